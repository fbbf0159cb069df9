//! The CUDA kernels of the indexing and neural-network families (`kernels/index.cu`,
//! `loss.cu`, `pool.cu`, `conv.cu`), mirroring `crate::cpu::{index, loss, pool, conv}`.
//!
//! Index checks happen in the kernels: each launch gets a two-`i64` error slot (Note [Index
//! error slot]) that the host reads back afterwards, so a bad index is the same error value
//! the CPU backend returns, naming the same (first, row-major) bad index — unless the index
//! tensor's known range proves every index valid (Note [Known index ranges]).

use ember_device::driver::{DevicePtr, GemmDesc};
use ember_kernels::{KernelArgs, StridedLayout, launch_config_1d};

use super::ops::{allow_tf32, cast, full, gemm_type};
use super::{CudaStorage, kernel_name, strided};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::{AvgDivisor, Conv2dParams, Pool2dParams};
use crate::scalar::Scalar;

// Note [Index error slot]:
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A kernel cannot return an error, so the indexing and loss kernels take `i64* err`, two
// values a fill kernel sets to i64::MAX (enqueued like any kernel: an upload from pageable
// host memory would wait for the stream): a thread that meets an index outside its range
// lowers err[0] to its row-major position (atomicMin). After the launch the host copies the
// slot back (which also waits for the kernel); err[0] < i64::MAX means some index was bad,
// and the index at that position is the first bad one in row-major order — the one the CPU
// backend names. The kernels' output is then discarded. The copy back costs one
// synchronisation per indexing op, which Note [Known index ranges] avoids when it can.

// Note [Known index ranges]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The read-back of Note [Index error slot] makes the host wait for the device once per
// indexing op: one training step with cross-entropy stops queueing work until its forward
// has run, which costs more than the loss kernel itself on a fast GPU. Most index tensors'
// values are known to the host without reading them back, so a CUDA i64/i32 storage carries
// `[min, max]` of its elements when
//   - it was uploaded from host memory (`to(device)`, `Tensor::new`/`from_vec` on a CUDA
//     device, pinned non-blocking copies): the upload scans the host copy, up to
//     `RANGE_SCAN_LIMIT` elements — the DataLoader's labels and token ids;
//   - `randint(low, high)` made it: `[low, high - 1]` by construction;
//   - it holds `max_pool2d`'s indices: `[0, H·W - 1]`, positions inside an input plane.
// Every in-place write takes the cell's write lock (Note [Storage sharing]), which forgets
// the range, and fresh storages start without one, so a range is never stale; a view's
// elements are some of its storage's, so the storage's range bounds every view. When the
// range proves every index valid, the kernel gets an unfilled scratch slot it never writes,
// and nothing is read back (`ErrorSlot::Proven`); otherwise the slot is filled and checked
// as before, so a bad index is still the CPU's error, at the same call. (A non-blocking
// upload scans the pinned source when it is enqueued: writing that memory before the copy
// runs is a race in PyTorch too, and here could let a bad index pass unreported — the
// kernels still test every index before using it, so nothing is read or written out of
// bounds.) PyTorch instead checks on the device with an assert that poisons the context.

/// An indexing kernel's error slot: checked (Note [Index error slot]) or, when the indices'
/// known range proves them valid, a scratch slot nothing writes (Note [Known index ranges]).
pub(super) enum ErrorSlot {
    /// Filled with `i64::MAX` before the launch and read back after it.
    Checked(CudaStorage),
    /// Never filled nor read: no index can be bad.
    Proven(CudaStorage),
}

impl ErrorSlot {
    /// A slot on `s`'s device for a kernel reading `idx`, proven when `idx`'s known range
    /// `[lo, hi]` satisfies `proves(lo, hi)`.
    pub(super) fn new(
        s: &CudaStorage,
        idx: &CudaStorage,
        proves: impl Fn(i64, i64) -> bool,
    ) -> Result<ErrorSlot> {
        Ok(match idx.known_range() {
            Some((lo, hi)) if proves(lo, hi) => {
                ErrorSlot::Proven(CudaStorage::alloc(s.ctx(), DType::I64, 2)?)
            }
            _ => ErrorSlot::Checked(full(s.ctx(), 2, Scalar::Int(i64::MAX), DType::I64)?),
        })
    }

    /// A slot for indices that must lie in `[0, size)`.
    fn for_indices(s: &CudaStorage, idx: &CudaStorage, size: usize) -> Result<ErrorSlot> {
        ErrorSlot::new(s, idx, |lo, hi| lo >= 0 && (hi as u64) < size as u64)
    }

    /// The slot's device address, for the kernel's `i64* err`.
    pub(super) fn ptr(&self) -> DevicePtr {
        match self {
            ErrorSlot::Checked(s) | ErrorSlot::Proven(s) => s.ptr_at(0),
        }
    }

    /// The first bad position the kernel recorded, if any (waits for the kernel when the
    /// slot is checked; `None` at once when proven).
    pub(super) fn bad_position(&self) -> Result<Option<usize>> {
        let ErrorSlot::Checked(slot) = self else {
            return Ok(None);
        };
        let host = slot.download()?;
        let pos = host.as_slice::<i64>()?.first().copied().unwrap_or(i64::MAX);
        Ok((pos != i64::MAX).then_some(pos as usize))
    }
}

/// Whether targets in `[lo, hi]` are all classes of `[0, classes)` or `ignore_index`.
pub(super) fn targets_proven(lo: i64, hi: i64, classes: usize, ignore_index: i64) -> bool {
    (lo >= 0 && (hi as u64) < classes as u64) || (lo == hi && lo == ignore_index)
}

/// After an indexing kernel: the CPU's error for the first bad index it recorded, if any.
fn check_slot(
    op: &'static str,
    err: &ErrorSlot,
    (idx, il): (&CudaStorage, &Layout),
    dim: usize,
    size: usize,
) -> Result<()> {
    match err.bad_position()? {
        Some(pos) => Err(TensorError::IndexOutOfRange {
            op,
            index: index_at(idx, il, pos)?,
            dim,
            size,
        }),
        None => Ok(()),
    }
}

/// The index value at row-major position `pos` of `il` over `idx` (i64 or i32).
pub(super) fn index_at(idx: &CudaStorage, il: &Layout, pos: usize) -> Result<i64> {
    let host = idx.download()?;
    let at = il.strided_index().nth(pos).unwrap_or(0);
    Ok(match idx.dtype() {
        DType::I32 => host
            .as_slice::<i32>()?
            .get(at)
            .map_or(-1, |&v| i64::from(v)),
        _ => host.as_slice::<i64>()?.get(at).copied().unwrap_or(-1),
    })
}

/// The first index of `il` (row-major) that `ok` rejects, checked on the host: for inputs
/// with no elements, which have no device address to hand a kernel.
pub(super) fn first_bad_on_host(
    idx: &CudaStorage,
    il: &Layout,
    ok: impl Fn(i64) -> bool,
) -> Result<Option<i64>> {
    let host = idx.download()?;
    let values: Vec<i64> = match idx.dtype() {
        DType::I32 => {
            let d = host.as_slice::<i32>()?;
            il.strided_index()
                .map(|i| d.get(i).map_or(-1, |&v| i64::from(v)))
                .collect()
        }
        _ => {
            let d = host.as_slice::<i64>()?;
            il.strided_index()
                .map(|i| d.get(i).copied().unwrap_or(-1))
                .collect()
        }
    };
    Ok(values.into_iter().find(|&v| !ok(v)))
}

/// For an empty indexed tensor (size 0 along `dim` or elsewhere): every index must be in
/// `[0, size)`, checked on the host, as there is nothing for a kernel to read.
fn check_on_host(
    op: &'static str,
    idx: &CudaStorage,
    il: &Layout,
    dim: usize,
    size: usize,
) -> Result<()> {
    match first_bad_on_host(idx, il, |v| v >= 0 && (v as u64) < size as u64)? {
        Some(index) => Err(TensorError::IndexOutOfRange {
            op,
            index,
            dim,
            size,
        }),
        None => Ok(()),
    }
}

pub(super) fn check_index_dtype(op: &'static str, idx: &CudaStorage) -> Result<()> {
    match idx.dtype() {
        DType::I64 | DType::I32 => Ok(()),
        found => Err(TensorError::IndexDType { op, found }),
    }
}

/// `{family}_{T}_{I}`.
pub(super) fn indexed_name(family: &str, dtype: DType, idx: DType) -> String {
    format!("{family}_{}_{}", dtype.short_name(), idx.short_name())
}

/// `dims` with `strides`, as a kernel operand (`strides` may hold zeros).
fn operand(op: &'static str, dims: &[usize], strides: &[usize]) -> Result<StridedLayout> {
    strided(op, &Layout::new(dims.to_vec().into(), strides.to_vec(), 0))
}

/// `src` with `dim` replaced by the rows picked by the 1-D (or 0-D) `idx`.
pub(crate) fn index_select(
    src: &CudaStorage,
    l: &Layout,
    dim: usize,
    idx: &CudaStorage,
    il: &Layout,
) -> Result<CudaStorage> {
    const OP: &str = "index_select";
    check_index_dtype(OP, idx)?;
    let count = il.numel();
    let size = l.dims()[dim];
    let mut dims = l.dims().to_vec();
    dims[dim] = count;
    let n: usize = dims.iter().product();
    let out = CudaStorage::alloc(src.ctx(), src.dtype(), n)?;
    if count == 0 {
        return Ok(out);
    }
    if src.is_empty() {
        check_on_host(OP, idx, il, dim, size)?;
        return Ok(out);
    }
    let mut strides = l.strides().to_vec();
    let src_dim_stride = strides[dim];
    strides[dim] = 0;
    let inner: usize = dims[dim + 1..].iter().product();
    let idx_stride = il.strides().first().copied().unwrap_or(0);
    let err = ErrorSlot::for_indices(src, idx, size)?;
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(inner as i64)
        .push(count as i64)
        .push(size as i64)
        .push(operand(OP, &dims, &strides)?)
        .push(src_dim_stride as i64)
        .ptr(src.ptr_at(l.offset()))
        .ptr(idx.ptr_at(il.offset()))
        .push(idx_stride as i64)
        .ptr(out.ptr_at(0))
        .ptr(err.ptr());
    let name = indexed_name(OP, src.dtype(), idx.dtype());
    // SAFETY: the argument list of `index_select_{T}_{I}` (kernels/index.cu); `src` and
    // `idx` are read inside their layouts (indices are checked before use), `out` holds `n`
    // elements, `err` two i64.
    unsafe {
        src.ctx()
            .launch(&name, launch_config_1d(n.max(count)), &mut args)?
    };
    check_slot(OP, &err, (idx, il), dim, size)?;
    Ok(out)
}

/// `out[.., i, ..] = src[.., idx[.., i, ..], ..]` along `dim`; `out` has `idx`'s shape.
pub(crate) fn gather(
    src: &CudaStorage,
    l: &Layout,
    dim: usize,
    idx: &CudaStorage,
    il: &Layout,
) -> Result<CudaStorage> {
    const OP: &str = "gather";
    check_index_dtype(OP, idx)?;
    let n = il.numel();
    let size = l.dims()[dim];
    let out = CudaStorage::alloc(src.ctx(), src.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    if src.is_empty() {
        check_on_host(OP, idx, il, dim, size)?;
        return Ok(out);
    }
    let mut strides = l.strides().to_vec();
    let src_dim_stride = strides[dim];
    strides[dim] = 0;
    let err = ErrorSlot::for_indices(src, idx, size)?;
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(size as i64)
        .push(operand(OP, il.dims(), &strides)?)
        .push(src_dim_stride as i64)
        .ptr(src.ptr_at(l.offset()))
        .push(strided(OP, il)?)
        .ptr(idx.ptr_at(il.offset()))
        .ptr(out.ptr_at(0))
        .ptr(err.ptr());
    let name = indexed_name(OP, src.dtype(), idx.dtype());
    // SAFETY: the argument list of `gather_{T}_{I}`; src's view over idx's shape (its dim
    // stride zeroed, added back per checked index) and idx's layout stay inside their
    // storages; `out` holds `n`, `err` two i64.
    unsafe { src.ctx().launch(&name, launch_config_1d(n), &mut args)? };
    check_slot(OP, &err, (idx, il), dim, size)?;
    Ok(out)
}

/// A contiguous copy of `dst` with `src` added at `idx` along `dim`; `sl` is `src` narrowed
/// to `idx`'s shape.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_add(
    dst: &CudaStorage,
    dl: &Layout,
    dim: usize,
    idx: &CudaStorage,
    il: &Layout,
    src: &CudaStorage,
    sl: &Layout,
) -> Result<CudaStorage> {
    const OP: &str = "scatter_add";
    check_index_dtype(OP, idx)?;
    let out = cast(dst, dl, dst.dtype())?;
    let n = il.numel();
    if n == 0 {
        return Ok(out);
    }
    let size = dl.dims()[dim];
    if out.is_empty() || src.is_empty() {
        check_on_host(OP, idx, il, dim, size)?;
        return Ok(out);
    }
    let mut out_strides = dl.shape().contiguous_strides();
    let out_dim_stride = out_strides[dim];
    out_strides[dim] = 0;
    let err = ErrorSlot::for_indices(dst, idx, size)?;
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(size as i64)
        .push(operand(OP, il.dims(), &out_strides)?)
        .push(out_dim_stride as i64)
        .ptr(out.ptr_at(0))
        .push(strided(OP, il)?)
        .ptr(idx.ptr_at(il.offset()))
        .push(strided(OP, sl)?)
        .ptr(src.ptr_at(sl.offset()))
        .ptr(err.ptr());
    let name = indexed_name(OP, dst.dtype(), idx.dtype());
    // SAFETY: the argument list of `scatter_add_{T}_{I}`; `out` is a fresh contiguous copy
    // of dst's shape (so the checked `idx * out_dim_stride` stays inside it, and nothing
    // else writes it during the launch, as the u8/bool word-CAS requires), idx and src are
    // read inside their layouts, `err` holds two i64.
    unsafe { dst.ctx().launch(&name, launch_config_1d(n), &mut args)? };
    check_slot(OP, &err, (idx, il), dim, size)?;
    Ok(out)
}

/// Per element of `[N, L]`: `(-w[t]·x[n, t, l], w[t])`, or `(0, 0)` at `ignore_index`.
pub(crate) fn nll_loss(
    x: &CudaStorage,
    lx: &Layout,
    t: &CudaStorage,
    lt: &Layout,
    weight: Option<(&CudaStorage, &Layout)>,
    ignore_index: i64,
) -> Result<(CudaStorage, CudaStorage)> {
    const OP: &str = "nll_loss";
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(TensorError::unsupported(OP, x.dtype()));
    }
    check_index_dtype(OP, t)?;
    let (dx, sx, st) = (lx.dims(), lx.strides(), lt.strides());
    let (n_batch, classes, len) = (dx[0], dx[1], dx[2]);
    let n = n_batch * len;
    let loss = CudaStorage::alloc(x.ctx(), x.dtype(), n)?;
    let wout = CudaStorage::alloc(x.ctx(), x.dtype(), n)?;
    if n == 0 {
        return Ok((loss, wout));
    }
    if x.is_empty() {
        // No classes: every target must be ignore_index.
        if let Some(cls) = first_bad_on_host(t, lt, |v| v == ignore_index)? {
            return Err(bad_target(cls, classes, ignore_index));
        }
        let zeros = |()| full(x.ctx(), n, Scalar::Int(0), x.dtype());
        return Ok((zeros(())?, zeros(())?));
    }
    let (w_ptr, w_s) = match weight {
        Some((w, lw)) => (w.ptr_at(lw.offset()), lw.strides()[0]),
        None => (DevicePtr(0), 0),
    };
    let err = ErrorSlot::new(x, t, |lo, hi| targets_proven(lo, hi, classes, ignore_index))?;
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(classes as i64)
        .push(len as i64)
        .ptr(x.ptr_at(lx.offset()))
        .push(sx[0] as i64)
        .push(sx[1] as i64)
        .push(sx[2] as i64)
        .ptr(t.ptr_at(lt.offset()))
        .push(st[0] as i64)
        .push(st[1] as i64)
        .ptr(w_ptr)
        .push(w_s as i64)
        .push(ignore_index)
        .ptr(loss.ptr_at(0))
        .ptr(wout.ptr_at(0))
        .ptr(err.ptr());
    let name = indexed_name(OP, x.dtype(), t.dtype());
    // SAFETY: the argument list of `nll_loss_{T}_{I}` (kernels/loss.cu); x is [N, C, L] and
    // t [N, L] inside their storages (targets are checked before they index x), weight is
    // [C] or null, `loss`/`wout` hold N·L elements, `err` two i64.
    unsafe { x.ctx().launch(&name, launch_config_1d(n), &mut args)? };
    if let Some(pos) = err.bad_position()? {
        return Err(bad_target(index_at(t, lt, pos)?, classes, ignore_index));
    }
    Ok((loss, wout))
}

/// The CPU backend's error for a target outside `[0, classes)`.
pub(super) fn bad_target(cls: i64, classes: usize, ignore_index: i64) -> TensorError {
    TensorError::invalid(
        "nll_loss",
        format!(
            "target {cls} is out of bounds: expected a class index in [0, {classes}) or ignore_index = {ignore_index}"
        ),
    )
}

fn check_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(TensorError::unsupported(op, dtype))
    }
}

/// The shared head of both pooling kernels' arguments, through the padding.
fn pool_args(x: &CudaStorage, l: &Layout, p: &Pool2dParams, n: usize) -> KernelArgs {
    let (d, s) = (l.dims(), l.strides());
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(d[1] as i64)
        .push(d[2] as i64)
        .push(d[3] as i64)
        .push(p.out.0 as i64)
        .push(p.out.1 as i64)
        .ptr(x.ptr_at(l.offset()));
    for v in [
        s[0], s[1], s[2], s[3], p.kernel.0, p.kernel.1, p.stride.0, p.stride.1,
    ] {
        args.push(v as i64);
    }
    args.push(p.pad.0 as i64).push(p.pad.1 as i64);
    args
}

/// Max pooling: values and flat `h * W + w` indices (i64).
pub(crate) fn max_pool2d(
    x: &CudaStorage,
    l: &Layout,
    p: &Pool2dParams,
) -> Result<(CudaStorage, CudaStorage)> {
    check_float("max_pool2d", x.dtype())?;
    let d = l.dims();
    let n = d[0] * d[1] * p.out.0 * p.out.1;
    let out = CudaStorage::alloc(x.ctx(), x.dtype(), n)?;
    let mut idx = CudaStorage::alloc(x.ctx(), DType::I64, n)?;
    if n > 0 {
        let mut args = pool_args(x, l, p, n);
        args.push(p.dilation.0 as i64)
            .push(p.dilation.1 as i64)
            .ptr(out.ptr_at(0))
            .ptr(idx.ptr_at(0));
        // SAFETY: the argument list of `max_pool2d_{T}` (kernels/pool.cu); x is the strided
        // [N, C, H, W] view, the geometry was checked by the front, `out` and `idx` hold n.
        unsafe {
            x.ctx().launch(
                &kernel_name("max_pool2d", x.dtype()),
                launch_config_1d(n),
                &mut args,
            )?
        };
        // Each index is a position h·W + w inside its input plane (a window always starts
        // inside the input: the front bounds the padding by half the kernel), so the
        // backward's scatter need not read them back (Note [Known index ranges]).
        let plane = (d[2] * d[3]) as i64;
        idx.set_known_range(0, plane - 1);
    }
    Ok((out, idx))
}

/// Average pooling with PyTorch's three divisors.
pub(crate) fn avg_pool2d(
    x: &CudaStorage,
    l: &Layout,
    p: &Pool2dParams,
    divisor: AvgDivisor,
) -> Result<CudaStorage> {
    check_float("avg_pool2d", x.dtype())?;
    let d = l.dims();
    let n = d[0] * d[1] * p.out.0 * p.out.1;
    let out = CudaStorage::alloc(x.ctx(), x.dtype(), n)?;
    if n > 0 {
        let (include_pad, over) = match divisor {
            AvgDivisor::IncludePad => (1i64, 0i64),
            AvgDivisor::ExcludePad => (0, 0),
            AvgDivisor::Override(v) => (0, v),
        };
        let mut args = pool_args(x, l, p, n);
        args.push(include_pad).push(over).ptr(out.ptr_at(0));
        // SAFETY: the argument list of `avg_pool2d_{T}`; as in `max_pool2d`.
        unsafe {
            x.ctx().launch(
                &kernel_name("avg_pool2d", x.dtype()),
                launch_config_1d(n),
                &mut args,
            )?
        };
    }
    Ok(out)
}

/// Most elements of one im2col buffer (samples are processed in chunks below it).
const COL_ELEMENTS: usize = 16 << 20;

/// conv2d on cuDNN where it can run (Note [Convolutions on cuDNN]), else im2col + GEMM.
pub(crate) fn conv2d(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    bias: Option<(&CudaStorage, &Layout)>,
    p: &Conv2dParams,
) -> Result<CudaStorage> {
    match super::cudnn::conv2d_forward(x, lx, w, lw, bias, p)? {
        Some(out) => Ok(out),
        None => conv2d_im2col(x, lx, w, lw, bias, p),
    }
}

/// conv2d as im2col + one strided-batched GEMM per group and chunk of samples, the bias
/// broadcast into the output first (GEMM with beta = 1). See kernels/conv.cu. The fallback
/// of the cuDNN path.
fn conv2d_im2col(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    bias: Option<(&CudaStorage, &Layout)>,
    p: &Conv2dParams,
) -> Result<CudaStorage> {
    const OP: &str = "conv2d";
    let dtype = gemm_type(OP, x.dtype())?;
    let ctx = x.ctx();
    let (dx, sx) = (lx.dims(), lx.strides());
    let (n_batch, c, h, wd) = (dx[0], dx[1], dx[2], dx[3]);
    let (o, kh, kw) = (lw.dims()[0], lw.dims()[2], lw.dims()[3]);
    let groups = p.groups;
    let og = o / groups;
    let k = (c / groups) * kh * kw;
    let l = p.out.0 * p.out.1;
    let total = n_batch * o * l;
    let (out, beta) = match bias {
        Some((b, lb)) => {
            let bcast = Layout::new(
                vec![n_batch, o, l].into(),
                vec![0, lb.strides()[0], 0],
                lb.offset(),
            );
            (cast(b, &bcast, b.dtype())?, 1.0)
        }
        None => (full(ctx, total, Scalar::Int(0), x.dtype())?, 0.0),
    };
    if total == 0 || k == 0 || l == 0 || og == 0 {
        return Ok(out);
    }
    let wt;
    let (wsrc, woff) = if lw.is_contiguous() {
        (w, lw.offset())
    } else {
        wt = cast(w, lw, w.dtype())?;
        (&wt, 0)
    };
    let rows = c * kh * kw;
    let chunk = (COL_ELEMENTS / (rows * l).max(1)).clamp(1, n_batch);
    let col = CudaStorage::alloc(ctx, x.dtype(), chunk * rows * l)?;
    let mut n0 = 0;
    while n0 < n_batch {
        let nc = chunk.min(n_batch - n0);
        let n = nc * rows * l;
        let mut args = KernelArgs::new();
        args.push(n as i64)
            .push(c as i64)
            .push(h as i64)
            .push(wd as i64)
            .ptr(x.ptr_at(lx.offset() + n0 * sx[0]));
        for v in [sx[0], sx[1], sx[2], sx[3], kh, kw, p.stride.0, p.stride.1] {
            args.push(v as i64);
        }
        for v in [
            p.pad.0,
            p.pad.1,
            p.dilation.0,
            p.dilation.1,
            p.out.0,
            p.out.1,
        ] {
            args.push(v as i64);
        }
        args.ptr(col.ptr_at(0));
        // SAFETY: the argument list of `im2col_{T}` (kernels/conv.cu); samples n0..n0+nc of
        // the strided input, `col` holds chunk·C·kh·kw·L >= n elements.
        unsafe {
            ctx.launch(
                &kernel_name("im2col", x.dtype()),
                launch_config_1d(n),
                &mut args,
            )?
        };
        for g in 0..groups {
            let desc = GemmDesc {
                trans_a: false,
                trans_b: false,
                m: l,
                n: og,
                k,
                alpha: 1.0,
                beta,
                a: col.ptr_at(g * k * l),
                lda: l,
                stride_a: rows * l,
                b: wsrc.ptr_at(woff + g * og * k),
                ldb: k,
                stride_b: 0,
                c: out.ptr_at((n0 * o + g * og) * l),
                ldc: l,
                stride_c: o * l,
                batch: nc,
                dtype,
                allow_tf32: allow_tf32(),
            };
            ctx.gemm(&desc)?;
        }
        n0 += nc;
    }
    Ok(out)
}
