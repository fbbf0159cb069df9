//! Reductions on CUDA (`kernels/reduce.cu`): the `[outer, size, inner]` form of any
//! reduction, the split of long rows with few outputs, and the two-pass whole reduction
//! (Note [Split whole reductions]). Mirrors `crate::cpu::reduce`.

use ember_kernels::KernelArgs;

use super::CudaStorage;
use super::ops::{ROW_BLOCK, cast, full, row_config};
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::Layout;
use crate::op::ReduceOp;
use crate::scalar::Scalar;

/// `[outer, size, inner]` of a contiguous layout whose `dims` (sorted) are consecutive, or
/// `None`.
fn row_split(l: &Layout, dims: &[usize]) -> Option<(usize, usize, usize)> {
    if !l.is_contiguous() {
        return None;
    }
    let (&first, &last) = (dims.first()?, dims.last()?);
    if last - first + 1 != dims.len() {
        return None;
    }
    let d = l.dims();
    Some((
        d[..first].iter().product(),
        d[first..=last].iter().product(),
        d[last + 1..].iter().product(),
    ))
}

/// A contiguous copy of `l` with `dims` (sorted) moved last, and its `[outer, size, 1]`.
fn rows_last(s: &CudaStorage, l: &Layout, dims: &[usize]) -> Result<(CudaStorage, usize, usize)> {
    let mut perm: Vec<usize> = (0..l.rank()).filter(|d| !dims.contains(d)).collect();
    let outer = perm.iter().map(|&d| l.dims()[d]).product();
    let size = dims.iter().map(|&d| l.dims()[d]).product();
    perm.extend_from_slice(dims);
    let p = l.permute(&perm)?;
    Ok((cast(s, &p, s.dtype())?, outer, size))
}

/// Reduces `dims` (sorted, unique) of `l`; the output is the kept dims, row-major.
/// Dtypes as the CPU's: sum/prod of integers and bool in i64, max/min keep the dtype,
/// argmax/argmin are i64.
pub(crate) fn reduce(
    op: ReduceOp,
    s: &CudaStorage,
    l: &Layout,
    dims: &[usize],
) -> Result<CudaStorage> {
    let dt = s.dtype();
    let extreme = matches!(
        op,
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
    );
    let n_red: usize = dims.iter().map(|&d| l.dims()[d]).product();
    if extreme && n_red == 0 {
        return Err(crate::cpu::reduce::empty_extreme(op));
    }
    let out_dtype = match op {
        ReduceOp::Sum | ReduceOp::Prod if !dt.is_float() => DType::I64,
        ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
        _ => dt,
    };
    let n_out: usize = (0..l.rank())
        .filter(|d| !dims.contains(d))
        .map(|d| l.dims()[d])
        .product();
    if n_red == 0 {
        // Nothing to read (an empty storage has no device address to hand a kernel): the
        // identity of sum and prod.
        let one = Scalar::Int(i64::from(op == ReduceOp::Prod));
        return full(s.ctx(), n_out, one, out_dtype);
    }
    let out = CudaStorage::alloc(s.ctx(), out_dtype, n_out)?;
    if n_out == 0 {
        return Ok(out);
    }
    let (tmp, src, offset, (outer, size, inner));
    if dims.is_empty() {
        (outer, size, inner) = (n_out, 1, 1);
        tmp = cast(s, l, dt)?;
        (src, offset) = (&tmp, 0);
    } else if let Some(split) = row_split(l, dims) {
        (outer, size, inner) = split;
        (src, offset) = (s, l.offset());
    } else {
        let (t, o, z) = rows_last(s, l, dims)?;
        tmp = t;
        (outer, size, inner) = (o, z, 1);
        (src, offset) = (&tmp, 0);
    }
    if outer * inner == 1
        && let Some(parts) = whole_parts(size, s.ctx().sm_count())
    {
        reduce_whole(op, (src, offset), &out, size, parts)?;
        return Ok(out);
    }
    // Few outputs over long rows would run on a few blocks: split each row into `c` chunks
    // reduced in parallel, then reduce the partials.
    let splittable = matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min)
        && !matches!(dt, DType::F16 | DType::Bf16)
        && !(op == ReduceOp::Sum && matches!(dt, DType::I32 | DType::U8 | DType::Bool));
    if let Some(c) = split_factor(outer * inner, size).filter(|_| splittable) {
        let partial = CudaStorage::alloc(s.ctx(), out_dtype, outer * c * inner)?;
        reduce_launch(op, (src, offset), &partial, (outer * c, size / c, inner))?;
        reduce_launch(op, (&partial, 0), &out, (outer, c, inner))?;
        return Ok(out);
    }
    reduce_launch(op, (src, offset), &out, (outer, size, inner))?;
    Ok(out)
}

// Note [Split whole reductions]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A reduction to one value ([1, size, 1]: `sum_all`, `max_all`, `argmax` of a vector) would
// run on one block, one SM of the device's. Past WHOLE_PER_BLOCK * 2 elements it runs in two
// passes instead (kernels/reduce.cu): `reduce_part_{op}_{dtype}` on `parts` blocks (at most
// WHOLE_BLOCKS_PER_SM per SM, each with at least WHOLE_PER_BLOCK elements), each folding its
// block-tiled share of the row into one accumulator (f32 for f32/f16/bf16 sums and products,
// f64, i64, or a value with its index for max/min and the arg forms), then
// `reduce_combine_{op}_{dtype}` on one block folding the partials and rounding once into
// the output. Every op and dtype splits: the partials are accumulators, not outputs, so f16
// sums are not rounded twice, and the arg forms keep global indices. Max, min and the arg
// forms fold by an order on (NaN first, value, lower index), which is associative and
// commutative, so the answer is the CPU's whatever the split: the first NaN, else the first
// index of the extreme value. Sums and products change only their rounding order (the
// partial sums make f32 sums of long rows more accurate than one running sum).

/// Elements a block of a split whole reduction takes at least.
const WHOLE_PER_BLOCK: usize = 8192;
/// Blocks per SM of the first pass of a split whole reduction, at most.
const WHOLE_BLOCKS_PER_SM: usize = 4;
/// Bytes per partial: the largest accumulator (a value and an i64 index).
const WHOLE_PARTIAL_BYTES: usize = 16;

/// The number of blocks a whole reduction of `size` elements is split over on `sm_count`
/// SMs, or `None` for one block (Note [Split whole reductions]).
fn whole_parts(size: usize, sm_count: usize) -> Option<usize> {
    let parts = (size / WHOLE_PER_BLOCK).min(sm_count.max(1) * WHOLE_BLOCKS_PER_SM);
    (parts >= 2).then_some(parts)
}

/// The two launches of a split whole reduction of the `size` contiguous elements of `src` at
/// `offset` into `out[0]`.
fn reduce_whole(
    op: ReduceOp,
    (src, offset): (&CudaStorage, usize),
    out: &CudaStorage,
    size: usize,
    parts: usize,
) -> Result<()> {
    let ctx = src.ctx();
    let partials = CudaStorage::alloc(
        ctx,
        DType::I64,
        parts * WHOLE_PARTIAL_BYTES / DType::I64.size_in_bytes(),
    )?;
    let dt = src.dtype().short_name();
    let mut args = KernelArgs::new();
    args.push(size as i64)
        .ptr(src.ptr_at(offset))
        .ptr(partials.ptr_at(0));
    let config = ember_device::driver::LaunchConfig {
        grid: (parts as u32, 1, 1),
        block: (ROW_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `reduce_part_{op}_{dtype}(i64 size, const T* in, A* partials)`; `in` holds the
    // `size` contiguous elements at `offset`, `partials` one accumulator (at most 16 bytes,
    // 8-byte aligned) per block of the grid; blockDim is a multiple of 32.
    unsafe {
        ctx.launch(
            &format!("reduce_part_{}_{dt}", op.name()),
            config,
            &mut args,
        )?
    };
    let mut args = KernelArgs::new();
    args.push(parts as i64)
        .ptr(partials.ptr_at(0))
        .ptr(out.ptr_at(0));
    // SAFETY: `reduce_combine_{op}_{dtype}(i64 parts, const A* partials, O* out)`; the first
    // pass wrote `parts` accumulators of the same op and dtype; `out` holds one element of
    // the output dtype; blockDim is a multiple of 32.
    unsafe {
        ctx.launch(
            &format!("reduce_combine_{}_{dt}", op.name()),
            row_config(1, 1),
            &mut args,
        )
    }
}

/// Rows of at least this many elements are split when there are few outputs.
const SPLIT_ROWS_FROM: usize = 8192;
/// The least elements per chunk of a split row (one block's worth of work).
const SPLIT_CHUNK_MIN: usize = 2048;

/// The number of chunks to split rows of `size` into when only `outputs` rows would run in
/// parallel: the largest divisor of `size` that leaves chunks of at least
/// [`SPLIT_CHUNK_MIN`] elements, at most 1024, or `None`.
fn split_factor(outputs: usize, size: usize) -> Option<usize> {
    if outputs > 64 || size < SPLIT_ROWS_FROM {
        return None;
    }
    let most = (size / SPLIT_CHUNK_MIN).min(1024);
    (2..=most).rev().find(|&c| size.is_multiple_of(c))
}

/// One `reduce_{op}_{dtype}` launch over the contiguous `[outer, size, inner]` block of
/// `src` at `offset` into `out` (`outer * inner` elements). Sums of 8/32-bit integers are
/// not split (their partials are i64, another dtype), so `src`'s dtype names the kernel.
fn reduce_launch(
    op: ReduceOp,
    (src, offset): (&CudaStorage, usize),
    out: &CudaStorage,
    (outer, size, inner): (usize, usize, usize),
) -> Result<()> {
    let mut args = KernelArgs::new();
    args.push(outer as i64)
        .push(size as i64)
        .push(inner as i64)
        .ptr(src.ptr_at(offset))
        .ptr(out.ptr_at(0));
    let name = format!("reduce_{}_{}", op.name(), src.dtype().short_name());
    // SAFETY: `reduce_{op}_{dtype}(i64 outer, i64 size, i64 inner, const T* in, O* out)`;
    // `in` holds the contiguous `[outer, size, inner]` block at `offset`, `out` holds
    // `outer * inner` elements of the output dtype; blockDim is a multiple of 32.
    unsafe { src.ctx().launch(&name, row_config(outer, inner), &mut args) }
}
