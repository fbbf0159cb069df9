#![allow(clippy::unwrap_used)]
//! `threshold_backward` (ReLU's backward in one pass) against the composed form it replaces,
//! `where(x <= threshold, 0, grad)` with the threshold converted to the dtype first, as
//! PyTorch's kernel does: bit for bit, over shapes, strided and broadcast views, every
//! numeric dtype, NaN and infinities; on every device (`test_device!`: `cpu` and the emulated
//! or real `cuda:0`).

use ember_tensor::aten;
use ember_tensor::{ALL_DTYPES, DType, Device, Result, Tensor, TensorError};
use ember_testing::test_device;
use proptest::prelude::*;

/// The dtypes `threshold_backward` takes: all but bool (the last of `ALL_DTYPES`).
const NUMERIC: &[DType] = ALL_DTYPES.split_last().unwrap().1;

/// The composed reference: `where(x <= t, 0, g)` with `t` the threshold in the dtype.
fn composed(g: &Tensor, x: &Tensor, threshold: f64) -> Result<Tensor> {
    let t = Tensor::scalar(threshold, x.device())?.to_dtype(x.dtype())?;
    ember_tensor::r#where(&x.le(&t)?, 0, g)
}

/// Values as f64 bit patterns (every dtype widens exactly), NaNs made one pattern.
fn bits(t: &Tensor) -> Vec<u64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
        .collect()
}

/// `n` values for `dtype` from `seed`: floats in [-3, 3) with NaN, ±inf and -0 mixed in,
/// integers in [-5, 5] (u8 wraps the negatives to large values).
fn values(dtype: DType, n: usize, seed: u64, device: &Device) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            if dtype.is_float() && i % 5 == 2 {
                [f64::NAN, f64::INFINITY, -0.0, f64::NEG_INFINITY, 0.0][(s % 5) as usize]
            } else if dtype.is_float() {
                u * 6.0 - 3.0
            } else {
                (u * 11.0).floor() - 5.0
            }
        })
        .collect();
    let t = Tensor::from_slice(&v, [n], Device::Cpu).unwrap();
    let t = if dtype == DType::U8 {
        t.to_dtype(DType::I64).unwrap().to_dtype(DType::U8).unwrap()
    } else {
        t.to_dtype(dtype).unwrap()
    };
    t.to_device(*device).unwrap()
}

/// A view of shape `dims`: contiguous, or sliced out of a larger tensor and transposed.
fn view(dtype: DType, dims: &[usize], seed: u64, strided: bool, device: &Device) -> Tensor {
    if !strided {
        let n = dims.iter().product();
        return values(dtype, n, seed, device).reshape(dims).unwrap();
    }
    let big: Vec<usize> = dims.iter().map(|&d| d + 1).collect();
    let mut t = values(dtype, big.iter().product(), seed, device)
        .reshape(big)
        .unwrap();
    for (d, &len) in dims.iter().enumerate() {
        t = t.narrow(d, 1, len).unwrap();
    }
    if dims.len() >= 2 {
        let r = dims.len();
        t = t
            .transpose(r - 2, r - 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .transpose(r - 2, r - 1)
            .unwrap();
    }
    t
}

fn matches_the_composed_form(device: &Device) {
    proptest!(ProptestConfig::with_cases(64), |(
        dims in prop::collection::vec(0usize..=5, 0..=3),
        di in 0usize..NUMERIC.len(),
        (sg, sx) in (any::<bool>(), any::<bool>()),
        bcast in any::<bool>(),
        ti in 0usize..4,
        seed in any::<u64>(),
    )| {
        let dtype = NUMERIC[di];
        let threshold = [0.0, 0.5, -1.0, 2.25][ti];
        let x = view(dtype, &dims, seed, sx, device);
        // The gradient has x's shape, or broadcasts against it from its last dims.
        let gdims = if bcast && !dims.is_empty() { dims[dims.len() - 1..].to_vec() } else { dims.clone() };
        let g = view(dtype, &gdims, seed ^ 7, sg, device);
        let got = aten::threshold_backward(&g, &x, threshold).unwrap();
        let want = composed(&g, &x, threshold).unwrap();
        prop_assert_eq!(got.device(), *device);
        prop_assert_eq!(got.dtype(), dtype);
        prop_assert_eq!(got.dims(), want.dims());
        prop_assert_eq!(bits(&got), bits(&want));
    });
}
test_device!(
    threshold_backward_matches_the_composed_form,
    matches_the_composed_form
);

/// Long contiguous operands: the CPU's parallel pieces, the kernel's 16-byte vector path and
/// its tail (aligned), and its scalar path (views starting one element in, misaligned).
fn long_contiguous_operands(device: &Device) {
    for dtype in [DType::F32, DType::F16, DType::Bf16, DType::F64, DType::I32] {
        let n = 100_003;
        let g = values(dtype, n + 1, 1, device);
        let x = values(dtype, n + 1, 2, device);
        for start in [0, 1] {
            let (g, x) = (
                g.narrow(0, start, n).unwrap(),
                x.narrow(0, start, n).unwrap(),
            );
            let got = aten::threshold_backward(&g, &x, 0.0).unwrap();
            assert_eq!(bits(&got), bits(&composed(&g, &x, 0.0).unwrap()), "{dtype}");
        }
    }
}
test_device!(
    threshold_backward_of_long_contiguous_operands,
    long_contiguous_operands
);

/// PyTorch's values: `x <= threshold` gives 0 (+0), anything else passes the gradient —
/// including NaN in `x`, where the composed `where(x > 0, g, 0)` would give 0.
fn pytorch_semantics_and_errors(device: &Device) {
    let g = Tensor::from_slice(&[1f32, -2., 3., 4., 5., -0.0], [6], device).unwrap();
    let x =
        Tensor::from_slice(&[0f32, 0.5, f32::NAN, -1., f32::INFINITY, 7.], [6], device).unwrap();
    let r = aten::threshold_backward(&g, &x, 0.0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(r[..2], [0.0, -2.0]);
    assert!(r[2] == 3.0 && r[3].to_bits() == 0 && r[4] == 5.0);
    assert_eq!(r[5].to_bits(), (-0.0f32).to_bits());
    // Promotion as a binary op: an f16 gradient and an f32 input compute in f32.
    let r = aten::threshold_backward(&g.to_dtype(DType::F16).unwrap(), &x, 0.0).unwrap();
    assert_eq!(r.dtype(), DType::F32);
    let b = Tensor::from_slice(&[true, false], [2], device).unwrap();
    assert!(matches!(
        aten::threshold_backward(&b, &b, 0)
            .unwrap_err()
            .downcast_ref::<TensorError>(),
        Some(TensorError::UnsupportedDType { .. })
    ));
    let e = aten::threshold_backward(&g, &Tensor::zeros([4], (device, DType::F32)).unwrap(), 0)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "threshold_backward: shapes [6] and [4] cannot be broadcast"
    );
    if device.is_cuda() {
        let e = aten::threshold_backward(&g, &x.cpu().unwrap(), 0).unwrap_err();
        assert!(e.to_string().contains("same device"), "{e}");
    }
}
test_device!(
    threshold_backward_follows_pytorch,
    pytorch_semantics_and_errors
);
