//! The trace clock: what ranges, points and device launches are stamped with.
//!
//! Note [Trace clock]:
//!
//! A recorded range reads the clock twice, and on some hosts `clock_gettime` is most of a
//! range's cost: about 25 ns through the vDSO with the `tsc` clock source, microseconds with
//! `hpet` or a hypervisor's clock that traps. PyTorch's profiler stamps its events with the
//! CPU's time-stamp counter instead (`c10::getApproximateTime`, `rdtsc`) and converts the
//! counts to wall-clock time when the trace is built (`ApproximateClockToUnixTimeConverter`).
//! Ember does the same:
//!
//! - [`Stamp::now`] reads the time-stamp counter where the CPU says it is invariant (x86-64,
//!   CPUID leaf `0x8000_0007`, EDX bit 8: it ticks at a constant rate in every power state,
//!   the same on every core), about 10 ns; elsewhere, or with
//!   `EMBER_TRACE_CLOCK=monotonic`, it is the nanoseconds since an origin `Instant` (the OS's
//!   monotonic clock). The choice and the origin are made once per process, on first use.
//! - A stamp means nothing alone: a [`Calibration`], taken when a profiler builds its trace,
//!   maps stamps to `Instant`s by the line through two (counter, `Instant`) pairs, the
//!   origin's and its own, each read as the tightest of a few brackets of the counter around
//!   `Instant::now`. The longer the process has been tracing, the better the rate; a
//!   calibration less than [`MIN_SPAN`] after the origin waits until that much has passed
//!   (once per process: later ones are further away), so the rate is right to a few parts in
//!   a million and a range's duration to nanoseconds.
//!
//! Stamps of one process compare and order as the times they stand for, on every thread.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long after the origin a calibration must be, at least (see Note [Trace clock]).
pub const MIN_SPAN: Duration = Duration::from_millis(10);

/// Brackets read for one (counter, `Instant`) pair; the tightest is kept.
const PAIR_TRIES: usize = 7;

/// `EMBER_TRACE_CLOCK`: `monotonic` forces the OS clock.
pub const ENV_TRACE_CLOCK: &str = "EMBER_TRACE_CLOCK";

/// A point on the trace clock (Note [Trace clock]): ticks of the time-stamp counter, or
/// nanoseconds since the origin; [`Calibration::instant`] says when it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(u64);

/// Which clock the stamps read, and the origin pair.
#[derive(Debug)]
struct Clock {
    counter: bool,
    origin: (u64, Instant),
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let counter = counter_usable()
            && std::env::var(ENV_TRACE_CLOCK).map_or(true, |v| v.trim() != "monotonic");
        let origin = if counter { pair() } else { (0, Instant::now()) };
        Clock { counter, origin }
    })
}

/// Whether this CPU has an invariant time-stamp counter.
#[cfg(target_arch = "x86_64")]
fn counter_usable() -> bool {
    let max_extended = std::arch::x86_64::__cpuid(0x8000_0000).eax;
    max_extended >= 0x8000_0007 && (std::arch::x86_64::__cpuid(0x8000_0007).edx >> 8) & 1 == 1
}

#[cfg(not(target_arch = "x86_64"))]
fn counter_usable() -> bool {
    false
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline]
fn counter() -> u64 {
    // SAFETY: `rdtsc` is in every x86-64 CPU and reads a register; it has no preconditions
    // (the intrinsic is `unsafe` only by the rules for architecture intrinsics).
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn counter() -> u64 {
    0
}

/// A (counter, `Instant`) pair: the tightest of a few brackets of the counter around
/// `Instant::now`, the counter taken at the bracket's middle.
fn pair() -> (u64, Instant) {
    let mut best: Option<(u64, u64, Instant)> = None;
    for _ in 0..PAIR_TRIES {
        let a = counter();
        let t = Instant::now();
        let b = counter();
        let width = b.wrapping_sub(a);
        if best.is_none_or(|(w, ..)| width < w) {
            best = Some((width, a + width / 2, t));
        }
    }
    best.map_or_else(|| (counter(), Instant::now()), |(_, c, t)| (c, t))
}

impl Stamp {
    /// Now, on the trace clock.
    #[inline]
    pub fn now() -> Stamp {
        let c = clock();
        if c.counter {
            Stamp(counter())
        } else {
            Stamp(u64::try_from(c.origin.1.elapsed().as_nanos()).unwrap_or(u64::MAX))
        }
    }

    /// `Instant::now()`'s stamp is [`Stamp::now`]; this is the stamp of an earlier or later
    /// `Instant`, through `cal` (for tests and for events made from host times).
    pub fn at(t: Instant, cal: &Calibration) -> Stamp {
        let ns = if t >= cal.origin {
            t.duration_since(cal.origin).as_nanos() as f64
        } else {
            -(cal.origin.duration_since(t).as_nanos() as f64)
        };
        let ticks = cal.origin_ticks as f64 + ns / cal.ns_per_tick;
        Stamp(ticks.max(0.0) as u64)
    }
}

/// Maps stamps to `Instant`s (Note [Trace clock]); take one when a trace is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    origin_ticks: u64,
    origin: Instant,
    ns_per_tick: f64,
}

impl Calibration {
    /// A calibration through the origin and now (waiting until [`MIN_SPAN`] after the
    /// origin if that has not passed yet).
    pub fn now() -> Calibration {
        let c = clock();
        let (origin_ticks, origin) = c.origin;
        if !c.counter {
            return Calibration {
                origin_ticks,
                origin,
                ns_per_tick: 1.0,
            };
        }
        let since = origin.elapsed();
        if since < MIN_SPAN {
            std::thread::sleep(MIN_SPAN - since);
        }
        let (ticks, at) = pair();
        let ns = at.duration_since(origin).as_nanos() as f64;
        let span = ticks.saturating_sub(origin_ticks);
        Calibration {
            origin_ticks,
            origin,
            // A counter that did not move (impossible for an invariant one) maps every
            // stamp to the origin rather than dividing by zero.
            ns_per_tick: if span == 0 { 0.0 } else { ns / span as f64 },
        }
    }

    /// When `s` was.
    pub fn instant(&self, s: Stamp) -> Instant {
        let ticks = s.0 as f64 - self.origin_ticks as f64;
        let ns = ticks * self.ns_per_tick;
        if ns >= 0.0 {
            self.origin + Duration::from_nanos(ns as u64)
        } else {
            self.origin
                .checked_sub(Duration::from_nanos((-ns) as u64))
                .unwrap_or(self.origin)
        }
    }

    /// The nanoseconds from `a` to `b` (0 if `b` is not after `a`).
    pub fn nanos_between(&self, a: Stamp, b: Stamp) -> u64 {
        (b.0.saturating_sub(a.0) as f64 * self.ns_per_tick) as u64
    }

    /// Whether the stamps read the time-stamp counter (`false`: the OS's monotonic clock).
    pub fn uses_counter(&self) -> bool {
        clock().counter
    }
}

/// Which clock the trace stamps read: `"tsc"` (the invariant time-stamp counter) or
/// `"monotonic"` (`ember info` and benchmarks report it).
pub fn source() -> &'static str {
    if clock().counter { "tsc" } else { "monotonic" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_map_to_the_instants_they_were_taken_at() {
        let t0 = Instant::now();
        let s0 = Stamp::now();
        std::thread::sleep(Duration::from_millis(3));
        let s1 = Stamp::now();
        let t1 = Instant::now();
        assert!(s0 < s1);
        let cal = Calibration::now();
        let (i0, i1) = (cal.instant(s0), cal.instant(s1));
        // Each within a few microseconds of the Instant read beside it.
        let near = |a: Instant, b: Instant| {
            let d = if a > b { a - b } else { b - a };
            d < Duration::from_micros(50)
        };
        assert!(near(i0, t0), "{:?}", i0.duration_since(t0.min(i0)));
        assert!(near(i1, t1), "{:?}", i1.duration_since(t1.min(i1)));
        let ns = cal.nanos_between(s0, s1);
        assert!((2_900_000..3_500_000).contains(&ns), "{ns}");
        assert_eq!(cal.nanos_between(s1, s0), 0);
        // `at` inverts `instant` (to a tick).
        let back = Stamp::at(i1, &cal);
        assert!(cal.nanos_between(back.min(s1), back.max(s1)) < 10);
        assert!(["tsc", "monotonic"].contains(&source()));
        assert_eq!(cal.uses_counter(), source() == "tsc");
    }

    #[test]
    fn stamps_are_ordered_across_threads() {
        let before = Stamp::now();
        let inside = std::thread::spawn(Stamp::now).join().unwrap_or(before);
        let after = Stamp::now();
        assert!(before <= inside && inside <= after);
    }
}
