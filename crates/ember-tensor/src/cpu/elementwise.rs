//! CPU kernels of the elementwise families: unary, binary, comparisons, `where`,
//! `threshold_backward`, clamp, and their in-place forms.

use crate::cpu::{Flat, dispatch, map1, map1_as, map2, update1, update2, update3};
use crate::dtype::DType;
use crate::dtype::WithDType;
use crate::error::Result;
use crate::layout::Layout;
use crate::op::{BinaryOpT, CmpOp, Elem, FusedOp, UnaryOpT};
use crate::scalar::Scalar;
use crate::storage::CpuStorage;
use crate::strided::StridedIndex;

pub(crate) fn unary<O: UnaryOpT>(src: &CpuStorage, l: &Layout) -> Result<CpuStorage> {
    // The float dtypes take the widest vector instructions: `exp`, `sigmoid`, `silu`, ... are
    // bound by arithmetic, not memory, and `exp_f32`'s `mul_add`s must be FMA instructions
    // (f16 and bf16 compute in f32).
    match src.dtype() {
        DType::F32 => map1_as::<true, f32, f32, _>(src, l, |x| x.unary::<O>()),
        DType::F16 => map1_as::<true, half::f16, half::f16, _>(src, l, |x| x.unary::<O>()),
        DType::Bf16 => map1_as::<true, half::bf16, half::bf16, _>(src, l, |x| x.unary::<O>()),
        dt => dispatch!(dt, T => map1::<T, T, _>(src, l, |x| x.unary::<O>())),
    }
}

pub(crate) fn binary<O: BinaryOpT>(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    dispatch!(a.dtype(), T => map2::<T, T, _>(a, la, b, lb, |x, y| x.binary::<O>(y)))
}

/// A [`FusedOp`] on f32 or f64 in one pass, computed as PyTorch's kernels (and Ember's
/// composed form of the op) do, operation for operation: `s + (v·a)·b`, `s + (v·a)/b`,
/// and `lerp` as `s + w·(e - s)` for `|w| < 0.5`, else `e - (e - s)·(1 - w)`, with `v`, `w`
/// and `1 - w` in the tensor's dtype. `Ok(false)` for other dtypes or, for the three-operand
/// ops, operands that are not all contiguous: the caller composes the op then.
pub(crate) fn fused_inplace(
    dst: &mut CpuStorage,
    ld: &Layout,
    srcs: &[(&CpuStorage, &Layout)],
    op: FusedOp,
) -> Result<bool> {
    match dst.dtype() {
        DType::F32 => fused_typed::<f32>(dst, ld, srcs, op),
        DType::F64 => fused_typed::<f64>(dst, ld, srcs, op),
        _ => Ok(false),
    }
}

fn fused_typed<T>(
    dst: &mut CpuStorage,
    ld: &Layout,
    srcs: &[(&CpuStorage, &Layout)],
    op: FusedOp,
) -> Result<bool>
where
    T: WithDType
        + std::ops::Add<Output = T>
        + std::ops::Sub<Output = T>
        + std::ops::Mul<Output = T>
        + std::ops::Div<Output = T>,
{
    if srcs.iter().any(|(s, _)| s.dtype() != T::DTYPE) {
        return Ok(false);
    }
    match (op, srcs) {
        (FusedOp::Addcmul(v), &[a, b]) => {
            let v = T::from_f64(v);
            update3::<T, _>(dst, ld, a, b, |s, x, y| s + v * x * y)
        }
        (FusedOp::Addcdiv(v), &[a, b]) => {
            let v = T::from_f64(v);
            update3::<T, _>(dst, ld, a, b, |s, x, y| s + v * x / y)
        }
        (FusedOp::Lerp(w), &[(e, le)]) => {
            let w = T::from_f64(w);
            let one_minus_w = T::from_f64(1.0) - w;
            if w.to_f64().abs() < 0.5 {
                update2::<T, _>(dst, ld, e, le, |s, e| s + w * (e - s))?;
            } else {
                update2::<T, _>(dst, ld, e, le, |s, e| e - (e - s) * one_minus_w)?;
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

pub(crate) fn binary_inplace<O: BinaryOpT>(
    dst: &mut CpuStorage,
    ld: &Layout,
    src: &CpuStorage,
    ls: &Layout,
) -> Result<()> {
    dispatch!(dst.dtype(), T => update2::<T, _>(dst, ld, src, ls, |x, y| x.binary::<O>(y)))
}

fn cmp_typed<T: WithDType + PartialOrd>(
    op: CmpOp,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    match op {
        CmpOp::Eq => map2::<T, bool, _>(a, la, b, lb, |x, y| x == y),
        CmpOp::Ne => map2::<T, bool, _>(a, la, b, lb, |x, y| x != y),
        CmpOp::Lt => map2::<T, bool, _>(a, la, b, lb, |x, y| x < y),
        CmpOp::Le => map2::<T, bool, _>(a, la, b, lb, |x, y| x <= y),
        CmpOp::Gt => map2::<T, bool, _>(a, la, b, lb, |x, y| x > y),
        CmpOp::Ge => map2::<T, bool, _>(a, la, b, lb, |x, y| x >= y),
    }
}

pub(crate) fn cmp(
    op: CmpOp,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    dispatch!(a.dtype(), T => cmp_typed::<T>(op, a, la, b, lb))
}

/// `out = cond ? t : f`; `cond` is bool, `t` and `f` share a dtype, all one shape.
pub(crate) fn where_cond(
    cond: &CpuStorage,
    lc: &Layout,
    t: &CpuStorage,
    lt: &Layout,
    f: &CpuStorage,
    lf: &Layout,
) -> Result<CpuStorage> {
    let c = cond.as_slice::<bool>()?;
    dispatch!(t.dtype(), T => {
        let (tv, fv) = (t.as_slice::<T>()?, f.as_slice::<T>()?);
        // Contiguous or broadcast-scalar operands (ReLU's backward, `where(x > 0, g, 0)`):
        // flat indexing, no stride walk.
        if let (Some(cf), Some(tf), Some(ff)) =
            (Flat::of(c, lc), Flat::of(tv, lt), Flat::of(fv, lf))
        {
            return CpuStorage::from_chunks(lc.numel(), |r| {
                r.map(move |i| if cf.at(i) { tf.at(i) } else { ff.at(i) })
            });
        }
        CpuStorage::from_chunks(lc.numel(), |r| {
            let len = r.len();
            StridedIndex::from_position(lc, r.start)
                .zip(StridedIndex::from_position(lt, r.start))
                .zip(StridedIndex::from_position(lf, r.start))
                .take(len)
                .map(|((i, j), k)| {
                    let pick = c.get(i).copied().unwrap_or(false);
                    let src = if pick { tv.get(j) } else { fv.get(k) };
                    src.copied().unwrap_or(<T as WithDType>::ZERO)
                })
        })
    })
}

/// `out = x <= threshold ? 0 : g` (PyTorch's `threshold_backward`): one parallel pass, the
/// threshold converted to the dtype first; NaN in `x` compares false and passes `g`.
pub(crate) fn threshold_backward(
    g: &CpuStorage,
    lg: &Layout,
    x: &CpuStorage,
    lx: &Layout,
    threshold: Scalar,
) -> Result<CpuStorage> {
    dispatch!(g.dtype(), T => {
        let th = threshold.to_dtype::<T>();
        map2::<T, T, _>(g, lg, x, lx, move |g, x| if x <= th { <T as WithDType>::ZERO } else { g })
    })
}

fn clamp_fn<T: WithDType + PartialOrd>(
    min: Option<Scalar>,
    max: Option<Scalar>,
) -> impl Fn(T) -> T + Sync {
    let lo = min.map(|s| s.to_dtype::<T>());
    let hi = max.map(|s| s.to_dtype::<T>());
    move |x: T| {
        // NaN stays NaN (x != x); as PyTorch, max wins when min > max.
        #[allow(clippy::eq_op)]
        let nan = x != x;
        if nan {
            return x;
        }
        let mut y = x;
        if let Some(lo) = lo
            && y < lo
        {
            y = lo;
        }
        if let Some(hi) = hi
            && y > hi
        {
            y = hi;
        }
        y
    }
}

/// Clamp into `[min, max]`; the bounds are already in the tensor's dtype category.
pub(crate) fn clamp(
    src: &CpuStorage,
    l: &Layout,
    min: Option<Scalar>,
    max: Option<Scalar>,
) -> Result<CpuStorage> {
    dispatch!(src.dtype(), T => map1::<T, T, _>(src, l, clamp_fn::<T>(min, max)))
}

pub(crate) fn clamp_inplace(
    dst: &mut CpuStorage,
    l: &Layout,
    min: Option<Scalar>,
    max: Option<Scalar>,
) -> Result<()> {
    dispatch!(dst.dtype(), T => update1::<T, _>(dst, l, clamp_fn::<T>(min, max)))
}

pub(crate) fn fill(dst: &mut CpuStorage, l: &Layout, value: Scalar) -> Result<()> {
    dispatch!(dst.dtype(), T => {
        let v = value.to_dtype::<T>();
        update1::<T, _>(dst, l, move |_| v)
    })
}

/// `dst = src` elementwise; `src` has `dst`'s dtype and shape.
pub(crate) fn copy(dst: &mut CpuStorage, ld: &Layout, src: &CpuStorage, ls: &Layout) -> Result<()> {
    dispatch!(dst.dtype(), T => update2::<T, _>(dst, ld, src, ls, |_, y| y))
}
