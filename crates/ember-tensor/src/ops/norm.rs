//! `batch_norm` as one recorded op over the fused kernels of `ember-tensor`
//! (`Tensor::batch_norm_forward` / `batch_norm_backward`), with PyTorch's node name
//! `NativeBatchNormBackward0`.
//!
//! Note [Batch norm backward]: with `x̂ = (x - mean)·k` (`k = 1 / sqrt(var + eps)`), `M`
//! elements per channel and `y = w·x̂ + b`: `∂L/∂b = Σ dy`, `∂L/∂w = Σ dy·x̂` (per channel),
//! and, with batch statistics (training), `∂L/∂x = w·k·(dy - Σdy / M - x̂·Σ(dy·x̂) / M)` (the
//! mean and variance depend on x); with running statistics they are constants and
//! `∂L/∂x = dy·w·k`. The running statistics get no gradient.

use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, Saved, maybe_record};
use crate::tensor::Tensor;

impl Tensor {
    /// `F.batch_norm` over the channel dim 1 of `[N, C, *]`: with the batch's statistics
    /// when `training` (updating `running_mean`/`running_var` in place, outside autograd,
    /// with `momentum` and the unbiased variance), with the running statistics otherwise.
    /// Output in `self`'s dtype (16-bit computed in f32). Backward as in Note [Batch norm
    /// backward].
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<Tensor> {
        let x = self.raw();
        let (rm, rv) = (running_mean.map(Tensor::raw), running_var.map(Tensor::raw));
        let (w, b) = (weight.map(Tensor::raw), bias.map(Tensor::raw));
        let (y, saved) = x.batch_norm_forward(
            rm.as_ref(),
            rv.as_ref(),
            w.as_ref(),
            b.as_ref(),
            training,
            momentum,
            eps,
        )?;
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        maybe_record("NativeBatchNormBackward0", y, &inputs, || {
            const NAME: &str = "NativeBatchNormBackward0";
            let need = [
                self.requires_grad(),
                weight.is_some_and(Tensor::requires_grad),
                bias.is_some_and(Tensor::requires_grad),
            ];
            let (has_w, has_b) = (weight.is_some(), bias.is_some());
            let sx = Saved::of(NAME, self)?;
            let sw = weight.map(|w| Saved::of(NAME, w)).transpose()?;
            let dtypes = (weight.map(Tensor::dtype), bias.map(Tensor::dtype));
            let f: BackwardFn = Box::new(move |g| {
                let x = sx.get()?;
                let w = sw.as_ref().map(Saved::get).transpose()?;
                let (gx, gw, gb) = x.batch_norm_backward(g, w.as_ref(), &saved, need)?;
                let mut r = vec![gx];
                if has_w {
                    r.push(match (gw, dtypes.0) {
                        (Some(t), Some(d)) => Some(t.to_dtype(d)?),
                        (t, _) => t,
                    });
                }
                if has_b {
                    r.push(match (gb, dtypes.1) {
                        (Some(t), Some(d)) => Some(t.to_dtype(d)?),
                        (t, _) => t,
                    });
                }
                Ok(r)
            });
            Ok(f)
        })
    }
}
