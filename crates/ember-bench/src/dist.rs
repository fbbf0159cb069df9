//! Collectives and `DistributedDataParallel` across 2 MPI ranks on this machine (shared
//! memory and loopback, as Open MPI chooses):
//!
//! - `all_reduce_mpi_{1kib,64kib,1mib,16mib,256mib}`: `ProcessGroup::all_reduce` (sum, in
//!   place) of an f32 tensor of that size, with the group's defaults (the per-call input
//!   check on: what a user gets), as bus bandwidth in GB/s as nccl-tests define it for
//!   all-reduce: algbw × 2(n−1)/n, algbw being the bytes over the time of one call (the
//!   slower rank's). Extras: `bytes`, `ranks`, `us_per_call`, and `busbw_check_off` /
//!   `us_per_call_check_off`, the same with `set_check_inputs(false)` on both ranks. Target:
//!   at least 0.9× of `MPI_Allreduce` called directly on the same buffers (mpi4py, in the
//!   side-by-side script).
//! - `ddp_train_mlp_2000_1000_100_b128_2ranks`: one SGD step (`zero_grad`, forward,
//!   cross-entropy, backward with DDP's bucketed all-reduce, `step`) of
//!   `Linear(2000,1000)–ReLU–Linear(1000,100)` wrapped in `DistributedDataParallel`, each
//!   rank on 64 rows of a global batch of 128, in samples per second of the global batch.
//!   Extras: `ranks`, `batch_per_rank`, `steps_per_s`, and `one_process_samples_per_s`
//!   (the same step without DDP, one process at batch 128 with this program's own thread
//!   count, `one_process_threads`) with `vs_one_process`. Target: at least PyTorch's DDP
//!   (gloo, the same model and threads per rank).
//!
//! Note [Benchmark ranks]:
//! The program starts its ranks itself: the parent runs `mpirun -n 2` (the flags of
//! `ember_parallel::testing::mpirun_command`: `--oversubscribe --bind-to none`, and
//! `--allow-run-as-root` as root) on its own executable with its own arguments, with
//! `EMBER_BENCH_RANKS_OUT` naming a file and `RAYON_NUM_THREADS` set to the threads per rank
//! (`EMBER_BENCH_RANK_THREADS`, default the cores divided among the ranks, at least 1: one
//! each on a 2-core machine). A process that finds `EMBER_BENCH_RANKS_OUT` set is a rank: it
//! runs only these cases and rank 0 writes their records to that file as JSON, so the
//! parent's standard output stays one JSON array. Ranks agree on every timing: the calls
//! per round come from the slower rank's first timed call (an all-reduce max), each round
//! starts with a barrier, and its time is the slower rank's. Without the `mpi` feature, or
//! without `mpirun`, the cases are skipped with a message saying why, never faked.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ember_nn::layers::Sequential;
use ember_nn::loss::CrossEntropyLoss;
use ember_nn::optim::{Optimizer, SGD, SgdOptions};
use ember_nn::{Loss, Module, Tensor};
use ember_parallel::group::{self, Backend, InitMethod, ProcessGroup, ReduceOp};
use ember_parallel::{DdpOptions, DistributedDataParallel};
use ember_tensor::{DType, Device};
use serde_json::Value;

use crate::harness::{Options, Record};
use crate::nn::{err, mlp, record};

/// Set in the ranks' environment: the file rank 0 writes its records to.
pub const RANKS_OUT_ENV: &str = "EMBER_BENCH_RANKS_OUT";
/// Threads per rank (default: the cores divided among the ranks, at least 1).
pub const RANK_THREADS_ENV: &str = "EMBER_BENCH_RANK_THREADS";
/// The number of ranks these cases run on.
const RANKS: usize = 2;
/// Timed rounds per case (the median is kept), as `harness::ns_per_iter`.
const ROUNDS: usize = 5;

const ALL_REDUCE: [(&str, usize); 5] = [
    ("all_reduce_mpi_1kib", 1 << 10),
    ("all_reduce_mpi_64kib", 64 << 10),
    ("all_reduce_mpi_1mib", 1 << 20),
    ("all_reduce_mpi_16mib", 16 << 20),
    ("all_reduce_mpi_256mib", 256 << 20),
];
const DDP: &str = "ddp_train_mlp_2000_1000_100_b128_2ranks";
const DDP_WIDTHS: [usize; 3] = [2000, 1000, 100];
const DDP_BATCH: usize = 128;
const LR: f64 = 0.01;

fn case_names() -> impl Iterator<Item = &'static str> {
    ALL_REDUCE.iter().map(|(n, _)| *n).chain([DDP])
}

/// The parent's side: the selected multi-rank cases, run by ranks it starts (Note
/// [Benchmark ranks]).
pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    let names: Vec<&str> = case_names().filter(|n| opts.wants(n)).collect();
    let nodes = opts.wants(crate::dist_nodes::DDP_NODES);
    if (names.is_empty() && !nodes) || !opts.cpu() {
        return Ok(());
    }
    if !group::mpi_built() && !names.is_empty() {
        eprintln!(
            "ember-bench: skipping {}: built without MPI support (build ember-bench with --features mpi; `cargo xtask bench` does when Open MPI is installed)",
            names.join(", ")
        );
        return crate::dist_nodes::run(opts, out, rank_threads());
    }
    let one_process = if (opts.wants(DDP) || nodes) && group::mpi_built() {
        Some(one_process_samples_per_s(opts.quick)?)
    } else {
        None
    };
    let mut records = Vec::new();
    if !names.is_empty() {
        match launch_ranks()? {
            Some(r) => records.extend(r),
            None => eprintln!(
                "ember-bench: skipping {}: mpirun was not found (install Open MPI: Debian's openmpi-bin)",
                names.join(", ")
            ),
        }
    }
    crate::dist_nodes::run(opts, &mut records, rank_threads())?;
    for r in &mut records {
        let ddp = r.name == DDP || r.name == crate::dist_nodes::DDP_NODES;
        if let (true, Some(one)) = (ddp, one_process) {
            r.extra
                .insert("one_process_samples_per_s".into(), one.into());
            r.extra.insert(
                "one_process_threads".into(),
                rayon::current_num_threads().into(),
            );
            r.extra
                .insert("vs_one_process".into(), (r.value / one).into());
        }
    }
    out.extend(records);
    Ok(())
}

/// Threads per rank: `EMBER_BENCH_RANK_THREADS`, else the cores divided among the ranks.
fn rank_threads() -> usize {
    std::env::var(RANK_THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&t: &usize| t > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |c| (c.get() / RANKS).max(1))
        })
}

/// Starts the ranks on this program with its own arguments and reads rank 0's records;
/// `None` when `mpirun` is not installed.
fn launch_ranks() -> Result<Option<Vec<Record>>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find ember-bench: {e}"))?;
    let file = std::env::temp_dir().join(format!("ember-bench-ranks-{}.json", std::process::id()));
    let mut cmd = ember_parallel::testing::mpirun_command(RANKS);
    cmd.args(["-x", RANKS_OUT_ENV, "-x", "RAYON_NUM_THREADS"]);
    cmd.arg(&exe).args(std::env::args().skip(1));
    // The ranks' world is MPI's; an enclosing launcher's variables would contradict it.
    for k in ember_parallel::launch::TORCHRUN_VARS {
        cmd.env_remove(k);
    }
    cmd.env(RANKS_OUT_ENV, &file)
        .env("RAYON_NUM_THREADS", rank_threads().to_string())
        .stdin(Stdio::null());
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot start mpirun: {e}")),
    };
    let text = std::fs::read_to_string(&file);
    let _ = std::fs::remove_file(&file);
    if !output.status.success() {
        return Err(format!(
            "the {RANKS} ranks failed (mpirun {}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = text.map_err(|e| format!("rank 0 wrote no records to {}: {e}", file.display()))?;
    records_of(&text).map(Some)
}

/// The records rank 0 wrote (a JSON array).
pub(crate) fn records_of(text: &str) -> Result<Vec<Record>, String> {
    let values: Vec<Value> = serde_json::from_str(text)
        .map_err(|e| format!("rank 0's records are not a JSON array: {e}"))?;
    values.iter().map(record_of).collect()
}

/// A record as rank 0 wrote it.
fn record_of(v: &Value) -> Result<Record, String> {
    let bad = || format!("not a record: {v}");
    let mut extra = v.as_object().ok_or_else(bad)?.clone();
    let mut take = |k: &str| extra.remove(k).ok_or_else(bad);
    let name = take("name")?.as_str().ok_or_else(bad)?.to_string();
    let device = take("device")?.as_str().ok_or_else(bad)?.to_string();
    let threads = take("threads")?.as_u64().ok_or_else(bad)? as usize;
    let value = take("value")?.as_f64().ok_or_else(bad)?;
    let unit = match take("unit")?.as_str() {
        Some("GB/s") => "GB/s",
        Some("samples/s") => "samples/s",
        _ => return Err(bad()),
    };
    Ok(Record {
        name,
        device,
        threads,
        value,
        unit,
        extra,
    })
}

/// The file a rank writes to, when this process is one (Note [Benchmark ranks]).
pub fn rank_output() -> Option<PathBuf> {
    std::env::var_os(RANKS_OUT_ENV).map(PathBuf::from)
}

/// A rank's side: runs the selected cases in the default group; rank 0 writes the records.
pub fn rank_main(opts: &Options, path: &Path) -> Result<(), String> {
    let pg = group::init_process_group(Backend::Mpi, InitMethod::Mpi).map_err(err)?;
    // A case's slowest collective takes well under a second: a rank that died fails the
    // others instead of hanging the benchmark.
    pg.set_timeout(Duration::from_secs(120));
    let mut records = Vec::new();
    if crate::dist_nodes::is_nodes_rank() {
        // A rank of the 2-node case runs it alone (Note [Benchmark nodes]).
        records.push(ddp_case(&pg, opts.quick, crate::dist_nodes::DDP_NODES)?);
    } else {
        for (name, bytes) in ALL_REDUCE {
            if opts.wants(name) {
                records.push(all_reduce_case(&pg, name, bytes, opts.quick)?);
            }
        }
        if opts.wants(DDP) {
            records.push(ddp_case(&pg, opts.quick, DDP)?);
        }
    }
    if pg.rank() == 0 {
        let text = serde_json::to_string(&records).map_err(err)?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    group::destroy_process_group().map_err(err)
}

/// The largest of every rank's `v`.
fn max_all(pg: &ProcessGroup, v: f64) -> Result<f64, String> {
    let t = Tensor::from_vec(vec![v], [1], Device::Cpu).map_err(err)?;
    pg.all_reduce(&t, ReduceOp::Max).map_err(err)?;
    t.to_vec::<f64>()
        .map_err(err)?
        .first()
        .copied()
        .ok_or_else(|| "an empty all-reduce result".to_string())
}

/// Nanoseconds per call of `f`, agreed by the ranks (Note [Benchmark ranks]): the median of
/// [`ROUNDS`] rounds, each the slower rank's time; with `quick`, one call.
fn ranks_ns_per_call(
    pg: &ProcessGroup,
    quick: bool,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    f()?;
    pg.barrier().map_err(err)?;
    let t = Instant::now();
    f()?;
    let once = max_all(pg, t.elapsed().as_secs_f64().max(1e-7))?;
    if quick {
        return Ok(once * 1e9);
    }
    let iters = ((0.2 / once) as usize).clamp(1, 10_000);
    for _ in 0..iters.min(64) {
        f()?;
    }
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        pg.barrier().map_err(err)?;
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        samples.push(max_all(pg, t.elapsed().as_secs_f64())? / iters as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2] * 1e9)
}

fn all_reduce_case(
    pg: &ProcessGroup,
    name: &str,
    bytes: usize,
    quick: bool,
) -> Result<Record, String> {
    let t = Tensor::zeros([bytes / DType::F32.size_in_bytes()], ()).map_err(err)?;
    let timed = |check: bool| {
        pg.set_check_inputs(check);
        ranks_ns_per_call(pg, quick, || pg.all_reduce(&t, ReduceOp::Sum).map_err(err))
    };
    let ns = timed(true)?;
    let ns_off = timed(false)?;
    pg.set_check_inputs(true);
    // nccl-tests' bus bandwidth of an all-reduce: algbw × 2(n−1)/n; bytes per ns is GB/s.
    let n = pg.world_size() as f64;
    let busbw = |ns: f64| bytes as f64 / ns * 2.0 * (n - 1.0) / n;
    let mut r = record(name, Device::Cpu, busbw(ns), "GB/s");
    r.extra.insert("bytes".into(), bytes.into());
    r.extra.insert("ranks".into(), pg.world_size().into());
    r.extra.insert("us_per_call".into(), (ns * 1e-3).into());
    r.extra
        .insert("busbw_check_off".into(), busbw(ns_off).into());
    r.extra
        .insert("us_per_call_check_off".into(), (ns_off * 1e-3).into());
    if quick {
        r.extra.insert("quick".into(), true.into());
    }
    Ok(r)
}

/// One SGD step of `model` on `x`, `y`, as a user writes it.
fn sgd_step(model: &dyn Module, opt: &mut SGD, x: &Tensor, y: &Tensor) -> Result<(), String> {
    opt.zero_grad(true).map_err(err)?;
    let loss = CrossEntropyLoss::new()
        .forward(&model.call(x).map_err(err)?, y)
        .map_err(err)?;
    loss.backward().map_err(err)?;
    opt.step().map_err(err)
}

/// A batch of `rows` random inputs and class targets, seeded by `seed`.
fn batch(rows: usize, seed: u64) -> Result<(Tensor, Tensor), String> {
    ember_tensor::random::manual_seed(seed);
    let x = Tensor::randn([rows, DDP_WIDTHS[0]], ()).map_err(err)?;
    let classes = DDP_WIDTHS[DDP_WIDTHS.len() - 1] as i64;
    let y = Tensor::randint(0, classes, [rows], (Device::Cpu, DType::I64)).map_err(err)?;
    Ok((x, y))
}

/// The MLP, seeded alike in every process (DDP broadcasts rank 0's anyway).
fn seeded_model() -> Result<Sequential, String> {
    ember_tensor::random::manual_seed(0);
    mlp(&DDP_WIDTHS, Device::Cpu)
}

fn sgd(params: Vec<Tensor>) -> Result<SGD, String> {
    SGD::new(
        params,
        SgdOptions {
            lr: LR,
            ..Default::default()
        },
    )
    .map_err(err)
}

fn ddp_case(pg: &ProcessGroup, quick: bool, name: &str) -> Result<Record, String> {
    let ddp =
        DistributedDataParallel::new(seeded_model()?, pg, DdpOptions::default()).map_err(err)?;
    let mut opt = sgd(ddp.parameters())?;
    let per_rank = DDP_BATCH / pg.world_size();
    let (x, y) = batch(per_rank, 1 + pg.rank() as u64)?;
    let ns = ranks_ns_per_call(pg, quick, || sgd_step(&ddp, &mut opt, &x, &y))?;
    let steps = 1e9 / ns;
    let mut r = record(name, Device::Cpu, steps * DDP_BATCH as f64, "samples/s");
    r.extra.insert("ranks".into(), pg.world_size().into());
    r.extra.insert("batch_per_rank".into(), per_rank.into());
    r.extra.insert("steps_per_s".into(), steps.into());
    if quick {
        r.extra.insert("quick".into(), true.into());
    }
    Ok(r)
}

/// The same step in one process at the global batch, without DDP.
fn one_process_samples_per_s(quick: bool) -> Result<f64, String> {
    let model = seeded_model()?;
    let mut opt = sgd(model.parameters())?;
    let (x, y) = batch(DDP_BATCH, 1)?;
    let ns = crate::nn::time(Device::Cpu, quick, || sgd_step(&model, &mut opt, &x, &y))?;
    Ok(1e9 / ns * DDP_BATCH as f64)
}
