//! [`SGD`]: stochastic gradient descent with momentum, dampening, Nesterov, weight decay
//! and maximize (`torch.optim.SGD`, its `_single_tensor_sgd`).

use std::collections::BTreeMap;

use ember_tensor::{FusedSgdOptions, Tensor as Raw};

use super::state::ParamState;
use super::{
    Groups, Hyper, MultiTensor, Optimizer, ParamGroup, ParamGroupSpec, column, follow,
    foreign_hyper, param_and_grad,
};
use crate::{Result, StateDict, Tensor};

/// [`SGD`]'s hyperparameters, the defaults of every group (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0).
    pub momentum: f64,
    /// Dampening for momentum (default 0).
    pub dampening: f64,
    /// Weight decay, an L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default `false`; needs momentum and zero dampening).
    pub nesterov: bool,
    /// Maximize the objective (default `false`).
    pub maximize: bool,
}

impl Default for SgdOptions {
    fn default() -> Self {
        SgdOptions {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }
}

option_setters!(SgdOptions {
    lr: f64,
    momentum: f64,
    dampening: f64,
    weight_decay: f64,
    nesterov: bool,
    maximize: bool,
});

impl SgdOptions {
    fn defaults(&self) -> ParamGroup {
        ParamGroup {
            params: Vec::new(),
            lr: self.lr,
            weight_decay: self.weight_decay,
            maximize: self.maximize,
            hyper: Hyper::Sgd {
                momentum: self.momentum,
                dampening: self.dampening,
                nesterov: self.nesterov,
            },
        }
    }
}

/// Stochastic gradient descent (`torch.optim.SGD`). Per parameter with gradient `g`:
///
/// ```text
/// g = -g if maximize;  g += weight_decay * p
/// b = g (first step) | momentum * b + (1 - dampening) * g;  g = b, or g + momentum * b (nesterov)
/// p -= lr * g
/// ```
#[allow(clippy::upper_case_acronyms)] // PyTorch's name.
#[derive(Debug)]
pub struct SGD {
    groups: Groups<SgdState>,
}

/// A parameter's momentum buffer.
#[derive(Debug)]
struct SgdState {
    momentum_buffer: Raw,
}

impl ParamState for SgdState {
    const NAMES: &'static [&'static str] = &["momentum_buffer"];
    const SCALARS: &'static [&'static str] = &[];

    fn entries(&self) -> Result<Vec<(&'static str, Raw)>> {
        Ok(vec![("momentum_buffer", self.momentum_buffer.clone())])
    }

    fn from_entries(
        mut entries: BTreeMap<&'static str, Raw>,
    ) -> std::result::Result<Self, Vec<&'static str>> {
        match entries.remove("momentum_buffer") {
            Some(momentum_buffer) => Ok(SgdState { momentum_buffer }),
            None => Err(vec!["momentum_buffer"]),
        }
    }
}

impl SGD {
    /// SGD over `params` (one group). Errors on invalid hyperparameters, with PyTorch's
    /// messages (`SGD: Invalid learning rate: -1`), and on an empty parameter list.
    pub fn new(params: Vec<Tensor>, options: impl Into<SgdOptions>) -> Result<SGD> {
        SGD::with_groups(vec![ParamGroupSpec::new(params)], options.into())
    }

    /// SGD over several groups, each overriding some of `options`.
    pub fn with_groups(groups: Vec<ParamGroupSpec>, options: SgdOptions) -> Result<SGD> {
        Ok(SGD {
            groups: Groups::new("SGD", options.defaults(), groups)?,
        })
    }
}

/// One parameter's update on the per-op path (`_single_tensor_sgd`, op for op).
fn sgd_single(
    param: &Raw,
    mut grad: Raw,
    slot: &mut Option<SgdState>,
    group: &ParamGroup,
    (momentum, dampening, nesterov): (f64, f64, bool),
) -> Result<()> {
    if group.maximize {
        grad = grad.neg()?;
    }
    if group.weight_decay != 0.0 {
        grad = grad.add(&param.mul(group.weight_decay)?)?;
    }
    if momentum != 0.0 {
        let buf = match slot {
            None => {
                let buf = grad.copy()?;
                *slot = Some(SgdState {
                    momentum_buffer: buf.clone(),
                });
                buf
            }
            Some(s) => {
                let buf = follow(s.momentum_buffer.clone(), param)?;
                s.momentum_buffer = buf.clone();
                buf.mul_(momentum)?;
                buf.add_(&grad.mul(1.0 - dampening)?)?;
                buf
            }
        };
        grad = if nesterov {
            grad.add(&buf.mul(momentum)?)?
        } else {
            buf
        };
    }
    param.add_(&grad.mul(-group.lr)?)?;
    Ok(())
}

impl Optimizer for SGD {
    fn step(&mut self) -> Result<()> {
        let _step =
            ember_device::trace::range_named(ember_device::trace::Category::UserAnnotation, || {
                "Optimizer.step#SGD.step".into()
            });
        let _no_grad = ember_autograd::no_grad();
        for (group, slots) in self.groups.iter_mut() {
            let Hyper::Sgd {
                momentum,
                dampening,
                nesterov,
            } = group.hyper
            else {
                return Err(foreign_hyper("SGD", group));
            };
            let hyper = (momentum, dampening, nesterov);
            // See Note [Multi-tensor optimizer steps]: one multi-tensor op per device (CUDA,
            // and f32/f64 on the CPU); the rest (CPU f16/bf16, non-contiguous, shared storage)
            // op by op.
            let mut fused = MultiTensor::<bool>::new();
            for (p, slot) in group.params.iter().zip(slots) {
                let Some((param, grad)) = param_and_grad(p)? else {
                    continue;
                };
                if let Some(s) = slot.as_mut() {
                    s.momentum_buffer = follow(s.momentum_buffer.clone(), &param)?;
                }
                let mut existing = vec![&param, &grad];
                existing.extend(slot.as_ref().map(|s| &s.momentum_buffer));
                if !fused.admits(&existing) {
                    sgd_single(&param, grad, slot, group, hyper)?;
                    continue;
                }
                let mut row = vec![param.clone(), grad];
                let mut first = false;
                if momentum != 0.0 {
                    let buf = match slot {
                        Some(s) => s.momentum_buffer.clone(),
                        None => {
                            // Written whole by the kernel (buf = g on its first step).
                            first = true;
                            let momentum_buffer = param.empty_like()?;
                            slot.insert(SgdState { momentum_buffer })
                                .momentum_buffer
                                .clone()
                        }
                    };
                    row.push(buf);
                }
                fused.push(row, first);
            }
            let options = FusedSgdOptions {
                lr: group.lr,
                momentum,
                dampening,
                weight_decay: group.weight_decay,
                nesterov,
                maximize: group.maximize,
            };
            for (_, rows) in &fused.batches {
                let buffers = if momentum != 0.0 {
                    column(rows, 2)
                } else {
                    Vec::new()
                };
                let first: Vec<bool> = rows.iter().map(|(_, f)| *f).collect();
                Raw::fused_sgd_(
                    &column(rows, 0),
                    &column(rows, 1),
                    &buffers,
                    &first,
                    &options,
                )?;
            }
        }
        Ok(())
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
