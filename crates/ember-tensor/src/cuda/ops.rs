//! The CUDA kernels of each op family, launched on [`CudaStorage`]s. Each function mirrors
//! the CPU backend's of the same name (`crate::cpu`), takes layouts already broadcast and of
//! the compute dtype (Note [Dispatch]) and returns a fresh contiguous storage or writes a view.

use std::sync::Arc;

use ember_device::driver::{DevicePtr, GemmDesc, GemmType};
use ember_kernels::{KernelArgs, StridedLayout, launch_config_1d, launch_config_elementwise};

use super::{Ctx, CudaStorage, kernel_name, strided};
use crate::cpu::dispatch;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::op::{BinaryOpT, CmpOp, UnaryOpT};
use crate::scalar::Scalar;

/// Threads per block of the row kernels (reductions, softmax); a multiple of 32.
pub(super) const ROW_BLOCK: u32 = 256;
/// The most blocks a row kernel's grid uses (the kernels loop over further rows).
const MAX_ROW_GRID: usize = 65_535;

/// Pushes `value` converted to `dtype`, as the kernels' by-value `T` parameter.
fn push_scalar(args: &mut KernelArgs, value: Scalar, dtype: DType) {
    dispatch!(dtype, T => {
        args.push(value.to_dtype::<T>());
    });
}

/// The launch of an elementwise kernel (kernels/ember.cuh, Note [Elementwise loops]) over
/// `n` elements with these operand layouts and dtypes (the output's among them).
fn elementwise_config(
    ctx: &Ctx,
    n: usize,
    layouts: &[&StridedLayout],
    dtypes: &[DType],
) -> ember_device::driver::LaunchConfig {
    let contiguous = layouts.iter().all(|l| l.contiguous != 0);
    let widest = dtypes.iter().map(|d| d.size_in_bytes()).max().unwrap_or(1);
    launch_config_elementwise(n, widest, contiguous, ctx.sm_count())
}

/// `out[i] = kernel(in[l(i)])` over `l`'s shape: the `(n, StridedLayout, in, out)` kernels.
fn map1(
    op: &'static str,
    name: &str,
    s: &CudaStorage,
    l: &Layout,
    out_dtype: DType,
) -> Result<CudaStorage> {
    let n = l.numel();
    let out = CudaStorage::alloc(s.ctx(), out_dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let sl = strided(op, l)?;
    let config = elementwise_config(s.ctx(), n, &[&sl], &[s.dtype(), out_dtype]);
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(sl)
        .ptr(s.ptr_at(l.offset()))
        .ptr(out.ptr_at(0));
    // SAFETY: `(i64 n, StridedLayout l, const T* in, U* out)` is the signature of every
    // kernel routed here (unary.cu, cast.cu); `l` stays inside `s` (a tensor's layout always
    // does) and `out` holds `n` elements of the output dtype.
    unsafe { s.ctx().launch(name, config, &mut args)? };
    Ok(out)
}

/// A contiguous copy of `l`'s elements, converted to `dtype`.
pub(crate) fn cast(s: &CudaStorage, l: &Layout, dtype: DType) -> Result<CudaStorage> {
    let name = format!("cast_{}_{}", s.dtype().short_name(), dtype.short_name());
    map1("cast", &name, s, l, dtype)
}

pub(crate) fn unary<O: UnaryOpT>(
    op: &'static str,
    s: &CudaStorage,
    l: &Layout,
) -> Result<CudaStorage> {
    map1(op, &kernel_name(O::KERNEL, s.dtype()), s, l, s.dtype())
}

/// The `(n, StridedLayout la, StridedLayout lb, const T* a, const T* b, U* out)` kernels.
fn map2(
    op: &'static str,
    name: &str,
    (a, la): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    out_dtype: DType,
) -> Result<CudaStorage> {
    let out = CudaStorage::alloc(a.ctx(), out_dtype, la.numel())?;
    map2_into(op, name, (a, la), (b, lb), (out.ptr_at(0), out_dtype))?;
    Ok(out)
}

/// The `(n, la, lb, a, b, out)` kernel writing its contiguous output at `out`.
fn map2_into(
    op: &'static str,
    name: &str,
    (a, la): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    (out, out_dtype): (DevicePtr, DType),
) -> Result<()> {
    let n = la.numel();
    if n == 0 {
        return Ok(());
    }
    let (sa, sb) = (strided(op, la)?, strided(op, lb)?);
    let dtypes = [a.dtype(), b.dtype(), out_dtype];
    let config = elementwise_config(a.ctx(), n, &[&sa, &sb], &dtypes);
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(sa)
        .push(sb)
        .ptr(a.ptr_at(la.offset()))
        .ptr(b.ptr_at(lb.offset()))
        .ptr(out);
    // SAFETY: the signature of the binary and comparison kernels (elementwise.cu); both
    // layouts have the output's shape (the front broadcast them) and stay inside their
    // storages; `out` holds `n` contiguous elements: a fresh buffer, or `a`'s own contiguous
    // view, where each thread reads element i before writing it.
    unsafe { a.ctx().launch(name, config, &mut args)? };
    Ok(())
}

pub(crate) fn binary<O: BinaryOpT>(
    op: &'static str,
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    let name = kernel_name(O::KERNEL, a.dtype());
    map2(op, &name, (a, la), (b, lb), a.dtype())
}

pub(crate) fn cmp(
    op: CmpOp,
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    let name = format!("cmp_{}_{}", op.name(), a.dtype().short_name());
    map2(op.name(), &name, (a, la), (b, lb), DType::Bool)
}

pub(crate) fn where_cond(
    (c, lc): (&CudaStorage, &Layout),
    (t, lt): (&CudaStorage, &Layout),
    (f, lf): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let n = lc.numel();
    let out = CudaStorage::alloc(t.ctx(), t.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let (sc, st, sf) = (
        strided("where", lc)?,
        strided("where", lt)?,
        strided("where", lf)?,
    );
    let dtypes = [DType::Bool, t.dtype()];
    let config = elementwise_config(t.ctx(), n, &[&sc, &st, &sf], &dtypes);
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(sc)
        .push(st)
        .push(sf)
        .ptr(c.ptr_at(lc.offset()))
        .ptr(t.ptr_at(lt.offset()))
        .ptr(f.ptr_at(lf.offset()))
        .ptr(out.ptr_at(0));
    // SAFETY: `where_{dtype}(n, lc, la, lb, const bool*, const T*, const T*, T*)`; the three
    // layouts share the output's shape and stay inside their storages (`c` is bool, `t` and
    // `f` the output's dtype); `out` holds `n` elements.
    unsafe {
        t.ctx()
            .launch(&kernel_name("where", t.dtype()), config, &mut args)?
    };
    Ok(out)
}

/// `out = x <= threshold ? 0 : g` through `threshold_backward_{dtype}`
/// (`kernels/activation_bwd.cu`).
pub(crate) fn threshold_backward(
    (g, lg): (&CudaStorage, &Layout),
    (x, lx): (&CudaStorage, &Layout),
    threshold: Scalar,
) -> Result<CudaStorage> {
    const OP: &str = "threshold_backward";
    let n = lg.numel();
    let dtype = g.dtype();
    let out = CudaStorage::alloc(g.ctx(), dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let (sg, sx) = (strided(OP, lg)?, strided(OP, lx)?);
    let config = elementwise_config(g.ctx(), n, &[&sg, &sx], &[dtype]);
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(sg)
        .push(sx)
        .ptr(g.ptr_at(lg.offset()))
        .ptr(x.ptr_at(lx.offset()));
    push_scalar(&mut args, threshold, dtype);
    args.ptr(out.ptr_at(0));
    // SAFETY: `threshold_backward_{dtype}(n, lg, lx, const T* grad, const T* x, T threshold,
    // T* out)` with the threshold pushed as `T`; both layouts have the output's shape (the
    // front broadcast them) and stay inside their storages, both of the output's dtype; `out`
    // is fresh with `n` elements.
    unsafe { g.ctx().launch(&kernel_name(OP, dtype), config, &mut args)? };
    Ok(out)
}

/// `out[lout] = in[lin]` (same shape), through `copy_{dtype}`.
fn copy_into(dst: &mut CudaStorage, ld: &Layout, src: &CudaStorage, ls: &Layout) -> Result<()> {
    let n = ld.numel();
    if n == 0 {
        return Ok(());
    }
    if ls.dims() != ld.dims() || src.dtype() != dst.dtype() {
        return Err(TensorError::invalid(
            "copy_",
            format!(
                "internal error: copying {} {:?} into {} {:?}",
                src.dtype(),
                ls.dims(),
                dst.dtype(),
                ld.dims()
            ),
        ));
    }
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(strided("copy_", ls)?)
        .push(strided("copy_", ld)?)
        .ptr(src.ptr_at(ls.offset()))
        .ptr(dst.ptr_at(ld.offset()));
    // SAFETY: `copy_{dtype}(n, lin, lout, const T* in, T* out)`; both layouts have `n`
    // elements of the same shape inside their storages, of one dtype (checked above). `dst`
    // is borrowed mutably, so it is not `src`, and the front refused destinations whose
    // elements overlap (expanded views).
    unsafe {
        dst.ctx().launch(
            &kernel_name("copy", dst.dtype()),
            launch_config_1d(n),
            &mut args,
        )?
    };
    Ok(())
}

/// `dst[ld] = src[ls]`; same dtype and shape.
pub(crate) fn copy(
    dst: &mut CudaStorage,
    ld: &Layout,
    src: &CudaStorage,
    ls: &Layout,
) -> Result<()> {
    copy_into(dst, ld, src, ls)
}

pub(crate) fn binary_inplace<O: BinaryOpT>(
    op: &'static str,
    dst: &mut CudaStorage,
    ld: &Layout,
    src: &CudaStorage,
    ls: &Layout,
) -> Result<()> {
    if ld.is_contiguous() {
        // The kernel writes its contiguous output over the operand it reads (element for
        // element): no buffer, no copy back — the optimizer's `add_`/`mul_` path.
        let name = kernel_name(O::KERNEL, dst.dtype());
        let out = (dst.ptr_at(ld.offset()), dst.dtype());
        return map2_into(op, &name, (dst, ld), (src, ls), out);
    }
    let r = binary::<O>(op, dst, ld, src, ls)?;
    copy_into(dst, ld, &r, &Layout::contiguous(ld.shape().clone()))
}

/// The clamp kernel from `(s, lin)` into `out` at `lout` (same shape).
fn clamp_launch(
    (s, lin): (&CudaStorage, &Layout),
    (out, lout): (&CudaStorage, &Layout),
    min: Option<Scalar>,
    max: Option<Scalar>,
) -> Result<()> {
    let n = lin.numel();
    if n == 0 {
        return Ok(());
    }
    let dtype = s.dtype();
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(strided("clamp", lin)?)
        .push(strided("clamp", lout)?)
        .ptr(s.ptr_at(lin.offset()))
        .ptr(out.ptr_at(lout.offset()));
    push_scalar(&mut args, min.unwrap_or(Scalar::Int(0)), dtype);
    push_scalar(&mut args, max.unwrap_or(Scalar::Int(0)), dtype);
    args.push(i32::from(min.is_some()))
        .push(i32::from(max.is_some()));
    // SAFETY: `clamp_{dtype}(n, lin, lout, const T* in, T* out, T lo, T hi, int, int)` with
    // lo/hi pushed as `T`; both layouts have `n` elements of one shape inside their
    // storages; `out` is either a fresh buffer or the input itself at the same layout (each
    // element read and written by the same thread).
    unsafe {
        s.ctx()
            .launch(&kernel_name("clamp", dtype), launch_config_1d(n), &mut args)?
    };
    Ok(())
}

pub(crate) fn clamp(
    s: &CudaStorage,
    l: &Layout,
    min: Option<Scalar>,
    max: Option<Scalar>,
) -> Result<CudaStorage> {
    let out = CudaStorage::alloc(s.ctx(), s.dtype(), l.numel())?;
    clamp_launch(
        (s, l),
        (&out, &Layout::contiguous(l.shape().clone())),
        min,
        max,
    )?;
    Ok(out)
}

pub(crate) fn clamp_inplace(
    s: &mut CudaStorage,
    l: &Layout,
    min: Option<Scalar>,
    max: Option<Scalar>,
) -> Result<()> {
    clamp_launch((s, l), (s, l), min, max)
}

/// `n` copies of `value` (as `dtype`) on `ctx`'s device.
pub(crate) fn full(ctx: &Arc<Ctx>, n: usize, value: Scalar, dtype: DType) -> Result<CudaStorage> {
    let out = CudaStorage::alloc(ctx, dtype, n)?;
    fill_launch(ctx, out.ptr_at(0), n, value, dtype)?;
    Ok(out)
}

/// `ember_fill_{dtype}` over `n` contiguous elements at `out`.
fn fill_launch(ctx: &Ctx, out: DevicePtr, n: usize, value: Scalar, dtype: DType) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let mut args = KernelArgs::new();
    args.ptr(out).push(n as i64);
    push_scalar(&mut args, value, dtype);
    // SAFETY: `ember_fill_{dtype}(T* out, i64 n, T value)`, value pushed as `T`; `out` holds
    // `n` elements (a fresh buffer or a contiguous view inside its storage).
    unsafe {
        ctx.launch(
            &kernel_name("ember_fill", dtype),
            launch_config_1d(n),
            &mut args,
        )
    }
}

pub(crate) fn fill(dst: &mut CudaStorage, l: &Layout, value: Scalar) -> Result<()> {
    if l.is_contiguous() {
        // `zero_()` of a gradient: straight into the view.
        return fill_launch(
            dst.ctx(),
            dst.ptr_at(l.offset()),
            l.numel(),
            value,
            dst.dtype(),
        );
    }
    let tmp = full(dst.ctx(), l.numel(), value, dst.dtype())?;
    copy_into(dst, l, &tmp, &Layout::contiguous(l.shape().clone()))
}

/// Launch geometry of the row kernels: a block per row when `inner == 1`, a thread per
/// column otherwise (reduce.cu, softmax.cu).
pub(super) fn row_config(outer: usize, inner: usize) -> ember_device::driver::LaunchConfig {
    if inner == 1 {
        ember_device::driver::LaunchConfig {
            grid: (outer.clamp(1, MAX_ROW_GRID) as u32, 1, 1),
            block: (ROW_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        launch_config_1d(outer * inner)
    }
}

/// Softmax or log-softmax along `dim` (f32/f64/f16/bf16), contiguous output.
pub(crate) fn softmax(s: &CudaStorage, l: &Layout, dim: usize, log: bool) -> Result<CudaStorage> {
    let n = l.numel();
    let out = CudaStorage::alloc(s.ctx(), s.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let tmp;
    let (src, offset) = if l.is_contiguous() {
        (s, l.offset())
    } else {
        tmp = cast(s, l, s.dtype())?;
        (&tmp, 0)
    };
    let d = l.dims();
    let (outer, size, inner) = (
        d[..dim].iter().product::<usize>(),
        d[dim],
        d[dim + 1..].iter().product::<usize>(),
    );
    let mut args = KernelArgs::new();
    args.push(outer as i64)
        .push(size as i64)
        .push(inner as i64)
        .ptr(src.ptr_at(offset))
        .ptr(out.ptr_at(0));
    let name = kernel_name(if log { "log_softmax" } else { "softmax" }, s.dtype());
    // SAFETY: `{log_}softmax_{dtype}(i64 outer, i64 size, i64 inner, const T* in, T* out)`;
    // `in` is the contiguous `[outer, size, inner]` block (n elements) at `offset`, `out`
    // holds n; blockDim is a multiple of 32.
    unsafe { s.ctx().launch(&name, row_config(outer, inner), &mut args)? };
    Ok(out)
}

/// `torch.set_float32_matmul_precision`: whether f32 matrix products may use TF32.
pub(crate) fn allow_tf32() -> bool {
    crate::precision::matmul_precision() != crate::precision::MatmulPrecision::Highest
}

/// How the GEMM reads one `[batch, rows, cols]` operand: transposed or not, its leading
/// dimension and batch stride, or `None` when it needs a contiguous copy first.
fn gemm_view(l: &Layout) -> Option<(bool, usize, usize)> {
    let (d, s, r) = (l.dims(), l.strides(), l.rank());
    let (rows, cols) = (d[r - 2], d[r - 1]);
    let (sr, sc) = (s[r - 2], s[r - 1]);
    // The batch dims as one stride, if they merge.
    let mut batch_stride: Option<usize> = None;
    let mut expect: Option<usize> = None;
    for i in (0..r - 2).rev() {
        if d[i] == 1 {
            continue;
        }
        match expect {
            None => batch_stride = Some(s[i]),
            Some(e) if e == s[i] => {}
            Some(_) => return None,
        }
        expect = Some(s[i] * d[i]);
    }
    let batch_stride = batch_stride.unwrap_or(rows * cols);
    // Row-major (`op = N` in the swapped product below) or column-major (`op = T`).
    if sc == 1 || cols == 1 {
        let ld = if rows == 1 { cols.max(1) } else { sr };
        if ld >= cols.max(1) {
            return Some((false, ld, batch_stride));
        }
    }
    if sr == 1 || rows == 1 {
        let ld = if cols == 1 { rows.max(1) } else { sc };
        if ld >= rows.max(1) {
            return Some((true, ld, batch_stride));
        }
    }
    None
}

pub(crate) fn gemm_type(op: &'static str, dtype: DType) -> Result<GemmType> {
    match dtype {
        DType::F32 => Ok(GemmType::F32),
        DType::F64 => Ok(GemmType::F64),
        DType::F16 => Ok(GemmType::F16),
        DType::Bf16 => Ok(GemmType::Bf16),
        other => Err(TensorError::UnsupportedDType {
            op,
            dtype: other,
            hint: "CUDA matrix products take f32, f64, f16 or bf16, as PyTorch's",
        }),
    }
}

/// Batched `[batch.., m, k] @ [batch.., k, n]` (batch dims already broadcast to one shape)
/// through the driver's strided-batched GEMM (cuBLAS; the CPU GEMM under the emulator).
pub(crate) fn matmul(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    let dtype = gemm_type("matmul", a.dtype())?;
    let (ra, rb) = (la.rank(), lb.rank());
    let (m, k, n) = (la.dims()[ra - 2], la.dims()[ra - 1], lb.dims()[rb - 1]);
    let batch: usize = la.dims()[..ra - 2].iter().product();
    let ctx = a.ctx();
    let numel = batch * m * n;
    if k == 0 {
        return full(ctx, numel, Scalar::Int(0), a.dtype());
    }
    let out = CudaStorage::alloc(ctx, a.dtype(), numel)?;
    if numel == 0 {
        return Ok(out);
    }
    // Each operand as the GEMM reads it, copied to contiguous when its strides don't fit.
    let (ta, tb);
    let (sa, offa, (trans_a, lda, stride_a)) = match gemm_view(la) {
        Some(v) => (a, la.offset(), v),
        None => {
            ta = cast(a, la, a.dtype())?;
            (&ta, 0, (false, k, m * k))
        }
    };
    let (sb, offb, (trans_b, ldb, stride_b)) = match gemm_view(lb) {
        Some(v) => (b, lb.offset(), v),
        None => {
            tb = cast(b, lb, b.dtype())?;
            (&tb, 0, (false, n, k * n))
        }
    };
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS's first operand is B.
    let desc = GemmDesc {
        trans_a: trans_b,
        trans_b: trans_a,
        m: n,
        n: m,
        k,
        alpha: 1.0,
        beta: 0.0,
        a: sb.ptr_at(offb),
        lda: ldb,
        stride_a: stride_b,
        b: sa.ptr_at(offa),
        ldb: lda,
        stride_b: stride_a,
        c: out.ptr_at(0),
        ldc: n,
        stride_c: m * n,
        batch,
        dtype,
        allow_tf32: allow_tf32(),
    };
    ctx.gemm(&desc)?;
    Ok(out)
}

/// Which `philox_*` kernel (kernels/random.cu) and its parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PhiloxKernel {
    /// `philox_uniform_{T}`: `[low, high)`.
    Uniform { low: f64, high: f64 },
    /// `philox_normal_{T}`: `mean + std * z`.
    Normal { mean: f64, std: f64 },
    /// `philox_randint_{T}`: `low + w mod range`.
    RandInt { low: i64, range: u64 },
    /// `philox_bernoulli_{T}`: 1 with probability `p`.
    Bernoulli { p: f64 },
}

/// `n` samples of `kernel` as `dtype`, from Philox key `key` starting at counter `base`
/// (the caller reserved the counters on the generator).
pub(crate) fn philox(
    ctx: &Arc<Ctx>,
    kernel: PhiloxKernel,
    dtype: DType,
    n: usize,
    key: [u32; 2],
    base: u64,
) -> Result<CudaStorage> {
    let out = CudaStorage::alloc(ctx, dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut args = KernelArgs::new();
    args.ptr(out.ptr_at(0))
        .push(n as i64)
        .push(key[0])
        .push(key[1])
        .push(base);
    let family = match kernel {
        PhiloxKernel::Uniform { low, high } => {
            args.push(low).push(high);
            "philox_uniform"
        }
        PhiloxKernel::Normal { mean, std } => {
            args.push(mean).push(std);
            "philox_normal"
        }
        PhiloxKernel::RandInt { low, range } => {
            args.push(low).push(range);
            "philox_randint"
        }
        PhiloxKernel::Bernoulli { p } => {
            args.push(p);
            "philox_bernoulli"
        }
    };
    // SAFETY: `philox_{family}_{T}(T* out, i64 n, u32 key0, u32 key1, u64 base, params)`
    // with the parameters of that family pushed at their exact widths (f64, or i64 + u64
    // for randint); `out` holds `n` elements of `dtype`. Any 1-D grid works.
    unsafe { ctx.launch(&kernel_name(family, dtype), launch_config_1d(n), &mut args)? };
    Ok(out)
}
