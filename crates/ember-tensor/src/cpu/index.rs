//! CPU kernels of the indexing family: `index_select`, `gather`, `scatter_add`. Indices
//! are validated here, in the kernel (as a CUDA kernel would flag them), and an
//! out-of-range index is an error naming it.

use crate::cpu::dispatch;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::CpuStorage;
use crate::strided::StridedIndex;

/// The indices (i64 or i32 storage) in the layout's order, each checked against `size`.
fn read_indices(
    op: &'static str,
    idx: &CpuStorage,
    il: &Layout,
    dim: usize,
    size: usize,
) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(il.numel());
    for_each_index(op, idx, il, |v| {
        out.push(checked_index(op, v, dim, size)?);
        Ok(())
    })?;
    Ok(out)
}

/// `v` as a position along `dim` of `size`, or the error naming it.
fn checked_index(op: &'static str, v: i64, dim: usize, size: usize) -> Result<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&u| u < size)
        .ok_or(TensorError::IndexOutOfRange {
            op,
            index: v,
            dim,
            size,
        })
}

/// Calls `f` with each index of `idx` (i64 or i32) in `il`'s order, stopping at its first
/// error. Positions outside the storage read as -1 (never a valid index).
fn for_each_index(
    op: &'static str,
    idx: &CpuStorage,
    il: &Layout,
    mut f: impl FnMut(i64) -> Result<()>,
) -> Result<()> {
    match idx.dtype() {
        DType::I64 => {
            let d = idx.as_slice::<i64>()?;
            il.strided_index()
                .try_for_each(|i| f(d.get(i).copied().unwrap_or(-1)))
        }
        DType::I32 => {
            let d = idx.as_slice::<i32>()?;
            il.strided_index()
                .try_for_each(|i| f(d.get(i).map_or(-1, |&v| v as i64)))
        }
        found => Err(TensorError::IndexDType { op, found }),
    }
}

/// `src` with `dim` replaced by the rows picked by the 1-D `idx`.
pub(crate) fn index_select(
    src: &CpuStorage,
    l: &Layout,
    dim: usize,
    idx: &CpuStorage,
    il: &Layout,
) -> Result<CpuStorage> {
    let size = l.dims()[dim];
    let picks = read_indices("index_select", idx, il, dim, size)?;
    let mut dims = l.dims().to_vec();
    dims[dim] = picks.len();
    let mut strides = l.strides().to_vec();
    let sd = strides[dim];
    strides[dim] = 0;
    let virt = Layout::new(dims.clone().into(), strides, l.offset());
    let inner: usize = dims[dim + 1..].iter().product();
    let n = virt.numel();
    let picks = &picks;
    dispatch!(src.dtype(), T => {
        let data = src.as_slice::<T>()?;
        CpuStorage::from_chunks(n, |r| {
            let start = r.start;
            StridedIndex::from_position(&virt, start)
                .take(r.len())
                .enumerate()
                .map(move |(j, base)| {
                    let pos = ((start + j) / inner.max(1)) % picks.len().max(1);
                    let row = picks.get(pos).copied().unwrap_or(0);
                    data.get(base + row * sd).copied().unwrap_or(<T as WithDType>::ZERO)
                })
        })
    })
}

/// `out[.., i, ..] = src[.., idx[.., i, ..], ..]` along `dim`; `out` has `idx`'s shape.
pub(crate) fn gather(
    src: &CpuStorage,
    l: &Layout,
    dim: usize,
    idx: &CpuStorage,
    il: &Layout,
) -> Result<CpuStorage> {
    let picks = read_indices("gather", idx, il, dim, l.dims()[dim])?;
    let mut strides = l.strides().to_vec();
    let sd = strides[dim];
    strides[dim] = 0;
    let virt = Layout::new(il.shape().clone(), strides, l.offset());
    dispatch!(src.dtype(), T => {
        let data = src.as_slice::<T>()?;
        let out: Vec<T> = virt
            .strided_index()
            .zip(&picks)
            .map(|(base, &p)| data.get(base + p * sd).copied().unwrap_or(<T as WithDType>::ZERO))
            .collect();
        CpuStorage::from_slice(&out)
    })
}

/// A contiguous copy of `dst` with `src` values added at `idx` along `dim`
/// (`out[.., idx[.., i, ..], ..] += src[.., i, ..]`); `src_l` is `src` narrowed to `idx`'s
/// shape.
pub(crate) fn scatter_add(
    dst: &CpuStorage,
    dl: &Layout,
    dim: usize,
    idx: &CpuStorage,
    il: &Layout,
    src: &CpuStorage,
    sl: &Layout,
) -> Result<CpuStorage> {
    // Every index is checked first (the first bad one, in order, is the error); then they
    // are read where they lie, with no copy.
    let size = dl.dims()[dim];
    for_each_index("scatter_add", idx, il, |v| {
        checked_index("scatter_add", v, dim, size).map(drop)
    })?;
    let out_strides = dl.shape().contiguous_strides();
    let mut vstrides = out_strides.clone();
    let sd = vstrides[dim];
    vstrides[dim] = 0;
    dispatch!(dst.dtype(), T => {
        // A contiguous copy of `dst` from the caching allocator, added to in place.
        let mut out = crate::cpu::cast(dst, dl, dst.dtype())?;
        let s = src.as_slice::<T>()?;
        let o = out.as_mut_slice::<T>()?;
        // Rows of dim 0 (when the scatter is along another dim) add into disjoint slabs of
        // `out`: one task per row.
        let rows = if dim > 0 { il.dims()[0] } else { 1 };
        let slab = if dim > 0 { out_strides[0] } else { o.len() };
        let row_of = |l: &Layout, r: usize| -> Layout {
            if dim == 0 {
                return l.clone();
            }
            let mut dims = l.dims().to_vec();
            dims[0] = 1;
            Layout::new(dims.into(), l.strides().to_vec(), l.offset() + r * l.strides()[0])
        };
        let mut vdims = il.dims().to_vec();
        if dim > 0 {
            vdims[0] = 1;
        }
        let virt = Layout::new(vdims.into(), vstrides, 0);
        let add = |r: usize, out: &mut [T]| -> Result<()> {
            let (ir, sr) = (row_of(il, r), row_of(sl, r));
            let mut srcs = sr.strided_index();
            let mut outs = virt.strided_index();
            for_each_index("scatter_add", idx, &ir, |p| {
                let (Some(o), Some(si)) = (outs.next(), srcs.next()) else {
                    return Ok(());
                };
                if let (Some(slot), Some(&v)) = (out.get_mut(o + p as usize * sd), s.get(si)) {
                    *slot = if T::DTYPE.is_float() {
                        T::from_f64(slot.to_f64() + v.to_f64())
                    } else {
                        T::from_i64(slot.to_i64().wrapping_add(v.to_i64()))
                    };
                }
                Ok(())
            })
        };
        let n = o.len();
        let used = &mut o[..(rows * slab).min(n)];
        if slab > 0 && rows > 1 && il.numel() >= crate::storage::PAR_THRESHOLD {
            ember_gemm::parallel::try_for_each_chunk_mut(used, slab, add)?;
        } else if slab > 0 {
            for (r, out) in used.chunks_mut(slab).enumerate() {
                add(r, out)?;
            }
        }
        Ok(out)
    })
}
