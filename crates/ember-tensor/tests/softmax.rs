#![allow(clippy::unwrap_used)]
//! The fused softmax / log-softmax kernel and the f32 sum against f64 loops, over random
//! shapes, dims and non-contiguous inputs.

use ember_tensor::random::Generator;
use ember_tensor::{DType, Device, Tensor};
use proptest::prelude::*;

const CPU: Device = Device::Cpu;

/// Softmax (or log-softmax) of `x` (row-major `dims`) along `dim`, in f64.
fn reference(x: &[f64], dims: &[usize], dim: usize, log: bool) -> Vec<f64> {
    let size = dims[dim];
    let inner: usize = dims[dim + 1..].iter().product();
    let outer: usize = dims[..dim].iter().product();
    let mut y = vec![0.0; x.len()];
    for o in 0..outer {
        for j in 0..inner {
            let at = |k: usize| o * size * inner + k * inner + j;
            let m = (0..size)
                .map(|k| x[at(k)])
                .fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..size).map(|k| (x[at(k)] - m).exp()).sum();
            for k in 0..size {
                y[at(k)] = if log {
                    x[at(k)] - m - s.ln()
                } else {
                    (x[at(k)] - m).exp() / s
                };
            }
        }
    }
    y
}

fn check(t: &Tensor, dim: usize, dtype: DType, tol: f64) {
    let dims = t.dims().to_vec();
    let x64 = t.to_dtype(DType::F64).unwrap().contiguous().unwrap();
    let xs = x64.to_vec::<f64>().unwrap();
    for log in [false, true] {
        let got = if log {
            t.log_softmax(dim).unwrap()
        } else {
            t.softmax(dim).unwrap()
        };
        assert_eq!(got.dtype(), dtype);
        assert_eq!(got.dims(), &dims[..]);
        let got = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let want = reference(&xs, &dims, dim, log);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "log={log} dim={dim} dims={dims:?} at {i}: {g} vs {w}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn softmax_matches_f64(
        dims in prop::collection::vec(1usize..7, 1..4),
        dim_pick in 0usize..4,
        seed in 0u64..1000,
        scale in prop::sample::select(vec![0.1f64, 3.0, 40.0]),
        transpose in any::<bool>(),
    ) {
        let dim = dim_pick % dims.len();
        let g = Generator::with_seed(seed, CPU);
        let mut t = Tensor::randn_with(&dims[..], DType::F64, &g).unwrap().mul(scale).unwrap();
        if transpose && dims.len() >= 2 {
            // A non-contiguous input of the transposed shape.
            t = t.transpose(0, -1).unwrap();
        }
        check(&t, dim, DType::F64, 1e-12);
        check(&t.to_dtype(DType::F32).unwrap(), dim, DType::F32, 2e-6);
        check(&t.to_dtype(DType::Bf16).unwrap(), dim, DType::Bf16, 2e-2);
    }

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

#[test]
fn softmax_edge_cases() {
    // Rows of NaN or infinities give NaN rows, as PyTorch; -inf entries give zeros.
    let x =
        Tensor::from_slice(&[f32::NAN, 1., 2., f32::NEG_INFINITY, 0., 0.], [2, 3], CPU).unwrap();
    let s = x.softmax(1).unwrap().to_vec::<f32>().unwrap();
    assert!(s[..3].iter().all(|v| v.is_nan()));
    assert_eq!(s[3], 0.0);
    assert!((s[4] - 0.5).abs() < 1e-7 && (s[5] - 0.5).abs() < 1e-7);
    let l = x.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(l[3], f32::NEG_INFINITY);
    assert!((l[4] + std::f32::consts::LN_2).abs() < 1e-7);
    // A 0-dim tensor is a row of one; empty tensors pass through; bad dims are errors.
    let s = Tensor::scalar(3.0f32, CPU).unwrap();
    assert_eq!(s.softmax(0).unwrap().item::<f32>().unwrap(), 1.0);
    assert_eq!(s.log_softmax(-1).unwrap().item::<f32>().unwrap(), 0.0);
    assert_eq!(
        Tensor::zeros([0, 3], ())
            .unwrap()
            .softmax(1)
            .unwrap()
            .dims(),
        &[0, 3]
    );
    assert!(x.softmax(2).is_err());
    // Long rows split across threads give the same as a short loop.
    let n = 100_000;
    let big = Tensor::arange(0, n, DType::F32)
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
