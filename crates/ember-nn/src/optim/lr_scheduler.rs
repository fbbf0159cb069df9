//! Learning-rate schedulers (`torch.optim.lr_scheduler`): [`StepLR`],
//! [`CosineAnnealingLR`], [`OneCycleLR`].
//!
//! As in PyTorch, building a scheduler takes its first step (epoch 0) and sets the
//! optimizer's learning rates; call [`LrScheduler::step`] after each `optimizer.step()`.
//! [`StepLR`] and [`CosineAnnealingLR`] use PyTorch's recursive ("chainable") formulas on
//! the groups' current `lr`, so their values agree with PyTorch's to the last bit.
//!
//! A scheduler's [`state_dict`](LrScheduler::state_dict) holds everything but the
//! optimizer (PyTorch's rule), so resuming needs both dicts: the chainable schedulers go on
//! from the groups' `lr`, which the optimizer's dict restores.
//!
//! ```
//! use ember_nn::optim::{LrScheduler, Optimizer, SGD, SgdOptions, StepLR};
//! use ember_nn::Tensor;
//! let w = Tensor::zeros([2], ())?.requires_grad_(true)?;
//! let mut opt = SGD::new(vec![w], SgdOptions { lr: 0.1, ..Default::default() })?;
//! let mut sched = StepLR::new(&mut opt, 2, 0.5)?;
//! let mut lrs = vec![];
//! for _ in 0..4 {
//!     opt.step()?;
//!     sched.step(&mut opt)?;
//!     lrs.extend(sched.get_last_lr());
//! }
//! assert_eq!(lrs, vec![0.1, 0.05, 0.05, 0.025]);
//! # Ok::<(), ember_nn::NnError>(())
//! ```

use std::collections::BTreeSet;
use std::f64::consts::PI;

use ember_tensor::{Device, Scalar, Shape, Tensor as Raw};

use super::Optimizer;
use super::state::{bool_entry, f64_entry, read_bool, read_f64, scalar_of};
use crate::{NnError, Result, StateDict, Tensor};

/// A learning-rate scheduler (`torch.optim.lr_scheduler.LRScheduler`).
pub trait LrScheduler: std::fmt::Debug {
    /// Advances one epoch (or iteration) and sets the optimizer's learning rates. The
    /// optimizer must be the one the scheduler was built with.
    fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<()>;

    /// The learning rates the last step set, one per parameter group.
    fn get_last_lr(&self) -> Vec<f64>;

    /// The index of the last step (0 right after construction).
    fn last_epoch(&self) -> i64;

    /// The scheduler's state as named CPU tensors (PyTorch's `state_dict()`: every field
    /// but the optimizer): `last_epoch` (0-dim i64), `base_lrs` and `_last_lr` (one f64 per
    /// group), and the scheduler's own settings under PyTorch's names (`step_size`,
    /// `gamma`, `T_max`, `eta_min`, ...). Copies: stepping on does not change it. Save it
    /// with the optimizer's, e.g. in one safetensors file under two prefixes.
    fn state_dict(&self) -> Result<StateDict>;

    /// Restores a [`state_dict`](LrScheduler::state_dict) of the same kind of scheduler
    /// built for as many parameter groups, settings included (PyTorch overwrites them
    /// too). Missing or unexpected keys, a different number of groups or an invalid value
    /// are errors, and leave the scheduler as it was. It does not touch the optimizer: load
    /// the optimizer's own dict as well.
    ///
    /// ```
    /// use ember_nn::optim::{LrScheduler, Optimizer, SGD, SgdOptions, StepLR};
    /// use ember_nn::Tensor;
    /// let sgd = |lr| {
    ///     let w = Tensor::zeros([2], ())?.requires_grad_(true)?;
    ///     SGD::new(vec![w], SgdOptions { lr, ..Default::default() })
    /// };
    /// let mut opt = sgd(0.1)?;
    /// let mut sched = StepLR::new(&mut opt, 2, 0.5)?;
    /// for _ in 0..3 {
    ///     opt.step()?;
    ///     sched.step(&mut opt)?;
    /// }
    /// let (opt_state, sched_state) = (opt.state_dict()?, sched.state_dict()?);
    ///
    /// // Resume into fresh objects (the settings they were built with are overwritten).
    /// let mut opt2 = sgd(1.0)?;
    /// let mut sched2 = StepLR::new(&mut opt2, 10, 0.9)?;
    /// opt2.load_state_dict(&opt_state)?;
    /// sched2.load_state_dict(&sched_state)?;
    /// sched.step(&mut opt)?;
    /// sched2.step(&mut opt2)?;
    /// assert_eq!(sched2.get_last_lr(), sched.get_last_lr());
    /// assert_eq!(sched2.last_epoch(), 4);
    /// # Ok::<(), ember_nn::NnError>(())
    /// ```
    fn load_state_dict(&mut self, state_dict: &StateDict) -> Result<()>;
}

fn i64_entry(v: i64) -> Result<Raw> {
    Ok(Raw::scalar(v, &Device::Cpu)?)
}

fn f64s_entry(v: &[f64]) -> Result<Raw> {
    Ok(Raw::from_vec(v.to_vec(), [v.len()], &Device::Cpu)?)
}

/// Named fields into a state dict (as [`Tensor`]s without history).
fn to_state_dict(fields: Vec<(&str, Raw)>) -> StateDict {
    let mut dict: StateDict = fields
        .into_iter()
        .map(|(k, t)| (k.to_string(), Tensor::wrap(t)))
        .collect();
    dict.sort_keys(); // listed by name, as always
    dict
}

/// Reads a scheduler's state dict by name: type and shape errors at once, missing and
/// unexpected keys together at [`Fields::finish`] (PyTorch's `load_state_dict` report).
struct Fields<'a> {
    scheduler: &'static str,
    dict: &'a StateDict,
    groups: usize,
    used: BTreeSet<&'a str>,
    missing: Vec<String>,
    mismatched: Vec<(String, Shape, Shape)>,
}

impl<'a> Fields<'a> {
    fn new(scheduler: &'static str, dict: &'a StateDict, groups: usize) -> Fields<'a> {
        Fields {
            scheduler,
            dict,
            groups,
            used: BTreeSet::new(),
            missing: Vec::new(),
            mismatched: Vec::new(),
        }
    }

    fn get(&mut self, key: &str) -> Option<Raw> {
        match self.dict.get_key_value(key) {
            Some((k, t)) => {
                self.used.insert(k.as_str());
                Some(t.data())
            }
            None => {
                self.missing.push(key.to_string());
                None
            }
        }
    }

    /// A 0-dim value as f64 (0 when missing; `finish` reports it).
    fn f64(&mut self, key: &str) -> Result<f64> {
        self.get(key).map_or(Ok(0.0), |t| read_f64(key, &t))
    }

    fn bool(&mut self, key: &str) -> Result<bool> {
        self.get(key).map_or(Ok(false), |t| read_bool(key, &t))
    }

    /// A whole number (an integer, or a float with no fraction).
    fn i64(&mut self, key: &str) -> Result<i64> {
        let Some(t) = self.get(key) else {
            return Ok(0);
        };
        match scalar_of(key, &t)? {
            Scalar::Int(i) => Ok(i),
            Scalar::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
            other => Err(NnError::invalid(
                "load_state_dict",
                format!("{key}: expected a whole number, found {other:?}"),
            )),
        }
    }

    /// One f64 per parameter group.
    fn per_group(&mut self, key: &str) -> Result<Vec<f64>> {
        let Some(t) = self.get(key) else {
            return Ok(vec![0.0; self.groups]);
        };
        if t.dims() != [self.groups] {
            self.mismatched.push((
                key.to_string(),
                t.shape().clone(),
                Shape::from([self.groups]),
            ));
            return Ok(vec![0.0; self.groups]);
        }
        Ok(t.to_dtype(ember_tensor::DType::F64)?.to_vec::<f64>()?)
    }

    /// A count read with [`Fields::i64`] that must be positive.
    fn positive(&mut self, key: &str) -> Result<usize> {
        let v = self.i64(key)?;
        match usize::try_from(v) {
            Ok(n) if n > 0 || !self.dict.contains_key(key) => Ok(n),
            _ => Err(NnError::invalid(
                self.scheduler,
                format!("{key} must be positive, found {v} in the loaded state dict"),
            )),
        }
    }

    /// Errors unless every key was found and used.
    fn finish(self) -> Result<()> {
        let unexpected: Vec<String> = self
            .dict
            .keys()
            .filter(|k| !self.used.contains(k.as_str()))
            .cloned()
            .collect();
        if self.missing.is_empty() && unexpected.is_empty() && self.mismatched.is_empty() {
            return Ok(());
        }
        Err(NnError::StateDict {
            module: self.scheduler.to_string(),
            missing: self.missing,
            unexpected,
            mismatched: self.mismatched,
        })
    }
}

/// What every scheduler keeps: PyTorch's `LRScheduler` fields.
#[derive(Clone, Debug)]
struct Base {
    name: &'static str,
    last_epoch: i64,
    base_lrs: Vec<f64>,
    last_lr: Vec<f64>,
}

impl Base {
    fn new(name: &'static str, base_lrs: Vec<f64>) -> Base {
        Base {
            name,
            last_epoch: -1,
            base_lrs,
            last_lr: Vec::new(),
        }
    }

    /// Errors if the optimizer does not have the groups the scheduler was built for.
    fn check(&self, optimizer: &dyn Optimizer) -> Result<()> {
        let n = optimizer.param_groups().len();
        if n != self.base_lrs.len() {
            return Err(NnError::invalid(
                self.name,
                format!(
                    "the optimizer has {n} parameter groups but the scheduler was built for {}",
                    self.base_lrs.len()
                ),
            ));
        }
        Ok(())
    }

    /// Sets the groups' learning rates and remembers them.
    fn apply(&mut self, optimizer: &mut dyn Optimizer, lrs: Vec<f64>) {
        for (g, lr) in optimizer.param_groups_mut().iter_mut().zip(&lrs) {
            g.lr = *lr;
        }
        self.last_lr = lrs;
    }

    /// The fields every scheduler saves.
    fn entries(&self) -> Result<Vec<(&'static str, Raw)>> {
        Ok(vec![
            ("last_epoch", i64_entry(self.last_epoch)?),
            ("base_lrs", f64s_entry(&self.base_lrs)?),
            ("_last_lr", f64s_entry(&self.last_lr)?),
        ])
    }

    /// The state of a scheduler whose settings are one positive count and one number
    /// ([`StepLR`], [`CosineAnnealingLR`]).
    fn count_and_factor_state(
        &self,
        count: (&'static str, usize),
        factor: (&'static str, f64),
    ) -> Result<StateDict> {
        let mut fields = self.entries()?;
        fields.push((count.0, i64_entry(count.1 as i64)?));
        fields.push((factor.0, f64_entry(factor.1)?));
        Ok(to_state_dict(fields))
    }

    /// Reads what [`Base::count_and_factor_state`] wrote.
    fn load_count_and_factor(
        &self,
        dict: &StateDict,
        count: &str,
        factor: &str,
    ) -> Result<(Base, usize, f64)> {
        let mut f = Fields::new(self.name, dict, self.base_lrs.len());
        let base = self.read(&mut f)?;
        let count = f.positive(count)?;
        let factor = f.f64(factor)?;
        f.finish()?;
        Ok((base, count, factor))
    }

    /// The common fields from a loaded dict.
    fn read(&self, f: &mut Fields<'_>) -> Result<Base> {
        let last_epoch = f.i64("last_epoch")?;
        if last_epoch < 0 {
            return Err(NnError::invalid(
                self.name,
                format!(
                    "last_epoch must be at least 0, found {last_epoch} in the loaded state dict"
                ),
            ));
        }
        Ok(Base {
            name: self.name,
            last_epoch,
            base_lrs: f.per_group("base_lrs")?,
            last_lr: f.per_group("_last_lr")?,
        })
    }
}

fn current_lrs(optimizer: &dyn Optimizer) -> Vec<f64> {
    optimizer.param_groups().iter().map(|g| g.lr).collect()
}

/// Multiplies each group's learning rate by `gamma` every `step_size` epochs
/// (`torch.optim.lr_scheduler.StepLR`).
#[derive(Clone, Debug)]
pub struct StepLR {
    base: Base,
    step_size: usize,
    gamma: f64,
}

impl StepLR {
    /// A StepLR on `optimizer` (its first step is taken: the learning rates stay).
    pub fn new(optimizer: &mut dyn Optimizer, step_size: usize, gamma: f64) -> Result<StepLR> {
        if step_size == 0 {
            return Err(NnError::invalid(
                "StepLR",
                "step_size must be positive, got 0",
            ));
        }
        let mut s = StepLR {
            base: Base::new("StepLR", current_lrs(optimizer)),
            step_size,
            gamma,
        };
        s.step(optimizer)?;
        Ok(s)
    }
}

impl LrScheduler for StepLR {
    fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<()> {
        self.base.check(optimizer)?;
        self.base.last_epoch += 1;
        let epoch = self.base.last_epoch;
        let decay = epoch != 0 && epoch % self.step_size as i64 == 0;
        let lrs = current_lrs(optimizer)
            .into_iter()
            .map(|lr| if decay { lr * self.gamma } else { lr })
            .collect();
        self.base.apply(optimizer, lrs);
        Ok(())
    }

    fn get_last_lr(&self) -> Vec<f64> {
        self.base.last_lr.clone()
    }

    fn last_epoch(&self) -> i64 {
        self.base.last_epoch
    }

    fn state_dict(&self) -> Result<StateDict> {
        self.base
            .count_and_factor_state(("step_size", self.step_size), ("gamma", self.gamma))
    }

    fn load_state_dict(&mut self, state_dict: &StateDict) -> Result<()> {
        let (base, step_size, gamma) =
            self.base
                .load_count_and_factor(state_dict, "step_size", "gamma")?;
        *self = StepLR {
            base,
            step_size,
            gamma,
        };
        Ok(())
    }
}

/// Cosine annealing from each group's initial learning rate down to `eta_min` over `t_max`
/// epochs, and back up over the next `t_max` (`torch.optim.lr_scheduler.CosineAnnealingLR`,
/// without restarts):
///
/// ```text
/// lr_t = eta_min + (base_lr - eta_min) * (1 + cos(pi * t / t_max)) / 2
/// ```
///
/// computed, as PyTorch does, recursively from the previous learning rate.
#[derive(Clone, Debug)]
pub struct CosineAnnealingLR {
    base: Base,
    t_max: usize,
    eta_min: f64,
}

impl CosineAnnealingLR {
    /// A CosineAnnealingLR on `optimizer` (its first step is taken: the learning rates
    /// stay).
    pub fn new(
        optimizer: &mut dyn Optimizer,
        t_max: usize,
        eta_min: f64,
    ) -> Result<CosineAnnealingLR> {
        if t_max == 0 {
            return Err(NnError::invalid(
                "CosineAnnealingLR",
                "T_max must be positive, got 0",
            ));
        }
        let mut s = CosineAnnealingLR {
            base: Base::new("CosineAnnealingLR", current_lrs(optimizer)),
            t_max,
            eta_min,
        };
        s.step(optimizer)?;
        Ok(s)
    }
}

impl LrScheduler for CosineAnnealingLR {
    fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<()> {
        self.base.check(optimizer)?;
        self.base.last_epoch += 1;
        let (e, t_max, eta_min) = (self.base.last_epoch, self.t_max as f64, self.eta_min);
        let t = self.t_max as i64;
        let lrs = current_lrs(optimizer)
            .into_iter()
            .zip(&self.base.base_lrs)
            .map(|(lr, base_lr)| {
                if e == 0 {
                    lr
                } else if (e - 1 - t).rem_euclid(2 * t) == 0 {
                    // The step through the minimum, where the ratio below would divide by 0.
                    lr + (base_lr - eta_min) * (1.0 - (PI / t_max).cos()) / 2.0
                } else {
                    (1.0 + (PI * e as f64 / t_max).cos())
                        / (1.0 + (PI * (e - 1) as f64 / t_max).cos())
                        * (lr - eta_min)
                        + eta_min
                }
            })
            .collect();
        self.base.apply(optimizer, lrs);
        Ok(())
    }

    fn get_last_lr(&self) -> Vec<f64> {
        self.base.last_lr.clone()
    }

    fn last_epoch(&self) -> i64 {
        self.base.last_epoch
    }

    fn state_dict(&self) -> Result<StateDict> {
        self.base
            .count_and_factor_state(("T_max", self.t_max), ("eta_min", self.eta_min))
    }

    fn load_state_dict(&mut self, state_dict: &StateDict) -> Result<()> {
        let (base, t_max, eta_min) = self
            .base
            .load_count_and_factor(state_dict, "T_max", "eta_min")?;
        *self = CosineAnnealingLR {
            base,
            t_max,
            eta_min,
        };
        Ok(())
    }
}

/// How [`OneCycleLR`] moves between its phases' endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AnnealStrategy {
    /// Half a cosine (PyTorch's `"cos"`, the default).
    #[default]
    Cos,
    /// A straight line (`"linear"`).
    Linear,
}

impl AnnealStrategy {
    /// The value a fraction `pct` of the way from `start` to `end` (PyTorch's formulas).
    fn anneal(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            AnnealStrategy::Cos => {
                let cos_out = (PI * pct).cos() + 1.0;
                end + (start - end) / 2.0 * cos_out
            }
            AnnealStrategy::Linear => (end - start) * pct + start,
        }
    }

    /// How a state dict stores the strategy.
    fn code(self) -> i64 {
        match self {
            AnnealStrategy::Cos => 0,
            AnnealStrategy::Linear => 1,
        }
    }

    fn from_code(code: i64) -> Option<AnnealStrategy> {
        match code {
            0 => Some(AnnealStrategy::Cos),
            1 => Some(AnnealStrategy::Linear),
            _ => None,
        }
    }
}

/// [`OneCycleLR`]'s options besides the peak learning rate and the number of steps
/// (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OneCycleLrOptions {
    /// Fraction of the steps spent increasing the learning rate (default 0.3).
    pub pct_start: f64,
    /// Cosine or linear annealing (default cosine).
    pub anneal_strategy: AnnealStrategy,
    /// Cycle the momentum inversely to the learning rate (default `true`); SGD's
    /// `momentum`, Adam's `betas.0`.
    pub cycle_momentum: bool,
    /// Lowest momentum, at the peak learning rate (default 0.85).
    pub base_momentum: f64,
    /// Highest momentum, at the start and the end (default 0.95).
    pub max_momentum: f64,
    /// The initial learning rate is `max_lr / div_factor` (default 25).
    pub div_factor: f64,
    /// The final learning rate is the initial one `/ final_div_factor` (default 1e4).
    pub final_div_factor: f64,
    /// Three phases (up, back down to the initial rate, then to the final one) instead of
    /// two (default `false`).
    pub three_phase: bool,
}

impl Default for OneCycleLrOptions {
    fn default() -> Self {
        OneCycleLrOptions {
            pct_start: 0.3,
            anneal_strategy: AnnealStrategy::Cos,
            cycle_momentum: true,
            base_momentum: 0.85,
            max_momentum: 0.95,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
}

/// A phase endpoint, read per group.
#[derive(Clone, Copy, Debug)]
enum Point {
    InitialLr,
    MaxLr,
    MinLr,
    MaxMomentum,
    BaseMomentum,
}

#[derive(Clone, Copy, Debug)]
struct Phase {
    end_step: f64,
    start_lr: Point,
    end_lr: Point,
    start_momentum: Point,
    end_momentum: Point,
}

/// The 1cycle policy (`torch.optim.lr_scheduler.OneCycleLR`): the learning rate rises from
/// `max_lr / div_factor` to `max_lr`, then falls far below the start, stepped once per
/// batch for `total_steps` steps; the momentum moves the opposite way. Stepping past
/// `total_steps` is an error, as in PyTorch.
#[derive(Clone, Debug)]
pub struct OneCycleLR {
    base: Base,
    total_steps: usize,
    options: OneCycleLrOptions,
    phases: Vec<Phase>,
    /// Per group: (initial, max, min) learning rate.
    lrs: Vec<(f64, f64, f64)>,
}

impl OneCycleLR {
    /// A OneCycleLR peaking at `max_lr` in every group, over `total_steps` steps. Sets the
    /// optimizer's learning rates to `max_lr / div_factor` (and its momentum to
    /// `max_momentum` if cycled).
    pub fn new(
        optimizer: &mut dyn Optimizer,
        max_lr: f64,
        total_steps: usize,
        options: OneCycleLrOptions,
    ) -> Result<OneCycleLR> {
        let n = optimizer.param_groups().len();
        OneCycleLR::with_max_lrs(optimizer, vec![max_lr; n], total_steps, options)
    }

    /// A OneCycleLR with one peak learning rate per parameter group.
    pub fn with_max_lrs(
        optimizer: &mut dyn Optimizer,
        max_lrs: Vec<f64>,
        total_steps: usize,
        options: OneCycleLrOptions,
    ) -> Result<OneCycleLR> {
        let bad = |msg: String| Err(NnError::invalid("OneCycleLR", msg));
        if total_steps == 0 {
            return bad(format!(
                "Expected positive integer total_steps, but got {total_steps}"
            ));
        }
        let pct_start = options.pct_start;
        check_pct_start(pct_start)?;
        let groups = optimizer.param_groups().len();
        if max_lrs.len() != groups {
            return bad(format!(
                "max_lr must have the same length as optimizer.param_groups. max_lr has {} values, param_groups has {groups}.",
                max_lrs.len()
            ));
        }
        let phases = phases(total_steps, pct_start, options.three_phase);
        let lrs: Vec<(f64, f64, f64)> = max_lrs
            .iter()
            .map(|&max_lr| {
                let initial = max_lr / options.div_factor;
                (initial, max_lr, initial / options.final_div_factor)
            })
            .collect();
        if options.cycle_momentum {
            for g in optimizer.param_groups_mut() {
                g.set_momentum(options.max_momentum);
            }
        }
        let mut s = OneCycleLR {
            base: Base::new("OneCycleLR", lrs.iter().map(|l| l.0).collect()),
            total_steps,
            options,
            phases,
            lrs,
        };
        s.step(optimizer)?;
        Ok(s)
    }

    fn value(&self, group: usize, point: Point) -> f64 {
        let (initial, max, min) = self.lrs[group];
        match point {
            Point::InitialLr => initial,
            Point::MaxLr => max,
            Point::MinLr => min,
            Point::MaxMomentum => self.options.max_momentum,
            Point::BaseMomentum => self.options.base_momentum,
        }
    }
}

fn check_pct_start(pct_start: f64) -> Result<()> {
    if (0.0..=1.0).contains(&pct_start) {
        Ok(())
    } else {
        Err(NnError::invalid(
            "OneCycleLR",
            format!("Expected float between 0 and 1 pct_start, but got {pct_start}"),
        ))
    }
}

/// OneCycleLR's phases (PyTorch's `_schedule_phases`).
fn phases(total_steps: usize, pct_start: f64, three_phase: bool) -> Vec<Phase> {
    let total = total_steps as f64;
    use Point::*;
    // Both schedules start by rising to the peak.
    let up = Phase {
        end_step: pct_start * total - 1.0,
        start_lr: InitialLr,
        end_lr: MaxLr,
        start_momentum: MaxMomentum,
        end_momentum: BaseMomentum,
    };
    if three_phase {
        vec![
            up,
            Phase {
                end_step: 2.0 * pct_start * total - 2.0,
                start_lr: MaxLr,
                end_lr: InitialLr,
                start_momentum: BaseMomentum,
                end_momentum: MaxMomentum,
            },
            Phase {
                end_step: total - 1.0,
                start_lr: InitialLr,
                end_lr: MinLr,
                start_momentum: MaxMomentum,
                end_momentum: MaxMomentum,
            },
        ]
    } else {
        vec![
            up,
            Phase {
                end_step: total - 1.0,
                start_lr: MaxLr,
                end_lr: MinLr,
                start_momentum: BaseMomentum,
                end_momentum: MaxMomentum,
            },
        ]
    }
}

impl LrScheduler for OneCycleLR {
    fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<()> {
        self.base.check(optimizer)?;
        let step_num = self.base.last_epoch + 1;
        if step_num > self.total_steps as i64 {
            return Err(NnError::invalid(
                "OneCycleLR",
                format!(
                    "Tried to step {step_num} times. The specified number of total steps is {}",
                    self.total_steps
                ),
            ));
        }
        self.base.last_epoch = step_num;
        let anneal = self.options.anneal_strategy;
        let mut lrs = Vec::with_capacity(self.lrs.len());
        let mut momenta = Vec::with_capacity(self.lrs.len());
        for g in 0..self.lrs.len() {
            let mut start_step = 0.0;
            for (i, phase) in self.phases.iter().enumerate() {
                if step_num as f64 <= phase.end_step || i == self.phases.len() - 1 {
                    let pct = (step_num as f64 - start_step) / (phase.end_step - start_step);
                    let value = |a, b| anneal.anneal(self.value(g, a), self.value(g, b), pct);
                    lrs.push(value(phase.start_lr, phase.end_lr));
                    momenta.push(value(phase.start_momentum, phase.end_momentum));
                    break;
                }
                start_step = phase.end_step;
            }
        }
        if self.options.cycle_momentum {
            for (g, m) in optimizer.param_groups_mut().iter_mut().zip(momenta) {
                g.set_momentum(m);
            }
        }
        self.base.apply(optimizer, lrs);
        Ok(())
    }

    fn get_last_lr(&self) -> Vec<f64> {
        self.base.last_lr.clone()
    }

    fn last_epoch(&self) -> i64 {
        self.base.last_epoch
    }

    /// Besides the common fields: `total_steps`, the options under their names
    /// (`anneal_strategy` as 0-dim i64, 0 for cosine and 1 for linear), and per group
    /// `initial_lr`, `max_lr`, `min_lr` (which PyTorch keeps in the optimizer's groups).
    fn state_dict(&self) -> Result<StateDict> {
        let o = &self.options;
        let per_group = |pick: fn(&(f64, f64, f64)) -> f64| {
            f64s_entry(&self.lrs.iter().map(pick).collect::<Vec<_>>())
        };
        let mut fields = self.base.entries()?;
        fields.extend([
            ("total_steps", i64_entry(self.total_steps as i64)?),
            ("pct_start", f64_entry(o.pct_start)?),
            ("anneal_strategy", i64_entry(o.anneal_strategy.code())?),
            ("cycle_momentum", bool_entry(o.cycle_momentum)?),
            ("base_momentum", f64_entry(o.base_momentum)?),
            ("max_momentum", f64_entry(o.max_momentum)?),
            ("div_factor", f64_entry(o.div_factor)?),
            ("final_div_factor", f64_entry(o.final_div_factor)?),
            ("three_phase", bool_entry(o.three_phase)?),
            ("initial_lr", per_group(|l| l.0)?),
            ("max_lr", per_group(|l| l.1)?),
            ("min_lr", per_group(|l| l.2)?),
        ]);
        Ok(to_state_dict(fields))
    }

    fn load_state_dict(&mut self, state_dict: &StateDict) -> Result<()> {
        let mut f = Fields::new("OneCycleLR", state_dict, self.lrs.len());
        let base = self.base.read(&mut f)?;
        let total_steps = f.positive("total_steps")?;
        let anneal = f.i64("anneal_strategy")?;
        let options = OneCycleLrOptions {
            pct_start: f.f64("pct_start")?,
            anneal_strategy: AnnealStrategy::from_code(anneal).ok_or_else(|| {
                NnError::invalid(
                    "OneCycleLR",
                    format!("anneal_strategy must be 0 (cos) or 1 (linear), found {anneal}"),
                )
            })?,
            cycle_momentum: f.bool("cycle_momentum")?,
            base_momentum: f.f64("base_momentum")?,
            max_momentum: f.f64("max_momentum")?,
            div_factor: f.f64("div_factor")?,
            final_div_factor: f.f64("final_div_factor")?,
            three_phase: f.bool("three_phase")?,
        };
        let (initial, max, min) = (
            f.per_group("initial_lr")?,
            f.per_group("max_lr")?,
            f.per_group("min_lr")?,
        );
        f.finish()?;
        check_pct_start(options.pct_start)?;
        if base.last_epoch > total_steps as i64 {
            return Err(NnError::invalid(
                "OneCycleLR",
                format!(
                    "last_epoch {} is past total_steps {total_steps} in the loaded state dict",
                    base.last_epoch
                ),
            ));
        }
        *self = OneCycleLR {
            base,
            total_steps,
            options,
            phases: phases(total_steps, options.pct_start, options.three_phase),
            lrs: (0..initial.len())
                .map(|g| (initial[g], max[g], min[g]))
                .collect(),
        };
        Ok(())
    }
}
