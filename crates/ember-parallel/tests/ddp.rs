//! DistributedDataParallel over 2 and 3 MPI ranks: training equals one process with the
//! global batch (SGD and Adam, with and without `no_sync` accumulation), buckets overlap
//! backward, unused parameters, mismatched models, and CUDA tensors (emulated) through the
//! mpi backend.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use ember_autograd::Tensor;
use ember_device::trace::{self, Category, Stamp, Subscriber, TraceEvent};
use ember_nn::layers::{Linear, Sequential, Tanh};
use ember_nn::optim::{Adam, AdamOptions, Optimizer, SGD, SgdOptions};
use ember_nn::{Module, Result};
use ember_parallel::group::{self, Backend, InitMethod, ProcessGroup};
use ember_parallel::testing;
use ember_parallel::{DdpOptions, DistributedDataParallel};
use ember_tensor::{DType, Device};

const B: usize = 4;
const STEPS: usize = 10;

fn mlp(seed: u64, device: Device) -> Result<Sequential> {
    ember_tensor::random::manual_seed(seed);
    let m = Sequential::new()
        .add(Linear::new(6, 16, ())?)
        .add(Tanh::new())
        .add(Linear::new(16, 3, ())?);
    m.to(device)?;
    Ok(m)
}

/// Step `s`'s global batch of `n` rows: inputs and targets, the same on every rank.
fn global_batch(s: usize, n: usize, device: Device) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..n * 6)
        .map(|i| (((i * 7 + s * 13) % 23) as f32 / 11.0) - 1.0)
        .collect();
    let y: Vec<f32> = (0..n * 3)
        .map(|i| (((i * 5 + s * 3) % 17) as f32 / 8.0) - 1.0)
        .collect();
    Ok((
        Tensor::from_vec(x, [n, 6], device)?,
        Tensor::from_vec(y, [n, 3], device)?,
    ))
}

fn loss(model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    model.call(x)?.sub(y)?.square()?.mean_all()
}

fn optimizer(adam: bool, params: Vec<Tensor>) -> Result<Box<dyn Optimizer>> {
    Ok(if adam {
        Box::new(Adam::new(
            params,
            AdamOptions {
                lr: 0.01,
                ..Default::default()
            },
        )?)
    } else {
        Box::new(SGD::new(
            params,
            SgdOptions {
                lr: 0.1,
                momentum: 0.9,
                ..Default::default()
            },
        )?)
    })
}

fn max_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Result<f64> {
    let mut worst = 0.0f64;
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let (va, vb) = (
            ta.to_dtype(DType::F64)?.to_vec::<f64>()?,
            tb.to_dtype(DType::F64)?.to_vec::<f64>()?,
        );
        for (x, y) in va.iter().zip(&vb) {
            worst = worst.max((x - y).abs());
        }
    }
    Ok(worst)
}

/// DDP over the ranks (batch B each, `micro` micro-batches per step, all but the last in
/// `no_sync`) against one model trained on the global batches in this process.
fn ddp_matches_one_process(adam: bool, micro: usize, device: Device) -> Result<()> {
    let pg = group::init_process_group(Backend::Mpi, InitMethod::Mpi)?;
    let (rank, world) = (pg.rank(), pg.world_size());
    // Each rank starts from different weights: DDP broadcasts rank 0's.
    let ddp =
        DistributedDataParallel::new(mlp(100 + rank as u64, device)?, &pg, DdpOptions::default())?;
    let reference = mlp(100, device)?;
    let mut opt = optimizer(adam, ddp.parameters())?;
    let mut ref_opt = optimizer(adam, reference.parameters())?;
    assert!(
        max_diff(
            &ddp.module().named_parameters(),
            &reference.named_parameters()
        )? == 0.0
    );
    for s in 0..STEPS {
        opt.zero_grad(true)?;
        ref_opt.zero_grad(true)?;
        for m in 0..micro {
            let (x, y) = global_batch(s * micro + m, world * B, device)?;
            let (xs, ys) = (x.narrow(0, rank * B, B)?, y.narrow(0, rank * B, B)?);
            if m + 1 < micro {
                let _no_sync = ddp.no_sync();
                loss(&ddp, &xs, &ys)?.backward()?;
            } else {
                loss(&ddp, &xs, &ys)?.backward()?;
            }
            loss(&reference, &x, &y)?.backward()?;
        }
        opt.step()?;
        ref_opt.step()?;
    }
    let d = max_diff(
        &ddp.module().named_parameters(),
        &reference.named_parameters(),
    )?;
    if d > 1e-5 {
        return Err(ember_nn::Error::invalid(
            "test",
            format!("rank {rank}: DDP parameters differ from one process's by {d}"),
        ));
    }
    drop(ddp);
    group::destroy_process_group()
}

#[test]
fn sgd_on_two_ranks_equals_one_process() {
    testing::ranks(2, "sgd_on_two_ranks_equals_one_process", || {
        ddp_matches_one_process(false, 1, Device::Cpu)
    });
}

#[test]
fn adam_on_three_ranks_equals_one_process() {
    testing::ranks(3, "adam_on_three_ranks_equals_one_process", || {
        ddp_matches_one_process(true, 1, Device::Cpu)
    });
}

#[test]
fn no_sync_accumulation_on_two_ranks_equals_one_process() {
    testing::ranks(
        2,
        "no_sync_accumulation_on_two_ranks_equals_one_process",
        || {
            ddp_matches_one_process(false, 3, Device::Cpu)?;
            Ok::<(), ember_nn::Error>(())
        },
    );
}

#[test]
fn adam_with_no_sync_on_three_ranks_equals_one_process() {
    testing::ranks(
        3,
        "adam_with_no_sync_on_three_ranks_equals_one_process",
        || ddp_matches_one_process(true, 2, Device::Cpu),
    );
}

/// The ranks' CUDA tensors (an emulated device per rank) go through the mpi backend staged
/// through host memory.
#[test]
fn ddp_on_emulated_cuda_devices_through_mpi() {
    let opts = testing::RunRanks::new(2, "ddp_on_emulated_cuda_devices_through_mpi")
        .env("EMBER_CUDA_EMULATOR", "1");
    if let Some(out) = testing::in_ranks(&opts, || {
        assert!(ember_device::cuda::is_available());
        ddp_matches_one_process(true, 1, Device::Cuda(0))
    }) {
        assert!(
            out.all_passed(),
            "{}",
            testing::report("ddp_on_emulated_cuda_devices_through_mpi", &out)
        );
    }
}

/// Records collective and backward ranges with their times.
#[derive(Debug, Default)]
struct Ranges(Mutex<Vec<(String, Category, Stamp, Stamp)>>);

impl Subscriber for Ranges {
    fn on_event(&self, e: &TraceEvent) {
        if let Ok(mut v) = self.0.lock() {
            v.push((e.name.to_string(), e.category, e.start, e.end));
        }
    }
}

fn deep_mlp(layers: usize) -> Result<Sequential> {
    ember_tensor::random::manual_seed(7);
    let mut m = Sequential::new();
    for _ in 0..layers {
        m = m.add(Linear::new(64, 64, ())?).add(Tanh::new());
    }
    Ok(m)
}

#[test]
fn buckets_follow_reverse_order_and_overlap_backward() {
    testing::ranks(
        2,
        "buckets_follow_reverse_order_and_overlap_backward",
        || {
            let pg = group::init_process_group(Backend::Mpi, InitMethod::Mpi)?;
            // 6 layers of 64x64 (+bias): 16,640 bytes each. A bucket closes once it reaches
            // its cap: 16,000 bytes close the first after one layer, 40,000 the next after
            // three, and the last two layers are the last bucket.
            let ddp = DistributedDataParallel::new(
                deep_mlp(6)?,
                &pg,
                DdpOptions {
                    first_bucket_cap_mb: 16_000.0 / 1048576.0,
                    bucket_cap_mb: 40_000.0 / 1048576.0,
                    ..Default::default()
                },
            )?;
            let names = ddp.bucket_parameter_names();
            assert_eq!(names[0], ["10.bias", "10.weight"], "{names:?}");
            assert_eq!(
                names[1],
                [
                    "8.bias", "8.weight", "6.bias", "6.weight", "4.bias", "4.weight"
                ],
                "{names:?}"
            );
            assert_eq!(
                names[2],
                ["2.bias", "2.weight", "0.bias", "0.weight"],
                "{names:?}"
            );
            assert_eq!(names.len(), 3, "{names:?}");
            let ranges = Arc::new(Ranges::default());
            let sub = trace::subscribe(ranges.clone());
            let x = Tensor::ones([32, 64], ())?;
            ddp.call(&x)?.square()?.sum_all()?.backward()?;
            drop(sub);
            let v = ranges.0.lock().unwrap().clone();
            let reduces: Vec<Stamp> = v
                .iter()
                .filter(|(n, ..)| n == "mpi:all_reduce")
                .map(|(_, _, s, _)| *s)
                .collect();
            assert_eq!(reduces.len(), 3, "one all-reduce per bucket: {v:?}");
            let last_backward_end = v
                .iter()
                .filter(|(_, c, ..)| *c == Category::Backward)
                .map(|(.., e)| *e)
                .max()
                .unwrap();
            assert!(
                reduces[0] < last_backward_end,
                "the first bucket's all-reduce starts before backward ends"
            );
            drop(ddp);
            group::destroy_process_group()
        },
    );
}

/// A model whose second layer is only used when asked.
#[derive(Debug, ember_nn::Module)]
#[module(no_replicate)] // an AtomicBool is not Clone; DDP needs no replica
struct Branchy {
    a: Linear,
    b: Linear,
    #[module(skip)]
    use_b: std::sync::atomic::AtomicBool,
}

impl Module for Branchy {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.a.call(x)?;
        if self.use_b.load(std::sync::atomic::Ordering::Relaxed) {
            self.b.call(&h)
        } else {
            Ok(h)
        }
    }
}

fn branchy(use_b: bool) -> Result<Branchy> {
    ember_tensor::random::manual_seed(3);
    Ok(Branchy {
        a: Linear::new(4, 4, ())?,
        b: Linear::new(4, 4, ())?,
        use_b: std::sync::atomic::AtomicBool::new(use_b),
    })
}

#[test]
fn unused_parameters_need_find_unused_parameters() {
    testing::ranks(2, "unused_parameters_need_find_unused_parameters", || {
        let pg = group::init_process_group(Backend::Mpi, InitMethod::Mpi)?;
        let rank = pg.rank();
        let x = Tensor::ones([2, 4], ())?;
        // Without find_unused_parameters: the next forward names the parameters.
        let ddp = DistributedDataParallel::new(branchy(false)?, &pg, DdpOptions::default())?;
        ddp.call(&x)?.sum_all()?.backward()?;
        let e = ddp.call(&x).unwrap_err();
        assert!(
            e.to_string()
                .contains("Expected to have finished reduction"),
            "{e}"
        );
        assert!(e.to_string().contains("b.weight"), "{e}");
        drop(ddp);
        // With it: `b` is used on rank 1 only; its gradient is rank 1's divided by 2 on both
        // ranks; `a`'s is averaged as usual.
        let ddp = DistributedDataParallel::new(
            branchy(rank == 1)?,
            &pg,
            DdpOptions {
                find_unused_parameters: true,
                ..Default::default()
            },
        )?;
        for _ in 0..2 {
            ddp.zero_grad(true)?;
            ddp.call(&x)?.sum_all()?.backward()?;
        }
        let gb = ddp
            .module()
            .b
            .weight
            .grad()
            .expect("b is used on some rank");
        // rank 1: d(sum(b(a x)))/dW_b = ones(4,1) @ h.sum(0)^T, halved by the average.
        let h = ddp.module().a.call(&x)?.sum(0)?;
        let expect = Tensor::ones([4, 1], ())?
            .matmul(&h.reshape([1, 4])?)?
            .div(2.0)?;
        let diff = gb.sub(&expect)?.abs()?.max_all()?.item::<f32>()?;
        assert!(diff < 1e-6, "rank {rank}: b.weight.grad off by {diff}");
        drop(ddp);
        // A parameter no rank uses keeps no gradient.
        let ddp = DistributedDataParallel::new(
            branchy(false)?,
            &pg,
            DdpOptions {
                find_unused_parameters: true,
                ..Default::default()
            },
        )?;
        ddp.call(&x)?.sum_all()?.backward()?;
        assert!(ddp.module().b.weight.grad().is_none());
        assert!(ddp.module().a.weight.grad().is_some());
        drop(ddp);
        group::destroy_process_group()
    });
}

#[test]
fn mismatched_models_are_a_named_error() {
    testing::ranks(2, "mismatched_models_are_a_named_error", || {
        let pg = group::init_process_group(Backend::Mpi, InitMethod::Mpi)?;
        let rank = pg.rank();
        let out = if rank == 0 { 3 } else { 5 };
        let model = Sequential::new()
            .add(Linear::new(4, 4, ())?)
            .add(Linear::new(4, out, ())?);
        let e = DistributedDataParallel::new(model, &pg, DdpOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("'1.weight'"), "{msg}");
        assert!(msg.contains("rank 0") && msg.contains("rank 1"), "{msg}");
        group::destroy_process_group()
    });
}

/// With one rank, DDP is the module: gradients untouched.
#[test]
fn one_rank_is_the_module_itself() {
    testing::ranks(1, "one_rank_is_the_module_itself", || {
        let pg: ProcessGroup = group::init_process_group(Backend::Mpi, InitMethod::Mpi)?;
        let ddp = DistributedDataParallel::new(mlp(1, Device::Cpu)?, &pg, DdpOptions::default())?;
        let reference = mlp(1, Device::Cpu)?;
        let (x, y) = global_batch(0, B, Device::Cpu)?;
        loss(&ddp, &x, &y)?.backward()?;
        loss(&reference, &x, &y)?.backward()?;
        let grads = |m: &dyn Module| -> Vec<(String, Tensor)> {
            m.named_parameters()
                .into_iter()
                .map(|(n, p)| (n, p.grad().unwrap()))
                .collect()
        };
        assert_eq!(max_diff(&grads(ddp.module()), &grads(&reference))?, 0.0);
        drop(ddp);
        group::destroy_process_group()
    });
}
