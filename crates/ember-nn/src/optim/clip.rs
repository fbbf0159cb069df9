//! Gradient clipping (`torch.nn.utils.clip_grad_norm_`, `clip_grad_value_`).

use ember_tensor::{Device, Tensor as Raw, promote_types};

use crate::{NnError, Result, Tensor};

/// The norm of `tensors` seen as one vector: the `norm_type`-norm of their norms
/// (`f64::INFINITY` for the max-abs norm), a 0-dim tensor on the first tensor's device
/// (PyTorch's `torch.nn.utils.get_total_norm`; 0 as an f32 on the CPU for no tensors).
/// `error_if_nonfinite` makes a NaN or infinite norm an error.
pub fn get_total_norm(
    tensors: &[Tensor],
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Tensor> {
    let Some(first) = tensors.first() else {
        return Raw::scalar(0f32, Device::Cpu);
    };
    let device = first.device();
    let norms = tensors
        .iter()
        .map(|t| t.data().norm_all(norm_type)?.to_device(device))
        .collect::<Result<Vec<Raw>>>()?;
    let dtype = norms
        .iter()
        .map(Raw::dtype)
        .reduce(promote_types)
        .unwrap_or(first.dtype());
    let norms = norms
        .iter()
        .map(|n| n.to_dtype(dtype))
        .collect::<std::result::Result<Vec<Raw>, _>>()?;
    let total = Raw::stack(&norms.iter().collect::<Vec<_>>(), 0)?.norm_all(norm_type)?;
    if error_if_nonfinite && !total.to_scalar()?.to_f64().is_finite() {
        return Err(NnError::invalid(
            "clip_grad_norm_",
            format!(
                "The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
            ),
        ).into());
    }
    Ok(total)
}

/// Scales the gradients of `params` in place so that their total `norm_type`-norm is at
/// most `max_norm`, and returns the total norm before clipping (a 0-dim tensor).
///
/// As PyTorch: `total` is the norm of the per-gradient norms, every gradient is multiplied
/// by `min(max_norm / (total + 1e-6), 1)`, parameters without a gradient are ignored, and
/// `norm_type` may be `f64::INFINITY`. A non-finite norm scales the gradients by it
/// (NaN); [`clip_grad_norm_opts`] can make it an error instead.
///
/// ```
/// use ember_nn::{optim::clip_grad_norm_, Tensor};
/// let p = Tensor::zeros([2], ())?.requires_grad_(true)?;
/// p.set_grad(Some(&Tensor::from_vec(vec![3f32, 4.], [2], &ember_tensor::Device::Cpu)?))?;
/// let total = clip_grad_norm_(&[p.clone()], 1.0, 2.0)?;
/// assert_eq!(total.item::<f32>()?, 5.0);
/// let g = p.grad().unwrap().to_vec::<f32>()?;
/// assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
/// # Ok::<(), ember_nn::Error>(())
/// ```
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    clip_grad_norm_opts(params, max_norm, norm_type, false)
}

/// [`clip_grad_norm_`] with PyTorch's `error_if_nonfinite`: a NaN or infinite total norm
/// is an error (and the gradients are left as they are).
pub fn clip_grad_norm_opts(
    params: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Tensor> {
    let grads: Vec<Tensor> = params.iter().filter_map(Tensor::grad).collect();
    let total = get_total_norm(&grads, norm_type, error_if_nonfinite)?;
    if grads.is_empty() {
        return Ok(total);
    }
    // PyTorch's `max_norm / (total + 1e-6)` is `(total + 1e-6).reciprocal() * max_norm`,
    // in the norm's dtype.
    let coef = total
        .data()
        .add(1e-6)?
        .reciprocal()?
        .mul(max_norm)?
        .clamp_max(1.0)?;
    for g in &grads {
        let g = g.data();
        g.mul_(&coef.to_device(g.device())?)?;
    }
    Ok(total)
}

/// Clamps the gradients of `params` into `[-clip_value, clip_value]` in place
/// (`torch.nn.utils.clip_grad_value_`).
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    for g in params.iter().filter_map(Tensor::grad) {
        g.data().clamp_(-clip_value, clip_value)?;
    }
    Ok(())
}
