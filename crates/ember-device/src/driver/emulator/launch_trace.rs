//! The record of launched kernels: with `EMBER_CUDA_EMULATOR_TRACE=FILE` (or
//! [`set_launch_trace`]), the emulator appends the name of every kernel it launches to `FILE`.
//!
//! Note [Launch trace]:
//!
//! `cargo xtask test` runs the emulated test suite with the variable set to one fresh file and
//! then compares the names in it with the kernel symbol table: a kernel that no test launched
//! fails CI ("no kernel ships that nothing has executed"). So the record must be complete
//! across the many test processes cargo runs at once, and cheap:
//!
//! - One line per kernel name per process: a process remembers the names it wrote and writes
//!   each only once (until the trace is pointed elsewhere).
//! - Each line (`name\n`) goes to the file in one `write` on a descriptor opened with
//!   `O_APPEND`, so lines from concurrent processes never interleave or overwrite each other
//!   (each append moves to the end of the file and writes atomically for a regular file on a
//!   local file system); the file is opened per new name and closed again, so nothing is held
//!   open across a process's `fork`/`exec` or lost to buffering when a process aborts.
//! - The name is written before the kernel runs: a kernel that aborts the process (the
//!   emulator's deadlock report) still counts as launched.
//! - A failure to write is reported once on stderr and does not fail the launch; the check
//!   then finds the kernel missing and says so.
//!
//! The variable is read once, on the first launch; [`set_launch_trace`] overrides it (tests).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The variable that names the launch-trace file (Note [Launch trace]).
pub const ENV_EMULATOR_TRACE: &str = "EMBER_CUDA_EMULATOR_TRACE";

#[derive(Debug)]
struct TraceState {
    /// Whether the variable was read (or a path set in code).
    initialised: bool,
    /// Where to append; `None`: tracing is off.
    path: Option<PathBuf>,
    /// Names this process already wrote to `path`.
    written: BTreeSet<String>,
    /// Whether a write failure was reported.
    warned: bool,
}

static STATE: Mutex<TraceState> = Mutex::new(TraceState {
    initialised: false,
    path: None,
    written: BTreeSet::new(),
    warned: false,
});

fn state() -> MutexGuard<'static, TraceState> {
    // The state stays consistent under a panic (plain fields): recover from poisoning.
    let mut s = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    if !s.initialised {
        s.initialised = true;
        s.path = std::env::var_os(ENV_EMULATOR_TRACE)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
    }
    s
}

/// Points the launch trace at `path` (`None`: off), overriding `EMBER_CUDA_EMULATOR_TRACE`
/// for the rest of the process; names are written again to a new file.
pub fn set_launch_trace(path: Option<&Path>) {
    let mut s = state();
    s.path = path.map(Path::to_path_buf);
    s.written.clear();
}

/// The file launched kernel names are appended to, if any.
pub fn launch_trace() -> Option<PathBuf> {
    state().path.clone()
}

thread_local! {
    /// Launches per kernel name made by this thread (the emulator runs a kernel on the
    /// thread that launches it), for tests that count launches.
    static THREAD_LAUNCHES: std::cell::RefCell<std::collections::BTreeMap<String, u64>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

/// How many times this thread launched each kernel on the emulator since it started (kernel
/// name to count). Tests take it before and after a call to count that call's launches:
/// per thread, so tests running in parallel in one process do not see each other's.
pub fn thread_launch_counts() -> std::collections::BTreeMap<String, u64> {
    THREAD_LAUNCHES.with(|m| m.borrow().clone())
}

thread_local! {
    /// Calls this thread made that block the host until the device catches up on a real GPU
    /// (driver call name to count): see [`thread_host_waits`].
    static THREAD_WAITS: std::cell::RefCell<std::collections::BTreeMap<&'static str, u64>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

/// How many times this thread made each driver call that makes the host wait for the device
/// on a real GPU (`cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`, the
/// synchronous copies `cuMemcpyHtoD`/`cuMemcpyDtoH`, and `cuMemFree`, which synchronises the
/// device): the emulator runs everything at once, but a wait on a GPU stops the host from
/// queueing work ahead of the device, so tests count them as they count launches.
pub fn thread_host_waits() -> std::collections::BTreeMap<&'static str, u64> {
    THREAD_WAITS.with(|m| m.borrow().clone())
}

thread_local! {
    /// Events this thread created and destroyed: see [`thread_event_calls`].
    static THREAD_EVENTS: std::cell::RefCell<std::collections::BTreeMap<&'static str, u64>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

/// How many times this thread called `cuEventCreate` and `cuEventDestroy` (call name to
/// count, successful calls only). Creating and destroying events costs host time on a real
/// GPU, so tests count them for code that should reuse its events (the profiler's device
/// timing, Note [Event pool] in `ember-profiler`) and check that none is leaked.
pub fn thread_event_calls() -> std::collections::BTreeMap<&'static str, u64> {
    THREAD_EVENTS.with(|m| m.borrow().clone())
}

/// Records a successful `cuEventCreate` or `cuEventDestroy` (see [`thread_event_calls`]).
pub(crate) fn record_event_call(call: &'static str) {
    THREAD_EVENTS.with(|m| *m.borrow_mut().entry(call).or_insert(0) += 1);
}

/// Records a call that blocks the host on a real GPU (see [`thread_host_waits`]).
pub(crate) fn record_host_wait(call: &'static str) {
    THREAD_WAITS.with(|m| *m.borrow_mut().entry(call).or_insert(0) += 1);
}

/// Records that kernel `name` is being launched (Note [Launch trace]).
pub(crate) fn record_launch(name: &str) {
    THREAD_LAUNCHES.with(|m| *m.borrow_mut().entry(name.to_string()).or_insert(0) += 1);
    let mut s = state();
    let Some(path) = s.path.clone() else {
        return;
    };
    if s.written.contains(name) {
        return;
    }
    let line = format!("{name}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    match written {
        Ok(()) => {
            s.written.insert(name.to_string());
        }
        Err(e) => {
            if !s.warned {
                s.warned = true;
                eprintln!(
                    "ember emulator: cannot append to the launch trace {} ({ENV_EMULATOR_TRACE}): {e}",
                    path.display()
                );
            }
        }
    }
}
