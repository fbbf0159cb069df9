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
//! - [`Stamp::now`] reads the time-stamp counter (x86-64, about 10 ns) when one of these
//!   holds, and otherwise the nanoseconds since an origin `Instant` (the OS's monotonic
//!   clock); the choice, its reason ([`reason`]) and the origin are made once per process, on
//!   first use ([`choose`] is the rule):
//!   1. `EMBER_TRACE_CLOCK=monotonic` forces the OS clock, `EMBER_TRACE_CLOCK=tsc` the counter;
//!   2. the CPU says the counter is invariant (CPUID leaf `0x8000_0007`, EDX bit 8: a constant
//!      rate in every power state, the same on every core);
//!   3. a virtual machine's CPUID often hides that bit (a named QEMU CPU model without
//!      `+invtsc`), and there the guest's clock source is often the hypervisor's, whose reads
//!      fall back to a system call when it cannot promise a stable counter: a microsecond,
//!      twice per range. So where the OS clock is slow (a read costs more than
//!      [`SLOW_OS_CLOCK_NS`], the least of a few measured batches) and Linux says the counter
//!      ticks at a constant rate (`constant_tsc` in `/proc/cpuinfo`), the counter is used, as
//!      PyTorch uses it on every x86 host. A fast OS clock is kept: its gain would be
//!      nanoseconds, not worth a counter the CPU does not vouch for.
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

/// `EMBER_TRACE_CLOCK`: `monotonic` forces the OS clock, `tsc` the time-stamp counter.
pub const ENV_TRACE_CLOCK: &str = "EMBER_TRACE_CLOCK";

/// The cost of one OS clock read above which a constant-rate counter is used in its place
/// (rule 3 of Note [Trace clock]): the vDSO's reads take 20-60 ns, a system call's hundreds.
pub const SLOW_OS_CLOCK_NS: f64 = 150.0;

/// What the clock choice rests on (Note [Trace clock]), gathered once per process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockFacts<'a> {
    /// `EMBER_TRACE_CLOCK`, if set.
    pub setting: Option<&'a str>,
    /// The CPU has a time-stamp counter this code reads (x86-64).
    pub has_counter: bool,
    /// CPUID says the counter is invariant.
    pub invariant: bool,
    /// Linux says the counter ticks at a constant rate (`constant_tsc`).
    pub constant_rate: bool,
}

/// Which clock to stamp with (`true`: the counter) and why, from `facts` (Note [Trace
/// clock]'s rules, in order). `os_clock_ns` (the nanoseconds one OS clock read costs) is
/// measured only when rule 3 needs it.
pub fn choose(facts: ClockFacts<'_>, os_clock_ns: impl FnOnce() -> f64) -> (bool, String) {
    match facts.setting.map(str::trim) {
        Some("monotonic") => return (false, format!("{ENV_TRACE_CLOCK}=monotonic")),
        Some("tsc") if facts.has_counter => return (true, format!("{ENV_TRACE_CLOCK}=tsc")),
        Some("tsc") => {
            return (
                false,
                format!("{ENV_TRACE_CLOCK}=tsc, but this CPU has no counter Ember reads"),
            );
        }
        _ => {}
    }
    if !facts.has_counter {
        return (
            false,
            "no time-stamp counter Ember reads on this CPU".into(),
        );
    }
    if facts.invariant {
        return (
            true,
            "the CPU says its time-stamp counter is invariant".into(),
        );
    }
    if !facts.constant_rate {
        return (
            false,
            "the CPU does not say its time-stamp counter is invariant or constant-rate".into(),
        );
    }
    let ns = os_clock_ns();
    if ns > SLOW_OS_CLOCK_NS {
        (
            true,
            format!(
                "the OS clock costs {ns:.0} ns a read and Linux says the time-stamp counter \
                 ticks at a constant rate (constant_tsc; CPUID does not say invariant)"
            ),
        )
    } else {
        (
            false,
            format!(
                "CPUID does not say the time-stamp counter is invariant, and the OS clock is \
                 fast ({ns:.0} ns a read)"
            ),
        )
    }
}

/// A point on the trace clock (Note [Trace clock]): ticks of the time-stamp counter, or
/// nanoseconds since the origin; [`Calibration::instant`] says when it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(u64);

/// Which clock the stamps read, and the origin pair.
#[derive(Debug)]
struct Clock {
    counter: bool,
    reason: String,
    origin: (u64, Instant),
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let setting = std::env::var(ENV_TRACE_CLOCK).ok();
        let facts = ClockFacts {
            setting: setting.as_deref(),
            has_counter: cfg!(target_arch = "x86_64"),
            invariant: counter_invariant(),
            constant_rate: linux_constant_rate(),
        };
        let (counter, reason) = choose(facts, os_clock_read_ns);
        let origin = if counter { pair() } else { (0, Instant::now()) };
        Clock {
            counter,
            reason,
            origin,
        }
    })
}

/// Whether this CPU says its time-stamp counter is invariant.
#[cfg(target_arch = "x86_64")]
fn counter_invariant() -> bool {
    let max_extended = std::arch::x86_64::__cpuid(0x8000_0000).eax;
    max_extended >= 0x8000_0007 && (std::arch::x86_64::__cpuid(0x8000_0007).edx >> 8) & 1 == 1
}

#[cfg(not(target_arch = "x86_64"))]
fn counter_invariant() -> bool {
    false
}

/// Whether Linux lists `constant_tsc` among the CPU's flags (false where there is no
/// `/proc/cpuinfo`).
fn linux_constant_rate() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|info| cpuinfo_has_flag(&info, "constant_tsc"))
}

/// Whether the first `flags` line of a `/proc/cpuinfo` text lists `flag`.
pub fn cpuinfo_has_flag(cpuinfo: &str, flag: &str) -> bool {
    cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "flags").then_some(value)
        })
        .is_some_and(|flags| flags.split_whitespace().any(|f| f == flag))
}

/// What one `Instant::now` costs here: the least of a few batches' averages.
pub fn os_clock_read_ns() -> f64 {
    const BATCH: u32 = 16;
    (0..4)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..BATCH {
                std::hint::black_box(Instant::now());
            }
            start.elapsed().as_nanos() as f64 / f64::from(BATCH + 1)
        })
        .fold(f64::INFINITY, f64::min)
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

/// Which clock the trace stamps read: `"tsc"` (the time-stamp counter) or `"monotonic"`
/// (`ember info` and benchmarks report it).
pub fn source() -> &'static str {
    if clock().counter { "tsc" } else { "monotonic" }
}

/// Why [`source`] is what it is (the rule of Note [Trace clock] that decided).
pub fn reason() -> &'static str {
    &clock().reason
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

    fn facts() -> ClockFacts<'static> {
        ClockFacts {
            setting: None,
            has_counter: true,
            invariant: false,
            constant_rate: true,
        }
    }

    #[test]
    fn the_clock_follows_the_rules_in_order() {
        let never = || -> f64 { panic!("the OS clock was timed when no rule needed it") };
        let decide = |f: ClockFacts<'static>, ns: f64| choose(f, || ns).0;
        // 1: the setting first, whatever the CPU.
        let forced = |s| ClockFacts {
            setting: Some(s),
            invariant: true,
            ..facts()
        };
        assert!(!choose(forced("monotonic"), never).0);
        assert!(choose(forced(" tsc "), never).0);
        let (counter, why) = choose(
            ClockFacts {
                has_counter: false,
                ..forced("tsc")
            },
            never,
        );
        assert!(!counter && why.contains("no counter"), "{why}");
        // 2: an invariant counter, without timing the OS clock.
        let invariant = ClockFacts {
            invariant: true,
            ..facts()
        };
        assert!(choose(invariant, never).0);
        assert!(
            !choose(
                ClockFacts {
                    has_counter: false,
                    ..invariant
                },
                never
            )
            .0
        );
        // 3: a constant-rate counter only beside a slow OS clock.
        assert!(decide(facts(), 1200.0));
        assert!(!decide(facts(), 40.0));
        assert!(!decide(facts(), SLOW_OS_CLOCK_NS));
        let (_, why) = choose(facts(), || 1234.0);
        assert!(
            why.contains("1234 ns") && why.contains("constant_tsc"),
            "{why}"
        );
        // Neither invariant nor constant-rate: the OS clock, untimed.
        let neither = ClockFacts {
            constant_rate: false,
            ..facts()
        };
        assert!(!choose(neither, never).0);
    }

    #[test]
    fn cpuinfo_flags_are_read_from_the_first_flags_line() {
        let info = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu tsc constant_tsc rep_good\n\nprocessor\t: 1\nflags\t\t: fpu\n";
        assert!(cpuinfo_has_flag(info, "constant_tsc"));
        assert!(cpuinfo_has_flag(info, "tsc"));
        assert!(!cpuinfo_has_flag(info, "nonstop_tsc"));
        assert!(!cpuinfo_has_flag(info, "constant"));
        assert!(!cpuinfo_has_flag("processor\t: 0\n", "tsc"));
        // This host's own answer is stated, and the OS clock's cost is a real number.
        let ns = os_clock_read_ns();
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
        assert!(!reason().is_empty());
    }

    #[test]
    fn stamps_are_ordered_across_threads() {
        let before = Stamp::now();
        let inside = std::thread::spawn(Stamp::now).join().unwrap_or(before);
        let after = Stamp::now();
        assert!(before <= inside && inside <= after);
    }
}
