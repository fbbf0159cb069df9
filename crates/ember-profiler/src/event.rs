//! The events of a finished trace ([`Profile`]) and how the raw hooks' records become them.

use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime};

use ember_device::driver::DeviceProperties;
use ember_device::trace::device::{ActivityKind, EnqueuedWork};
use ember_device::trace::{Calibration, Category, Stamp};
use serde_json::{Map, Value};

use crate::ProfilerActivity;
use crate::stack::Symbolizer;

/// What an [`Event`] is (its Chrome trace category in brackets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// A tensor op (`cpu_op`), named `aten::...`.
    CpuOp,
    /// An autograd node or the engine's evaluation of it (`cpu_op`, as PyTorch files them).
    Backward,
    /// `record_function`, an optimizer step, a DataLoader batch, `ProfilerStep#N`
    /// (`user_annotation`).
    UserAnnotation,
    /// A driver call that enqueued device work (`cuda_runtime`).
    Runtime,
    /// A kernel on a device stream (`kernel`).
    Kernel,
    /// A copy on a device stream (`gpu_memcpy`).
    Memcpy,
    /// A memset on a device stream (`gpu_memset`).
    Memset,
    /// An allocation or a free (`cpu_instant_event`, named `[memory]`).
    Memory,
    /// Any other range of the trace hooks (`cpu_op`).
    Other,
}

impl EventType {
    /// The `cat` of the Chrome trace, as PyTorch writes it.
    pub fn chrome_category(self) -> &'static str {
        match self {
            EventType::CpuOp | EventType::Backward | EventType::Other => "cpu_op",
            EventType::UserAnnotation => "user_annotation",
            EventType::Runtime => "cuda_runtime",
            EventType::Kernel => "kernel",
            EventType::Memcpy => "gpu_memcpy",
            EventType::Memset => "gpu_memset",
            EventType::Memory => "cpu_instant_event",
        }
    }

    /// `true` for work on a device stream.
    pub fn is_device(self) -> bool {
        matches!(
            self,
            EventType::Kernel | EventType::Memcpy | EventType::Memset
        )
    }

    fn of_category(c: Category) -> EventType {
        match c {
            Category::Op => EventType::CpuOp,
            Category::UserAnnotation => EventType::UserAnnotation,
            Category::Backward => EventType::Backward,
            Category::Runtime => EventType::Runtime,
            Category::Other => EventType::Other,
        }
    }

    fn of_activity(k: ActivityKind) -> EventType {
        match k {
            ActivityKind::Kernel => EventType::Kernel,
            ActivityKind::Memset => EventType::Memset,
            _ => EventType::Memcpy,
        }
    }
}

/// Where an event is drawn: a host thread, or a stream of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    /// A host thread (the trace hooks' small thread number).
    Thread(u64),
    /// A stream of a CUDA device.
    Stream {
        /// The device's ordinal.
        device: usize,
        /// The stream's handle (0: the default stream).
        stream: u64,
    },
}

/// An allocation (`bytes > 0`) or a free (`bytes < 0`) of a caching allocator.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryRecord {
    /// `None` for host memory, the CUDA ordinal otherwise.
    pub cuda: Option<usize>,
    /// The address.
    pub addr: u64,
    /// Bytes allocated (positive) or freed (negative).
    pub bytes: i64,
    /// The allocator's allocated bytes after the event.
    pub total_allocated: i64,
    /// The allocator's reserved bytes after the event.
    pub total_reserved: i64,
}

/// One event of a finished trace. Times are nanoseconds since the trace began.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// As shown in tables and traces (`aten::mm`, `MmBackward0`, `cudaLaunchKernel`, the
    /// kernel's name, `[memory]`).
    pub name: String,
    /// What it is.
    pub kind: EventType,
    /// Where it is drawn.
    pub track: Track,
    /// Start, ns since the trace began.
    pub start_ns: u64,
    /// Duration in ns (0 for memory events).
    pub dur_ns: u64,
    /// Recorded ranges around it on its thread.
    pub depth: u32,
    /// The enclosing range on the same thread; for device work, the runtime call that
    /// enqueued it (whose parent is the op).
    pub parent: Option<usize>,
    /// Links a runtime call to its device work (0: none).
    pub correlation: u64,
    /// The inputs' dims as PyTorch prints them (`[[5, 8], [8, 16], []]`), if recorded.
    pub input_shapes: Option<String>,
    /// Extra arguments for the trace (the inputs' dims and types, a kernel's grid).
    pub args: Map<String, Value>,
    /// For [`EventType::Memory`].
    pub memory: Option<MemoryRecord>,
    /// The range was still open when the trace ended, and was closed there.
    pub truncated: bool,
    /// With `with_stack`, an op's or annotation's call site and its callers, innermost
    /// first (`file:line: function`), from the first frame outside Ember's library crates
    /// (the Chrome trace's `Call stack`); empty otherwise.
    pub stack: Vec<String>,
}

impl Event {
    /// End, ns since the trace began.
    pub fn end_ns(&self) -> u64 {
        self.start_ns + self.dur_ns
    }
}

/// A finished trace: its events, ordered by start, and what was recorded.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Events ordered by start time (parents before children).
    pub events: Vec<Event>,
    /// When the trace began (wall clock).
    pub started_at: SystemTime,
    /// How long it lasted.
    pub duration: Duration,
    /// The activities asked for.
    pub activities: Vec<ProfilerActivity>,
    /// Whether input shapes were recorded.
    pub record_shapes: bool,
    /// Whether allocations were recorded.
    pub profile_memory: bool,
    /// Whether call sites were recorded.
    pub with_stack: bool,
    /// The CUDA devices that ran recorded work.
    pub devices: Vec<(usize, DeviceProperties)>,
    /// The device times came from the CUDA emulator (durations are the emulator's).
    pub emulated: bool,
    /// Device calls that could not be timed (an event could not be created or read, or the
    /// activity API left no record of them).
    pub untimed: u64,
    /// How the device work was timed: [`DeviceTiming::Cupti`](crate::DeviceTiming::Cupti)
    /// or [`DeviceTiming::Events`](crate::DeviceTiming::Events); `None` when no device work
    /// was recorded.
    pub device_timing: Option<crate::DeviceTiming>,
}

/// What the hooks delivered, before resolution.
#[derive(Clone, Debug)]
pub(crate) struct RawRange {
    pub name: Cow<'static, str>,
    pub category: Category,
    pub metadata: String,
    pub tid: u64,
    /// On the trace clock (Note [Trace clock] in `ember-device`).
    pub start: Stamp,
    pub end: Stamp,
    pub depth: u32,
    pub correlation: u64,
    pub truncated: bool,
    /// Return addresses, innermost first (empty unless `with_stack`).
    pub stack: Vec<usize>,
}

/// A memory point event before resolution.
#[derive(Clone, Debug)]
pub(crate) struct RawMemory {
    pub tid: u64,
    pub at: Stamp,
    pub depth: u32,
    pub record: MemoryRecord,
}

/// Device work with its times resolved on the host clock.
#[derive(Clone, Debug)]
pub(crate) struct RawDevice {
    pub kind: ActivityKind,
    pub name: String,
    pub device: usize,
    pub stream: u64,
    pub correlation: u64,
    pub start: Instant,
    pub end: Instant,
    pub bytes: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

impl RawDevice {
    /// `work` as its call site described it, run on the device from `start` to `end`.
    pub(crate) fn of(work: &EnqueuedWork, start: Instant, end: Instant) -> RawDevice {
        let l = &work.launch;
        RawDevice {
            kind: l.kind,
            name: l.name.to_string(),
            device: work.device,
            stream: work.stream.0,
            correlation: work.correlation,
            start,
            end,
            bytes: l.bytes,
            grid: l.grid,
            block: l.block,
        }
    }
}

fn since(t0: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(t0).as_nanos()).unwrap_or(u64::MAX)
}

/// `[[5, 8], [16]]` from `{"Input Dims": [[5,8],[16]]}`.
fn shapes_of(args: &Map<String, Value>) -> Option<String> {
    let dims = args.get("Input Dims")?.as_array()?;
    let parts: Vec<String> = dims
        .iter()
        .map(|d| {
            let inner: Vec<String> = d
                .as_array()
                .map(|a| a.iter().map(|v| v.to_string()).collect())
                .unwrap_or_default();
            format!("[{}]", inner.join(", "))
        })
        .collect();
    Some(format!("[{}]", parts.join(", ")))
}

/// Parse an allocator point's metadata (see `ember-memory`'s `tracing` module).
pub(crate) fn parse_memory(name: &str, metadata: &str) -> Option<MemoryRecord> {
    let v: Value = serde_json::from_str(metadata).ok()?;
    let device = v.get("device")?.as_str()?;
    let cuda = match device {
        "cpu" => None,
        d => Some(d.strip_prefix("cuda:")?.parse().ok()?),
    };
    let bytes = i64::try_from(v.get("bytes")?.as_u64()?).ok()?;
    Some(MemoryRecord {
        cuda,
        addr: v.get("addr")?.as_u64()?,
        bytes: if name == "memory.free" { -bytes } else { bytes },
        total_allocated: v.get("total_allocated")?.as_i64()?,
        total_reserved: v.get("total_reserved")?.as_i64()?,
    })
}

/// Turn the raw records into ordered events with parents (see [`Event::parent`]).
pub(crate) fn resolve(
    t0: Instant,
    cal: &Calibration,
    ranges: Vec<RawRange>,
    memory: Vec<RawMemory>,
    device: Vec<RawDevice>,
    emulated: bool,
) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::with_capacity(ranges.len() + memory.len() + device.len());
    let mut symbols = Symbolizer::new();
    for r in ranges {
        let kind = EventType::of_category(r.category);
        let mut args = if r.metadata.starts_with('{') {
            serde_json::from_str::<Map<String, Value>>(&r.metadata).unwrap_or_default()
        } else {
            Map::new()
        };
        let input_shapes = shapes_of(&args);
        if r.truncated {
            args.insert(
                "truncated".into(),
                Value::String("the profile ended while this range was open; closed there".into()),
            );
        }
        if r.correlation != 0 {
            args.insert("correlation".into(), r.correlation.into());
        }
        let name = match kind {
            EventType::CpuOp => format!("aten::{}", r.name),
            _ => r.name.into_owned(),
        };
        let stack = if r.stack.is_empty() {
            Vec::new()
        } else {
            symbols.user_frames(&r.stack)
        };
        if !stack.is_empty() {
            args.insert("Call stack".into(), Value::String(stack.join(";")));
        }
        events.push(Event {
            name,
            kind,
            track: Track::Thread(r.tid),
            // Both ends through the one monotone map, so nested ranges stay nested.
            start_ns: since(t0, cal.instant(r.start)),
            dur_ns: since(cal.instant(r.start), cal.instant(r.end)),
            depth: r.depth,
            parent: None,
            correlation: r.correlation,
            input_shapes,
            args,
            memory: None,
            truncated: r.truncated,
            stack,
        });
    }
    for m in memory {
        events.push(Event {
            name: "[memory]".into(),
            kind: EventType::Memory,
            track: Track::Thread(m.tid),
            start_ns: since(t0, cal.instant(m.at)),
            dur_ns: 0,
            depth: m.depth,
            parent: None,
            correlation: 0,
            input_shapes: None,
            args: Map::new(),
            memory: Some(m.record),
            truncated: false,
            stack: Vec::new(),
        });
    }
    for d in device {
        let mut args = Map::new();
        args.insert("device".into(), d.device.into());
        args.insert("stream".into(), d.stream.into());
        args.insert("correlation".into(), d.correlation.into());
        if d.kind == ActivityKind::Kernel && d.grid != [0; 3] {
            args.insert("grid".into(), d.grid.to_vec().into());
            args.insert("block".into(), d.block.to_vec().into());
        }
        if d.bytes > 0 {
            args.insert("bytes".into(), d.bytes.into());
        }
        if emulated {
            args.insert(
                "emulated".into(),
                Value::String("the CUDA emulator ran this; its duration is the emulator's".into()),
            );
        }
        events.push(Event {
            name: d.name,
            kind: EventType::of_activity(d.kind),
            track: Track::Stream {
                device: d.device,
                stream: d.stream,
            },
            start_ns: since(t0, d.start),
            dur_ns: since(d.start, d.end),
            depth: 0,
            parent: None,
            correlation: d.correlation,
            input_shapes: None,
            args,
            memory: None,
            truncated: false,
            stack: Vec::new(),
        });
    }
    // Parents before children: by start, then outer (lower depth) first; memory points
    // after the ranges that start at the same instant.
    events.sort_by_key(|e| (e.start_ns, e.kind == EventType::Memory, e.depth));
    link_parents(&mut events);
    events
}

/// Each host event's parent is the latest-started range one level out on its thread that
/// contains it; device work's parent is the op around the runtime call that enqueued it.
fn link_parents(events: &mut [Event]) {
    use std::collections::HashMap;
    let mut open: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut runtime_of: HashMap<u64, usize> = HashMap::new();
    for i in 0..events.len() {
        let Track::Thread(tid) = events[i].track else {
            continue;
        };
        let stack = open.entry(tid).or_default();
        let depth = events[i].depth as usize;
        let parent = depth
            .checked_sub(1)
            .and_then(|d| stack.get(d).copied())
            .filter(|&p| p != usize::MAX)
            .filter(|&p| {
                let (pe, e) = (&events[p], &events[i]);
                pe.start_ns <= e.start_ns && pe.end_ns() >= e.end_ns()
            });
        events[i].parent = parent;
        if events[i].kind != EventType::Memory {
            stack.truncate(depth);
            stack.resize(depth, usize::MAX);
            stack.push(i);
        }
        if events[i].kind == EventType::Runtime && events[i].correlation != 0 {
            runtime_of.insert(events[i].correlation, i);
        }
    }
    for e in events.iter_mut() {
        if e.kind.is_device() {
            e.parent = runtime_of.get(&e.correlation).copied();
        }
    }
}
