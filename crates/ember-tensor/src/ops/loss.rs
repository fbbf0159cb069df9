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

use crate::raw::loss::{CrossEntropyOptions, NllLossOptions, check_smoothing};
use crate::{DType, RawTensor as Raw, Reduction, TensorError};

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
        if let Some(c) = autocast_inputs(&crate::op_table::nll_loss, [self])? {
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
    /// at class indices `target` (i64 or i32, the input's shape without the class dim),
    /// with weights, `ignore_index`, label smoothing and reduction; backward is fused
    /// (Note [Cross-entropy backward]). A floating `target` of the input's shape holds
    /// class probabilities instead (Note [Class-probability targets]).
    ///
    /// ```
    /// use ember_tensor::{CrossEntropyOptions, Tensor};
    /// let x = Tensor::from_vec(vec![0f64, 0., 0., 1., 2., 3.], [2, 3], ())?;
    /// let probs = Tensor::from_vec(vec![1f64, 0., 0., 0., 0., 1.], [2, 3], ())?;
    /// let classes = Tensor::new(&[0i64, 2], ())?;
    /// let o = CrossEntropyOptions::new();
    /// let (a, b) = (x.cross_entropy(&probs, &o)?, x.cross_entropy(&classes, &o)?);
    /// assert!((a.item::<f64>()? - b.item::<f64>()?).abs() < 1e-12); // one-hot = indices
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn cross_entropy(&self, target: &Tensor, opts: &CrossEntropyOptions<'_>) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::cross_entropy, [self])? {
            return c[0].cross_entropy(target, opts);
        }
        if target.dtype().is_float() || (self.rank() > 0 && self.dims() == target.dims()) {
            return self.cross_entropy_probs(target, opts);
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

    /// Note [Class-probability targets]: as PyTorch's `cross_entropy_loss_prob_target`, a
    /// floating `target` shaped like the scores `x` gives per row `-Σ_c w_c·y_c·logp_c`
    /// with `logp = log_softmax(x)` over the class dim and `y = (1 - ε)·target + ε/C` under
    /// label smoothing ε. `Mean` divides the sum by the number of rows (`numel / C`, NaN for
    /// none), not by the weights; `ignore_index` must stay negative (it has no meaning for
    /// probabilities). Composed of recorded ops, so autograd differentiates it with respect
    /// to `x`, and to `target` where that requires grad.
    fn cross_entropy_probs(
        &self,
        target: &Tensor,
        opts: &CrossEntropyOptions<'_>,
    ) -> Result<Tensor> {
        const OP: &str = "cross_entropy";
        let (xs, ts) = (self.shape(), target.shape());
        if !self.dtype().is_float() {
            return Err(TensorError::UnsupportedDType {
                op: OP,
                dtype: self.dtype(),
                hint: "the input must hold floating-point scores",
            }
            .into());
        }
        if self.rank() == 0 {
            return Err(TensorError::ShapeMismatch {
                op: OP,
                msg: format!(
                    "expected input of shape [C], [N, C] or [N, C, d1, ...], but got a 0-D input (target {ts})"
                ),
            }
            .into());
        }
        if !target.dtype().is_float() {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "Expected floating point type for target with class probabilities, got {} (a target of the input's shape {xs} holds class probabilities; class indices have the input's shape without the class dim)",
                    target.dtype()
                ),
            )
            .into());
        }
        if xs != ts {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "expected a target of class probabilities shaped like the input {xs}, or class indices of dtype torch.int64 or torch.int32, but got a {} target of shape {ts}",
                    target.dtype()
                ),
            )
            .into());
        }
        if opts.nll.ignore_index >= 0 {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "ignore_index is not supported for floating point target (got ignore_index {})",
                    opts.nll.ignore_index
                ),
            )
            .into());
        }
        check_smoothing(opts.label_smoothing)?;
        let class_dim = usize::from(self.rank() > 1);
        let c = self.dims()[class_dim];
        let eps = opts.label_smoothing;
        let logp = self.log_softmax(class_dim)?;
        let y = if eps > 0.0 {
            target.mul(1.0 - eps)?.add(eps / c as f64)?
        } else {
            target.clone()
        };
        let mut terms = logp.mul(&y)?;
        if let Some(w) = opts.nll.weight {
            if w.dims() != [c] {
                return Err(TensorError::ShapeMismatch {
                    op: OP,
                    msg: format!(
                        "weight tensor should be defined either for all {c} classes or no classes but got weight tensor of shape {} (input {xs})",
                        w.shape()
                    ),
                }
                .into());
            }
            if !w.dtype().is_float() {
                return Err(TensorError::UnsupportedDType {
                    op: OP,
                    dtype: w.dtype(),
                    hint: "the class weight must be floating point",
                }
                .into());
            }
            let mut along = vec![1usize; self.rank()];
            along[class_dim] = c;
            terms = terms.mul(&w.reshape(along)?)?;
        }
        match opts.nll.reduction {
            Reduction::None => terms.sum(class_dim)?.neg(),
            Reduction::Sum => terms.sum_all()?.neg(),
            Reduction::Mean => {
                // Rows: every element but the class dim's (0/0 = NaN for none, as PyTorch).
                let rows = self.numel().checked_div(c).unwrap_or(0);
                terms.sum_all()?.neg()?.div(rows as f64)
            }
        }
    }
}
