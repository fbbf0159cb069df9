//! `nll_loss` and `cross_entropy` with class-index targets, PyTorch's semantics: per-class
//! `weight`, `ignore_index`, `label_smoothing`, and mean/sum/none reduction where the mean
//! divides by the summed weights of the non-ignored targets (all ignored: NaN).
//!
//! Built from one kernel primitive, [`Tensor::nll_loss_terms`] (per element `-w[t]·x[t]`
//! and `w[t]`), and existing ops: `cross_entropy` is `log_softmax`, then that primitive,
//! then the smoothing term `-Σ_c w_c·logp_c` as a mul and a sum. So the autograd layer
//! rebuilds both losses from differentiable pieces (`log_softmax` and the primitive, whose
//! gradient is `-w[t]` at `t`), and the log-probabilities stay reachable there. Without
//! label smoothing the first two steps are one backend call, which the CPU fuses: per row
//! the max and `ln Σ exp`, and `log_softmax` only at the target, never written out.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{Storage, read_many};
use crate::tensor::{Tensor, same_device};

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
pub struct NllLossOptions<'a, T = Tensor> {
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
pub struct CrossEntropyOptions<'a, T = Tensor> {
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

/// [`Storage::nll_loss`] or [`Storage::log_softmax_nll_loss`].
type NllKernel = fn(
    &Storage,
    &Layout,
    &Storage,
    &Layout,
    Option<(&Storage, &Layout)>,
    i64,
) -> Result<(Storage, Storage)>;

/// Checked and reshaped operands: input `[N, C, L]` and target `[N, L]` in the compute
/// dtype (f32 or f64), the weight `[C]` cast to it.
struct Prepared {
    x: Tensor,
    target: Tensor,
    weight: Option<Tensor>,
    classes: usize,
}

fn prepare(
    op: &'static str,
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
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
                "expected a target of class indices of dtype torch.int64 or torch.int32, but found {} (class-probability targets are not supported)",
                target.dtype()
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
    Ok(Prepared {
        x: input.to_dtype(compute)?.reshape([n, c, l])?,
        target: target.reshape([n, l])?,
        weight,
        classes: c,
    })
}

impl Prepared {
    /// `(-w[t]·x[t], w[t])` per element, `[N, L]`, in the compute dtype.
    fn terms(&self, ignore_index: i64) -> Result<(Tensor, Tensor)> {
        self.terms_by(ignore_index, Storage::nll_loss)
    }

    /// [`Prepared::terms`] of `log_softmax(x, 1)`, which the backend may fuse (the CPU
    /// never writes the log-probabilities out).
    fn log_softmax_terms(&self, ignore_index: i64) -> Result<(Tensor, Tensor)> {
        self.terms_by(ignore_index, Storage::log_softmax_nll_loss)
    }

    fn terms_by(&self, ignore_index: i64, kernel: NllKernel) -> Result<(Tensor, Tensor)> {
        let (lx, lt) = (self.x.layout().clone(), self.target.layout().clone());
        let (loss, w) = match &self.weight {
            None => read_many(&[self.x.cell(), self.target.cell()], |s| {
                kernel(s[0], &lx, s[1], &lt, None, ignore_index)
            })?,
            Some(wt) => {
                let lw = wt.layout().clone();
                read_many(&[self.x.cell(), self.target.cell(), wt.cell()], |s| {
                    kernel(s[0], &lx, s[1], &lt, Some((s[2], &lw)), ignore_index)
                })?
            }
        };
        let shape = self.target.shape().clone();
        Ok((
            Tensor::from_storage(loss, shape.clone()),
            Tensor::from_storage(w, shape),
        ))
    }
}

impl Tensor {
    /// The unreduced pieces of the negative log-likelihood of log-probabilities `self`
    /// (`[C]`, `[N, C]` or `[N, C, d1, ...]`) at class indices `target` (`[]`, `[N]` or
    /// `[N, d1, ...]`, i64 or i32): per target element the loss `-w[t]·self[.., t, ..]`
    /// and the weight `w[t]` it used (`w = 1` without `weight`), both 0 where
    /// `t == ignore_index`; shaped like the target, in f32 (f64 for f64 input). `nll_loss`
    /// reduces these; its mean is `Σ loss / Σ w`. A target outside `[0, C)` is an error
    /// naming it.
    pub fn nll_loss_terms(
        &self,
        target: &Tensor,
        weight: Option<&Tensor>,
        ignore_index: i64,
    ) -> Result<(Tensor, Tensor)> {
        let p = prepare("nll_loss", self, target, weight)?;
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
    /// # Ok::<(), ember_tensor::TensorError>(())
    /// ```
    pub fn nll_loss(&self, target: &Tensor, opts: &NllLossOptions<'_>) -> Result<Tensor> {
        let _op = crate::profile::op("nll_loss", &[self.as_input(), target.as_input()]);
        let p = prepare("nll_loss", self, target, opts.weight)?;
        let (loss, w) = p.terms(opts.ignore_index)?;
        let r = match opts.reduction {
            Reduction::None => loss.reshape(target.shape())?,
            Reduction::Sum => loss.sum_all()?,
            Reduction::Mean => loss.sum_all()?.div(&w.sum_all()?)?,
        };
        r.to_dtype(self.dtype())
    }

    /// `torch.nn.functional.cross_entropy` of unnormalised scores `self` (`[C]`, `[N, C]`
    /// or `[N, C, d1, ...]`, classes along dim 1, or 0 for `[C]`) and class indices
    /// `target`: `nll_loss(log_softmax(self))`, blended with label smoothing ε as
    /// `(1 - ε)·nll + (ε / C)·Σ_c -w_c·logp_c`, the second term zero at ignored targets
    /// and divided by the same `Σ w[t]` under mean reduction (PyTorch's formula).
    ///
    /// ```
    /// use ember_tensor::{CrossEntropyOptions, Device, Tensor};
    /// // Two equal scores: log p = ln(1/2) for both classes, so the loss is ln 2 for any
    /// // target, and smoothing changes nothing.
    /// let x = Tensor::zeros([1, 2], ())?;
    /// let t = Tensor::new(&[1i64], &Device::Cpu)?;
    /// let l = x.cross_entropy(&t, &CrossEntropyOptions::new().label_smoothing(0.1))?;
    /// assert!((l.item::<f32>()? - std::f32::consts::LN_2).abs() < 1e-6);
    /// # Ok::<(), ember_tensor::TensorError>(())
    /// ```
    pub fn cross_entropy(&self, target: &Tensor, opts: &CrossEntropyOptions<'_>) -> Result<Tensor> {
        let _op = crate::profile::op("cross_entropy_loss", &[self.as_input(), target.as_input()]);
        let eps = opts.label_smoothing;
        if !(0.0..=1.0).contains(&eps) {
            return Err(TensorError::invalid(
                "cross_entropy",
                format!("label_smoothing must be between 0.0 and 1.0, got {eps}"),
            ));
        }
        let nll = &opts.nll;
        let mut p = prepare("cross_entropy", self, target, nll.weight)?;
        if eps == 0.0 {
            let (loss, w) = p.log_softmax_terms(nll.ignore_index)?;
            let r = match nll.reduction {
                Reduction::None => loss.reshape(target.shape())?,
                Reduction::Sum => loss.sum_all()?,
                Reduction::Mean => loss.sum_all()?.div(&w.sum_all()?)?,
            };
            return r.to_dtype(self.dtype());
        }
        p.x = p.x.log_softmax(1)?;
        let (loss, w) = p.terms(nll.ignore_index)?;
        let total_weight = || w.sum_all();
        // smooth[n, l] = -Σ_c w_c·logp[n, c, l], zero where the target is ignored.
        let weighted = match &p.weight {
            Some(wc) => p.x.mul(&wc.reshape([1, p.classes, 1])?)?,
            None => p.x.clone(),
        };
        let smooth = weighted.sum(1)?.neg()?;
        let ignored = p.target.eq(nll.ignore_index)?;
        let smooth = crate::r#where(&ignored, 0.0, &smooth)?.to_dtype(p.x.dtype())?;
        let scale = eps / p.classes as f64;
        let r = match nll.reduction {
            Reduction::None => loss
                .mul(1.0 - eps)?
                .add(&smooth.mul(scale)?)?
                .reshape(target.shape())?,
            Reduction::Sum => loss
                .sum_all()?
                .mul(1.0 - eps)?
                .add(&smooth.sum_all()?.mul(scale)?)?,
            Reduction::Mean => {
                let tw = total_weight()?;
                loss.sum_all()?
                    .div(&tw)?
                    .mul(1.0 - eps)?
                    .add(&smooth.sum_all()?.div(&tw)?.mul(scale)?)?
            }
        };
        r.to_dtype(self.dtype())
    }
}
