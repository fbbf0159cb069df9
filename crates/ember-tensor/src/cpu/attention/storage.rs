//! The CPU attention kernels on storages and layouts (what `backend_fused.rs` dispatches
//! to): each operand a 4-D layout `[batch, heads, len, dim]` whose last stride is 1 (or
//! whose last dim is at most 1), the mask a 4-D layout over `[batch, heads, len_q, len_kv]`
//! (stride 0 where it broadcasts), bool or the operands' dtype. The slices start at each
//! layout's offset; outputs are fresh contiguous storages.

use super::{
    AttnDims, AttnElem, AttnMask, AttnOptions, AttnView, attention_backward, attention_forward,
    invalid,
};
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::CpuStorage;

/// A storage and its 4-D layout.
pub(crate) type CpuOperand<'a> = (&'a CpuStorage, &'a Layout);

/// `[n0, n1, n2, n3]` and the first three strides of a 4-D layout with unit last stride.
fn dims4(what: &str, l: &Layout) -> Result<([usize; 4], [usize; 3])> {
    match (l.dims(), l.strides()) {
        (&[a, b, c, d], &[sa, sb, sc, sd]) if sd == 1 || d <= 1 => Ok(([a, b, c, d], [sa, sb, sc])),
        (dims, strides) => Err(invalid(format!(
            "expected {what} as [batch, heads, len, dim] with unit stride on dim, found shape \
             {dims:?} with strides {strides:?} (internal error)"
        ))),
    }
}

/// The elements of `s` from `l`'s offset on.
fn from_offset<'a, T: WithDType>(what: &str, s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let data = s.as_slice::<T>()?;
    data.get(l.offset()..).ok_or_else(|| {
        invalid(format!(
            "{what} starts at element {} of a storage of {} (internal error)",
            l.offset(),
            data.len()
        ))
    })
}

/// An operand as the kernel's view, with its dims.
fn view<'a, T: WithDType>(
    what: &str,
    (s, l): CpuOperand<'a>,
) -> Result<(AttnView<'a, T>, [usize; 4])> {
    let (dims, strides) = dims4(what, l)?;
    Ok((
        AttnView {
            data: from_offset(what, s, l)?,
            strides,
        },
        dims,
    ))
}

/// The mask as the kernel reads it.
fn mask<'a, T: WithDType>(m: Option<CpuOperand<'a>>, dims: [usize; 4]) -> Result<AttnMask<'a, T>> {
    let Some((s, l)) = m else {
        return Ok(AttnMask::None);
    };
    let strides = match (l.dims(), l.strides()) {
        (d, &[a, b, c, e]) if d == dims => [a, b, c, e],
        (d, _) => {
            return Err(invalid(format!(
                "expected the mask expanded to {dims:?}, found {d:?} (internal error)"
            )));
        }
    };
    if s.dtype() == DType::Bool {
        Ok(AttnMask::Bool(from_offset("the mask", s, l)?, strides))
    } else {
        Ok(AttnMask::Float(from_offset("the mask", s, l)?, strides))
    }
}

/// The operands' views and the attention's shape, checked against each other.
type Views<'a, T> = (AttnDims, [AttnView<'a, T>; 3], AttnMask<'a, T>);

fn views<'a, T: WithDType>(
    q: CpuOperand<'a>,
    k: CpuOperand<'a>,
    v: CpuOperand<'a>,
    m: Option<CpuOperand<'a>>,
) -> Result<Views<'a, T>> {
    let (qv, [b, h, l, e]) = view::<T>("q", q)?;
    let (kv, [kb, g, s, ke]) = view::<T>("k", k)?;
    let (vv, [vb, vg, vs, ev]) = view::<T>("v", v)?;
    if kb != b || vb != b || vg != g || vs != s || ke != e {
        return Err(invalid(format!(
            "q {:?}, k {:?} and v {:?} do not fit together (internal error)",
            q.1.dims(),
            k.1.dims(),
            v.1.dims()
        )));
    }
    let dims = AttnDims {
        batch: b,
        heads: h,
        kv_heads: g,
        len_q: l,
        len_kv: s,
        dim_qk: e,
        dim_v: ev,
    };
    Ok((dims, [qv, kv, vv], mask(m, [b, h, l, s])?))
}

fn check_dtypes(q: &CpuStorage, others: &[&CpuStorage]) -> Result<DType> {
    let dtype = q.dtype();
    if let Some(o) = others.iter().find(|o| o.dtype() != dtype) {
        return Err(invalid(format!(
            "expected every operand in q's dtype {dtype}, found {} (internal error)",
            o.dtype()
        )));
    }
    Ok(dtype)
}

/// The forward: `(out, lse)`, out `[B, H, L, Ev]` contiguous in q's dtype, lse `[B, H, L]`
/// in the compute dtype (f32; f64 for f64).
pub(crate) fn forward(
    q: CpuOperand<'_>,
    k: CpuOperand<'_>,
    v: CpuOperand<'_>,
    mask: Option<CpuOperand<'_>>,
    opts: &AttnOptions,
) -> Result<(CpuStorage, CpuStorage)> {
    match check_dtypes(q.0, &[k.0, v.0])? {
        DType::F32 => forward_t::<f32>(q, k, v, mask, opts),
        DType::F64 => forward_t::<f64>(q, k, v, mask, opts),
        DType::F16 => forward_t::<half::f16>(q, k, v, mask, opts),
        DType::Bf16 => forward_t::<half::bf16>(q, k, v, mask, opts),
        d => Err(TensorError::unsupported("scaled_dot_product_attention", d)),
    }
}

fn forward_t<T: AttnElem + WithDType>(
    q: CpuOperand<'_>,
    k: CpuOperand<'_>,
    v: CpuOperand<'_>,
    m: Option<CpuOperand<'_>>,
    opts: &AttnOptions,
) -> Result<(CpuStorage, CpuStorage)>
where
    T::Acc: WithDType,
{
    let (dims, [qv, kv, vv], mask) = views::<T>(q, k, v, m)?;
    let rows = dims.batch * dims.heads * dims.len_q;
    let mut out = CpuStorage::zeroed(T::DTYPE, rows * dims.dim_v)?;
    let mut lse = CpuStorage::zeroed(<T::Acc as WithDType>::DTYPE, rows)?;
    attention_forward(
        &dims,
        qv,
        kv,
        vv,
        mask,
        opts,
        out.as_mut_slice::<T>()?,
        lse.as_mut_slice::<T::Acc>()?,
    )?;
    Ok((out, lse))
}

/// The backward: `(dq, dk, dv)`, contiguous `[B, H, L, E]`, `[B, G, S, E]`,
/// `[B, G, S, Ev]` in q's dtype, from the forward's contiguous `out`, its `lse` and the
/// output gradient `dout` (`[B, H, L, Ev]`, unit last stride); `opts` the forward's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: CpuOperand<'_>,
    k: CpuOperand<'_>,
    v: CpuOperand<'_>,
    mask: Option<CpuOperand<'_>>,
    opts: &AttnOptions,
    out: &CpuStorage,
    lse: &CpuStorage,
    dout: CpuOperand<'_>,
) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    let args = (q, k, v, mask, opts, out, lse, dout);
    match check_dtypes(q.0, &[k.0, v.0, out, dout.0])? {
        DType::F32 => backward_t::<f32>(args),
        DType::F64 => backward_t::<f64>(args),
        DType::F16 => backward_t::<half::f16>(args),
        DType::Bf16 => backward_t::<half::bf16>(args),
        d => Err(TensorError::unsupported("scaled_dot_product_attention", d)),
    }
}

type BwdArgs<'a> = (
    CpuOperand<'a>,
    CpuOperand<'a>,
    CpuOperand<'a>,
    Option<CpuOperand<'a>>,
    &'a AttnOptions,
    &'a CpuStorage,
    &'a CpuStorage,
    CpuOperand<'a>,
);

fn backward_t<T: AttnElem + WithDType>(
    (q, k, v, m, opts, out, lse, dout): BwdArgs<'_>,
) -> Result<(CpuStorage, CpuStorage, CpuStorage)>
where
    T::Acc: WithDType,
{
    let (dims, [qv, kv, vv], mask) = views::<T>(q, k, v, m)?;
    let (dv_, ddims) = view::<T>("the output gradient", dout)?;
    let rows = dims.batch * dims.heads * dims.len_q;
    if ddims != [dims.batch, dims.heads, dims.len_q, dims.dim_v] {
        return Err(invalid(format!(
            "the output gradient {ddims:?} does not fit the forward (internal error)"
        )));
    }
    let keys = dims.batch * dims.kv_heads * dims.len_kv;
    let mut dq = CpuStorage::zeroed(T::DTYPE, rows * dims.dim_qk)?;
    let mut dk = CpuStorage::zeroed(T::DTYPE, keys * dims.dim_qk)?;
    let mut dv = CpuStorage::zeroed(T::DTYPE, keys * dims.dim_v)?;
    attention_backward(
        &dims,
        (qv, kv, vv),
        mask,
        opts,
        (out.as_slice::<T>()?, dv_, lse.as_slice::<T::Acc>()?),
        dq.as_mut_slice::<T>()?,
        dk.as_mut_slice::<T>()?,
        dv.as_mut_slice::<T>()?,
    )?;
    Ok((dq, dk, dv))
}
