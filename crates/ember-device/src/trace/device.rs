//! Device activity: kernels, copies and library calls, timed on the device.
//!
//! Note [Device activity]:
//!
//! The places that enqueue work on a CUDA stream (`ember-kernels`' launch, the GEMM and the
//! copies of `ember-tensor`'s CUDA backend) wrap the driver call in [`timed`]. While no
//! [`DeviceSink`] is installed that costs one relaxed atomic load. While one is installed
//! (the profiler with its CUDA activity), [`timed`]:
//!
//! 1. takes two timing events (ones the sink hands back, Note [Event pool] in
//!    `ember-profiler`, or new ones) and records the first on the stream;
//! 2. opens a [`Category::Runtime`](super::Category::Runtime) range named after the API
//!    (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cublasGemmStridedBatchedEx`) carrying a fresh
//!    correlation id, runs the call inside it, and records the second event;
//! 3. hands a [`DeviceActivity`] with both events and the same correlation id to the sink.
//!
//! The sink owns the events from then on: once the work is done it reads the device time
//! between them (`cuEventElapsedTime`, placed on the host clock through a reference event)
//! and reuses them for later launches ([`DeviceSink::reuse_event`]) or destroys them. This is CUDA events, not CUPTI: the
//! durations are the device's, measured on its own clock, but a kernel's start is when the
//! stream reached the first event, so back-to-back kernels may show the gap of an event
//! record between them. On the emulator the events are stamped on the host when recorded and
//! kernels run inside the launch call, so the same events come out with the emulator's
//! durations.
//!
//! A failure to create or record an event never fails the user's call: the call runs
//! untimed and [`untimed_count`] counts it, so the profiler can say so.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::driver::{Driver, EventHandle, StreamHandle};

/// What a [`DeviceActivity`] did on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivityKind {
    /// A kernel, or a library call that runs kernels (a cuBLAS GEMM).
    Kernel,
    /// A copy from host to device.
    MemcpyHtoD,
    /// A copy from device to host.
    MemcpyDtoH,
    /// A copy between device buffers.
    MemcpyDtoD,
    /// A memset.
    Memset,
}

impl ActivityKind {
    /// PyTorch's trace category: `kernel`, `gpu_memcpy` or `gpu_memset`.
    pub fn category(self) -> &'static str {
        match self {
            ActivityKind::Kernel => "kernel",
            ActivityKind::Memset => "gpu_memset",
            _ => "gpu_memcpy",
        }
    }
}

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

/// One piece of work enqueued on a stream, with the two events around it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceActivity {
    /// What the call site said.
    pub launch: Launch,
    /// The device's ordinal.
    pub device: usize,
    /// The stream it ran on.
    pub stream: StreamHandle,
    /// Shared with the runtime range that enqueued it.
    pub correlation: u64,
    /// Recorded just before the work (owned by the sink).
    pub start: EventHandle,
    /// Recorded just after the work (owned by the sink).
    pub end: EventHandle,
    /// When the host enqueued it.
    pub enqueued: Instant,
    /// The enqueuing thread's [`super::thread_tid`].
    pub tid: u64,
}

/// Receives device activity; takes ownership of its two events.
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
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static NEXT_CORRELATION: AtomicU64 = AtomicU64::new(1);
static UNTIMED: AtomicU64 = AtomicU64::new(0);
static SINK: RwLock<Option<Arc<dyn DeviceSink>>> = RwLock::new(None);

/// `true` while a sink is installed.
#[inline]
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Install `sink` (or remove it with `None`); returns the one it replaces.
pub fn set_sink(sink: Option<Arc<dyn DeviceSink>>) -> Option<Arc<dyn DeviceSink>> {
    let mut slot = SINK.write().unwrap_or_else(|e| e.into_inner());
    ACTIVE.store(sink.is_some(), Ordering::Relaxed);
    std::mem::replace(&mut *slot, sink)
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
    let Some(sink) = SINK.read().unwrap_or_else(|e| e.into_inner()).clone() else {
        // The sink went away since `is_active`: nobody listens any more.
        return call();
    };
    let Some(events) = start_events(driver, &*sink, device, stream) else {
        UNTIMED.fetch_add(1, Ordering::Relaxed);
        return call();
    };
    let correlation = NEXT_CORRELATION.fetch_add(1, Ordering::Relaxed);
    let enqueued = Instant::now();
    let range = super::runtime_range(launch.api, correlation);
    let result = call();
    let recorded = driver.event_record(events.1, stream).is_ok();
    drop(range);
    if result.is_ok() && recorded {
        sink.on_activity(
            driver,
            DeviceActivity {
                launch,
                device,
                stream,
                correlation,
                start: events.0,
                end: events.1,
                enqueued,
                tid: super::thread_tid(),
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
