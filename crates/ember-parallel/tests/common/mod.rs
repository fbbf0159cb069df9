//! Test bodies shared by the 2- and 3-device binaries (each installs the emulator with its
//! device count first: a process has one CUDA driver).
#![allow(clippy::unwrap_used, dead_code)]

use ember_device::Device;
use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_nn::layers::{BatchNorm2d, Conv2d, Flatten, Linear, ReLU, Sequential};
use ember_nn::loss::CrossEntropyLoss;
use ember_nn::optim::{Adam, AdamOptions, Optimizer, SGD, SgdOptions};
use ember_nn::{Loss, Module, ReplicaMemo, Replicate, Result, Tensor};
use ember_parallel::DataParallel;
use ember_parallel::comm::{self, Broadcast, Gather, ReduceAddCoalesced, Scatter, chunk_sizes};
use ember_tensor::DType;

pub fn install(devices: usize) {
    cuda::use_emulator(EmulatorConfig::devices(devices)).unwrap();
    assert_eq!(cuda::device_count(), devices);
}

fn cuda0() -> Device {
    Device::Cuda(0)
}

pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_device(Device::Cpu).unwrap().to_vec::<f64>().unwrap()
}

pub fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let (x, y) = (values(a), values(b));
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!(
            (p - q).abs() <= tol * (1.0 + q.abs()),
            "{what}: element {i}: {p} vs {q}"
        );
    }
}

pub fn mlp() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(6, 16, ())?)
        .add(ReLU::new())
        .add(Linear::new(16, 4, ())?))
}

/// A derived generic module of modules: `x + inner(x)`.
#[derive(Debug, Module)]
pub struct Residual<M: Module> {
    inner: M,
}

impl<M: Module> Module for Residual<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.add(&self.inner.call(x)?)
    }
}

/// An MLP with a `Residual<Linear>` and a `Residual<Sequential>` among its layers, which
/// DataParallel replicates through their boxed replicas (Note [Boxed replicas of generic
/// modules] in `ember-nn`).
pub fn residual_mlp() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(6, 16, ())?)
        .add(ReLU::new())
        .add(Residual {
            inner: Linear::new(16, 16, ())?,
        })
        .add(Residual {
            inner: Sequential::new()
                .add(Linear::new(16, 16, ())?)
                .add(ReLU::new()),
        })
        .add(Linear::new(16, 4, ())?))
}

pub fn conv_bn() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Conv2d::new(2, 4, 3, ())?)
        .add(BatchNorm2d::new(4, ())?)
        .add(ReLU::new())
        .add(Flatten::new())
        .add(Linear::new(4 * 3 * 3, 3, ())?))
}

/// A module on cuda:0 and an independent copy of it (same values, own tensors).
fn pair(make: fn() -> Result<Sequential>) -> (Sequential, Sequential) {
    let a = make().unwrap();
    let b = make().unwrap();
    b.load_state_dict(&a.state_dict().unwrap()).unwrap();
    a.to(cuda0()).unwrap();
    b.to(cuda0()).unwrap();
    (a, b)
}

fn wrap(m: Sequential) -> DataParallel<Sequential> {
    DataParallel::new(m, None, None).unwrap()
}

/// A module whose hand-written replica has another structure than the module.
#[derive(Debug, Module)]
#[module(no_replicate)]
struct Lopsided(Sequential);

impl Module for Lopsided {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.call(x)
    }
}

impl Replicate for Lopsided {
    fn replicate_with(&self, _memo: &mut ReplicaMemo) -> Result<Self> {
        Ok(Lopsided(Sequential::new().add(Linear::new(6, 4, ())?)))
    }
}

/// The single-device meaning of DataParallel: the module on each `torch.chunk` of the batch,
/// outputs concatenated; the buffers (running statistics) are those after chunk 0, as
/// device 0's replica keeps them.
fn reference_forward(m: &Sequential, x: &Tensor, devices: usize) -> Tensor {
    let sizes = chunk_sizes(x.dims()[0], devices);
    let mut outs = Vec::new();
    let mut kept: Option<Vec<Tensor>> = None;
    let mut start = 0;
    for (i, n) in sizes.iter().enumerate() {
        outs.push(m.call(&x.narrow(0, start, *n).unwrap()).unwrap());
        if i == 0 {
            kept = Some(
                m.buffers()
                    .iter()
                    .map(|b| b.detach().data().copy().unwrap())
                    .collect(),
            );
        }
        start += n;
    }
    if let Some(kept) = kept {
        let _g = ember_autograd::no_grad();
        for (b, k) in m.buffers().iter().zip(kept) {
            b.set_data(&k.data());
        }
    }
    let refs: Vec<&Tensor> = outs.iter().collect();
    Tensor::cat(&refs, 0).unwrap()
}

pub fn forward_equals_the_module(devices: usize) {
    for batch in [1, devices, 2 * devices + 1, 7] {
        let (a, b) = pair(mlp);
        let dp = wrap(a);
        let x = Tensor::randn([batch, 6], cuda0()).unwrap();
        let y = dp.call(&x).unwrap();
        assert_eq!(y.device(), cuda0());
        assert_close(
            &y,
            &b.call(&x).unwrap(),
            1e-5,
            &format!("forward, batch {batch}"),
        );
    }
}

pub fn gradients_equal_single_device(devices: usize) {
    let (a, b) = pair(mlp);
    let dp = wrap(a);
    let x = Tensor::randn([2 * devices + 1, 6], cuda0()).unwrap();
    let xa = x.detach().requires_grad_(true).unwrap();
    let xb = x.detach().requires_grad_(true).unwrap();
    dp.call(&xa)
        .unwrap()
        .pow(2.0)
        .unwrap()
        .mean_all()
        .unwrap()
        .backward()
        .unwrap();
    b.call(&xb)
        .unwrap()
        .pow(2.0)
        .unwrap()
        .mean_all()
        .unwrap()
        .backward()
        .unwrap();
    for ((n, p), q) in dp
        .module()
        .named_parameters()
        .into_iter()
        .zip(b.parameters())
    {
        let (gp, gq) = (p.grad().unwrap(), q.grad().unwrap());
        assert_eq!(gp.device(), cuda0(), "{n}");
        assert_close(&gp, &gq, 1e-5, &format!("grad of {n}"));
    }
    assert_close(
        &xa.grad().unwrap(),
        &xb.grad().unwrap(),
        1e-5,
        "grad of the input",
    );
    // A second backward accumulates, as on one device.
    dp.call(&xa).unwrap().sum_all().unwrap().backward().unwrap();
    b.call(&xb).unwrap().sum_all().unwrap().backward().unwrap();
    for (p, q) in dp.module().parameters().into_iter().zip(b.parameters()) {
        assert_close(
            &p.grad().unwrap(),
            &q.grad().unwrap(),
            1e-5,
            "accumulated grad",
        );
    }
}

fn train(
    make: fn() -> Result<Sequential>,
    input: &[usize],
    classes: usize,
    adam: bool,
    devices: usize,
) {
    let (a, b) = pair(make);
    let dp = wrap(a);
    let opt = |m: &dyn Module| -> Box<dyn Optimizer> {
        if adam {
            Box::new(
                Adam::new(
                    m.parameters(),
                    AdamOptions {
                        lr: 1e-2,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        } else {
            Box::new(
                SGD::new(
                    m.parameters(),
                    SgdOptions {
                        lr: 0.1,
                        momentum: 0.9,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        }
    };
    let (mut oa, mut ob) = (opt(dp.module()), opt(&b));
    let loss = CrossEntropyLoss::new();
    let batch = input[0];
    for step in 0..4 {
        let x = Tensor::randn(input.to_vec(), cuda0()).unwrap();
        let y = Tensor::randint(0, classes as i64, [batch], cuda0()).unwrap();
        oa.zero_grad(true).unwrap();
        ob.zero_grad(true).unwrap();
        let la = loss.forward(&dp.call(&x).unwrap(), &y).unwrap();
        let lb = loss
            .forward(&reference_forward(&b, &x, devices), &y)
            .unwrap();
        assert_close(&la, &lb, 1e-5, &format!("loss at step {step}"));
        la.backward().unwrap();
        lb.backward().unwrap();
        oa.step().unwrap();
        ob.step().unwrap();
    }
    for ((n, p), q) in dp
        .module()
        .named_parameters()
        .into_iter()
        .zip(b.parameters())
    {
        assert_close(&p, &q, 1e-4, &format!("{n} after training"));
    }
    for ((n, p), q) in dp.module().named_buffers().into_iter().zip(b.buffers()) {
        assert_close(&p, &q, 1e-4, &format!("buffer {n} after training"));
    }
    // Evaluation mode: the replicas use the kept running statistics.
    dp.eval();
    b.eval();
    let x = Tensor::randn(input.to_vec(), cuda0()).unwrap();
    assert_close(
        &dp.call(&x).unwrap(),
        &b.call(&x).unwrap(),
        1e-4,
        "eval forward",
    );
}

pub fn training_matches_single_device(devices: usize) {
    for adam in [false, true] {
        train(mlp, &[2 * devices + 1, 6], 4, adam, devices);
        train(residual_mlp, &[2 * devices + 1, 6], 4, adam, devices);
        train(conv_bn, &[3 * devices + 1, 2, 5, 5], 3, adam, devices);
    }
}

/// See Note [Replica gradients in device order]: the replicas run at once, and the result must
/// not depend on how their threads interleave, so the same training repeated gives the same
/// bits. A conv bias before BatchNorm has a gradient that is zero up to rounding, which
/// Adam scales to a full step: a summation order that follows thread timing shows here.
pub fn training_is_repeatable(devices: usize) {
    let init = conv_bn().unwrap();
    let batch = 3 * devices + 1;
    let data: Vec<(Tensor, Tensor)> = (0..3)
        .map(|_| {
            (
                Tensor::randn([batch, 2, 5, 5], cuda0()).unwrap(),
                Tensor::randint(0, 3, [batch], cuda0()).unwrap(),
            )
        })
        .collect();
    let loss = CrossEntropyLoss::new();
    let run = || -> Vec<f64> {
        let m = conv_bn().unwrap();
        m.load_state_dict(&init.state_dict().unwrap()).unwrap();
        m.to(cuda0()).unwrap();
        let dp = wrap(m);
        let options = AdamOptions {
            lr: 1e-2,
            ..Default::default()
        };
        let mut opt = Adam::new(dp.module().parameters(), options).unwrap();
        for (x, y) in &data {
            opt.zero_grad(true).unwrap();
            let l = loss.forward(&dp.call(x).unwrap(), y).unwrap();
            l.backward().unwrap();
            opt.step().unwrap();
        }
        dp.module().parameters().iter().flat_map(values).collect()
    };
    let first = run();
    for attempt in 1..6 {
        assert_eq!(run(), first, "run {attempt} differs from run 0");
    }
}

pub fn errors_are_clear(devices: usize) {
    // The module must be on device_ids[0].
    let m = mlp().unwrap();
    let dp = DataParallel::new(m, None, None).unwrap();
    let x = Tensor::randn([4, 6], cuda0()).unwrap();
    let e = dp.call(&x).unwrap_err().to_string();
    assert!(e.contains("device_ids[0]") && e.contains("cpu"), "{e}");
    // Device lists.
    let e = DataParallel::new(mlp().unwrap(), Some(vec![]), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty"), "{e}");
    let e = DataParallel::new(mlp().unwrap(), Some(vec![0, 0]), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    let e = DataParallel::new(mlp().unwrap(), Some(vec![devices]), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("cuda:{devices}")), "{e}");
    // An input on a CUDA device the wrapper does not use.
    let m = mlp().unwrap();
    m.to(Device::Cuda(1)).unwrap();
    let dp = DataParallel::new(m, Some(vec![1]), None).unwrap();
    let e = dp.call(&x).unwrap_err().to_string();
    assert!(e.contains("input is on cuda:0"), "{e}");
    // An input on the CPU is scattered from there.
    let cpu_x = Tensor::randn([3, 6], ()).unwrap();
    assert_eq!(dp.call(&cpu_x).unwrap().device(), Device::Cuda(1));
    // A hand-written replica of another structure.
    let m = Lopsided(mlp().unwrap());
    m.to(cuda0()).unwrap();
    let dp = DataParallel::new(m, None, None).unwrap();
    let e = dp.call(&x).unwrap_err().to_string();
    assert!(e.contains("another structure"), "{e}");
    // An empty batch.
    let (a, _) = pair(mlp);
    let dp = wrap(a);
    let e = dp
        .call(&Tensor::zeros([0, 6], cuda0()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty"), "{e}");
}

pub fn comm_functions(devices: usize) {
    let all: Vec<Device> = (0..devices).map(Device::Cuda).collect();
    for dtype in [DType::F32, DType::F16, DType::Bf16, DType::F64, DType::I64] {
        let a = Tensor::randint(-4, 5, [5, 3], cuda0())
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let b = Tensor::randint(-4, 5, [7], cuda0())
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let out = comm::broadcast_coalesced(&[a.clone(), b.clone()], &all).unwrap();
        assert_eq!(out.len(), devices);
        for (i, list) in out.iter().enumerate() {
            assert_eq!(list[0].device(), Device::Cuda(i));
            assert_eq!(list[0].dtype(), dtype);
            assert_eq!(values(&list[0]), values(&a), "{dtype} broadcast");
            assert_eq!(values(&list[1]), values(&b), "{dtype} broadcast");
        }
        // reduce_add_coalesced to each device in turn.
        for dest in 0..devices {
            let sums = comm::reduce_add_coalesced(&out, Some(Device::Cuda(dest))).unwrap();
            assert_eq!(sums[0].device(), Device::Cuda(dest));
            let want: Vec<f64> = values(&a).iter().map(|v| v * devices as f64).collect();
            assert_eq!(values(&sums[0]), want, "{dtype} reduce_add");
        }
        // To the CPU: the copy path.
        let sums = comm::reduce_add_coalesced(&out, Some(Device::Cpu)).unwrap();
        assert_eq!(sums[1].device(), Device::Cpu);
        let want: Vec<f64> = values(&b).iter().map(|v| v * devices as f64).collect();
        assert_eq!(values(&sums[1]), want);
    }
    // From the CPU: the copy path.
    let c = Tensor::randn([4], ()).unwrap();
    let mut with_cpu = vec![Device::Cpu];
    with_cpu.extend(&all);
    let out = comm::broadcast(&c, &with_cpu).unwrap();
    assert_eq!(out.len(), devices + 1);
    assert_eq!(values(&out[devices]), values(&c));
    // Scatter and gather.
    let t = Tensor::randn([2 * devices + 1, 3], cuda0()).unwrap();
    let parts = comm::scatter(&t, &all, None, 0).unwrap();
    let sizes: Vec<usize> = parts.iter().map(|p| p.dims()[0]).collect();
    assert_eq!(sizes, chunk_sizes(2 * devices + 1, devices));
    let back = comm::gather(&parts, 0, Some(Device::Cpu)).unwrap();
    assert_eq!(values(&back), values(&t));
    let mut custom = vec![1; devices];
    custom[0] = devices + 2;
    let parts = comm::scatter(&t, &all, Some(&custom), 0).unwrap();
    assert_eq!(parts[0].dims(), [devices + 2, 3]);
    assert!(comm::scatter(&t, &all, Some(&[1, 1][..devices.min(2)]), 0).is_err());
    let cols = comm::scatter(&t, &all, None, 1).unwrap();
    assert_eq!(cols.len(), chunk_sizes(3, devices).len());
    let back = comm::gather(&cols, 1, Some(cuda0())).unwrap();
    assert_eq!(values(&back), values(&t));
    // Bad input.
    let on1 = Tensor::randn([2], Device::Cuda(1)).unwrap();
    assert!(
        comm::broadcast(&on1, &all).is_err(),
        "tensor not on devices[0]"
    );
    assert!(comm::reduce_add_coalesced(&[vec![a_f32()], vec![]], None).is_err());
}

fn a_f32() -> Tensor {
    Tensor::randn([2], cuda0()).unwrap()
}

pub fn autograd_functions(devices: usize) {
    let all: Vec<Device> = (0..devices).map(Device::Cuda).collect();
    let p = Tensor::randn([3, 2], cuda0())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let copies = Broadcast::apply(&all, std::slice::from_ref(&p)).unwrap();
    let mut total: Option<Tensor> = None;
    for (i, list) in copies.iter().enumerate() {
        let term = list[0]
            .mul((i + 1) as f64)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_device(cuda0())
            .unwrap();
        total = Some(match total {
            None => term,
            Some(t) => t.add(&term).unwrap(),
        });
    }
    total.unwrap().backward().unwrap();
    let want = (1..=devices).sum::<usize>() as f64;
    assert!(
        values(&p.grad().unwrap())
            .iter()
            .all(|g| (*g - want).abs() < 1e-6)
    );

    let per_device: Vec<Vec<Tensor>> = all
        .iter()
        .map(|&d| vec![Tensor::randn([4], d).unwrap().requires_grad_(true).unwrap()])
        .collect();
    let sum = ReduceAddCoalesced::apply(cuda0(), &per_device).unwrap();
    sum[0]
        .mul(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (i, l) in per_device.iter().enumerate() {
        let g = l[0].grad().unwrap();
        assert_eq!(g.device(), Device::Cuda(i));
        assert!(values(&g).iter().all(|v| *v == 3.0));
    }

    let x = Tensor::randn([2 * devices + 1, 2], cuda0())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let parts = Scatter::apply(&all, None, 0, &x).unwrap();
    let weights: Vec<f64> = (0..parts.len()).map(|i| (i + 2) as f64).collect();
    let scaled: Vec<Tensor> = parts
        .iter()
        .zip(&weights)
        .map(|(p, w)| p.mul(*w).unwrap())
        .collect();
    let y = Gather::apply(Device::Cpu, 0, &scaled).unwrap();
    assert_eq!(y.device(), Device::Cpu);
    y.sum_all().unwrap().backward().unwrap();
    let g = values(&x.grad().unwrap());
    let sizes = chunk_sizes(2 * devices + 1, devices);
    let mut row = 0;
    for (n, w) in sizes.iter().zip(&weights) {
        for r in row..row + n {
            assert_eq!(&g[r * 2..r * 2 + 2], &[*w, *w], "row {r}");
        }
        row += n;
    }
}

/// The test functions of a binary for `$devices` emulated devices.
#[macro_export]
macro_rules! device_tests {
    ($devices:expr) => {
        #[test]
        fn forward_equals_the_module() {
            common::install($devices);
            common::forward_equals_the_module($devices);
        }

        #[test]
        fn gradients_equal_single_device() {
            common::install($devices);
            common::gradients_equal_single_device($devices);
        }

        #[test]
        fn training_matches_single_device() {
            common::install($devices);
            common::training_matches_single_device($devices);
        }

        #[test]
        fn training_is_repeatable() {
            common::install($devices);
            common::training_is_repeatable($devices);
        }

        #[test]
        fn errors_are_clear() {
            common::install($devices);
            common::errors_are_clear($devices);
        }

        #[test]
        fn comm_functions() {
            common::install($devices);
            common::comm_functions($devices);
        }

        #[test]
        fn autograd_functions() {
            common::install($devices);
            common::autograd_functions($devices);
        }
    };
}
