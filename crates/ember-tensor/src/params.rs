//! The parameter structs of the ops whose kernels take more than layouts: convolution,
//! pooling, the fused cross-entropy and batch norm, the fused optimizer steps. The fronts
//! (`raw/conv.rs`, `raw/pool.rs`, `raw/loss.rs`, `raw/norm.rs`, `raw/optim.rs`) fill them,
//! the dispatch (`backend_nn.rs`, `backend_fused.rs`) passes them on, and the kernels
//! (`cpu/`, `cuda/`) read them; they sit below all three so that every import points down.

use crate::storage::Storage;

/// Geometry of one 2-D convolution, as the kernels receive it. Input layout
/// `[N, C, H, W]`, weight `[O, C/groups, kH, kW]`, output `[N, O, out_h, out_w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Conv2dParams {
    /// Stride (h, w), at least 1.
    pub stride: (usize, usize),
    /// Zero padding before the first row / column (h, w). Padding after the last one is
    /// implied by the output size (it differs from this for odd `"same"` padding).
    pub pad: (usize, usize),
    /// Dilation (h, w), at least 1.
    pub dilation: (usize, usize),
    /// Groups, at least 1, dividing C and O.
    pub groups: usize,
    /// Output height and width.
    pub out: (usize, usize),
}

/// Which 2-D pooling and its options, as the kernels receive them. Input layout
/// `[N, C, H, W]`, output `[N, C, out_h, out_w]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pool2dParams {
    /// Kernel size (h, w), at least 1.
    pub kernel: (usize, usize),
    /// Stride (h, w), at least 1.
    pub stride: (usize, usize),
    /// Implicit padding (h, w), at most half the kernel.
    pub pad: (usize, usize),
    /// Dilation (h, w), at least 1 (always 1 for average pooling).
    pub dilation: (usize, usize),
    /// Output height and width (ceil mode already applied).
    pub out: (usize, usize),
}

/// How average pooling divides each window's sum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum AvgDivisor {
    /// By the window's size including padding (clipped at `H + pad`), PyTorch's
    /// `count_include_pad=True`.
    IncludePad,
    /// By the number of input elements in the window.
    ExcludePad,
    /// By this constant (`divisor_override`), non-zero.
    Override(i64),
}

/// The options of the fused cross-entropy kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CrossEntropyParams {
    /// Rows whose target equals this contribute nothing.
    pub ignore_index: i64,
    /// Label smoothing ε in `[0, 1]`.
    pub smoothing: f64,
}

/// Per-channel statistics as the batch-norm kernels read them: `mean` and `v` (`[C]`,
/// compute dtype), `v` an inverse standard deviation, or a variance (`is_var`, eval mode's
/// running variance) to which `eps` is added before `1 / sqrt`.
pub(crate) struct BnStats<'a, S> {
    pub mean: &'a S,
    pub v: &'a S,
    pub is_var: bool,
    pub eps: f64,
}

/// What a batch-norm backward computes: the input gradient (`need_input`) and the
/// per-channel sums `Σ dy`, `Σ dy·x̂` (`sums`, or whenever `training`: the input gradient of
/// batch statistics needs them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BnBackward {
    pub training: bool,
    pub sums: bool,
    pub need_input: bool,
}

/// The backward's results: the input gradient and `(Σ dy, Σ dy·x̂)`, as asked.
pub(crate) type BnGrads<S = Storage> = (Option<S>, Option<(S, S)>);

/// The hyperparameters of [`Tensor::fused_sgd_`](crate::Tensor::fused_sgd_) (`torch.optim.SGD`'s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedSgdOptions {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: no momentum buffers).
    pub momentum: f64,
    /// Dampening for momentum.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Maximize the objective (the gradient's sign flipped).
    pub maximize: bool,
}

/// The hyperparameters of [`Tensor::fused_adam_`](crate::Tensor::fused_adam_) (`torch.optim.Adam`'s and `AdamW`'s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedAdamOptions {
    /// Learning rate.
    pub lr: f64,
    /// Coefficients of the running averages of the gradient and its square.
    pub betas: (f64, f64),
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: an L2 term in the gradient, or with `decoupled_weight_decay` (AdamW)
    /// `p *= 1 - lr * weight_decay` before the update.
    pub weight_decay: f64,
    /// AMSGrad (the `max_exp_avg_sqs` are used).
    pub amsgrad: bool,
    /// Maximize the objective.
    pub maximize: bool,
    /// AdamW's decoupled weight decay.
    pub decoupled_weight_decay: bool,
}
