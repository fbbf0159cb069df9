#![allow(clippy::unwrap_used)]
//! The ops added through the op table alone (docs/adding-an-op.md): `hardswish` and
//! `logaddexp`, on every device (`test_device!`: `cpu` and the emulated or real `cuda:0`).
//! Forward in every floating dtype against an f64 reference, PyTorch's outputs and
//! gradients (`reference/new_ops.py` writes `reference/new_ops.json`), gradcheck, the
//! infinities, and the dtypes PyTorch refuses.

use ember_autograd::{ErrorKind, GradcheckOptions, Result, Tensor, gradcheck};
use ember_tensor::{DType, Device};
use ember_testing::{rand_vec, test_device};

const FLOATS: [(DType, f64); 4] = [
    (DType::F64, 1e-14),
    (DType::F32, 1e-6),
    (DType::F16, 2e-3),
    (DType::Bf16, 1e-2),
];

fn reference() -> serde_json::Value {
    serde_json::from_str(include_str!("reference/new_ops.json")).unwrap()
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn hardswish_ref(x: f64) -> f64 {
    x * (x + 3.0).clamp(0.0, 6.0) / 6.0
}

fn logaddexp_ref(a: f64, b: f64) -> f64 {
    if a.is_infinite() && a == b {
        a
    } else {
        a.max(b) + (-(a - b).abs()).exp().ln_1p()
    }
}

/// `got` against `want` to `tol` relative (absolute below 1), both rounded to `dtype`
/// first for the reference: the kernels compute in f32 for f16/bf16 and round once.
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * w.abs().max(1.0);
        assert!(ok, "{what}[{i}]: {g} != {w}");
    }
}

/// Random inputs over the kinks and the tails, in every floating dtype, against the f64
/// reference of the values as stored.
fn forward_every_dtype(device: &Device) -> Result<()> {
    let n = 333;
    let xs: Vec<f64> = rand_vec(n, 7).iter().map(|u| 16.0 * u - 8.0).collect();
    let ys: Vec<f64> = rand_vec(n, 8).iter().map(|u| 40.0 * u - 20.0).collect();
    for (dtype, tol) in FLOATS {
        let x = Tensor::from_vec(xs.clone(), [n], device)?.to_dtype(dtype)?;
        let y = Tensor::from_vec(ys.clone(), [n], device)?.to_dtype(dtype)?;
        let (xv, yv) = (values(&x), values(&y));
        let h = x.hardswish()?;
        assert_eq!(h.dtype(), dtype);
        let want: Vec<f64> = xv.iter().map(|&v| hardswish_ref(v)).collect();
        assert_close(&format!("hardswish {dtype}"), &values(&h), &want, tol);
        let l = x.logaddexp(&y)?;
        assert_eq!(l.dtype(), dtype);
        let want: Vec<f64> = xv
            .iter()
            .zip(&yv)
            .map(|(&a, &b)| logaddexp_ref(a, b))
            .collect();
        assert_close(&format!("logaddexp {dtype}"), &values(&l), &want, tol);
        // A number operand, and broadcasting of a column against a row.
        let s = x.logaddexp(0.5)?;
        let want: Vec<f64> = xv.iter().map(|&a| logaddexp_ref(a, 0.5)).collect();
        assert_close(
            &format!("logaddexp scalar {dtype}"),
            &values(&s),
            &want,
            tol,
        );
    }
    let col = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], [3, 1], device)?;
    let row = Tensor::from_vec(vec![0.5f32, -3.0], [2], device)?;
    let b = col.logaddexp(&row)?;
    assert_eq!(b.dims(), vec![3, 2]);
    let want: Vec<f64> = [-1.0, 0.0, 2.0]
        .iter()
        .flat_map(|&a| [0.5, -3.0].map(|r| logaddexp_ref(a, r)))
        .collect();
    assert_close("logaddexp broadcast", &values(&b), &want, 1e-6);
    Ok(())
}
test_device!(forward_every_dtype, forward_every_dtype);

/// PyTorch's outputs and gradients, from `reference/new_ops.json`.
fn against_pytorch(device: &Device) -> Result<()> {
    let r = reference();
    let h = &r["hardswish"];
    let x =
        Tensor::from_vec(floats(&h["x"]), [floats(&h["x"]).len()], device)?.requires_grad_(true)?;
    let y = x.hardswish()?;
    assert_close("hardswish", &values(&y), &floats(&h["y"]), 1e-15);
    let g = Tensor::from_vec(floats(&h["grad_out"]), x.dims(), device)?;
    y.backward_with(&g)?;
    assert_close(
        "hardswish grad",
        &values(&x.grad().unwrap()),
        &floats(&h["grad_x"]),
        1e-15,
    );

    let l = &r["logaddexp"];
    let dims: Vec<usize> = l["a_shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let a = Tensor::from_vec(floats(&l["a"]), dims.clone(), device)?.requires_grad_(true)?;
    let b = Tensor::from_vec(floats(&l["b"]), [dims[1]], device)?.requires_grad_(true)?;
    let z = a.logaddexp(&b)?;
    assert_close("logaddexp", &values(&z), &floats(&l["y"]), 1e-14);
    let g = Tensor::from_vec(floats(&l["grad_out"]), dims, device)?;
    z.backward_with(&g)?;
    assert_close(
        "logaddexp grad a",
        &values(&a.grad().unwrap()),
        &floats(&l["grad_a"]),
        1e-14,
    );
    assert_close(
        "logaddexp grad b",
        &values(&b.grad().unwrap()),
        &floats(&l["grad_b"]),
        1e-14,
    );
    Ok(())
}
test_device!(against_pytorch, against_pytorch);

/// The infinities as PyTorch gives them (`reference/new_ops.py` prints its answers), in
/// f32 and f16: the same infinity on both sides is that infinity, not NaN.
fn logaddexp_infinities(device: &Device) -> Result<()> {
    let inf = f64::INFINITY;
    let a = [-inf, inf, -inf, inf, -inf, 1.0, f64::NAN];
    let b = [-inf, inf, inf, -inf, 3.0, inf, 0.0];
    let want = [-inf, inf, inf, inf, 3.0, inf, f64::NAN];
    for dtype in [DType::F32, DType::F16] {
        let ta = Tensor::from_vec(a.to_vec(), [7], device)?.to_dtype(dtype)?;
        let tb = Tensor::from_vec(b.to_vec(), [7], device)?.to_dtype(dtype)?;
        assert_close(
            &format!("{dtype}"),
            &values(&ta.logaddexp(&tb)?),
            &want,
            1e-3,
        );
    }
    Ok(())
}
test_device!(logaddexp_infinities, logaddexp_infinities);

/// Gradcheck in f64 (hardswish away from its kinks at ±3).
fn gradchecks(device: &Device) -> Result<()> {
    let xs: Vec<f64> = rand_vec(24, 3)
        .iter()
        .enumerate()
        .map(|(i, u)| [-4.5, -1.5, 1.5, 4.5][i % 4] + u - 0.5)
        .collect();
    let x = Tensor::from_vec(xs, [4, 6], device)?.requires_grad_(true)?;
    gradcheck(|v| v[0].hardswish(), &[x], GradcheckOptions::default())?;
    let a = Tensor::from_vec(rand_vec(12, 4), [3, 4], device)?
        .mul(6.0)?
        .sub(3.0)?
        .detach()
        .requires_grad_(true)?;
    let b = Tensor::from_vec(rand_vec(4, 5), [4], device)?
        .mul(6.0)?
        .sub(3.0)?
        .detach()
        .requires_grad_(true)?;
    gradcheck(
        |v| v[0].logaddexp(&v[1]),
        &[a.clone(), b],
        GradcheckOptions::default(),
    )?;
    gradcheck(|v| v[0].logaddexp(-1.25), &[a], GradcheckOptions::default())?;
    Ok(())
}
test_device!(gradchecks, gradchecks);

/// The dtypes PyTorch refuses ("hardswish_cpu" not implemented for 'Long'): an error
/// naming the op and the dtype, never a silent f32 result.
fn integer_inputs_refused(device: &Device) -> Result<()> {
    let r = reference();
    assert!(
        r["hardswish_long"]
            .as_str()
            .unwrap()
            .contains("not implemented for 'Long'")
    );
    assert!(
        r["logaddexp_long"]
            .as_str()
            .unwrap()
            .contains("not implemented for 'Long'")
    );
    let i = Tensor::from_vec(vec![1i64, 2], [2], device)?;
    for (op, e) in [
        ("hardswish", i.hardswish().unwrap_err()),
        ("logaddexp", i.logaddexp(&i).unwrap_err()),
        ("logaddexp", i.logaddexp(2).unwrap_err()),
    ] {
        assert_eq!(e.kind(), ErrorKind::DType, "{e}");
        let msg = e.to_string();
        assert!(msg.contains(op) && msg.contains("not implemented"), "{msg}");
    }
    // An integer tensor with a float operand promotes to float, as PyTorch.
    let f = i.logaddexp(0.5)?;
    assert_eq!(f.dtype(), DType::F32);
    let bools = Tensor::from_vec(vec![true, false], [2], device)?;
    assert_eq!(
        bools.logaddexp(&bools).unwrap_err().kind(),
        ErrorKind::DType
    );
    Ok(())
}
test_device!(integer_inputs_refused, integer_inputs_refused);
