//! CPU kernels. Every kernel takes storages with their layouts and returns a fresh
//! contiguous storage (or writes in place into a `&mut` one). Contiguous inputs take a
//! plain-slice path the compiler vectorises; others walk [`StridedIndex`]; both split into
//! parallel chunks above [`PAR_THRESHOLD`](crate::storage::PAR_THRESHOLD) elements.

pub(crate) mod amp;
pub(crate) mod attention;
pub(crate) mod batch_norm;
pub(crate) mod conv;
pub(crate) mod cross_entropy;
pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod optim;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod simd;
pub(crate) mod softmax;

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{CpuStorage, for_each_piece};
use crate::strided::StridedIndex;

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::dtype::DType::Bf16 => {
                type $T = half::bf16;
                $body
            }
            $crate::dtype::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::dtype::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::dtype::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::dtype::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}
pub(crate) use dispatch;

/// The error of a layout that reaches outside its storage: an internal error, never the
/// user's (the fronts build every layout the kernels see).
pub(crate) fn corrupt(op: &'static str) -> TensorError {
    TensorError::invalid(op, "layout reaches outside its storage (internal error)")
}

/// The layout's elements as one slice, if the layout is contiguous.
pub(crate) fn contiguous_slice<'a, T>(data: &'a [T], l: &Layout) -> Option<&'a [T]> {
    let (s, e) = l.contiguous_range()?;
    data.get(s..e)
}

/// An operand read by flat element index without walking strides: a contiguous slice, or
/// one value broadcast over the whole shape.
#[derive(Clone, Copy)]
pub(crate) enum Flat<'a, T> {
    Slice(&'a [T]),
    Const(T),
}

impl<'a, T: WithDType> Flat<'a, T> {
    /// The operand as a flat one, if its layout is contiguous or constant (and not empty).
    pub(crate) fn of(data: &'a [T], l: &Layout) -> Option<Flat<'a, T>> {
        if l.numel() == 0 {
            return None;
        }
        if let Some(s) = contiguous_slice(data, l) {
            return Some(Flat::Slice(s));
        }
        if is_constant(l) {
            return data.get(l.offset()).map(|&v| Flat::Const(v));
        }
        None
    }

    /// Element `i` (zero past the end, which the callers' bounds checks exclude).
    #[inline(always)]
    pub(crate) fn at(&self, i: usize) -> T {
        match self {
            Flat::Slice(s) => s.get(i).copied().unwrap_or(T::ZERO),
            Flat::Const(v) => *v,
        }
    }
}

/// `true` if every element of the layout is the same storage element (a broadcast scalar).
fn is_constant(l: &Layout) -> bool {
    l.dims()
        .iter()
        .zip(l.strides())
        .all(|(&d, &s)| d <= 1 || s == 0)
}

fn check_bounds(data_len: usize, l: &Layout, op: &'static str) -> Result<()> {
    if l.max_extent() <= data_len || l.numel() == 0 {
        Ok(())
    } else {
        Err(corrupt(op))
    }
}

/// `out[i] = f(src[i])` over the layout, into a new contiguous storage.
pub(crate) fn map1<T, U, F>(src: &CpuStorage, l: &Layout, f: F) -> Result<CpuStorage>
where
    T: WithDType,
    U: WithDType,
    F: Fn(T) -> U + Sync,
{
    map1_as::<false, T, U, F>(src, l, f)
}

/// [`map1`], with each chunk's loop compiled for the CPU's widest vector instructions (see
/// `cpu::simd`) when `WIDE`: for arithmetic-bound `f` such as `exp`, whose `mul_add`s are
/// single FMA instructions there, where baseline x86-64 code would call libm's `fmaf`.
pub(crate) fn map1_as<const WIDE: bool, T, U, F>(
    src: &CpuStorage,
    l: &Layout,
    f: F,
) -> Result<CpuStorage>
where
    T: WithDType,
    U: WithDType,
    F: Fn(T) -> U + Sync,
{
    let data = src.as_slice::<T>()?;
    check_bounds(data.len(), l, "map")?;
    let n = l.numel();
    if let Some(d) = contiguous_slice(data, l) {
        CpuStorage::from_chunks_as::<WIDE, _, _, _>(n, |r| d[r].iter().map(|&x| f(x)))
    } else {
        CpuStorage::from_chunks_as::<WIDE, _, _, _>(n, |r| {
            let len = r.len();
            StridedIndex::from_position(l, r.start)
                .take(len)
                .map(|i| f(data.get(i).copied().unwrap_or(T::ZERO)))
        })
    }
}

/// `out[i] = f(a[i], b[i])` for two layouts of one shape, into a new contiguous storage.
pub(crate) fn map2<T, U, F>(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
    f: F,
) -> Result<CpuStorage>
where
    T: WithDType,
    U: WithDType,
    F: Fn(T, T) -> U + Sync,
{
    let (da, db) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    check_bounds(da.len(), la, "map2")?;
    check_bounds(db.len(), lb, "map2")?;
    let n = la.numel();
    if n == 0 {
        return CpuStorage::from_chunks(0, |_| std::iter::empty::<U>());
    }
    match (contiguous_slice(da, la), contiguous_slice(db, lb)) {
        (Some(x), Some(y)) => {
            return CpuStorage::from_chunks(n, |r| {
                x[r.clone()].iter().zip(&y[r]).map(|(&p, &q)| f(p, q))
            });
        }
        (Some(x), None) if is_constant(lb) => {
            let q = db
                .get(lb.offset())
                .copied()
                .ok_or_else(|| corrupt("map2"))?;
            return CpuStorage::from_chunks(n, |r| x[r].iter().map(|&p| f(p, q)));
        }
        (None, Some(y)) if is_constant(la) => {
            let p = da
                .get(la.offset())
                .copied()
                .ok_or_else(|| corrupt("map2"))?;
            return CpuStorage::from_chunks(n, |r| y[r].iter().map(|&q| f(p, q)));
        }
        _ => {}
    }
    if let Some(out) = map2_rows(da, la, db, lb, &f)? {
        return Ok(out);
    }
    CpuStorage::from_chunks(n, |r| {
        let len = r.len();
        StridedIndex::from_position(la, r.start)
            .zip(StridedIndex::from_position(lb, r.start))
            .take(len)
            .map(|(i, j)| {
                f(
                    da.get(i).copied().unwrap_or(T::ZERO),
                    db.get(j).copied().unwrap_or(T::ZERO),
                )
            })
    })
}

/// [`map2`] a row (the last dimension) at a time, when along it each operand is contiguous
/// or one value (stride 1 or 0): `x + bias`, `x * scale[:, None]`, a row of a transposed
/// view. The strided walk costs a few nanoseconds an element; this costs that per row, and
/// its inner loops vectorise. `None` for other layouts or short rows.
fn map2_rows<T, U, F>(
    da: &[T],
    la: &Layout,
    db: &[T],
    lb: &Layout,
    f: &F,
) -> Result<Option<CpuStorage>>
where
    T: WithDType,
    U: WithDType,
    F: Fn(T, T) -> U + Sync,
{
    let inner = la.dims().last().copied().unwrap_or(0);
    let stride = |l: &Layout| l.strides().last().copied().filter(|&s| s <= 1);
    let (Some(sa), Some(sb)) = (stride(la), stride(lb)) else {
        return Ok(None);
    };
    if inner < 16 {
        return Ok(None);
    }
    let n = la.numel();
    // Every element is in bounds (`map2` checked both layouts), so the rows' slices are too;
    // `get` keeps an internal error from panicking (its row stays zero).
    let mut out = CpuStorage::zeroed(U::DTYPE, n)?;
    let o = out.as_mut_slice::<U>()?;
    for_each_piece(o, |start, mut piece| {
        let mut pos = start;
        while !piece.is_empty() {
            let (row, col) = (pos / inner, pos % inner);
            let len = (inner - col).min(piece.len());
            let (head, tail) = std::mem::take(&mut piece).split_at_mut(len);
            let a0 = crate::strided::offset_of(la, row * inner) + col * sa;
            let b0 = crate::strided::offset_of(lb, row * inner) + col * sb;
            match (row_run(da, a0, sa, len), row_run(db, b0, sb, len)) {
                (Some(x), Some(y)) if sa == 1 && sb == 1 => {
                    for ((o, &p), &q) in head.iter_mut().zip(x).zip(y) {
                        *o = f(p, q);
                    }
                }
                (Some(x), Some(&[q])) if sa == 1 => {
                    for (o, &p) in head.iter_mut().zip(x) {
                        *o = f(p, q);
                    }
                }
                (Some(&[p]), Some(y)) if sb == 1 => {
                    for (o, &q) in head.iter_mut().zip(y) {
                        *o = f(p, q);
                    }
                }
                (Some(&[p]), Some(&[q])) => head.fill(f(p, q)),
                _ => {}
            }
            pos += len;
            piece = tail;
        }
    });
    Ok(Some(out))
}

/// The `len` elements of a row from `at` (stride 1), or its one value (stride 0).
fn row_run<T>(d: &[T], at: usize, stride: usize, len: usize) -> Option<&[T]> {
    d.get(at..at + if stride == 1 { len } else { 1 })
}

/// `dst[i] = f(dst[i], src[i])` in place, for two layouts of one shape. `dst`'s layout must
/// not overlap itself (checked by the front).
pub(crate) fn update2<T, F>(
    dst: &mut CpuStorage,
    ld: &Layout,
    src: &CpuStorage,
    ls: &Layout,
    f: F,
) -> Result<()>
where
    T: WithDType,
    F: Fn(T, T) -> T + Sync,
{
    // Nothing to write; an empty view's offset may be past its (empty) storage's end.
    if ld.numel() == 0 {
        return Ok(());
    }
    let s = src.as_slice::<T>()?;
    check_bounds(s.len(), ls, "update")?;
    if is_constant(ls) {
        // One value broadcast over `dst` (a scalar operand, `x.mul_(0.9)`): read it once
        // and take `update1`'s contiguous, parallel loop rather than the strided walk.
        let q = *s.get(ls.offset()).ok_or_else(|| corrupt("update"))?;
        return update1(dst, ld, |p| f(p, q));
    }
    let d = dst.as_mut_slice::<T>()?;
    check_bounds(d.len(), ld, "update")?;
    if let (Some((a, b)), Some(y)) = (ld.contiguous_range(), contiguous_slice(s, ls)) {
        let x = d.get_mut(a..b).ok_or_else(|| corrupt("update"))?;
        for_each_piece(x, |start, x| {
            let y = y.get(start..).unwrap_or(&[]);
            x.iter_mut().zip(y).for_each(|(p, &q)| *p = f(*p, q));
        });
        return Ok(());
    }
    for (i, j) in ld.strided_index().zip(ls.strided_index()) {
        if let (Some(&q), Some(p)) = (s.get(j), d.get_mut(i)) {
            *p = f(*p, q);
        }
    }
    Ok(())
}

/// `dst[i] = f(dst[i], a[i], b[i])` in place when all three are contiguous with `dst`'s
/// element count; `Ok(false)` (nothing written) otherwise, for the caller's general path.
pub(crate) fn update3<T, F>(
    dst: &mut CpuStorage,
    ld: &Layout,
    (a, la): (&CpuStorage, &Layout),
    (b, lb): (&CpuStorage, &Layout),
    f: F,
) -> Result<bool>
where
    T: WithDType,
    F: Fn(T, T, T) -> T + Sync,
{
    let (sa, sb) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    let (Some(x), Some(y), Some((lo, hi))) = (
        contiguous_slice(sa, la),
        contiguous_slice(sb, lb),
        ld.contiguous_range(),
    ) else {
        return Ok(false);
    };
    let d = dst.as_mut_slice::<T>()?;
    let z = d.get_mut(lo..hi).ok_or_else(|| corrupt("update"))?;
    if x.len() != z.len() || y.len() != z.len() {
        return Ok(false);
    }
    for_each_piece(z, |start, z| {
        let (x, y) = (x.get(start..).unwrap_or(&[]), y.get(start..).unwrap_or(&[]));
        for ((p, &q), &r) in z.iter_mut().zip(x).zip(y) {
            *p = f(*p, q, r);
        }
    });
    Ok(true)
}

/// `dst[i] = f(dst[i])` in place over a non-overlapping layout.
pub(crate) fn update1<T, F>(dst: &mut CpuStorage, ld: &Layout, f: F) -> Result<()>
where
    T: WithDType,
    F: Fn(T) -> T + Sync,
{
    if ld.numel() == 0 {
        return Ok(());
    }
    let d = dst.as_mut_slice::<T>()?;
    check_bounds(d.len(), ld, "update")?;
    if let Some((a, b)) = ld.contiguous_range() {
        let x = d.get_mut(a..b).ok_or_else(|| corrupt("update"))?;
        for_each_piece(x, |_, x| x.iter_mut().for_each(|p| *p = f(*p)));
        return Ok(());
    }
    for i in ld.strided_index() {
        if let Some(p) = d.get_mut(i) {
            *p = f(*p);
        }
    }
    Ok(())
}

/// Converts one element with PyTorch's cast rules (see Note [Float to int casts]).
#[inline(always)]
pub(crate) fn cast_elem<T: WithDType, U: WithDType>(x: T) -> U {
    if U::DTYPE == DType::Bool {
        // x != 0, NaN -> true
        U::from_f64(x.to_f64())
    } else if T::DTYPE.is_float() {
        U::from_f64(x.to_f64())
    } else {
        U::from_i64(x.to_i64())
    }
}

/// A contiguous copy of the layout's elements converted to `dtype`.
pub(crate) fn cast(src: &CpuStorage, l: &Layout, dtype: DType) -> Result<CpuStorage> {
    // The casts between f32 and the 16-bit floats (autocast's) take vectorised loops; they
    // give `cast_elem`'s bits (f32 → f64 is exact, so `from_f64(x as f64)` rounds once).
    match (src.dtype(), dtype) {
        (DType::F32, DType::Bf16) => {
            return map1_as::<true, f32, _, _>(src, l, crate::dtype::bf16_from_f32);
        }
        (DType::Bf16, DType::F32) => {
            return map1_as::<true, _, f32, _>(src, l, crate::dtype::bf16_to_f32);
        }
        (DType::F32, DType::F16) => {
            return map1_as::<true, f32, _, _>(src, l, half::f16::from_f32);
        }
        (DType::F16, DType::F32) => return map1_as::<true, _, f32, _>(src, l, half::f16::to_f32),
        _ => {}
    }
    dispatch!(src.dtype(), T => dispatch!(dtype, U => {
        if T::DTYPE == U::DTYPE {
            map1::<T, T, _>(src, l, |x| x)
        } else {
            map1::<T, U, _>(src, l, cast_elem::<T, U>)
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 bit patterns over every exponent: zeros, subnormals, halfway and near-halfway
    /// mantissas, the largest finite values, infinities and NaNs of both signs.
    fn f32_patterns() -> Vec<f32> {
        let mantissas = [
            0u32, 1, 0x7fff, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x1_8001, 0x40_0000, 0x7f_ffff,
            0x12_3456, 0x7f_8000,
        ];
        let mut v = Vec::new();
        for sign in [0u32, 1 << 31] {
            for exp in 0u32..=255 {
                for &m in &mantissas {
                    v.push(f32::from_bits(sign | exp << 23 | m));
                }
            }
        }
        v
    }

    fn same_bits_or_both_nan(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn fast_16_bit_casts_give_the_general_paths_bits() {
        for x in f32_patterns() {
            // `half`'s own conversions (which `WithDType` used before): the same bits.
            let general = half::bf16::from_f32(x);
            let fast: half::bf16 = cast_elem(x);
            assert_eq!(
                fast.to_bits(),
                general.to_bits(),
                "{x:e} ({:#x})",
                x.to_bits()
            );
            let widened = crate::dtype::bf16_to_f32(general);
            assert!(same_bits_or_both_nan(widened, general.to_f32()), "{x:e}");
            let (a, b) = (WithDType::to_f64(general), general.to_f64());
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{x:e}"
            );
        }
        // Through `cast`, contiguous (the vectorised loops, split in parallel) and strided.
        let xs: Vec<f32> = f32_patterns().into_iter().cycle().take(70_000).collect();
        let src = CpuStorage::from_slice(&xs).unwrap_or_else(|e| panic!("{e}"));
        let l = Layout::contiguous([xs.len()]);
        for dt in [DType::Bf16, DType::F16] {
            let fast = cast(&src, &l, dt).unwrap_or_else(|e| panic!("{e}"));
            let back = cast(&fast, &l, DType::F32).unwrap_or_else(|e| panic!("{e}"));
            let back = back.as_slice::<f32>().unwrap_or_else(|e| panic!("{e}"));
            for (i, &x) in xs.iter().enumerate() {
                let want: f32 = if dt == DType::Bf16 {
                    cast_elem(cast_elem::<f32, half::bf16>(x))
                } else {
                    cast_elem(cast_elem::<f32, half::f16>(x))
                };
                assert!(same_bits_or_both_nan(back[i], want), "{dt:?} {x:e}");
            }
        }
    }
}
