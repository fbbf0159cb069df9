#![allow(clippy::unwrap_used)]
// The error test builds its one-tensor lists inline (`&[p.clone()]`), which reads better here.
#![allow(clippy::cloned_ref_to_slice_refs)]
//! The optimizers' multi-tensor steps (Note [Multi-tensor optimizer steps] in
//! `ember-nn/src/optim/mod.rs`): SGD, Adam and AdamW update every parameter in one op per
//! device (on CUDA one launch per dtype, on the CPU one pass over the f32/f64 ones), with the
//! per-op path's bits for f32/f64 parameters and, on CUDA, one rounding of f32 math for
//! bf16/f16; non-contiguous tensors fall back to the per-op path.

use ember_device::driver::emulator::thread_launch_counts;
use ember_nn::Result;
use ember_nn::Tensor;
use ember_nn::optim::{Adam, AdamOptions, AdamW, AdamWOptions, Optimizer, SGD, SgdOptions};
use ember_tensor::{DType, Device};
use ember_testing::test_device;

/// Shapes of the test's parameters: a scalar-like one, a matrix, two spanning two chunks of
/// the CUDA kernel's table (32768 elements each) and split into parallel pieces on the CPU
/// (from `PAR_THRESHOLD`, 32768 elements), one of each dtype where two alternate, and an
/// empty one.
const SHAPES: [&[usize]; 5] = [&[1], &[7, 3], &[40_000], &[200, 250], &[0, 3]];

/// Deterministic values in about [-1, 1] (an LCG), different per `seed`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64, dtype: DType, dev: &Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed), shape.to_vec(), dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Parameters of `dtypes` (cycled over [`SHAPES`]) on `dev`.
fn params(dtypes: &[DType], dev: &Device) -> Vec<Tensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, s)| {
            tensor(s, 100 + i as u64, dtypes[i % dtypes.len()], dev)
                .requires_grad_(true)
                .unwrap()
        })
        .collect()
}

/// `t`'s values in a tensor of its shape that is not contiguous (every other element of a
/// wider storage) where it has more than one element.
fn strided(t: &Tensor) -> Tensor {
    Tensor::stack(&[t, t], -1).unwrap().select(-1, 0).unwrap()
}

/// Gradients for step `step`; `per_op`: non-contiguous ones, which send their parameters
/// down the per-op path.
fn set_grads(params: &[Tensor], step: usize, per_op: bool) {
    for (i, p) in params.iter().enumerate() {
        let mut g = tensor(&p.dims(), (1000 * step + i) as u64, p.dtype(), &p.device());
        if per_op {
            g = strided(&g);
            assert!(g.is_contiguous() == (g.numel() <= 1));
        }
        p.set_grad(Some(&g)).unwrap();
    }
}

type Make = Box<dyn Fn(Vec<Tensor>) -> Box<dyn Optimizer>>;

/// Every option combination of SGD, Adam and AdamW (nesterov only where PyTorch allows it).
fn configs() -> Vec<(String, Make)> {
    let mut out: Vec<(String, Make)> = Vec::new();
    for momentum in [0.0, 0.9] {
        for dampening in [0.0, 0.5] {
            for nesterov in [false, true] {
                if nesterov && (momentum == 0.0 || dampening != 0.0) {
                    continue;
                }
                for weight_decay in [0.0, 0.01] {
                    for maximize in [false, true] {
                        let o = SgdOptions {
                            lr: 0.1,
                            momentum,
                            dampening,
                            weight_decay,
                            nesterov,
                            maximize,
                        };
                        out.push((
                            format!("{o:?}"),
                            Box::new(move |p| Box::new(SGD::new(p, o).unwrap())),
                        ));
                    }
                }
            }
        }
    }
    for weight_decay in [0.0, 0.1] {
        for amsgrad in [false, true] {
            for maximize in [false, true] {
                let o = AdamOptions {
                    lr: 0.01,
                    weight_decay,
                    amsgrad,
                    maximize,
                    ..Default::default()
                };
                out.push((
                    format!("Adam {o:?}"),
                    Box::new(move |p| Box::new(Adam::new(p, o).unwrap())),
                ));
                let o = AdamWOptions {
                    lr: 0.01,
                    weight_decay,
                    amsgrad,
                    maximize,
                    ..Default::default()
                };
                out.push((
                    format!("AdamW {o:?}"),
                    Box::new(move |p| Box::new(AdamW::new(p, o).unwrap())),
                ));
            }
        }
    }
    out
}

/// `steps` steps of `make`'s optimizer over [`params`]; `per_op`: on the per-op path.
fn run(make: &Make, dtypes: &[DType], dev: &Device, steps: usize, per_op: bool) -> Vec<Tensor> {
    let params = params(dtypes, dev);
    let mut opt = make(params.clone());
    for k in 0..steps {
        set_grads(&params, k, per_op);
        opt.step().unwrap();
    }
    params
}

fn f32_bits(t: &Tensor) -> Vec<u32> {
    t.data()
        .to_device(Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// f32 and f64 parameters: three multi-tensor steps on `dev` give the CPU per-op path's
/// bits, for every option combination.
fn same_bits_as_per_op(dev: &Device) -> Result<()> {
    for (name, make) in configs() {
        let expected = run(&make, &[DType::F32, DType::F64], &Device::Cpu, 3, true);
        let got = run(&make, &[DType::F32, DType::F64], dev, 3, false);
        for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
            let (e, g) = (
                e.data().to_dtype(DType::F64)?,
                g.data().to_device(Device::Cpu)?,
            );
            let (e, g) = (e.to_vec::<f64>()?, g.to_dtype(DType::F64)?.to_vec::<f64>()?);
            let same = e.iter().zip(&g).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same && e.len() == g.len(), "{name} on {dev}, param {i}");
        }
    }
    Ok(())
}
test_device!(multi_tensor_same_bits_as_per_op, same_bits_as_per_op);

/// bf16 and f16 parameters: one step is the f32 per-op step on the same (widened) values,
/// rounded once; three steps stay within a few half-precision roundings of f32's.
fn half_params_round_f32_math_once(dev: &Device) -> Result<()> {
    for half in [DType::Bf16, DType::F16] {
        if half == DType::F16 && !dev.is_cuda() {
            // The CPU's per-op f16 Adam rounds `eps` = 1e-8 to 0 in f16 and divides by zero
            // where `v` underflows (as PyTorch's single-tensor path would); nothing to compare.
            continue;
        }
        for (name, make) in configs() {
            let got = run(&make, &[half], dev, 1, false);
            // The f32 reference from the same values: widen the half params and grads.
            let params32: Vec<Tensor> = SHAPES
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let p = tensor(s, 100 + i as u64, half, &Device::Cpu);
                    p.to_dtype(DType::F32)
                        .unwrap()
                        .requires_grad_(true)
                        .unwrap()
                })
                .collect();
            let mut opt = make(params32.clone());
            for (i, p) in params32.iter().enumerate() {
                let g = tensor(&p.dims(), i as u64, half, &Device::Cpu).to_dtype(DType::F32)?;
                p.set_grad(Some(&g))?;
            }
            opt.step().unwrap();
            for (i, (e, g)) in params32.iter().zip(&got).enumerate() {
                let e = e.to_dtype(half)?.to_dtype(DType::F32)?;
                let g = g.to_dtype(DType::F32)?;
                if dev.is_cuda() {
                    assert_eq!(
                        f32_bits(&g),
                        f32_bits(&e),
                        "{name} {half} on {dev}, param {i}"
                    );
                } else {
                    // The CPU's per-op path rounds after every op.
                    let (e, g) = (e.to_vec::<f32>()?, g.to_vec::<f32>()?);
                    for (a, b) in e.iter().zip(&g) {
                        assert!(
                            (a - b).abs() <= 2e-2 * a.abs().max(1.0),
                            "{name} {half}: {a} {b}"
                        );
                    }
                }
            }
            // Three steps against f32's, loosely.
            let got = run(&make, &[half], dev, 3, false);
            let reference = run(&make, &[DType::F32], &Device::Cpu, 3, true);
            for (e, g) in reference.iter().zip(&got) {
                let g = g
                    .to_dtype(DType::F32)?
                    .to_device(Device::Cpu)?
                    .to_vec::<f32>()?;
                let e = e.to_vec::<f32>()?;
                for (a, b) in e.iter().zip(&g) {
                    assert!(
                        (a - b).abs() <= 5e-2 * a.abs().max(1.0),
                        "{name} {half}: {a} {b}"
                    );
                }
            }
        }
    }
    Ok(())
}
test_device!(multi_tensor_half_params, half_params_round_f32_math_once);

/// A non-contiguous gradient sends its parameter down the per-op path; the result is the
/// same.
fn non_contiguous_falls_back(dev: &Device) -> Result<()> {
    let make = |p: Vec<Tensor>| -> Box<dyn Optimizer> {
        Box::new(
            Adam::new(
                p,
                AdamOptions {
                    lr: 0.01,
                    amsgrad: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    };
    let results: Vec<Vec<u32>> = [Device::Cpu, *dev]
        .iter()
        .map(|d| {
            let a = tensor(&[4, 6], 1, DType::F32, d)
                .requires_grad_(true)
                .unwrap();
            let b = tensor(&[5], 2, DType::F32, d).requires_grad_(true).unwrap();
            let mut opt = make(vec![a.clone(), b.clone()]);
            for k in 0..3 {
                let g = tensor(&[6, 4], 10 + k, DType::F32, d).t().unwrap();
                assert!(!g.is_contiguous());
                a.set_grad(Some(&g)).unwrap();
                b.set_grad(Some(&tensor(&[5], 20 + k, DType::F32, d)))
                    .unwrap();
                opt.step().unwrap();
            }
            [f32_bits(&a), f32_bits(&b)].concat()
        })
        .collect();
    assert_eq!(results[0], results[1]);
    Ok(())
}
test_device!(
    multi_tensor_non_contiguous_falls_back,
    non_contiguous_falls_back
);

/// On CUDA a step is one launch per dtype: no other kernel runs once the state exists.
fn one_launch_per_dtype(dev: &Device) -> Result<()> {
    if ember_testing::real_gpu_requested() {
        ember_testing::skip!("counts the emulator's launches (the real driver keeps no count)");
    }
    let sgd = |p| -> Box<dyn Optimizer> {
        let o = SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.01,
            ..Default::default()
        };
        Box::new(SGD::new(p, o).unwrap())
    };
    let adam = |p| -> Box<dyn Optimizer> {
        let o = AdamWOptions {
            amsgrad: true,
            ..Default::default()
        };
        Box::new(AdamW::new(p, o).unwrap())
    };
    for (kernel, make) in [
        ("optim_sgd", &sgd as &dyn Fn(_) -> _),
        ("optim_adam", &adam),
    ] {
        // 8 params: f32 and bf16 alternating.
        let params: Vec<Tensor> = (0..8)
            .map(|i| {
                let dtype = if i % 2 == 0 { DType::F32 } else { DType::Bf16 };
                tensor(&[3 + i, 2], i as u64, dtype, dev)
                    .requires_grad_(true)
                    .unwrap()
            })
            .collect();
        let mut opt = make(params.clone());
        set_grads(&params, 0, false);
        opt.step()?; // creates the state
        set_grads(&params, 1, false);
        let before = thread_launch_counts();
        opt.step()?;
        let after = thread_launch_counts();
        let mut launched: Vec<(String, u64)> = after
            .iter()
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        let mut expected = vec![(format!("{kernel}_bf16"), 1), (format!("{kernel}_f32"), 1)];
        expected.sort();
        launched.sort();
        assert_eq!(launched, expected);
    }
    Ok(())
}
test_device!(
    multi_tensor_one_launch_per_dtype,
    one_launch_per_dtype,
    [cuda]
);

/// `Tensor::fused_sgd_`/`fused_adam_` refuse bad lists with errors naming what they expected,
/// and change nothing.
fn fused_ops_refuse_bad_input(dev: &Device) -> Result<()> {
    use ember_tensor::{FusedAdamOptions, FusedSgdOptions, Tensor as Raw};
    let raw = |shape: &[usize], seed| tensor(shape, seed, DType::F32, dev).data();
    let sgd = FusedSgdOptions {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        maximize: false,
    };
    let (p, g, b) = (raw(&[2, 3], 1), raw(&[2, 3], 2), raw(&[2, 3], 3));
    let before = p.to_device(Device::Cpu)?.to_vec::<f32>()?;
    let err = |r: ember_tensor::Result<()>| r.unwrap_err().to_string();
    if !dev.is_cuda() {
        // CPU f16/bf16 params keep the per-op path: the CPU kernel has none.
        let half = |seed| tensor(&[2, 3], seed, DType::Bf16, dev).data();
        let e = err(Raw::fused_sgd_(
            &[half(1)],
            &[half(2)],
            &[half(3)],
            &[false],
            &sgd,
        ));
        assert!(
            e.contains("_fused_sgd_: not implemented for torch.bfloat16"),
            "{e}"
        );
    }
    let e = err(Raw::fused_sgd_(
        &[p.clone()],
        &[g.clone()],
        &[],
        &[false],
        &sgd,
    ));
    assert!(
        e.contains("expected 1 momentum_buffers (one per param), found 0"),
        "{e}"
    );
    let e = err(Raw::fused_sgd_(
        &[p.clone()],
        &[raw(&[3, 2], 4)],
        &[b.clone()],
        &[false],
        &sgd,
    ));
    assert!(
        e.contains(
            "grads[0]: expected torch.float32 [2, 3] as its param, found torch.float32 [3, 2]"
        ),
        "{e}"
    );
    let e = err(Raw::fused_sgd_(
        &[p.clone()],
        &[raw(&[3, 2], 4).t()?],
        &[b.clone()],
        &[false],
        &sgd,
    ));
    assert!(e.contains("grads[0]: expected a contiguous tensor"), "{e}");
    let e = err(Raw::fused_sgd_(
        &[p.clone()],
        &[g.clone()],
        &[p.clone()],
        &[false],
        &sgd,
    ));
    assert!(
        e.contains("momentum_buffers[0]: expected its own storage"),
        "{e}"
    );
    let adam = FusedAdamOptions {
        lr: 0.1,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.0,
        amsgrad: false,
        maximize: false,
        decoupled_weight_decay: false,
    };
    let (m, v) = (raw(&[2, 3], 5), raw(&[2, 3], 6));
    let e = err(Raw::fused_adam_(
        &[p.clone()],
        &[g.clone()],
        (&[m.clone()], &[v.clone()], &[]),
        &[],
        &adam,
    ));
    assert!(e.contains("expected 1 step counts, found 0"), "{e}");
    let e = err(Raw::fused_adam_(
        &[p.clone()],
        &[g],
        (&[m], &[v], &[b]),
        &[1.0],
        &adam,
    ));
    assert!(
        e.contains("expected no max_exp_avg_sqs without amsgrad, found 1"),
        "{e}"
    );
    assert_eq!(p.to_device(Device::Cpu)?.to_vec::<f32>()?, before);
    Ok(())
}
test_device!(
    multi_tensor_fused_ops_refuse_bad_input,
    fused_ops_refuse_bad_input
);
