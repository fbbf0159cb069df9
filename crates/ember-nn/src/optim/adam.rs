//! [`Adam`] and [`AdamW`] (`torch.optim.Adam`/`AdamW`, their `_single_tensor_adam`).

use std::collections::BTreeMap;

use ember_tensor::{Device, FusedAdamOptions, Tensor as Raw};

use super::state::ParamState;
use super::{
    Groups, Hyper, MultiTensor, Optimizer, ParamGroup, ParamGroupSpec, column, follow,
    foreign_hyper, param_and_grad,
};
use crate::{NnError, Result, StateDict, Tensor};

/// [`Adam`]'s hyperparameters, the defaults of every group (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Coefficients of the running averages of the gradient and its square (default
    /// (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for numerical stability (default 1e-8).
    pub eps: f64,
    /// Weight decay, an L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// AMSGrad: normalize by the maximum of the past squared-gradient averages (default
    /// `false`).
    pub amsgrad: bool,
    /// Maximize the objective (default `false`).
    pub maximize: bool,
}

impl Default for AdamOptions {
    fn default() -> Self {
        AdamOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
        }
    }
}

/// [`AdamW`]'s hyperparameters: [`AdamOptions`]' with a decoupled weight decay of 0.01 by
/// default.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Coefficients of the running averages of the gradient and its square (default
    /// (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for numerical stability (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay: each step multiplies the parameter by `1 - lr *
    /// weight_decay` (default 0.01).
    pub weight_decay: f64,
    /// AMSGrad (default `false`).
    pub amsgrad: bool,
    /// Maximize the objective (default `false`).
    pub maximize: bool,
}

impl Default for AdamWOptions {
    fn default() -> Self {
        AdamWOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
            maximize: false,
        }
    }
}

option_setters!(AdamOptions {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    maximize: bool,
});

option_setters!(AdamWOptions {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    maximize: bool,
});

fn adam_defaults(o: AdamOptions, decoupled_weight_decay: bool) -> ParamGroup {
    ParamGroup {
        params: Vec::new(),
        lr: o.lr,
        weight_decay: o.weight_decay,
        maximize: o.maximize,
        hyper: Hyper::Adam {
            betas: o.betas,
            eps: o.eps,
            amsgrad: o.amsgrad,
            decoupled_weight_decay,
        },
    }
}

/// A parameter's Adam state.
#[derive(Debug)]
struct AdamState {
    /// Steps taken (PyTorch keeps it as a 0-dim f32 tensor on the CPU).
    step: f64,
    exp_avg: Raw,
    exp_avg_sq: Raw,
    max_exp_avg_sq: Option<Raw>,
}

impl ParamState for AdamState {
    const NAMES: &'static [&'static str] = &["step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"];
    const SCALARS: &'static [&'static str] = &["step"];

    fn entries(&self) -> Result<Vec<(&'static str, Raw)>> {
        let mut out = vec![
            ("step", Raw::scalar(self.step as f32, Device::Cpu)?),
            ("exp_avg", self.exp_avg.clone()),
            ("exp_avg_sq", self.exp_avg_sq.clone()),
        ];
        if let Some(m) = &self.max_exp_avg_sq {
            out.push(("max_exp_avg_sq", m.clone()));
        }
        Ok(out)
    }

    fn validate(&self, key: &str) -> Result<()> {
        let step = self.step;
        if !(step >= 0.0 && step.is_finite() && step.fract() == 0.0) {
            return Err(NnError::invalid(
                "load_state_dict",
                format!("{key}.step: expected a whole number of steps >= 0, found {step}"),
            )
            .into());
        }
        Ok(())
    }

    fn from_entries(
        mut entries: BTreeMap<&'static str, Raw>,
    ) -> std::result::Result<Self, Vec<&'static str>> {
        let step = entries
            .remove("step")
            .and_then(|s| s.to_scalar().ok())
            .map(|s| s.to_f64());
        let (exp_avg, exp_avg_sq) = (entries.remove("exp_avg"), entries.remove("exp_avg_sq"));
        match (step, exp_avg, exp_avg_sq) {
            (Some(step), Some(exp_avg), Some(exp_avg_sq)) => Ok(AdamState {
                step,
                exp_avg,
                exp_avg_sq,
                max_exp_avg_sq: entries.remove("max_exp_avg_sq"),
            }),
            (step, exp_avg, exp_avg_sq) => Err([
                ("step", step.is_none()),
                ("exp_avg", exp_avg.is_none()),
                ("exp_avg_sq", exp_avg_sq.is_none()),
            ]
            .into_iter()
            .filter_map(|(name, lacks)| lacks.then_some(name))
            .collect()),
        }
    }
}

/// Adam (`torch.optim.Adam`). Per parameter with gradient `g`, at step `t`:
///
/// ```text
/// g = -g if maximize;  g += weight_decay * p
/// m = lerp(m, g, 1 - β₁);  v = β₂ v + (1 - β₂) g²;  (amsgrad: v̂ = max(v̂, v), used for v)
/// p -= lr / (1 - β₁ᵗ) * m / (sqrt(v) / sqrt(1 - β₂ᵗ) + eps)
/// ```
#[derive(Debug)]
pub struct Adam {
    groups: Groups<AdamState>,
}

/// AdamW (`torch.optim.AdamW`): [`Adam`] with decoupled weight decay, `p *= 1 - lr *
/// weight_decay` before the update instead of an L2 term in the gradient.
#[derive(Debug)]
pub struct AdamW {
    groups: Groups<AdamState>,
}

impl Adam {
    /// Adam over `params` (one group). Errors on invalid hyperparameters with PyTorch's
    /// messages (`Adam: Invalid beta parameter at index 0: 1`).
    pub fn new(params: Vec<Tensor>, options: impl Into<AdamOptions>) -> Result<Adam> {
        Adam::with_groups(vec![ParamGroupSpec::new(params)], options.into())
    }

    /// Adam over several groups, each overriding some of `options`.
    pub fn with_groups(groups: Vec<ParamGroupSpec>, options: AdamOptions) -> Result<Adam> {
        Ok(Adam {
            groups: Groups::new("Adam", adam_defaults(options, false), groups)?,
        })
    }
}

impl AdamW {
    /// AdamW over `params` (one group).
    pub fn new(params: Vec<Tensor>, options: impl Into<AdamWOptions>) -> Result<AdamW> {
        AdamW::with_groups(vec![ParamGroupSpec::new(params)], options.into())
    }

    /// AdamW over several groups, each overriding some of `options`.
    pub fn with_groups(groups: Vec<ParamGroupSpec>, options: AdamWOptions) -> Result<AdamW> {
        let o = AdamOptions {
            lr: options.lr,
            betas: options.betas,
            eps: options.eps,
            weight_decay: options.weight_decay,
            amsgrad: options.amsgrad,
            maximize: options.maximize,
        };
        Ok(AdamW {
            groups: Groups::new("AdamW", adam_defaults(o, true), groups)?,
        })
    }
}

/// One Adam step over every group: one multi-tensor op per device (on CUDA a launch per
/// dtype, on the CPU one pass over the f32/f64 params; Note [Multi-tensor optimizer
/// steps]) for the parameters it admits, PyTorch's `_single_tensor_adam` op for op for the
/// others (CPU f16/bf16, non-contiguous or storage-sharing tensors).
fn adam_step(groups: &mut Groups<AdamState>) -> Result<()> {
    let _no_grad = ember_autograd::no_grad();
    let name = groups.name;
    for (group, slots) in groups.iter_mut() {
        let Hyper::Adam {
            betas,
            eps,
            amsgrad,
            decoupled_weight_decay,
        } = group.hyper
        else {
            return Err(foreign_hyper(name, group));
        };
        // Also the per-op path's hyperparameters.
        let h = FusedAdamOptions {
            lr: group.lr,
            betas,
            eps,
            weight_decay: group.weight_decay,
            amsgrad,
            maximize: group.maximize,
            decoupled_weight_decay,
        };
        let mut fused = MultiTensor::<f64>::new();
        for (p, slot) in group.params.iter().zip(slots) {
            let Some((param, grad)) = param_and_grad(p)? else {
                continue;
            };
            if let Some(s) = slot.as_mut() {
                s.exp_avg = follow(s.exp_avg.clone(), &param)?;
                s.exp_avg_sq = follow(s.exp_avg_sq.clone(), &param)?;
                if let Some(m) = s.max_exp_avg_sq.take() {
                    s.max_exp_avg_sq = Some(follow(m, &param)?);
                }
            }
            let mut existing = vec![&param, &grad];
            if let Some(s) = slot.as_ref() {
                existing.extend([&s.exp_avg, &s.exp_avg_sq]);
                existing.extend(s.max_exp_avg_sq.as_ref().filter(|_| amsgrad));
            }
            let admitted = fused.admits(&existing);
            let s = match slot {
                Some(s) => s,
                None => slot.insert(AdamState {
                    step: 0.0,
                    exp_avg: param.zeros_like()?,
                    exp_avg_sq: param.zeros_like()?,
                    max_exp_avg_sq: None,
                }),
            };
            if amsgrad && s.max_exp_avg_sq.is_none() {
                s.max_exp_avg_sq = Some(param.zeros_like()?);
            }
            s.step += 1.0;
            if !admitted {
                adam_single(&param, grad, s, &h)?;
                continue;
            }
            let mut row = vec![param.clone(), grad, s.exp_avg.clone(), s.exp_avg_sq.clone()];
            row.extend(s.max_exp_avg_sq.clone().filter(|_| amsgrad));
            fused.push(row, s.step);
        }
        for (_, rows) in &fused.batches {
            let max_exp_avg_sqs = if amsgrad { column(rows, 4) } else { Vec::new() };
            let steps: Vec<f64> = rows.iter().map(|(_, t)| *t).collect();
            Raw::fused_adam_(
                &column(rows, 0),
                &column(rows, 1),
                (&column(rows, 2), &column(rows, 3), &max_exp_avg_sqs),
                &steps,
                &h,
            )?;
        }
    }
    Ok(())
}

/// One parameter's update on the per-op path (`_single_tensor_adam`, op for op), its step
/// already counted.
fn adam_single(param: &Raw, mut grad: Raw, s: &AdamState, h: &FusedAdamOptions) -> Result<()> {
    let (beta1, beta2) = h.betas;
    if h.maximize {
        grad = grad.neg()?;
    }
    if h.weight_decay != 0.0 {
        if h.decoupled_weight_decay {
            param.mul_(1.0 - h.lr * h.weight_decay)?;
        } else {
            grad = grad.add(&param.mul(h.weight_decay)?)?;
        }
    }
    s.exp_avg.lerp_(&grad, 1.0 - beta1)?;
    s.exp_avg_sq
        .mul_(beta2)?
        .addcmul_(&grad, &grad, 1.0 - beta2)?;

    let bias_correction1 = 1.0 - beta1.powf(s.step);
    let bias_correction2 = 1.0 - beta2.powf(s.step);
    let step_size = h.lr / bias_correction1;
    let bias_correction2_sqrt = bias_correction2.powf(0.5);
    let second = match (&s.max_exp_avg_sq, h.amsgrad) {
        (Some(m), true) => {
            m.copy_(&m.maximum(&s.exp_avg_sq)?)?;
            m
        }
        _ => &s.exp_avg_sq,
    };
    let denom = second.sqrt()?.div(bias_correction2_sqrt)?;
    denom.add_(h.eps)?;
    param.addcdiv_(&s.exp_avg, &denom, -step_size)?;
    Ok(())
}

macro_rules! adam_optimizer {
    ($t:ty) => {
        impl Optimizer for $t {
            fn step(&mut self) -> Result<()> {
                let _step = ember_device::trace::range_named(
                    ember_device::trace::Category::UserAnnotation,
                    || concat!("Optimizer.step#", stringify!($t), ".step").into(),
                );
                adam_step(&mut self.groups)
            }

            fn param_groups(&self) -> &[ParamGroup] {
                &self.groups.groups
            }

            fn param_groups_mut(&mut self) -> &mut [ParamGroup] {
                &mut self.groups.groups
            }

            fn add_param_group(&mut self, group: ParamGroupSpec) -> Result<()> {
                self.groups.add(group)
            }

            fn state_dict(&self) -> Result<StateDict> {
                self.groups.state_dict()
            }

            fn load_state_dict(&mut self, state_dict: &StateDict) -> Result<()> {
                self.groups.load_state_dict(state_dict)
            }
        }
    };
}

adam_optimizer!(Adam);
adam_optimizer!(AdamW);
