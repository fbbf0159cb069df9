#![allow(clippy::unwrap_used)]
//! The fused softmax / log-softmax kernel against the f64 reference (random shapes, dims and
//! non-contiguous inputs) and its edge cases, on every device (`ember_testing::test_device!`:
//! `cpu` and the emulated or real `cuda:0`); and the CPU's f32 sum against f64 loops.

use ember_tensor::random::Generator;
use ember_tensor::{DType, Device, Tensor};
use ember_testing::{Close, reference, test_device};
use proptest::prelude::*;

const CPU: Device = Device::Cpu;

fn check(t: &Tensor, dim: usize, dtype: DType, tol: f64) {
    let dims = t.dims().to_vec();
    let xs = ember_testing::values(t);
    for log in [false, true] {
        let got = if log {
            t.log_softmax(dim).unwrap()
        } else {
            t.softmax(dim).unwrap()
        };
        assert_eq!(got.dtype(), dtype);
        assert_eq!(got.device(), t.device());
        assert_eq!(got.dims(), &dims[..]);
        let want = reference::softmax(&xs, &dims, dim, log);
        // |got - want| <= tol · (1 + |want|)
        Close::new()
            .rtol_atol(tol, tol)
            .context(format!("log={log} dim={dim} dims={dims:?}"))
            .assert(&got, &want);
    }
}

fn softmax_matches_f64(device: &Device) {
    proptest!(ProptestConfig::with_cases(64), |(
        dims in prop::collection::vec(1usize..7, 1..4),
        dim_pick in 0usize..4,
        seed in 0u64..1000,
        scale in prop::sample::select(vec![0.1f64, 3.0, 40.0]),
        transpose in any::<bool>(),
    )| {
        let dim = dim_pick % dims.len();
        let g = Generator::with_seed(seed, CPU);
        let mut t = Tensor::randn_with(&dims[..], DType::F64, &g).unwrap().mul(scale).unwrap()
            .to_device(device).unwrap();
        if transpose && dims.len() >= 2 {
            // A non-contiguous input of the transposed shape.
            t = t.transpose(0, -1).unwrap();
        }
        check(&t, dim, DType::F64, 1e-12);
        check(&t.to_dtype(DType::F32).unwrap(), dim, DType::F32, 2e-6);
        check(&t.to_dtype(DType::Bf16).unwrap(), dim, DType::Bf16, 2e-2);
    });
}
test_device!(softmax_matches_f64, softmax_matches_f64);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The CPU's summation (f32 lanes, f64 blocks); CUDA's tree of block sums is
    /// `cuda_ops.rs`'s and `ember-kernels`' `reduce.rs`'s.
    #[test]
    fn f32_sum_matches_f64(n in 0usize..5000, seed in 0u64..1000, offset in 0usize..3) {
        let g = Generator::with_seed(seed, CPU);
        let t = Tensor::randn_with([n + offset], (), &g).unwrap().narrow(0, offset, n).unwrap();
        let xs = t.to_vec::<f32>().unwrap();
        let want: f64 = xs.iter().map(|&v| v as f64).sum();
        let abs: f64 = xs.iter().map(|&v| (v as f64).abs()).sum();
        let got = t.sum_all().unwrap().item::<f32>().unwrap() as f64;
        // Each f32 lane adds at most 64 values before they go to f64, so the error is at
        // most 64 ulps of Σ|x| (plus the final rounding to f32).
        let tol = 64.0 * f32::EPSILON as f64 * abs + f32::EPSILON as f64 * want.abs();
        prop_assert!((got - want).abs() <= tol, "{got} vs {want} (tolerance {tol})");
    }
}

fn softmax_edge_cases(device: &Device) {
    // Rows of NaN or infinities give NaN rows, as PyTorch; -inf entries give zeros.
    let x = Tensor::from_slice(
        &[f32::NAN, 1., 2., f32::NEG_INFINITY, 0., 0.],
        [2, 3],
        device,
    )
    .unwrap();
    let s = x.softmax(1).unwrap().to_vec::<f32>().unwrap();
    assert!(s[..3].iter().all(|v| v.is_nan()), "{s:?}");
    assert_eq!(s[3], 0.0);
    assert!(
        (s[4] - 0.5).abs() < 1e-7 && (s[5] - 0.5).abs() < 1e-7,
        "{s:?}"
    );
    let l = x.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(l[3], f32::NEG_INFINITY);
    assert!((l[4] + std::f32::consts::LN_2).abs() < 1e-7, "{l:?}");
    // A 0-dim tensor is a row of one; empty tensors pass through; bad dims are errors.
    let s = Tensor::scalar(3.0f32, device).unwrap();
    assert_eq!(s.softmax(0).unwrap().item::<f32>().unwrap(), 1.0);
    assert_eq!(s.log_softmax(-1).unwrap().item::<f32>().unwrap(), 0.0);
    assert_eq!(
        Tensor::zeros([0, 3], device)
            .unwrap()
            .softmax(1)
            .unwrap()
            .dims(),
        &[0, 3]
    );
    assert!(x.softmax(2).is_err());
    // Long rows split across threads (CPU) or longer than a block (CUDA) give the same as a
    // short loop.
    let n = 100_000;
    let big = Tensor::arange(0, n, (device, DType::F32))
        .unwrap()
        .div(n as f64)
        .unwrap();
    let p = big
        .reshape([4, n as usize / 4])
        .unwrap()
        .softmax(1)
        .unwrap();
    let sums = p.sum(1).unwrap().to_vec::<f32>().unwrap();
    assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
}
test_device!(softmax_edge_cases, softmax_edge_cases);
