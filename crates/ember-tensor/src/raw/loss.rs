//! `nll_loss` and `cross_entropy` with class-index targets, PyTorch's semantics: per-class
//! `weight`, `ignore_index`, `label_smoothing`, and mean/sum/none reduction where the mean
//! divides by the summed weights of the non-ignored targets (all ignored: NaN).
//!
//! `nll_loss` is one kernel primitive, [`Tensor::nll_loss_terms`] (per element `-w[t]·x[t]`
//! and `w[t]`), then the reduction. `cross_entropy` is fused (`backend_fused.rs`): one
//! forward kernel reads each row of scores once and writes one loss per row (and the row's
//! `logsumexp` for the backward), then the reduction; [`Tensor::cross_entropy_backward`] is
//! one kernel writing the scores' gradient once. The autograd layer records the pair as one
//! op (Note [Cross-entropy backward] in `ember-autograd`).

use crate::backend_fused::{CeBackward, CeOperands};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::params::CrossEntropyParams;
use crate::raw::{RawTensor, same_device};
use crate::storage::{Storage, read_many};

/// How a loss reduces its per-element values (PyTorch's `reduction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The per-element losses, shaped like the target.
    None,
    /// Their weighted mean (the default).
    #[default]
    Mean,
    /// Their sum.
    Sum,
}

/// `()` is PyTorch's default reduction, the mean.
impl From<()> for Reduction {
    fn from(_: ()) -> Self {
        Reduction::Mean
    }
}

/// Options of [`Tensor::nll_loss`]: per-class `weight` (`[C]`), `ignore_index` (default
/// -100), `reduction` (default mean). `T` is the tensor type of the weight: this crate's
/// tensor here, the autograd tensor for `ember::Tensor`'s losses.
#[derive(Debug)]
pub struct NllLossOptions<'a, T = crate::Tensor> {
    /// A weight per class, `[C]`, floating.
    pub weight: Option<&'a T>,
    /// Targets equal to this contribute nothing (loss 0, weight 0).
    pub ignore_index: i64,
    /// How to reduce.
    pub reduction: Reduction,
}

impl<T> Clone for NllLossOptions<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for NllLossOptions<'_, T> {}

impl<T> From<()> for NllLossOptions<'_, T> {
    fn from(_: ()) -> Self {
        Self::default()
    }
}
impl<'a, T> From<&NllLossOptions<'a, T>> for NllLossOptions<'a, T> {
    fn from(o: &NllLossOptions<'a, T>) -> Self {
        *o
    }
}

impl<T> Default for NllLossOptions<'_, T> {
    fn default() -> Self {
        NllLossOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

impl<'a, T> NllLossOptions<'a, T> {
    /// PyTorch's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same options with the weight mapped to another tensor type (`weight` is where
    /// the mapped weight lives).
    pub fn with_weight<'b, U>(&self, weight: Option<&'b U>) -> NllLossOptions<'b, U> {
        NllLossOptions {
            weight,
            ignore_index: self.ignore_index,
            reduction: self.reduction,
        }
    }

    /// Sets the per-class weight.
    pub fn weight(mut self, w: &'a T) -> Self {
        self.weight = Some(w);
        self
    }

    /// Sets `ignore_index`.
    pub fn ignore_index(mut self, i: i64) -> Self {
        self.ignore_index = i;
        self
    }

    /// Sets the reduction.
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
}

/// Options of [`Tensor::cross_entropy`]: those of [`NllLossOptions`] plus
/// `label_smoothing` in `[0, 1]` (default 0).
#[derive(Debug)]
pub struct CrossEntropyOptions<'a, T = crate::Tensor> {
    /// Weight, `ignore_index` and reduction, as for `nll_loss`.
    pub nll: NllLossOptions<'a, T>,
    /// The target becomes `(1 - ε)·one_hot + ε / C` (ε in `[0, 1]`).
    pub label_smoothing: f64,
}

impl<T> Clone for CrossEntropyOptions<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for CrossEntropyOptions<'_, T> {}

impl<T> From<()> for CrossEntropyOptions<'_, T> {
    fn from(_: ()) -> Self {
        Self::default()
    }
}
impl<'a, T> From<&CrossEntropyOptions<'a, T>> for CrossEntropyOptions<'a, T> {
    fn from(o: &CrossEntropyOptions<'a, T>) -> Self {
        *o
    }
}

impl<T> Default for CrossEntropyOptions<'_, T> {
    fn default() -> Self {
        CrossEntropyOptions {
            nll: NllLossOptions::default(),
            label_smoothing: 0.0,
        }
    }
}

impl<'a, T> CrossEntropyOptions<'a, T> {
    /// PyTorch's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same options with the weight mapped to another tensor type.
    pub fn with_weight<'b, U>(&self, weight: Option<&'b U>) -> CrossEntropyOptions<'b, U> {
        CrossEntropyOptions {
            nll: self.nll.with_weight(weight),
            label_smoothing: self.label_smoothing,
        }
    }

    /// Sets the per-class weight.
    pub fn weight(mut self, w: &'a T) -> Self {
        self.nll.weight = Some(w);
        self
    }

    /// Sets `ignore_index`.
    pub fn ignore_index(mut self, i: i64) -> Self {
        self.nll.ignore_index = i;
        self
    }

    /// Sets the reduction.
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.nll.reduction = r;
        self
    }

    /// Sets `label_smoothing`.
    pub fn label_smoothing(mut self, eps: f64) -> Self {
        self.label_smoothing = eps;
        self
    }
}

/// Checked and reshaped operands: input `[N, C, L]` (in the compute dtype, f32 or f64, when
/// widened; else in its own dtype, contiguous) and target `[N, L]`, the weight `[C]` cast to
/// the compute dtype.
struct Prepared {
    x: RawTensor,
    target: RawTensor,
    weight: Option<RawTensor>,
    compute: DType,
}

fn prepare(
    op: &'static str,
    input: &RawTensor,
    target: &RawTensor,
    weight: Option<&RawTensor>,
    widen: bool,
) -> Result<Prepared> {
    let mut all = vec![input, target];
    all.extend(weight);
    same_device(&all)?;
    let (xs, ts) = (input.shape(), target.shape());
    let compute = match input.dtype() {
        DType::F64 => DType::F64,
        DType::F32 | DType::F16 | DType::Bf16 => DType::F32,
        d => {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: d,
                hint: "the input must hold floating-point scores",
            });
        }
    };
    if !matches!(target.dtype(), DType::I64 | DType::I32) {
        return Err(TensorError::invalid(
            op,
            format!(
                "expected a target of class indices of dtype torch.int64 or torch.int32, but found {}{}",
                target.dtype(),
                if op == "cross_entropy" {
                    " (class probabilities, a floating target of the input's shape, go through the autograd Tensor::cross_entropy, not the fused kernel)"
                } else {
                    ""
                }
            ),
        ));
    }
    let shape_err = |msg: String| TensorError::ShapeMismatch { op, msg };
    let (n, c, rest): (usize, usize, &[usize]) = match input.dims() {
        [] => {
            return Err(shape_err(format!(
                "expected input of shape [C], [N, C] or [N, C, d1, ...], but got a 0-D input (target {ts})"
            )));
        }
        [c] => (1, *c, &[]),
        [n, c, rest @ ..] => (*n, *c, rest),
    };
    let expected: Vec<usize> = if input.rank() == 1 {
        Vec::new()
    } else {
        std::iter::once(n).chain(rest.iter().copied()).collect()
    };
    if target.dims() != expected.as_slice() {
        return Err(shape_err(if input.rank() == 2 && target.rank() == 1 {
            format!(
                "expected input batch_size ({n}) to match target batch_size ({}) (input {xs}, target {ts})",
                target.dims()[0]
            )
        } else {
            format!(
                "expected target of shape {} for input {xs}, but got target {ts}",
                crate::shape::Shape::from(expected)
            )
        }));
    }
    let weight = match weight {
        None => None,
        Some(w) => {
            if w.dims() != [c] {
                return Err(shape_err(format!(
                    "weight tensor should be defined either for all {c} classes or no classes but got weight tensor of shape {} (input {xs})",
                    w.shape()
                )));
            }
            if !w.dtype().is_float() {
                return Err(TensorError::UnsupportedDType {
                    op,
                    dtype: w.dtype(),
                    hint: "the class weight must be floating point",
                });
            }
            Some(w.to_dtype(compute)?)
        }
    };
    let l: usize = rest.iter().product();
    let x = if widen {
        input.to_dtype(compute)?.reshape([n, c, l])?
    } else {
        input.contiguous()?.reshape([n, c, l])?
    };
    Ok(Prepared {
        x,
        target: target.reshape([n, l])?,
        weight,
        compute,
    })
}

impl Prepared {
    /// `(-w[t]·x[t], w[t])` per element, `[N, L]`, in the compute dtype.
    fn terms(&self, ignore_index: i64) -> Result<(RawTensor, RawTensor)> {
        let (lx, lt) = (self.x.layout().clone(), self.target.layout().clone());
        let (loss, w) = match &self.weight {
            None => read_many(&[self.x.cell(), self.target.cell()], |s| {
                s[0].nll_loss(&lx, s[1], &lt, None, ignore_index)
            })?,
            Some(wt) => {
                let lw = wt.layout().clone();
                read_many(&[self.x.cell(), self.target.cell(), wt.cell()], |s| {
                    s[0].nll_loss(&lx, s[1], &lt, Some((s[2], &lw)), ignore_index)
                })?
            }
        };
        let shape = self.target.shape().clone();
        Ok((
            RawTensor::from_storage(loss, shape.clone()),
            RawTensor::from_storage(w, shape),
        ))
    }

    /// Runs `f` on the fused kernels' operands and `extra` storages (read-locked with them).
    fn with_operands<R>(
        &self,
        extra: &[&RawTensor],
        f: impl FnOnce(&CeOperands<'_>, &[&Storage]) -> Result<R>,
    ) -> Result<R> {
        let (lx, lt) = (self.x.layout().clone(), self.target.layout().clone());
        let lw = self.weight.as_ref().map(|w| w.layout().clone());
        let mut cells = vec![self.x.cell(), self.target.cell()];
        cells.extend(self.weight.as_ref().map(RawTensor::cell));
        cells.extend(extra.iter().map(|t| t.cell()));
        read_many(&cells, |s| {
            let k = 2 + usize::from(lw.is_some());
            let ops = CeOperands {
                x: (s[0], &lx),
                target: (s[1], &lt),
                weight: lw.as_ref().map(|l| (s[2], l)),
            };
            f(&ops, s.get(k..).unwrap_or(&[]))
        })
    }
}

/// Checks label smoothing's ε (PyTorch's message).
pub(crate) fn check_smoothing(eps: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&eps) {
        return Err(TensorError::invalid(
            "cross_entropy",
            format!("label_smoothing must be between 0.0 and 1.0, got {eps}"),
        ));
    }
    Ok(())
}

/// What [`Tensor::cross_entropy_backward`] reads from the forward
/// ([`Tensor::cross_entropy_forward`]): each row's `logsumexp` of the scores and, under mean
/// reduction, the divisor `Σ w[t]`, both in the compute dtype.
#[derive(Clone, Debug)]
pub struct CrossEntropySaved {
    lse: RawTensor,
    total: Option<RawTensor>,
}

impl RawTensor {
    /// The unreduced pieces of the negative log-likelihood of log-probabilities `self`
    /// (`[C]`, `[N, C]` or `[N, C, d1, ...]`) at class indices `target` (`[]`, `[N]` or
    /// `[N, d1, ...]`, i64 or i32): per target element the loss `-w[t]·self[.., t, ..]`
    /// and the weight `w[t]` it used (`w = 1` without `weight`), both 0 where
    /// `t == ignore_index`; shaped like the target, in f32 (f64 for f64 input). `nll_loss`
    /// reduces these; its mean is `Σ loss / Σ w`. A target outside `[0, C)` is an error
    /// naming it.
    pub fn nll_loss_terms(
        &self,
        target: &RawTensor,
        weight: Option<&RawTensor>,
        ignore_index: i64,
    ) -> Result<(RawTensor, RawTensor)> {
        let p = prepare("nll_loss", self, target, weight, true)?;
        let (l, w) = p.terms(ignore_index)?;
        Ok((l.reshape(target.shape())?, w.reshape(target.shape())?))
    }

    /// `torch.nn.functional.nll_loss` of log-probabilities `self` (`[C]`, `[N, C]` or
    /// `[N, C, d1, ...]`) at class indices `target` (`[]`, `[N]`, `[N, d1, ...]`; i64 or
    /// i32). The result has `self`'s dtype (f16/bf16 compute in f32).
    ///
    /// ```
    /// use ember_tensor::{Device, NllLossOptions, Reduction, Tensor};
    /// let logp = Tensor::from_vec(vec![-1f32, -2., -3., -0.5, -1.5, -2.5], [2, 3], &Device::Cpu)?;
    /// let t = Tensor::new(&[2i64, 0], &Device::Cpu)?;
    /// assert_eq!(logp.nll_loss(&t, &NllLossOptions::new())?.item::<f32>()?, 1.75); // (3 + 0.5) / 2
    /// let w = Tensor::new(&[1f32, 1., 3.], &Device::Cpu)?;
    /// let o = NllLossOptions::new().weight(&w).reduction(Reduction::Mean);
    /// assert_eq!(logp.nll_loss(&t, &o)?.item::<f32>()?, 2.375); // (9 + 0.5) / 4
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn nll_loss(
        &self,
        target: &RawTensor,
        opts: &NllLossOptions<'_, RawTensor>,
    ) -> Result<RawTensor> {
        let _op = crate::profile::op("nll_loss", &[self.as_input(), target.as_input()]);
        let p = prepare("nll_loss", self, target, opts.weight, true)?;
        let (loss, w) = p.terms(opts.ignore_index)?;
        let r = match opts.reduction {
            Reduction::None => loss.reshape(target.shape())?,
            Reduction::Sum => loss.sum_all()?,
            Reduction::Mean => loss.sum_all()?.div(&w.sum_all()?)?,
        };
        r.to_dtype(self.dtype())
    }

    /// [`Tensor::cross_entropy`] and what its backward needs: one fused kernel per row of
    /// scores (the row read once: its max, `ln Σ exp`, the target's log-probability, the
    /// smoothing term, one loss), then the reduction. f16/bf16 scores are read as such and
    /// computed in f32.
    pub fn cross_entropy_forward(
        &self,
        target: &RawTensor,
        opts: &CrossEntropyOptions<'_, RawTensor>,
    ) -> Result<(RawTensor, CrossEntropySaved)> {
        let _op = crate::profile::op("cross_entropy_loss", &[self.as_input(), target.as_input()]);
        check_smoothing(opts.label_smoothing)?;
        let nll = &opts.nll;
        let p = prepare("cross_entropy", self, target, nll.weight, false)?;
        let params = CrossEntropyParams {
            ignore_index: nll.ignore_index,
            smoothing: opts.label_smoothing,
        };
        let (loss, w, lse) = p.with_operands(&[], |ops, _| ops.cross_entropy_fwd(&params))?;
        let shape = p.target.shape().clone();
        let rows = shape.numel();
        // On CUDA the mean of up to 2^16 rows is one launch (`cross_entropy_mean`) where
        // the reductions and the division below take three.
        let fused_mean = match nll.reduction {
            Reduction::Mean => Storage::cross_entropy_mean(&loss, &w, rows)?.map(|(m, t)| {
                let scalar = || crate::shape::Shape::scalar();
                (
                    RawTensor::from_storage(m, scalar()),
                    RawTensor::from_storage(t, scalar()),
                )
            }),
            _ => None,
        };
        let loss = RawTensor::from_storage(loss, shape.clone());
        let lse = RawTensor::from_storage(lse, shape.clone());
        let (r, total) = match (nll.reduction, fused_mean) {
            (Reduction::None, _) => (loss.reshape(target.shape())?, None),
            (Reduction::Sum, _) => (loss.sum_all()?, None),
            (Reduction::Mean, Some((mean, tw))) => (mean, Some(tw)),
            (Reduction::Mean, None) => {
                let tw = RawTensor::from_storage(w, shape).sum_all()?;
                (loss.sum_all()?.div(&tw)?, Some(tw))
            }
        };
        Ok((r.to_dtype(self.dtype())?, CrossEntropySaved { lse, total }))
    }

    /// The gradient of [`Tensor::cross_entropy`] with respect to the scores `self`, for the
    /// upstream gradient `grad` (shaped like the loss): one fused kernel writing
    /// `scale·(softmax(self)·A - a)` per score (Note [Cross-entropy backward] in
    /// `ember-autograd`), in `self`'s dtype and shape. `saved` comes from
    /// [`Tensor::cross_entropy_forward`] with the same operands and options.
    pub fn cross_entropy_backward(
        &self,
        target: &RawTensor,
        opts: &CrossEntropyOptions<'_, RawTensor>,
        saved: &CrossEntropySaved,
        grad: &RawTensor,
    ) -> Result<RawTensor> {
        let _op = crate::profile::op(
            "cross_entropy_loss_backward",
            &[grad.as_input(), self.as_input(), target.as_input()],
        );
        check_smoothing(opts.label_smoothing)?;
        let nll = &opts.nll;
        let p = prepare("cross_entropy", self, target, nll.weight, false)?;
        same_device(&[self, grad])?;
        let per_row = nll.reduction == Reduction::None;
        let rows = p.target.numel();
        if grad.numel() != if per_row { rows } else { 1 } || saved.lse.numel() != rows {
            return Err(TensorError::ShapeMismatch {
                op: "cross_entropy_backward",
                msg: format!(
                    "expected a gradient shaped like the loss ({} elements) and the forward's saved rows ({rows}), but got gradient {} and {} saved rows",
                    if per_row { rows } else { 1 },
                    grad.shape(),
                    saved.lse.numel()
                ),
            });
        }
        let g = crate::raw::norm::from_start(grad.to_dtype(p.compute)?)?;
        let wsum = match &p.weight {
            Some(w) if opts.label_smoothing != 0.0 => Some(w.sum_all()?),
            _ => None,
        };
        let mut extra = vec![&saved.lse, &g];
        extra.extend(saved.total.as_ref());
        extra.extend(wsum.as_ref());
        let has_total = saved.total.is_some();
        let params = CrossEntropyParams {
            ignore_index: nll.ignore_index,
            smoothing: opts.label_smoothing,
        };
        let dx = p.with_operands(&extra, |ops, s| {
            let b = CeBackward {
                lse: s[0],
                grad: (s[1], per_row),
                total: has_total.then(|| s[2]),
                wsum: wsum.as_ref().map(|_| s[2 + usize::from(has_total)]),
            };
            ops.cross_entropy_bwd(&b, &params)
        })?;
        RawTensor::from_storage(dx, p.x.shape().clone()).reshape(self.shape())
    }
}
