//! Batch normalisation over the channel dim 1 of `[N, C, *]` as fused kernels
//! (`backend_fused.rs`): training = one statistics kernel (per-channel mean and biased
//! variance, and the running statistics' update) + one normalising kernel; eval = one
//! normalising kernel with the running statistics; backward = one per-channel reduction
//! (`Σ dy`, `Σ dy·x̂`: the bias and weight gradients) + one elementwise kernel for the input
//! gradient. 16-bit inputs are read and written as such and computed in f32; the output has
//! the input's dtype.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::params::{BnBackward, BnStats};
use crate::raw::{RawTensor, same_device};
use crate::storage::{read_many, same, write_many_read};

/// What [`Tensor::batch_norm_backward`] reads from [`Tensor::batch_norm_forward`]: the
/// per-channel mean and inverse standard deviation of the batch (training), or the running
/// mean and variance (eval), in the compute dtype.
#[derive(Clone, Debug)]
pub struct BatchNormSaved {
    mean: RawTensor,
    v: RawTensor,
    is_var: bool,
    eps: f64,
    training: bool,
}

/// The gradients of [`Tensor::batch_norm_backward`]: input, weight, bias (each when asked).
pub type BatchNormGrads = (Option<RawTensor>, Option<RawTensor>, Option<RawTensor>);

const OP: &str = "batch_norm";

fn compute_dtype(d: DType) -> Result<DType> {
    match d {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::Bf16 => Ok(DType::F32),
        d => Err(TensorError::UnsupportedDType {
            op: OP,
            dtype: d,
            hint: "batch_norm takes floating-point input",
        }),
    }
}

/// `t` contiguous from element 0 of its own storage (the fused kernels index operands from
/// their storage's start): `t` itself when it already is, else a fresh copy.
pub(crate) fn from_start(t: RawTensor) -> Result<RawTensor> {
    if t.is_contiguous() && t.layout().offset() == 0 {
        return Ok(t);
    }
    let fresh = RawTensor::zeros(t.shape().clone(), (t.device(), t.dtype()))?;
    fresh.copy_(&t)?;
    Ok(fresh)
}

/// A per-channel vector `[C]` as the kernels read it: the compute dtype, contiguous from
/// element 0 of its own storage (a fresh copy unless it already is).
fn channel_vec(t: &RawTensor, c: usize, cd: DType, what: &str) -> Result<RawTensor> {
    if t.dims() != [c] {
        return Err(TensorError::ShapeMismatch {
            op: OP,
            msg: format!("expected {what} of shape [{c}], but got {}", t.shape()),
        });
    }
    if t.dtype() == cd && t.is_contiguous() && t.layout().offset() == 0 {
        return Ok(t.clone());
    }
    let fresh = RawTensor::zeros([c], (t.device(), cd))?;
    fresh.copy_(t)?;
    Ok(fresh)
}

impl RawTensor {
    /// `F.batch_norm` of `self` (`[N, C, *]`): normalised with the batch's statistics when
    /// `training` (then `running_mean`/`running_var`, if given, are updated in place with
    /// `momentum` and the unbiased variance, as PyTorch), with the running statistics
    /// otherwise; then scaled by `weight` and shifted by `bias` (`[C]`). Returns the output
    /// (`self`'s dtype and shape) and what [`Tensor::batch_norm_backward`] needs.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_forward(
        &self,
        running_mean: Option<&RawTensor>,
        running_var: Option<&RawTensor>,
        weight: Option<&RawTensor>,
        bias: Option<&RawTensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<(RawTensor, BatchNormSaved)> {
        let _op = crate::profile::op1("native_batch_norm", self);
        let mut all = vec![self];
        all.extend(running_mean);
        all.extend(running_var);
        all.extend(weight);
        all.extend(bias);
        same_device(&all)?;
        let cd = compute_dtype(self.dtype())?;
        let dims = self.dims();
        if dims.len() < 2 {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "expected input [N, C, *] with at least 2 dims, found {}",
                    self.shape()
                ),
            ));
        }
        let (n, c) = (dims[0], dims[1]);
        let s: usize = dims[2..].iter().product();
        let x = self.contiguous()?.reshape([n, c, s])?;
        let w = weight
            .map(|w| channel_vec(w, c, cd, "weight"))
            .transpose()?;
        let b = bias.map(|b| channel_vec(b, c, cd, "bias")).transpose()?;
        let saved = if training {
            if n * s <= 1 {
                return Err(TensorError::invalid(
                    OP,
                    format!(
                        "Expected more than 1 value per channel when training, got input size {}",
                        self.shape()
                    ),
                ));
            }
            let lx = x.layout().clone();
            let (mean, invstd) = match (running_mean, running_var) {
                (Some(rm), Some(rv)) => {
                    let direct = |t: &RawTensor| {
                        t.dims() == [c]
                            && t.dtype() == cd
                            && t.is_contiguous()
                            && t.layout().offset() == 0
                            && !same(t.cell(), x.cell())
                    };
                    let (tm, tv) = if direct(rm) && direct(rv) && !same(rm.cell(), rv.cell()) {
                        (rm.clone(), rv.clone())
                    } else {
                        (
                            channel_vec(rm, c, cd, "running_mean")?,
                            channel_vec(rv, c, cd, "running_var")?,
                        )
                    };
                    let r = write_many_read(&[tm.cell(), tv.cell()], x.cell(), |d, xs| {
                        let [m, v] = d else {
                            return Err(TensorError::invalid(OP, "two running statistics"));
                        };
                        xs.batch_norm_stats(&lx, Some((&mut **m, &mut **v)), momentum, eps)
                    })?;
                    if !same(tm.cell(), rm.cell()) {
                        rm.copy_(&tm)?;
                        rv.copy_(&tv)?;
                    }
                    r
                }
                (None, None) => x.cell().read().batch_norm_stats(&lx, None, momentum, eps)?,
                _ => {
                    return Err(TensorError::invalid(
                        OP,
                        "running_mean and running_var must be given together",
                    ));
                }
            };
            BatchNormSaved {
                mean: RawTensor::from_storage(mean, [c]),
                v: RawTensor::from_storage(invstd, [c]),
                is_var: false,
                eps,
                training: true,
            }
        } else {
            let (Some(rm), Some(rv)) = (running_mean, running_var) else {
                return Err(TensorError::invalid(
                    OP,
                    "running_mean and running_var must be given when training is false",
                ));
            };
            BatchNormSaved {
                mean: channel_vec(rm, c, cd, "running_mean")?,
                v: channel_vec(rv, c, cd, "running_var")?,
                is_var: true,
                eps,
                training: false,
            }
        };
        let mut cells = vec![x.cell(), saved.mean.cell(), saved.v.cell()];
        cells.extend(w.as_ref().map(RawTensor::cell));
        cells.extend(b.as_ref().map(RawTensor::cell));
        let lx = x.layout().clone();
        let (hw, hb) = (w.is_some(), b.is_some());
        let y = read_many(&cells, |s| {
            let st = BnStats {
                mean: s[1],
                v: s[2],
                is_var: saved.is_var,
                eps,
            };
            let wi = hw.then(|| s[3]);
            let bi = hb.then(|| s[3 + usize::from(hw)]);
            s[0].batch_norm_apply(&lx, &st, wi, bi)
        })?;
        let y = RawTensor::from_storage(y, x.shape().clone()).reshape(self.shape())?;
        Ok((y, saved))
    }

    /// The gradients of [`Tensor::batch_norm_forward`] for input `self` and upstream `grad`
    /// (`self`'s shape): `need` says which of (input, weight, bias) to compute. The weight
    /// and bias gradients are `Σ dy·x̂` and `Σ dy` per channel, in the compute dtype (f32,
    /// f64 for f64 input); the input gradient has `self`'s dtype and shape.
    pub fn batch_norm_backward(
        &self,
        grad: &RawTensor,
        weight: Option<&RawTensor>,
        saved: &BatchNormSaved,
        need: [bool; 3],
    ) -> Result<BatchNormGrads> {
        let _op = crate::profile::op(
            "native_batch_norm_backward",
            &[grad.as_input(), self.as_input()],
        );
        let mut all = vec![self, grad];
        all.extend(weight);
        same_device(&all)?;
        let cd = compute_dtype(self.dtype())?;
        if grad.dims() != self.dims() || self.rank() < 2 {
            return Err(TensorError::ShapeMismatch {
                op: "batch_norm_backward",
                msg: format!(
                    "expected a gradient of the input's shape {}, but got {}",
                    self.shape(),
                    grad.shape()
                ),
            });
        }
        let dims = self.dims();
        let (n, c) = (dims[0], dims[1]);
        let s: usize = dims[2..].iter().product();
        let x = self.contiguous()?.reshape([n, c, s])?;
        let dy = from_start(grad.to_dtype(self.dtype())?.reshape([n, c, s])?)?;
        let w = weight
            .map(|w| channel_vec(w, c, cd, "weight"))
            .transpose()?;
        let b = BnBackward {
            training: saved.training,
            sums: need[1] || need[2],
            need_input: need[0],
        };
        let mut cells = vec![dy.cell(), x.cell(), saved.mean.cell(), saved.v.cell()];
        cells.extend(w.as_ref().map(RawTensor::cell));
        let lx = x.layout().clone();
        let hw = w.is_some();
        let (dx, sums) = read_many(&cells, |s| {
            let st = BnStats {
                mean: s[2],
                v: s[3],
                is_var: saved.is_var,
                eps: saved.eps,
            };
            s[0].batch_norm_backward(s[1], &lx, &st, hw.then(|| s[4]), &b)
        })?;
        let dx = dx
            .map(|d| RawTensor::from_storage(d, x.shape().clone()).reshape(self.shape()))
            .transpose()?;
        let (gw, gb) = match sums {
            Some((sd, sdx)) => (
                need[1].then(|| RawTensor::from_storage(sdx, [c])),
                need[2].then(|| RawTensor::from_storage(sd, [c])),
            ),
            None => (None, None),
        };
        Ok((dx, gw, gb))
    }
}
