//! Trace hooks: scoped ranges and point events for the profiler.
//!
//! Lower crates mark what they do ([`range`] around an op, [`instant`] for an allocation);
//! a profiler [`subscribe`]s and receives a [`TraceEvent`] per completed range or point.
//!
//! Note [Zero-cost tracing]:
//!
//! While nobody is subscribed, [`range`], [`range_with`] and [`instant`] cost one relaxed
//! atomic load: they return an inert [`RangeGuard`] (a `None` inside, nothing on drop), do not
//! touch thread-local state, and never run the metadata closure. The flag is a count of live
//! [`Subscription`]s. A range that began while nobody listened stays inert even if a
//! subscriber arrives before it ends; a range that began while someone listened is delivered
//! at its end to whoever is subscribed then.
//!
//! Events are delivered when a range *ends* (Chrome's "complete" events), so nested ranges
//! arrive inner first; each carries its start and end [`Stamp`] (Note [Trace clock]), the thread, and its nesting
//! depth on that thread (0 for the outermost traced range). Subscribers are called on the
//! thread that ends the range, outside any lock, so they may subscribe or trace themselves.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use ember_device::trace::{self, Subscriber, TraceEvent};
//!
//! #[derive(Debug, Default)]
//! struct Names(Mutex<Vec<String>>);
//! impl Subscriber for Names {
//!     fn on_event(&self, event: &TraceEvent) {
//!         self.0.lock().unwrap().push(event.name.to_string());
//!     }
//! }
//!
//! let names = Arc::new(Names::default());
//! let subscription = trace::subscribe(names.clone());
//! {
//!     let _outer = trace::range("outer");
//!     let _inner = trace::range_with("inner", || "detail".to_string());
//! }
//! drop(subscription);
//! let seen = names.0.lock().unwrap().clone();
//! assert!(seen.windows(2).any(|w| w == ["inner", "outer"]));
//! ```

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::ThreadId;

pub mod clock;
pub mod device;
mod published;

pub use clock::{Calibration, Stamp};
use published::{Cached, Published};

/// What kind of event a [`TraceEvent`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A scoped range with a duration.
    Range,
    /// A point in time (`start == end`).
    Instant,
}

/// Who made a range, as the profiler groups and draws it (the `cat` of a Chrome trace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// A tensor op (`ember-tensor`'s fronts); shown with the `aten::` prefix PyTorch uses.
    Op,
    /// A user's `record_function`, an optimizer step, a DataLoader batch, a profiler step.
    UserAnnotation,
    /// An autograd backward node (`MulBackward0`) or the engine's evaluation around it.
    Backward,
    /// A call into the CUDA driver or a library that enqueues device work
    /// (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cublasGemm`); carries a correlation id.
    Runtime,
    /// Anything else (allocator points, internal ranges).
    Other,
}

/// One completed range or point event.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// Unique per range (0 for a point event); matches [`Subscriber::on_begin`]'s id.
    pub id: u64,
    /// The name given at the call site.
    pub name: Cow<'static, str>,
    /// What made it.
    pub category: Category,
    /// Metadata from the call site's closure; empty if none was given. Ops write
    /// `{"Input Dims":[[2,3],[]],"Input type":["float","Scalar"]}` when shapes are recorded
    /// (see [`shapes_wanted`]); allocator points write a JSON object too.
    pub metadata: String,
    /// Range or point.
    pub kind: EventKind,
    /// The thread the event happened on.
    pub thread: ThreadId,
    /// A small process-unique number for the thread (1 for the first thread that traced).
    pub tid: u64,
    /// When the range began (or the point happened), on the trace clock (Note [Trace
    /// clock]: a [`Calibration`] says when that was).
    pub start: Stamp,
    /// When the range ended (equal to `start` for a point).
    pub end: Stamp,
    /// Traced ranges open around this one on its thread.
    pub depth: u32,
    /// Links a [`Category::Runtime`] range to the device activity it enqueued (0 if none).
    pub correlation: u64,
    /// The call stack where an op or annotation range opened, as return addresses
    /// (innermost first), while stacks are wanted ([`stacks_wanted`]); empty otherwise.
    /// Unresolved: a profiler symbolizes them once per address (Note [Call sites]).
    pub stack: Vec<usize>,
}

/// A range that has just opened (delivered to [`Subscriber::on_begin`]). It lends the
/// range's parts, which the range keeps until it ends: a subscriber copies what it needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BeginEvent<'a> {
    /// The range's id, repeated in its [`TraceEvent`].
    pub id: u64,
    /// The name given at the call site (cloning a borrowed name copies no text).
    pub name: &'a Cow<'static, str>,
    /// What made it.
    pub category: Category,
    /// Metadata from the call site's closure.
    pub metadata: &'a str,
    /// A small process-unique number for the thread.
    pub tid: u64,
    /// When it began, on the trace clock.
    pub start: Stamp,
    /// Traced ranges open around it on its thread.
    pub depth: u32,
    /// As [`TraceEvent::stack`].
    pub stack: &'a [usize],
}

/// Receives trace events. See Note [Zero-cost tracing].
pub trait Subscriber: Send + Sync + fmt::Debug {
    /// Called for each completed range and each point event.
    fn on_event(&self, event: &TraceEvent);

    /// [`Subscriber::on_event`] for the last subscriber to see an event, which may keep its
    /// parts without copying them (a profiler storing every range). The default lends it.
    fn on_event_owned(&self, event: TraceEvent) {
        self.on_event(&event);
    }

    /// Called when a range opens while someone listens (so that a profiler can close ranges
    /// still open when it stops). The default ignores it.
    fn on_begin(&self, _event: &BeginEvent<'_>) {}
}

static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static SHAPES: AtomicBool = AtomicBool::new(false);
static STACKS: AtomicBool = AtomicBool::new(false);
static MEMORY: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);
type Subscribers = Vec<(u64, Arc<dyn Subscriber>)>;

/// The subscriber list, replaced whole on (un)subscribe; threads keep a copy
/// (Note [Per-thread trace state]).
static SUBSCRIBERS: Published<Subscribers> = Published::new();

// Note [Per-thread trace state]:
// A traced range costs what its bookkeeping touches, so everything a range needs besides
// the clock lives in one thread-local, reached once when the range opens and once when it
// ends: its nesting depth, the thread's small id and `ThreadId`, the next range id, and the
// thread's copy of the subscriber list. Range ids are the thread's id in the high bits and a
// per-thread count below (no shared counter), and the list is fetched from the global lock
// only when its generation says it changed (`published.rs`, which the device sink uses too),
// so a range makes no atomic read-modify-write and takes no lock on its own behalf; the
// subscribers are called with the thread's copy lent.
// A subscriber that traces from its callback finds the copy lent and reads it shared; one
// that subscribes there makes the nested call fetch the new list itself. A thread keeps its
// copy (and so the subscribers it names) until it next traces after a change, or exits.

/// Bits of a range id below the thread's id.
const RANGE_BITS: u32 = 40;

struct ThreadState {
    depth: Cell<u32>,
    tid: Cell<u64>,
    thread: Cell<Option<ThreadId>>,
    next_range: Cell<u64>,
    listeners: RefCell<Cached<Subscribers>>,
}

impl ThreadState {
    fn tid(&self) -> u64 {
        let v = self.tid.get();
        if v != 0 {
            return v;
        }
        let v = NEXT_TID.fetch_add(1, Ordering::Relaxed);
        self.tid.set(v);
        v
    }

    fn thread(&self) -> ThreadId {
        if let Some(t) = self.thread.get() {
            return t;
        }
        let t = std::thread::current().id();
        self.thread.set(Some(t));
        t
    }

    fn next_range(&self) -> u64 {
        let n = self.next_range.get().wrapping_add(1) & ((1 << RANGE_BITS) - 1);
        self.next_range.set(n);
        (self.tid() << RANGE_BITS) | n.max(1)
    }

    /// Calls `f` with the current subscribers (none: `f` is not called).
    fn with_subscribers(&self, f: impl FnOnce(&Subscribers)) {
        SUBSCRIBERS.with_current(&self.listeners, |list| {
            if let Some(list) = list {
                f(list);
            }
        });
    }
}

thread_local! {
    static STATE: ThreadState = const {
        ThreadState {
            depth: Cell::new(0),
            tid: Cell::new(0),
            thread: Cell::new(None),
            next_range: Cell::new(0),
            listeners: RefCell::new(Cached::empty()),
        }
    };
}

/// `true` while at least one subscriber listens.
#[inline]
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed) != 0
}

/// Whether ops should describe their inputs' shapes and dtypes in their metadata (the
/// profiler's `record_shapes`). Only meaningful while [`is_active`].
#[inline]
pub fn shapes_wanted() -> bool {
    SHAPES.load(Ordering::Relaxed)
}

/// Turn shape recording on or off for every op (the profiler sets it while it records).
pub fn set_shapes_wanted(on: bool) {
    SHAPES.store(on, Ordering::Relaxed);
}

/// Whether the caching allocators emit `memory.alloc`/`memory.free` point events (the
/// profiler's `profile_memory`). Only meaningful while [`is_active`]: a profiler recording
/// CPU ranges alone does not pay for two formatted events per tensor.
#[inline]
pub fn memory_wanted() -> bool {
    MEMORY.load(Ordering::Relaxed)
}

/// Turn allocation events on or off (the profiler sets it while it records).
pub fn set_memory_wanted(on: bool) {
    MEMORY.store(on, Ordering::Relaxed);
}

/// Whether op and annotation ranges capture their call stack (the profiler's
/// `with_stack`). Only meaningful while [`is_active`].
#[inline]
pub fn stacks_wanted() -> bool {
    STACKS.load(Ordering::Relaxed)
}

/// Turn call-stack capture on or off (the profiler sets it while it records).
pub fn set_stacks_wanted(on: bool) {
    STACKS.store(on, Ordering::Relaxed);
}

// Note [Call sites]:
// `with_stack` asks where in the user's code each op was called. Resolving a backtrace to
// file and line costs tens of microseconds to milliseconds (DWARF lookups), far too much
// per op; walking the stack for its return addresses costs about a microsecond per frame
// kept. So a range captures only the addresses (`backtrace::trace`, at most
// `MAX_FRAMES`), and the profiler resolves each distinct address once, at the end of a
// cycle, keeping the frames from the first one outside Ember's library crates outwards.
// Builds without line tables (`debug = false`) resolve to function names only.

/// Most return addresses kept per range: enough to get from the deepest op front through
/// autograd and a few layers to the user's code.
const MAX_FRAMES: usize = 64;

/// The return addresses of the calling thread's stack, innermost first (Note [Call sites]).
#[cold]
fn capture_stack() -> Vec<usize> {
    let mut ips = Vec::with_capacity(MAX_FRAMES);
    backtrace::trace(|frame| {
        ips.push(frame.ip() as usize);
        ips.len() < MAX_FRAMES
    });
    ips
}

/// This thread's small process-unique number (assigned on first use, from 1; 0 while the
/// thread is exiting and its state is gone).
pub fn thread_tid() -> u64 {
    STATE.try_with(ThreadState::tid).unwrap_or(0)
}

/// Replaces the subscriber list with `edit`'s result (an empty list: none).
fn replace_subscribers(edit: impl FnOnce(&mut Subscribers)) {
    SUBSCRIBERS.replace(|old| {
        let mut subs: Subscribers = old.map(|l| l.as_ref().clone()).unwrap_or_default();
        edit(&mut subs);
        (!subs.is_empty()).then(|| Arc::new(subs))
    });
}

/// Start delivering events to `subscriber` until the returned [`Subscription`] is dropped.
pub fn subscribe(subscriber: Arc<dyn Subscriber>) -> Subscription {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    replace_subscribers(|subs| subs.push((id, subscriber)));
    ACTIVE.fetch_add(1, Ordering::Relaxed);
    Subscription { id }
}

/// A live subscription; unsubscribes on drop.
#[derive(Debug)]
#[must_use = "dropping the subscription unsubscribes at once"]
pub struct Subscription {
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut removed = false;
        replace_subscribers(|subs| {
            let before = subs.len();
            subs.retain(|(id, _)| *id != self.id);
            removed = subs.len() < before;
        });
        if removed {
            ACTIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Hands `event` to every subscriber, the last one by value.
fn deliver(state: &ThreadState, event: TraceEvent) {
    state.with_subscribers(|subs| {
        if let Some(((_, last), rest)) = subs.split_last() {
            for (_, s) in rest {
                s.on_event(&event);
            }
            last.on_event_owned(event);
        }
    });
}

#[derive(Debug)]
struct OpenRange {
    id: u64,
    name: Cow<'static, str>,
    category: Category,
    metadata: String,
    start: Stamp,
    depth: u32,
    correlation: u64,
    stack: Vec<usize>,
}

/// An open range; the event is delivered when it is dropped. Inert (no state, nothing on
/// drop) when nobody was subscribed at its start. See Note [Zero-cost tracing].
#[derive(Debug)]
#[must_use = "a range ends when its guard is dropped; bind it with `let _guard = ...`"]
pub struct RangeGuard {
    open: Option<OpenRange>,
}

impl RangeGuard {
    /// A guard that records nothing.
    pub const fn inert() -> RangeGuard {
        RangeGuard { open: None }
    }

    /// `true` if this range is being traced.
    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        if let Some(open) = self.open.take() {
            let end = Stamp::now();
            // A range ending while its thread exits (its state gone) is not delivered.
            let _ = STATE.try_with(|state| {
                state.depth.set(open.depth);
                let event = TraceEvent {
                    id: open.id,
                    name: open.name,
                    category: open.category,
                    metadata: open.metadata,
                    kind: EventKind::Range,
                    thread: state.thread(),
                    tid: state.tid(),
                    start: open.start,
                    end,
                    depth: open.depth,
                    correlation: open.correlation,
                    stack: open.stack,
                };
                deliver(state, event);
            });
        }
    }
}

/// Open a range named `name`; it ends when the guard drops.
#[inline]
pub fn range(name: &'static str) -> RangeGuard {
    if !is_active() {
        return RangeGuard::inert();
    }
    open_range(Cow::Borrowed(name), Category::Other, String::new(), 0)
}

/// Open a range with metadata; `metadata` runs only if someone listens.
#[inline]
pub fn range_with(name: &'static str, metadata: impl FnOnce() -> String) -> RangeGuard {
    if !is_active() {
        return RangeGuard::inert();
    }
    open_range(Cow::Borrowed(name), Category::Other, metadata(), 0)
}

/// Open a tensor op's range (`name` without the `aten::` prefix); `inputs` describes the
/// inputs (see [`TraceEvent::metadata`]) and runs only if someone listens and wants shapes.
#[inline]
pub fn op_range(name: &'static str, inputs: impl FnOnce() -> String) -> RangeGuard {
    range_with_inputs(Category::Op, || Cow::Borrowed(name), inputs)
}

/// Open a range of `category` whose name is made only if someone listens.
#[inline]
pub fn range_named(category: Category, name: impl FnOnce() -> Cow<'static, str>) -> RangeGuard {
    if !is_active() {
        return RangeGuard::inert();
    }
    open_range(name(), category, String::new(), 0)
}

/// Open a range of `category` whose name is made only if someone listens, and whose inputs
/// are described (as [`op_range`]'s) only if shapes are wanted too.
#[inline]
pub fn range_with_inputs(
    category: Category,
    name: impl FnOnce() -> Cow<'static, str>,
    inputs: impl FnOnce() -> String,
) -> RangeGuard {
    if !is_active() {
        return RangeGuard::inert();
    }
    let metadata = if shapes_wanted() {
        inputs()
    } else {
        String::new()
    };
    open_range(name(), category, metadata, 0)
}

/// Open a [`Category::Runtime`] range that enqueued the device activity `correlation`.
pub(crate) fn runtime_range(name: &'static str, correlation: u64) -> RangeGuard {
    if !is_active() {
        return RangeGuard::inert();
    }
    open_range(
        Cow::Borrowed(name),
        Category::Runtime,
        String::new(),
        correlation,
    )
}

#[cold]
fn open_range(
    name: Cow<'static, str>,
    category: Category,
    metadata: String,
    correlation: u64,
) -> RangeGuard {
    let stack = if stacks_wanted() && matches!(category, Category::Op | Category::UserAnnotation) {
        capture_stack()
    } else {
        Vec::new()
    };
    STATE
        .try_with(|state| {
            let depth = state.depth.get();
            state.depth.set(depth + 1);
            let id = state.next_range();
            let start = Stamp::now();
            let tid = state.tid();
            state.with_subscribers(|subs| {
                let begin = BeginEvent {
                    id,
                    name: &name,
                    category,
                    metadata: &metadata,
                    tid,
                    start,
                    depth,
                    stack: &stack,
                };
                for (_, s) in subs {
                    s.on_begin(&begin);
                }
            });
            RangeGuard {
                open: Some(OpenRange {
                    id,
                    name,
                    category,
                    metadata,
                    start,
                    depth,
                    correlation,
                    stack,
                }),
            }
        })
        // The thread is exiting: nothing is traced.
        .unwrap_or(RangeGuard::inert())
}

/// Emit a point event; `metadata` runs only if someone listens.
#[inline]
pub fn instant(name: &'static str, metadata: impl FnOnce() -> String) {
    if is_active() {
        emit_instant(name, metadata());
    }
}

#[cold]
fn emit_instant(name: &'static str, metadata: String) {
    let now = Stamp::now();
    let _ = STATE.try_with(|state| {
        let event = TraceEvent {
            id: 0,
            name: Cow::Borrowed(name),
            category: Category::Other,
            metadata,
            kind: EventKind::Instant,
            thread: state.thread(),
            tid: state.tid(),
            start: now,
            end: now,
            depth: state.depth.get(),
            correlation: 0,
            stack: Vec::new(),
        };
        deliver(state, event);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records only events from the thread that created it, so that parallel tests tracing
    /// on other threads do not disturb the assertions.
    #[derive(Debug)]
    struct Recorder {
        thread: ThreadId,
        events: Mutex<Vec<TraceEvent>>,
    }

    impl Recorder {
        fn new() -> Arc<Recorder> {
            Arc::new(Recorder {
                thread: std::thread::current().id(),
                events: Mutex::new(Vec::new()),
            })
        }
        fn take(&self) -> Vec<TraceEvent> {
            std::mem::take(&mut self.events.lock().unwrap())
        }
    }

    impl Subscriber for Recorder {
        fn on_event(&self, event: &TraceEvent) {
            if event.thread == self.thread {
                self.events.lock().unwrap().push(event.clone());
            }
        }
    }

    #[test]
    fn nested_ranges_arrive_in_order_and_stop_after_unsubscribe() {
        let rec = Recorder::new();
        let sub = subscribe(rec.clone());
        {
            let _outer = range("outer");
            {
                let _a = range_with("a", || "m=1".into());
                instant("point", || "p".into());
            }
            let _b = range("b");
        }
        let events = rec.take();
        let summary: Vec<_> = events
            .iter()
            .map(|e| (e.name.as_ref(), e.kind, e.depth, e.metadata.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("point", EventKind::Instant, 2, "p"),
                ("a", EventKind::Range, 1, "m=1"),
                ("b", EventKind::Range, 1, ""),
                ("outer", EventKind::Range, 0, ""),
            ]
        );
        let outer = &events[3];
        assert!(
            events
                .iter()
                .all(|e| e.start >= outer.start && e.end <= outer.end)
        );
        assert!(events[1].end <= events[2].start);

        drop(sub);
        let mut ran = false;
        {
            let _r = range_with("after", || {
                ran = true;
                String::new()
            });
        }
        instant("after", String::new);
        assert!(rec.take().is_empty());
        // Other tests may hold subscriptions; only when none does must the closure be skipped.
        if !is_active() {
            assert!(!ran);
        }
    }

    /// Traces from its own callbacks, and subscribes a second recorder from its first one
    /// (Note [Per-thread trace state]: the lent list is read shared, a changed one fetched).
    #[derive(Debug)]
    struct Reentrant {
        inner: Arc<Recorder>,
        nested: Mutex<Option<Subscription>>,
    }

    impl Subscriber for Reentrant {
        fn on_event(&self, event: &TraceEvent) {
            if event.thread != self.inner.thread || event.name != "outer" {
                return;
            }
            let _inside = range("from_callback");
            let mut nested = self.nested.lock().unwrap();
            if nested.is_none() {
                *nested = Some(subscribe(self.inner.clone()));
            }
        }

        fn on_begin(&self, event: &BeginEvent<'_>) {
            if event.name == "outer" {
                instant("begin_callback", String::new);
            }
        }
    }

    #[test]
    fn subscribers_may_trace_and_subscribe_from_their_callbacks() {
        let rec = Recorder::new();
        let reentrant = Arc::new(Reentrant {
            inner: rec.clone(),
            nested: Mutex::new(None),
        });
        let sub = subscribe(reentrant.clone());
        {
            let _outer = range("outer");
        }
        // The recorder subscribed inside the first `outer`'s delivery sees the second.
        {
            let _outer = range("outer");
        }
        let names: Vec<_> = rec.take().into_iter().map(|e| e.name.to_string()).collect();
        assert!(names.contains(&"from_callback".to_string()), "{names:?}");
        assert!(names.contains(&"outer".to_string()), "{names:?}");
        assert!(names.contains(&"begin_callback".to_string()), "{names:?}");
        drop(sub);
        drop(reentrant.nested.lock().unwrap().take());
        {
            let _after = range("after");
        }
        assert!(rec.take().is_empty());
    }

    #[test]
    fn range_ids_are_unique_across_threads() {
        #[derive(Debug, Default)]
        struct Ids(Mutex<Vec<u64>>);
        impl Subscriber for Ids {
            fn on_event(&self, event: &TraceEvent) {
                if event.name == "id_probe" {
                    self.0.lock().unwrap().push(event.id);
                }
            }
        }
        let ids = Arc::new(Ids::default());
        let sub = subscribe(ids.clone());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..500 {
                        let _r = range("id_probe");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(sub);
        let mut all = ids.0.lock().unwrap().clone();
        assert_eq!(all.len(), 2000);
        assert!(all.iter().all(|&id| id != 0));
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 2000);
    }

    #[test]
    fn inert_guard_when_nobody_listens() {
        // Valid whatever other tests do: an inert guard records nothing.
        let g = RangeGuard { open: None };
        assert!(!g.is_recording());
        drop(g);
    }
}
