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

/// A schedule: see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Steps ignored before the first cycle.
    pub skip_first: u64,
    /// Idle steps at the start of each cycle.
    pub wait: u64,
    /// Warm-up steps of each cycle.
    pub warmup: u64,
    /// Recorded steps of each cycle (at least 1).
    pub active: u64,
    /// Cycles; 0 repeats until the profiler stops.
    pub repeat: u64,
}

/// `torch.profiler.schedule(skip_first=, wait=, warmup=, active=, repeat=)`; `active` must be
/// at least 1.
///
/// ```
/// use ember_profiler::{ProfilerAction as A, schedule};
/// let s = schedule(0, 1, 1, 2, 1)?;
/// let actions: Vec<A> = (0..6).map(|step| s.action(step)).collect();
/// assert_eq!(actions, [A::None, A::Warmup, A::Record, A::RecordAndSave, A::None, A::None]);
/// # Ok::<(), ember_profiler::ProfilerError>(())
/// ```
pub fn schedule(
    skip_first: u64,
    wait: u64,
    warmup: u64,
    active: u64,
    repeat: u64,
) -> Result<Schedule> {
    if active == 0 {
        return Err(ProfilerError::Schedule(
            "expected active >= 1 recorded steps per cycle, but got active = 0".into(),
        ));
    }
    Ok(Schedule {
        skip_first,
        wait,
        warmup,
        active,
        repeat,
    })
}

impl Schedule {
    /// The action for step `step` (PyTorch's `schedule_fn`).
    pub fn action(&self, step: u64) -> ProfilerAction {
        if step < self.skip_first {
            return ProfilerAction::None;
        }
        let step = step - self.skip_first;
        let cycle = self.wait + self.warmup + self.active;
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
        let s = schedule(2, 1, 1, 2, 2).expect("valid");
        let got: Vec<_> = (0..14).map(|i| s.action(i)).collect();
        assert_eq!(got, [N, N, N, W, R, S, N, W, R, S, N, N, N, N]);
        // repeat = 0 cycles for ever; no warmup, active 1.
        let s = schedule(0, 1, 0, 1, 0).expect("valid");
        let got: Vec<_> = (0..6).map(|i| s.action(i)).collect();
        assert_eq!(got, [N, S, N, S, N, S]);
    }

    #[test]
    fn active_zero_is_an_error() {
        let e = schedule(0, 1, 1, 0, 1).expect_err("active = 0");
        assert!(e.to_string().contains("active >= 1"), "{e}");
    }
}
