//! The kernels PyTorch exposes as `torch.ops.aten.*` (and `torch.nn.grad`): backward
//! kernels and fused forwards that the op table's entries run, callable directly, for tests
//! that check a kernel against a reference with a chosen gradient and for code that drives
//! them itself. They are not recorded by autograd and are not methods of [`Tensor`]: a user
//! computes gradients with `backward`.

use crate::autograd::error::Result;
use crate::raw::conv::Conv2dOptions;
use crate::raw::loss::CrossEntropyOptions;
use crate::tensor::Tensor;

pub use crate::raw::loss::CrossEntropySaved;
pub use crate::raw::norm::BatchNormSaved;

fn opt(t: Option<&Tensor>) -> Option<crate::RawTensor> {
    t.map(Tensor::raw)
}

/// `aten::threshold_backward`: `grad` where `input > threshold`, else 0 (ReLU's backward
/// at threshold 0).
pub fn threshold_backward(
    grad: &Tensor,
    input: &Tensor,
    threshold: impl Into<crate::Scalar>,
) -> Result<Tensor> {
    Ok(Tensor::wrap(
        grad.raw().threshold_backward(&input.raw(), threshold)?,
    ))
}

/// `torch.nn.grad.conv2d_input`: the gradient of a convolution's input of dims
/// `input_dims` from the output gradient `grad` and `weight`.
pub fn conv2d_backward_input(
    grad: &Tensor,
    input_dims: [usize; 4],
    weight: &Tensor,
    opts: &Conv2dOptions,
) -> Result<Tensor> {
    Ok(Tensor::wrap(grad.raw().conv2d_backward_input(
        input_dims,
        &weight.raw(),
        opts,
    )?))
}

/// `torch.nn.grad.conv2d_weight`: the gradient of a convolution's weight of dims
/// `weight_dims` from the output gradient `grad` and `input`.
pub fn conv2d_backward_weight(
    grad: &Tensor,
    input: &Tensor,
    weight_dims: [usize; 4],
    opts: &Conv2dOptions,
) -> Result<Tensor> {
    Ok(Tensor::wrap(grad.raw().conv2d_backward_weight(
        &input.raw(),
        weight_dims,
        opts,
    )?))
}

/// The unreduced pieces of `nll_loss` of log-probabilities `x` at `target`: per target
/// element the loss and the weight it counts with (0 where ignored).
pub fn nll_loss_terms(
    x: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    ignore_index: i64,
) -> Result<(Tensor, Tensor)> {
    let (l, w) = x
        .raw()
        .nll_loss_terms(&target.raw(), opt(weight).as_ref(), ignore_index)?;
    Ok((Tensor::wrap(l), Tensor::wrap(w)))
}

/// The fused cross-entropy forward of logits `x` (`aten::cross_entropy_loss`'s fused
/// path): the loss and what its backward needs.
pub fn cross_entropy_forward(
    x: &Tensor,
    target: &Tensor,
    opts: &CrossEntropyOptions<'_>,
) -> Result<(Tensor, CrossEntropySaved)> {
    let w = opt(opts.nll.weight);
    let (y, saved) = x
        .raw()
        .cross_entropy_forward(&target.raw(), &opts.with_weight(w.as_ref()))?;
    Ok((Tensor::wrap(y), saved))
}

/// The fused cross-entropy backward: the gradient of the logits `x` from the loss's
/// gradient `grad`.
pub fn cross_entropy_backward(
    x: &Tensor,
    target: &Tensor,
    opts: &CrossEntropyOptions<'_>,
    saved: &CrossEntropySaved,
    grad: &Tensor,
) -> Result<Tensor> {
    let w = opt(opts.nll.weight);
    Ok(Tensor::wrap(x.raw().cross_entropy_backward(
        &target.raw(),
        &opts.with_weight(w.as_ref()),
        saved,
        &grad.raw(),
    )?))
}

/// `aten::native_batch_norm`: the output, and the statistics its backward needs; in
/// training the running statistics are updated in place.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_forward(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<(Tensor, BatchNormSaved)> {
    let (y, saved) = x.raw().batch_norm_forward(
        opt(running_mean).as_ref(),
        opt(running_var).as_ref(),
        opt(weight).as_ref(),
        opt(bias).as_ref(),
        training,
        momentum,
        eps,
    )?;
    Ok((Tensor::wrap(y), saved))
}

/// `aten::native_batch_norm_backward`: the gradients of the input, the weight and the
/// bias (each where `need` asks for it).
pub fn batch_norm_backward(
    x: &Tensor,
    grad: &Tensor,
    weight: Option<&Tensor>,
    saved: &BatchNormSaved,
    need: [bool; 3],
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let (dx, dw, db) =
        x.raw()
            .batch_norm_backward(&grad.raw(), opt(weight).as_ref(), saved, need)?;
    Ok((
        dx.map(Tensor::wrap),
        dw.map(Tensor::wrap),
        db.map(Tensor::wrap),
    ))
}
