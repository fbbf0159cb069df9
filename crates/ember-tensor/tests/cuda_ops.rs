#![allow(clippy::unwrap_used)]
//! The CUDA backend against the CPU: every op run on `cpu` and on the emulated `cuda:0`
//! (the real kernels of `kernels/*.cu`, compiled for the CPU) from the same inputs, with
//! results compared exactly for integers, bools and copies, within dtype tolerance for
//! floats. Shapes, strides, broadcasting and dtypes come from proptest.

use ember_device::cuda;
use ember_tensor::{ALL_DTYPES, DType, Device, Result, Scalar, Tensor, TensorError};
use proptest::prelude::*;

mod common_cuda;

use common_cuda::{
    CPU, GPU, MATMUL_PRECISION, assert_matches, same, same_within, second_gpu, setup, values, view,
};

/// Cases per property: `default`, or proptest's own `PROPTEST_CASES` when set (fewer under
/// compute-sanitizer's racecheck, where each launch is slow: `gpu-session`'s `sanitize`).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..=4, 0..=3)
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(ALL_DTYPES.to_vec())
}

fn float_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::Bf16])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    #[test]
    fn casts_and_copies_match(dims in shape(), from in dtype(), to in dtype(), seed in 0u64..1000, tr in any::<bool>()) {
        setup();
        let x = view(from, &dims, seed, tr);
        same("cast", &[&x], |t| t[0].to_dtype(to));
        same("contiguous", &[&x], |t| t[0].contiguous());
        same("permute+copy", &[&x], |t| {
            let r = t[0].rank();
            t[0].permute((0..r).rev().collect::<Vec<_>>())?.copy()
        });
    }

    #[test]
    fn unary_ops_match(dims in shape(), dt in dtype(), seed in 0u64..1000, tr in any::<bool>()) {
        setup();
        let x = view(dt, &dims, seed, tr);
        type Op = fn(&Tensor) -> Result<Tensor>;
        let ops: [(&str, Op); 19] = [
            ("neg", Tensor::neg), ("abs", Tensor::abs), ("sign", Tensor::sign),
            ("exp", Tensor::exp), ("log", Tensor::log), ("log1p", Tensor::log1p),
            ("sqrt", Tensor::sqrt), ("rsqrt", Tensor::rsqrt), ("sin", Tensor::sin),
            ("cos", Tensor::cos), ("tanh", Tensor::tanh), ("sigmoid", Tensor::sigmoid),
            ("reciprocal", Tensor::reciprocal), ("relu", Tensor::relu), ("gelu", Tensor::gelu_erf),
            ("gelu_tanh", Tensor::gelu_tanh), ("silu", Tensor::silu),
            ("softplus", Tensor::softplus), ("square", Tensor::square),
        ];
        for (name, op) in ops {
            same(name, &[&x], |t| op(&t[0]));
        }
        same("clamp", &[&x], |t| t[0].clamp(Some(Scalar::Int(-1)), Some(Scalar::Float(2.5))));
        same("clamp_min", &[&x], |t| t[0].clamp_min(0));
        same("logical_not", &[&x], |t| t[0].logical_not());
    }

    #[test]
    fn binary_ops_broadcast_and_promote(
        da in shape(), keep in prop::collection::vec(any::<bool>(), 3),
        ta in dtype(), tb in dtype(), seed in 0u64..1000, tr in any::<bool>(),
    ) {
        setup();
        // b broadcasts against a: some dims of a set to 1, and maybe fewer dims.
        let db: Vec<usize> = da.iter().zip(&keep).map(|(&d, &k)| if k { d } else { 1 }).collect();
        let db = if keep[0] && !db.is_empty() { db[1..].to_vec() } else { db };
        let a = view(ta, &da, seed, tr);
        let b = view(tb, &db, seed + 1, false);
        type Op = fn(&Tensor, &Tensor) -> Result<Tensor>;
        let ops: [(&str, Op); 16] = [
            ("add", |a, b| a.add(b)), ("sub", |a, b| a.sub(b)), ("mul", |a, b| a.mul(b)),
            ("div", |a, b| a.div(b)), ("pow", |a, b| a.pow(b)), ("maximum", |a, b| a.maximum(b)),
            ("minimum", |a, b| a.minimum(b)), ("eq", |a, b| a.eq(b)), ("ne", |a, b| a.ne(b)),
            ("lt", |a, b| a.lt(b)), ("le", |a, b| a.le(b)), ("gt", |a, b| a.gt(b)),
            ("ge", |a, b| a.ge(b)), ("and", |a, b| a.logical_and(b)),
            ("or", |a, b| a.logical_or(b)), ("xor", |a, b| a.logical_xor(b)),
        ];
        for (name, op) in ops {
            same(name, &[&a, &b], |t| op(&t[0], &t[1]));
        }
        same("add scalar", &[&a], |t| t[0].add(2));
        same("mul float scalar", &[&a], |t| t[0].mul(0.5));
        same("where", &[&a, &b], |t| ember_tensor::r#where(&t[0].gt(0)?, &t[0], &t[1]));
    }

    #[test]
    fn reductions_match(dims in prop::collection::vec(1usize..=5, 1..=3), dt in dtype(), seed in 0u64..1000,
                        tr in any::<bool>(), pick in prop::collection::vec(any::<bool>(), 3), keep in any::<bool>()) {
        setup();
        let x = view(dt, &dims, seed, tr);
        let rd: Vec<usize> = (0..dims.len()).filter(|&d| pick[d]).collect();
        same("sum", &[&x], |t| t[0].sum((rd.clone(), keep)));
        same("sum_all", &[&x], |t| t[0].sum_all());
        same("prod", &[&x], |t| t[0].prod((rd.clone(), keep)));
        same("amax", &[&x], |t| t[0].amax((rd.clone(), keep)));
        same("amin", &[&x], |t| t[0].amin((rd.clone(), keep)));
        same("argmax", &[&x], |t| t[0].argmax((0, keep)));
        same("argmin", &[&x], |t| t[0].argmin((-1, keep)));
        same("max_dim.values", &[&x], |t| Ok(t[0].max_dim((0, keep))?.0));
        same("min_dim.indices", &[&x], |t| Ok(t[0].min_dim((-1, keep))?.1));
        if dt.is_float() {
            same("mean", &[&x], |t| t[0].mean((rd.clone(), keep)));
            same("var", &[&x], |t| t[0].var((rd.clone(), keep)));
            same("std", &[&x], |t| t[0].std_correction((rd.clone(), keep), 0.0));
            same("logsumexp", &[&x], |t| t[0].logsumexp((rd.clone(), keep)));
            same("softmax", &[&x], |t| t[0].softmax(-1));
            same("log_softmax", &[&x], |t| t[0].log_softmax(0));
        }
    }

    #[test]
    fn matmul_matches(b in 0usize..=3, m in 0usize..=5, k in 0usize..=5, n in 0usize..=5, dt in float_dtype(),
                      seed in 0u64..1000, ta in any::<bool>(), tb in any::<bool>(), bcast in any::<bool>()) {
        setup();
        let a = view(dt, &[b.max(1), m, k], seed, ta);
        let bb = if bcast { view(dt, &[k, n], seed + 7, tb) } else { view(dt, &[b.max(1), k, n], seed + 7, tb) };
        same("matmul", &[&a, &bb], |t| t[0].matmul(&t[1]));
        let v = view(dt, &[k], seed + 3, false);
        same("matmul vec", &[&a, &v], |t| t[0].matmul(&t[1]));
        same("dot", &[&v, &v], |t| t[0].matmul(&t[1]));
    }

    #[test]
    fn inplace_ops_write_through_views(dims in prop::collection::vec(1usize..=4, 1..=3), dt in dtype(), seed in 0u64..1000) {
        setup();
        let base = view(dt, &dims, seed, false);
        let src = view(dt, &dims[1..], seed + 5, false);
        type Op = fn(&Tensor, &Tensor) -> Result<()>;
        let ops: [(&str, Op); 6] = [
            ("copy_", |v, s| v.copy_(s).map(|_| ())),
            ("add_", |v, s| v.add_(s).map(|_| ())),
            ("mul_", |v, s| v.mul_(s).map(|_| ())),
            ("fill_", |v, _| v.fill_(3).map(|_| ())),
            ("zero_", |v, _| v.zero_().map(|_| ())),
            ("clamp_", |v, _| v.clamp_(Some(Scalar::Int(-1)), Some(Scalar::Int(1))).map(|_| ())),
        ];
        for (name, op) in ops {
            // Write into a transposed view of a copy; compare the whole base afterwards.
            same(name, &[&base, &src], |t| {
                let whole = t[0].copy()?;
                let r = whole.rank();
                let v = whole.permute((0..r).rev().collect::<Vec<_>>())?
                    .permute((0..r).rev().collect::<Vec<_>>())?
                    .narrow(0, 0, 1)?;
                op(&v, &t[1])?;
                Ok(whole)
            });
        }
    }
}

#[test]
fn to_device_round_trips_and_shares_when_already_there() {
    setup();
    let x = view(DType::F32, &[3, 4], 1, true);
    let g = x.to("cuda:0").unwrap();
    assert_eq!(g.device(), GPU);
    assert!(g.is_contiguous());
    assert_eq!(g.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    assert!(g.to(GPU).unwrap().shares_storage(&g));
    // (device, dtype) together
    let h = x.to((GPU, DType::F16)).unwrap();
    assert_eq!((h.device(), h.dtype()), (GPU, DType::F16));
    // views of a device tensor come back as views
    let col = g.select(1, 2).unwrap();
    assert_eq!(
        col.to_vec::<f32>().unwrap(),
        x.select(1, 2).unwrap().to_vec::<f32>().unwrap()
    );
    assert_eq!(
        g.to_string().replace(", device='cuda:0'", ""),
        x.to_string(),
        "Display downloads and shows the device"
    );
    assert!(g.to_string().ends_with("device='cuda:0')"), "{g}");
}

#[test]
fn creation_on_cuda_matches_cpu() {
    setup();
    for dt in ALL_DTYPES {
        let z = Tensor::zeros([2, 3], (GPU, dt)).unwrap();
        assert_matches("zeros", &Tensor::zeros([2, 3], dt).unwrap(), &z);
        let f = Tensor::full([5], 3, (GPU, dt)).unwrap();
        assert_matches("full", &Tensor::full([5], 3, dt).unwrap(), &f);
    }
    let a = Tensor::arange(0, 10, GPU).unwrap();
    assert_matches("arange", &Tensor::arange(0, 10, ()).unwrap(), &a);
    let e = Tensor::eye(3, GPU).unwrap();
    assert_matches("eye", &Tensor::eye(3, ()).unwrap(), &e);
    let t = Tensor::from_slice(&[1.5f32, 2.5], [2], GPU).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.5, 2.5]);
    assert_eq!(Tensor::scalar(7i64, GPU).unwrap().item::<i64>().unwrap(), 7);
}

/// The Philox kernels draw, bit for bit, what the CPU generator draws for the same seed
/// and offset: every sampler and dtype, odd lengths, consecutive ops (offsets advance alike).
#[test]
fn same_seed_same_numbers_on_cpu_and_cuda() {
    setup();
    use ember_tensor::random::Generator;
    let bits = |t: &Tensor| -> Vec<i64> {
        let t = t.to_device(CPU).unwrap();
        match t.dtype() {
            DType::F32 => t
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| i64::from(v.to_bits()))
                .collect(),
            DType::F64 => t
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits() as i64)
                .collect(),
            DType::F16 => t
                .to_vec::<half::f16>()
                .unwrap()
                .iter()
                .map(|v| i64::from(v.to_bits()))
                .collect(),
            DType::Bf16 => t
                .to_vec::<half::bf16>()
                .unwrap()
                .iter()
                .map(|v| i64::from(v.to_bits()))
                .collect(),
            _ => t.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        }
    };
    for seed in [42u64, 0xDEAD_BEEF_0000_0001] {
        let (gc, gg) = (
            Generator::with_seed(seed, CPU),
            Generator::with_seed(seed, GPU),
        );
        for n in [0usize, 1, 7, 101] {
            for dt in [DType::F32, DType::F64, DType::F16, DType::Bf16] {
                let a = Tensor::rand_with([n], dt, &gc).unwrap();
                let b = Tensor::rand_with([n], (GPU, dt), &gg).unwrap();
                assert_eq!(b.device(), GPU);
                assert_eq!(bits(&a), bits(&b), "rand {dt} n={n}");
                let a = Tensor::randn_with([n], dt, &gc).unwrap();
                let b = Tensor::randn_with([n], (GPU, dt), &gg).unwrap();
                assert_eq!(bits(&a), bits(&b), "randn {dt} n={n}");
            }
            for dt in ALL_DTYPES {
                let (lo, hi) = match dt {
                    DType::Bool => (0, 2),
                    DType::U8 => (3, 200),
                    _ => (-3, 100),
                };
                let a = Tensor::randint_with(lo, hi, [n], dt, &gc).unwrap();
                let b = Tensor::randint_with(lo, hi, [n], (GPU, dt), &gg).unwrap();
                assert_eq!(bits(&a), bits(&b), "randint {dt} n={n}");
                let a = Tensor::bernoulli_mask_with([n], 0.3, dt, &gc).unwrap();
                let b = Tensor::bernoulli_mask_with([n], 0.3, (GPU, dt), &gg).unwrap();
                assert_eq!(bits(&a), bits(&b), "bernoulli {dt} n={n}");
            }
            // A range above 2^32 takes two words per sample.
            let a = Tensor::randint_with(i64::MIN, i64::MAX, [n], (), &gc).unwrap();
            let b = Tensor::randint_with(i64::MIN, i64::MAX, [n], GPU, &gg).unwrap();
            assert_eq!(bits(&a), bits(&b), "randint wide n={n}");
            let a = Tensor::dropout_mask_with([n], 0.5, (), &gc).unwrap();
            let b = Tensor::dropout_mask_with([n], 0.5, GPU, &gg).unwrap();
            assert_eq!(bits(&a), bits(&b), "dropout n={n}");
        }
        assert_eq!(
            gc.get_state(),
            gg.get_state(),
            "both generators advanced alike"
        );
    }
}

#[test]
fn mixed_devices_are_refused_with_pytorchs_wording() {
    setup();
    let a = Tensor::ones([2], GPU).unwrap();
    let b = Tensor::ones([2], ()).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(matches!(
        e.downcast_ref::<TensorError>(),
        Some(TensorError::DeviceMismatch { .. })
    ));
    assert_eq!(
        e.to_string(),
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    );
    // copy_ across devices is allowed, as in PyTorch.
    let dst = Tensor::zeros([2], GPU).unwrap();
    dst.copy_(&b).unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    // A device past the count names it.
    let err = Tensor::ones([1], Device::Cuda(7)).unwrap_err().to_string();
    assert!(err.contains('7'), "{err}");
}

#[test]
fn matmul_precision_switch_and_int_matmul() {
    setup();
    let a = view(DType::F32, &[4, 3], 2, false);
    let (cpu, gpu) = {
        let _precision = MATMUL_PRECISION
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ember_tensor::set_float32_matmul_precision("high").unwrap();
        let g = a.to_device(GPU).unwrap();
        let gpu = g.matmul(&g.t().unwrap());
        ember_tensor::set_float32_matmul_precision("highest").unwrap();
        (a.matmul(&a.t().unwrap()).unwrap(), gpu.unwrap())
    };
    // TF32 keeps 10 of f32's 23 mantissa bits: each product is good to about 2^-10 of the
    // sum of the terms' magnitudes (inputs here are in [-3, 3), k = 3).
    let (c, g) = (
        cpu.to_vec::<f32>().unwrap(),
        gpu.cpu().unwrap().to_vec::<f32>().unwrap(),
    );
    assert_eq!(gpu.dims(), &[4, 4]);
    for (i, (x, y)) in c.iter().zip(&g).enumerate() {
        assert!(
            (x - y).abs() <= 27.0 * 2e-3,
            "matmul with TF32 allowed: element {i}: cpu {x}, cuda {y}"
        );
    }
    // Integer products compute on CUDA as on the CPU (PyTorch does; issue 26).
    let i = Tensor::ones([2, 2], (GPU, DType::I64)).unwrap();
    let p = i.matmul(&i).unwrap();
    assert_eq!(p.dtype(), DType::I64);
    assert_eq!(p.to_vec::<i64>().unwrap(), vec![2, 2, 2, 2]);
}

/// The only test on `cuda:1`, so that its allocation counts are not disturbed by the
/// tests running beside it on `cuda:0`.
#[test]
fn memory_is_counted_on_the_device_and_devices_exchange_tensors() {
    setup();
    let one = match ember_testing::prepare(Device::Cuda(1)) {
        Ok(d) => d,
        Err(s) => ember_testing::skip!("{s}"),
    };
    let before = ember_memory::memory_allocated(one).unwrap();
    let t = Tensor::zeros([1024], one).unwrap();
    assert_eq!(ember_memory::memory_allocated(one).unwrap(), before + 4096);
    drop(t);
    assert_eq!(ember_memory::memory_allocated(one).unwrap(), before);
    // cuda:0 -> cuda:1 -> cpu
    let x = view(DType::F32, &[3, 4], 1, true);
    let g1 = x.to(GPU).unwrap().to("cuda:1").unwrap();
    assert_eq!(g1.device(), one);
    assert_eq!(
        g1.cpu().unwrap().to_vec::<f32>().unwrap(),
        x.to_vec::<f32>().unwrap()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(32), ..ProptestConfig::default() })]

    #[test]
    fn index_ops_match(dims in prop::collection::vec(1usize..=4, 1..=3), dt in dtype(), seed in 0u64..1000,
                       i32_idx in any::<bool>(), bad in any::<bool>()) {
        setup();
        let x = view(dt, &dims, seed, true);
        let dim = (seed as usize) % dims.len();
        let size = dims[dim] as i64;
        // Indices (with a repeat), maybe one out of range: both devices must name it.
        let mut picks: Vec<i64> = (0..5).map(|i| (i * 7 + seed as i64) % size).collect();
        if bad {
            picks[3] = size + 2;
        }
        let idx = Tensor::from_slice(&picks, [5], CPU).unwrap();
        let idx = if i32_idx { idx.to_dtype(DType::I32).unwrap() } else { idx };
        same("index_select", &[&x, &idx], |t| t[0].index_select(dim, &t[1]));
        // gather/scatter_add: an index of x's shape with dim shrunk.
        let mut gdims = dims.clone();
        gdims[dim] = gdims[dim].min(2);
        let n: usize = gdims.iter().product();
        let g: Vec<i64> = (0..n as i64).map(|i| if bad && i == 1 { -1 } else { (i * 5 + seed as i64) % size }).collect();
        let gi = Tensor::from_slice(&g, gdims.as_slice(), CPU).unwrap();
        same("gather", &[&x, &gi], |t| t[0].gather(dim, &t[1]));
        let src = view(dt, &gdims, seed + 9, false);
        // Up to two adds land on one element, in an order a real GPU's atomics leave open;
        // in 16 bits each rounds at the partial sum (up to |6|), so orders differ by up to
        // four half-ulps of 6: 8 times the usual tolerance (the emulator matches exactly).
        let slack = if matches!(dt, DType::F16 | DType::Bf16) { 8.0 } else { 1.0 };
        same_within("scatter_add", &[&x, &gi, &src], slack, |t| t[0].scatter_add(dim, &t[1], &t[2]));
        let mask = x.gt(0).unwrap();
        same("masked_fill", &[&x, &mask], |t| t[0].masked_fill(&t[1], 2));
        let cls = Tensor::from_slice(&picks.iter().map(|p| p.rem_euclid(4)).collect::<Vec<_>>(), [5], CPU).unwrap();
        same("one_hot", &[&cls], |t| t[0].one_hot(Some(4)));
        if dt.is_float() && dims.len() == 2 {
            same("embedding", &[&x, &idx], |t| t[0].embedding(&t[1]));
        }
        same("cat", &[&x, &x], |t| Tensor::cat(&[&t[0], &t[1]], dim));
        same("stack", &[&x, &x], |t| Tensor::stack(&[&t[0], &t[1]], 0));
    }

    #[test]
    fn losses_match(n in 0usize..=4, c in 1usize..=5, dt in float_dtype(), seed in 0u64..1000,
                    weighted in any::<bool>(), smoothing in prop::sample::select(vec![0.0, 0.1]),
                    reduction in prop::sample::select(vec![ember_tensor::Reduction::Mean, ember_tensor::Reduction::Sum, ember_tensor::Reduction::None]),
                    bad in any::<bool>()) {
        setup();
        let x = view(dt, &[n, c], seed, true);
        let t: Vec<i64> = (0..n as i64).map(|i| if bad && i == 1 { c as i64 } else if i == 2 { -100 } else { (i + seed as i64) % c as i64 }).collect();
        let t = Tensor::from_slice(&t, [n], CPU).unwrap();
        let w = view(dt, &[c], seed + 1, false).abs().unwrap();
        same("cross_entropy", &[&x, &t, &w], |a| {
            let mut o = ember_tensor::CrossEntropyOptions::new().reduction(reduction).label_smoothing(smoothing);
            if weighted {
                o = o.weight(&a[2]);
            }
            a[0].cross_entropy(&a[1], &o)
        });
        same("nll_loss", &[&x, &t], |a| {
            a[0].log_softmax(1)?.nll_loss(&a[1], &ember_tensor::NllLossOptions::new().reduction(reduction))
        });
    }

    #[test]
    fn conv_and_pool_match(n in 1usize..=2, cg in 1usize..=2, groups in 1usize..=2, og in 1usize..=2,
                           h in 1usize..=6, w in 1usize..=6, k in 1usize..=3, stride in 1usize..=2,
                           pad in 0usize..=1, dil in 1usize..=2, dt in float_dtype(), seed in 0u64..1000,
                           with_bias in any::<bool>(), ceil in any::<bool>()) {
        setup();
        let c = cg * groups;
        let x = view(dt, &[n, c, h, w], seed, true);
        let wt = view(dt, &[og * groups, cg, k, k], seed + 1, false);
        let b = view(dt, &[og * groups], seed + 2, false);
        same("conv2d", &[&x, &wt, &b], |t| {
            let o = ember_tensor::Conv2dOptions::new().stride(stride).padding(pad).dilation(dil).groups(groups);
            t[0].conv2d(&t[1], if with_bias { Some(&t[2]) } else { None }, &o)
        });
        let pk = k.min(h).min(w);
        same("max_pool2d", &[&x], |t| {
            let o = ember_tensor::MaxPool2dOptions::new(pk).stride(stride).padding(pad.min(pk / 2)).dilation(dil).ceil_mode(ceil);
            Ok(t[0].max_pool2d_with_indices(&o)?.1)
        });
        same("max_pool2d values", &[&x], |t| {
            t[0].max_pool2d(&ember_tensor::MaxPool2dOptions::new(pk).stride(stride).ceil_mode(ceil))
        });
        for (include, over) in [(true, None), (false, None), (true, Some(3))] {
            same("avg_pool2d", &[&x], |t| {
                let mut o = ember_tensor::AvgPool2dOptions::new(pk).stride(stride).padding(pad.min(pk / 2)).ceil_mode(ceil);
                o.count_include_pad = include;
                o.divisor_override = over;
                t[0].avg_pool2d(&o)
            });
        }
    }
}

#[test]
fn empty_inputs_match() {
    setup();
    let e = Tensor::zeros([0, 3], ()).unwrap();
    same("sum over an empty dim", &[&e], |t| t[0].sum(0));
    same("prod over an empty dim", &[&e], |t| t[0].prod((0, true)));
    same("amax over an empty dim", &[&e], |t| t[0].amax(0));
    same("sum_all of empty", &[&e], |t| t[0].sum_all());
    let idx = Tensor::from_slice(&[0i64, 1], [2], CPU).unwrap();
    same("index_select from empty", &[&e, &idx], |t| {
        t[0].index_select(0, &t[1])
    });
    let i2 = Tensor::zeros([1, 3], DType::I64).unwrap();
    same("gather from empty", &[&e, &i2], |t| t[0].gather(0, &t[1]));
    let x = Tensor::zeros([2, 0], ()).unwrap();
    let target = Tensor::from_slice(&[-100i64, 0], [2], CPU).unwrap();
    same("nll_loss without classes", &[&x, &target], |t| {
        t[0].nll_loss(&t[1], &ember_tensor::NllLossOptions::new())
    });
}

#[test]
fn streams_pinned_memory_and_non_blocking_copies() {
    setup();
    use ember_device::cuda::{Stream, StreamGuard};
    let x = view(DType::F32, &[3, 5], 4, true);
    let p = x.pin_memory().unwrap();
    assert!(p.is_pinned() && !x.is_pinned());
    assert_eq!(p.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    let s = Stream::new(0).unwrap();
    let (g, sum) = {
        let _guard = StreamGuard::new(&s);
        assert_eq!(cuda::current_stream(0), s.handle());
        // Enqueued on `s`; the op after it on the same stream sees the data.
        let g = p.to_non_blocking(GPU).unwrap();
        drop(p); // the pinned block stays reserved for the copy (record_stream)
        let sum = g.sum_all().unwrap();
        (g, sum)
    };
    s.synchronize().unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    assert_matches("sum on a side stream", &x.sum_all().unwrap(), &sum);
    g.record_stream(&s).unwrap();
    let e = x.record_stream(&s).unwrap_err().to_string();
    assert!(e.contains("pinned CPU tensor"), "{e}");
    if second_gpu("streams_pinned_memory_and_non_blocking_copies").is_some() {
        let on_other = Stream::new(1).unwrap();
        assert!(g.record_stream(&on_other).is_err());
    }
    assert!(g.pin_memory().is_err());
    // Non-pinned sources and other directions fall back to synchronous copies.
    assert_eq!(
        x.to_non_blocking(GPU)
            .unwrap()
            .cpu()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        x.to_vec::<f32>().unwrap()
    );
    assert_eq!(
        g.to_non_blocking(CPU).unwrap().to_vec::<f32>().unwrap(),
        x.to_vec::<f32>().unwrap()
    );
}

/// Long rows with few outputs take the two-pass path (rows split into chunks, then the
/// partials reduced); the results still match the CPU.
#[test]
fn long_reductions_split_in_two_passes() {
    setup();
    for (dt, n) in [
        (DType::F32, 1 << 16),
        (DType::F64, 3 * 5 * 7 * 128),
        (DType::I64, 10_000),
        (DType::I32, 1 << 14),
    ] {
        let x = values(dt, n, 3, false);
        same("sum_all long", &[&x], |t| t[0].sum_all());
        same("max_all long", &[&x], |t| t[0].max_all());
        same("min over rows", &[&x], |t| {
            t[0].reshape([2, n / 2])?.amin(1)
        });
        same("mean long", &[&x], |t| {
            if dt.is_float() {
                t[0].mean_all()
            } else {
                t[0].sum_all()
            }
        });
    }
    // A prime length cannot be split: one pass.
    let p = values(DType::F32, 16381, 5, false);
    same("sum prime", &[&p], |t| t[0].sum_all());
}

/// Every dtype through the kernels only this crate launches (copy and clamp into views),
/// deterministically: the launch-coverage check of `cargo xtask test` must not depend on
/// which dtypes proptest happened to draw.
#[test]
fn copy_and_clamp_every_dtype() {
    setup();
    for dt in ALL_DTYPES {
        let x = view(dt, &[3, 4], 11, true);
        same("clamp", &[&x], |t| {
            t[0].clamp(Some(Scalar::Int(0)), Some(Scalar::Int(2)))
        });
        same("clamp_ on a view", &[&x], |t| {
            let c = t[0].copy()?;
            c.t()?.clamp_(-1, ())?;
            Ok(c)
        });
        same("copy_ into a view", &[&x], |t| {
            let z = t[0].zeros_like()?;
            z.narrow(1, 1, 2)?.copy_(&t[0].narrow(1, 0, 2)?)?;
            Ok(z)
        });
    }
}

/// In-place ops on non-contiguous views take the buffer-and-copy-back path (contiguous
/// views are written directly).
#[test]
fn inplace_on_transposed_views() {
    setup();
    for dt in [DType::F32, DType::I64] {
        let x = view(dt, &[3, 4], 21, false);
        let y = view(dt, &[4, 3], 22, false);
        same("add_ on t()", &[&x, &y], |t| {
            let c = t[0].copy()?;
            c.t()?.add_(&t[1])?;
            Ok(c)
        });
        same("fill_ on t()", &[&x], |t| {
            let c = t[0].copy()?;
            c.t()?.narrow(0, 1, 2)?.fill_(7)?;
            Ok(c)
        });
    }
}

/// The optimizers' fused in-place ops on `cuda:0` (composed from the single-op kernels)
/// give the CPU's values (one fused pass there) for contiguous and transposed operands.
#[test]
fn fused_inplace_ops_match_the_cpu() {
    setup();
    for dt in [DType::F32, DType::F16] {
        let s = view(dt, &[5, 7], 31, false);
        let a = view(dt, &[5, 7], 32, false);
        let b = view(dt, &[5, 7], 33, true).abs().unwrap().add(0.5).unwrap();
        same("addcmul_", &[&s, &a, &b], |t| {
            let c = t[0].copy()?;
            c.addcmul_(&t[1], &t[2], 0.3)?;
            Ok(c)
        });
        same("addcdiv_", &[&s, &a, &b], |t| {
            let c = t[0].copy()?;
            c.addcdiv_(&t[1], &t[2], -0.7)?;
            Ok(c)
        });
        for w in [0.1, 0.9] {
            same("lerp_", &[&s, &a], |t| {
                let c = t[0].copy()?;
                c.lerp_(&t[1], w)?;
                Ok(c)
            });
        }
    }
}
