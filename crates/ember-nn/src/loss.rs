//! Losses (`torch.nn.CrossEntropyLoss` and friends): modules of two inputs, the prediction
//! and the target, implementing [`Loss`].

use ember_autograd::{CrossEntropyOptions, NllLossOptions};

pub use ember_tensor::Reduction;

use crate::functional as F;
use crate::{Result, Tensor};

/// A loss: `loss.forward(&input, &target)`.
pub trait Loss: Send + Sync + std::fmt::Debug {
    /// The loss of `input` against `target`.
    fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor>;
}

/// Cross-entropy of unnormalised scores `[N, C]` (or `[C]`, or `[N, C, d...]`) at class
/// indices, fused and numerically stable, or against class probabilities (a floating target
/// of the input's shape; `ignore_index` must then stay negative) (`torch.nn.CrossEntropyLoss`).
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
        let opts = CrossEntropyOptions {
            nll: NllLossOptions {
                weight: self.weight.as_ref(),
                ignore_index: self.ignore_index,
                reduction: self.reduction,
            },
            label_smoothing: self.label_smoothing,
        };
        F::cross_entropy(input, target, opts)
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
        let opts = NllLossOptions {
            weight: self.weight.as_ref(),
            ignore_index: self.ignore_index,
            reduction: self.reduction,
        };
        F::nll_loss(input, target, opts)
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
        F::mse_loss(input, target, self.reduction)
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
        F::binary_cross_entropy_with_logits(x, y, self.pos_weight.as_ref(), self.reduction)
    }
}
