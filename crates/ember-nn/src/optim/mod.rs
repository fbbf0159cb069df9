//! Optimizers (`torch.optim`), learning-rate schedulers and gradient clipping.
//!
//! - The [`Optimizer`] trait (object safe) and its [`ParamGroup`]s; [`SGD`], [`Adam`] and
//!   [`AdamW`] follow PyTorch 2.x's single-tensor (`foreach=False`) code paths op for op.
//! - [`lr_scheduler`]: [`StepLR`], [`CosineAnnealingLR`], [`OneCycleLR`] behind the
//!   [`LrScheduler`] trait.
//! - [`clip_grad_norm_`] and [`clip_grad_value_`] (`torch.nn.utils`).
//!
//! ```
//! use ember_nn::optim::{Optimizer, SGD, SgdOptions};
//! use ember_nn::Tensor;
//! let w = Tensor::from_vec(vec![1f32, 2.], [2], &ember_tensor::Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = SGD::new(vec![w.clone()], SgdOptions { lr: 0.1, ..Default::default() })?;
//! w.mul(&w)?.sum_all()?.backward()?;          // grad = 2w
//! opt.step()?;                                // w -= 0.1 * 2w
//! assert_eq!(w.to_vec::<f32>()?, vec![0.8, 1.6]);
//! opt.zero_grad(true)?;
//! assert!(w.grad().is_none());
//! # Ok::<(), ember_nn::Error>(())
//! ```
//!
//! An optimizer holds its parameters as [`Tensor`] clones (the same tensors), so moving a
//! model after building its optimizer works: see Note [Optimizer state follows its
//! parameter].
//!
//! Note [Optimizer state follows its parameter]:
//! moving a module replaces each parameter's data in place (`set_data`), so the optimizer
//! sees the new device and dtype at once; its per-parameter state (momentum buffers,
//! Adam's moments) is moved to the parameter's device and dtype at the start of the next
//! `step()`, and `load_state_dict` moves loaded state the same way (PyTorch's
//! `_process_value_according_to_param_policy`). A gradient left on another device or in
//! another dtype is brought over the same way before it is used.
//!
//! Note [Multi-tensor optimizer steps]:
//! [`SGD`], [`Adam`] and [`AdamW`] update their parameters with one multi-tensor op per step
//! per device (`Tensor::fused_sgd_`/`fused_adam_`, PyTorch's `fused=True` paths) instead of
//! one op per step of the update per parameter: on CUDA one kernel launch per dtype
//! (kernels/optim.cu), on the CPU one parallel pass over the f32/f64 parameters
//! (`ember-tensor`'s `cpu/optim.rs`), each reading and writing every tensor once where the
//! per-op path makes a pass per op. The kernels do the per-op path's arithmetic op for op,
//! each op rounded to f32 (f64 for f64 params), so f32 and f64 results are the same bits; on
//! CUDA f16/bf16 params are updated in f32 and rounded once per stored value, as PyTorch's
//! fused kernels do, while on the CPU they keep the per-op path (which rounds after every
//! op, as PyTorch's CPU for-loop step does). A parameter whose param, gradient or state
//! tensor is not contiguous, or shares storage with another tensor of the step, takes the
//! per-op path too ([`MultiTensor::admits`]).

/// Builder setters named after the fields of an optimizer's options, and `From<f64>` as
/// the learning rate: `Adam::new(params, 1e-3)` is `Adam(params, lr=1e-3)`, and
/// `SgdOptions::from(0.1).momentum(0.9)` is `lr=0.1, momentum=0.9`.
macro_rules! option_setters {
    ($ty:ident { $($field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets `", stringify!($field), "`.")]
                pub fn $field(mut self, $field: $t) -> $ty {
                    self.$field = $field;
                    self
                }
            )*
        }

        impl From<f64> for $ty {
            /// The defaults with this learning rate.
            fn from(lr: f64) -> $ty {
                $ty { lr, ..<$ty>::default() }
            }
        }
    };
}

mod adam;
mod clip;
pub mod lr_scheduler;
mod sgd;
mod state;

use std::collections::HashSet;

use ember_tensor::{DType, Device, Tensor as Raw};

use crate::{NnError, Result, StateDict, Tensor};

pub use adam::{Adam, AdamOptions, AdamW, AdamWOptions};
pub use clip::{clip_grad_norm_, clip_grad_norm_opts, clip_grad_value_, get_total_norm};
pub use lr_scheduler::{
    AnnealStrategy, CosineAnnealingLR, LrScheduler, OneCycleLR, OneCycleLrOptions, StepLR,
};
pub use sgd::{SGD, SgdOptions};

/// An optimizer: updates its parameters from their gradients (`torch.optim.Optimizer`).
///
/// Object safe, so schedulers and training loops take `&mut dyn Optimizer`.
pub trait Optimizer: std::fmt::Debug {
    /// One update of every parameter that has a gradient (parameters without one are
    /// skipped, their state untouched). Runs under `no_grad`, in place on the parameters'
    /// storage.
    fn step(&mut self) -> Result<()>;

    /// Clears the gradients: `set_to_none` drops them (`.grad` becomes `None`, PyTorch's
    /// default), otherwise they are zeroed in place.
    fn zero_grad(&mut self, set_to_none: bool) -> Result<()> {
        zero_grad_groups(self.param_groups(), set_to_none)
    }

    /// The parameter groups, with their hyperparameters.
    fn param_groups(&self) -> &[ParamGroup];

    /// The parameter groups, to change hyperparameters (a scheduler sets `lr` here).
    fn param_groups_mut(&mut self) -> &mut [ParamGroup];

    /// Adds a group; hyperparameters it does not set come from the optimizer's defaults.
    fn add_param_group(&mut self, group: ParamGroupSpec) -> Result<()>;

    /// The optimizer's state as flat named tensors, saveable with safetensors.
    ///
    /// Parameters are numbered globally in group order, as PyTorch numbers them:
    /// - `state.{i}.{name}`: parameter `i`'s state (`momentum_buffer`; `step` (0-dim f32
    ///   on the CPU), `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`), present once it was
    ///   stepped;
    /// - `param_groups.{g}.params`: the group's parameter numbers (i64);
    /// - `param_groups.{g}.{hyperparameter}`: `lr`, `weight_decay`, ... as 0-dim f64
    ///   tensors, `betas` as a 1-D f64 tensor of two, flags as 0-dim bool tensors.
    fn state_dict(&self) -> Result<StateDict>;

    /// Loads a [`state_dict`](Optimizer::state_dict): checks that the groups and their
    /// sizes match and every key is known and has the right shape (nothing is changed if
    /// not), replaces the groups' hyperparameters, and moves loaded state to its
    /// parameter's device and dtype.
    fn load_state_dict(&mut self, state_dict: &StateDict) -> Result<()>;
}

/// The hyperparameters that differ between optimizer families.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Hyper {
    /// [`SGD`]'s.
    Sgd {
        /// Momentum factor (0: plain SGD).
        momentum: f64,
        /// Dampening of the momentum.
        dampening: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// [`Adam`]'s and [`AdamW`]'s.
    Adam {
        /// Coefficients of the running averages of the gradient and its square.
        betas: (f64, f64),
        /// Added to the denominator for numerical stability.
        eps: f64,
        /// Use the maximum of the past squared-gradient averages (AMSGrad).
        amsgrad: bool,
        /// `true` for AdamW: weight decay shrinks the parameter instead of adding to the
        /// gradient.
        decoupled_weight_decay: bool,
    },
}

/// `0 <= x < inf`: PyTorch's `not 0.0 <= x` checks (false for NaN), and finite, so that a
/// learning rate of `inf` (from a caller or a corrupted checkpoint) is refused too.
fn non_negative(x: f64) -> bool {
    x >= 0.0 && x.is_finite()
}

/// Parameters that share hyperparameters: one entry of PyTorch's `param_groups`.
#[derive(Clone, Debug)]
pub struct ParamGroup {
    /// The parameters (the same tensors the model holds).
    pub params: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// Weight decay (L2 penalty; decoupled for AdamW).
    pub weight_decay: f64,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
    /// The optimizer family's own hyperparameters.
    pub hyper: Hyper,
}

impl ParamGroup {
    /// The momentum a scheduler cycles: SGD's `momentum`, Adam's `betas.0`.
    pub fn momentum(&self) -> f64 {
        match self.hyper {
            Hyper::Sgd { momentum, .. } => momentum,
            Hyper::Adam { betas, .. } => betas.0,
        }
    }

    /// Sets [`momentum`](ParamGroup::momentum).
    pub fn set_momentum(&mut self, value: f64) {
        match &mut self.hyper {
            Hyper::Sgd { momentum, .. } => *momentum = value,
            Hyper::Adam { betas, .. } => betas.0 = value,
        }
    }

    /// Checks the hyperparameters with PyTorch's messages (`Invalid learning rate: -1`).
    fn validate(&self, op: &'static str) -> Result<()> {
        let bad = |msg: String| Err(NnError::invalid(op, msg).into());
        if !non_negative(self.lr) {
            return bad(format!("Invalid learning rate: {}", self.lr));
        }
        match self.hyper {
            Hyper::Sgd {
                momentum,
                dampening,
                nesterov,
            } => {
                if !non_negative(momentum) {
                    return bad(format!("Invalid momentum value: {momentum}"));
                }
                if !non_negative(self.weight_decay) {
                    return bad(format!("Invalid weight_decay value: {}", self.weight_decay));
                }
                if !dampening.is_finite() {
                    return bad(format!("Invalid dampening value: {dampening}"));
                }
                if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                    return bad("Nesterov momentum requires a momentum and zero dampening".into());
                }
            }
            Hyper::Adam { betas, eps, .. } => {
                if !non_negative(eps) {
                    return bad(format!("Invalid epsilon value: {eps}"));
                }
                if !(0.0..1.0).contains(&betas.0) {
                    return bad(format!("Invalid beta parameter at index 0: {}", betas.0));
                }
                if !(0.0..1.0).contains(&betas.1) {
                    return bad(format!("Invalid beta parameter at index 1: {}", betas.1));
                }
                if !non_negative(self.weight_decay) {
                    return bad(format!("Invalid weight_decay value: {}", self.weight_decay));
                }
            }
        }
        Ok(())
    }
}

/// A parameter group to build an optimizer from: its parameters and the hyperparameters it
/// overrides (PyTorch's `{"params": [...], "lr": 0.1}`); unset ones come from the
/// optimizer's options.
///
/// ```
/// use ember_nn::optim::{ParamGroupSpec, SGD, SgdOptions};
/// use ember_nn::Tensor;
/// let (a, b) = (Tensor::zeros([2], ())?, Tensor::zeros([3], ())?);
/// let opt = SGD::with_groups(
///     vec![ParamGroupSpec::new(vec![a]), ParamGroupSpec::new(vec![b]).lr(0.1)],
///     SgdOptions { lr: 0.01, momentum: 0.9, ..Default::default() },
/// )?;
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct ParamGroupSpec {
    /// The parameters.
    pub params: Vec<Tensor>,
    /// Learning rate for this group.
    pub lr: Option<f64>,
    /// Weight decay for this group.
    pub weight_decay: Option<f64>,
    /// Momentum for this group: SGD's `momentum`, Adam's `betas.0`.
    pub momentum: Option<f64>,
}

impl ParamGroupSpec {
    /// A group of `params` with the optimizer's default hyperparameters.
    pub fn new(params: Vec<Tensor>) -> ParamGroupSpec {
        ParamGroupSpec {
            params,
            ..Default::default()
        }
    }

    /// Overrides the learning rate.
    pub fn lr(mut self, lr: f64) -> ParamGroupSpec {
        self.lr = Some(lr);
        self
    }

    /// Overrides the weight decay.
    pub fn weight_decay(mut self, weight_decay: f64) -> ParamGroupSpec {
        self.weight_decay = Some(weight_decay);
        self
    }

    /// Overrides the momentum (SGD's `momentum`, Adam's `betas.0`).
    pub fn momentum(mut self, momentum: f64) -> ParamGroupSpec {
        self.momentum = Some(momentum);
        self
    }

    /// The group: `defaults` with this spec's overrides, validated.
    fn build(self, defaults: &ParamGroup, op: &'static str) -> Result<ParamGroup> {
        let mut group = ParamGroup {
            params: self.params,
            ..defaults.clone()
        };
        if let Some(lr) = self.lr {
            group.lr = lr;
        }
        if let Some(wd) = self.weight_decay {
            group.weight_decay = wd;
        }
        if let Some(m) = self.momentum {
            group.set_momentum(m);
        }
        group.validate(op)?;
        for p in &group.params {
            if !p.is_leaf() {
                return Err(NnError::invalid(op, "can't optimize a non-leaf Tensor").into());
            }
            if !p.dtype().is_float() {
                return Err(NnError::invalid(
                    op,
                    format!(
                        "can only optimize floating-point tensors, got {}",
                        p.dtype()
                    ),
                )
                .into());
            }
        }
        Ok(group)
    }
}

/// Parameter groups and per-parameter state: what every optimizer here is made of.
///
/// State is kept per group and position (`state[g][i]` belongs to `groups[g].params[i]`),
/// grown as groups grow; `None` until the parameter's first update.
#[derive(Debug)]
pub(crate) struct Groups<S> {
    pub(crate) name: &'static str,
    pub(crate) defaults: ParamGroup,
    pub(crate) groups: Vec<ParamGroup>,
    pub(crate) state: Vec<Vec<Option<S>>>,
}

impl<S> Groups<S> {
    /// Groups from specs over `defaults` (which has no parameters), checked as PyTorch
    /// checks them: some parameter at all, no parameter in two groups.
    pub(crate) fn new(
        name: &'static str,
        defaults: ParamGroup,
        specs: Vec<ParamGroupSpec>,
    ) -> Result<Groups<S>> {
        defaults.validate(name)?;
        if specs.iter().all(|s| s.params.is_empty()) {
            return Err(NnError::invalid(name, "optimizer got an empty parameter list").into());
        }
        let mut out = Groups {
            name,
            defaults,
            groups: Vec::new(),
            state: Vec::new(),
        };
        for spec in specs {
            out.add(spec)?;
        }
        Ok(out)
    }

    /// Adds a group (PyTorch's `add_param_group`).
    pub(crate) fn add(&mut self, spec: ParamGroupSpec) -> Result<()> {
        let group = spec.build(&self.defaults, self.name)?;
        let known = self.groups.iter().flat_map(|g| &g.params);
        for (i, p) in group.params.iter().enumerate() {
            if group.params[..i].iter().any(|q| q.same(p)) {
                return Err(NnError::invalid(
                    self.name,
                    "optimizer contains a parameter group with duplicate parameters",
                )
                .into());
            }
            if known.clone().any(|q| q.same(p)) {
                return Err(NnError::invalid(
                    self.name,
                    "some parameters appear in more than one parameter group",
                )
                .into());
            }
        }
        self.groups.push(group);
        self.state.push(Vec::new());
        Ok(())
    }

    /// Each group with its state slots, one per parameter (grown if parameters were added
    /// through `param_groups_mut`).
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&ParamGroup, &mut [Option<S>])> {
        self.state.resize_with(self.groups.len(), Vec::new);
        self.groups.iter().zip(&mut self.state).map(|(g, s)| {
            if s.len() < g.params.len() {
                s.resize_with(g.params.len(), || None);
            }
            (g, &mut s[..g.params.len()])
        })
    }
}

/// The error for a group whose hyperparameters belong to another optimizer family (set
/// through `param_groups_mut`).
pub(crate) fn foreign_hyper(op: &'static str, group: &ParamGroup) -> crate::Error {
    NnError::invalid(
        op,
        format!(
            "a parameter group has another optimizer's hyperparameters: {:?}",
            group.hyper
        ),
    )
    .into()
}

/// `zero_grad` over groups: drop the gradients, or zero them in place.
pub(crate) fn zero_grad_groups(groups: &[ParamGroup], set_to_none: bool) -> Result<()> {
    for p in groups.iter().flat_map(|g| &g.params) {
        if set_to_none {
            p.set_grad(None)?;
        } else if let Some(g) = p.grad() {
            g.data().zero_()?;
        }
    }
    Ok(())
}

/// The parameter's data and its gradient brought to the parameter's device and dtype
/// (`None` if it has no gradient: the parameter is skipped).
pub(crate) fn param_and_grad(p: &Tensor) -> Result<Option<(Raw, Raw)>> {
    let Some(g) = p.grad() else {
        return Ok(None);
    };
    let param = p.data();
    let grad = follow(g.data(), &param)?;
    Ok(Some((param, grad)))
}

/// `t` on `param`'s device in `param`'s dtype: itself if it already is, else a moved copy.
/// See Note [Optimizer state follows its parameter].
pub(crate) fn follow(t: Raw, param: &Raw) -> Result<Raw> {
    if t.device() == param.device() && t.dtype() == param.dtype() {
        Ok(t)
    } else {
        Ok(t.to((param.device(), param.dtype()))?)
    }
}

/// One parameter of a multi-tensor step: the param, its gradient and its state tensors, and
/// the optimizer's per-parameter value.
pub(crate) type Row<E> = (Vec<Raw>, E);

/// The parameters of one step that go to the multi-tensor kernels, one batch per device (the
/// CUDA kernels split each batch by dtype). See Note [Multi-tensor optimizer steps].
#[derive(Debug)]
pub(crate) struct MultiTensor<E> {
    /// Storages taken so far ([`Raw::storage_id`]).
    seen: HashSet<usize>,
    /// Per device, its rows: the param, its gradient and its state tensors, and the
    /// optimizer's per-parameter value.
    pub(crate) batches: Vec<(Device, Vec<Row<E>>)>,
}

impl<E> MultiTensor<E> {
    pub(crate) fn new() -> Self {
        MultiTensor {
            seen: HashSet::new(),
            batches: Vec::new(),
        }
    }

    /// Whether a parameter with these tensors (param, gradient, existing state) can take the
    /// multi-tensor kernel: all on CUDA or f32/f64 on the CPU ([`has_kernel`]), contiguous,
    /// and sharing no storage with each other or with a tensor taken before. If so their
    /// storages count as taken.
    pub(crate) fn admits(&mut self, tensors: &[&Raw]) -> bool {
        let ok = tensors.iter().all(|t| has_kernel(t) && t.is_contiguous())
            && tensors.iter().enumerate().all(|(i, t)| {
                !self.seen.contains(&t.storage_id())
                    && tensors[..i].iter().all(|u| !u.shares_storage(t))
            });
        if ok {
            self.seen.extend(tensors.iter().map(|t| t.storage_id()));
        }
        ok
    }

    /// Adds an admitted parameter's row (param first).
    pub(crate) fn push(&mut self, row: Vec<Raw>, extra: E) {
        let Some(device) = row.first().map(Raw::device) else {
            return;
        };
        self.seen.extend(row.iter().map(Raw::storage_id));
        match self.batches.iter_mut().find(|(d, _)| *d == device) {
            Some((_, rows)) => rows.push((row, extra)),
            None => self.batches.push((device, vec![(row, extra)])),
        }
    }
}

/// Whether the multi-tensor kernels take a tensor's device and dtype: every float dtype on
/// CUDA, f32 and f64 on the CPU (whose f16/bf16 params keep the per-op path, see Note
/// [Multi-tensor optimizer steps]).
fn has_kernel(t: &Raw) -> bool {
    match t.device() {
        Device::Cpu => matches!(t.dtype(), DType::F32 | DType::F64),
        d => d.is_cuda(),
    }
}

/// Column `c` of a batch's rows.
pub(crate) fn column<E>(rows: &[Row<E>], c: usize) -> Vec<Raw> {
    rows.iter().filter_map(|(r, _)| r.get(c).cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Contiguous f32/f64 CPU tensors take the multi-tensor kernels; CPU f16/bf16 ones, a
    /// non-contiguous one and a storage already taken keep the per-op path.
    #[test]
    fn admits_contiguous_f32_f64_on_the_cpu() -> Result<()> {
        let t = |dims: &[usize], dtype| Raw::zeros(dims.to_vec(), (Device::Cpu, dtype));
        let mut fused = MultiTensor::<()>::new();
        let (p, g) = (t(&[3, 4], DType::F32)?, t(&[3, 4], DType::F32)?);
        assert!(fused.admits(&[&p, &g]));
        assert!(
            !fused.admits(&[&p, &t(&[3, 4], DType::F32)?]),
            "p taken twice"
        );
        assert!(fused.admits(&[&t(&[5], DType::F64)?, &t(&[5], DType::F64)?]));
        for half in [DType::Bf16, DType::F16] {
            assert!(!fused.admits(&[&t(&[2], half)?, &t(&[2], half)?]), "{half}");
        }
        let w = t(&[4, 3], DType::F32)?.t()?;
        assert!(
            !fused.admits(&[&w, &t(&[3, 4], DType::F32)?]),
            "non-contiguous"
        );
        Ok(())
    }
}
