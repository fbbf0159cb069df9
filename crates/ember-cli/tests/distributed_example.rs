#![allow(clippy::unwrap_used)]
//! The GPU-computing chapter's `distributed.py` (`examples/distributed.rs`) on 2 ranks,
//! checked against what the chapter says DDP and `DistributedSampler` do: every rank trains
//! on `cuda:LOCAL_RANK` (or the CPU), starts from rank 0's weights, loads a disjoint half of
//! each epoch in batches of 32, and ends with the same weights as the others, the weights
//! one process reaches training on the global batch (64).
//!
//! - On the emulated GPUs over `nccl`: the ranks are threads of this process, each with its
//!   own group on `cuda:rank` (the emulator's NCCL joins the devices of one process, Note
//!   [Explicit groups]) and its own random generator, as a process has.
//! - With the `mpi` feature, as the text runs it: `ember launch --nproc-per-node 2` starts
//!   this test binary as two ranks, which run the example's `main` (rank and `LOCAL_RANK`
//!   from the environment) and print their reports; on the CPU over `mpi`, and on two
//!   emulated GPUs per process (`cuda:LOCAL_RANK`) over `nccl`, the emulator's NCCL joining
//!   the two processes.

use std::sync::Arc;
use std::time::Duration;

use ember::Device;
use ember::parallel::store::TcpStore;
use ember::parallel::{Backend, InitMethod, InitOptions, ProcessGroup};

// Formatted as an example (examples/rustfmt.toml), not as a test.
#[rustfmt::skip]
#[path = "../../ember/examples/distributed.rs"]
mod distributed;

use distributed::{BATCH_SIZE, RankReport, SAMPLES};

const EPOCHS: u64 = 3;

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len(), "parameter counts");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "parameter sizes");
            x.iter().zip(y).map(|(p, q)| (p - q).abs() as f64)
        })
        .fold(0.0, f64::max)
}

/// What the text claims, on the reports of the ranks (by rank), trained on `device(rank)`
/// over `backend`; `reference` is one process on the global batch.
fn check(
    reports: &[RankReport],
    device: impl Fn(usize) -> Device,
    backend: &str,
    reference: Device,
) {
    let world = reports.len();
    assert_eq!(world, 2);
    for (r, rep) in reports.iter().enumerate() {
        // init_process_group: this rank of a world of 2.
        assert_eq!((rep.rank, rep.world_size), (r, world), "rank {r}");
        assert_eq!(rep.backend, backend, "rank {r}");
        // MyModel().cuda(local_rank): every parameter on the rank's device.
        let d = device(r).to_string();
        assert_eq!(rep.device, d, "rank {r}");
        assert!(!rep.param_devices.is_empty());
        assert!(
            rep.param_devices.iter().all(|p| *p == d),
            "rank {r}: {rep:?}"
        );
        // DDP(model, ...): rank 0's weights on every rank.
        let d = max_diff(&rep.wrapped, &reports[0].initial);
        assert!(
            d == 0.0,
            "rank {r}: DDP broadcasts rank 0's weights (off by {d})"
        );
        // DataLoader(dataset, sampler=sampler, batch_size=32): half the data, in 32s.
        assert_eq!(
            rep.batches_per_epoch,
            SAMPLES / world / BATCH_SIZE,
            "rank {r}"
        );
        assert_eq!(rep.batch_sizes, vec![BATCH_SIZE; rep.batches_per_epoch]);
        assert_eq!(rep.shards.len(), EPOCHS as usize);
    }
    // The ranks drew different weights: the broadcast is not vacuous.
    assert!(max_diff(&reports[0].initial, &reports[1].initial) > 0.0);
    // DistributedSampler: each epoch the shards are disjoint and cover the dataset, and
    // set_epoch gives each epoch its own order.
    for e in 0..EPOCHS as usize {
        let mut all: Vec<usize> = reports.iter().flat_map(|r| r.shards[e].clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..SAMPLES).collect::<Vec<_>>(), "epoch {e}");
    }
    assert_ne!(reports[0].shards[0], reports[0].shards[1], "set_epoch");
    // Gradients synchronised: the replicas stay identical ...
    let d = max_diff(&reports[0].weights, &reports[1].weights);
    assert!(d == 0.0, "the replicas diverged by {d}");
    assert_eq!(reports[0].epoch_losses, reports[1].epoch_losses);
    assert!(
        max_diff(&reports[0].weights, &reports[0].wrapped) > 0.0,
        "training moved the weights"
    );
    let l = &reports[0].epoch_losses;
    assert!(l[EPOCHS as usize - 1] < l[0], "the loss falls: {l:?}");
    // ... and equal to one process training on the global batch of 2 x 32.
    let (weights, losses) =
        distributed::one_process(&reports[0].initial, world, reference, EPOCHS).unwrap();
    let d = max_diff(&reports[0].weights, &weights);
    assert!(
        d < 1e-5,
        "DDP differs from one process on the global batch by {d}"
    );
    for (a, b) in l.iter().zip(&losses) {
        assert!(
            (a - b).abs() < 1e-5,
            "losses {l:?} vs one process {losses:?}"
        );
    }
}

/// Two ranks as threads, on the emulated `cuda:0` and `cuda:1`, over `nccl`.
#[test]
fn distributed_py_on_two_emulated_gpus_over_nccl() {
    if std::env::var_os("EMBER_GPU_TEST").is_some() {
        ember_testing::skip!("ranks as threads need the emulator's NCCL");
    }
    ember::cuda::use_emulator(ember::driver::emulator::EmulatorConfig::devices(2)).unwrap();
    let patience = Duration::from_secs(60);
    let server = Arc::new(TcpStore::new("127.0.0.1", 0, true, patience).unwrap());
    let port = server.addr().port();
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let store = if rank == 0 {
                server.clone()
            } else {
                Arc::new(TcpStore::new("127.0.0.1", port, false, patience).unwrap())
            };
            std::thread::spawn(move || {
                // A process's own generator: manual_seed on this rank seeds this thread.
                let _own = ember::tensor::random::ThreadGenerator::with_seed(rank as u64);
                // init_process_group(backend='nccl'), LOCAL_RANK = rank.
                let opts = InitOptions::new(
                    Backend::Nccl,
                    InitMethod::Explicit {
                        rank,
                        world_size: 2,
                    },
                )
                .with_store(store)
                .with_device(rank)
                .with_timeout(patience);
                let group = ProcessGroup::new(opts).unwrap();
                let report = distributed::run(&group, Device::Cuda(rank), EPOCHS);
                group.destroy().unwrap();
                report.unwrap()
            })
        })
        .collect();
    let reports: Vec<RankReport> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    check(&reports, Device::Cuda, "nccl", Device::Cuda(0));
}

/// Set in the ranks `ember launch` starts: run the example's `main`.
#[cfg(feature = "mpi")]
const ROLE: &str = "EMBER_DISTRIBUTED_EXAMPLE_RANK";

/// `ember launch --nproc-per-node 2 -- <this test>`; each rank runs the example's `main`.
/// Returns the ranks' reports (`None` inside a rank).
#[cfg(feature = "mpi")]
fn launched(test: &str, port: u16, emulated_gpus: Option<&str>) -> Option<Vec<RankReport>> {
    if std::env::var_os(ROLE).is_some() {
        distributed::main().unwrap();
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(["launch", "--nproc-per-node", "2", "--master-port"])
        .arg(port.to_string())
        .arg("--")
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, "1")
        .env_remove("EMBER_GPU_TEST");
    match emulated_gpus {
        Some(n) => cmd.env("EMBER_CUDA_EMULATOR", n),
        None => cmd.env_remove("EMBER_CUDA_EMULATOR"),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ember launch failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let reports = (0..2)
        .map(|r| {
            let tag = format!("[rank{r}]:");
            let line = stdout
                .lines()
                .filter_map(|l| l.strip_prefix(&tag))
                .find_map(|l| l.trim_start().strip_prefix("DDP-REPORT "))
                .unwrap_or_else(|| panic!("no report from rank {r} in\n{stdout}"));
            serde_json::from_str(line).unwrap()
        })
        .collect();
    Some(reports)
}

/// As the text runs it: two processes on the CPU (the `mpi` backend, PyTorch's `gloo`).
#[cfg(feature = "mpi")]
#[test]
fn distributed_py_under_ember_launch_on_the_cpu() {
    let test = "distributed_py_under_ember_launch_on_the_cpu";
    if let Some(reports) = launched(test, 29541, None) {
        check(&reports, |_| Device::Cpu, "mpi", Device::Cpu);
    }
}

/// Two processes, each on its `cuda:LOCAL_RANK` of two emulated GPUs.
#[cfg(feature = "mpi")]
#[test]
fn distributed_py_under_ember_launch_on_emulated_gpus() {
    let test = "distributed_py_under_ember_launch_on_emulated_gpus";
    if std::env::var_os("EMBER_GPU_TEST").is_some() && std::env::var_os(ROLE).is_none() {
        ember_testing::skip!("{test} runs on the emulator");
    }
    if let Some(reports) = launched(test, 29542, Some("2")) {
        // The reference runs in this process, on the emulator too.
        ember::cuda::use_emulator(ember::driver::emulator::EmulatorConfig::devices(2)).unwrap();
        check(&reports, Device::Cuda, "nccl", Device::Cuda(0));
    }
}
