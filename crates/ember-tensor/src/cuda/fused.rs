//! The fused kernels of `crate::backend_fused` on CUDA: cross-entropy forward and backward
//! (`kernels/cross_entropy.cu`), mirroring `crate::cpu::cross_entropy`, and batch norm
//! (`kernels/batch_norm.cu`, Note [Split channel reductions]), mirroring
//! `crate::cpu::batch_norm`.

use ember_device::driver::DevicePtr;
use ember_kernels::{KernelArgs, launch_config_1d};

use super::nn::{
    ErrorSlot, bad_target, check_index_dtype, first_bad_on_host, index_at, indexed_name,
    targets_proven,
};
use super::ops::{full, row_config};
use super::{CudaStorage, kernel_name};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::{BnBackward, BnGrads, BnStats, CrossEntropyParams};
use crate::scalar::Scalar;

const CE: &str = "cross_entropy";

/// The dtype the loss is computed in: f64 for f64 scores, f32 for the others.
fn compute_dtype(x: DType) -> Result<DType> {
    match x {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::Bf16 => Ok(DType::F32),
        d => Err(TensorError::unsupported(CE, d)),
    }
}

/// `[N, C, L]` of a contiguous score layout, or an internal error.
fn ncl(lx: &Layout) -> Result<(usize, usize, usize)> {
    match lx.dims() {
        &[n, c, l] if lx.is_contiguous() => Ok((n, c, l)),
        _ => Err(TensorError::invalid(
            CE,
            "expected contiguous [N, C, L] scores (internal error)",
        )),
    }
}

/// The device address and stride of an optional weight (null and 0 without one).
fn weight_arg(weight: Option<(&CudaStorage, &Layout)>) -> (DevicePtr, i64) {
    match weight {
        Some((w, lw)) => (w.ptr_at(lw.offset()), lw.strides()[0] as i64),
        None => (DevicePtr(0), 0),
    }
}

/// The launch of one of the two kernels: a block per row for contiguous rows (`L == 1`,
/// the block size of log_softmax's), a thread per row otherwise.
fn ce_config(rows: usize, len: usize) -> ember_device::driver::LaunchConfig {
    if len == 1 {
        row_config(rows, 1)
    } else {
        launch_config_1d(rows)
    }
}

/// Per row: loss, `w[t]` and `lse` (compute dtype), see `kernels/cross_entropy.cu`.
pub(crate) fn cross_entropy_fwd(
    x: &CudaStorage,
    lx: &Layout,
    t: &CudaStorage,
    lt: &Layout,
    weight: Option<(&CudaStorage, &Layout)>,
    p: &CrossEntropyParams,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let cd = compute_dtype(x.dtype())?;
    check_index_dtype(CE, t)?;
    let (n, c, l) = ncl(lx)?;
    let rows = n * l;
    let ctx = x.ctx();
    if rows == 0 || c == 0 {
        // No classes: every target must be ignore_index; nothing for a kernel to read.
        if rows > 0
            && let Some(cls) = first_bad_on_host(t, lt, |v| v == p.ignore_index)?
        {
            return Err(bad_target(cls, c, p.ignore_index));
        }
        let zeros = || full(ctx, rows, Scalar::Int(0), cd);
        return Ok((zeros()?, zeros()?, zeros()?));
    }
    let loss = CudaStorage::alloc(ctx, cd, rows)?;
    let wout = CudaStorage::alloc(ctx, cd, rows)?;
    let lse = CudaStorage::alloc(ctx, cd, rows)?;
    let (w_ptr, w_s) = weight_arg(weight);
    let err = ErrorSlot::new(x, t, |lo, hi| targets_proven(lo, hi, c, p.ignore_index))?;
    let st = lt.strides();
    let mut args = KernelArgs::new();
    args.push(rows as i64)
        .push(c as i64)
        .push(l as i64)
        .ptr(x.ptr_at(lx.offset()))
        .ptr(t.ptr_at(lt.offset()))
        .push(st[0] as i64)
        .push(st[1] as i64)
        .ptr(w_ptr)
        .push(w_s)
        .push(p.ignore_index)
        .push(p.smoothing)
        .ptr(loss.ptr_at(0))
        .ptr(wout.ptr_at(0))
        .ptr(lse.ptr_at(0))
        .ptr(err.ptr());
    let name = indexed_name("cross_entropy_fwd", x.dtype(), t.dtype());
    // SAFETY: the argument list of `cross_entropy_fwd_{T}_{I}` (kernels/cross_entropy.cu):
    // x is the contiguous [N, C, L] scores, t the [N, L] targets inside their storages
    // (targets are checked before they index x), the weight [C] in the compute dtype or
    // null, `loss`/`wout`/`lse` hold N·L compute-dtype elements, `err` two i64; the block
    // size is a multiple of 32.
    unsafe { ctx.launch(&name, ce_config(rows, l), &mut args)? };
    if let Some(pos) = err.bad_position()? {
        return Err(bad_target(index_at(t, lt, pos)?, c, p.ignore_index));
    }
    Ok((loss, wout, lse))
}

/// Rows up to which [`cross_entropy_mean`] reduces a loss (one block, a strided share of
/// at most 128 rows per thread); longer ones take the whole-tensor reductions.
pub(crate) const CE_MEAN_MAX_ROWS: usize = 1 << 16;

/// Threads of [`cross_entropy_mean`]'s one block.
const CE_MEAN_BLOCK: u32 = 512;

/// The `mean` reduction of a cross-entropy: `(Σ loss / Σ w, Σ w)` over the `rows` per-row
/// losses and target weights of [`cross_entropy_fwd`], as two one-element storages of their
/// (compute) dtype, in one launch (`kernels/cross_entropy.cu`).
pub(crate) fn cross_entropy_mean(
    loss: &CudaStorage,
    w: &CudaStorage,
    rows: usize,
) -> Result<(CudaStorage, CudaStorage)> {
    let cd = loss.dtype();
    if !matches!(cd, DType::F32 | DType::F64) || w.dtype() != cd {
        return Err(TensorError::invalid(
            CE,
            format!(
                "expected f32 or f64 losses and weights of one dtype, found {} and {}",
                cd,
                w.dtype()
            ),
        ));
    }
    if rows == 0 || rows > CE_MEAN_MAX_ROWS || loss.len() < rows || w.len() < rows {
        return Err(TensorError::invalid(
            CE,
            format!(
                "expected 1 to {CE_MEAN_MAX_ROWS} rows within {} losses and {} weights, found {rows}",
                loss.len(),
                w.len()
            ),
        ));
    }
    let ctx = loss.ctx();
    let out = CudaStorage::alloc(ctx, cd, 1)?;
    let total = CudaStorage::alloc(ctx, cd, 1)?;
    let mut args = KernelArgs::new();
    args.push(rows as i64)
        .ptr(loss.ptr_at(0))
        .ptr(w.ptr_at(0))
        .ptr(out.ptr_at(0))
        .ptr(total.ptr_at(0));
    let config = ember_device::driver::LaunchConfig {
        grid: (1, 1, 1),
        block: (CE_MEAN_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list of `cross_entropy_mean_{C}` (kernels/cross_entropy.cu):
    // `loss` and `w` hold at least `rows` elements of C (checked above), `out` and `total`
    // one each; one block, a multiple of 32 threads.
    unsafe { ctx.launch(&kernel_name("cross_entropy_mean", cd), config, &mut args)? };
    Ok((out, total))
}

/// The gradient of the scores (`[N, C, L]`, their dtype).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cross_entropy_bwd(
    x: &CudaStorage,
    lx: &Layout,
    lse: &CudaStorage,
    t: &CudaStorage,
    lt: &Layout,
    weight: Option<(&CudaStorage, &Layout)>,
    wsum: Option<&CudaStorage>,
    (grad, per_row): (&CudaStorage, bool),
    total: Option<&CudaStorage>,
    p: &CrossEntropyParams,
) -> Result<CudaStorage> {
    let cd = compute_dtype(x.dtype())?;
    check_index_dtype(CE, t)?;
    let (n, c, l) = ncl(lx)?;
    let rows = n * l;
    let ctx = x.ctx();
    let dx = CudaStorage::alloc(ctx, x.dtype(), n * c * l)?;
    if dx.is_empty() {
        return Ok(dx);
    }
    let bad = |s: &CudaStorage, len: usize| s.dtype() != cd || s.len() < len;
    if bad(lse, rows)
        || bad(grad, if per_row { rows } else { 1 })
        || total.is_some_and(|s| bad(s, 1))
        || wsum.is_some_and(|s| bad(s, 1))
        || (p.smoothing != 0.0 && weight.is_some() && wsum.is_none())
    {
        return Err(TensorError::invalid(
            CE,
            "backward operands do not match the scores (internal error)",
        ));
    }
    let (w_ptr, w_s) = weight_arg(weight);
    let opt_ptr = |s: Option<&CudaStorage>| s.map_or(DevicePtr(0), |s| s.ptr_at(0));
    let st = lt.strides();
    let mut args = KernelArgs::new();
    args.push(rows as i64)
        .push(c as i64)
        .push(l as i64)
        .ptr(x.ptr_at(lx.offset()))
        .ptr(lse.ptr_at(0))
        .ptr(t.ptr_at(lt.offset()))
        .push(st[0] as i64)
        .push(st[1] as i64)
        .ptr(w_ptr)
        .push(w_s)
        .push(p.ignore_index)
        .push(p.smoothing)
        .ptr(opt_ptr(wsum))
        .ptr(grad.ptr_at(0))
        .push(i64::from(per_row))
        .ptr(opt_ptr(total))
        .ptr(dx.ptr_at(0));
    let name = indexed_name("cross_entropy_bwd", x.dtype(), t.dtype());
    // SAFETY: the argument list of `cross_entropy_bwd_{T}_{I}`: x and dx are contiguous
    // [N, C, L] (dx fresh, N·C·L elements), lse holds N·L and grad N·L (per row) or one
    // compute-dtype value, total and wsum one value or null (wsum given whenever the kernel
    // reads it: smoothing with a weight), targets are range-checked in the kernel before
    // they index anything.
    unsafe { ctx.launch(&name, ce_config(rows, l), &mut args)? };
    Ok(dx)
}

const BN: &str = "batch_norm";

/// `[N, C, S]` of a contiguous batch-norm operand, or an internal error.
fn ncs(lx: &Layout) -> Result<(usize, usize, usize)> {
    match lx.dims() {
        &[n, c, s] if lx.is_contiguous() => Ok((n, c, s)),
        _ => Err(TensorError::invalid(
            BN,
            "expected contiguous [N, C, S] operands (internal error)",
        )),
    }
}

// Note [Split channel reductions]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The per-channel reductions of batch norm (the statistics; the backward's Σdy and Σdy·x̂)
// read all M = N·S elements of each channel. One block per channel leaves most SMs idle when
// C is small beside the SM count: a ResNet's first BatchNorm has 64 channels of 32·112·112
// values on an H100's 132 SMs. So each channel is cut into `splits` consecutive parts of its
// M elements, one block each: enough blocks for `BLOCKS_PER_SM` per SM (four 512-thread
// blocks fill an SM's 2048 threads), but no part under `MIN_PER_BLOCK` elements (four per
// thread), where the partials and the extra launch would cost more than the idle SMs. With
// splits > 1 each block writes its part (Welford's count, mean and M2; or the two sums) to a
// workspace of 3 (or 2) compute-dtype values per part, and a combine kernel (one thread per
// channel) merges a channel's parts in part order, Chan's formula for the statistics: the
// result is deterministic and equals the one-block result to rounding. With splits = 1 (many
// channels, or few elements per channel) the blocks finish their channels themselves, one
// launch as before. The SM count is the device's (`Ctx::sm_count`; the emulator reports its
// configured count, 132 by default, so the split paths run in CI).

/// Threads per block of the per-channel reductions.
const BN_BLOCK: u32 = 512;
/// Blocks per SM the split aims for (512-thread blocks; 2048 threads per SM).
const BLOCKS_PER_SM: usize = 4;
/// The fewest elements of a channel one block takes when channels are split.
const MIN_PER_BLOCK: usize = 4 * BN_BLOCK as usize;

/// How many blocks share each channel's reduction (Note [Split channel reductions]): `c`
/// channels of `m` elements each on `sm_count` SMs.
fn channel_splits(c: usize, m: usize, sm_count: usize) -> usize {
    let want = (sm_count * BLOCKS_PER_SM).div_ceil(c.max(1));
    want.min(m / MIN_PER_BLOCK).max(1)
}

/// One block per work item (a channel, or a part of one) for the per-channel reductions;
/// the kernels grid-stride over further items.
fn channel_config(items: usize) -> ember_device::driver::LaunchConfig {
    ember_device::driver::LaunchConfig {
        grid: (items.clamp(1, 65_535) as u32, 1, 1),
        block: (BN_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The workspace of `splits` parts per channel of `per_part` compute-dtype values each,
/// `None` when channels are not split.
fn partials(
    ctx: &std::sync::Arc<super::Ctx>,
    cd: DType,
    c: usize,
    splits: usize,
    per_part: usize,
) -> Result<Option<CudaStorage>> {
    if splits > 1 {
        Ok(Some(CudaStorage::alloc(ctx, cd, per_part * c * splits)?))
    } else {
        Ok(None)
    }
}

/// A `[C]` vector in the compute dtype, or an internal error.
fn check_vec(v: &CudaStorage, c: usize, cd: DType) -> Result<()> {
    if v.dtype() == cd && v.len() >= c {
        Ok(())
    } else {
        Err(TensorError::invalid(
            BN,
            format!(
                "expected a [{c}] {cd} channel vector, found {} elements of {} (internal error)",
                v.len(),
                v.dtype()
            ),
        ))
    }
}

fn opt_vec(v: Option<&CudaStorage>, c: usize, cd: DType) -> Result<DevicePtr> {
    match v {
        Some(v) => {
            check_vec(v, c, cd)?;
            Ok(v.ptr_at(0))
        }
        None => Ok(DevicePtr(0)),
    }
}

/// Per-channel mean and invstd (and the running statistics' update), see
/// `kernels/batch_norm.cu`.
pub(crate) fn batch_norm_stats(
    x: &CudaStorage,
    lx: &Layout,
    running: Option<(&CudaStorage, &CudaStorage)>,
    momentum: f64,
    eps: f64,
) -> Result<(CudaStorage, CudaStorage)> {
    let cd = compute_dtype(x.dtype())?;
    let (n, c, s) = ncs(lx)?;
    let ctx = x.ctx();
    let mean = CudaStorage::alloc(ctx, cd, c)?;
    let invstd = CudaStorage::alloc(ctx, cd, c)?;
    if c == 0 {
        return Ok((mean, invstd));
    }
    if n * s == 0 {
        return Err(TensorError::invalid(BN, "no elements per channel"));
    }
    let (rm, rv) = match running {
        Some((m, v)) => (opt_vec(Some(m), c, cd)?, opt_vec(Some(v), c, cd)?),
        None => (DevicePtr(0), DevicePtr(0)),
    };
    let splits = channel_splits(c, n * s, ctx.sm_count());
    let partial = partials(ctx, cd, c, splits, 3)?;
    let partial_ptr = partial.as_ref().map_or(DevicePtr(0), |p| p.ptr_at(0));
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(c as i64)
        .push(s as i64)
        .ptr(x.ptr_at(lx.offset()))
        .ptr(mean.ptr_at(0))
        .ptr(invstd.ptr_at(0))
        .ptr(rm)
        .ptr(rv)
        .push(momentum)
        .push(eps)
        .push(splits as i64)
        .ptr(partial_ptr);
    let name = super::kernel_name("batch_norm_stats", x.dtype());
    // SAFETY: the argument list of `batch_norm_stats_{T}` (kernels/batch_norm.cu): x is the
    // contiguous [N, C, S] input (N·S > 0), mean/invstd fresh [C] compute-dtype vectors, the
    // running statistics [C] compute-dtype vectors (checked) or both null; `partial` holds
    // 3·C·splits compute-dtype values when splits > 1 (null, unread, otherwise); 512 threads.
    unsafe { ctx.launch(&name, channel_config(c * splits), &mut args)? };
    if partial.is_some() {
        let mut args = KernelArgs::new();
        args.push(c as i64)
            .push(splits as i64)
            .ptr(partial_ptr)
            .ptr(mean.ptr_at(0))
            .ptr(invstd.ptr_at(0))
            .ptr(rm)
            .ptr(rv)
            .push(momentum)
            .push(eps);
        let name = super::kernel_name("batch_norm_stats_combine", cd);
        // SAFETY: the argument list of `batch_norm_stats_combine_{C}`: `partial` holds the
        // 3·C·splits values the launch above wrote (same stream, so in order), the [C]
        // vectors as above.
        unsafe { ctx.launch(&name, launch_config_1d(c), &mut args)? };
    }
    Ok((mean, invstd))
}

/// The statistics' pointers and flags as the kernels take them.
fn stats_args(
    args: &mut KernelArgs,
    st: &BnStats<'_, CudaStorage>,
    c: usize,
    cd: DType,
) -> Result<()> {
    check_vec(st.mean, c, cd)?;
    check_vec(st.v, c, cd)?;
    args.ptr(st.mean.ptr_at(0))
        .ptr(st.v.ptr_at(0))
        .push(i64::from(st.is_var))
        .push(st.eps);
    Ok(())
}

/// `y = (x - mean)·k·weight + bias`, one elementwise kernel.
pub(crate) fn batch_norm_apply(
    x: &CudaStorage,
    lx: &Layout,
    st: &BnStats<'_, CudaStorage>,
    weight: Option<&CudaStorage>,
    bias: Option<&CudaStorage>,
) -> Result<CudaStorage> {
    let cd = compute_dtype(x.dtype())?;
    let (n, c, s) = ncs(lx)?;
    let ctx = x.ctx();
    let total = n * c * s;
    let y = CudaStorage::alloc(ctx, x.dtype(), total)?;
    if total == 0 {
        return Ok(y);
    }
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(c as i64)
        .push(s as i64)
        .ptr(x.ptr_at(lx.offset()));
    stats_args(&mut args, st, c, cd)?;
    args.ptr(opt_vec(weight, c, cd)?)
        .ptr(opt_vec(bias, c, cd)?)
        .ptr(y.ptr_at(0));
    let name = super::kernel_name("batch_norm_apply", x.dtype());
    // SAFETY: the argument list of `batch_norm_apply_{T}`: x and y contiguous [N, C, S] (y
    // fresh), every channel vector [C] of the compute dtype (checked) or null.
    unsafe { ctx.launch(&name, bn_elementwise_config(total, s, x.dtype()), &mut args)? };
    Ok(y)
}

/// The launch of the elementwise batch-norm kernels over `total` elements of `dtype` in rows
/// of `s`: a thread per 16-byte group where rows hold whole groups (Note [Grouped channel
/// walks] in `kernels/batch_norm.cu`; the kernel itself checks the alignment and falls back
/// to elements), a thread per element otherwise. Any grid is correct.
fn bn_elementwise_config(
    total: usize,
    s: usize,
    dtype: DType,
) -> ember_device::driver::LaunchConfig {
    let group = 16 / dtype.size_in_bytes().max(1);
    launch_config_1d(if s.is_multiple_of(group) {
        total / group
    } else {
        total
    })
}

/// The backward: the per-channel sums (one reduction kernel) and the input gradient (one
/// elementwise kernel), as `b` asks.
pub(crate) fn batch_norm_backward(
    dy: &CudaStorage,
    x: &CudaStorage,
    lx: &Layout,
    st: &BnStats<'_, CudaStorage>,
    weight: Option<&CudaStorage>,
    b: &BnBackward,
) -> Result<BnGrads<CudaStorage>> {
    let cd = compute_dtype(x.dtype())?;
    let (n, c, s) = ncs(lx)?;
    let ctx = x.ctx();
    let total = n * c * s;
    if dy.dtype() != x.dtype() || dy.len() < total {
        return Err(TensorError::invalid(
            BN,
            "the gradient does not match the input (internal error)",
        ));
    }
    let sums = if (b.training || b.sums) && c > 0 {
        let sd = CudaStorage::alloc(ctx, cd, c)?;
        let sdx = CudaStorage::alloc(ctx, cd, c)?;
        if n * s == 0 {
            return Err(TensorError::invalid(BN, "no elements per channel"));
        }
        let splits = channel_splits(c, n * s, ctx.sm_count());
        let partial = partials(ctx, cd, c, splits, 2)?;
        let partial_ptr = partial.as_ref().map_or(DevicePtr(0), |p| p.ptr_at(0));
        let mut args = KernelArgs::new();
        args.push(n as i64)
            .push(c as i64)
            .push(s as i64)
            .ptr(dy.ptr_at(0))
            .ptr(x.ptr_at(lx.offset()));
        stats_args(&mut args, st, c, cd)?;
        args.ptr(sd.ptr_at(0))
            .ptr(sdx.ptr_at(0))
            .push(splits as i64)
            .ptr(partial_ptr);
        let name = super::kernel_name("batch_norm_bwd_reduce", x.dtype());
        // SAFETY: the argument list of `batch_norm_bwd_reduce_{T}`: dy and x contiguous
        // [N, C, S] (N·S > 0), mean and v [C] (checked), sd and sdx fresh [C], `partial`
        // 2·C·splits compute-dtype values when splits > 1 (null, unread, otherwise); 512
        // threads.
        unsafe { ctx.launch(&name, channel_config(c * splits), &mut args)? };
        if partial.is_some() {
            let mut args = KernelArgs::new();
            args.push(c as i64)
                .push(splits as i64)
                .ptr(partial_ptr)
                .ptr(sd.ptr_at(0))
                .ptr(sdx.ptr_at(0));
            let name = super::kernel_name("batch_norm_bwd_combine", cd);
            // SAFETY: the argument list of `batch_norm_bwd_combine_{C}`: `partial` holds the
            // 2·C·splits values written above (same stream), sd and sdx [C].
            unsafe { ctx.launch(&name, launch_config_1d(c), &mut args)? };
        }
        Some((sd, sdx))
    } else {
        None
    };
    let dx = if b.need_input {
        let dx = CudaStorage::alloc(ctx, x.dtype(), total)?;
        if total > 0 {
            let (sd, sdx) = match &sums {
                Some((a, b)) => (a.ptr_at(0), b.ptr_at(0)),
                None => (DevicePtr(0), DevicePtr(0)),
            };
            let mut args = KernelArgs::new();
            args.push(n as i64)
                .push(c as i64)
                .push(s as i64)
                .ptr(dy.ptr_at(0))
                .ptr(x.ptr_at(lx.offset()));
            stats_args(&mut args, st, c, cd)?;
            args.ptr(opt_vec(weight, c, cd)?)
                .ptr(sd)
                .ptr(sdx)
                .push(i64::from(b.training && sums.is_some()))
                .ptr(dx.ptr_at(0));
            let name = super::kernel_name("batch_norm_bwd_elem", x.dtype());
            // SAFETY: the argument list of `batch_norm_bwd_elem_{T}`: dy, x and dx (fresh)
            // contiguous [N, C, S], the channel vectors [C] (checked) or null; the sums are
            // read only in training mode, where they were computed above.
            unsafe { ctx.launch(&name, bn_elementwise_config(total, s, x.dtype()), &mut args)? };
        }
        Some(dx)
    } else {
        None
    };
    Ok((dx, sums))
}

#[cfg(test)]
mod tests {
    use super::{MIN_PER_BLOCK, channel_splits};

    #[test]
    fn channels_are_split_only_when_few_and_long() {
        // ResNet-18's first BatchNorm on an H100: 64 channels of 32·112·112 values.
        assert_eq!(channel_splits(64, 32 * 112 * 112, 132), 9);
        // Enough channels to give every SM four blocks: one block per channel.
        assert_eq!(channel_splits(528, 1 << 20, 132), 1);
        assert_eq!(channel_splits(1024, 1 << 20, 132), 1);
        // Short channels are never cut below MIN_PER_BLOCK elements a part.
        assert_eq!(channel_splits(2, 3 * MIN_PER_BLOCK - 1, 132), 2);
        assert_eq!(channel_splits(2, MIN_PER_BLOCK - 1, 132), 1);
        assert_eq!(channel_splits(1, 0, 132), 1);
        // One SM, one channel: four blocks.
        assert_eq!(channel_splits(1, 1 << 20, 1), 4);
    }
}
