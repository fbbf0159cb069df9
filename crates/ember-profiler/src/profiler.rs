//! [`profile`] and [`Profiler`]: recording with the trace hooks, cycles of a [`Schedule`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use ember_device::cuda;
use ember_device::trace::device::{self as device_trace, DeviceSink};
use ember_device::trace::{
    self, Calibration, Category, RangeGuard, Stamp, Subscriber, Subscription,
};

use crate::collector::Collector;
use crate::device_records::{self, Tagged};
use crate::error::{ProfilerError, Result};
use crate::event::{self, Profile, RawRange};
use crate::schedule::{ProfilerAction, Schedule};

/// What to record, as `torch.profiler.ProfilerActivity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfilerActivity {
    /// Host ranges: ops, autograd nodes, `record_function`, driver calls.
    Cpu,
    /// Device work: kernels and copies, timed on the device.
    Cuda,
}

/// How device work is timed (Note [Device activity] in `ember-device`): asked for in
/// [`ProfileOptions::device_timing`], and what a cycle used in
/// [`Profile::device_timing`](crate::Profile::device_timing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceTiming {
    /// CUPTI's activity API where the driver has it (as PyTorch's profiler), CUDA events
    /// otherwise. Only asked for, never reported.
    #[default]
    Auto,
    /// The driver's activity records (CUPTI on a GPU, its emulation on the emulator).
    Cupti,
    /// Two CUDA events around each launch.
    Events,
}

impl DeviceTiming {
    /// `"auto"`, `"cupti"` or `"cuda events"`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceTiming::Auto => "auto",
            DeviceTiming::Cupti => "cupti",
            DeviceTiming::Events => "cuda events",
        }
    }
}

/// Called with each finished cycle's trace (`on_trace_ready`).
pub type TraceHandler = Box<dyn FnMut(&Profile) -> Result<()> + Send>;

/// The arguments of `torch.profiler.profile(...)`.
pub struct ProfileOptions {
    /// What to record; [`ProfileOptions::default`] gives both, as PyTorch's default where
    /// CUDA is available (`Cuda` records nothing where no CUDA device runs work).
    pub activities: Vec<ProfilerActivity>,
    /// Record each op's input dims and dtypes.
    pub record_shapes: bool,
    /// Record each allocation and free of the caching allocators, and the host ranges they
    /// happen in (even without [`ProfilerActivity::Cpu`]: an allocation is attributed to
    /// its op, so `profile(activities=[CUDA], profile_memory=True)` still ranks ops by the
    /// memory they take).
    pub profile_memory: bool,
    /// Record the call site of each op and annotation in the user's code, and its callers
    /// ([`Event::stack`](crate::Event::stack); file and line where the binary has line
    /// tables, function names where it has only symbols, nothing where it is stripped:
    /// [`call_sites_resolvable`](crate::call_sites_resolvable)).
    pub with_stack: bool,
    /// Which steps to record; `None` records from start to stop.
    pub schedule: Option<Schedule>,
    /// Called with the trace of each finished cycle (and, without a schedule, at stop).
    pub on_trace_ready: Option<TraceHandler>,
    /// How device work is timed: [`DeviceTiming::Auto`] (the default) or
    /// [`DeviceTiming::Events`] (events even where CUPTI is available); `Cupti` is taken as
    /// `Auto`.
    pub device_timing: DeviceTiming,
}

impl fmt::Debug for ProfileOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProfileOptions")
            .field("activities", &self.activities)
            .field("record_shapes", &self.record_shapes)
            .field("profile_memory", &self.profile_memory)
            .field("with_stack", &self.with_stack)
            .field("schedule", &self.schedule)
            .field(
                "on_trace_ready",
                &self.on_trace_ready.as_ref().map(|_| "<handler>"),
            )
            .field("device_timing", &self.device_timing)
            .finish()
    }
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            activities: vec![ProfilerActivity::Cpu, ProfilerActivity::Cuda],
            record_shapes: false,
            profile_memory: false,
            with_stack: false,
            schedule: None,
            on_trace_ready: None,
            device_timing: DeviceTiming::Auto,
        }
    }
}

impl ProfileOptions {
    /// The defaults (see [`ProfileOptions::activities`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the activities.
    pub fn activities(mut self, a: impl IntoIterator<Item = ProfilerActivity>) -> Self {
        self.activities = a.into_iter().collect();
        self
    }

    /// Set `record_shapes`.
    pub fn record_shapes(mut self, on: bool) -> Self {
        self.record_shapes = on;
        self
    }

    /// Set `profile_memory`.
    pub fn profile_memory(mut self, on: bool) -> Self {
        self.profile_memory = on;
        self
    }

    /// Set `with_stack`.
    pub fn with_stack(mut self, on: bool) -> Self {
        self.with_stack = on;
        self
    }

    /// Set the schedule.
    pub fn schedule(mut self, s: Schedule) -> Self {
        self.schedule = Some(s);
        self
    }

    /// Set how device work is timed.
    pub fn device_timing(mut self, t: DeviceTiming) -> Self {
        self.device_timing = t;
        self
    }

    /// Set `on_trace_ready`.
    pub fn on_trace_ready(
        mut self,
        handler: impl FnMut(&Profile) -> Result<()> + Send + 'static,
    ) -> Self {
        self.on_trace_ready = Some(Box::new(handler));
        self
    }
}

/// `torch.profiler.record_function(name)`: a user range, shown as `user_annotation`; it ends
/// when the guard drops. Free (one atomic load) while no profiler records.
///
/// ```
/// let _forward = ember_profiler::record_function("forward");
/// ```
pub fn record_function(name: impl Into<Cow<'static, str>>) -> RangeGuard {
    trace::range_named(Category::UserAnnotation, || name.into())
}

static PROFILING: AtomicBool = AtomicBool::new(false);

/// Start profiling, as `with torch.profiler.profile(...) as prof:`; recording ends at
/// [`Profiler::stop`] or when the profiler drops. One profiler at a time per process: a
/// second is [`ProfilerError::AlreadyActive`].
///
/// ```
/// use ember_profiler::{ProfileOptions, ProfilerActivity, profile, record_function};
/// let mut prof = profile(ProfileOptions::new().activities([ProfilerActivity::Cpu]))?;
/// {
///     let _r = record_function("work");
/// }
/// prof.stop()?;
/// let table = prof.key_averages()?.table("cpu_time_total", 10)?;
/// assert!(table.contains("work"));
/// # Ok::<(), ember_profiler::ProfilerError>(())
/// ```
pub fn profile(options: ProfileOptions) -> Result<Profiler> {
    if let Some(s) = &options.schedule {
        s.check()?;
    }
    if PROFILING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(ProfilerError::AlreadyActive);
    }
    let mut p = Profiler {
        cpu: options.activities.contains(&ProfilerActivity::Cpu),
        cuda: options.activities.contains(&ProfilerActivity::Cuda),
        options,
        step_num: 0,
        action: ProfilerAction::None,
        recording: None,
        step_range: None,
        last: None,
        stopped: false,
    };
    let first = p.action_for(0);
    p.transit(ProfilerAction::None, first)?;
    p.action = first;
    p.open_step_range();
    Ok(p)
}

/// `with profile(...) as prof: f(prof)`: runs `f` with a profiler, stops it, and returns
/// `f`'s result with the stopped profiler (for its tables and traces).
pub fn with_profile<T>(
    options: ProfileOptions,
    f: impl FnOnce(&mut Profiler) -> T,
) -> Result<(T, Profiler)> {
    let mut p = profile(options)?;
    let out = f(&mut p);
    p.stop()?;
    Ok((out, p))
}

/// A running (then stopped) profiler. See [`profile`].
pub struct Profiler {
    options: ProfileOptions,
    cpu: bool,
    cuda: bool,
    step_num: u64,
    action: ProfilerAction,
    recording: Option<Recording>,
    step_range: Option<RangeGuard>,
    last: Option<Profile>,
    stopped: bool,
}

impl fmt::Debug for Profiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profiler")
            .field("options", &self.options)
            .field("step_num", &self.step_num)
            .field("action", &self.action)
            .field("stopped", &self.stopped)
            .finish()
    }
}

impl Profiler {
    /// `prof.step()`: the end of one step of the loop; moves the schedule on.
    pub fn step(&mut self) -> Result<()> {
        if self.stopped {
            return Err(ProfilerError::Stopped { op: "step" });
        }
        self.step_range = None;
        let prev = self.action;
        self.step_num += 1;
        let next = self.action_for(self.step_num);
        self.transit(prev, next)?;
        self.action = next;
        self.open_step_range();
        Ok(())
    }

    /// The step number (steps taken so far).
    pub fn step_num(&self) -> u64 {
        self.step_num
    }

    /// The action of the current step.
    pub fn current_action(&self) -> ProfilerAction {
        self.action
    }

    /// Stop recording: the current cycle's trace is kept (and handed to `on_trace_ready`).
    /// Stopping twice is harmless.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        self.step_range = None;
        let result = match self.action {
            ProfilerAction::Record | ProfilerAction::RecordAndSave => self.finish_cycle(),
            ProfilerAction::Warmup | ProfilerAction::None => {
                self.recording = None;
                Ok(())
            }
        };
        PROFILING.store(false, Ordering::Release);
        result
    }

    /// The last finished trace (after [`Profiler::stop`], or the last cycle a schedule
    /// finished).
    pub fn profile(&self) -> Result<&Profile> {
        match &self.last {
            Some(p) => Ok(p),
            None if !self.stopped => Err(ProfilerError::StillRunning { op: "profile" }),
            None => Err(ProfilerError::Stopped { op: "profile" }),
        }
    }

    /// `prof.key_averages()`: events grouped by name, over the last finished trace.
    pub fn key_averages(&self) -> Result<crate::table::KeyAverages> {
        Ok(self.last_or_running("key_averages")?.key_averages(false))
    }

    /// `prof.key_averages(group_by_input_shape=True)`.
    pub fn key_averages_by_input_shape(&self) -> Result<crate::table::KeyAverages> {
        Ok(self.last_or_running("key_averages")?.key_averages(true))
    }

    /// `prof.key_averages(group_by_stack_n=n)`: events grouped by name and the first `n`
    /// frames of their call stack (recorded with `with_stack`); the table gains PyTorch's
    /// "Source Location" column.
    pub fn key_averages_by_stack(&self, n: usize) -> Result<crate::table::KeyAverages> {
        Ok(self
            .last_or_running("key_averages")?
            .key_averages_grouped(false, n))
    }

    /// `prof.export_chrome_trace(path)`: the last finished trace as a Chrome trace file.
    pub fn export_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.last_or_running("export_chrome_trace")?
            .export_chrome_trace(path)
    }

    /// `export_memory_timeline(path)`: the last finished trace's memory as one HTML page.
    pub fn export_memory_timeline(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.last_or_running("export_memory_timeline")?
            .export_memory_timeline(path)
    }

    fn last_or_running(&self, op: &'static str) -> Result<&Profile> {
        match &self.last {
            Some(p) => Ok(p),
            None if !self.stopped => Err(ProfilerError::StillRunning { op }),
            None => Ok(empty_profile()),
        }
    }

    fn action_for(&self, step: u64) -> ProfilerAction {
        match &self.options.schedule {
            Some(s) => s.action(step),
            None => ProfilerAction::Record,
        }
    }

    fn open_step_range(&mut self) {
        if self.options.schedule.is_some() && self.action != ProfilerAction::None {
            let n = self.step_num;
            self.step_range = Some(trace::range_named(Category::UserAnnotation, || {
                Cow::Owned(format!("ProfilerStep#{n}"))
            }));
        }
    }

    /// PyTorch's `_transit_action` table.
    fn transit(&mut self, prev: ProfilerAction, next: ProfilerAction) -> Result<()> {
        use ProfilerAction::{None as N, Record as R, RecordAndSave as S, Warmup as W};
        match (prev, next) {
            (N, N) | (W, W) | (R, R) | (R, S) => Ok(()),
            (N, W) | (N, R) | (N, S) => {
                self.start_recording();
                Ok(())
            }
            (W, N) => {
                self.recording = None;
                Ok(())
            }
            (W, R) | (W, S) => {
                // The warm-up ran the hooks; what they recorded is dropped.
                self.start_recording();
                Ok(())
            }
            (R, N) | (S, N) => self.finish_cycle(),
            (R, W) | (S, W) | (S, R) | (S, S) => {
                let r = self.finish_cycle();
                self.start_recording();
                r
            }
        }
    }

    fn start_recording(&mut self) {
        self.recording = None;
        self.recording = Some(Recording::start(&self.options, self.cpu, self.cuda));
    }

    fn finish_cycle(&mut self) -> Result<()> {
        let Some(rec) = self.recording.take() else {
            return Ok(());
        };
        let profile = rec.finish(&self.options);
        let handled = match &mut self.options.on_trace_ready {
            Some(h) => h(&profile).map_err(|e| ProfilerError::Handler(Box::new(e))),
            None => Ok(()),
        };
        self.last = Some(profile);
        handled
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        // Errors of a handler at drop have nowhere to go; `stop()` reports them.
        let _ = self.stop();
    }
}

/// The trace of a profiler that recorded no step (its tables are empty).
fn empty_profile() -> &'static Profile {
    static EMPTY: std::sync::OnceLock<Profile> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Profile {
        events: Vec::new(),
        started_at: SystemTime::UNIX_EPOCH,
        duration: Duration::ZERO,
        activities: Vec::new(),
        record_shapes: false,
        profile_memory: false,
        with_stack: false,
        devices: Vec::new(),
        emulated: false,
        untimed: 0,
        device_timing: None,
    })
}

/// What the hooks record besides ranges: input shapes, call stacks, allocation events.
fn set_wanted(shapes: bool, stacks: bool, memory: bool) {
    trace::set_shapes_wanted(shapes);
    trace::set_stacks_wanted(stacks);
    trace::set_memory_wanted(memory);
}

/// One cycle being recorded.
#[derive(Debug)]
struct Recording {
    collector: Arc<Collector>,
    subscription: Option<Subscription>,
    cuda: bool,
    t0: Instant,
    started_at: SystemTime,
    untimed_before: u64,
    /// Set by [`Recording::finish`], which stops what the cycle started.
    finished: bool,
}

impl Recording {
    fn start(options: &ProfileOptions, cpu: bool, cuda: bool) -> Recording {
        let collector = Arc::new(Collector::new(
            cpu || options.profile_memory,
            options.profile_memory,
            options.device_timing != DeviceTiming::Events,
        ));
        if cuda {
            // Installing the sink touches no CUDA state: the process's driver is chosen by
            // the user's first CUDA call, during the profile or before it.
            let sink: Arc<dyn DeviceSink> = collector.clone();
            device_trace::set_sink(Some(sink));
        }
        set_wanted(
            options.record_shapes,
            options.with_stack,
            options.profile_memory,
        );
        let subscription = (cpu || options.profile_memory).then(|| {
            let sub: Arc<dyn Subscriber> = collector.clone();
            trace::subscribe(sub)
        });
        Recording {
            collector,
            subscription,
            cuda,
            t0: Instant::now(),
            started_at: SystemTime::now(),
            untimed_before: device_trace::untimed_count(),
            finished: false,
        }
    }

    fn finish(mut self, options: &ProfileOptions) -> Profile {
        // The end on the trace clock, and as the calibration maps it: ranges closed here end
        // exactly at the profile's end.
        let end_stamp = Stamp::now();
        let cal = Calibration::now();
        let end = cal.instant(end_stamp);
        self.finished = true;
        self.subscription = None;
        set_wanted(false, false, false);
        if self.cuda {
            device_trace::set_sink(None);
        }
        // Device work was enqueued only if the process has a driver already.
        let process_driver = cuda::initialized_driver();
        let mut device = {
            let mut state = self.collector.lock();
            let taken = std::mem::take(&mut state.device);
            // Close the collector's device side in place too: an activity racing with the
            // end (a launch on another thread that saw the sink) destroys its events.
            state.device.release_with(process_driver.as_deref());
            taken
        };
        let logs = self.collector.take_logs();
        let mut tagged: Tagged = logs.tagged.into_iter().collect();
        let cupti = self.collector.activity_enabled();
        let resolved = match &process_driver {
            Some(d) if cupti => tagged.finish(&**d),
            Some(d) if device.holds_events() => device.finish(&**d),
            _ => Default::default(),
        };
        let device_timing = match (cupti, resolved.device.is_empty() && resolved.untimed == 0) {
            (_, true) => None,
            (true, false) => Some(DeviceTiming::Cupti),
            (false, false) => Some(DeviceTiming::Events),
        };
        let mut ranges = logs.ranges.into_vec();
        ranges.extend(logs.open.into_iter().map(|b| RawRange {
            name: b.name,
            category: b.category,
            metadata: String::new(),
            tid: b.tid,
            start: b.start,
            end: end_stamp,
            depth: b.depth,
            correlation: 0,
            truncated: true,
            stack: Vec::new(),
        }));
        let mut used: Vec<usize> = resolved.device.iter().map(|d| d.device).collect();
        used.sort_unstable();
        used.dedup();
        let driver = process_driver.filter(|_| !used.is_empty());
        let devices = match &driver {
            Some(d) => used
                .iter()
                .filter_map(|&i| d.properties(i).ok().map(|p| (i, p)))
                .collect(),
            None => Vec::new(),
        };
        let emulated = driver.is_some() && cuda::is_emulated();
        let events = event::resolve(
            self.t0,
            &cal,
            ranges,
            logs.memory.into_vec(),
            resolved.device,
            emulated,
        );
        Profile {
            events,
            started_at: self.started_at,
            duration: end.saturating_duration_since(self.t0),
            activities: options.activities.clone(),
            record_shapes: options.record_shapes,
            profile_memory: options.profile_memory,
            with_stack: options.with_stack,
            devices,
            emulated,
            untimed: resolved.untimed
                + device_trace::untimed_count().saturating_sub(self.untimed_before),
            device_timing,
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if self.cuda {
            device_trace::set_sink(None);
        }
        set_wanted(false, false, false);
        // A cycle dropped unfinished (a warm-up): its device events are ours to destroy, and
        // the activity recording it enabled ours to stop (a finished cycle did both).
        let driver = cuda::initialized_driver();
        self.collector.lock().device.release_with(driver.as_deref());
        // What an unfinished cycle recorded goes now, not when the last thread that cached
        // the collector (Note [Per-thread trace state]) lets it go.
        drop(self.collector.take_logs());
        if let Some(d) = &driver
            && self.collector.activity_enabled()
            && !self.finished
        {
            device_records::discard(&**d);
        }
    }
}
