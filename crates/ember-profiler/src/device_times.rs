//! Reading the device times of a cycle's kernels and copies as they finish, and reusing their
//! timing events.
//!
//! Note [Event pool]:
//!
//! `ember-device`'s `timed` brackets every launch with two timing events while the profiler
//! records CUDA activity (Note [Device activity]). Creating and destroying CUDA events costs
//! host time on every launch (PyTorch's caching allocator and its `CUDAEvent` users keep a
//! pool of events for that reason), and holding every event of a cycle until it ends keeps
//! two live events per launch: hundreds of thousands in a long cycle. So [`DeviceTimes`]
//! reads activities while the cycle runs:
//!
//! - once [`DRAIN_AT`] activities are pending, the sink that receives the next one reads the
//!   oldest ones whose end event the device has passed (`cuEventQuery`, which does not wait:
//!   one query of each stream's newest event, as a stream runs its work in order), stopping
//!   at the first still running; the next read waits for [`DRAIN_AT`] more, so that a device
//!   far behind the host is not scanned at every launch;
//! - reading takes the device time from the device's anchor event to the start event and from
//!   start to end (`cuEventElapsedTime`), and puts both events on the free list, from which
//!   `timed` takes its next events ([`DeviceSink::reuse_event`](ember_device::trace::device::DeviceSink::reuse_event));
//! - the first start event read on a device becomes its anchor; once an activity starts more
//!   than [`REANCHOR_MS`] after the anchor, its start event becomes the new anchor, its
//!   offset from the first one summed in f64, so that `cuEventElapsedTime`'s f32
//!   milliseconds never lose precision over a long cycle;
//! - when the cycle ends the profiler waits for each device, reads what is left, and records
//!   one clock event on the idle device, whose host time places the last anchor (and through
//!   the offsets every activity) on the host clock.
//!
//! In a steady state a profiled launch therefore creates no event, and the live events are
//! the free list, the anchors and the pending ones. An activity that reaches the sink after
//! the cycle closed (a launch on another thread racing with the end) has its events
//! destroyed at once. The emulator counts event creates per thread
//! (`thread_event_calls`), which the profiler's tests use to check both.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ember_device::driver::{Driver, EventHandle, StreamHandle};
use ember_device::trace::device::DeviceActivity;

use crate::event::RawDevice;

/// Pending activities at which the next one triggers a read of the finished ones.
pub(crate) const DRAIN_AT: usize = 64;

/// Milliseconds after its anchor from which an activity's start becomes the new anchor.
pub(crate) const REANCHOR_MS: f32 = 1000.0;

/// A device's anchor: the event times are measured from, and its offset from the device's
/// first anchor.
#[derive(Debug)]
struct Anchor {
    device: usize,
    event: EventHandle,
    offset_ms: f64,
}

/// An activity whose device times are read: milliseconds from its device's first anchor.
#[derive(Debug)]
struct Read {
    activity: DeviceActivity,
    start_ms: f64,
    end_ms: f64,
}

/// The device side of one recording cycle (Note [Event pool]).
#[derive(Debug)]
pub(crate) struct DeviceTimes {
    /// Enqueued and not yet read: their events are live and owned here.
    pending: VecDeque<DeviceActivity>,
    /// Read, in the order they were read.
    read: Vec<Read>,
    /// Timing events no activity uses, by device, for the next launches.
    free: Vec<(usize, EventHandle)>,
    /// One per device that has a read activity.
    anchors: Vec<Anchor>,
    /// Activities whose times could not be read.
    unread: u64,
    /// Set when the cycle ends: later activities are dropped with their events.
    closed: bool,
    /// Pending activities at which the next push reads: [`DRAIN_AT`] more than were left
    /// pending by the last read, so that a device running far behind the host is not
    /// scanned again at every launch.
    drain_at: usize,
    /// [`REANCHOR_MS`], smaller in tests.
    reanchor_ms: f32,
}

impl Default for DeviceTimes {
    fn default() -> Self {
        DeviceTimes {
            pending: VecDeque::new(),
            read: Vec::new(),
            free: Vec::new(),
            anchors: Vec::new(),
            unread: 0,
            closed: false,
            drain_at: DRAIN_AT,
            reanchor_ms: REANCHOR_MS,
        }
    }
}

/// The device times of a finished cycle, on the host clock.
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    pub(crate) device: Vec<RawDevice>,
    /// Activities that ran untimed (an event could not be read or placed).
    pub(crate) untimed: u64,
}

impl DeviceTimes {
    /// Take ownership of `a`'s events; read finished activities once enough are pending.
    pub(crate) fn push(&mut self, d: &dyn Driver, a: DeviceActivity) {
        if self.closed {
            destroy_events(d, &a);
            return;
        }
        self.pending.push_back(a);
        if self.pending.len() >= self.drain_at {
            self.read_finished(d);
            self.drain_at = self.pending.len() + DRAIN_AT;
        }
    }

    /// A free timing event of `device`, if there is one.
    pub(crate) fn take_free(&mut self, device: usize) -> Option<EventHandle> {
        if self.closed {
            return None;
        }
        let i = self.free.iter().rposition(|&(dev, _)| dev == device)?;
        Some(self.free.swap_remove(i).1)
    }

    /// The devices with device activity in this cycle.
    pub(crate) fn devices(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self.anchors.iter().map(|a| a.device).collect();
        out.extend(self.pending.iter().map(|a| a.work.device));
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Read the oldest pending activities the device has finished, up to the first one still
    /// running. Work on a stream runs in order, so one query of a stream's newest end event
    /// usually clears all of that stream's activities; only a stream still running is
    /// queried activity by activity.
    fn read_finished(&mut self, d: &dyn Driver) {
        // A broken event (the query fails) is read, and given up on, like a finished one.
        let ready = finished_prefix(&self.pending, |a| d.event_query(a.end).ok());
        for _ in 0..ready {
            if let Some(a) = self.pending.pop_front() {
                self.read_one(d, a);
            }
        }
    }

    /// Read one finished activity's times and free (or keep as the anchor) its events.
    fn read_one(&mut self, d: &dyn Driver, a: DeviceActivity) {
        let device = a.work.device;
        let anchor = self.anchors.iter().position(|x| x.device == device);
        let since = anchor
            .map(|i| d.event_elapsed_ms(self.anchors[i].event, a.start))
            .transpose();
        let times = since.and_then(|since| Ok((since, d.event_elapsed_ms(a.start, a.end)?)));
        let Ok((since, dur)) = times else {
            // Unreadable: the activity counts as untimed, its events go.
            self.unread += 1;
            destroy_events(d, &a);
            return;
        };
        // The start event becomes the anchor on the device's first activity, and when the
        // anchor is more than `reanchor_ms` behind it; otherwise it is free again.
        let start_ms = match (anchor, since) {
            (Some(i), Some(since)) => {
                let start_ms = self.anchors[i].offset_ms + f64::from(since);
                let freed = if since > self.reanchor_ms {
                    self.anchors[i].offset_ms = start_ms;
                    std::mem::replace(&mut self.anchors[i].event, a.start)
                } else {
                    a.start
                };
                self.free.push((device, freed));
                start_ms
            }
            _ => {
                self.anchors.push(Anchor {
                    device,
                    event: a.start,
                    offset_ms: 0.0,
                });
                0.0
            }
        };
        self.free.push((device, a.end));
        self.read.push(Read {
            activity: a,
            start_ms,
            end_ms: start_ms + f64::from(dur.max(0.0)),
        });
    }

    /// End the cycle: wait for each device, read everything, place the times on the host
    /// clock, and destroy every event.
    pub(crate) fn finish(&mut self, d: &dyn Driver) -> Resolved {
        self.closed = true;
        let mut clocks = Vec::new();
        for device in self.devices() {
            if let Some(c) = device_clock(d, device) {
                clocks.push(c);
            }
        }
        // Every device is idle now; activities of a device without a clock are read anyway
        // and then dropped below as untimed.
        while let Some(a) = self.pending.pop_front() {
            self.read_one(d, a);
        }
        // Each device's first anchor on the host clock: the clock's host time, less the
        // device time from the last anchor to the clock, less the last anchor's offset.
        let origins: Vec<(usize, Option<Instant>)> = self
            .anchors
            .iter()
            .map(|a| {
                let origin = clocks.iter().find(|c| c.device == a.device).and_then(|c| {
                    let to_clock = d.event_elapsed_ms(a.event, c.event).ok()?;
                    shift(c.host, -(f64::from(to_clock) + a.offset_ms))
                });
                (a.device, origin)
            })
            .collect();
        let mut out = Resolved {
            untimed: self.unread,
            ..Resolved::default()
        };
        for r in self.read.drain(..) {
            let origin = origins
                .iter()
                .find(|(dev, _)| *dev == r.activity.work.device)
                .and_then(|(_, o)| *o);
            let times = origin.and_then(|o| Some((shift(o, r.start_ms)?, shift(o, r.end_ms)?)));
            let Some((start, end)) = times else {
                out.untimed += 1;
                continue;
            };
            out.device.push(RawDevice::of(&r.activity.work, start, end));
        }
        for c in clocks {
            let _ = d.event_destroy(c.event);
        }
        self.release(d);
        out
    }

    /// Destroy every event still held (a cycle dropped unfinished, or the end of one).
    pub(crate) fn release(&mut self, d: &dyn Driver) {
        self.closed = true;
        for a in self.pending.drain(..) {
            destroy_events(d, &a);
        }
        for (_, e) in self.free.drain(..) {
            let _ = d.event_destroy(e);
        }
        for a in self.anchors.drain(..) {
            let _ = d.event_destroy(a.event);
        }
        self.read.clear();
    }

    /// Close the cycle and destroy its events with `d`, the process's driver (`None` where
    /// there is none, and so no event either).
    pub(crate) fn release_with(&mut self, d: Option<&dyn Driver>) {
        match d {
            Some(d) => self.release(d),
            None => {
                *self = DeviceTimes {
                    closed: true,
                    ..DeviceTimes::default()
                }
            }
        }
    }

    /// Whether any event is still held.
    pub(crate) fn holds_events(&self) -> bool {
        !(self.pending.is_empty() && self.free.is_empty() && self.anchors.is_empty())
    }
}

/// Destroy an activity's two events (best effort: nothing else holds them).
fn destroy_events(d: &dyn Driver, a: &DeviceActivity) {
    let _ = d.event_destroy(a.start);
    let _ = d.event_destroy(a.end);
}

/// How many of `pending`'s oldest activities are finished, up to the first still running:
/// `query` asks whether an activity's end event has passed (`None`: the query failed, which
/// counts as finished so that reading gives up on the activity). A stream is a device's (the
/// default stream's handle is the same on every device) and runs its work in order, so the
/// newest activity of each stream is asked first, and a finished one clears all of its
/// stream's; only a stream still running is asked activity by activity.
fn finished_prefix(
    pending: &VecDeque<DeviceActivity>,
    mut query: impl FnMut(&DeviceActivity) -> Option<bool>,
) -> usize {
    let key = |a: &DeviceActivity| (a.work.device, a.work.stream);
    let mut done: Vec<(usize, StreamHandle)> = Vec::new();
    let mut asked: Vec<(usize, StreamHandle)> = Vec::new();
    for a in pending.iter().rev() {
        if !asked.contains(&key(a)) {
            asked.push(key(a));
            if query(a) == Some(true) {
                done.push(key(a));
            }
        }
    }
    pending
        .iter()
        .take_while(|a| done.contains(&key(a)) || query(a) != Some(false))
        .count()
}

/// A reference event recorded on an idle device, and the host time then.
#[derive(Debug)]
struct DeviceClock {
    device: usize,
    event: EventHandle,
    host: Instant,
}

/// Wait for `device` to be idle, record a reference event and note the host time.
fn device_clock(d: &dyn Driver, device: usize) -> Option<DeviceClock> {
    d.synchronize(device).ok()?;
    let event = d.event_create(device, true).ok()?;
    // The idle device stamps the event as soon as it is recorded: the host time just before
    // the call is its host time, off by the latency of one event record.
    let host = Instant::now();
    if d.event_record(event, StreamHandle::DEFAULT).is_err() || d.event_synchronize(event).is_err()
    {
        let _ = d.event_destroy(event);
        return None;
    }
    Some(DeviceClock {
        device,
        event,
        host,
    })
}

/// `t` moved by `ms` milliseconds (either way), or `None` if that leaves the clock's range.
fn shift(t: Instant, ms: f64) -> Option<Instant> {
    let by = Duration::try_from_secs_f64(ms.abs() / 1e3).ok()?;
    if ms >= 0.0 {
        t.checked_add(by)
    } else {
        t.checked_sub(by)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::borrow::Cow;

    use ember_device::driver::emulator::{Emulator, EmulatorConfig, thread_event_calls};
    use ember_device::trace::device::{ActivityKind, EnqueuedWork, Launch};

    use super::*;

    fn creates_and_destroys() -> (u64, u64) {
        let c = thread_event_calls();
        (
            c.get("cuEventCreate").copied().unwrap_or(0),
            c.get("cuEventDestroy").copied().unwrap_or(0),
        )
    }

    /// Kernel `name` on `stream` of `device`, bracketed by `events`.
    fn kernel(
        name: impl Into<Cow<'static, str>>,
        device: usize,
        stream: StreamHandle,
        correlation: u64,
        events: (EventHandle, EventHandle),
    ) -> DeviceActivity {
        DeviceActivity {
            work: EnqueuedWork {
                launch: Launch {
                    api: "cudaLaunchKernel",
                    kind: ActivityKind::Kernel,
                    name: name.into(),
                    bytes: 0,
                    grid: [1; 3],
                    block: [1; 3],
                },
                device,
                stream,
                correlation,
                enqueued: ember_device::trace::Stamp::now(),
                tid: 0,
            },
            start: events.0,
            end: events.1,
        }
    }

    /// `n` activities on the emulator, each bracketed by events as `timed` does (spare events
    /// first), with the host times around each; then the cycle's end.
    fn run(n: usize, reanchor_ms: f32) -> (Vec<(Instant, Instant)>, Resolved, u64) {
        let e = Emulator::new(EmulatorConfig::devices(1)).unwrap();
        let s = e.stream_create(0).unwrap();
        let mut dt = DeviceTimes {
            reanchor_ms,
            ..DeviceTimes::default()
        };
        let (c0, d0) = creates_and_destroys();
        let mut host = Vec::new();
        let mut creates_late = 0;
        for i in 0..n {
            let before = creates_and_destroys().0;
            let mut take = || {
                dt.take_free(0)
                    .unwrap_or_else(|| e.event_create(0, true).unwrap())
            };
            let (a, b) = (take(), take());
            if i >= n / 2 {
                creates_late += creates_and_destroys().0 - before;
            }
            let t0 = Instant::now();
            e.event_record(a, s).unwrap();
            std::thread::sleep(Duration::from_micros(50));
            e.event_record(b, s).unwrap();
            let t1 = Instant::now();
            host.push((t0, t1));
            dt.push(&e, kernel(format!("k{i}"), 0, s, i as u64, (a, b)));
        }
        let resolved = dt.finish(&e);
        assert!(!dt.holds_events());
        let (c1, d1) = creates_and_destroys();
        assert_eq!(c1 - c0, d1 - d0, "every event created is destroyed");
        e.stream_destroy(s).unwrap();
        (host, resolved, creates_late)
    }

    fn check_placed(host: &[(Instant, Instant)], r: &Resolved) {
        assert_eq!(r.untimed, 0);
        assert_eq!(r.device.len(), host.len());
        // The clock event is placed to within an event record and the f32 milliseconds of
        // cuEventElapsedTime: allow 20 us either way.
        let slack = Duration::from_micros(20);
        for (i, (d, &(t0, t1))) in r.device.iter().zip(host).enumerate() {
            assert_eq!(d.name, format!("k{i}"));
            assert!(d.start + slack >= t0, "k{i} starts before its launch");
            assert!(d.end <= t1 + slack, "k{i} ends after its launch returned");
            assert!(
                d.end >= d.start + Duration::from_micros(40),
                "k{i} lost its duration"
            );
        }
    }

    #[test]
    fn a_long_cycle_reuses_its_events_and_places_every_activity() {
        let (host, r, creates_late) = run(4 * DRAIN_AT, REANCHOR_MS);
        check_placed(&host, &r);
        assert_eq!(
            creates_late, 0,
            "the second half of the launches created events"
        );
    }

    #[test]
    fn moving_the_anchor_keeps_the_times() {
        // Every activity starts past the threshold, so each becomes the anchor in turn.
        let (host, r, _) = run(3 * DRAIN_AT, 0.001);
        check_placed(&host, &r);
    }

    #[test]
    fn finished_activities_are_found_with_one_query_per_stream() {
        // Device 0's default stream, a stream of device 0, and device 1's default stream
        // (the same handle as device 0's), interleaved; end events numbered in order.
        let s = StreamHandle(7);
        let keys = [
            (0, StreamHandle::DEFAULT),
            (0, s),
            (1, StreamHandle::DEFAULT),
        ];
        let pending: VecDeque<DeviceActivity> = (0..9)
            .map(|i| {
                let (device, stream) = keys[i % 3];
                let events = (EventHandle(100 + i as u64), EventHandle(i as u64));
                kernel("k", device, stream, i as u64, events)
            })
            .collect();
        // Everything done: one query per stream (3), all 9 finished.
        let mut asked = 0;
        let n = finished_prefix(&pending, |_| {
            asked += 1;
            Some(true)
        });
        assert_eq!((n, asked), (9, 3));
        // Device 1's default stream has run up to its second activity (end 5), the others
        // are done: the prefix stops at its third (end 8), which is still running. Had the
        // two default streams been taken for one, device 0's finished newest (end 6) would
        // have cleared device 1's too.
        let n = finished_prefix(&pending, |a| Some(a.work.device == 0 || a.end.0 <= 5));
        assert_eq!(n, 8);
        // Device 0's stream s still runs its first activity (end 1): nothing past it.
        let n = finished_prefix(&pending, |a| Some(a.work.stream != s || a.end.0 < 1));
        assert_eq!(n, 1);
        // A failed query counts as finished (reading then gives up on it).
        assert_eq!(finished_prefix(&pending, |_| None), 9);
    }

    #[test]
    fn an_activity_after_the_end_gives_its_events_back() {
        let e = Emulator::new(EmulatorConfig::devices(1)).unwrap();
        let mut dt = DeviceTimes::default();
        dt.release_with(Some(&e));
        let (c0, d0) = creates_and_destroys();
        let (a, b) = (
            e.event_create(0, true).unwrap(),
            e.event_create(0, true).unwrap(),
        );
        assert!(dt.take_free(0).is_none());
        dt.push(&e, kernel("late", 0, StreamHandle::DEFAULT, 1, (a, b)));
        assert!(!dt.holds_events());
        assert_eq!(creates_and_destroys(), (c0 + 2, d0 + 2));
    }
}
