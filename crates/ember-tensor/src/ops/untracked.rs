//! Ops autograd never records: the optimizers' fused steps and pointwise updates, AMP's
//! unscale and scale update, and what a tensor's storage is. PyTorch's optimizers and
//! `GradScaler` run these under `no_grad`; here an in-place one that would need recording
//! (grad mode on and a tensor involved requires grad) is an error that says to wrap it in
//! `no_grad()`, never a silently untracked write.

use crate::WithDType;
use crate::autograd::error::{AutogradError, Result};
use crate::params::{FusedAdamOptions, FusedSgdOptions};
use crate::tensor::Tensor;

/// The untracked tensors of `ts`.
fn raws(ts: &[Tensor]) -> Vec<crate::RawTensor> {
    ts.iter().map(Tensor::raw).collect()
}

/// Refuses an in-place `op` on `all` (the written tensor first) that autograd would have
/// to record.
fn untracked(op: &'static str, all: &[&Tensor]) -> Result<()> {
    if crate::autograd::mode::is_grad_enabled() && all.iter().any(|t| t.requires_grad()) {
        return Err(AutogradError::Inplace(format!(
            "{op}: this in-place op is not recorded by autograd, and a tensor it involves requires grad; call it under no_grad() (as optimizers do)"
        ))
        .into());
    }
    Ok(())
}

impl Tensor {
    /// `self += value * t1 * t2` in place (`torch.Tensor.addcmul_`), `t1` and `t2`
    /// broadcast to this shape; on the CPU, for f32/f64 operands of this shape, in one pass.
    /// Not recorded by autograd (call it under `no_grad`).
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let v = Tensor::from_slice(&[1f32, 2.], [2], &Device::Cpu)?;
    /// let g = Tensor::from_slice(&[3f32, 4.], [2], &Device::Cpu)?;
    /// v.addcmul_(&g, &g, 0.5)?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![5.5, 10.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn addcmul_(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<&Tensor> {
        untracked("addcmul_", &[self, t1, t2])?;
        self.raw().addcmul_(&t1.raw(), &t2.raw(), value)?;
        Ok(self)
    }

    /// `self += value * t1 / t2` in place (`torch.Tensor.addcdiv_`), PyTorch's order of
    /// operations. Not recorded by autograd (call it under `no_grad`).
    pub fn addcdiv_(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<&Tensor> {
        untracked("addcdiv_", &[self, t1, t2])?;
        self.raw().addcdiv_(&t1.raw(), &t2.raw(), value)?;
        Ok(self)
    }

    /// `self += weight * (end - self)` in place (`torch.Tensor.lerp_` with a scalar
    /// weight), rounded as PyTorch's kernel. Not recorded by autograd (call it under
    /// `no_grad`).
    pub fn lerp_(&self, end: &Tensor, weight: f64) -> Result<&Tensor> {
        untracked("lerp_", &[self, end])?;
        self.raw().lerp_(&end.raw(), weight)?;
        Ok(self)
    }

    /// One SGD step over every param at once (PyTorch's `_fused_sgd_`): see
    /// [`FusedSgdOptions`]. One kernel launch per dtype on CUDA, one parallel pass on the
    /// CPU. Not recorded by autograd (call it under `no_grad`).
    pub fn fused_sgd_(
        params: &[Tensor],
        grads: &[Tensor],
        momentum_buffers: &[Tensor],
        first_step: &[bool],
        o: &FusedSgdOptions,
    ) -> Result<()> {
        let refs: Vec<&Tensor> = params.iter().collect();
        untracked("_fused_sgd_", &refs)?;
        crate::RawTensor::fused_sgd_(
            &raws(params),
            &raws(grads),
            &raws(momentum_buffers),
            first_step,
            o,
        )?;
        Ok(())
    }

    /// One Adam/AdamW step over every param at once (PyTorch's `_fused_adam_`): see
    /// [`FusedAdamOptions`]. Not recorded by autograd (call it under `no_grad`).
    pub fn fused_adam_(
        params: &[Tensor],
        grads: &[Tensor],
        (exp_avgs, exp_avg_sqs, max_exp_avg_sqs): (&[Tensor], &[Tensor], &[Tensor]),
        steps: &[f64],
        o: &FusedAdamOptions,
    ) -> Result<()> {
        let refs: Vec<&Tensor> = params.iter().collect();
        untracked("_fused_adam_", &refs)?;
        crate::RawTensor::fused_adam_(
            &raws(params),
            &raws(grads),
            (&raws(exp_avgs), &raws(exp_avg_sqs), &raws(max_exp_avg_sqs)),
            steps,
            o,
        )?;
        Ok(())
    }

    /// AMP's unscale (PyTorch's `_amp_foreach_non_finite_check_and_unscale_`): multiplies
    /// every tensor by `inv_scale` in place and sets `found_inf` (one f32 element) to 1
    /// when any element is inf or NaN, without a host wait.
    pub fn amp_foreach_non_finite_check_and_unscale_(
        tensors: &[Tensor],
        found_inf: &Tensor,
        inv_scale: &Tensor,
    ) -> Result<()> {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        untracked("_amp_foreach_non_finite_check_and_unscale_", &refs)?;
        crate::RawTensor::amp_foreach_non_finite_check_and_unscale_(
            &raws(tensors),
            &found_inf.raw(),
            &inv_scale.raw(),
        )?;
        Ok(())
    }

    /// AMP's scale update (PyTorch's `_amp_update_scale_`) on this one-element scale, on the
    /// device: backs off on `found_inf`, grows after `growth_interval` clean steps.
    pub fn amp_update_scale_(
        &self,
        growth_tracker: &Tensor,
        found_inf: &Tensor,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: i32,
    ) -> Result<&Tensor> {
        untracked("_amp_update_scale_", &[self, growth_tracker])?;
        self.raw().amp_update_scale_(
            &growth_tracker.raw(),
            &found_inf.raw(),
            growth_factor,
            backoff_factor,
            growth_interval,
        )?;
        Ok(self)
    }

    /// Runs `f` on the elements of this contiguous CPU tensor, in place, as `&[T]` (the
    /// storage read-locked meanwhile): zero-copy access for code that hands host memory to a
    /// C library (the MPI collectives of `ember-parallel`). An error, naming `op`, for a
    /// tensor on another device, a non-contiguous one, or `T` other than its dtype.
    pub fn with_cpu_slice<T: WithDType, R>(
        &self,
        op: &'static str,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        Ok(self.raw().with_cpu_slice(op, f)?)
    }

    /// As [`with_cpu_slice`](Tensor::with_cpu_slice), with `&mut [T]`: the storage is
    /// write-locked (its version bumped, as every in-place write does) while `f` runs. Not
    /// recorded by autograd (call it under `no_grad`).
    pub fn with_cpu_slice_mut<T: WithDType, R>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        untracked(op, &[self])?;
        Ok(self.raw().with_cpu_slice_mut(op, f)?)
    }

    /// `true` if both tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        self.raw().shares_storage(&other.raw())
    }

    /// An identifier of the storage: equal for tensors that share one (as
    /// [`shares_storage`](Tensor::shares_storage) says), distinct between live storages.
    pub fn storage_id(&self) -> usize {
        self.raw().storage_id()
    }

    /// Whether this tensor's memory is pinned (from [`pin_memory`](Tensor::pin_memory)).
    pub fn is_pinned(&self) -> bool {
        self.raw().is_pinned()
    }
}
