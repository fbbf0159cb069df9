//! `ddp_train_mlp_2000_1000_100_b128_2nodes`: the DDP step of `ddp_train_..._2ranks`
//! (`dist.rs`) on 2 nodes × 1 process on loopback, started as a user starts a multi-node
//! job: two `ember launch --nnodes 2 --nproc-per-node 1` launchers. Samples per second of
//! the global batch of 128. Target: at least PyTorch's DDP over gloo under `torchrun
//! --nnodes 2` on loopback (the side-by-side script).
//!
//! Note [Benchmark nodes]: the parent starts this program twice as launchers
//! (`EMBER_BENCH_NODE` = 0 and 1, `EMBER_BENCH_NODE_PORT` the store's port), each running
//! `ember_parallel::launch::launch` with the mpirun spawner: node 0's mpirun starts both
//! ranks, node 1's launcher its daemon (Note [mpirun across nodes] in ember-parallel), and
//! the nodes being on loopback, Open MPI's TCP transport carries the all-reduces, as
//! between two machines (not shared memory, as for `_2ranks`). The ranks are this program
//! again, with `EMBER_BENCH_RANKS_OUT` naming the file rank 0 writes its record to and
//! `EMBER_BENCH_NODES` telling them to run this case alone (Note [Benchmark ranks] in
//! `dist.rs`). Without the `mpi` feature or without `mpirun` the case is skipped, saying
//! why.

use std::ffi::OsString;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use ember_parallel::group;
use ember_parallel::launch::{self, LaunchOptions, Spawner};

use crate::dist::{RANKS_OUT_ENV, records_of};
use crate::harness::{Options, Record};

/// The case's name.
pub const DDP_NODES: &str = "ddp_train_mlp_2000_1000_100_b128_2nodes";
/// Set in a launcher's environment: its node rank.
pub const NODE_ENV: &str = "EMBER_BENCH_NODE";
/// Set in a launcher's environment: the store's port on node 0.
pub const NODE_PORT_ENV: &str = "EMBER_BENCH_NODE_PORT";
/// Set in the ranks' environment: run this case alone.
pub const NODES_ENV: &str = "EMBER_BENCH_NODES";
const NODES: usize = 2;

/// `Some((node, port))` in a launcher this program started. Its ranks inherit the
/// launcher's variables (the local ones through `mpirun`'s environment), so a process that
/// is a rank ([`is_nodes_rank`]) is never a launcher: else every rank would start a
/// launcher of its own, whose store cannot bind the port its parent holds.
pub fn launcher_node() -> Option<(usize, u16)> {
    if is_nodes_rank() {
        return None;
    }
    let node = std::env::var(NODE_ENV).ok()?.parse().ok()?;
    let port = std::env::var(NODE_PORT_ENV).ok()?.parse().ok()?;
    Some((node, port))
}

/// `true` in a rank of this case.
pub fn is_nodes_rank() -> bool {
    std::env::var_os(NODES_ENV).is_some()
}

/// A launcher's side: launches this program as its node's rank and exits with the code.
pub fn launcher_main(node: usize, port: u16) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ember-bench (launcher): cannot find ember-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let program: Vec<OsString> = std::iter::once(exe.into_os_string())
        .chain(std::env::args_os().skip(1))
        .collect();
    let mut opts = LaunchOptions::new(1, program);
    opts.nnodes = NODES;
    opts.node_rank = node;
    opts.master_port = port;
    opts.join_timeout = Duration::from_secs(120);
    opts.spawner = Some(Spawner::Mpirun);
    for k in [RANKS_OUT_ENV, "RAYON_NUM_THREADS"] {
        if let Some(v) = std::env::var_os(k) {
            opts.env.push((k.into(), v));
        }
    }
    opts.env.push((NODES_ENV.into(), "1".into()));
    match launch::launch(&opts) {
        Ok(out) => ExitCode::from(u8::try_from(out.code).unwrap_or(1)),
        Err(e) => {
            eprintln!("ember-bench (launcher of node {node}): {e}");
            ExitCode::FAILURE
        }
    }
}

/// The parent's side: starts the two launchers and reads rank 0's record.
pub fn run(opts: &Options, out: &mut Vec<Record>, rank_threads: usize) -> Result<(), String> {
    if !opts.wants(DDP_NODES) || !opts.cpu() {
        return Ok(());
    }
    if !group::mpi_built() {
        eprintln!(
            "ember-bench: skipping {DDP_NODES}: built without MPI support (build ember-bench with --features mpi)"
        );
        return Ok(());
    }
    if !launch::mpirun_available() {
        eprintln!(
            "ember-bench: skipping {DDP_NODES}: mpirun was not found (install Open MPI: Debian's openmpi-bin)"
        );
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find ember-bench: {e}"))?;
    let file = std::env::temp_dir().join(format!("ember-bench-nodes-{}.json", std::process::id()));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot find a free port: {e}"))?
        .port();
    let start = |node: usize| {
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1));
        for k in ember_parallel::launch::TORCHRUN_VARS {
            cmd.env_remove(k);
        }
        cmd.env(NODE_ENV, node.to_string())
            .env(NODE_PORT_ENV, port.to_string())
            .env(RANKS_OUT_ENV, &file)
            .env("RAYON_NUM_THREADS", rank_threads.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the launcher of node {node}: {e}"))
    };
    let launchers = [start(0)?, start(1)?];
    let mut failed = Vec::new();
    for (node, l) in launchers.into_iter().enumerate() {
        let o = l
            .wait_with_output()
            .map_err(|e| format!("the launcher of node {node}: {e}"))?;
        if !o.status.success() {
            failed.push(format!(
                "node {node} ({}):\n{}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
    }
    let text = std::fs::read_to_string(&file);
    let _ = std::fs::remove_file(&file);
    if !failed.is_empty() {
        return Err(format!("the 2-node job failed: {}", failed.join("\n")));
    }
    let text = text.map_err(|e| format!("rank 0 wrote no records to {}: {e}", file.display()))?;
    let mut records = records_of(&text)?;
    for r in &mut records {
        r.extra.insert("nodes".into(), NODES.into());
        r.extra.insert("ranks_per_node".into(), 1.into());
        r.extra.insert(
            "transport".into(),
            "Open MPI TCP over loopback (two ember launch --nnodes 2)".into(),
        );
    }
    out.extend(records);
    Ok(())
}
