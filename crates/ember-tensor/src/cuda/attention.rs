//! The fused attention kernels (`kernels/attention.cu`) on CUDA storages: the forward
//! (`attn_fwd_{T}`) and the backward (`attn_bwd_prep_{T}`, `attn_bwd_dkdv_{T}`,
//! `attn_bwd_dq_{T}`) for f32, f16 and bf16, mirroring `crate::cpu::attention` (whose
//! [`AttnOptions`] they take). Device memory: the outputs, the forward's log-sum-exp and the
//! backward's `delta` (`[B, H, L]` f32 each) — O(L), never an `L×S` buffer.
//!
//! Every operand is a 4-D layout `[batch, heads, len, dim]` whose last stride is 1 (the op
//! flattens leading dims and makes the last one contiguous); the mask is a 4-D layout over
//! `[batch, heads, len_q, len_kv]` (broadcast strides 0), bool or the operands' dtype.

use ember_kernels::KernelArgs;
use ember_kernels::attention::{AttnKernel, AttnParams, attn_launch_config, keep_threshold};

use super::{Ctx, CudaStorage};
use crate::cpu::attention::AttnOptions;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;

const OP: &str = "scaled_dot_product_attention";

/// A storage and its 4-D layout.
pub(crate) type Operand<'a> = (&'a CudaStorage, &'a Layout);

fn invalid(msg: String) -> TensorError {
    TensorError::invalid(OP, msg)
}

/// `[n0, n1, n2, n3]` and the first three strides of a 4-D layout with unit last stride.
fn dims4(what: &str, l: &Layout) -> Result<([usize; 4], [i64; 3])> {
    match (l.dims(), l.strides()) {
        (&[a, b, c, d], &[sa, sb, sc, sd]) if sd == 1 || d <= 1 => {
            Ok(([a, b, c, d], [sa as i64, sb as i64, sc as i64]))
        }
        (dims, strides) => Err(invalid(format!(
            "expected {what} as [batch, heads, len, dim] with unit stride on dim, found shape \
             {dims:?} with strides {strides:?} (internal error)"
        ))),
    }
}

/// The kernels' parameters for q, k, v (and the mask) with `opts`, checked against each
/// other.
fn params(
    (q, lq): Operand<'_>,
    (k, lk): Operand<'_>,
    (v, lv): Operand<'_>,
    mask: Option<Operand<'_>>,
    opts: &AttnOptions,
) -> Result<AttnParams> {
    let dtype = q.dtype();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) {
        return Err(TensorError::UnsupportedDType {
            op: OP,
            dtype,
            hint: "the fused CUDA kernels take f32, f16 and bf16",
        });
    }
    if k.dtype() != dtype || v.dtype() != dtype {
        return Err(invalid(format!(
            "expected query, key, and value to have the same dtype, but got query.dtype: \
             {dtype} key.dtype: {} and value.dtype: {} instead.",
            k.dtype(),
            v.dtype()
        )));
    }
    let ([b, h, l, e], qs) = dims4("q", lq)?;
    let ([kb, g, s, ke], ks) = dims4("k", lk)?;
    let ([vb, vg, vs, ev], vst) = dims4("v", lv)?;
    if kb != b || vb != b || vg != g || vs != s || ke != e || g == 0 || !h.is_multiple_of(g) {
        return Err(invalid(format!(
            "q {:?}, k {:?} and v {:?} do not fit together (internal error)",
            lq.dims(),
            lk.dims(),
            lv.dims()
        )));
    }
    let i = |x: usize| x as i64;
    let mut p = AttnParams {
        batch: i(b),
        heads: i(h),
        kv_heads: i(g),
        len_q: i(l),
        len_kv: i(s),
        dim_qk: i(e),
        dim_v: i(ev),
        q_sb: qs[0],
        q_sh: qs[1],
        q_sl: qs[2],
        k_sb: ks[0],
        k_sh: ks[1],
        k_sl: ks[2],
        v_sb: vst[0],
        v_sh: vst[1],
        v_sl: vst[2],
        causal: i32::from(opts.causal),
        scale: opts.scale as f32,
        ..AttnParams::default()
    };
    if let Some((m, lm)) = mask {
        if m.dtype() != DType::Bool && m.dtype() != dtype {
            return Err(invalid(format!(
                "Expected attn_mask dtype to be bool or float or to match query dtype, but got \
                 attn_mask.dtype: {} and  query.dtype: {dtype} instead.",
                m.dtype()
            )));
        }
        match (lm.dims(), lm.strides()) {
            (&[mb, mh, ml, ms], &[sb, sh, sl, ss]) if [mb, mh, ml, ms] == [b, h, l, s] => {
                [p.m_sb, p.m_sh, p.m_sl, p.m_ss] = [sb, sh, sl, ss].map(|x| x as i64);
            }
            (dims, _) => {
                return Err(invalid(format!(
                    "expected the mask expanded to {:?}, found {dims:?} (internal error)",
                    [b, h, l, s]
                )));
            }
        }
    }
    if let Some(d) = opts.dropout {
        p.dropout = 1;
        p.keep_threshold = keep_threshold(d.p);
        p.dropout_scale = (1.0 / (1.0 - d.p)) as f32;
        [p.philox_key0, p.philox_key1] = d.key;
        p.philox_base = d.base;
    }
    Ok(p)
}

/// The float mask's and the bool mask's addresses (null for the one not given).
fn mask_ptrs(
    mask: Option<Operand<'_>>,
) -> (
    ember_device::driver::DevicePtr,
    ember_device::driver::DevicePtr,
) {
    use ember_device::driver::DevicePtr;
    match mask {
        Some((m, lm)) if m.dtype() == DType::Bool => (DevicePtr(0), m.ptr_at(lm.offset())),
        Some((m, lm)) => (m.ptr_at(lm.offset()), DevicePtr(0)),
        None => (DevicePtr(0), DevicePtr(0)),
    }
}

/// Launches `kernel` unless it has nothing to do.
///
/// # Safety
/// `args` must follow `p` with the pointers of the kernel's parameter list
/// (kernels/attention.cu), each valid for the shapes in `p`.
unsafe fn launch(
    ctx: &Ctx,
    kernel: AttnKernel,
    dtype: DType,
    p: &AttnParams,
    args: &mut KernelArgs,
) -> Result<()> {
    if let Some(config) = attn_launch_config(kernel, p)? {
        let name = kernel.name(dtype.short_name());
        // SAFETY: forwarded from this function's contract.
        unsafe { ctx.launch(&name, config, args)? };
    }
    Ok(())
}

/// The forward: `(out, lse)`, out `[B, H, L, Ev]` contiguous in q's dtype, lse `[B, H, L]`
/// f32 (natural log; `+inf` for fully masked rows, whose output is 0).
pub(crate) fn attention_forward(
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<Operand<'_>>,
    opts: &AttnOptions,
) -> Result<(CudaStorage, CudaStorage)> {
    let p = params(q, k, v, mask, opts)?;
    let dtype = q.0.dtype();
    let ctx = q.0.ctx();
    let rows = (p.batch * p.heads * p.len_q) as usize;
    let out = CudaStorage::alloc(ctx, dtype, rows * p.dim_v as usize)?;
    let lse = CudaStorage::alloc(ctx, DType::F32, rows)?;
    let (fm, bm) = mask_ptrs(mask);
    let mut args = KernelArgs::new();
    args.push(p)
        .ptr(q.0.ptr_at(q.1.offset()))
        .ptr(k.0.ptr_at(k.1.offset()))
        .ptr(v.0.ptr_at(v.1.offset()))
        .ptr(fm)
        .ptr(bm)
        .ptr(out.ptr_at(0))
        .ptr(lse.ptr_at(0));
    // SAFETY: attn_fwd_{T}(AttnParams, q, k, v, mask, bmask, o, lse): q, k, v and the mask
    // are views whose 4-D layouts `params` checked and copied (unit last stride, shapes that
    // fit), out and lse hold B·H·L·Ev and B·H·L elements.
    unsafe { launch(ctx, AttnKernel::Forward, dtype, &p, &mut args)? };
    Ok((out, lse))
}

/// The backward: `(dq, dk, dv)`, contiguous `[B, H, L, E]`, `[B, G, S, E]`, `[B, G, S, Ev]`
/// in q's dtype, from the forward's `out` and `lse` and the output gradient `dout`
/// (`[B, H, L, Ev]`, unit last stride). `opts` must be the forward's (the same dropout
/// counters).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    mask: Option<Operand<'_>>,
    opts: &AttnOptions,
    out: &CudaStorage,
    lse: &CudaStorage,
    dout: Operand<'_>,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let mut p = params(q, k, v, mask, opts)?;
    let dtype = q.0.dtype();
    let ([db, dh, dl, dev], ds) = dims4("the output gradient", dout.1)?;
    let (b, h, l, ev) = (
        p.batch as usize,
        p.heads as usize,
        p.len_q as usize,
        p.dim_v as usize,
    );
    let rows = b * h * l;
    if [db, dh, dl, dev] != [b, h, l, ev]
        || dout.0.dtype() != dtype
        || out.dtype() != dtype
        || out.len() != rows * ev
        || lse.dtype() != DType::F32
        || lse.len() != rows
    {
        return Err(invalid(format!(
            "the saved output, log-sum-exp or the output gradient {:?} do not fit the forward \
             (internal error)",
            dout.1.dims()
        )));
    }
    [p.do_sb, p.do_sh, p.do_sl] = ds;
    let ctx = q.0.ctx();
    let (s, e, g) = (p.len_kv as usize, p.dim_qk as usize, p.kv_heads as usize);
    let delta = CudaStorage::alloc(ctx, DType::F32, rows)?;
    let mut args = KernelArgs::new();
    args.push(p)
        .ptr(out.ptr_at(0))
        .ptr(dout.0.ptr_at(dout.1.offset()))
        .ptr(delta.ptr_at(0));
    // SAFETY: attn_bwd_prep_{T}(AttnParams, o, dout, delta): out is contiguous [B, H, L, Ev]
    // (checked above), dout a view with the strides in p, delta holds B·H·L floats.
    unsafe { launch(ctx, AttnKernel::BackwardPrep, dtype, &p, &mut args)? };
    let (fm, bm) = mask_ptrs(mask);
    let common = |args: &mut KernelArgs| {
        args.push(p)
            .ptr(q.0.ptr_at(q.1.offset()))
            .ptr(k.0.ptr_at(k.1.offset()))
            .ptr(v.0.ptr_at(v.1.offset()))
            .ptr(fm)
            .ptr(bm)
            .ptr(dout.0.ptr_at(dout.1.offset()))
            .ptr(lse.ptr_at(0))
            .ptr(delta.ptr_at(0));
    };
    let dk = CudaStorage::alloc(ctx, dtype, b * g * s * e)?;
    let dv = CudaStorage::alloc(ctx, dtype, b * g * s * ev)?;
    let mut args = KernelArgs::new();
    common(&mut args);
    args.ptr(dk.ptr_at(0)).ptr(dv.ptr_at(0));
    // SAFETY: attn_bwd_dkdv_{T}(AttnParams, q, k, v, mask, bmask, dout, lse, delta, dk, dv):
    // the views as for the forward, lse and delta B·H·L floats, dk and dv B·G·S·E and
    // B·G·S·Ev elements.
    unsafe { launch(ctx, AttnKernel::BackwardDkDv, dtype, &p, &mut args)? };
    let dq = CudaStorage::alloc(ctx, dtype, rows * e)?;
    let mut args = KernelArgs::new();
    common(&mut args);
    args.ptr(dq.ptr_at(0));
    // SAFETY: attn_bwd_dq_{T}(AttnParams, q, k, v, mask, bmask, dout, lse, delta, dq): as
    // above, dq holds B·H·L·E elements.
    unsafe { launch(ctx, AttnKernel::BackwardDq, dtype, &p, &mut args)? };
    Ok((dq, dk, dv))
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
