//! The GradScaler's two ops (`ember-amp`), as PyTorch's private ATen ops:
//! [`Tensor::amp_foreach_non_finite_check_and_unscale_`] (one fused pass per device and
//! dtype over all gradients: CPU one parallel loop, CUDA one multi-tensor launch, Note
//! [Multi-tensor launches] in `cuda/amp.rs`) and [`Tensor::amp_update_scale_`].

use std::collections::HashSet;
use std::sync::Arc;

use crate::cpu::amp::ScaleUpdate;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::raw::{RawTensor, same_device};
use crate::storage::{Storage, StorageCell, write_many_read};

/// Checks that `t` is a one-element tensor of `dtype` (PyTorch's "found_inf must be a
/// 1-element tensor." and "... must be a float tensor.").
fn one_element(op: &'static str, what: &str, t: &RawTensor, dtype: DType) -> Result<()> {
    if t.numel() != 1 {
        return Err(TensorError::invalid(
            op,
            format!(
                "{what} must be a 1-element tensor, but has {} elements",
                t.numel()
            ),
        ));
    }
    if t.dtype() != dtype {
        return Err(TensorError::invalid(
            op,
            format!("{what} must be a {dtype} tensor, but is {}", t.dtype()),
        ));
    }
    Ok(())
}

fn addr(c: &Arc<StorageCell>) -> usize {
    Arc::as_ptr(c) as usize
}

impl RawTensor {
    /// Multiplies every element of every tensor of `tensors` by `inv_scale` in place and
    /// sets `found_inf` to 1 if any element was an infinity or a NaN
    /// (`torch._amp_foreach_non_finite_check_and_unscale_`; `found_inf` is never cleared).
    ///
    /// `found_inf` and `inv_scale` are one-element f32 tensors; every tensor is a float
    /// tensor on their device. One fused pass per dtype: on the CPU one parallel loop over
    /// all tensors of that dtype, on CUDA one kernel launch, however many tensors there
    /// are. Values are computed in f32 (f64 for f64 tensors) and rounded once.
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let g = Tensor::from_slice(&[2f32, 4.], [2], &Device::Cpu)?;
    /// let h = Tensor::from_slice(&[f32::INFINITY], [1], &Device::Cpu)?;
    /// let found = Tensor::zeros([1], ())?;
    /// let inv = Tensor::from_slice(&[0.5f32], [1], &Device::Cpu)?;
    /// Tensor::amp_foreach_non_finite_check_and_unscale_(&[g.clone(), h], &found, &inv)?;
    /// assert_eq!(g.to_vec::<f32>()?, vec![1.0, 2.0]);
    /// assert_eq!(found.to_vec::<f32>()?, vec![1.0]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn amp_foreach_non_finite_check_and_unscale_(
        tensors: &[RawTensor],
        found_inf: &RawTensor,
        inv_scale: &RawTensor,
    ) -> Result<()> {
        let _op = crate::profile::op("_amp_foreach_non_finite_check_and_unscale_", &[]);
        const OP: &str = "_amp_foreach_non_finite_check_and_unscale_";
        one_element(OP, "found_inf", found_inf, DType::F32)?;
        one_element(OP, "inv_scale", inv_scale, DType::F32)?;
        let mut all: Vec<&RawTensor> = vec![found_inf, inv_scale];
        all.extend(tensors);
        same_device(&all)?;
        for t in tensors {
            if !t.dtype().is_float() {
                return Err(TensorError::unsupported(OP, t.dtype()));
            }
            if t.layout().has_internal_overlap() {
                return Err(TensorError::InPlaceOverlap { op: OP });
            }
        }
        if addr(found_inf.cell()) == addr(inv_scale.cell()) {
            return Err(TensorError::invalid(
                OP,
                "found_inf and inv_scale share storage",
            ));
        }
        let reserved = [addr(found_inf.cell()), addr(inv_scale.cell())];
        // A non-contiguous tensor is unscaled in a contiguous copy written back afterwards;
        // tensors whose storage is shared (with another tensor of the list, or with
        // found_inf/inv_scale) go to later batches, so that each batch locks each storage
        // once. The usual case (gradients, each its own contiguous storage) is one batch.
        let mut work: Vec<(RawTensor, Option<&RawTensor>)> = Vec::with_capacity(tensors.len());
        for t in tensors {
            if t.numel() == 0 {
                continue;
            }
            if t.is_contiguous() && !reserved.contains(&addr(t.cell())) {
                work.push((t.clone(), None));
            } else {
                work.push((t.copy()?, Some(t)));
            }
        }
        let mut pending: Vec<&(RawTensor, Option<&RawTensor>)> = work.iter().collect();
        while !pending.is_empty() {
            let mut seen = HashSet::new();
            let (batch, rest): (Vec<_>, Vec<_>) = pending
                .into_iter()
                .partition(|(t, _)| seen.insert(addr(t.cell())));
            pending = rest;
            let mut cells: Vec<&Arc<StorageCell>> = batch.iter().map(|(t, _)| t.cell()).collect();
            cells.push(found_inf.cell());
            write_many_read(&cells, inv_scale.cell(), |storages, inv| {
                let Some((found, grads)) = storages.split_last_mut() else {
                    return Ok(());
                };
                let mut items: Vec<(&mut Storage, &crate::layout::Layout)> = grads
                    .iter_mut()
                    .zip(&batch)
                    .map(|(s, (t, _))| (&mut **s, t.layout()))
                    .collect();
                Storage::amp_unscale(
                    &mut items,
                    (found, found_inf.layout()),
                    (inv, inv_scale.layout()),
                )
            })?;
        }
        for (copy, original) in &work {
            if let Some(original) = original {
                original.copy_(copy)?;
            }
        }
        Ok(())
    }

    /// Updates a loss scale in place (`torch._amp_update_scale_`): this one-element f32
    /// tensor is the scale, `growth_tracker` a one-element i32 tensor counting successful
    /// steps, `found_inf` a one-element f32 tensor. If `found_inf` is nonzero the scale is
    /// multiplied by `backoff_factor` and the tracker reset; otherwise the tracker counts
    /// the step, and at `growth_interval` the scale is multiplied by `growth_factor` (unless
    /// that overflows f32) and the tracker reset. On CUDA a one-thread kernel: nothing
    /// comes back to the host.
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let scale = Tensor::from_slice(&[1024f32], [1], &Device::Cpu)?;
    /// let tracker = Tensor::from_slice(&[1i32], [1], &Device::Cpu)?;
    /// let found = Tensor::zeros([1], ())?;
    /// scale.amp_update_scale_(&tracker, &found, 2.0, 0.5, 2)?; // the 2nd good step: grow
    /// assert_eq!(scale.to_vec::<f32>()?, vec![2048.0]);
    /// assert_eq!(tracker.to_vec::<i32>()?, vec![0]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn amp_update_scale_(
        &self,
        growth_tracker: &RawTensor,
        found_inf: &RawTensor,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: i32,
    ) -> Result<&RawTensor> {
        let _op = crate::profile::op1("_amp_update_scale_", self);
        const OP: &str = "_amp_update_scale_";
        one_element(OP, "current_scale", self, DType::F32)?;
        one_element(OP, "growth_tracker", growth_tracker, DType::I32)?;
        one_element(OP, "found_inf", found_inf, DType::F32)?;
        same_device(&[self, growth_tracker, found_inf])?;
        let (s, t, f) = (
            addr(self.cell()),
            addr(growth_tracker.cell()),
            addr(found_inf.cell()),
        );
        if s == t || s == f || t == f {
            return Err(TensorError::invalid(
                OP,
                "current_scale, growth_tracker and found_inf must not share storage",
            ));
        }
        let update = ScaleUpdate {
            growth_factor,
            backoff_factor,
            growth_interval,
        };
        write_many_read(
            &[self.cell(), growth_tracker.cell()],
            found_inf.cell(),
            |storages, found| match storages {
                [scale, tracker] => Storage::amp_update_scale(
                    (scale, self.layout()),
                    (tracker, growth_tracker.layout()),
                    (found, found_inf.layout()),
                    update,
                ),
                _ => Err(TensorError::invalid(OP, "internal error: lock count")),
            },
        )?;
        Ok(self)
    }
}
