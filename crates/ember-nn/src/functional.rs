//! `torch.nn.functional` (imported as `F` by `ember::prelude`): the layers and losses as
//! functions of [`Tensor`]s, with PyTorch's argument order. The modules in
//! [`layers`](crate::layers) and [`loss`](crate::loss) hold parameters and options and call
//! these.
//!
//! ```
//! use ember_nn::functional as F;
//! use ember_nn::Tensor;
//! let x = Tensor::from_vec(vec![-1f32, 0.5, 2.0, -3.0], [2, 2], ())?;
//! let w = Tensor::ones([3, 2], ())?;
//! let h = F::relu(&F::linear(&x, &w, None)?)?;                 // [2, 3]
//! let target = Tensor::from_vec(vec![0i64, 2], [2], ())?;
//! let loss = F::cross_entropy(&h, &target, ())?;
//! assert_eq!(loss.dims(), Vec::<usize>::new());
//! let mse = F::mse_loss(&x, &x.zeros_like()?, ())?;          // mean of squares
//! assert_eq!(mse.item::<f32>()?, (1.0 + 0.25 + 4.0 + 9.0) / 4.0);
//! # Ok::<(), ember_nn::Error>(())
//! ```

use ember_autograd::mode::autocast_inputs;
use ember_autograd::{CrossEntropyOptions, NllLossOptions};
use ember_tensor::{
    Approximate, AvgPool2dOptions, Conv2dOptions, DType, Dim, MaxPool2dOptions, op_table,
};

pub use ember_tensor::{Reduction, SdpaOptions};

use crate::{NnError, Result, Tensor};

/// `F.relu`: `max(x, 0)`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    x.relu()
}

/// `F.gelu(x, approximate=...)`: `()` or `Approximate::None` for the exact form,
/// `Approximate::Tanh` for the tanh approximation.
pub fn gelu(x: &Tensor, approximate: impl Into<Approximate>) -> Result<Tensor> {
    x.gelu(approximate)
}

/// `F.silu`: `x · sigmoid(x)`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    x.silu()
}

/// `F.sigmoid`.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    x.sigmoid()
}

/// `F.tanh`.
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    x.tanh()
}

/// `F.softmax(x, dim)`.
pub fn softmax(x: &Tensor, dim: impl Dim) -> Result<Tensor> {
    x.softmax(dim)
}

/// `F.log_softmax(x, dim)`.
pub fn log_softmax(x: &Tensor, dim: impl Dim) -> Result<Tensor> {
    x.log_softmax(dim)
}

/// `F.dropout(x, p, training)`: zeroes elements with probability `p` and scales the rest
/// by `1 / (1 - p)` when `training`; the identity otherwise.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    x.dropout(p, training)
}

/// `F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
/// scale, enable_gqa)`, the keyword arguments in [`SdpaOptions`]: `softmax(q·kᵀ·scale +
/// mask)·v` over q `[..., L, E]`, k `[..., S, E]`, v `[..., S, Ev]`. The fused kernels or the
/// math path run as `ember_tensor::backends::sdpa` chooses (`EMBER_SDPA`).
///
/// ```
/// use ember_nn::functional::{self as F, SdpaOptions};
/// use ember_nn::Tensor;
/// let q = Tensor::ones([1, 2, 4, 8], ())?;
/// let kv = Tensor::ones([1, 2, 6, 8], ())?;
/// let out = F::scaled_dot_product_attention(&q, &kv, &kv, &SdpaOptions::default())?;
/// assert_eq!(out.dims(), vec![1, 2, 4, 8]);
/// # Ok::<(), ember_nn::Error>(())
/// ```
pub fn scaled_dot_product_attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    query.scaled_dot_product_attention(key, value, opts)
}

/// `F.linear(x, weight, bias)`: `x @ weight.T + bias`, `weight` `[out, in]`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(mut c) = autocast_inputs(&op_table::linear, [x, weight].into_iter().chain(bias))? {
        // The 16-bit copies of the input and the weight go before the bias is added (the
        // tape keeps them where a gradient needs them): under `no_grad` a layer then holds
        // them and its product at once, as PyTorch's fused addmm does, not them and two
        // outputs (`fwd_mlp_*_bf16`'s peak memory).
        let b = if bias.is_some() { c.pop() } else { None };
        let y = linear(&c[0], &c[1], None)?;
        drop(c);
        return match b {
            Some(b) => y.add(&b),
            None => Ok(y),
        };
    }
    let in_features = weight.dims().get(1).copied();
    if weight.rank() != 2 || x.dims().last().copied() != in_features {
        return Err(NnError::invalid(
            "linear",
            format!(
                "expected a weight [out_features, in_features] and an input whose last dimension is in_features, found weight {} and input {}",
                weight.shape(),
                x.shape()
            ),
        )
        .into());
    }
    let y = x.matmul(&weight.t()?)?;
    match bias {
        Some(b) => y.add(b),
        None => Ok(y),
    }
}

/// `F.conv2d(x, weight, bias, stride, padding, dilation, groups)`, the options in
/// [`Conv2dOptions`].
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &Conv2dOptions,
) -> Result<Tensor> {
    x.conv2d(weight, bias, opts)
}

/// `F.max_pool2d`.
pub fn max_pool2d(x: &Tensor, opts: &MaxPool2dOptions) -> Result<Tensor> {
    x.max_pool2d(opts)
}

/// `F.avg_pool2d`.
pub fn avg_pool2d(x: &Tensor, opts: &AvgPool2dOptions) -> Result<Tensor> {
    x.avg_pool2d(opts)
}

/// `F.embedding(indices, weight)`: the rows of `weight` at `indices`.
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    weight.embedding(indices)
}

/// `F.one_hot(indices, num_classes)` (`None`: one more than the largest index).
pub fn one_hot(indices: &Tensor, num_classes: Option<usize>) -> Result<Tensor> {
    indices.one_hot(num_classes)
}

/// `F.layer_norm(x, normalized_shape, weight, bias, eps)`: normalises over the last
/// `normalized_shape.len()` dims (biased variance), then scales and shifts.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let inputs = [x].into_iter().chain(weight).chain(bias);
    if let Some(c) = autocast_inputs(&op_table::layer_norm, inputs)? {
        let mut rest = c[1..].iter();
        let w = weight.and_then(|_| rest.next());
        let b = bias.and_then(|_| rest.next());
        return layer_norm(&c[0], normalized_shape, w, b, eps);
    }
    let axes = normalized_axes("layer_norm", x, normalized_shape)?;
    let mean = x.mean((axes.as_slice(), true))?;
    let var = x.var_correction((axes.as_slice(), true), 0.0)?;
    let mut y = x.sub(&mean)?.mul(&var.add(eps)?.rsqrt()?)?;
    if let Some(w) = weight {
        y = y.mul(w)?;
    }
    if let Some(b) = bias {
        y = y.add(b)?;
    }
    Ok(y)
}

/// The trailing axes a norm over `normalized_shape` reduces, or the error naming `op` when
/// `x`'s shape does not end in `normalized_shape`.
fn normalized_axes(op: &'static str, x: &Tensor, normalized_shape: &[usize]) -> Result<Vec<usize>> {
    let dims = x.dims();
    let k = normalized_shape.len();
    if k == 0 || dims.len() < k || dims[dims.len() - k..] != *normalized_shape {
        return Err(NnError::invalid(
            op,
            format!(
                "expected input with shape [*, {}], found {}",
                normalized_shape
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                x.shape()
            ),
        )
        .into());
    }
    Ok((dims.len() - k..dims.len()).collect())
}

/// `torch.finfo(dtype).eps` of a floating-point dtype: the default `eps` of
/// [`rms_norm`] and [`RMSNorm`](crate::layers::RMSNorm). `None` for the other dtypes.
pub fn finfo_eps(dtype: DType) -> Option<f64> {
    match dtype {
        DType::F32 => Some(f64::from(f32::EPSILON)),
        DType::F64 => Some(f64::EPSILON),
        DType::F16 => Some(0.000_976_562_5),
        DType::Bf16 => Some(0.007_812_5),
        _ => None,
    }
}

/// `F.rms_norm(x, normalized_shape, weight, eps)`: `x / sqrt(mean(x²) + eps) · weight`, the
/// mean over the last `normalized_shape.len()` dims; `eps` `None` is
/// `torch.finfo(x.dtype).eps`. A 16-bit input is normalised in f32 and rounded once to its
/// dtype, as PyTorch's composite kernel does.
pub fn rms_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Tensor> {
    let axes = normalized_axes("rms_norm", x, normalized_shape)?;
    let dtype = x.dtype();
    let Some(eps) = eps.or_else(|| finfo_eps(dtype)) else {
        return Err(NnError::invalid(
            "rms_norm",
            format!("expected a floating-point input, found dtype {dtype}"),
        )
        .into());
    };
    let xf = if dtype.is_half() {
        x.to_dtype(DType::F32)?
    } else {
        x.clone()
    };
    let ms = xf.square()?.mean((axes.as_slice(), true))?;
    let mut y = xf.mul(&ms.add(eps)?.rsqrt()?)?;
    if let Some(w) = weight {
        y = y.mul(w)?;
    }
    if y.dtype() != dtype {
        y = y.to_dtype(dtype)?;
    }
    Ok(y)
}

/// `F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)` over
/// the channel dim 1 of `[N, C, *]`: with the batch's statistics when `training` (and then,
/// where running statistics are given, `running = (1 - momentum)·running + momentum·batch`
/// with the unbiased batch variance, outside autograd), with the running statistics
/// otherwise (they must be given then).
///
/// The output has the input's dtype. A 16-bit input (f16, bf16) is normalised in f32 and
/// the result rounded once to its dtype, as PyTorch's kernels accumulate in f32: a
/// mixed-precision model (16-bit activations from an autocast convolution, f32 weights and
/// running statistics) keeps 16-bit activations through its batch norms, and the statistics
/// stay accurate. It runs as fused kernels (`Tensor::batch_norm`: one statistics kernel and
/// one normalising kernel forward, one reduction and one elementwise kernel backward).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let dims = x.dims();
    if dims.len() < 2 {
        return Err(NnError::invalid(
            "batch_norm",
            format!(
                "expected input [N, C, *] with at least 2 dims, found {}",
                x.shape()
            ),
        )
        .into());
    }
    if training {
        let n: usize = dims
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != 1)
            .map(|(_, &v)| v)
            .product();
        if n <= 1 {
            return Err(NnError::invalid(
                "batch_norm",
                format!(
                    "Expected more than 1 value per channel when training, got input size {}",
                    x.shape()
                ),
            )
            .into());
        }
    } else if running_mean.is_none() || running_var.is_none() {
        return Err(NnError::invalid(
            "batch_norm",
            "running_mean and running_var must be given when training is false",
        )
        .into());
    }
    x.batch_norm(
        running_mean,
        running_var,
        weight,
        bias,
        training,
        momentum,
        eps,
    )
}

/// `F.cross_entropy(x, target, weight=, ignore_index=, reduction=, label_smoothing=)`:
/// `()` for PyTorch's defaults, or [`CrossEntropyOptions`] (by value or reference).
/// `target` holds class indices (i64/i32), or class probabilities (floating, of `x`'s
/// shape; the mean is then over rows, not weights, as PyTorch).
pub fn cross_entropy<'a>(
    x: &Tensor,
    target: &Tensor,
    opts: impl Into<CrossEntropyOptions<'a>>,
) -> Result<Tensor> {
    x.cross_entropy(target, &opts.into())
}

/// `F.nll_loss(log_probs, target, weight=, ignore_index=, reduction=)`: `()` for the
/// defaults, or [`NllLossOptions`].
pub fn nll_loss<'a>(
    x: &Tensor,
    target: &Tensor,
    opts: impl Into<NllLossOptions<'a>>,
) -> Result<Tensor> {
    x.nll_loss(target, &opts.into())
}

/// `input` and `target` must have one shape (PyTorch's elementwise losses warn and
/// broadcast; a silent broadcast is almost always a bug, so here it is an error).
fn same_shape(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    if input.dims() != target.dims() {
        return Err(NnError::invalid(
            op,
            format!(
                "Using a target size ({}) that is different to the input size ({}) is not supported",
                target.shape(),
                input.shape()
            ),
        )
        .into());
    }
    Ok(())
}

/// The per-element losses `l` reduced as asked.
pub(crate) fn reduce(l: Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::None => Ok(l),
        Reduction::Mean => l.mean_all(),
        Reduction::Sum => l.sum_all(),
    }
}

/// `F.mse_loss(x, target, reduction=)`: `(x - target)²` reduced (`()` for the mean).
pub fn mse_loss(x: &Tensor, target: &Tensor, reduction: impl Into<Reduction>) -> Result<Tensor> {
    if let Some(c) = autocast_inputs(&op_table::mse_loss, [x, target])? {
        return mse_loss(&c[0], &c[1], reduction);
    }
    same_shape("mse_loss", x, target)?;
    reduce(x.sub(target)?.square()?, reduction.into())
}

/// `F.l1_loss(x, target, reduction=)`: `|x - target|` reduced (`()` for the mean).
pub fn l1_loss(x: &Tensor, target: &Tensor, reduction: impl Into<Reduction>) -> Result<Tensor> {
    if let Some(c) = autocast_inputs(&op_table::l1_loss, [x, target])? {
        return l1_loss(&c[0], &c[1], reduction);
    }
    same_shape("l1_loss", x, target)?;
    reduce(x.sub(target)?.abs()?, reduction.into())
}

/// `F.binary_cross_entropy_with_logits(x, target, pos_weight=, reduction=)` for targets in
/// `[0, 1]`, in the stable form `max(x, 0) - x·y + log(1 + e^{-|x|})`; `pos_weight`
/// weights the positive term, broadcast over the last dimension.
pub fn binary_cross_entropy_with_logits(
    x: &Tensor,
    target: &Tensor,
    pos_weight: Option<&Tensor>,
    reduction: impl Into<Reduction>,
) -> Result<Tensor> {
    same_shape("binary_cross_entropy_with_logits", x, target)?;
    let inputs = [x, target].into_iter().chain(pos_weight);
    if let Some(c) = autocast_inputs(&op_table::binary_cross_entropy_with_logits, inputs)? {
        return binary_cross_entropy_with_logits(&c[0], &c[1], c.get(2), reduction);
    }
    let y = target;
    // softplus(-x) = log(1 + e^{-x}) = max(-x, 0) + log1p(e^{-|x|}).
    let sp_neg = x
        .neg()?
        .clamp_min(0.0)?
        .add(&x.abs()?.neg()?.exp()?.log1p()?)?;
    let l = match pos_weight {
        // (1 - y)·x + (1 + (pw - 1)·y)·softplus(-x)
        Some(pw) => {
            let coef = pw.sub(1.0)?.mul(y)?.add(1.0)?;
            y.neg()?.add(1.0)?.mul(x)?.add(&coef.mul(&sp_neg)?)?
        }
        // x - x·y + softplus(-x)
        None => x.sub(&x.mul(y)?)?.add(&sp_neg)?,
    };
    reduce(l, reduction.into())
}
