//! Process groups over the `nccl` backend: 2 and 3 ranks as threads of one process, each on
//! its emulated device (Note [Explicit groups]; the emulator's NCCL meets within one
//! process), every collective against a naive reference in f64, the async forms, a timeout,
//! bad input, world size 1 with its failure paths, and DDP over an nccl group against one
//! process.
//!
//! Under `EMBER_GPU_TEST=1` the ranks are on the real GPUs, one each: world size 1 and its
//! failure paths run on a one-GPU machine; a test of N ranks needs N GPUs and, with fewer,
//! skips and says so (Note [Skipped tests]). The wording of an aborted clique's error is
//! the emulator's and is checked there only.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ember_autograd::{ErrorKind, Tensor};
use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_nn::Module;
use ember_nn::layers::{Linear, Sequential, Tanh};
use ember_nn::optim::{Optimizer, SGD, SgdOptions};
use ember_parallel::group::{Backend, InitMethod, InitOptions, ProcessGroup, ReduceOp};
use ember_parallel::store::TcpStore;
use ember_parallel::{DdpOptions, DistributedDataParallel};
use ember_tensor::{DType, Device};
use ember_testing::{prepare, real_gpu_requested, skip, skip_part};

const DEVICES: usize = 3;
const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Product,
];

/// Makes the devices of `world` ranks ready, `cuda:0` to `cuda:{world - 1}`: the 3-device
/// emulator, or under `EMBER_GPU_TEST=1` the real GPUs (a missing GPU fails the test, as
/// `ember_testing::prepare` has it). `Err(why)` when the machine has fewer real GPUs than
/// ranks: the test skips.
fn devices_for(world: usize) -> Result<(), String> {
    if real_gpu_requested() {
        prepare(Device::Cuda(0)).unwrap();
        let n = cuda::device_count();
        if n < world {
            return Err(format!(
                "{world} ranks need {world} CUDA devices, one each; this machine has {n} (the \
                 emulated passes run it on the emulator's {DEVICES})"
            ));
        }
        return Ok(()); // not a skip: the devices are ready
    }
    if let Err(e) = cuda::use_emulator(EmulatorConfig::devices(DEVICES)) {
        assert!(
            cuda::is_emulated() && cuda::device_count() >= DEVICES,
            "{world} ranks need {DEVICES} emulated devices: {e}"
        );
    }
    Ok(())
}

fn opts(rank: usize, world: usize, store: Arc<TcpStore>, timeout: Duration) -> InitOptions {
    InitOptions::new(
        Backend::Nccl,
        InitMethod::Explicit {
            rank,
            world_size: world,
        },
    )
    .with_store(store)
    .with_device(rank)
    .with_timeout(timeout)
}

/// Runs `body` on `world` ranks, each a thread with its group on `cuda:rank`; returns each
/// rank's result. A group left unbroken is destroyed.
fn ranks<R: Send + 'static>(
    world: usize,
    timeout: Duration,
    body: impl Fn(&ProcessGroup) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let patience = Duration::from_secs(60);
    let server = Arc::new(TcpStore::new("127.0.0.1", 0, true, patience).unwrap());
    let port = server.addr().port();
    let body = Arc::new(body);
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let store = if rank == 0 {
                server.clone()
            } else {
                Arc::new(TcpStore::new("127.0.0.1", port, false, patience).unwrap())
            };
            let body = body.clone();
            std::thread::spawn(move || {
                let pg = ProcessGroup::new(opts(rank, world, store, timeout)).unwrap();
                assert_eq!((pg.rank(), pg.world_size()), (rank, world));
                assert_eq!(pg.device(), Some(Device::Cuda(rank)));
                let r = body(&pg);
                if !pg.is_broken() {
                    pg.destroy().unwrap();
                }
                r
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Rank `r`'s values: small integers, distinct per rank and element (exact in every dtype).
fn data(r: usize, n: usize) -> Vec<f64> {
    (0..n).map(|i| ((r * 7 + i * 3) % 5) as f64 + 1.0).collect()
}

fn tensor(vals: &[f64], dims: &[usize], dtype: DType, device: Device) -> Tensor {
    Tensor::from_vec(vals.to_vec(), dims.to_vec(), device)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_device(Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

/// The reduction of `xs` (one value per rank) as the backend computes it in `dtype`.
fn reduce(xs: &[f64], op: ReduceOp, dtype: DType) -> f64 {
    let n = xs.len() as f64;
    match op {
        ReduceOp::Sum => xs.iter().sum(),
        ReduceOp::Avg if dtype == DType::I64 => (xs.iter().sum::<f64>() / n).trunc(),
        ReduceOp::Avg => xs.iter().sum::<f64>() / n,
        ReduceOp::Max => xs.iter().copied().fold(f64::MIN, f64::max),
        ReduceOp::Min => xs.iter().copied().fold(f64::MAX, f64::min),
        ReduceOp::Product => xs.iter().product(),
    }
}

fn assert_close(got: &[f64], want: &[f64], dtype: DType, what: &str) {
    let tol = if dtype == DType::Bf16 { 1e-2 } else { 1e-6 };
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, expected {w}"
        );
    }
}

/// Every collective (sync forms) on `world` ranks, checked on every rank.
fn every_collective(world: usize) {
    let out = ranks(world, Duration::from_secs(60), move |pg| {
        let (rank, dev) = (pg.rank(), Device::Cuda(pg.rank()));
        let dims = [2usize, 3];
        for dtype in [DType::F32, DType::I64, DType::Bf16] {
            for op in OPS {
                let t = tensor(&data(rank, 6), &dims, dtype, dev);
                pg.all_reduce(&t, op).unwrap();
                let want: Vec<f64> = (0..6)
                    .map(|i| {
                        let xs: Vec<f64> = (0..world).map(|r| data(r, 6)[i]).collect();
                        reduce(&xs, op, dtype)
                    })
                    .collect();
                assert_close(
                    &values(&t),
                    &want,
                    dtype,
                    &format!("all_reduce {op:?} {dtype}"),
                );
            }
            // A strided view is reduced in place through a contiguous copy.
            let base = tensor(&data(rank, 6), &dims, dtype, dev);
            let view = base.transpose(0, 1).unwrap();
            pg.all_reduce(&view, ReduceOp::Sum).unwrap();
            let want: Vec<f64> = (0..6)
                .map(|i| (0..world).map(|r| data(r, 6)[i]).sum())
                .collect();
            assert_close(
                &values(&base),
                &want,
                dtype,
                "all_reduce of a transposed view",
            );

            let src = world - 1;
            let t = tensor(&data(rank, 6), &dims, dtype, dev);
            pg.broadcast(&t, src).unwrap();
            assert_close(&values(&t), &data(src, 6), dtype, "broadcast");

            let input = tensor(&data(rank, 6), &dims, dtype, dev);
            let outputs: Vec<Tensor> = (0..world)
                .map(|_| Tensor::zeros(dims, (&dev, dtype)).unwrap())
                .collect();
            pg.all_gather(&outputs, &input).unwrap();
            for (r, o) in outputs.iter().enumerate() {
                assert_eq!(o.dims(), &dims);
                assert_close(&values(o), &data(r, 6), dtype, &format!("all_gather [{r}]"));
            }

            for op in [ReduceOp::Sum, ReduceOp::Max] {
                // Rank r's inputs[j] holds data(r * world + j).
                let inputs: Vec<Tensor> = (0..world)
                    .map(|j| tensor(&data(rank * world + j, 6), &dims, dtype, dev))
                    .collect();
                let output = Tensor::zeros(dims, (&dev, dtype)).unwrap();
                pg.reduce_scatter(&output, &inputs, op).unwrap();
                let want: Vec<f64> = (0..6)
                    .map(|i| {
                        let xs: Vec<f64> =
                            (0..world).map(|r| data(r * world + rank, 6)[i]).collect();
                        reduce(&xs, op, dtype)
                    })
                    .collect();
                assert_close(
                    &values(&output),
                    &want,
                    dtype,
                    &format!("reduce_scatter {op:?}"),
                );
            }
        }
        let flags = Tensor::from_vec(vec![rank == 0, false], [2], dev).unwrap();
        pg.all_reduce(&flags, ReduceOp::Max).unwrap();
        assert_eq!(
            flags
                .to_device(Device::Cpu)
                .unwrap()
                .to_vec::<bool>()
                .unwrap(),
            [true, false]
        );
        pg.barrier().unwrap();
        rank
    });
    assert_eq!(out, (0..world).collect::<Vec<_>>());
}

#[test]
fn every_collective_on_two_ranks() {
    if let Err(why) = devices_for(2) {
        skip!("{why}");
    }
    every_collective(2);
}

#[test]
fn every_collective_on_three_ranks() {
    if let Err(why) = devices_for(3) {
        skip!("{why}");
    }
    every_collective(3);
}

#[test]
fn async_forms_complete_in_issue_order() {
    if let Err(why) = devices_for(3) {
        skip!("{why}");
    }
    let world = 3;
    ranks(world, Duration::from_secs(60), move |pg| {
        let (rank, dev) = (pg.rank(), Device::Cuda(pg.rank()));
        let a = tensor(&data(rank, 5), &[5], DType::F32, dev);
        let b = tensor(&data(rank, 4), &[4], DType::F32, dev);
        let outputs: Vec<Tensor> = (0..world)
            .map(|_| Tensor::zeros([4], (&dev, DType::F32)).unwrap())
            .collect();
        let inputs: Vec<Tensor> = (0..world)
            .map(|j| tensor(&data(j + rank, 2), &[2], DType::F32, dev))
            .collect();
        let scattered = Tensor::zeros([2], (&dev, DType::F32)).unwrap();
        let works = vec![
            pg.all_reduce_async(&a, ReduceOp::Sum).unwrap(),
            pg.all_gather_async(&outputs, &b).unwrap(),
            pg.broadcast_async(&b, 0).unwrap(),
            pg.reduce_scatter_async(&scattered, &inputs, ReduceOp::Sum)
                .unwrap(),
            pg.barrier_async().unwrap(),
        ];
        for w in &works {
            w.wait().unwrap();
            assert!(w.is_completed());
        }
        let sum = |n: usize, i: usize| (0..world).map(|r| data(r, n)[i]).sum::<f64>();
        assert_close(
            &values(&a),
            &(0..5).map(|i| sum(5, i)).collect::<Vec<_>>(),
            DType::F32,
            "a",
        );
        for (r, o) in outputs.iter().enumerate() {
            assert_close(
                &values(o),
                &data(r, 4),
                DType::F32,
                "all_gather before broadcast",
            );
        }
        assert_close(&values(&b), &data(0, 4), DType::F32, "broadcast");
        let want: Vec<f64> = (0..2)
            .map(|i| (0..world).map(|r| data(rank + r, 2)[i]).sum())
            .collect();
        assert_close(&values(&scattered), &want, DType::F32, "reduce_scatter");
    });
}

#[test]
fn a_rank_that_skips_a_collective_times_the_other_out() {
    if let Err(why) = devices_for(2) {
        skip!("{why}");
    }
    // Rank 0's timeout aborts its communicator (ncclCommAbort), which wakes its
    // communication thread (waiting in the emulator's NCCL for rank 1) and makes the
    // clique unusable: rank 1's later call fails too, and both groups are destroyed at
    // once, long before the emulator's own 120 s wait.
    let timed_out = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let started = std::time::Instant::now();
    let out = ranks(2, Duration::from_secs(2), move |pg| {
        let (flag, cv) = &*timed_out;
        if pg.rank() == 1 {
            // Skips the all-reduce; comes back once rank 0 has given up.
            let g = flag.lock().unwrap();
            let g = cv
                .wait_timeout_while(g, Duration::from_secs(60), |done| !*done)
                .unwrap()
                .0;
            assert!(*g, "rank 0 never timed out");
            drop(g);
            let e = pg.barrier().unwrap_err();
            let broken = pg.is_broken();
            let destroyed = pg.destroy().map_err(|e| e.to_string());
            return (e.kind(), e.to_string(), broken, String::new(), destroyed);
        }
        let t = Tensor::ones([4], (&Device::Cuda(0), DType::F32)).unwrap();
        let e = pg.all_reduce(&t, ReduceOp::Sum).unwrap_err();
        let again = pg.barrier().unwrap_err();
        *flag.lock().unwrap() = true;
        cv.notify_all();
        let broken = pg.is_broken();
        let destroyed = pg.destroy().map_err(|e| e.to_string());
        (
            e.kind(),
            e.to_string(),
            broken,
            again.to_string(),
            destroyed,
        )
    });
    let (kind, msg, broken, again, destroyed) = out[0].clone();
    assert_eq!(kind, ErrorKind::Distributed);
    assert!(
        msg.contains("rank 0: nccl:all_reduce") && msg.contains("timed out"),
        "{msg}"
    );
    assert!(broken);
    assert!(
        again.contains("rank 0: nccl:barrier")
            && again.contains("unusable")
            && again.contains("communicator was aborted"),
        "{again}"
    );
    // The aborted communicator let the communication thread go: destroy joined it.
    assert_eq!(destroyed, Ok(()));
    let (kind, msg, broken, _, destroyed) = out[1].clone();
    assert_eq!(kind, ErrorKind::Distributed);
    assert!(msg.contains("rank 1: nccl:barrier"), "{msg}");
    if cuda::is_emulated() {
        // The emulator's words for a clique one of whose communicators was aborted.
        assert!(
            msg.contains("communicator of rank 0 of this clique was aborted"),
            "{msg}"
        );
    }
    assert!(broken);
    assert_eq!(destroyed, Ok(()));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn mismatched_inputs_fail_on_every_rank() {
    if let Err(why) = devices_for(2) {
        skip!("{why}");
    }
    let out = ranks(2, Duration::from_secs(60), |pg| {
        let t = Tensor::zeros([3 + pg.rank()], (&Device::Cuda(pg.rank()), DType::F32)).unwrap();
        let e = pg.all_reduce(&t, ReduceOp::Sum).unwrap_err();
        // The group stays usable after a mismatch.
        pg.barrier().unwrap();
        (e.kind(), e.to_string())
    });
    for (kind, msg) in out {
        assert_eq!(kind, ErrorKind::Shape);
        assert!(
            msg.contains("the ranks' inputs differ")
                && msg.contains("rank 1: all_reduce(sum) of torch.float32 [4]"),
            "{msg}"
        );
    }
}

#[test]
fn cpu_tensors_and_other_devices_are_named_errors() {
    if let Err(why) = devices_for(3) {
        skip!("{why}");
    }
    let out = ranks(2, Duration::from_secs(60), |pg| {
        let cpu = Tensor::zeros([2], (&Device::Cpu, DType::F32)).unwrap();
        let e = pg.all_reduce(&cpu, ReduceOp::Sum).unwrap_err();
        let other = Tensor::zeros([2], (&Device::Cuda(2), DType::F32)).unwrap();
        let f = pg.broadcast(&other, 0).unwrap_err();
        pg.barrier().unwrap();
        (e.kind(), e.to_string(), f.kind(), f.to_string())
    });
    for (rank, (ek, e, fk, f)) in out.into_iter().enumerate() {
        assert_eq!(ek, ErrorKind::DeviceMismatch);
        assert!(
            e.contains(&format!("rank {rank}: nccl:all_reduce"))
                && e.contains("found a tensor on cpu"),
            "{e}"
        );
        assert_eq!(fk, ErrorKind::DeviceMismatch);
        assert!(
            f.contains(&format!(
                "communicator is on cuda:{rank}, but found a tensor on cuda:2"
            )),
            "{f}"
        );
    }
}

/// A group of world size 1 on `cuda:{device}`, with no store.
fn group_of_one(device: usize) -> ember_autograd::Result<ProcessGroup> {
    ProcessGroup::new(
        InitOptions::new(
            Backend::Nccl,
            InitMethod::Explicit {
                rank: 0,
                world_size: 1,
            },
        )
        .with_device(device),
    )
}

/// World size 1 on `cuda:0` (the real GPU under `EMBER_GPU_TEST=1`): every collective, no
/// store needed.
#[test]
fn world_size_one_runs_every_collective() {
    devices_for(1).unwrap();
    let dev = Device::Cuda(0);
    let pg = group_of_one(0).unwrap();
    for dtype in [DType::F32, DType::F16, DType::I32] {
        for op in OPS {
            let t = tensor(&data(0, 7), &[7], dtype, dev);
            pg.all_reduce(&t, op).unwrap();
            let want: Vec<f64> = data(0, 7)
                .iter()
                .map(|&x| reduce(&[x], op, dtype))
                .collect();
            assert_close(
                &values(&t),
                &want,
                dtype,
                &format!("all_reduce {op:?} {dtype}"),
            );
        }
        let t = tensor(&data(0, 7), &[7], dtype, dev);
        pg.broadcast_async(&t, 0).unwrap().wait().unwrap();
        assert_close(&values(&t), &data(0, 7), dtype, "broadcast");
        let out = Tensor::zeros([7], (&dev, dtype)).unwrap();
        pg.all_gather(std::slice::from_ref(&out), &t).unwrap();
        assert_close(&values(&out), &data(0, 7), dtype, "all_gather");
        let red = Tensor::zeros([7], (&dev, dtype)).unwrap();
        pg.reduce_scatter(&red, std::slice::from_ref(&t), ReduceOp::Sum)
            .unwrap();
        assert_close(&values(&red), &data(0, 7), dtype, "reduce_scatter");
    }
    pg.barrier().unwrap();
    pg.destroy().unwrap();
}

/// The failure paths of one rank on `cuda:0` (the real GPU under `EMBER_GPU_TEST=1`): each
/// bad argument, sync or async, is an error naming what was expected and what was found,
/// and the group stays usable after it; a tensor on another device needs a second one.
#[test]
fn world_size_one_names_bad_arguments_and_stays_usable() {
    devices_for(1).unwrap();
    let dev = Device::Cuda(0);
    let pg = group_of_one(0).unwrap();
    let t = tensor(&data(0, 4), &[4], DType::F32, dev);
    let zeros = |n: usize, dtype: DType, d: Device| Tensor::zeros([n], (&d, dtype)).unwrap();
    let check = |r: ember_autograd::Result<()>, kind: ErrorKind, parts: &[&str]| {
        let e = r.unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.kind(), kind, "{msg}");
        for p in parts {
            assert!(msg.contains(p), "{p:?} not in {msg:?}");
        }
    };
    check(
        pg.all_reduce(&zeros(2, DType::F32, Device::Cpu), ReduceOp::Sum),
        ErrorKind::DeviceMismatch,
        &["rank 0: nccl:all_reduce", "found a tensor on cpu"],
    );
    check(
        pg.broadcast(&t, 1),
        ErrorKind::InvalidArgument,
        &[
            "nccl:broadcast",
            "src 1 is not a rank of a group of world size 1",
        ],
    );
    check(
        pg.broadcast_async(&t, 3).map(drop),
        ErrorKind::InvalidArgument,
        &["src 3 is not a rank"],
    );
    check(
        pg.all_gather(&[zeros(4, DType::F32, dev), zeros(4, DType::F32, dev)], &t),
        ErrorKind::InvalidArgument,
        &[
            "nccl:all_gather",
            "expected 1 outputs (one per rank), but found 2",
        ],
    );
    check(
        pg.all_gather(&[zeros(5, DType::F32, dev)], &t),
        ErrorKind::Shape,
        &["nccl:all_gather", "outputs[0] is", "[5]", "but expected"],
    );
    check(
        pg.reduce_scatter(&t, &[zeros(4, DType::F16, dev)], ReduceOp::Sum),
        ErrorKind::Shape,
        &["nccl:reduce_scatter", "inputs[0] is", "float16"],
    );
    if cuda::device_count() >= 2 {
        let other = zeros(2, DType::F32, Device::Cuda(1));
        check(
            pg.broadcast(&other, 0),
            ErrorKind::DeviceMismatch,
            &["communicator is on cuda:0, but found a tensor on cuda:1"],
        );
    } else {
        skip_part("a tensor on cuda:1 needs a second CUDA device; this machine has 1");
    }
    // Nothing was enqueued by the refused calls: the group works on.
    pg.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_close(&values(&t), &data(0, 4), DType::F32, "after the errors");
    pg.barrier().unwrap();
    pg.destroy().unwrap();
}

/// A group asked for on a CUDA device the machine lacks is an error naming the device,
/// not a panic or a hang.
#[test]
fn a_group_on_a_missing_device_is_a_named_error() {
    devices_for(1).unwrap();
    let n = cuda::device_count();
    let e = group_of_one(n).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("cuda:{n}")) || msg.contains(&n.to_string()),
        "{msg}"
    );
}

// --- DDP over an nccl group ------------------------------------------------------------------

const B: usize = 4;
const STEPS: usize = 10;

fn mlp(device: Device) -> ember_nn::Result<Sequential> {
    let m = Sequential::new()
        .add(Linear::new(6, 16, ())?)
        .add(Tanh::new())
        .add(Linear::new(16, 3, ())?);
    m.to(device)?;
    Ok(m)
}

fn batch(s: usize, n: usize, device: Device) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..n * 6)
        .map(|i| (((i * 7 + s * 13) % 23) as f32 / 11.0) - 1.0)
        .collect();
    let y: Vec<f32> = (0..n * 3)
        .map(|i| (((i * 5 + s * 3) % 17) as f32 / 8.0) - 1.0)
        .collect();
    (
        Tensor::from_vec(x, [n, 6], device).unwrap(),
        Tensor::from_vec(y, [n, 3], device).unwrap(),
    )
}

fn sgd(params: Vec<Tensor>) -> SGD {
    SGD::new(
        params,
        SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The mean squared error of `m` on `(x, y)`.
fn mse(m: &dyn Module, x: &Tensor, y: &Tensor) -> Tensor {
    m.call(x)
        .unwrap()
        .sub(y)
        .unwrap()
        .square()
        .unwrap()
        .mean_all()
        .unwrap()
}

fn params(m: &dyn Module) -> Vec<Vec<f64>> {
    m.named_parameters()
        .iter()
        .map(|(_, p)| values(p))
        .collect()
}

/// DDP over 2 ranks on emulated cuda:0 and cuda:1 (batch B each) equals one model trained
/// on the global batch of 2B.
#[test]
fn ddp_over_an_nccl_group_equals_one_process() {
    if let Err(why) = devices_for(2) {
        skip!("{why}");
    }
    let world = 2;
    // The models are made here, one after another (the generator is the process's): rank
    // 1's starts from other weights, which DDP replaces by rank 0's.
    ember_tensor::random::manual_seed(7);
    let reference = mlp(Device::Cuda(0)).unwrap();
    let models: Vec<std::sync::Mutex<Option<Sequential>>> = (0..world)
        .map(|r| {
            ember_tensor::random::manual_seed(if r == 0 { 7 } else { 99 });
            std::sync::Mutex::new(Some(mlp(Device::Cuda(r)).unwrap()))
        })
        .collect();
    let models = Arc::new(models);
    let out = ranks(world, Duration::from_secs(120), move |pg| {
        let (rank, dev) = (pg.rank(), Device::Cuda(pg.rank()));
        let model = models[rank].lock().unwrap().take().unwrap();
        let ddp = DistributedDataParallel::new(model, pg, DdpOptions::default()).unwrap();
        let mut opt = sgd(ddp.parameters());
        for s in 0..STEPS {
            opt.zero_grad(true).unwrap();
            let (x, y) = batch(s, world * B, dev);
            let (xs, ys) = (
                x.narrow(0, rank * B, B).unwrap(),
                y.narrow(0, rank * B, B).unwrap(),
            );
            mse(&ddp, &xs, &ys).backward().unwrap();
            opt.step().unwrap();
        }
        params(ddp.module())
    });
    let mut opt = sgd(reference.parameters());
    for s in 0..STEPS {
        opt.zero_grad(true).unwrap();
        let (x, y) = batch(s, world * B, Device::Cuda(0));
        mse(&reference, &x, &y).backward().unwrap();
        opt.step().unwrap();
    }
    let want = params(&reference);
    for (rank, got) in out.iter().enumerate() {
        for (g, w) in got.iter().zip(&want) {
            for (a, b) in g.iter().zip(w) {
                assert!((a - b).abs() <= 1e-5, "rank {rank}: {a} vs {b}");
            }
        }
    }
}
