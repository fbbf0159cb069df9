#![allow(clippy::unwrap_used)]
//! Every differentiable op against finite differences in f64 (`gradcheck`), with
//! proptest-chosen shapes, on `cpu` and on the emulated `cuda:0` (the real kernels of
//! `kernels/*.cu` run on the CPU).

use ember_autograd::{
    CrossEntropyOptions, GradcheckOptions, NllLossOptions, Result, Tensor, gradcheck,
};
use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_tensor::{
    AvgPool2dOptions, Conv2dOptions, DType, Device, MaxPool2dOptions, Padding, Reduction, Scalar,
};
use proptest::prelude::*;

fn devices() -> Vec<Device> {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
    }
    vec![Device::Cpu, Device::Cuda(0)]
}

/// How far apart [`values`] keeps its values from each other and from [`KINK_GRID`]'s points:
/// far above gradcheck's step (1e-6), so no central difference straddles a tie or a kink.
const GAP: f64 = 1e-4;
/// Every kink of the ops below lies on a multiple of this: 0 (abs, relu, `where(x > 0)`,
/// norms of one element) and the clamp limits -0.5, 0.7, 0.8 and 1.5.
const KINK_GRID: f64 = 0.05;

/// Deterministic values in `[lo, hi)` (a small LCG keyed by `seed`), pairwise at least
/// [`GAP`] apart (max, max-pool and maximum pick one element unambiguously) and at least
/// `GAP` from every multiple of [`KINK_GRID`].
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v = lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64);
        let off_grid = ((v / KINK_GRID).round() * KINK_GRID - v).abs() > GAP;
        if off_grid && out.iter().all(|u: &f64| (u - v).abs() > GAP) {
            out.push(v);
        }
    }
    out
}

/// An f64 leaf requiring grad on `dev`.
fn input(shape: &[usize], seed: u64, lo: f64, hi: f64, dev: Device) -> Tensor {
    let n = shape.iter().product();
    leaf(values(n, seed, lo, hi), shape, dev)
}

/// Like [`input`], but every value on [`KINK_GRID`]: at least `GAP` from any value of
/// [`values`], so `maximum`/`minimum` against such an input never meet a tie.
fn input_on_grid(shape: &[usize], seed: u64, lo: f64, hi: f64, dev: Device) -> Tensor {
    let n = shape.iter().product();
    let v = values(n, seed, lo, hi);
    leaf(
        v.iter()
            .map(|x| (x / KINK_GRID).round() * KINK_GRID)
            .collect(),
        shape,
        dev,
    )
}

fn leaf(v: Vec<f64>, shape: &[usize], dev: Device) -> Tensor {
    Tensor::from_vec(v, shape.to_vec(), Device::Cpu)
        .unwrap()
        .to_device(dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

fn check(name: &str, dev: Device, inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    if let Err(e) = gradcheck(f, inputs, GradcheckOptions::default()) {
        panic!("{name} on {dev}: {e}");
    }
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..4, 0..4)
}

fn shape_nonempty() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..4, 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn unary_ops(s in shape(), seed in any::<u64>()) {
        for dev in devices() {
            let x = input(&s, seed, -2.0, 2.0, dev);
            let pos = input(&s, seed, 0.3, 2.0, dev);
            // Both signs, |x| > 0.1 (values keeps every input off the clamp limits too).
            let away = leaf(
                values(x.numel(), seed, 0.1, 2.0).iter().enumerate()
                    .map(|(i, v)| if i % 2 == 0 { *v } else { -*v }).collect(),
                &s, dev);
            check("neg", dev, std::slice::from_ref(&x), |v| v[0].neg());
            check("exp", dev, std::slice::from_ref(&x), |v| v[0].exp());
            check("sin", dev, std::slice::from_ref(&x), |v| v[0].sin());
            check("cos", dev, std::slice::from_ref(&x), |v| v[0].cos());
            check("tanh", dev, std::slice::from_ref(&x), |v| v[0].tanh());
            check("sigmoid", dev, std::slice::from_ref(&x), |v| v[0].sigmoid());
            check("gelu", dev, std::slice::from_ref(&x), |v| v[0].gelu(()));
            check("gelu_tanh", dev, std::slice::from_ref(&x), |v| v[0].gelu(ember_tensor::Approximate::Tanh));
            check("silu", dev, std::slice::from_ref(&x), |v| v[0].silu());
            check("softplus", dev, std::slice::from_ref(&x), |v| v[0].softplus());
            check("square", dev, std::slice::from_ref(&x), |v| v[0].square());
            check("log", dev, std::slice::from_ref(&pos), |v| v[0].log());
            check("log1p", dev, std::slice::from_ref(&pos), |v| v[0].log1p());
            check("sqrt", dev, std::slice::from_ref(&pos), |v| v[0].sqrt());
            check("rsqrt", dev, std::slice::from_ref(&pos), |v| v[0].rsqrt());
            check("reciprocal", dev, std::slice::from_ref(&pos), |v| v[0].reciprocal());
            check("abs", dev, std::slice::from_ref(&away), |v| v[0].abs());
            check("relu", dev, std::slice::from_ref(&away), |v| v[0].relu());
            check("clamp", dev, std::slice::from_ref(&away), |v| {
                v[0].clamp(Some(Scalar::Float(-0.5)), Some(Scalar::Float(0.7)))
            });
            check("dropout(eval)", dev, std::slice::from_ref(&x), |v| v[0].dropout(0.5, false));
        }
    }

    #[test]
    fn binary_ops_broadcast(a in shape(), b in shape(), seed in any::<u64>()) {
        // Make `b` broadcastable against `a`: trailing dims equal or 1.
        let b: Vec<usize> = b.iter().enumerate().map(|(i, &d)| {
            let off = a.len() as isize - b.len() as isize + i as isize;
            if off >= 0 && d != 1 { a[off as usize] } else { d }
        }).collect();
        for dev in devices() {
            let x = input(&a, seed, -2.0, 2.0, dev);
            let y = input_on_grid(&b, seed.wrapping_add(1), 0.5, 2.0, dev);
            check("add", dev, &[x.clone(), y.clone()], |v| v[0].add(&v[1]));
            check("sub", dev, &[x.clone(), y.clone()], |v| v[0].sub(&v[1]));
            check("mul", dev, &[x.clone(), y.clone()], |v| v[0].mul(&v[1]));
            check("div", dev, &[x.clone(), y.clone()], |v| v[0].div(&v[1]));
            check("pow", dev, &[y.clone(), x.clone()], |v| v[0].pow(&v[1]));
            check("maximum", dev, &[x.clone(), y.clone()], |v| v[0].maximum(&v[1]));
            check("minimum", dev, &[x.clone(), y.clone()], |v| v[0].minimum(&v[1]));
            check("scalar ops", dev, std::slice::from_ref(&x), |v| v[0].mul(1.5)?.sub(0.25)?.div(3.0)?.pow(2.0));
            check("where", dev, &[x.clone(), y.clone()], |v| {
                ember_autograd::r#where(&v[0].gt(0.0)?, &v[0], &v[1])
            });
        }
    }

    #[test]
    fn reductions(s in shape_nonempty(), seed in any::<u64>(), d in 0usize..3, keep in any::<bool>()) {
        let d = d % s.len();
        for dev in devices() {
            let x = input(&s, seed, -2.0, 2.0, dev);
            check("sum_all", dev, std::slice::from_ref(&x), |v| v[0].sum_all());
            check("mean_all", dev, std::slice::from_ref(&x), |v| v[0].mean_all());
            check("sum", dev, std::slice::from_ref(&x), |v| v[0].sum((d, keep)));
            check("mean", dev, std::slice::from_ref(&x), |v| v[0].mean((d, keep)));
            check("prod", dev, std::slice::from_ref(&x), |v| v[0].prod((d, keep)));
            check("prod_all", dev, std::slice::from_ref(&x), |v| v[0].prod_all());
            check("amax", dev, std::slice::from_ref(&x), |v| v[0].amax((d, keep)));
            check("amin", dev, std::slice::from_ref(&x), |v| v[0].amin((d, keep)));
            check("max_all", dev, std::slice::from_ref(&x), |v| v[0].max_all());
            check("max_dim", dev, std::slice::from_ref(&x), |v| Ok(v[0].max_dim((d, keep))?.0));
            check("min_dim", dev, std::slice::from_ref(&x), |v| Ok(v[0].min_dim((d, keep))?.0));
            check("logsumexp", dev, std::slice::from_ref(&x), |v| v[0].logsumexp((d, keep)));
            check("norm2", dev, std::slice::from_ref(&x), |v| v[0].norm(2.0, (d, keep)));
            check("norm3", dev, std::slice::from_ref(&x), |v| v[0].norm(3.0, (d, keep)));
            check("softmax", dev, std::slice::from_ref(&x), |v| v[0].softmax(d));
            check("log_softmax", dev, std::slice::from_ref(&x), |v| v[0].log_softmax(d));
            if s[d] > 1 {
                check("var", dev, std::slice::from_ref(&x), |v| v[0].var((d, keep)));
                check("std", dev, std::slice::from_ref(&x), |v| v[0].std((d, keep)));
                check("var_all", dev, std::slice::from_ref(&x), |v| v[0].var_all(0.0));
            }
        }
    }

    #[test]
    fn views_and_assembly(s in prop::collection::vec(2usize..4, 2..4), seed in any::<u64>()) {
        for dev in devices() {
            let x = input(&s, seed, -2.0, 2.0, dev);
            let y = input(&s, seed.wrapping_add(7), -2.0, 2.0, dev);
            let r = s.len();
            check("reshape", dev, std::slice::from_ref(&x), |v| v[0].reshape([-1isize])?.mul(&v[0].flatten_all()?));
            check("permute", dev, std::slice::from_ref(&x), |v| {
                let p: Vec<usize> = (0..r).rev().collect();
                v[0].permute(&p)?.contiguous()
            });
            check("transpose", dev, std::slice::from_ref(&x), |v| v[0].transpose(0, -1)?.exp());
            check("narrow", dev, std::slice::from_ref(&x), |v| v[0].narrow(-1, 1, 1));
            check("slice", dev, std::slice::from_ref(&x), |v| v[0].slice(0, 0.., 2));
            check("select", dev, std::slice::from_ref(&x), |v| v[0].select(1, -1));
            check("unsqueeze", dev, std::slice::from_ref(&x), |v| v[0].unsqueeze(1)?.squeeze_dim(1)?.unsqueeze(0)?.squeeze());
            check("expand", dev, std::slice::from_ref(&x), |v| {
                let mut big = vec![2isize];
                big.extend(s.iter().map(|&d| d as isize));
                v[0].unsqueeze(0)?.expand(big)?.mul(&v[0])
            });
            check("cat", dev, &[x.clone(), y.clone()], |v| Tensor::cat(&[&v[0], &v[1], &v[0]], 1));
            check("stack", dev, &[x.clone(), y.clone()], |v| Tensor::stack(&[&v[0], &v[1]], -1));
            check("split", dev, std::slice::from_ref(&x), |v| {
                let p = v[0].split(1, 0)?;
                p[0].mul(&p[1])
            });
            check("chunk", dev, std::slice::from_ref(&x), |v| {
                let p = v[0].chunk(2, -1)?;
                p[0].sum_all()?.mul(&p[1].sum_all()?)
            });
        }
    }

    #[test]
    fn matrix_products(m in 1usize..4, k in 1usize..4, n in 1usize..4, b in 1usize..3, seed in any::<u64>()) {
        for dev in devices() {
            let a2 = input(&[m, k], seed, -1.0, 1.0, dev);
            let b2 = input(&[k, n], seed ^ 1, -1.0, 1.0, dev);
            let a1 = input(&[k], seed ^ 2, -1.0, 1.0, dev);
            let b1 = input(&[k], seed ^ 3, -1.0, 1.0, dev);
            let a3 = input(&[b, m, k], seed ^ 4, -1.0, 1.0, dev);
            let b3 = input(&[b, k, n], seed ^ 5, -1.0, 1.0, dev);
            let a4 = input(&[2, 1, m, k], seed ^ 6, -1.0, 1.0, dev);
            let c = input(&[m, n], seed ^ 7, -1.0, 1.0, dev);
            check("mm", dev, &[a2.clone(), b2.clone()], |v| v[0].mm(&v[1]));
            check("matmul 1-D·1-D", dev, &[a1.clone(), b1.clone()], |v| v[0].matmul(&v[1]));
            check("matmul 1-D·2-D", dev, &[a1.clone(), b2.clone()], |v| v[0].matmul(&v[1]));
            check("matmul 2-D·1-D", dev, &[a2.clone(), b1.clone()], |v| v[0].matmul(&v[1]));
            check("matmul batched·2-D", dev, &[a3.clone(), b2.clone()], |v| v[0].matmul(&v[1]));
            check("matmul broadcast batch", dev, &[a4.clone(), b3.clone()], |v| v[0].matmul(&v[1]));
            check("bmm", dev, &[a3.clone(), b3.clone()], |v| v[0].bmm(&v[1]));
            check("addmm", dev, &[c.clone(), a2.clone(), b2.clone()], |v| v[0].addmm_scaled(&v[1], &v[2], 0.5, 2.0));
            // Transposed (column-major) operands, as `Linear` passes `weight.t()`: their
            // gradients are computed transposed (PyTorch's mm_mat1/mat2_backward).
            let at = input(&[k, m], seed ^ 8, -1.0, 1.0, dev);
            let bt = input(&[n, k], seed ^ 9, -1.0, 1.0, dev);
            check("mm, a transposed", dev, &[at.clone(), b2.clone()], |v| v[0].t()?.mm(&v[1]));
            check("mm, b transposed", dev, &[a2.clone(), bt.clone()], |v| v[0].mm(&v[1].t()?));
            check("mm, both transposed", dev, &[at.clone(), bt.clone()], |v| v[0].t()?.matmul(&v[1].t()?));
        }
    }

    #[test]
    fn indexing(rows in 2usize..5, cols in 1usize..4, seed in any::<u64>()) {
        for dev in devices() {
            let x = input(&[rows, cols], seed, -2.0, 2.0, dev);
            let idx = Tensor::new(&[0i64, (rows - 1) as i64, 0], Device::Cpu).unwrap().to_device(dev).unwrap();
            check("index_select", dev, std::slice::from_ref(&x), |v| v[0].index_select(0, &idx));
            let gi: Vec<i64> = values(rows * cols, seed, 0.0, rows as f64).iter().map(|v| *v as i64).collect();
            let gidx = Tensor::from_vec(gi, [rows, cols], Device::Cpu).unwrap().to_device(dev).unwrap();
            check("gather", dev, std::slice::from_ref(&x), |v| v[0].gather(0, &gidx));
            let src = input(&[rows, cols], seed ^ 9, -1.0, 1.0, dev);
            check("scatter_add", dev, &[x.clone(), src.clone()], |v| v[0].scatter_add(0, &gidx, &v[1]));
            let mask = x.gt(0.0).unwrap();
            check("masked_fill", dev, std::slice::from_ref(&x), |v| v[0].masked_fill(&mask, 3.0));
            let tokens = Tensor::from_vec(vec![1i64, 0, 1, (rows - 1) as i64], [2, 2], Device::Cpu).unwrap().to_device(dev).unwrap();
            check("embedding", dev, std::slice::from_ref(&x), |v| v[0].embedding(&tokens));
        }
    }

    #[test]
    fn losses(n in 1usize..4, c in 2usize..5, seed in any::<u64>(), smooth in prop_oneof![Just(0.0), Just(0.1)], red in 0usize..3) {
        let reduction = [Reduction::Mean, Reduction::Sum, Reduction::None][red];
        for dev in devices() {
            let x = input(&[n, c], seed, -2.0, 2.0, dev);
            let t: Vec<i64> = (0..n).map(|i| ((seed as usize + i) % c) as i64).collect();
            let mut t_ign = t.clone();
            t_ign[0] = -100;
            let t = Tensor::new(&t, Device::Cpu).unwrap().to_device(dev).unwrap();
            let t_ign = Tensor::new(&t_ign, Device::Cpu).unwrap().to_device(dev).unwrap();
            let w = Tensor::from_vec(values(c, seed, 0.5, 2.0), [c], Device::Cpu).unwrap().to_device(dev).unwrap();
            let o = CrossEntropyOptions::new().label_smoothing(smooth).reduction(reduction);
            check("cross_entropy", dev, std::slice::from_ref(&x), |v| v[0].cross_entropy(&t, &o));
            let ow = CrossEntropyOptions::new().label_smoothing(smooth).reduction(reduction).weight(&w);
            check("cross_entropy weighted", dev, std::slice::from_ref(&x), |v| v[0].cross_entropy(&t, &ow));
            if n > 1 {
                check("cross_entropy ignore_index", dev, std::slice::from_ref(&x), |v| v[0].cross_entropy(&t_ign, &ow));
            }
            let x3 = input(&[n, c, 2], seed ^ 3, -2.0, 2.0, dev);
            let t3 = Tensor::from_vec((0..2 * n).map(|i| (i % c) as i64).collect::<Vec<_>>(), [n, 2], Device::Cpu).unwrap().to_device(dev).unwrap();
            check("cross_entropy [N, C, d]", dev, std::slice::from_ref(&x3), |v| v[0].cross_entropy(&t3, &o));
            let no = NllLossOptions::new().weight(&w).reduction(reduction);
            check("nll_loss", dev, std::slice::from_ref(&x), |v| v[0].log_softmax(1)?.nll_loss(&t, &no));
        }
    }

    #[test]
    fn convolution(
        n in 1usize..3, g in 1usize..3, cg in 1usize..3, og in 1usize..3,
        h in 3usize..6, w in 3usize..6, k in 1usize..4, stride in 1usize..3,
        pad in 0usize..2, dil in 1usize..3, bias in any::<bool>(), same in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let k = k.min(((h.min(w) + 2 * pad - 1) / dil) + 1).max(1);
        let mut opts = Conv2dOptions::new().stride(stride).padding(pad).dilation(dil).groups(g);
        if same {
            opts = Conv2dOptions::new().padding(Padding::Same).dilation(dil).groups(g);
        }
        for dev in devices() {
            let x = input(&[n, g * cg, h, w], seed, -1.0, 1.0, dev);
            let wt = input(&[g * og, cg, k, k], seed ^ 1, -1.0, 1.0, dev);
            let b = input(&[g * og], seed ^ 2, -1.0, 1.0, dev);
            let mut inputs = vec![x.clone(), wt.clone()];
            if bias {
                inputs.push(b.clone());
            }
            check("conv2d", dev, &inputs, |v| v[0].conv2d(&v[1], v.get(2), &opts));
            // Unbatched input.
            let xu = input(&[g * cg, h, w], seed ^ 3, -1.0, 1.0, dev);
            check("conv2d unbatched", dev, &[xu, wt.clone()], |v| v[0].conv2d(&v[1], None, &opts));
        }
    }

    #[test]
    fn pooling(
        n in 1usize..3, c in 1usize..3, h in 2usize..7, w in 2usize..7, k in 1usize..4,
        stride in 1usize..3, pad in 0usize..2, ceil in any::<bool>(), include in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let k = k.min(h.min(w)).max(1);
        let pad = pad.min(k / 2);
        for dev in devices() {
            let x = input(&[n, c, h, w], seed, -1.0, 1.0, dev);
            let mo = MaxPool2dOptions::new(k).stride(stride).padding(pad).ceil_mode(ceil);
            check("max_pool2d", dev, std::slice::from_ref(&x), |v| v[0].max_pool2d(&mo));
            let ao = AvgPool2dOptions::new(k).stride(stride).padding(pad).ceil_mode(ceil).count_include_pad(include);
            check("avg_pool2d", dev, std::slice::from_ref(&x), |v| v[0].avg_pool2d(&ao));
            let ad = AvgPool2dOptions::new(k).stride(stride).divisor_override(3);
            check("avg_pool2d divisor", dev, std::slice::from_ref(&x), |v| v[0].avg_pool2d(&ad));
            let xu = input(&[c, h, w], seed ^ 5, -1.0, 1.0, dev);
            check("max_pool2d unbatched", dev, &[xu], |v| v[0].max_pool2d(&mo));
        }
    }

    #[test]
    fn device_moves_casts_and_inplace(s in shape(), seed in any::<u64>()) {
        for dev in devices() {
            let x = input(&s, seed, 0.5, 2.0, dev);
            let y = input(&s, seed ^ 11, 0.5, 2.0, dev);
            let other = if dev == Device::Cpu { Device::Cuda(0) } else { Device::Cpu };
            check("to_device", dev, std::slice::from_ref(&x), |v| {
                v[0].to_device(other)?.exp()?.to_device(dev)
            });
            check("to_dtype round trip", dev, std::slice::from_ref(&x), |v| {
                v[0].to_dtype(DType::F64)?.mul(2.0)
            });
            check("add_/mul_/div_/sub_", dev, &[x.clone(), y.clone()], |v| {
                let t = v[0].mul(2.0)?;
                t.add_(&v[1])?;
                t.mul_(&v[1])?;
                t.sub_(&v[0])?;
                t.div_(2.0)?;
                Ok(t)
            });
            check("copy_", dev, &[x.clone(), y.clone()], |v| {
                let z = Tensor::zeros(s.clone(), (&dev, DType::F64))?;
                z.copy_(&v[0].mul(&v[1])?)?;
                z.exp()
            });
            check("clamp_", dev, std::slice::from_ref(&x), |v| {
                let t = v[0].mul(1.0)?;
                t.clamp_(Some(Scalar::Float(0.8)), Some(Scalar::Float(1.5)))?;
                Ok(t)
            });
        }
    }
}

#[test]
fn float32_inputs_are_refused() {
    let x = Tensor::ones([2], (&Device::Cpu, DType::F32))
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let e = gradcheck(|v| v[0].exp(), &[x], GradcheckOptions::default()).unwrap_err();
    assert!(e.to_string().contains("needs f64"), "{e}");
}

/// gradcheck must catch a wrong gradient: a deliberately wrong backward (a hook doubling
/// the gradient of the input) fails it.
#[test]
fn gradcheck_catches_a_wrong_gradient() {
    let x = Tensor::from_vec(vec![0.5f64, 1.0], [2], Device::Cpu)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let e = gradcheck(
        |v| {
            let y = v[0].exp()?;
            if y.requires_grad() {
                y.register_hook(|g| Some(g.mul(2.0).unwrap()))?;
            }
            Ok(y)
        },
        &[x],
        GradcheckOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("Jacobian mismatch"), "{e}");
}

/// ReLU's backward is one `threshold_backward` (PyTorch's `ReluBackward0`): the upstream
/// gradient where the output is > 0, 0 elsewhere, and the gradient passed where the output
/// is NaN (relu(NaN) = NaN; the old composed `where(y > 0, g, 0)` gave 0 there); in f32,
/// f16 and bf16, on `cpu` and the emulated `cuda:0`, where the backward is one launch of the
/// fused kernel and no comparison or `where`.
#[test]
fn relu_backward_is_threshold_backward() {
    for dev in devices() {
        for dt in [DType::F32, DType::F16, DType::Bf16] {
            let xs = [-1.5f64, -0.0, 0.0, 0.25, f64::NAN, 3.0, -f64::INFINITY, 2.0];
            let gs = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0];
            let x = Tensor::from_vec(xs.to_vec(), [8], dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
                .requires_grad_(true)
                .unwrap();
            let g = Tensor::from_vec(gs.to_vec(), [8], dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            let y = x.relu().unwrap();
            let before = ember_device::driver::emulator::thread_launch_counts();
            y.backward_with(&g).unwrap();
            let after = ember_device::driver::emulator::thread_launch_counts();
            let got = x
                .grad()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            assert_eq!(
                got,
                [0.0, 0.0, 0.0, 4.0, 5.0, 6.0, 0.0, -8.0],
                "{dt} on {dev}"
            );
            if dev.is_cuda() && std::env::var_os("EMBER_GPU_TEST").is_none() {
                let launched: Vec<_> = after
                    .iter()
                    .filter(|(k, v)| before.get(*k) != Some(*v))
                    .map(|(k, _)| k.as_str())
                    .collect();
                let fused = format!("threshold_backward_{}", dt.short_name());
                assert!(launched.contains(&fused.as_str()), "{launched:?}");
                assert!(
                    !launched
                        .iter()
                        .any(|k| k.starts_with("cmp_") || k.starts_with("where_")),
                    "{launched:?}"
                );
            }
        }
    }
}
