//! The optimizers' multi-tensor steps, as PyTorch's `torch._fused_sgd_` and
//! `torch._fused_adam_`/`_fused_adamw_`: [`Tensor::fused_sgd_`] and [`Tensor::fused_adam_`]
//! update every parameter of a list with the math of `ember-nn`'s per-op
//! `SGD`/`Adam`/`AdamW` steps: on CUDA in one kernel launch per dtype (`kernels/optim.cu`,
//! `cuda/optim.rs`), on the CPU in one parallel pass over f32/f64 params (`cpu/optim.rs`;
//! f16/bf16 CPU params keep the per-op path, see Note [Fused optimizer bits on the CPU]).

use std::collections::HashSet;
use std::sync::Arc;

use ember_device::Device;

use crate::cpu::optim as cpu_optim;
use crate::cuda::{CudaStorage, OptimRow, optim_step};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::{FusedAdamOptions, FusedSgdOptions};
use crate::raw::{RawTensor, same_device};
use crate::storage::{CpuStorage, Storage, StorageCell, write_many_read_many};

fn addr(c: &Arc<StorageCell>) -> usize {
    Arc::as_ptr(c) as usize
}

/// Checks a multi-tensor step's lists: `columns[0]` the params, `columns[1]` the grads (read),
/// the others states (written); each list as long as the params, every tensor a contiguous
/// tensor of its param's dtype (a float one; f32 or f64 on the CPU) and shape, on one
/// device, each in its own storage. Returns that device.
fn check(op: &'static str, names: &[&str], columns: &[&[RawTensor]]) -> Result<Device> {
    let n = columns.first().map_or(0, |c| c.len());
    for (name, c) in names.iter().zip(columns) {
        if c.len() != n {
            return Err(TensorError::invalid(
                op,
                format!("expected {n} {name} (one per param), found {}", c.len()),
            ));
        }
    }
    let all: Vec<&RawTensor> = columns.iter().flat_map(|c| c.iter()).collect();
    let device = same_device(&all)?;
    let mut cells = HashSet::with_capacity(all.len());
    for (name, c) in names.iter().zip(columns) {
        for (i, t) in c.iter().enumerate() {
            let p = &columns[0][i];
            let cpu_dtype = matches!(p.dtype(), DType::F32 | DType::F64);
            if !p.dtype().is_float() || (device.is_cpu() && !cpu_dtype) {
                return Err(TensorError::UnsupportedDType {
                    op,
                    dtype: p.dtype(),
                    hint: "expected float params (f32 or f64 on the CPU, whose f16/bf16 params \
                           take the per-op path)",
                });
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
    Ok(device)
}

/// One param's storages, locked: the param and its states (written; `None` for a state the
/// options leave out), then its gradient (read), each with its tensor's layout.
struct Locked<'a> {
    written: Vec<Option<(&'a mut Storage, &'a Layout)>>,
    grad: Option<(&'a Storage, &'a Layout)>,
}

fn lock_error(op: &'static str) -> TensorError {
    TensorError::invalid(op, "internal error: lock count")
}

/// Locks every storage (grads for reading, the others for writing) and calls `f` with one
/// [`Locked`] row per param.
fn locked<R>(
    (params, grads): (&[RawTensor], &[RawTensor]),
    states: &[Option<&[RawTensor]>],
    f: impl for<'a> FnOnce(Vec<Locked<'a>>) -> Result<R>,
) -> Result<R> {
    let n = params.len();
    // Written: the params, then each present state column.
    let columns: Vec<&[RawTensor]> = std::iter::once(params)
        .chain(states.iter().flatten().copied())
        .collect();
    let wcells: Vec<&Arc<StorageCell>> = columns
        .iter()
        .flat_map(|c| c.iter().map(RawTensor::cell))
        .collect();
    let rcells: Vec<&Arc<StorageCell>> = grads.iter().map(RawTensor::cell).collect();
    write_many_read_many(&wcells, &rcells, |ws, rs| {
        let mut ws: Vec<Option<&mut Storage>> = ws.iter_mut().map(|s| Some(&mut **s)).collect();
        let mut rows = Vec::with_capacity(n);
        for i in 0..n {
            // Param i's written storages, column by column, with their layouts.
            let mut present = columns.iter().enumerate().map(|(column, c)| {
                let s = ws.get_mut(column * n + i).and_then(Option::take);
                s.zip(c.get(i).map(RawTensor::layout))
            });
            let mut written = vec![present.next().flatten()];
            for state in states {
                written.push(state.and_then(|_| present.next().flatten()));
            }
            let grad = rs.get(i).copied().zip(grads.get(i).map(RawTensor::layout));
            rows.push(Locked { written, grad });
        }
        f(rows)
    })
}

/// Runs CUDA kernel `kernel` over one row per param: param, grad, then the states (`None`:
/// a state the options leave out, address 0), with `extras[..][i]` after the counts.
fn run_cuda(
    op: &'static str,
    kernel: &str,
    tensors: (&[RawTensor], &[RawTensor]),
    states: &[Option<&[RawTensor]>],
    extras: &[Vec<i64>],
    scalars: impl Fn(&mut ember_kernels::KernelArgs),
) -> Result<()> {
    locked(tensors, states, |rows| {
        let mut out: Vec<OptimRow<'_>> = Vec::with_capacity(rows.len());
        for (i, row) in rows.into_iter().enumerate() {
            let mut written = row.written.into_iter().map(|w| w.map(|(s, l)| (&*s, l)));
            let (Some(param), Some(grad)) = (written.next().flatten(), row.grad) else {
                return Err(lock_error(op));
            };
            let mut tensors = vec![on_cuda(op, Some(param))?, on_cuda(op, Some(grad))?];
            for state in written {
                tensors.push(on_cuda(op, state)?);
            }
            out.push(OptimRow {
                tensors,
                extras: extras.iter().filter_map(|e| e.get(i).copied()).collect(),
            });
        }
        optim_step(op, kernel, &out, &scalars)
    })
}

/// A locked storage and its tensor's layout as a CUDA view.
fn on_cuda<'a>(
    op: &'static str,
    t: Option<(&'a Storage, &'a Layout)>,
) -> Result<Option<(&'a CudaStorage, &'a Layout)>> {
    t.map(|(s, l)| Ok((s.as_cuda().ok_or_else(|| wrong_device(op, s.device()))?, l)))
        .transpose()
}

fn wrong_device(op: &'static str, device: Device) -> TensorError {
    TensorError::invalid(
        op,
        format!("expected every storage on one device, found one on {device}"),
    )
}

/// Runs the CPU kernel `update` over one row per param (`cpu/optim.rs`): param and states as
/// [`locked`] gives them, `extras[i]` its per-parameter values.
fn run_cpu<U: cpu_optim::Update>(
    op: &'static str,
    tensors: (&[RawTensor], &[RawTensor]),
    states: &[Option<&[RawTensor]>],
    extras: &[[f64; 2]],
    update: &U,
) -> Result<()> {
    fn host<'a>(op: &'static str, s: &'a Storage) -> Result<&'a CpuStorage> {
        s.as_cpu().ok_or_else(|| wrong_device(op, s.device()))
    }
    locked(tensors, states, |rows| {
        let mut out = Vec::with_capacity(rows.len());
        for (row, &extras) in rows.into_iter().zip(extras) {
            let Some((grad, lg)) = row.grad else {
                return Err(lock_error(op));
            };
            let mut written = Vec::with_capacity(row.written.len());
            for w in row.written {
                written.push(match w {
                    Some((s, l)) => {
                        let device = s.device();
                        match s.as_cpu_mut() {
                            Some(c) => Some((c, l)),
                            None => return Err(wrong_device(op, device)),
                        }
                    }
                    None => None,
                });
            }
            if written.first().is_none_or(Option::is_none) {
                return Err(lock_error(op));
            }
            out.push(cpu_optim::Row {
                written,
                grad: (host(op, grad)?, lg),
                extras,
            });
        }
        cpu_optim::step(op, out, update)
    })
}

impl RawTensor {
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
    /// tensor of its param's float dtype and shape on one device, each in its own storage.
    /// Each scalar is cast once to f32 (f64 for f64 params) and every op rounds as Ember's
    /// per-op path does, so f32 and f64 params get its bits. On CUDA: one kernel launch per
    /// dtype present, however many params there are; f16/bf16 params are updated in f32 and
    /// rounded once (PyTorch's fused kernels). On the CPU: one parallel pass over all the
    /// params, f32 and f64 ones only (Note [Fused optimizer bits on the CPU]).
    pub fn fused_sgd_(
        params: &[RawTensor],
        grads: &[RawTensor],
        momentum_buffers: &[RawTensor],
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
        let device = check(OP, &names, &columns)?;
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
        let buffers = with_momentum.then_some(momentum_buffers);
        if !device.is_cuda() {
            let extras: Vec<[f64; 2]> = first.iter().map(|&f| [f as f64, 0.0]).collect();
            return run_cpu(OP, (params, grads), &[buffers], &extras, o);
        }
        let flags = i32::from(o.maximize) | i32::from(o.nesterov) << 1;
        run_cuda(
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
    /// the devices' kernels and the rounding are [`Tensor::fused_sgd_`]'s.
    pub fn fused_adam_(
        params: &[RawTensor],
        grads: &[RawTensor],
        (exp_avgs, exp_avg_sqs, max_exp_avg_sqs): (&[RawTensor], &[RawTensor], &[RawTensor]),
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
        let device = check(OP, &names, &columns)?;
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
        // `_single_tensor_adam`'s host arithmetic, per tensor: the step size and the square
        // root of the second bias correction.
        let corrections: Vec<[f64; 2]> = steps
            .iter()
            .map(|&t| {
                [
                    o.lr / (1.0 - beta1.powf(t)),
                    (1.0 - beta2.powf(t)).powf(0.5),
                ]
            })
            .collect();
        let states = [
            Some(exp_avgs),
            Some(exp_avg_sqs),
            o.amsgrad.then_some(max_exp_avg_sqs),
        ];
        if !device.is_cuda() {
            return run_cpu(OP, (params, grads), &states, &corrections, o);
        }
        let bits =
            |k: usize| -> Vec<i64> { corrections.iter().map(|c| c[k].to_bits() as i64).collect() };
        let (step_sizes, bc2_sqrts) = (bits(0), bits(1));
        let flags = i32::from(o.maximize)
            | i32::from(o.amsgrad) << 1
            | i32::from(o.decoupled_weight_decay) << 2;
        run_cuda(
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
