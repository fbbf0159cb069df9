#![allow(clippy::unwrap_used)]
//! The optimizers' fused in-place ops, `addcmul_`, `addcdiv_` and `lerp_`: the one-pass CPU
//! kernels give the same bits as the same formula composed from single ops (the path for
//! other layouts, dtypes and devices), which in turn stays within rounding of an f64
//! reference.

use ember_tensor::{DType, Device, Tensor};
use proptest::prelude::*;

const CPU: Device = Device::Cpu;

fn tensor(v: &[f64], dims: &[usize], dtype: DType) -> Tensor {
    Tensor::from_slice(v, dims, CPU)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// The three ops composed from single ops, in the fused kernels' order of operations.
fn composed(op: &str, s: &Tensor, a: &Tensor, b: &Tensor, v: f64) -> Tensor {
    match op {
        "addcmul_" => s.add(&a.mul(v).unwrap().mul(b).unwrap()).unwrap(),
        "addcdiv_" => s.add(&a.mul(v).unwrap().div(b).unwrap()).unwrap(),
        _ => {
            let w = if s.dtype() == DType::F64 {
                v
            } else {
                f64::from(v as f32)
            };
            let omw = if s.dtype() == DType::F64 {
                1.0 - v
            } else {
                f64::from(1.0 - v as f32)
            };
            let diff = a.sub(s).unwrap();
            if w.abs() < 0.5 {
                s.add(&diff.mul(w).unwrap()).unwrap()
            } else {
                a.sub(&diff.mul(omw).unwrap()).unwrap()
            }
        }
    }
}

fn run(op: &str, s: &Tensor, a: &Tensor, b: &Tensor, v: f64) -> ember_tensor::Result<()> {
    match op {
        "addcmul_" => s.addcmul_(a, b, v).map(drop),
        "addcdiv_" => s.addcdiv_(a, b, v).map(drop),
        _ => s.lerp_(a, v).map(drop),
    }
}

fn reference(op: &str, s: f64, a: f64, b: f64, v: f64) -> f64 {
    match op {
        "addcmul_" => s + v * a * b,
        "addcdiv_" => s + v * a / b,
        _ => s + v * (a - s),
    }
}

const OPS: [&str; 3] = ["addcmul_", "addcdiv_", "lerp_"];

fn data(n: usize, seed: u64, positive: bool) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let x = ((i as u64 * 2654435761 + seed * 97) % 1000) as f64 / 250.0 - 2.0;
            if positive { x.abs() + 0.5 } else { x }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Contiguous (fused), transposed and broadcast (composed) operands, f32 and f64, over
    /// sizes on both sides of the parallel threshold: bits equal to the composed formula.
    #[test]
    fn fused_matches_composed_bit_for_bit(
        rows in 1usize..40, cols in 1usize..3000, seed in 0u64..1000,
        value in prop_oneof![Just(0.1), Just(-0.7), Just(0.5), -2.0f64..2.0],
        f64_dtype in any::<bool>(), layout in 0usize..3,
    ) {
        let dtype = if f64_dtype { DType::F64 } else { DType::F32 };
        let n = rows * cols;
        for op in OPS {
            let s = tensor(&data(n, seed, false), &[rows, cols], dtype);
            let a = tensor(&data(n, seed + 1, false), &[rows, cols], dtype);
            let b = match layout {
                // transposed storage, the same logical shape: not contiguous
                1 => tensor(&data(n, seed + 2, true), &[cols, rows], dtype).t().unwrap(),
                // one row broadcast down the columns
                2 => tensor(&data(cols, seed + 2, true), &[1, cols], dtype),
                _ => tensor(&data(n, seed + 2, true), &[rows, cols], dtype),
            };
            let want = composed(op, &s, &a, &b, value);
            let target = s.copy().unwrap();
            run(op, &target, &a, &b, value).unwrap();
            let (got, want) = (f64s(&target), f64s(&want));
            prop_assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                "{op} {dtype:?} layout {layout}: fused and composed differ");
            let bv = f64s(&b.expand([rows, cols]).unwrap().contiguous().unwrap());
            let (sv, av) = (f64s(&s), f64s(&a));
            for i in 0..n {
                let r = reference(op, sv[i], av[i], bv[i], value);
                let tol = if f64_dtype { 1e-12 } else { 1e-5 } * (1.0 + r.abs());
                prop_assert!((got[i] - r).abs() <= tol, "{op}: {} vs f64 {r}", got[i]);
            }
        }
    }
}

#[test]
fn half_types_and_strided_targets_take_the_composed_path() {
    for dtype in [DType::F16, DType::Bf16, DType::F32] {
        for op in OPS {
            let base = tensor(&data(12, 3, false), &[3, 4], dtype);
            let s = base.t().unwrap(); // a strided target
            let a = tensor(&data(12, 4, false), &[4, 3], dtype);
            let b = tensor(&data(12, 5, true), &[4, 3], dtype);
            let want = f64s(&composed(op, &s, &a, &b, 0.3));
            run(op, &s, &a, &b, 0.3).unwrap();
            assert_eq!(f64s(&s), want, "{op} {dtype:?}");
            // written through the view into the base
            assert_eq!(f64s(&base.t().unwrap()), want, "{op} {dtype:?} base");
        }
    }
}

#[test]
fn operands_may_alias_each_other_and_the_target() {
    // Adam's `addcmul_(grad, grad)`: both operands one storage.
    let v = tensor(&[1.0, 2.0, 3.0], &[3], DType::F32);
    let g = tensor(&[0.5, -1.0, 2.0], &[3], DType::F32);
    v.addcmul_(&g, &g, 0.25).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![1.0625, 2.25, 4.0]);
    // The target as an operand: read before it is written.
    let x = tensor(&[1.0, 2.0, 4.0], &[3], DType::F32);
    x.addcdiv_(&x, &x, 1.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 5.0]);
    let y = tensor(&[1.0, 2.0], &[2], DType::F64);
    y.lerp_(&y, 0.3).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![1.0, 2.0]);
    // A shifted view of the target's own storage.
    let z = tensor(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F32);
    let (lo, hi) = (z.narrow(0, 0, 3).unwrap(), z.narrow(0, 1, 3).unwrap());
    lo.addcmul_(&hi, &hi, 1.0).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![5.0, 11.0, 19.0, 4.0]);
}

#[test]
fn bad_operands_are_errors() {
    let s = tensor(&[1.0, 2.0], &[2], DType::F32);
    let three = tensor(&[1.0, 2.0, 3.0], &[3], DType::F32);
    let e = s.addcmul_(&three, &s, 1.0).unwrap_err().to_string();
    assert!(e.contains("[3]") && e.contains("[2]"), "{e}");
    let e = s.lerp_(&three, 0.5).unwrap_err().to_string();
    assert!(e.contains("[3]") && e.contains("[2]"), "{e}");
    let d = tensor(&[1.0, 2.0], &[2], DType::F64);
    let e = s.lerp_(&d, 0.5).unwrap_err().to_string();
    assert!(e.contains("lerp_"), "{e}");
    let i = Tensor::new(&[1i64, 2], CPU).unwrap();
    assert!(i.lerp_(&i, 0.5).is_err(), "lerp_ on integers");
    // Writing into an expanded view is refused, as for every in-place op.
    let e = s.reshape([2, 1]).unwrap().expand([2, 3]).unwrap();
    let ones = Tensor::ones([2, 3], ()).unwrap();
    assert!(e.addcmul_(&ones, &ones, 1.0).is_err());
    assert!(e.lerp_(&ones, 0.5).is_err());
    assert_eq!(
        s.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0],
        "unchanged after errors"
    );
}

#[test]
fn each_op_bumps_the_version_counter_once_fused_or_composed() {
    // Fused (f32/f64 contiguous), composed for the dtype (f16), composed for the layout (a
    // transposed target), composed for aliasing (the target as an operand): one write each,
    // as autograd's saved-tensor check expects of one in-place op.
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for op in OPS {
            for weight in [0.3, 0.7] {
                let a = tensor(&data(12, 4, false), &[3, 4], dtype);
                let b = tensor(&data(12, 5, true), &[3, 4], dtype);
                let targets = [
                    tensor(&data(12, 3, false), &[3, 4], dtype),
                    tensor(&data(12, 3, false), &[4, 3], dtype).t().unwrap(),
                ];
                for s in &targets {
                    let before = s.version();
                    run(op, s, &a, &b, weight).unwrap();
                    assert_eq!(s.version(), before + 1, "{op} {dtype:?} w={weight}");
                }
                let s = tensor(&data(12, 3, true), &[3, 4], dtype);
                let before = s.version();
                run(op, &s, &s, &s, weight).unwrap();
                assert_eq!(s.version(), before + 1, "{op} {dtype:?} aliased");
            }
        }
    }
}
