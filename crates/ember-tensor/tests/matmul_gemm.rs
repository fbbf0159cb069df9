#![allow(clippy::unwrap_used)]
//! matmul on the ember-gemm path (f32, f16, bf16) and the loop path (f64, integers) against
//! a naive f64 reference: random shapes with broadcast batch dims, 1-D operands, k = 0 and
//! empty dims, operands that are contiguous, transposed, strided slices or expanded views.

mod common_nn;

use common_nn::CPU;
use ember_tensor::{DType, Tensor};
use ember_testing::{rand_vec, reference, values};
use proptest::prelude::*;

/// `t` as an operand of the given layout kind holding `vals` (row-major) in `dtype`:
/// 0 contiguous; 1 every dim reversed in memory (a transposed matrix); 2 a strided slice
/// (every other element of every dim of a larger, NaN-padded tensor: no unit stride, a
/// non-zero offset); 3 the first row along dim 0 expanded (stride 0; the values change).
fn operand(vals: &[f64], shape: &[usize], dtype: DType, kind: u8) -> Tensor {
    let plain = || {
        Tensor::from_vec(vals.to_vec(), shape.to_vec(), CPU)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    match kind {
        0 => plain(),
        1 => {
            let rev: Vec<usize> = (0..shape.len()).rev().collect();
            let t = plain().permute(&rev).unwrap().contiguous().unwrap();
            t.permute(&rev).unwrap()
        }
        2 => {
            let wide: Vec<usize> = shape.iter().map(|&d| 2 * d + 1).collect();
            let mut data = vec![f64::NAN; wide.iter().product()];
            for (i, &v) in vals.iter().enumerate() {
                // Logical index i -> position (1 + 2·idx) in every dim of `wide`.
                let (mut rest, mut at, mut scale) = (i, 0, 1);
                for (&d, &w) in shape.iter().zip(&wide).rev() {
                    at += (1 + 2 * (rest % d)) * scale;
                    rest /= d;
                    scale *= w;
                }
                data[at] = v;
            }
            let mut t = Tensor::from_vec(data, wide, CPU)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            for d in 0..shape.len() {
                t = t.slice(d, 1.., 2).unwrap();
            }
            assert_eq!(t.dims(), shape);
            t
        }
        _ => {
            if shape.first().is_none_or(|&d| d == 0) {
                return plain();
            }
            plain().narrow(0, 0, 1).unwrap().expand(shape).unwrap()
        }
    }
}

/// Unit roundoff of results stored in `dtype`, the absolute rounding error of its subnormal
/// range (half its smallest subnormal: below the smallest normal, rounding is not relative),
/// and the unit roundoff of its accumulator.
fn eps(dtype: DType) -> (f64, f64, f64) {
    let (e32, e64) = (f32::EPSILON as f64 / 2.0, f64::EPSILON / 2.0);
    match dtype {
        DType::F64 => (e64, 2f64.powi(-1075), e64),
        DType::F32 => (e32, 2f64.powi(-150), e32),
        DType::F16 => (2f64.powi(-11), 2f64.powi(-25), e32),
        _ => (2f64.powi(-8), 2f64.powi(-134), e32),
    }
}

/// `a @ b` in `dtype` against the reference on the values the operands hold (already
/// rounded to `dtype`): within one rounding of the output (relative, or absolute in the
/// subnormal range) plus `2(k+2)` accumulator roundings of `Σ|a·b|`.
fn check(a: &Tensor, b: &Tensor, dtype: DType, what: &str) {
    let (av, bv) = (values(a), values(b));
    let (shape, want, scale) = reference::matmul(&av, &a.dims(), &bv, &b.dims());
    let c = a.matmul(b).unwrap();
    assert_eq!(c.dtype(), dtype, "{what}");
    assert_eq!(c.dims(), &shape[..], "{what}");
    let got = values(&c);
    let k = a.dims()[a.rank() - 1] as f64;
    let (out_eps, out_tiny, acc_eps) = eps(dtype);
    for (i, ((g, w), s)) in got.iter().zip(&want).zip(&scale).enumerate() {
        let tol = 2.0 * (out_eps * w.abs() + out_tiny) + 2.0 * (k + 2.0) * acc_eps * s;
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w} (tol {tol:e})"
        );
    }
}

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::Bf16, DType::F64];

/// Batch dims of A and B: none, equal, one side only, and broadcasts that fold into one
/// ember-gemm batch or do not (`[b1, 1] x [b2]`).
fn batches(case: usize, b1: usize, b2: usize) -> (Vec<usize>, Vec<usize>) {
    match case {
        0 => (vec![], vec![]),
        1 => (vec![b1], vec![b1]),
        2 => (vec![b1], vec![]),
        3 => (vec![], vec![b1]),
        4 => (vec![b1, 1], vec![b2]),
        5 => (vec![1, b2], vec![b1, 1]),
        _ => (vec![b1, b2], vec![b1, b2]),
    }
}

/// One generated case: operand shapes from the batch `case`, 1-D operands now and then (only
/// without batch dims, as PyTorch allows any), layouts `la`/`lb`, values from `seed`.
#[allow(clippy::too_many_arguments)]
fn product_case(
    (m, k, n): (usize, usize, usize),
    (case, b1, b2): (usize, usize, usize),
    (la, lb, vec_a, vec_b): (u8, u8, usize, usize),
    dtype: DType,
    seed: u64,
) {
    let (bsa, bsb) = batches(case, b1, b2);
    let sa = if vec_a == 0 && bsa.is_empty() {
        vec![k]
    } else {
        [bsa, vec![m, k]].concat()
    };
    let sb = if vec_b == 0 {
        vec![k]
    } else {
        [bsb, vec![k, n]].concat()
    };
    let a = operand(&rand_vec(sa.iter().product(), seed), &sa, dtype, la);
    let b = operand(&rand_vec(sb.iter().product(), seed ^ 1), &sb, dtype, lb);
    check(&a, &b, dtype, &format!("{dtype} {sa:?}/{la} @ {sb:?}/{lb}"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn matmul_matches_f64_reference(
        m in 0usize..10, k in 0usize..10, n in 0usize..10,
        case in 0usize..7, b1 in 0usize..4, b2 in 1usize..4,
        la in 0u8..4, lb in 0u8..4, vec_a in 0usize..6, vec_b in 0usize..6,
        dt in 0usize..4, seed in any::<u64>(),
    ) {
        product_case((m, k, n), (case, b1, b2), (la, lb, vec_a, vec_b), DTYPES[dt], seed);
    }
}

#[test]
fn f16_products_in_the_subnormal_range_round_absolutely() {
    // Found by CI: a product of 2.29e-5 lies below f16's smallest normal (6.1e-5), where
    // one rounding is up to 2^-25 absolute, far above 2^-11 relative.
    let seed = 17035612809863863412;
    product_case((4, 1, 0), (1, 3, 1), (0, 0, 0, 0), DType::F16, seed);
}

#[test]
fn large_and_many_small_products_take_the_parallel_paths() {
    for dtype in DTYPES {
        // One product above the parallel threshold, A transposed, B broadcast over 3.
        let a = operand(&rand_vec(3 * 70 * 90, 1), &[3, 70, 90], dtype, 1);
        let b = operand(&rand_vec(90 * 80, 2), &[90, 80], dtype, 0);
        check(&a, &b, dtype, &format!("{dtype} large"));
        // Many small products in one ember-gemm batch / one task each.
        let a = operand(&rand_vec(64 * 16 * 16, 3), &[64, 16, 16], dtype, 0);
        let b = operand(&rand_vec(64 * 16 * 16, 4), &[64, 16, 16], dtype, 2);
        check(&a, &b, dtype, &format!("{dtype} many small"));
        // A broadcast that does not fold: 16 calls of 8, one task each.
        let a = operand(&rand_vec(16 * 16 * 16, 5), &[16, 1, 16, 16], dtype, 0);
        let b = operand(&rand_vec(8 * 16 * 16, 6), &[8, 16, 16], dtype, 1);
        check(&a, &b, dtype, &format!("{dtype} unfolded broadcast"));
    }
}

#[test]
fn empty_inner_dims_give_zeros_and_empty_outputs_have_their_shape() {
    for dtype in DTYPES
        .into_iter()
        .chain([DType::I64, DType::I32, DType::U8])
    {
        let z = |s: &[usize]| Tensor::ones(s, dtype).unwrap();
        let c = z(&[2, 3, 0]).matmul(&z(&[0, 4])).unwrap();
        assert_eq!((c.dims(), c.dtype()), (vec![2, 3, 4], dtype));
        assert!(values(&c).iter().all(|&x| x == 0.0), "{dtype}");
        for (sa, sb, want) in [
            (vec![0, 3], vec![3, 4], vec![0, 4]),
            (vec![2, 3], vec![3, 0], vec![2, 0]),
            (vec![0, 2, 3], vec![3, 4], vec![0, 2, 4]),
            (vec![2, 0, 2, 3], vec![1, 3, 4], vec![2, 0, 2, 4]),
        ] {
            assert_eq!(z(&sa).matmul(&z(&sb)).unwrap().dims(), &want[..], "{dtype}");
        }
    }
}

#[test]
fn integer_products_wrap_like_their_type() {
    // Values as i64 (exact), then the integer dtypes, transposed and broadcast.
    let av: Vec<f64> = (0..2 * 3 * 4).map(|i| ((i * 37) % 23) as f64).collect();
    let bv: Vec<f64> = (0..4 * 5).map(|i| ((i * 11) % 19) as f64).collect();
    let (_, want, _) = reference::matmul(&av, &[2, 3, 4], &bv, &[4, 5]);
    for dtype in [DType::I64, DType::I32, DType::U8] {
        for (la, lb) in [(0, 0), (1, 2), (2, 1)] {
            let a = operand(&av, &[2, 3, 4], dtype, la);
            let b = operand(&bv, &[4, 5], dtype, lb);
            let got = a.matmul(&b).unwrap().to_dtype(DType::I64).unwrap();
            let got = got.to_vec::<i64>().unwrap();
            let want: Vec<i64> = want
                .iter()
                .map(|&w| {
                    if dtype == DType::U8 {
                        w as i64 as u8 as i64
                    } else {
                        w as i64
                    }
                })
                .collect();
            assert_eq!(got, want, "{dtype} layouts {la}/{lb}");
        }
    }
}

#[test]
fn bad_operands_are_errors() {
    let f = |s: &[usize], d: DType| Tensor::ones(s, d).unwrap();
    assert!(
        f(&[2, 2], DType::Bool)
            .matmul(&f(&[2, 2], DType::Bool))
            .is_err()
    );
    assert!(
        f(&[2, 2], DType::F16)
            .matmul(&f(&[2, 2], DType::Bf16))
            .is_err()
    );
    assert!(
        f(&[2, 3], DType::F16)
            .matmul(&f(&[2, 3], DType::F16))
            .is_err()
    );
    assert!(
        f(&[2, 2, 3], DType::F32)
            .matmul(&f(&[3, 3, 2], DType::F32))
            .is_err()
    );
}
