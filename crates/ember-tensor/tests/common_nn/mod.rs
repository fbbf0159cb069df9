//! Helpers shared by the conv/pool and loss tests: tensors in several layouts holding the
//! same values, on any device, and tolerances. Random data, references and closeness are
//! `ember_testing`'s.

#![allow(dead_code, clippy::unwrap_used)]

use ember_tensor::{DType, Device, Tensor};
use ember_testing::Close;

pub const CPU: Device = Device::Cpu;

/// A tensor of `shape` and `dtype` on `device` with values `vals` (row-major), laid out as
/// 0: contiguous, 1: every dim reversed in memory (permuted view), 2: narrowed out of a
/// wider last dim (non-contiguous). The views are taken on `device`, so they reach its
/// kernels as views.
pub fn make(vals: &[f64], shape: &[usize], dtype: DType, layout: u8, device: &Device) -> Tensor {
    let on = |data: Vec<f64>, dims: Vec<usize>| {
        Tensor::from_vec(data, dims, CPU)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_device(device)
            .unwrap()
    };
    let t = on(vals.to_vec(), shape.to_vec());
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
            on(data, wide).narrow(r - 1, 1, last).unwrap()
        }
    }
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

/// Closeness within `rtol·(scale + |want|)` elementwise (NaN equals NaN), naming `what`.
pub fn within(rtol: f64, scale: f64, what: &str) -> Close {
    Close::new().rtol_atol(rtol, rtol * scale).context(what)
}

pub const FLOAT_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];
