//! Two nodes on one machine: two `ember launch` launchers (`--nnodes 2`, node ranks 0 and
//! 1, 2 ranks each) on loopback, the ranks training with DistributedDataParallel and a
//! DistributedSampler over the `nccl` backend on emulated GPUs (the emulator's NCCL across
//! processes, ranks started by the launchers) and over the `mpi` backend on the CPU (one
//! `mpirun` of node 0 across both, Note [mpirun across nodes]). Every rank checks that its
//! weights equal those of one process trained on the global batch (the union of the
//! ranks' batches of each step), within f32 rounding.
//!
//! The test starts this binary as the launcher of each node (`ROLE=launcher`), each
//! launcher starts it as its ranks (`ROLE=rank`).
#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

use ember_autograd::Tensor;
use ember_nn::data::{Sampler, TensorDataset};
use ember_nn::layers::{Linear, Sequential, Tanh};
use ember_nn::optim::{Optimizer, SGD, SgdOptions};
use ember_nn::{Module, Result};
use ember_parallel::group::{self, Backend, InitMethod};
use ember_parallel::launch::{self, LaunchOptions, Spawner};
use ember_parallel::{DdpOptions, DistributedDataParallel, DistributedSampler};
use ember_tensor::{DType, Device};

const ROLE: &str = "EMBER_MULTINODE_ROLE";
const NODE: &str = "EMBER_MULTINODE_NODE";
const PORT: &str = "EMBER_MULTINODE_PORT";
/// Samples in the dataset, samples per rank and step, epochs.
const N: usize = 48;
const B: usize = 3;
const EPOCHS: u64 = 2;

fn mlp(seed: u64, device: Device) -> Result<Sequential> {
    ember_tensor::random::manual_seed(seed);
    let m = Sequential::new()
        .add(Linear::new(6, 16, ())?)
        .add(Tanh::new())
        .add(Linear::new(16, 3, ())?);
    m.to(device)?;
    Ok(m)
}

/// Sample `i`: 6 inputs and 3 targets.
fn sample(i: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..6)
        .map(|j| (((i * 7 + j * 13) % 23) as f32 / 11.0) - 1.0)
        .collect();
    let y = (0..3)
        .map(|j| (((i * 5 + j * 3) % 17) as f32 / 8.0) - 1.0)
        .collect();
    (x, y)
}

/// The batch of samples `idx`.
fn batch(idx: &[usize], device: Device) -> Result<(Tensor, Tensor)> {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for &i in idx {
        let (x, y) = sample(i);
        xs.extend(x);
        ys.extend(y);
    }
    Ok((
        Tensor::from_vec(xs, [idx.len(), 6], device)?,
        Tensor::from_vec(ys, [idx.len(), 3], device)?,
    ))
}

fn loss(model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    model.call(x)?.sub(y)?.square()?.mean_all()
}

fn sgd(params: Vec<Tensor>) -> Result<SGD> {
    SGD::new(
        params,
        SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    )
}

/// A rank: DDP with a DistributedSampler, against one model on the global batches.
fn rank(backend: Backend) -> Result<f64> {
    let local: usize = std::env::var("LOCAL_RANK").unwrap().parse().unwrap();
    let device = match backend {
        Backend::Nccl => Device::Cuda(local),
        Backend::Mpi => Device::Cpu,
    };
    let pg = group::init_process_group(backend, InitMethod::Env)?;
    let (me, world) = (pg.rank(), pg.world_size());
    let (xs, ys): (Vec<_>, Vec<_>) = (0..N).map(sample).unzip();
    let data = TensorDataset::new(vec![
        Tensor::from_vec(xs.concat(), [N, 6], Device::Cpu)?,
        Tensor::from_vec(ys.concat(), [N, 3], Device::Cpu)?,
    ])?;
    let samplers: Vec<DistributedSampler> = (0..world)
        .map(|r| Ok(DistributedSampler::with_replicas(&data, world, r)?.seed(7)))
        .collect::<Result<_>>()?;
    // Each rank starts from its own weights: DDP broadcasts rank 0's.
    let ddp =
        DistributedDataParallel::new(mlp(100 + me as u64, device)?, &pg, DdpOptions::default())?;
    let reference = mlp(100, device)?;
    let (mut opt, mut ref_opt) = (sgd(ddp.parameters())?, sgd(reference.parameters())?);
    for epoch in 0..EPOCHS {
        let shards: Vec<Vec<usize>> = samplers
            .iter()
            .map(|s| {
                s.set_epoch(epoch);
                s.indices(epoch)
            })
            .collect::<Result<_>>()?;
        for step in 0..shards[me].len() / B {
            let part = |r: usize| shards[r][step * B..(step + 1) * B].to_vec();
            let (x, y) = batch(&part(me), device)?;
            let global: Vec<usize> = (0..world).flat_map(part).collect();
            let (gx, gy) = batch(&global, device)?;
            opt.zero_grad(true)?;
            ref_opt.zero_grad(true)?;
            loss(&ddp, &x, &y)?.backward()?;
            loss(&reference, &gx, &gy)?.backward()?;
            opt.step()?;
            ref_opt.step()?;
        }
    }
    let mut worst = 0.0f64;
    for ((_, a), (_, b)) in ddp
        .module()
        .named_parameters()
        .iter()
        .zip(reference.named_parameters())
    {
        let (a, b) = (
            a.to_dtype(DType::F64)?.to_vec::<f64>()?,
            b.to_dtype(DType::F64)?.to_vec::<f64>()?,
        );
        for (x, y) in a.iter().zip(&b) {
            worst = worst.max((x - y).abs());
        }
    }
    drop(ddp);
    group::destroy_process_group()?;
    Ok(worst)
}

fn launcher(test: &str, backend: Backend) {
    let exe = std::env::current_exe().unwrap();
    let program: Vec<OsString> = vec![
        exe.into(),
        "--exact".into(),
        test.into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
        "-q".into(),
    ];
    let mut opts = LaunchOptions::new(2, program);
    opts.nnodes = 2;
    opts.node_rank = std::env::var(NODE).unwrap().parse().unwrap();
    opts.master_port = std::env::var(PORT).unwrap().parse().unwrap();
    opts.join_timeout = Duration::from_secs(60);
    opts.env.push((ROLE.into(), "rank".into()));
    match backend {
        Backend::Nccl => {
            opts.spawner = Some(Spawner::Direct);
            opts.env.push(("EMBER_CUDA_EMULATOR".into(), "2".into()));
        }
        Backend::Mpi => opts.spawner = Some(Spawner::Mpirun),
    }
    let out = launch::launch(&opts).unwrap();
    std::process::exit(out.code);
}

/// Plays the test's roles; the parent starts the two launchers and checks every rank.
fn two_nodes(test: &str, backend: Backend) {
    match std::env::var(ROLE).as_deref() {
        Ok("rank") => {
            let worst = rank(backend).unwrap();
            println!("max |ddp - one process| = {worst:e}");
            assert!(worst < 1e-5, "DDP differs from one process by {worst}");
            return;
        }
        Ok("launcher") => launcher(test, backend),
        _ => {}
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = |node: usize| {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
            .env(ROLE, "launcher")
            .env(NODE, node.to_string())
            .env(PORT, port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (n0, n1) = (start(0), start(1));
    let outs = [
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    ];
    let mut lines = Vec::new();
    for (node, o) in outs.iter().enumerate() {
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(
            o.status.success(),
            "node {node}: {}\nstdout:\n{out}\nstderr:\n{err}",
            o.status
        );
        lines.extend(
            out.lines()
                .filter(|l| l.contains("max |ddp - one process|"))
                .map(String::from),
        );
    }
    eprintln!("{}", lines.join("\n"));
    // All four ranks checked their weights (under mpirun node 0 prints every rank's lines).
    for r in 0..4 {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("[rank{r}]:"))),
            "{lines:?}"
        );
    }
}

#[test]
fn two_nodes_of_two_ranks_train_as_one_process_over_nccl() {
    two_nodes(
        "two_nodes_of_two_ranks_train_as_one_process_over_nccl",
        Backend::Nccl,
    );
}

#[cfg(feature = "mpi")]
#[test]
fn two_nodes_of_two_ranks_train_as_one_process_over_mpi() {
    two_nodes(
        "two_nodes_of_two_ranks_train_as_one_process_over_mpi",
        Backend::Mpi,
    );
}
