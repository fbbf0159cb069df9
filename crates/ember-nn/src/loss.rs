//! Losses (`torch.nn.CrossEntropyLoss` and friends): modules of two inputs, the prediction
//! and the target, implementing [`Loss`].

use ember_tensor::{CrossEntropyOptions, NllLossOptions};

pub use ember_tensor::Reduction;

use crate::{NnError, Result, Tensor};

/// A loss: `loss.forward(&input, &target)`.
pub trait Loss: Send + Sync + std::fmt::Debug {
    /// The loss of `input` against `target`.
    fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor>;
}

fn reduce(x: Tensor, reduction: Reduction) -> Result<Tensor> {
    Ok(match reduction {
        Reduction::None => x,
        Reduction::Mean => x.mean_all()?,
        Reduction::Sum => x.sum_all()?,
    })
}

fn same_shape(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    if input.shape() != target.shape() {
        return Err(NnError::invalid(
            op,
            format!(
                "Using a target size ({}) that is different to the input size ({}) is not supported",
                target.shape(),
                input.shape()
            ),
        ).into());
    }
    Ok(())
}

/// Cross-entropy of unnormalised scores `[N, C]` (or `[C]`, or `[N, C, d...]`) at class
/// indices (`torch.nn.CrossEntropyLoss`), fused and numerically stable.
#[derive(Debug, Clone)]
pub struct CrossEntropyLoss {
    /// Per-class weights `[C]`, if any.
    pub weight: Option<Tensor>,
    /// Targets equal to this index contribute nothing (default -100).
    pub ignore_index: i64,
    /// Mean (default), sum or none.
    pub reduction: Reduction,
    /// Label smoothing in `[0, 1]` (default 0).
    pub label_smoothing: f64,
}

impl Default for CrossEntropyLoss {
    fn default() -> Self {
        CrossEntropyLoss {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

impl CrossEntropyLoss {
    /// PyTorch's defaults: mean over the non-ignored targets, no smoothing.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Loss for CrossEntropyLoss {
    fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        let w = self.weight.as_ref().map(Tensor::data);
        let opts = CrossEntropyOptions {
            nll: NllLossOptions {
                weight: w.as_ref(),
                ignore_index: self.ignore_index,
                reduction: self.reduction,
            },
            label_smoothing: self.label_smoothing,
        };
        input.cross_entropy(target, &opts)
    }
}

/// Negative log-likelihood of log-probabilities at class indices (`torch.nn.NLLLoss`).
#[derive(Debug, Clone)]
pub struct NLLLoss {
    /// Per-class weights `[C]`, if any.
    pub weight: Option<Tensor>,
    /// Targets equal to this index contribute nothing (default -100).
    pub ignore_index: i64,
    /// Mean (default), sum or none.
    pub reduction: Reduction,
}

impl Default for NLLLoss {
    fn default() -> Self {
        NLLLoss {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

impl NLLLoss {
    /// PyTorch's defaults.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Loss for NLLLoss {
    fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        let w = self.weight.as_ref().map(Tensor::data);
        let opts = NllLossOptions {
            weight: w.as_ref(),
            ignore_index: self.ignore_index,
            reduction: self.reduction,
        };
        input.nll_loss(target, &opts)
    }
}

/// Mean squared error, `(input - target)²` reduced (`torch.nn.MSELoss`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MSELoss {
    /// Mean (default), sum or none.
    pub reduction: Reduction,
}

impl MSELoss {
    /// Mean reduction.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Loss for MSELoss {
    fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        same_shape("MSELoss", input, target)?;
        reduce(input.sub(target)?.square()?, self.reduction)
    }
}

/// Binary cross-entropy of logits against targets in `[0, 1]`, in the stable form
/// `max(x, 0) - x·y + log(1 + e^{-|x|})` (`torch.nn.BCEWithLogitsLoss`); `pos_weight`
/// weights the positive term, broadcast over the last dimension.
#[derive(Debug, Clone, Default)]
pub struct BCEWithLogitsLoss {
    /// Weight of positive examples per class, if any.
    pub pos_weight: Option<Tensor>,
    /// Mean (default), sum or none.
    pub reduction: Reduction,
}

impl BCEWithLogitsLoss {
    /// Mean reduction, no positive weight.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Loss for BCEWithLogitsLoss {
    fn forward(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        same_shape("BCEWithLogitsLoss", x, y)?;
        // softplus(-x) = log(1 + e^{-x}) = max(-x, 0) + log1p(e^{-|x|}).
        let sp_neg = x
            .neg()?
            .clamp_min(0.0)?
            .add(&x.abs()?.neg()?.exp()?.log1p()?)?;
        let l = match &self.pos_weight {
            // (1 - y)·x + (1 + (pw - 1)·y)·softplus(-x)
            Some(pw) => {
                let coef = pw.sub(1.0)?.mul(y)?.add(1.0)?;
                y.neg()?.add(1.0)?.mul(x)?.add(&coef.mul(&sp_neg)?)?
            }
            // x - x·y + softplus(-x)
            None => x.sub(&x.mul(y)?)?.add(&sp_neg)?,
        };
        reduce(l, self.reduction)
    }
}
