//! `scaled_dot_product_attention` (`torch.nn.functional.scaled_dot_product_attention`) on
//! autograd tensors, by one of two paths that `backends::sdpa` chooses between:
//!
//! - **fused**: the tiled kernels of docs/attention.md (`cpu/attention/`, the CUDA flash
//!   kernels), one recorded node (`ScaledDotProductFlashAttentionForCpuBackward0` on the
//!   CPU, `ScaledDotProductFlashAttentionBackward0` on CUDA, PyTorch's names) that saves q,
//!   k, v, the output, the log-sum-exp and the dropout stream, and runs the kernels'
//!   backward;
//! - **math**: PyTorch's `_scaled_dot_product_attention_math` from recorded ops (matmul,
//!   masked fill or add, a softmax that gives 0 for fully masked rows, dropout, matmul), so
//!   its gradients, a float mask's included, come from those ops.
//!
//! Both take the same dropout stream: the fused kernels reserve the counters
//! `Tensor::dropout` over the `[..., L, S]` weights would, so from the same generator state
//! both paths drop the same weights (docs/attention.md, "Dropout"). The profiler sees
//! `scaled_dot_product_attention` around `_scaled_dot_product_flash_attention_for_cpu`,
//! `_scaled_dot_product_flash_attention` or `_scaled_dot_product_attention_math`: which path
//! ran.

use crate::autograd::engine::sum_to;
use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, Saved, maybe_record, needs_grad};
use crate::autograd::mode::{autocast_inputs, current_policy, set_autocast_policy};
use crate::backends::sdpa::{self, SdpaKernel};
use crate::cpu::attention::{AttnDropout, AttnOptions};
use crate::error::TensorError;
use crate::raw::attention::FusedAttention;
use crate::tensor::Tensor;
use crate::{DType, Device, RawTensor as Raw, Shape};

const OP: &str = "scaled_dot_product_attention";

/// The options of [`Tensor::scaled_dot_product_attention`], PyTorch's keyword arguments
/// with its defaults.
#[derive(Clone, Debug, Default)]
pub struct SdpaOptions {
    /// Bool (`true` takes part, `false` is masked out) or float (added to the scores; f32
    /// or the query's dtype), broadcastable to the weights' `[..., L, S]`.
    pub attn_mask: Option<Tensor>,
    /// Dropout probability on the attention weights, in `[0, 1]` (applied whenever it is
    /// above 0: pass 0 in evaluation, as with PyTorch's functional form).
    pub dropout_p: f64,
    /// The top-left-aligned causal mask `tril(ones(L, S))`; an error with `attn_mask`.
    pub is_causal: bool,
    /// The factor of `q·kᵀ`; `None` for `1 / sqrt(E)`.
    pub scale: Option<f64>,
    /// Grouped-query attention: k and v have `G` heads (dim -3) dividing the query's `H`;
    /// query head `h` reads kv head `h / (H / G)`.
    pub enable_gqa: bool,
}

fn invalid(msg: String) -> crate::Error {
    TensorError::invalid(OP, msg).into()
}

fn shape_err(msg: String) -> crate::Error {
    TensorError::ShapeMismatch { op: OP, msg }.into()
}

/// The shape of one attention after broadcasting: the weights are `lead + [H, L, S]`
/// flattened to `[B, H, L, S]` (`B` the product of `lead`); k and v have `G` heads.
#[derive(Clone, Debug, PartialEq)]
struct Geometry {
    /// The batch dims before the heads' (empty for 3-D and 2-D inputs of one "head").
    lead: Vec<usize>,
    /// Whether the operands have a heads dim at all (rank >= 3 after broadcasting).
    has_heads: bool,
    heads: usize,
    kv_heads: usize,
    len_q: usize,
    len_kv: usize,
    dim_qk: usize,
    dim_v: usize,
}

impl Geometry {
    fn batch(&self) -> usize {
        self.lead.iter().product()
    }

    /// `lead [+ heads] + [len, dim]`.
    fn full(&self, heads: usize, len: usize, dim: usize) -> Vec<usize> {
        let mut s = self.lead.clone();
        if self.has_heads {
            s.push(heads);
        }
        s.extend([len, dim]);
        s
    }

    fn weights(&self) -> Vec<usize> {
        self.full(self.heads, self.len_q, self.len_kv)
    }

    /// `t` (`[..., len, dim]`, broadcastable to `full(heads, ...)`) as the kernels' 4-D
    /// `[B, heads, len, dim]` with a unit last stride: views where possible, a copy where
    /// the broadcast batch dims cannot be merged or the last dim is strided.
    fn four_d(&self, t: &Raw, heads: usize) -> Result<Raw> {
        let d = t.dims();
        let (len, dim) = (d[d.len() - 2], d[d.len() - 1]);
        let x = t
            .expand(self.full(heads, len, dim))?
            .reshape([self.batch(), heads, len, dim])?;
        if dim > 1 && x.strides()[3] != 1 {
            return Ok(x.contiguous()?);
        }
        Ok(x)
    }
}

fn broadcast(a: &[usize], b: &[usize], what: &str) -> Result<Vec<usize>> {
    crate::broadcast_shape(OP, &Shape::from(a.to_vec()), &Shape::from(b.to_vec()))
        .map(|s| s.dims().to_vec())
        .map_err(|_| {
            shape_err(format!(
                "the batch dims of {what} do not broadcast: {a:?} and {b:?}"
            ))
        })
}

/// PyTorch's checks of the operands (`validate_sdpa_input` and the shapes the math path
/// needs), and the shape of the attention.
fn geometry(q: &Tensor, k: &Tensor, v: &Tensor, o: &SdpaOptions) -> Result<Geometry> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(invalid(format!(
            "Expected query, key, and value to have the same dtype, but got query.dtype: {} \
             key.dtype: {} and value.dtype: {} instead.",
            q.dtype(),
            k.dtype(),
            v.dtype()
        )));
    }
    if !q.dtype().is_float() {
        return Err(TensorError::UnsupportedDType {
            op: OP,
            dtype: q.dtype(),
            hint: "scaled_dot_product_attention takes floating-point query, key and value",
        }
        .into());
    }
    if q.device() != k.device() || q.device() != v.device() {
        return Err(invalid(format!(
            "Expected query, key, and value to have the same device type, but got \
             query.device: {} key.device: {} and value.device: {} instead.",
            q.device(),
            k.device(),
            v.device()
        )));
    }
    if qd.len() < 2 || kd.len() < 2 || vd.len() < 2 {
        return Err(invalid(format!(
            "Expected query, key, and value to all be at least 2 dimensional, but got \
             query.dim: {} key.dim: {} and value.dim: {} instead.",
            qd.len(),
            kd.len(),
            vd.len()
        )));
    }
    let last2 = |d: &[usize]| (d[d.len() - 2], d[d.len() - 1]);
    let ((l, e), (s, ke), (vs, ev)) = (last2(&qd), last2(&kd), last2(&vd));
    if ke != e {
        return Err(shape_err(format!(
            "expected key's last dim to be the query's {e} (query {:?}), but got key {:?}",
            qd, kd
        )));
    }
    if vs != s {
        return Err(shape_err(format!(
            "expected value's dim -2 to be key's sequence length {s}, but got key {kd:?} and \
             value {vd:?}"
        )));
    }
    if !(0.0..=1.0).contains(&o.dropout_p) {
        return Err(invalid(format!(
            "dropout probability has to be between 0 and 1, but got {}",
            o.dropout_p
        )));
    }
    if o.is_causal && o.attn_mask.is_some() {
        return Err(invalid(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when \
             is_causal=True"
                .into(),
        ));
    }
    let geom = |lead: Vec<usize>, has_heads: bool, heads: usize, kv_heads: usize| Geometry {
        lead,
        has_heads,
        heads,
        kv_heads,
        len_q: l,
        len_kv: s,
        dim_qk: e,
        dim_v: ev,
    };
    let gqa = o.enable_gqa && qd.len() >= 3 && kd.len() >= 3 && vd.len() >= 3;
    let g = if gqa && qd[qd.len() - 3] != kd[kd.len() - 3] {
        let (h, hk, hv) = (qd[qd.len() - 3], kd[kd.len() - 3], vd[vd.len() - 3]);
        if hk != hv {
            return Err(shape_err(format!(
                "Expected key and value to have the same number of heads (dim -3) with \
                 enable_gqa, but got key {kd:?} and value {vd:?}"
            )));
        }
        if hk == 0 || !h.is_multiple_of(hk) {
            return Err(shape_err(format!(
                "Expected the number of query heads ({h}, query {qd:?}) to be a multiple of \
                 the number of key/value heads ({hk}, key {kd:?}) with enable_gqa"
            )));
        }
        let lead = broadcast(&qd[..qd.len() - 3], &kd[..kd.len() - 3], "query and key")?;
        let lead = broadcast(&lead, &vd[..vd.len() - 3], "query, key and value")?;
        geom(lead, true, h, hk)
    } else {
        let bs = broadcast(&qd[..qd.len() - 2], &kd[..kd.len() - 2], "query and key")?;
        let bs = broadcast(&bs, &vd[..vd.len() - 2], "query, key and value")?;
        match bs.split_last() {
            Some((&h, lead)) => geom(lead.to_vec(), true, h, h),
            None => geom(Vec::new(), false, 1, 1),
        }
    };
    if let Some(m) = &o.attn_mask {
        let md = m.dtype();
        if md != DType::Bool && md != DType::F32 && md != q.dtype() {
            return Err(invalid(format!(
                "Expected attn_mask dtype to be bool or float or to match query dtype, but \
                 got attn_mask.dtype: {md} and  query.dtype: {} instead.",
                q.dtype()
            )));
        }
        if m.device() != q.device() {
            return Err(invalid(format!(
                "Expected attn_mask to be on the query's device {}, but got {}",
                q.device(),
                m.device()
            )));
        }
        let w = g.weights();
        let ok = crate::broadcast_shape(OP, &m.shape(), &Shape::from(w.clone()))
            .is_ok_and(|b| b.dims() == w);
        if !ok {
            return Err(shape_err(format!(
                "expected attn_mask broadcastable to the attention weights {w:?} \
                 ([..., L, S]), but got attn_mask {:?}",
                m.dims()
            )));
        }
    }
    Ok(g)
}

/// Why the fused kernel cannot run this case (`None` where it can).
fn fused_blocker(q: &Tensor, g: &Geometry, mask: Option<&Tensor>, p: f64) -> Option<String> {
    if q.device().is_cuda() {
        if q.dtype() == DType::F64 {
            return Some("the CUDA kernels take f32, f16 and bf16, not f64".into());
        }
        if g.dim_qk == 0 && g.len_q * g.len_kv * g.dim_v > 0 {
            return Some("the CUDA kernels take no head dim E = 0".into());
        }
        if g.dim_qk > 256 || g.dim_v > 256 {
            return Some(format!(
                "the CUDA kernels take head dims up to 256, not E = {}, Ev = {}",
                g.dim_qk, g.dim_v
            ));
        }
    }
    if g.heads == 0 || g.kv_heads == 0 {
        return Some("no heads".into());
    }
    if p >= 1.0 {
        return Some("dropout_p = 1 drops every weight".into());
    }
    if let Some(m) = mask
        && m.dtype() != DType::Bool
        && needs_grad(&[m])
    {
        return Some("the kernels do not compute a float attn_mask's gradient".into());
    }
    None
}

impl Tensor {
    /// `F.scaled_dot_product_attention(query=self, key, value, ...)`: `softmax(q·kᵀ·scale +
    /// mask)·v` with dropout on the weights, q `[..., L, E]`, k `[..., S, E]`, v
    /// `[..., S, Ev]` (batch dims broadcast; with `enable_gqa` k and v may have fewer heads
    /// at dim -3), output `[..., L, Ev]`. A row whose every score is masked gives 0 (and 0
    /// gradients), as PyTorch's math path. Which implementation runs is
    /// [`backends::sdpa`](crate::backends::sdpa)'s choice.
    ///
    /// ```
    /// use ember_tensor::{SdpaOptions, Tensor};
    /// let q = Tensor::ones([2, 4, 3, 8], ())?;
    /// let kv = Tensor::ones([2, 4, 5, 8], ())?;
    /// let opts = SdpaOptions { is_causal: true, ..Default::default() };
    /// let out = q.scaled_dot_product_attention(&kv, &kv, &opts)?;
    /// assert_eq!(out.dims(), vec![2, 4, 3, 8]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn scaled_dot_product_attention(
        &self,
        key: &Tensor,
        value: &Tensor,
        opts: &SdpaOptions,
    ) -> Result<Tensor> {
        let float_mask = opts.attn_mask.as_ref().filter(|m| m.dtype().is_float());
        if let Some(c) = autocast_inputs(
            &crate::op_table::scaled_dot_product_attention,
            [self, key, value].into_iter().chain(float_mask),
        )? {
            let mut o = opts.clone();
            if float_mask.is_some() {
                o.attn_mask = c.get(3).cloned();
            }
            // The inputs are in the region's dtype now; the ops of the math path run in it
            // too (PyTorch runs an op's insides below the autocast key).
            let _off = set_autocast_policy(None);
            return c[0].scaled_dot_product_attention(&c[1], &c[2], &o);
        }
        let g = geometry(self, key, value, opts)?;
        let (q, k, v) = (self.raw(), key.raw(), value.raw());
        let mut inputs = vec![q.as_input(), k.as_input(), v.as_input()];
        let mask_raw = opts.attn_mask.as_ref().map(Tensor::raw);
        inputs.extend(mask_raw.as_ref().map(Raw::as_input));
        let _op = crate::profile::op(OP, &inputs);
        // A float mask in the operands' dtype (PyTorch accepts f32 with 16-bit operands).
        let mask = match &opts.attn_mask {
            Some(m) if m.dtype() != DType::Bool && m.dtype() != self.dtype() => {
                Some(m.to_dtype(self.dtype())?)
            }
            m => m.clone(),
        };
        let scale = opts.scale.unwrap_or(if g.dim_qk == 0 {
            1.0
        } else {
            1.0 / (g.dim_qk as f64).sqrt()
        });
        let blocker = fused_blocker(self, &g, mask.as_ref(), opts.dropout_p);
        let fused = match sdpa::kernel()? {
            SdpaKernel::Math => false,
            SdpaKernel::Auto => blocker.is_none(),
            SdpaKernel::Flash => match blocker {
                None => true,
                Some(why) => {
                    return Err(invalid(format!(
                        "the fused kernel was asked for (backends::sdpa Flash or \
                         EMBER_SDPA=flash) but cannot run this case: {why}"
                    )));
                }
            },
        };
        let c = Call {
            g,
            mask,
            scale,
            causal: opts.is_causal,
            p: opts.dropout_p,
        };
        if fused {
            c.fused(self, key, value)
        } else {
            c.math(self, key, value)
        }
    }
}

/// One attention, checked.
struct Call {
    g: Geometry,
    mask: Option<Tensor>,
    scale: f64,
    causal: bool,
    p: f64,
}

/// What the fused backward rebuilds the kernels' operands from.
struct FusedSaved {
    q: Saved,
    k: Saved,
    v: Saved,
    out: Saved,
    lse: Raw,
    mask: Option<Raw>,
    opts: AttnOptions,
    g: Geometry,
    need: [bool; 3],
}

impl Call {
    fn fused(&self, query: &Tensor, key: &Tensor, value: &Tensor) -> Result<Tensor> {
        let g = &self.g;
        let (b, h, l, s) = (g.batch(), g.heads, g.len_q, g.len_kv);
        let dropout = (self.p > 0.0).then(|| {
            let generator = crate::random::default_generator(query.device());
            let counters = ember_kernels::attention::dropout_counters(b, h, l, s);
            let (key, base) = generator.reserve(counters);
            AttnDropout {
                p: self.p,
                key,
                base,
            }
        });
        let opts = AttnOptions {
            scale: self.scale,
            causal: self.causal,
            dropout,
        };
        let mask = self
            .mask
            .as_ref()
            .map(|m| -> Result<Raw> {
                let w = g.weights();
                Ok(m.raw().expand(w)?.reshape([b, h, l, s])?)
            })
            .transpose()?;
        let fa = FusedAttention {
            q: g.four_d(&query.raw(), g.heads)?,
            k: g.four_d(&key.raw(), g.kv_heads)?,
            v: g.four_d(&value.raw(), g.kv_heads)?,
            mask: mask.clone(),
            opts,
        };
        let (out4, lse) = fa.forward()?;
        let out = out4.reshape(g.full(h, l, g.dim_v))?;
        let name = if query.device().is_cuda() {
            "ScaledDotProductFlashAttentionBackward0"
        } else {
            "ScaledDotProductFlashAttentionForCpuBackward0"
        };
        maybe_record(name, out, &[query, key, value], || {
            let saved = FusedSaved {
                q: Saved::of(name, query)?,
                k: Saved::of(name, key)?,
                v: Saved::of(name, value)?,
                out: Saved::new(name, &out4),
                lse,
                mask,
                opts,
                g: g.clone(),
                need: [
                    query.requires_grad(),
                    key.requires_grad(),
                    value.requires_grad(),
                ],
            };
            let f: BackwardFn = Box::new(move |grad| saved.backward(grad));
            Ok(f)
        })
    }

    /// PyTorch's `_scaled_dot_product_attention_math`: q and k each scaled by
    /// `sqrt(|scale|)`, the scores masked (bool: `-inf` where false; float: added; causal:
    /// `-inf` above the diagonal), a softmax that gives 0 for rows whose every score is
    /// `-inf` (PyTorch's `_safe_softmax`), dropout, the product with v.
    fn math(&self, query: &Tensor, key: &Tensor, value: &Tensor) -> Result<Tensor> {
        let g = &self.g;
        let dev = query.device();
        let inputs = [query.raw(), key.raw(), value.raw()];
        let _op = crate::profile::op(
            "_scaled_dot_product_attention_math",
            &inputs.iter().map(Raw::as_input).collect::<Vec<_>>(),
        );
        let _no_autocast = current_policy().map(|_| set_autocast_policy(None));
        let (key, value) = if g.heads != g.kv_heads {
            let rep = g.heads / g.kv_heads;
            (repeat_heads(key, rep)?, repeat_heads(value, rep)?)
        } else {
            (key.clone(), value.clone())
        };
        let root = self.scale.abs().sqrt();
        let qs = query.mul(root)?;
        let ks = key.mul(if self.scale < 0.0 { -root } else { root })?;
        let mut scores = qs.matmul(&ks.transpose(-2, -1)?)?;
        let masked = self.causal || self.mask.is_some();
        if self.causal {
            let (l, s) = (g.len_q, g.len_kv);
            let above: Vec<bool> = (0..l * s).map(|x| x % s > x / s).collect();
            let above = Tensor::wrap(Raw::from_vec(above, [l, s], Device::Cpu)?.to_device(dev)?);
            scores = scores.masked_fill(&above, f64::NEG_INFINITY)?;
        }
        match &self.mask {
            Some(m) if m.dtype() == DType::Bool => {
                scores = scores.masked_fill(&m.logical_not()?, f64::NEG_INFINITY)?;
            }
            Some(m) => scores = scores.add(m)?,
            None => {}
        }
        let weights = if masked && g.len_kv > 0 {
            // Rows whose every score is -inf: softmax of zeros there (finite, so no NaN
            // reaches the gradients), then 0.
            let last = scores.rank() - 1;
            let dead = scores.raw().amax((last, true))?.eq(f64::NEG_INFINITY)?;
            let dead = Tensor::wrap(dead);
            scores
                .masked_fill(&dead, 0.0)?
                .softmax(-1)?
                .masked_fill(&dead, 0.0)?
        } else {
            scores.softmax(-1)?
        };
        let weights = if self.p > 0.0 {
            weights.dropout(self.p, true)?
        } else {
            weights
        };
        weights.matmul(&value)
    }
}

/// `t.repeat_interleave(rep, dim=-3)` from recorded views (`[..., G, S, D]` to
/// `[..., G·rep, S, D]`, each kv head repeated `rep` times in a row).
fn repeat_heads(t: &Tensor, rep: usize) -> Result<Tensor> {
    let d = t.dims();
    let r = d.len();
    let mut wide = d.clone();
    wide.insert(r - 2, rep);
    let mut merged = d.clone();
    merged[r - 3] *= rep;
    t.unsqueeze(r - 2)?.expand(wide)?.reshape(merged)
}

impl FusedSaved {
    fn backward(&self, grad: &Raw) -> Result<Vec<Option<Raw>>> {
        let g = &self.g;
        let (q, k, v) = (self.q.get()?, self.k.get()?, self.v.get()?);
        let out = self.out.get()?;
        let fa = FusedAttention {
            q: g.four_d(&q, g.heads)?,
            k: g.four_d(&k, g.kv_heads)?,
            v: g.four_d(&v, g.kv_heads)?,
            mask: self.mask.clone(),
            opts: self.opts,
        };
        let dims = out.dims().to_vec();
        let mut dout = grad.to_dtype(q.dtype())?.reshape(dims)?;
        if g.dim_v > 1 && dout.strides()[3] != 1 {
            dout = dout.contiguous()?;
        }
        let (dq, dk, dv) = fa.backward(&out, &self.lse, &dout)?;
        let back = |d: Raw, heads: usize, x: &Raw, need: bool| -> Result<Option<Raw>> {
            if !need {
                return Ok(None);
            }
            let xd = x.dims();
            let (len, dim) = (xd[xd.len() - 2], xd[xd.len() - 1]);
            let d = d.reshape(g.full(heads, len, dim))?;
            Ok(Some(sum_to(&d, xd)?))
        };
        Ok(vec![
            back(dq, g.heads, &q, self.need[0])?,
            back(dk, g.kv_heads, &k, self.need[1])?,
            back(dv, g.kv_heads, &v, self.need[2])?,
        ])
    }
}
