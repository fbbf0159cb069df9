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
//! # Ok::<(), ember_nn::Error>(())
//! ```

use std::collections::BTreeSet;
use std::f64::consts::PI;

use ember_tensor::{Device, Scalar, Shape, Tensor as Raw};

use super::Optimizer;
use super::state::{f64_entry, read_bool, read_f64, scalar_of};
use crate::{NnError, Result, StateDict};

mod one_cycle;

pub use one_cycle::{AnnealStrategy, OneCycleLR, OneCycleLrOptions};

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
    /// # Ok::<(), ember_nn::Error>(())
    /// ```
    fn load_state_dict(&mut self, state_dict: &StateDict) -> Result<()>;
}

/// Errors unless every value is finite (and `>= 0` when `non_negative`): what the
/// constructors refuse, and what a loaded state dict must not bring in (a learning rate of
/// `inf` from a corrupted checkpoint).
fn check_values(
    scheduler: &'static str,
    key: &str,
    values: &[f64],
    non_negative: bool,
) -> Result<()> {
    match values
        .iter()
        .find(|v| !v.is_finite() || (non_negative && **v < 0.0))
    {
        None => Ok(()),
        Some(v) => Err(NnError::invalid(
            scheduler,
            format!(
                "{key} must be finite{}, found {v}",
                if non_negative { " and >= 0" } else { "" }
            ),
        )
        .into()),
    }
}

fn i64_entry(v: i64) -> Result<Raw> {
    Raw::scalar(v, Device::Cpu)
}

fn f64s_entry(v: &[f64]) -> Result<Raw> {
    Raw::from_vec(v.to_vec(), [v.len()], Device::Cpu)
}

/// Named fields into a state dict (as [`Tensor`]s without history).
fn to_state_dict(fields: Vec<(&str, Raw)>) -> StateDict {
    let mut dict: StateDict = fields
        .into_iter()
        .map(|(k, t)| (k.to_string(), t))
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
            )
            .into()),
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
        t.to_dtype(ember_tensor::DType::F64)?.to_vec::<f64>()
    }

    /// A count read with [`Fields::i64`] that must be positive.
    fn positive(&mut self, key: &str) -> Result<usize> {
        let v = self.i64(key)?;
        match usize::try_from(v) {
            Ok(n) if n > 0 || !self.dict.contains_key(key) => Ok(n),
            _ => Err(NnError::invalid(
                self.scheduler,
                format!("{key} must be positive, found {v} in the loaded state dict"),
            )
            .into()),
        }
    }

    /// Errors unless every key was found and used.
    fn finish(self) -> Result<()> {
        let unexpected: Vec<String> = self
            .dict
            .keys()
            .chain(self.dict.plain().map(|(k, _)| k))
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
        }
        .into())
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
            )
            .into());
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
        let value = f.f64(factor)?;
        f.finish()?;
        check_values(self.name, factor, &[value], false)?;
        Ok((base, count, value))
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
            )
            .into());
        }
        let (base_lrs, last_lr) = (f.per_group("base_lrs")?, f.per_group("_last_lr")?);
        check_values(self.name, "base_lrs", &base_lrs, true)?;
        check_values(self.name, "_last_lr", &last_lr, true)?;
        Ok(Base {
            name: self.name,
            last_epoch,
            base_lrs,
            last_lr,
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
            return Err(NnError::invalid("StepLR", "step_size must be positive, got 0").into());
        }
        check_values("StepLR", "gamma", &[gamma], false)?;
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
            return Err(
                NnError::invalid("CosineAnnealingLR", "T_max must be positive, got 0").into(),
            );
        }
        check_values("CosineAnnealingLR", "eta_min", &[eta_min], false)?;
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
