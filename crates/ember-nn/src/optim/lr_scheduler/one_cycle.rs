//! [`OneCycleLR`] (`torch.optim.lr_scheduler.OneCycleLR`) and its options.

use std::f64::consts::PI;

use super::super::Optimizer;
use super::super::state::{bool_entry, f64_entry};
use super::{Base, Fields, LrScheduler, check_values, f64s_entry, i64_entry, to_state_dict};
use crate::{NnError, Result, StateDict};

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
        let bad = |msg: String| Err(NnError::invalid("OneCycleLR", msg).into());
        if total_steps == 0 {
            return bad(format!(
                "Expected positive integer total_steps, but got {total_steps}"
            ));
        }
        let pct_start = options.pct_start;
        check_pct_start(pct_start)?;
        check_options(&options)?;
        check_values("OneCycleLR", "max_lr", &max_lrs, true)?;
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

/// The options' numbers: finite momenta, finite positive division factors.
fn check_options(o: &OneCycleLrOptions) -> Result<()> {
    check_values("OneCycleLR", "base_momentum", &[o.base_momentum], false)?;
    check_values("OneCycleLR", "max_momentum", &[o.max_momentum], false)?;
    for (key, v) in [
        ("div_factor", o.div_factor),
        ("final_div_factor", o.final_div_factor),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            return Err(NnError::invalid(
                "OneCycleLR",
                format!("{key} must be finite and > 0, found {v}"),
            )
            .into());
        }
    }
    Ok(())
}

fn check_pct_start(pct_start: f64) -> Result<()> {
    if (0.0..=1.0).contains(&pct_start) {
        Ok(())
    } else {
        Err(NnError::invalid(
            "OneCycleLR",
            format!("Expected float between 0 and 1 pct_start, but got {pct_start}"),
        )
        .into())
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
            )
            .into());
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
        check_options(&options)?;
        check_values("OneCycleLR", "initial_lr", &initial, true)?;
        check_values("OneCycleLR", "max_lr", &max, true)?;
        check_values("OneCycleLR", "min_lr", &min, true)?;
        if base.last_epoch > total_steps as i64 {
            return Err(NnError::invalid(
                "OneCycleLR",
                format!(
                    "last_epoch {} is past total_steps {total_steps} in the loaded state dict",
                    base.last_epoch
                ),
            )
            .into());
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
