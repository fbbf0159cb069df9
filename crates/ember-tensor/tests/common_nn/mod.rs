//! Helpers shared by the conv/pool and loss tests: deterministic data, tensors in several
//! layouts holding the same values, and tolerance checks.

#![allow(dead_code, clippy::unwrap_used)]

use ember_tensor::{DType, Device, Tensor};

pub const CPU: Device = Device::Cpu;

/// `n` values in [-1, 1) from a seed (xorshift).
pub fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// A tensor of `shape` and `dtype` with values `vals` (row-major), laid out as
/// 0: contiguous, 1: every dim reversed in memory (permuted view), 2: narrowed out of a
/// wider last dim (non-contiguous).
pub fn make(vals: &[f64], shape: &[usize], dtype: DType, layout: u8) -> Tensor {
    let t = Tensor::from_vec(vals.to_vec(), shape.to_vec(), CPU)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    match layout {
        0 => t,
        1 => {
            let rev: Vec<usize> = (0..shape.len()).rev().collect();
            let v = t
                .permute(&rev)
                .unwrap()
                .contiguous()
                .unwrap()
                .permute(&rev)
                .unwrap();
            assert_eq!(v.dims(), shape);
            v
        }
        _ => {
            let r = shape.len();
            if r == 0 {
                return t;
            }
            let last = shape[r - 1];
            let mut wide = shape.to_vec();
            wide[r - 1] = last + 3;
            let rows: usize = shape[..r - 1].iter().product();
            let mut data = vec![f64::NAN; rows * (last + 3)];
            for i in 0..rows {
                for j in 0..last {
                    data[i * (last + 3) + 1 + j] = vals[i * last + j];
                }
            }
            Tensor::from_vec(data, wide, CPU)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
                .narrow(r - 1, 1, last)
                .unwrap()
        }
    }
}

/// The values of `t` as f64, row-major.
pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// Relative tolerance for results computed in `dtype`.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-5,
        DType::F16 => 4e-3,
        _ => 3e-2,
    }
}

/// Asserts `got ≈ want` elementwise within `rtol·(scale + |want|)`.
pub fn assert_close(got: &[f64], want: &[f64], rtol: f64, scale: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= rtol * (scale + w.abs());
        assert!(ok, "{what}: element {i}: got {g}, want {w} (rtol {rtol})");
    }
}

pub const FLOAT_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];
