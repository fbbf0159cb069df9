//! The optimizers' multi-tensor steps on CUDA, as PyTorch's `torch._fused_sgd_` and
//! `torch._fused_adam_`/`_fused_adamw_`: [`Tensor::fused_sgd_`] and [`Tensor::fused_adam_`]
//! update every parameter of a list in one kernel launch per dtype (`kernels/optim.cu`,
//! `cuda/optim.rs`), with the math of `ember-nn`'s per-op `SGD`/`Adam`/`AdamW` steps.
//!
//! Only CUDA tensors: on the CPU the optimizers keep their per-op path (whose in-place ops
//! are single passes already).

use std::collections::HashSet;
use std::sync::Arc;

use crate::cuda::{CudaStorage, OptimRow, optim_step};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{Storage, StorageCell, write_many_read_many};
use crate::tensor::{Tensor, same_device};

/// The hyperparameters of [`Tensor::fused_sgd_`] (`torch.optim.SGD`'s).
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

/// The hyperparameters of [`Tensor::fused_adam_`] (`torch.optim.Adam`'s and `AdamW`'s).
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

fn addr(c: &Arc<StorageCell>) -> usize {
    Arc::as_ptr(c) as usize
}

/// Checks a multi-tensor step's lists: `columns[0]` the params, `columns[1]` the grads (read),
/// the others states (written); each list as long as the params, every tensor a contiguous
/// CUDA tensor of its param's dtype (a float one) and shape, on one device, each in its own
/// storage.
fn check(op: &'static str, names: &[&str], columns: &[&[Tensor]]) -> Result<()> {
    let n = columns.first().map_or(0, |c| c.len());
    for (name, c) in names.iter().zip(columns) {
        if c.len() != n {
            return Err(TensorError::invalid(
                op,
                format!("expected {n} {name} (one per param), found {}", c.len()),
            ));
        }
    }
    let all: Vec<&Tensor> = columns.iter().flat_map(|c| c.iter()).collect();
    let device = same_device(&all)?;
    if !device.is_cuda() {
        return Err(TensorError::invalid(
            op,
            format!("expected CUDA tensors, found {device} ones (the CPU takes the per-op path)"),
        ));
    }
    let mut cells = HashSet::with_capacity(all.len());
    for (name, c) in names.iter().zip(columns) {
        for (i, t) in c.iter().enumerate() {
            let p = &columns[0][i];
            if !p.dtype().is_float() {
                return Err(TensorError::unsupported(op, p.dtype()));
            }
            if t.dtype() != p.dtype() || t.shape() != p.shape() {
                return Err(TensorError::invalid(
                    op,
                    format!(
                        "{name}[{i}]: expected {} {:?} as its param, found {} {:?}",
                        p.dtype(),
                        p.dims(),
                        t.dtype(),
                        t.dims()
                    ),
                ));
            }
            if !t.is_contiguous() {
                return Err(TensorError::invalid(
                    op,
                    format!(
                        "{name}[{i}]: expected a contiguous tensor, found strides {:?}",
                        t.strides()
                    ),
                ));
            }
            if !cells.insert(addr(t.cell())) {
                return Err(TensorError::invalid(
                    op,
                    format!(
                        "{name}[{i}]: expected its own storage, found one shared with another tensor of the step"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Locks every storage (grads for reading, the others for writing) and runs the kernel over
/// one row per param: param, grad, then the states (`None`: a state the options leave out,
/// address 0), with `extras[..][i]` after the counts.
fn run(
    op: &'static str,
    kernel: &str,
    (params, grads): (&[Tensor], &[Tensor]),
    states: &[Option<&[Tensor]>],
    extras: &[Vec<i64>],
    scalars: impl Fn(&mut ember_kernels::KernelArgs),
) -> Result<()> {
    let n = params.len();
    // Written: the params, then each present state column.
    let written: Vec<&[Tensor]> = std::iter::once(params)
        .chain(states.iter().flatten().copied())
        .collect();
    let wcells: Vec<&Arc<StorageCell>> = written
        .iter()
        .flat_map(|c| c.iter().map(Tensor::cell))
        .collect();
    let rcells: Vec<&Arc<StorageCell>> = grads.iter().map(Tensor::cell).collect();
    let lock_error = || TensorError::invalid(op, "internal error: lock count");
    write_many_read_many(&wcells, &rcells, |ws, rs| {
        let ws: Vec<&Storage> = ws.iter().map(|s| &**s).collect();
        let mut rows: Vec<OptimRow<'_>> = Vec::with_capacity(n);
        for i in 0..n {
            let param = (ws.get(i).copied(), params.get(i));
            let grad = (rs.get(i).copied(), grads.get(i));
            let mut tensors = vec![on_cuda(op, param)?, on_cuda(op, grad)?];
            let mut column = 1;
            for state in states {
                if let Some(c) = state {
                    tensors.push(on_cuda(op, (ws.get(column * n + i).copied(), c.get(i)))?);
                    column += 1;
                } else {
                    tensors.push(None);
                }
            }
            if tensors.iter().take(2).any(Option::is_none) {
                return Err(lock_error());
            }
            rows.push(OptimRow {
                tensors,
                extras: extras.iter().filter_map(|e| e.get(i).copied()).collect(),
            });
        }
        optim_step(op, kernel, &rows, &scalars)
    })
}

/// A locked storage and its tensor as a CUDA view (`None` when either is missing).
fn on_cuda<'a>(
    op: &'static str,
    (s, t): (Option<&'a Storage>, Option<&'a Tensor>),
) -> Result<Option<(&'a CudaStorage, &'a Layout)>> {
    match (s, t) {
        (Some(Storage::Cuda(c)), Some(t)) => Ok(Some((c, t.layout()))),
        (Some(other), Some(_)) => Err(TensorError::invalid(
            op,
            format!("expected a CUDA storage, found one on {}", other.device()),
        )),
        _ => Ok(None),
    }
}

impl Tensor {
    /// One SGD step over `params` (`torch._fused_sgd_`; `torch.optim.SGD`'s update): for each
    /// param `p` with gradient `g` (of the same shape and dtype),
    ///
    /// ```text
    /// g = -g if maximize;  g += weight_decay * p               (if weight_decay != 0)
    /// b = g (first step) | momentum * b + (1 - dampening) * g  (if momentum != 0)
    /// g = g + momentum * b (nesterov) | b
    /// p += -lr * g
    /// ```
    ///
    /// `momentum_buffers` has one tensor per param when `momentum != 0` (its contents are
    /// ignored where `first_step[i]`), and is empty otherwise. Every tensor is a contiguous
    /// CUDA tensor of its param's float dtype and shape on one device, each in its own
    /// storage. One kernel launch per dtype present, however many params there are; each
    /// scalar is cast once to f32 (f64 for f64 params) and every op rounds as Ember's per-op
    /// path does, so f32 params get its bits; f16/bf16 params are updated in f32 and rounded
    /// once (PyTorch's fused kernels).
    pub fn fused_sgd_(
        params: &[Tensor],
        grads: &[Tensor],
        momentum_buffers: &[Tensor],
        first_step: &[bool],
        o: &FusedSgdOptions,
    ) -> Result<()> {
        const OP: &str = "_fused_sgd_";
        let _op = crate::profile::op(OP, &[]);
        let with_momentum = o.momentum != 0.0;
        let mut names = vec!["params", "grads"];
        let mut columns = vec![params, grads];
        if with_momentum {
            names.push("momentum_buffers");
            columns.push(momentum_buffers);
        } else if !momentum_buffers.is_empty() {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "expected no momentum_buffers with momentum 0, found {}",
                    momentum_buffers.len()
                ),
            ));
        }
        check(OP, &names, &columns)?;
        if with_momentum && first_step.len() != params.len() {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "expected {} first_step flags, found {}",
                    params.len(),
                    first_step.len()
                ),
            ));
        }
        let first: Vec<i64> = (0..params.len())
            .map(|i| i64::from(first_step.get(i).copied().unwrap_or(false)))
            .collect();
        let flags = i32::from(o.maximize) | i32::from(o.nesterov) << 1;
        let buffers = with_momentum.then_some(momentum_buffers);
        run(
            OP,
            "optim_sgd",
            (params, grads),
            &[buffers],
            &[first],
            |args| {
                args.push(o.lr)
                    .push(o.momentum)
                    .push(o.dampening)
                    .push(o.weight_decay)
                    .push(flags);
            },
        )
    }

    /// One Adam (or, with `decoupled_weight_decay`, AdamW) step over `params`
    /// (`torch._fused_adam_`/`_fused_adamw_`; `torch.optim.Adam`'s update as
    /// `_single_tensor_adam` computes it): for each param `p` with gradient `g` at step
    /// `t = steps[i]` (already counted),
    ///
    /// ```text
    /// g = -g if maximize;  p *= 1 - lr * wd (decoupled) | g += wd * p   (if wd != 0)
    /// m = lerp(m, g, 1 - β₁);  v = β₂ v + (1 - β₂) g²;  (amsgrad: v̂ = max(v̂, v), used for v)
    /// p += -lr / (1 - β₁ᵗ) * m / (sqrt(v) / sqrt(1 - β₂ᵗ) + eps)
    /// ```
    ///
    /// with the bias corrections computed on the host in f64 per tensor. `max_exp_avg_sqs`
    /// has one tensor per param with `amsgrad`, none otherwise. The tensors' requirements,
    /// the launches and the rounding are [`Tensor::fused_sgd_`]'s.
    pub fn fused_adam_(
        params: &[Tensor],
        grads: &[Tensor],
        (exp_avgs, exp_avg_sqs, max_exp_avg_sqs): (&[Tensor], &[Tensor], &[Tensor]),
        steps: &[f64],
        o: &FusedAdamOptions,
    ) -> Result<()> {
        const OP: &str = "_fused_adam_";
        let _op = crate::profile::op(OP, &[]);
        let mut names = vec!["params", "grads", "exp_avgs", "exp_avg_sqs"];
        let mut columns = vec![params, grads, exp_avgs, exp_avg_sqs];
        if o.amsgrad {
            names.push("max_exp_avg_sqs");
            columns.push(max_exp_avg_sqs);
        } else if !max_exp_avg_sqs.is_empty() {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "expected no max_exp_avg_sqs without amsgrad, found {}",
                    max_exp_avg_sqs.len()
                ),
            ));
        }
        check(OP, &names, &columns)?;
        if steps.len() != params.len() {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "expected {} step counts, found {}",
                    params.len(),
                    steps.len()
                ),
            ));
        }
        let (beta1, beta2) = o.betas;
        // `_single_tensor_adam`'s host arithmetic, per tensor.
        let step_sizes: Vec<i64> = steps
            .iter()
            .map(|&t| (o.lr / (1.0 - beta1.powf(t))).to_bits() as i64)
            .collect();
        let bc2_sqrts: Vec<i64> = steps
            .iter()
            .map(|&t| (1.0 - beta2.powf(t)).powf(0.5).to_bits() as i64)
            .collect();
        let flags = i32::from(o.maximize)
            | i32::from(o.amsgrad) << 1
            | i32::from(o.decoupled_weight_decay) << 2;
        let states = [
            Some(exp_avgs),
            Some(exp_avg_sqs),
            o.amsgrad.then_some(max_exp_avg_sqs),
        ];
        run(
            OP,
            "optim_adam",
            (params, grads),
            &states,
            &[step_sizes, bc2_sqrts],
            |args| {
                args.push(o.lr)
                    .push(beta1)
                    .push(beta2)
                    .push(o.eps)
                    .push(o.weight_decay)
                    .push(flags);
            },
        )
    }
}
