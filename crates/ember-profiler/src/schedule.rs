//! [`schedule`]: which steps of a loop the profiler records, as `torch.profiler.schedule`.
//!
//! Steps are numbered from 0 and advanced by [`Profiler::step`](crate::Profiler::step).
//! After `skip_first` steps the profiler cycles through `wait` idle steps, `warmup` steps
//! that run the hooks but keep nothing, and `active` recorded steps; the last active step of
//! a cycle is [`ProfilerAction::RecordAndSave`], after which the cycle's trace is handed to
//! `on_trace_ready`. `repeat` cycles run (0: until the profiler stops).

use crate::error::{ProfilerError, Result};

/// What the profiler does during one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfilerAction {
    /// Nothing is recorded.
    None,
    /// The hooks run, but what they record is dropped.
    Warmup,
    /// Recorded.
    Record,
    /// Recorded; the cycle's trace is handed over at the end of this step.
    RecordAndSave,
}

/// A schedule: see the module docs. Built with [`schedule`] and its named setters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Schedule {
    /// Steps ignored before the first cycle.
    pub skip_first: u64,
    /// Idle steps at the start of each cycle.
    pub wait: u64,
    /// Warm-up steps of each cycle.
    pub warmup: u64,
    /// Recorded steps of each cycle (at least 1: [`profile`](crate::profile) refuses 0).
    pub active: u64,
    /// Cycles; 0 repeats until the profiler stops.
    pub repeat: u64,
}

/// `torch.profiler.schedule(wait=, warmup=, active=, repeat=, skip_first=)`, whose
/// arguments are keyword-only: every count starts at 0 and is set by name, so no order can
/// be got wrong. `active` must be set (at least 1): [`profile`](crate::profile) refuses a
/// schedule without recorded steps, as [`Schedule::check`] does.
///
/// ```
/// use ember_profiler::{ProfilerAction as A, schedule};
/// let s = schedule().wait(1).warmup(1).active(2).repeat(1);
/// let actions: Vec<A> = (0..6).map(|step| s.action(step)).collect();
/// assert_eq!(actions, [A::None, A::Warmup, A::Record, A::RecordAndSave, A::None, A::None]);
/// assert!(schedule().wait(1).check().is_err()); // no active steps
/// ```
pub fn schedule() -> Schedule {
    Schedule::default()
}

impl Schedule {
    /// Sets `skip_first`: steps ignored before the first cycle.
    pub fn skip_first(mut self, n: u64) -> Schedule {
        self.skip_first = n;
        self
    }

    /// Sets `wait`: idle steps at the start of each cycle.
    pub fn wait(mut self, n: u64) -> Schedule {
        self.wait = n;
        self
    }

    /// Sets `warmup`: steps of each cycle that run the hooks and keep nothing.
    pub fn warmup(mut self, n: u64) -> Schedule {
        self.warmup = n;
        self
    }

    /// Sets `active`: recorded steps of each cycle (at least 1).
    pub fn active(mut self, n: u64) -> Schedule {
        self.active = n;
        self
    }

    /// Sets `repeat`: the number of cycles (0: until the profiler stops).
    pub fn repeat(mut self, n: u64) -> Schedule {
        self.repeat = n;
        self
    }

    /// An error unless the schedule records at least one step per cycle.
    pub fn check(&self) -> Result<()> {
        if self.active == 0 {
            return Err(ProfilerError::Schedule(
                "expected active >= 1 recorded steps per cycle, but got active = 0 (set it with schedule().active(n))".into(),
            ));
        }
        Ok(())
    }
    /// The action for step `step` (PyTorch's `schedule_fn`).
    pub fn action(&self, step: u64) -> ProfilerAction {
        if step < self.skip_first {
            return ProfilerAction::None;
        }
        let step = step - self.skip_first;
        let cycle = self.wait + self.warmup + self.active;
        if self.active == 0 {
            return ProfilerAction::None;
        }
        if self.repeat > 0 && step / cycle >= self.repeat {
            return ProfilerAction::None;
        }
        let m = step % cycle;
        if m < self.wait {
            ProfilerAction::None
        } else if m < self.wait + self.warmup {
            ProfilerAction::Warmup
        } else if m + 1 < cycle {
            ProfilerAction::Record
        } else {
            ProfilerAction::RecordAndSave
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProfilerAction::{None as N, Record as R, RecordAndSave as S, Warmup as W};

    #[test]
    fn matches_pytorch_schedule_fn() {
        // torch.profiler.schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2) over
        // 14 steps, as PyTorch 2.x prints it.
        let s = schedule()
            .skip_first(2)
            .wait(1)
            .warmup(1)
            .active(2)
            .repeat(2);
        let got: Vec<_> = (0..14).map(|i| s.action(i)).collect();
        assert_eq!(got, [N, N, N, W, R, S, N, W, R, S, N, N, N, N]);
        // repeat = 0 cycles for ever; no warmup, active 1.
        let s = schedule().wait(1).active(1);
        let got: Vec<_> = (0..6).map(|i| s.action(i)).collect();
        assert_eq!(got, [N, S, N, S, N, S]);
    }

    #[test]
    fn active_zero_is_an_error() {
        let s = schedule().wait(1).warmup(1).repeat(1);
        let e = s.check().expect_err("active = 0");
        assert!(e.to_string().contains("active >= 1"), "{e}");
        // Used anyway, it records nothing (and does not divide by zero).
        assert!((0..5).all(|i| s.action(i) == N));
        assert!(schedule().check().is_err());
    }

    #[test]
    fn profile_refuses_a_schedule_without_active_steps() {
        // Checked before the one-profiler-at-a-time flag is taken: no other test is held up.
        let opts = crate::ProfileOptions::new().schedule(schedule().wait(1).warmup(1));
        let e = crate::profile(opts).expect_err("active = 0");
        assert!(e.to_string().contains("active >= 1"), "{e}");
    }
}
