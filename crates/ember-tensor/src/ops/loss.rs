//! `nll_loss` and `cross_entropy` with a fused backward.
//!
//! `cross_entropy` records one op over the fused kernels of `ember-tensor`
//! (`Tensor::cross_entropy_forward` / `cross_entropy_backward`: one kernel each way, the
//! backward computing the formula below per score); `nll_loss`'s backward is built from
//! tensor ops (`coefficients`).
//!
//! Note [Cross-entropy backward]: per target element `i` (a row of scores along the class
//! dim) the loss is `-Σ_c a_ic·logp_ic` with `a_ic = valid_i·((1-ε)·w_{t_i}·[c = t_i] +
//! (ε/C)·w_c)` (ε the label smoothing, `w` the class weights or 1, `valid_i` 0 where the
//! target is `ignore_index`). With `logp = log_softmax(x)` the gradient is
//! `∂L_i/∂x_ij = p_ij·Σ_c a_ic - a_ij`: one softmax and no log of a probability, so it is
//! as stable as the forward. Mean reduction divides by `Σ_i valid_i·w_{t_i}`, as the
//! forward does. For `nll_loss` (input already log-probabilities) it is `-a_ij` with ε = 0.

use crate::raw::loss::{CrossEntropyOptions, NllLossOptions};
use crate::{DType, RawTensor as Raw, Reduction};

use crate::autograd::error::Result;
use crate::autograd::graph::{Saved, maybe_record};
use crate::autograd::mode::autocast_inputs;
use crate::ops::bw1;
use crate::tensor::Tensor;

/// What the backward needs besides the saved input.
struct LossSpec {
    target: Raw,
    weight: Option<Raw>,
    ignore_index: i64,
    reduction: Reduction,
    smoothing: f64,
}

/// The coefficients `a` of Note [Cross-entropy backward] as `[N, C, L]`, and the mean
/// denominator `Σ valid·w[t]`.
fn coefficients(spec: &LossSpec, dtype: DType, n: usize, c: usize, l: usize) -> Result<(Raw, Raw)> {
    let t = spec.target.reshape([n, l])?.to_dtype(DType::I64)?;
    let valid = t.ne(spec.ignore_index)?;
    let tc = crate::raw::binary::r#where(&valid, &t, 0)?.to_dtype(DType::I64)?;
    let validf = valid.to_dtype(dtype)?;
    let w_t = match &spec.weight {
        Some(w) => w
            .to_dtype(dtype)?
            .index_select(0, &tc.flatten_all()?)?
            .reshape([n, l])?,
        None => validf.ones_like()?,
    };
    let a_t = w_t.mul(&validf)?; // [N, L]
    let total = a_t.sum_all()?;
    let onehot = tc
        .one_hot(Some(c))?
        .to_dtype(dtype)?
        .permute([0usize, 2, 1])?; // [N, C, L]
    let mut a = onehot.mul(&a_t.unsqueeze(1)?)?;
    if spec.smoothing > 0.0 {
        a = a.mul(1.0 - spec.smoothing)?;
        let wc = match &spec.weight {
            Some(w) => w.to_dtype(dtype)?.reshape([1, c, 1])?,
            None => Raw::ones([1, c, 1], (t.device(), dtype))?,
        };
        let smooth = wc
            .mul(spec.smoothing / c as f64)?
            .mul(&validf.unsqueeze(1)?)?;
        a = a.add(&smooth)?;
    }
    Ok((a, total))
}

/// The upstream gradient as a per-element scale broadcastable to `[N, 1, L]`.
fn scale(spec: &LossSpec, g: &Raw, total: &Raw, n: usize, l: usize) -> Result<Raw> {
    Ok(match spec.reduction {
        Reduction::None => g.reshape([n, 1, l])?,
        Reduction::Sum => g.clone(),
        Reduction::Mean => g.div(total)?,
    })
}

impl Tensor {
    /// `torch.nn.functional.nll_loss` of log-probabilities (`[C]`, `[N, C]` or
    /// `[N, C, d...]`) at class indices `target` (the weight gets no gradient).
    pub fn nll_loss(&self, target: &Tensor, opts: &NllLossOptions<'_>) -> Result<Tensor> {
        if let Some(c) = autocast_inputs("nll_loss", [self])? {
            return c[0].nll_loss(target, opts);
        }
        let x = self.raw();
        let t = target.raw();
        let weight = opts.weight.map(Tensor::raw);
        let y = x.nll_loss(&t, &opts.with_weight(weight.as_ref()))?;
        let spec = LossSpec {
            target: t,
            weight,
            ignore_index: opts.ignore_index,
            reduction: opts.reduction,
            smoothing: 0.0,
        };
        let shape = x.shape().clone();
        maybe_record("NllLossBackward0", y, &[self], || {
            Ok(bw1(move |g| {
                let dtype = g.dtype();
                let (n, c, l) = match shape.dims().len() {
                    1 => (1, shape.dims()[0], 1),
                    _ => (
                        shape.dims()[0],
                        shape.dims()[1],
                        shape.dims()[2..].iter().product(),
                    ),
                };
                let (a, total) = coefficients(&spec, dtype, n, c, l)?;
                let s = scale(&spec, &g.to_dtype(dtype)?, &total, n, l)?;
                Ok(a.neg()?.mul(&s)?.reshape(&shape)?)
            }))
        })
    }

    /// `torch.nn.functional.cross_entropy` of scores (`[C]`, `[N, C]` or `[N, C, d...]`)
    /// at class indices `target`, with weights, `ignore_index`, label smoothing and
    /// reduction; backward is fused (Note [Cross-entropy backward]).
    pub fn cross_entropy(&self, target: &Tensor, opts: &CrossEntropyOptions<'_>) -> Result<Tensor> {
        if let Some(c) = autocast_inputs("cross_entropy", [self])? {
            return c[0].cross_entropy(target, opts);
        }
        let x = self.raw();
        let t = target.raw();
        let weight = opts.nll.weight.map(Tensor::raw);
        let raw_opts = opts.with_weight(weight.as_ref());
        let (y, saved) = x.cross_entropy_forward(&t, &raw_opts)?;
        let (ignore_index, reduction) = (opts.nll.ignore_index, opts.nll.reduction);
        let smoothing = opts.label_smoothing;
        maybe_record("CrossEntropyLossBackward0", y, &[self], || {
            let sx = Saved::of("CrossEntropyLossBackward0", self)?;
            Ok(bw1(move |g| {
                let x = sx.get()?;
                let o = crate::CrossEntropyOptions::new()
                    .ignore_index(ignore_index)
                    .reduction(reduction)
                    .label_smoothing(smoothing);
                let o = match &weight {
                    Some(w) => o.weight(w),
                    None => o,
                };
                Ok(x.cross_entropy_backward(&t, &o, &saved, g)?)
            }))
        })
    }
}
