//! Device activity: kernels, copies and library calls, timed on the device.
//!
//! Note [Device activity]:
//!
//! The places that enqueue work on a CUDA stream (`ember-kernels`' launch, the GEMM, the
//! convolutions and the copies of `ember-tensor`'s CUDA backend) wrap the driver call in
//! [`timed`]. While no [`DeviceSink`] is installed that costs one relaxed atomic load. While
//! one is installed (the profiler with its CUDA activity), [`timed`] opens a
//! [`Category::Runtime`](super::Category::Runtime) range named after the API
//! (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cublasGemmStridedBatchedEx`) carrying a fresh
//! correlation id, runs the call inside it, and times the work in one of two ways:
//!
//! - **the activity API** (CUPTI, Note [CUPTI through the seam] in `driver/activity.rs`),
//!   when the sink says so ([`DeviceSink::activity_api`]: it enabled the driver's recording):
//!   the correlation id is pushed as the thread's external id around the call, so the
//!   driver's records of the work (every kernel a library call runs) carry it, and the sink
//!   gets a [`EnqueuedWork`] to join them with when it flushes. No event is made or
//!   recorded; the host pays CUPTI's bookkeeping and a push and a pop.
//! - **CUDA events** otherwise (no CUPTI, or the profile asked for events): two timing events
//!   (ones the sink hands back, Note [Event pool] in `ember-profiler`, or new ones) are
//!   recorded on the stream before and after the call, and the sink gets a
//!   [`DeviceActivity`] owning both. Once the work is done it reads the device time between
//!   them (`cuEventElapsedTime`, placed on the host clock through a reference event) and
//!   reuses them for later launches ([`DeviceSink::reuse_event`]) or destroys them. A
//!   kernel's start is when the stream reached the first event, so back-to-back kernels may
//!   show the gap of an event record between them, and a library call is one activity
//!   however many kernels it runs.
//!
//! On the emulator both ways produce the same events with the emulator's durations: it
//! stamps events on the host when recorded and runs kernels inside the launch call, and its
//! activity records are the host clock around the work.
//!
//! A failure to create or record an event, or to push the id, never fails the user's call:
//! the call runs untimed and [`untimed_count`] counts it, so the profiler can say so.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::published::{Cached, Published};
use crate::driver::{Driver, EventHandle, StreamHandle};

pub use crate::driver::ActivityKind;

/// What the call site says about the work it enqueues (built only while a sink listens).
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The API that enqueued it, as CUDA names it (`cudaLaunchKernel`).
    pub api: &'static str,
    /// What it is.
    pub kind: ActivityKind,
    /// The kernel's name, or a copy's description (`Memcpy HtoD (Pageable -> Device)`).
    pub name: Cow<'static, str>,
    /// Bytes moved (copies), 0 for kernels.
    pub bytes: u64,
    /// Grid and block of a kernel (zeros otherwise).
    pub grid: [u32; 3],
    /// Threads per block of a kernel (zeros otherwise).
    pub block: [u32; 3],
}

/// One piece of work enqueued on a stream while a sink listens (Note [Device activity]).
#[derive(Clone, Debug, PartialEq)]
pub struct EnqueuedWork {
    /// What the call site said.
    pub launch: Launch,
    /// The device's ordinal.
    pub device: usize,
    /// The stream it was enqueued on.
    pub stream: StreamHandle,
    /// Shared with the runtime range that enqueued it and, under the activity API, with its
    /// activity records (their external id).
    pub correlation: u64,
    /// When the host enqueued it, on the trace clock (Note [Trace clock]).
    pub enqueued: super::Stamp,
    /// The enqueuing thread's [`super::thread_tid`].
    pub tid: u64,
}

impl EnqueuedWork {
    /// `launch` on `stream` of `device`, being enqueued now by this thread, with a fresh
    /// correlation id.
    fn begin(launch: Launch, device: usize, stream: StreamHandle) -> EnqueuedWork {
        EnqueuedWork {
            launch,
            device,
            stream,
            correlation: NEXT_CORRELATION.fetch_add(1, Ordering::Relaxed),
            enqueued: super::Stamp::now(),
            tid: super::thread_tid(),
        }
    }
}

/// Work timed with CUDA events: the two recorded around it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceActivity {
    /// What was enqueued.
    pub work: EnqueuedWork,
    /// Recorded just before the work (owned by the sink).
    pub start: EventHandle,
    /// Recorded just after the work (owned by the sink).
    pub end: EventHandle,
}

/// Receives device activity; takes ownership of the events of a [`DeviceActivity`].
pub trait DeviceSink: Send + Sync + fmt::Debug {
    /// Called after the work was enqueued (not finished), with the driver that enqueued it
    /// and owns the events.
    fn on_activity(&self, driver: &dyn Driver, activity: DeviceActivity);

    /// A timing event of `device` that the sink took with an earlier activity and no longer
    /// needs, for the next launch to record; `None` (the default) makes [`timed`] create
    /// one.
    fn reuse_event(&self, device: usize) -> Option<EventHandle> {
        let _ = device;
        None
    }

    /// Whether `driver`'s activity API records this sink's launches (the sink enables it on
    /// the first launch it sees and answers the same from then on); `false` (the default)
    /// times them with events.
    fn activity_api(&self, driver: &dyn Driver) -> bool {
        let _ = driver;
        false
    }

    /// Called after work was enqueued with its id pushed, when [`DeviceSink::activity_api`]
    /// said so.
    fn on_tagged(&self, work: EnqueuedWork) {
        let _ = work;
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static NEXT_CORRELATION: AtomicU64 = AtomicU64::new(1);
static UNTIMED: AtomicU64 = AtomicU64::new(0);
/// The installed sink; a launch reads its thread's copy, refreshed when the generation
/// moves (Note [Per-thread trace state]), so a timed launch takes no lock.
static SINK: Published<dyn DeviceSink> = Published::new();

thread_local! {
    static THREAD_SINK: RefCell<Cached<dyn DeviceSink>> = const { RefCell::new(Cached::empty()) };
}

/// The installed sink (`None`: none): one reference count, no lock.
fn current_sink() -> Option<Arc<dyn DeviceSink>> {
    THREAD_SINK
        .try_with(|cell| SINK.with_current(cell, |s| s.cloned()))
        .unwrap_or_else(|_| SINK.current())
}

/// `true` while a sink is installed.
#[inline]
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Install `sink` (or remove it with `None`); returns the one it replaces.
pub fn set_sink(sink: Option<Arc<dyn DeviceSink>>) -> Option<Arc<dyn DeviceSink>> {
    SINK.replace(|_| {
        ACTIVE.store(sink.is_some(), Ordering::Relaxed);
        sink
    })
}

/// How many calls ran untimed because an event could not be created or recorded.
pub fn untimed_count() -> u64 {
    UNTIMED.load(Ordering::Relaxed)
}

/// Run `call`, which enqueues work on `stream` of `device`; while a sink listens, time it on
/// the device (Note [Device activity]). `describe` runs only then.
#[inline]
pub fn timed<T, E>(
    driver: &dyn Driver,
    device: usize,
    stream: StreamHandle,
    describe: impl FnOnce() -> Launch,
    call: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    if !is_active() {
        return call();
    }
    timed_slow(driver, device, stream, describe(), call)
}

#[cold]
fn timed_slow<T, E>(
    driver: &dyn Driver,
    device: usize,
    stream: StreamHandle,
    launch: Launch,
    call: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let Some(sink) = current_sink() else {
        // The sink went away since `is_active`: nobody listens any more.
        return call();
    };
    if sink.activity_api(driver) {
        return tagged(driver, &*sink, device, stream, launch, call);
    }
    let Some(events) = start_events(driver, &*sink, device, stream) else {
        UNTIMED.fetch_add(1, Ordering::Relaxed);
        return call();
    };
    let work = EnqueuedWork::begin(launch, device, stream);
    let range = super::runtime_range(work.launch.api, work.correlation);
    let result = call();
    let recorded = driver.event_record(events.1, stream).is_ok();
    drop(range);
    if result.is_ok() && recorded {
        sink.on_activity(
            driver,
            DeviceActivity {
                work,
                start: events.0,
                end: events.1,
            },
        );
    } else {
        if result.is_ok() {
            UNTIMED.fetch_add(1, Ordering::Relaxed);
        }
        // Best effort: the events were ours and nobody else saw them.
        let _ = driver.event_destroy(events.0);
        let _ = driver.event_destroy(events.1);
    }
    result
}

/// [`timed`] under the activity API: the call inside a runtime range, with the range's
/// correlation id pushed as the thread's external id.
fn tagged<T, E>(
    driver: &dyn Driver,
    sink: &dyn DeviceSink,
    device: usize,
    stream: StreamHandle,
    launch: Launch,
    call: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let work = EnqueuedWork::begin(launch, device, stream);
    let range = super::runtime_range(work.launch.api, work.correlation);
    if driver.activity_push_correlation(work.correlation).is_err() {
        UNTIMED.fetch_add(1, Ordering::Relaxed);
        return call();
    }
    let result = call();
    let popped = driver.activity_pop_correlation().is_ok();
    drop(range);
    match (&result, popped) {
        (Ok(_), true) => sink.on_tagged(work),
        (Ok(_), false) => {
            UNTIMED.fetch_add(1, Ordering::Relaxed);
        }
        (Err(_), _) => {}
    }
    result
}

/// Take two timing events on `device` (the sink's spare ones first) and record the first on
/// `stream`.
fn start_events(
    driver: &dyn Driver,
    sink: &dyn DeviceSink,
    device: usize,
    stream: StreamHandle,
) -> Option<(EventHandle, EventHandle)> {
    let take = || match sink.reuse_event(device) {
        Some(e) => Some(e),
        None => driver.event_create(device, true).ok(),
    };
    let a = take()?;
    let Some(b) = take() else {
        let _ = driver.event_destroy(a);
        return None;
    };
    if driver.event_record(a, stream).is_err() {
        let _ = driver.event_destroy(a);
        let _ = driver.event_destroy(b);
        return None;
    }
    Some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::emulator::{Emulator, EmulatorConfig};
    use std::sync::Mutex;

    /// Keeps the correlation ids of the activities it is handed (and destroys their events).
    #[derive(Debug, Default)]
    struct Counting(Mutex<Vec<u64>>);

    impl DeviceSink for Counting {
        fn on_activity(&self, driver: &dyn Driver, a: DeviceActivity) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(a.work.correlation);
            let _ = driver.event_destroy(a.start);
            let _ = driver.event_destroy(a.end);
        }
    }

    impl Counting {
        fn len(&self) -> usize {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
        }
    }

    /// The thread's copy of the sink follows every replacement (Note [Per-thread trace
    /// state]): a launch goes to the sink installed when it runs, never to an earlier one.
    #[test]
    fn a_replaced_sink_takes_the_next_launch_on_the_same_thread() {
        let emu = Emulator::new(EmulatorConfig::devices(1)).expect("emulator");
        let run = || {
            let launch = || Launch {
                api: "cudaLaunchKernel",
                kind: ActivityKind::Kernel,
                name: Cow::Borrowed("probe"),
                bytes: 0,
                grid: [1; 3],
                block: [1; 3],
            };
            timed(&emu, 0, StreamHandle::DEFAULT, launch, || Ok::<(), ()>(()))
        };
        let (a, b) = (Arc::new(Counting::default()), Arc::new(Counting::default()));
        let _ = set_sink(Some(a.clone()));
        assert!(run().is_ok());
        let _ = set_sink(Some(b.clone()));
        assert!(run().is_ok() && run().is_ok());
        let _ = set_sink(None);
        assert!(run().is_ok());
        assert_eq!((a.len(), b.len()), (1, 2));
        // Another thread sees the same sink.
        let _ = set_sink(Some(a.clone()));
        std::thread::scope(|s| {
            s.spawn(|| assert!(run().is_ok()));
        });
        let _ = set_sink(None);
        assert_eq!(a.len(), 2);
    }
}
