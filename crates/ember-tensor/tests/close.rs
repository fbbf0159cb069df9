#![allow(clippy::unwrap_used)]
//! `isclose`, `allclose` and `equal` against a naive f64 loop of PyTorch's definition
//! (`at::native::isclose`), on every device (`test_device!`: `cpu` and the emulated or
//! real `cuda:0`): several dtypes, broadcasting, NaN and infinities, the errors.

use ember_tensor::{DType, Device, IscloseOptions, Result, Tensor, TensorError};
use ember_testing::{rand_vec, test_device};

/// PyTorch's closeness of one pair, in f64: equal (infinities only to themselves), both
/// NaN under `equal_nan`, or a finite `|a - b| <= atol + |rtol·b|`.
fn close_ref(a: f64, b: f64, o: &IscloseOptions) -> bool {
    if a == b || (o.equal_nan && a.is_nan() && b.is_nan()) {
        return true;
    }
    let actual = (a - b).abs();
    actual.is_finite() && actual <= o.atol + (o.rtol * b).abs()
}

/// How far `|a - b|` is from the boundary, as a ratio to the allowed error: the reference
/// and a kernel rounding in a narrower dtype can disagree only near 1.
fn margin(a: f64, b: f64, o: &IscloseOptions) -> f64 {
    (a - b).abs() / (o.atol + (o.rtol * b).abs())
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// `b` random, `a = b + d` with `|d|` from far inside to far outside the tolerance; both in
/// `dtype`, then `isclose` against the reference on the values as stored.
fn random_pairs(device: &Device) -> Result<()> {
    let cases: [(DType, IscloseOptions); 4] = [
        (DType::F64, IscloseOptions::new()),
        (DType::F32, IscloseOptions::new().rtol(1e-4).atol(1e-6)),
        (DType::F16, IscloseOptions::new().rtol(1e-2).atol(1e-3)),
        (DType::Bf16, IscloseOptions::new().rtol(2e-2).atol(1e-2)),
    ];
    for (seed, (dtype, o)) in cases.into_iter().enumerate() {
        let n = 240;
        let b: Vec<f64> = rand_vec(n, 11 + seed as u64)
            .iter()
            .map(|v| v * 8.0)
            .collect();
        let scale = rand_vec(n, 101 + seed as u64);
        let a: Vec<f64> = b
            .iter()
            .zip(&scale)
            .enumerate()
            .map(|(i, (&b, &s))| {
                // |d| / allowed in [0.1, 10] (log-uniform), either sign; every 7th exact.
                let allowed = o.atol + (o.rtol * b).abs();
                let ratio = 10f64.powf(s);
                if i % 7 == 0 {
                    b
                } else {
                    b + ratio * allowed * s.signum()
                }
            })
            .collect();
        let (ta, tb) = (
            Tensor::from_slice(&a, [12, 20], (device, dtype))?,
            Tensor::from_slice(&b, [12, 20], (device, dtype))?,
        );
        let got = ta.isclose(&tb, o)?;
        assert_eq!((got.dtype(), got.dims()), (DType::Bool, vec![12, 20]));
        let got = got.to_vec2::<bool>()?.concat();
        let (va, vb) = (values(&ta), values(&tb));
        let (mut decided, mut trues) = (0, 0);
        for i in 0..n {
            let m = margin(va[i], vb[i], &o);
            if (0.8..1.25).contains(&m) {
                continue; // too near the boundary for a narrower dtype's rounding
            }
            decided += 1;
            trues += usize::from(got[i]);
            assert_eq!(
                got[i],
                close_ref(va[i], vb[i], &o),
                "{dtype} element {i}: a = {}, b = {}, margin {m}",
                va[i],
                vb[i]
            );
        }
        assert!(
            decided > n / 2 && trues > 10 && trues + 10 < decided,
            "{dtype}: {decided} decided, {trues} close"
        );
        let all_close = got.iter().all(|&c| c);
        assert_eq!(ta.allclose(&tb, o)?, all_close);
        assert!(tb.allclose(&tb, o)?, "{dtype}: a tensor is close to itself");
    }
    Ok(())
}
test_device!(random_pairs, random_pairs);

/// The special values against each other, in every float dtype, with and without
/// `equal_nan`, and PyTorch's tolerance edge cases.
fn nan_and_infinities(device: &Device) -> Result<()> {
    let inf = f64::INFINITY;
    let specials = [0.0, -0.0, 1.0, -1.0, 1e-9, inf, -inf, f64::NAN];
    let n = specials.len();
    let a: Vec<f64> = (0..n * n).map(|k| specials[k / n]).collect();
    let b: Vec<f64> = (0..n * n).map(|k| specials[k % n]).collect();
    for dtype in [DType::F64, DType::F32, DType::F16, DType::Bf16] {
        let ta = Tensor::from_slice(&a, [n, n], (device, dtype))?;
        let tb = Tensor::from_slice(&b, [n, n], (device, dtype))?;
        for o in [
            IscloseOptions::new(),
            IscloseOptions::new().equal_nan(true),
            IscloseOptions::new().rtol(0.0).atol(0.0),
            IscloseOptions::new().rtol(0.0).atol(0.0).equal_nan(true),
            IscloseOptions::new().atol(inf),
        ] {
            let got = ta.isclose(&tb, o)?.to_vec2::<bool>()?.concat();
            let (va, vb) = (values(&ta), values(&tb));
            for k in 0..n * n {
                assert_eq!(
                    got[k],
                    close_ref(va[k], vb[k], &o),
                    "{dtype} {o:?}: isclose({}, {})",
                    va[k],
                    vb[k]
                );
            }
        }
    }
    // Spelled out: infinities only to themselves, NaN only with equal_nan, 1 is never close
    // to inf even with an infinite atol.
    let x = Tensor::new(&[inf, inf, f64::NAN, 1.0], device)?;
    let y = Tensor::new(&[inf, -inf, f64::NAN, inf], device)?;
    assert_eq!(
        x.isclose(&y, ())?.to_vec::<bool>()?,
        [true, false, false, false]
    );
    assert_eq!(
        x.isclose(&y, (1e-5, inf, true))?.to_vec::<bool>()?,
        [true, false, true, false]
    );
    assert!(
        !x.allclose(&x, ())?,
        "NaN is not close to itself by default"
    );
    assert!(x.allclose(&x, (1e-5, 1e-8, true))?);
    Ok(())
}
test_device!(nan_and_infinities, nan_and_infinities);

/// `other` broadcasts against `self` both ways, as a binary op.
fn broadcasting(device: &Device) -> Result<()> {
    let a = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], [2, 3], device)?;
    let row = Tensor::from_slice(&[1f32, 2.5, 3.], [3], device)?;
    assert_eq!(
        a.isclose(&row, (0.0, 0.1))?.to_vec2::<bool>()?,
        [[true, false, true], [false, false, false]]
    );
    let col = Tensor::from_slice(&[2f32, 5.], [2, 1], device)?;
    assert_eq!(
        a.isclose(&col, (0.25, 0.0))?.to_vec2::<bool>()?,
        [[false, true, false], [true, true, true]]
    );
    // [3] against [2, 1]: the result is [2, 3].
    let t = row.isclose(&col, (0.0, 0.6))?;
    assert_eq!(t.dims(), [2, 3]);
    assert_eq!(
        t.to_vec2::<bool>()?,
        [[false, true, false], [false, false, false]]
    );
    assert!(a.allclose(&a.add(1e-7)?, ())?);
    assert!(!a.allclose(&row, ())?);
    assert!(
        Tensor::from_slice(&[3f32, 3.], [2, 1], device)?
            .allclose(&Tensor::full([2, 4], 3.0, (device, DType::F32))?, ())?
    );
    // A non-contiguous view is read through its strides.
    let at = a.transpose(0, 1)?;
    let expect = Tensor::from_slice(&[1f32, 4., 2., 5., 3., 6.], [3, 2], device)?;
    assert!(at.allclose(&expect, (0.0, 0.0))?);
    assert!(at.equal(&expect)?);
    let e = a.isclose(&Tensor::ones([4], device)?, ()).unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<TensorError>(),
            Some(TensorError::Broadcast { .. })
        ),
        "{e}"
    );
    Ok(())
}
test_device!(broadcasting, broadcasting);

/// Integers and bool are compared in f32 as PyTorch does (no u8 wrap-around); mixed dtypes
/// and negative tolerances are errors naming what was expected.
fn integers_bool_and_errors(device: &Device) -> Result<()> {
    let a = Tensor::new(&[100i64, -5, 7, 0], device)?;
    let b = Tensor::new(&[101i64, -5, 9, 1], device)?;
    assert_eq!(
        a.isclose(&b, ())?.to_vec::<bool>()?,
        [false, true, false, false]
    );
    assert_eq!(
        a.isclose(&b, (0.01, 0.0))?.to_vec::<bool>()?,
        [true, true, false, false]
    );
    assert_eq!(
        a.isclose(&b, (0.0, 1.0))?.to_vec::<bool>()?,
        [true, true, false, true]
    );
    for dtype in [DType::I32, DType::U8] {
        let (x, y) = (a.abs()?.to_dtype(dtype)?, b.abs()?.to_dtype(dtype)?);
        assert_eq!(
            x.isclose(&y, (0.0, 1.0))?.to_vec::<bool>()?,
            [true, true, false, true],
            "{dtype}"
        );
        // 0 and 1 as u8: |0 - 1| is 1, not a wrapped 255.
        assert_eq!(
            x.isclose(&y, (0.0, 2.0))?.to_vec::<bool>()?,
            [true; 4],
            "{dtype}"
        );
    }
    let t = Tensor::new(&[true, false, true], device)?;
    let f = Tensor::new(&[true, true, false], device)?;
    assert_eq!(t.isclose(&f, ())?.to_vec::<bool>()?, [true, false, false]);
    assert_eq!(t.isclose(&f, (0.0, 1.0))?.to_vec::<bool>()?, [true; 3]);
    assert!(t.allclose(&t, ())? && !t.allclose(&f, ())?);

    let x32 = Tensor::new(&[1f32], device)?;
    let e = x32.isclose(&Tensor::new(&[1f64], device)?, ()).unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<TensorError>(),
            Some(TensorError::DTypeMismatch {
                expected: DType::F32,
                found: DType::F64,
                ..
            })
        ),
        "{e}"
    );
    assert!(x32.allclose(&Tensor::new(&[1i64], device)?, ()).is_err());
    for (o, name) in [((-1.0, 0.0), "rtol"), ((0.0, f64::NAN), "atol")] {
        let e = x32.isclose(&x32, o).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{name} must be greater than or equal to zero")),
            "{e}"
        );
    }
    Ok(())
}
test_device!(integers_bool_and_errors, integers_bool_and_errors);

/// `equal`: one shape and equal values after promotion; no broadcasting; NaN never equal.
fn equal(device: &Device) -> Result<()> {
    let a = Tensor::from_slice(&[1f32, 2., 3., 4.], [2, 2], device)?;
    assert!(a.equal(&a.copy()?)?);
    assert!(!a.equal(&a.add(1e-3)?)?);
    assert!(!a.equal(&a.reshape([4])?)?, "another shape is false");
    assert!(
        !a.equal(&Tensor::from_slice(&[1f32, 2.], [2], device)?)?,
        "no broadcasting"
    );
    assert!(!a.equal(&Tensor::from_slice(&[1f32, 2.], [1, 2], device)?)?);
    assert!(a.equal(&Tensor::from_slice(&[1i64, 2, 3, 4], [2, 2], device)?)?);
    assert!(a.to_dtype(DType::F16)?.equal(&a.to_dtype(DType::F64)?)?);
    let nan = Tensor::new(&[f32::NAN], device)?;
    assert!(!nan.equal(&nan)?);
    let empty = Tensor::zeros([0, 3], device)?;
    assert!(empty.equal(&Tensor::zeros([0, 3], device)?)?);
    assert!(!empty.equal(&Tensor::zeros([3, 0], device)?)?);
    assert!(empty.allclose(&empty, ())?, "no elements: all close");
    Ok(())
}
test_device!(equal, equal);

/// Another device is an error, not `false` (PyTorch: "Expected all tensors to be on the
/// same device").
#[test]
fn across_devices() {
    ember_testing::run_on(
        "across_devices",
        Device::Cuda(0),
        |d: &Device| -> Result<()> {
            let g = Tensor::ones([2], d)?;
            let c = Tensor::ones([2], Device::Cpu)?;
            for e in [
                g.isclose(&c, ()).map(drop).unwrap_err(),
                g.allclose(&c, ()).map(drop).unwrap_err(),
                g.equal(&c).map(drop).unwrap_err(),
            ] {
                assert!(
                    matches!(
                        e.downcast_ref::<TensorError>(),
                        Some(TensorError::DeviceMismatch { .. })
                    ),
                    "{e}"
                );
            }
            Ok(())
        },
    );
}
