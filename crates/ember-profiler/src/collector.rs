//! The subscriber and device sink of one profiling cycle: what the hooks deliver, kept in
//! per-thread logs (Note [Per-thread logs]).

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use ember_device::driver::{Driver, EventHandle};
use ember_device::trace::device::{DeviceActivity, DeviceSink, EnqueuedWork};
use ember_device::trace::{BeginEvent, Category, EventKind, Stamp, Subscriber, TraceEvent};

use crate::device_times::DeviceTimes;
use crate::event::{self, RawMemory, RawRange};

// Note [Per-thread logs]:
// Every range, allocation and tagged launch of a cycle is appended to a log of the thread
// it happened on: a thread-local names the cycle (`Collector::id`) and its log, so the hot
// path takes only that log's own lock, which nobody else takes until the cycle ends (it is
// uncontended), instead of one lock that every thread shares. A thread's first event of a
// cycle registers its log with the collector (the one shared lock, once per thread per
// cycle). A range that opens leaves a small `Opened` entry (no copy of its metadata or
// stack), removed when the range ends (ranges end in reverse order on a thread, so it is
// found at the back); what is left at the cycle's end was still open, and is closed there
// (its name, start and depth kept). The logs are taken after the subscription is dropped;
// an event racing with that lands in a log nobody reads again.

/// A range that opened during the cycle and has not ended yet.
#[derive(Debug)]
pub(crate) struct Opened {
    id: u64,
    pub(crate) name: Cow<'static, str>,
    pub(crate) category: Category,
    pub(crate) tid: u64,
    pub(crate) start: Stamp,
    pub(crate) depth: u32,
}

/// Entries per chunk of an [`AppendLog`].
const LOG_CHUNK: usize = 256;

/// An append-only list in fixed chunks (PyTorch's `AppendOnlyList`): appending never moves
/// what is already there, as a growing `Vec` does (a copy of the whole log at each doubling).
#[derive(Debug)]
pub(crate) struct AppendLog<T> {
    chunks: Vec<Vec<T>>,
}

impl<T> Default for AppendLog<T> {
    fn default() -> Self {
        AppendLog { chunks: Vec::new() }
    }
}

impl<T> AppendLog<T> {
    #[inline]
    fn push(&mut self, value: T) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < chunk.capacity() => chunk.push(value),
            _ => {
                let mut chunk = Vec::with_capacity(LOG_CHUNK);
                chunk.push(value);
                self.chunks.push(chunk);
            }
        }
    }

    /// Moves `other`'s chunks to the end of this log.
    fn append(&mut self, other: &mut AppendLog<T>) {
        self.chunks.append(&mut other.chunks);
    }

    pub(crate) fn into_vec(self) -> Vec<T> {
        let mut all = Vec::with_capacity(self.chunks.iter().map(Vec::len).sum());
        for chunk in self.chunks {
            all.extend(chunk);
        }
        all
    }
}

/// One thread's records of one cycle.
#[derive(Debug, Default)]
pub(crate) struct ThreadLog {
    pub(crate) ranges: AppendLog<RawRange>,
    pub(crate) open: Vec<Opened>,
    pub(crate) memory: AppendLog<RawMemory>,
    pub(crate) tagged: Vec<EnqueuedWork>,
}

type SharedLog = Arc<Mutex<ThreadLog>>;

fn lock_log(log: &SharedLog) -> MutexGuard<'_, ThreadLog> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}

static NEXT_COLLECTOR: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's log and the collector it belongs to (Note [Per-thread logs]).
    static LOG: RefCell<Option<(u64, SharedLog)>> = const { RefCell::new(None) };
}

/// What the device side delivers during one cycle (CUDA events need the shared state: their
/// pool and the reads while the cycle runs).
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) device: DeviceTimes,
}

/// The subscriber and device sink of one cycle.
#[derive(Debug)]
pub(crate) struct Collector {
    /// Distinguishes this cycle's logs from an earlier cycle's in the threads' locals.
    id: u64,
    cpu: bool,
    memory: bool,
    /// Whether the driver's activity API may be used ([`DeviceTiming::Events`] forbids it).
    activity_allowed: bool,
    /// Set by the first launch: whether this cycle enabled the driver's activity API.
    activity: OnceLock<bool>,
    /// Every thread's log of this cycle.
    logs: Mutex<Vec<SharedLog>>,
    state: Mutex<Collected>,
}

impl Collector {
    /// A collector of host ranges (`cpu`; for `memory` too, to attribute allocations),
    /// allocations (`memory`) and device work, through the driver's activity API where
    /// `activity_allowed`.
    pub(crate) fn new(cpu: bool, memory: bool, activity_allowed: bool) -> Collector {
        Collector {
            id: NEXT_COLLECTOR.fetch_add(1, Ordering::Relaxed),
            cpu,
            memory,
            activity_allowed,
            activity: OnceLock::new(),
            logs: Mutex::new(Vec::new()),
            state: Mutex::new(Collected::default()),
        }
    }

    /// Whether this cycle records through the activity API (set once, by the first launch).
    pub(crate) fn activity_enabled(&self) -> bool {
        self.activity.get().copied().unwrap_or(false)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Collected> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on this thread's log of this cycle (registering it on the thread's first
    /// event); not at all while the thread exits.
    fn with_log(&self, f: impl FnOnce(&mut ThreadLog)) {
        let _ = LOG.try_with(|slot| {
            let Ok(mut slot) = slot.try_borrow_mut() else {
                return;
            };
            let log = match &*slot {
                Some((id, log)) if *id == self.id => log,
                _ => {
                    let log = SharedLog::default();
                    self.logs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(log.clone());
                    &slot.insert((self.id, log)).1
                }
            };
            f(&mut lock_log(log));
        });
    }

    /// Every thread's log, merged (the cycle has ended: nobody appends any more).
    pub(crate) fn take_logs(&self) -> ThreadLog {
        let logs = std::mem::take(&mut *self.logs.lock().unwrap_or_else(|e| e.into_inner()));
        let mut all = ThreadLog::default();
        for log in logs {
            let mut l = std::mem::take(&mut *lock_log(&log));
            all.ranges.append(&mut l.ranges);
            all.open.append(&mut l.open);
            all.memory.append(&mut l.memory);
            all.tagged.append(&mut l.tagged);
        }
        all
    }
}

impl Subscriber for Collector {
    fn on_begin(&self, e: &BeginEvent<'_>) {
        if self.cpu {
            self.with_log(|log| {
                log.open.push(Opened {
                    id: e.id,
                    name: e.name.clone(),
                    category: e.category,
                    tid: e.tid,
                    start: e.start,
                    depth: e.depth,
                });
            });
        }
    }

    fn on_event(&self, e: &TraceEvent) {
        self.on_event_owned(e.clone());
    }

    fn on_event_owned(&self, e: TraceEvent) {
        match e.kind {
            EventKind::Range if self.cpu => self.with_log(|log| {
                if let Some(i) = log.open.iter().rposition(|o| o.id == e.id) {
                    log.open.swap_remove(i);
                }
                log.ranges.push(RawRange {
                    name: e.name,
                    category: e.category,
                    metadata: e.metadata,
                    tid: e.tid,
                    start: e.start,
                    end: e.end,
                    depth: e.depth,
                    correlation: e.correlation,
                    truncated: false,
                    stack: e.stack,
                });
            }),
            EventKind::Instant
                if self.memory && (e.name == "memory.alloc" || e.name == "memory.free") =>
            {
                if let Some(record) = event::parse_memory(&e.name, &e.metadata) {
                    self.with_log(|log| {
                        log.memory.push(RawMemory {
                            tid: e.tid,
                            at: e.start,
                            depth: e.depth,
                            record,
                        });
                    });
                }
            }
            _ => {}
        }
    }
}

impl DeviceSink for Collector {
    fn on_activity(&self, driver: &dyn Driver, activity: DeviceActivity) {
        self.lock().device.push(driver, activity);
    }

    fn reuse_event(&self, device: usize) -> Option<EventHandle> {
        self.lock().device.take_free(device)
    }

    fn activity_api(&self, driver: &dyn Driver) -> bool {
        *self
            .activity
            .get_or_init(|| self.activity_allowed && driver.activity_enable().is_ok())
    }

    fn on_tagged(&self, work: EnqueuedWork) {
        self.with_log(|log| log.tagged.push(work));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_log_keeps_order_across_chunks_and_appends() {
        let mut a = AppendLog::default();
        for i in 0..(2 * LOG_CHUNK + 3) {
            a.push(i);
        }
        assert_eq!(a.chunks.len(), 3);
        assert!(a.chunks.iter().all(|c| c.capacity() == LOG_CHUNK));
        let mut b = AppendLog::default();
        b.push(usize::MAX);
        a.append(&mut b);
        assert!(b.chunks.is_empty());
        let all = a.into_vec();
        assert_eq!(all.len(), 2 * LOG_CHUNK + 4);
        assert!(
            all[..2 * LOG_CHUNK + 3]
                .iter()
                .enumerate()
                .all(|(i, &v)| i == v)
        );
        assert_eq!(all.last(), Some(&usize::MAX));
        assert!(AppendLog::<u8>::default().into_vec().is_empty());
    }
}
