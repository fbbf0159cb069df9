//! The communication thread of a group and the [`Work`] handles it completes. See Note [One
//! communication thread] and Note [Timeouts].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ember_autograd::{ErrorKind, Result};
use ember_device::driver::StreamHandle;
use ember_device::{cuda, trace};
use ember_tensor::Tensor as Raw;

use super::{Backend, InitOptions, ReduceOp};
use crate::error::{DistError, dist_error};

/// One collective as the communication thread runs it, over the tensors' data.
#[derive(Debug)]
pub(crate) enum Collective {
    AllReduce {
        tensor: Raw,
        op: ReduceOp,
    },
    Broadcast {
        tensor: Raw,
        src: usize,
    },
    AllGather {
        outputs: Vec<Raw>,
        input: Raw,
    },
    ReduceScatter {
        output: Raw,
        inputs: Vec<Raw>,
        op: ReduceOp,
    },
    Barrier,
}

impl Collective {
    /// The trace name, `BACKEND:OP` as PyTorch's profiler shows collectives.
    pub(crate) fn trace_name(&self, backend: Backend) -> &'static str {
        match (backend, self) {
            (Backend::Mpi, Collective::AllReduce { .. }) => "mpi:all_reduce",
            (Backend::Mpi, Collective::Broadcast { .. }) => "mpi:broadcast",
            (Backend::Mpi, Collective::AllGather { .. }) => "mpi:all_gather",
            (Backend::Mpi, Collective::ReduceScatter { .. }) => "mpi:reduce_scatter",
            (Backend::Mpi, Collective::Barrier) => "mpi:barrier",
            (Backend::Nccl, Collective::AllReduce { .. }) => "nccl:all_reduce",
            (Backend::Nccl, Collective::Broadcast { .. }) => "nccl:broadcast",
            (Backend::Nccl, Collective::AllGather { .. }) => "nccl:all_gather",
            (Backend::Nccl, Collective::ReduceScatter { .. }) => "nccl:reduce_scatter",
            (Backend::Nccl, Collective::Barrier) => "nccl:barrier",
        }
    }

    fn metadata(&self) -> String {
        let t = match self {
            Collective::AllReduce { tensor, .. } | Collective::Broadcast { tensor, .. } => tensor,
            Collective::AllGather { input, .. } => input,
            Collective::ReduceScatter { output, .. } => output,
            Collective::Barrier => return String::new(),
        };
        format!(
            "{{\"dtype\":\"{}\",\"numel\":{},\"shape\":{:?}}}",
            t.dtype(),
            t.numel(),
            t.dims()
        )
    }
}

/// What a collective run on the communication thread gives besides success.
#[derive(Debug)]
pub(crate) enum EngineError {
    /// The inputs were wrong (mismatched across ranks, ...): the group stays usable.
    Invalid(ErrorKind, String),
    /// The library failed: the group is broken.
    Failed(String),
    /// The deadline passed with the collective still in flight: the group is broken.
    TimedOut,
}

/// What a backend's `run` is told besides the collective.
#[derive(Debug)]
pub(crate) struct RunCtx {
    /// Give up at this instant (Note [Timeouts]).
    pub(crate) deadline: Instant,
    /// Exchange and compare the inputs' metadata first.
    pub(crate) check_inputs: bool,
    /// The issuing thread's current stream on the group's device when the collective was
    /// issued (the producing stream; `None` for a group without a device). See Note
    /// [NCCL streams] in `nccl.rs`.
    pub(crate) producer: Option<StreamHandle>,
}

/// Polls `done` until it says finished or `deadline` passes (Note [Timeouts]): spins while
/// the collective is young, then gives the core away between polls (ranks often outnumber
/// cores on a CI machine).
pub(crate) fn poll_until(
    deadline: Instant,
    mut done: impl FnMut() -> std::result::Result<bool, EngineError>,
) -> std::result::Result<(), EngineError> {
    let started = Instant::now();
    let mut polls: u32 = 0;
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(EngineError::TimedOut);
        }
        polls = polls.wrapping_add(1);
        if started.elapsed() > Duration::from_millis(20) {
            std::thread::sleep(Duration::from_micros(50));
        } else if polls.is_multiple_of(64) {
            std::thread::yield_now();
        }
    }
}

/// A backend, living on its group's communication thread.
pub(crate) trait Engine {
    /// This rank and the world size.
    fn rank_and_size(&self) -> (usize, usize);
    /// The CUDA device the backend's communicator is bound to (`None`: no device).
    fn device(&self) -> Option<usize> {
        None
    }
    /// Runs one collective to completion, or gives up at `ctx.deadline`.
    fn run(&mut self, c: &Collective, ctx: &RunCtx) -> std::result::Result<(), EngineError>;
    /// Ends the backend cleanly (only on a group that is not broken).
    fn finalize(self: Box<Self>);
    /// The part of the backend that may run a blocking collective on the issuing thread
    /// when nothing is queued (Note [Collectives on the caller's thread]); `None`: every
    /// collective goes through the communication thread.
    fn direct(&self) -> Option<Arc<dyn Direct>> {
        None
    }
    /// How to abandon the backend's communicator from any thread once the group is broken
    /// (NCCL's `ncclCommAbort`); `None`: the backend has no such call (Note [Timeouts]).
    fn abort(&self) -> Option<Arc<Abort>> {
        None
    }
}

/// A backend's abort (NCCL's `ncclCommAbort`), run at most once, from whichever thread
/// first finds the group broken: a `Work::wait` past its deadline, the communication thread
/// after a failed or timed-out collective, or the group's destruction.
pub(crate) struct Abort {
    f: Box<dyn Fn() + Send + Sync>,
    once: std::sync::Once,
}

impl Abort {
    pub(crate) fn new(f: impl Fn() + Send + Sync + 'static) -> Arc<Abort> {
        Arc::new(Abort {
            f: Box::new(f),
            once: std::sync::Once::new(),
        })
    }

    fn fire(&self) {
        self.once.call_once(|| (self.f)());
    }

    fn fired(&self) -> bool {
        self.once.is_completed()
    }
}

/// Whether `abort` was fired: the broken group's message says so.
fn aborted(abort: Option<&Abort>) -> bool {
    abort.is_some_and(Abort::fired)
}

impl std::fmt::Debug for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Abort(fired: {})", self.once.is_completed())
    }
}

/// A backend's collectives as any thread may run them, one at a time (the group's
/// execution lock serializes them with the communication thread's).
pub(crate) trait Direct: Send + Sync + std::fmt::Debug {
    /// Whether `c` may run on the caller's thread with the input check `check_inputs`
    /// (Note [Collectives on the caller's thread]).
    fn takes(&self, c: &Collective, check_inputs: bool) -> bool;
    /// Runs one collective to completion, or gives up at `ctx.deadline`.
    fn run(&self, c: &Collective, ctx: &RunCtx) -> std::result::Result<(), EngineError>;
}

type Outcome = std::result::Result<(), (ErrorKind, DistError)>;

#[derive(Debug, Default)]
struct Completion {
    outcome: Mutex<Option<Outcome>>,
    cv: Condvar,
}

impl Completion {
    fn complete(&self, o: Outcome) {
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(o);
        self.cv.notify_all();
    }
}

enum Msg {
    Run {
        c: Collective,
        done: Arc<Completion>,
        deadline: Instant,
        timeout: Duration,
        name: &'static str,
        producer: Option<StreamHandle>,
    },
    Shutdown(mpsc::Sender<()>),
}

/// The state a [`ProcessGroup`](super::ProcessGroup) handle shares with its thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) backend: Backend,
    /// The CUDA device of the backend's communicator (the `nccl` backend).
    pub(crate) device: Option<usize>,
    timeout_ns: AtomicU64,
    check_inputs: Arc<AtomicBool>,
    broken: Arc<Mutex<Option<String>>>,
    /// The queue to the communication thread (`None` once shut down). Held while a
    /// collective is queued or started on the caller's thread, so that either happens in
    /// one order on this rank.
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    /// Collectives queued and not yet finished by the communication thread.
    pending: Arc<AtomicUsize>,
    /// Held by whichever thread runs a collective: the backend's calls never overlap.
    exec: Arc<Mutex<()>>,
    /// The backend's caller-thread runner (Note [Collectives on the caller's thread]).
    direct: Option<Arc<dyn Direct>>,
    /// The backend's abort, fired once the group is broken.
    abort: Option<Arc<Abort>>,
    /// How many collectives ran on the caller's thread (for tests).
    direct_runs: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Run { name, .. } => write!(f, "Run({name})"),
            Msg::Shutdown(_) => f.write_str("Shutdown"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn duration_ns(t: Duration) -> u64 {
    u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
}

impl Shared {
    /// Starts the communication thread; `make` builds the backend on it (MPI is
    /// initialized on the thread that calls it) and reports this rank and the world size.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn start<F>(opts: &InitOptions, make: F) -> Result<Arc<Shared>>
    where
        F: FnOnce() -> Result<Box<dyn Engine>> + Send + 'static,
    {
        Shared::start_within(opts, make, None)
    }

    /// [`Shared::start`], giving up on `make` at `init.0` with the error `init.1` makes
    /// (NCCL's init blocks until every rank joined). The thread is then left to end with
    /// the process: nothing can interrupt a blocked `ncclCommInitRank`.
    pub(crate) fn start_within<F>(
        opts: &InitOptions,
        make: F,
        init: Option<(Instant, &dyn Fn() -> ember_autograd::Error)>,
    ) -> Result<Arc<Shared>>
    where
        F: FnOnce() -> Result<Box<dyn Engine>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Msg>();
        type Ready = (
            (usize, usize),
            Option<usize>,
            Option<Arc<dyn Direct>>,
            Option<Arc<Abort>>,
        );
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Ready>>();
        let broken: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let check_inputs = Arc::new(AtomicBool::new(true));
        let backend = opts.backend;
        let (thread_broken, thread_check) = (broken.clone(), check_inputs.clone());
        let pending = Arc::new(AtomicUsize::new(0));
        let exec = Arc::new(Mutex::new(()));
        let (thread_pending, thread_exec) = (pending.clone(), exec.clone());
        let thread = std::thread::Builder::new()
            .name(format!("ember-{backend}-comm"))
            .spawn(move || {
                let engine = match make() {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let (rank, size) = engine.rank_and_size();
                let abort = engine.abort();
                let ready = (
                    (rank, size),
                    engine.device(),
                    engine.direct(),
                    abort.clone(),
                );
                let _ = ready_tx.send(Ok(ready));
                let state = ServeState {
                    rank,
                    broken: &thread_broken,
                    check_inputs: &thread_check,
                    pending: &thread_pending,
                    exec: &thread_exec,
                    abort: abort.as_deref(),
                };
                serve(engine, rx, &state);
            })
            .map_err(|e| {
                dist_error(
                    ErrorKind::Other,
                    None,
                    "init_process_group",
                    format!("cannot start the communication thread: {e}"),
                )
            })?;
        let ready = match init {
            None => ready_rx.recv().map_err(|_| false),
            Some((deadline, _)) => ready_rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .map_err(|e| e == mpsc::RecvTimeoutError::Timeout),
        };
        let ((rank, world_size), device, direct, abort) = match ready {
            Ok(r) => r?,
            Err(true) => {
                // The thread stays blocked in the backend's init; it is not joined.
                let late = init.map(|(_, late)| late);
                return Err(late.map_or_else(
                    || {
                        dist_error(
                            ErrorKind::Distributed,
                            None,
                            "init_process_group",
                            "the backend's initialization timed out",
                        )
                    },
                    |late| late(),
                ));
            }
            Err(false) => {
                let _ = thread.join();
                return Err(dist_error(
                    ErrorKind::Distributed,
                    None,
                    "init_process_group",
                    "the communication thread ended while starting the backend",
                ));
            }
        };
        Ok(Arc::new(Shared {
            rank,
            world_size,
            backend,
            device,
            timeout_ns: AtomicU64::new(duration_ns(opts.timeout)),
            check_inputs,
            broken,
            tx: Mutex::new(Some(tx)),
            pending,
            exec,
            direct,
            abort,
            direct_runs: AtomicU64::new(0),
            thread: Mutex::new(Some(thread)),
        }))
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn set_timeout(&self, t: Duration) {
        self.timeout_ns.store(duration_ns(t), Ordering::Relaxed);
    }

    pub(crate) fn set_check_inputs(&self, on: bool) {
        self.check_inputs.store(on, Ordering::Relaxed);
    }

    pub(crate) fn broken(&self) -> Option<String> {
        lock(&self.broken).clone()
    }

    /// Marks the group broken for `why` and shuts it down (aborting the backend's
    /// communicator): for a group whose rendezvous failed after the backend started.
    pub(crate) fn abandon(&self, why: &str) {
        lock(&self.broken).get_or_insert_with(|| why.to_string());
        let _ = self.shutdown();
    }

    fn error(&self, kind: ErrorKind, op: &str, msg: impl Into<String>) -> ember_autograd::Error {
        dist_error(kind, Some(self.rank), op, msg)
    }

    /// The deadline of a collective issued now, and the timeout it comes from.
    fn deadline(&self) -> (Instant, Duration) {
        let timeout = self.timeout();
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(u32::MAX.into()));
        (deadline, timeout)
    }

    /// Queues `c` and returns its handle. The caller holds the trace range.
    fn issue(&self, c: Collective, name: &'static str) -> Result<Work> {
        if let Some(why) = self.broken() {
            let msg = broken_msg(&why, aborted(self.abort.as_deref()));
            return Err(self.error(ErrorKind::Distributed, name, msg));
        }
        let (deadline, timeout) = self.deadline();
        let done = Arc::new(Completion::default());
        let producer = self.device.map(cuda::current_stream);
        let sent = lock(&self.tx).as_ref().map(|tx| {
            self.pending.fetch_add(1, Ordering::SeqCst);
            let r = tx.send(Msg::Run {
                c,
                done: done.clone(),
                deadline,
                timeout,
                name,
                producer,
            });
            if r.is_err() {
                self.pending.fetch_sub(1, Ordering::SeqCst);
            }
            r
        });
        match sent {
            Some(Ok(())) => Ok(Work {
                done,
                deadline,
                timeout,
                name,
                rank: self.rank,
                broken: self.broken.clone(),
                abort: self.abort.clone(),
            }),
            _ => Err(self.error(
                ErrorKind::Distributed,
                name,
                "the process group was destroyed",
            )),
        }
    }

    pub(crate) fn run_async(&self, c: Collective) -> Result<Work> {
        let name = c.trace_name(self.backend);
        let _range = trace::range_with(name, || c.metadata());
        self.issue(c, name)
    }

    pub(crate) fn run_sync(&self, c: Collective) -> Result<()> {
        let name = c.trace_name(self.backend);
        let _range = trace::range_with(name, || c.metadata());
        match self.run_here(&c, name) {
            Some(r) => r,
            None => self.issue(c, name)?.wait(),
        }
    }

    /// Runs `c` on this thread when the backend takes it and nothing is queued (Note
    /// [Collectives on the caller's thread]); `None`: queue it instead.
    fn run_here(&self, c: &Collective, name: &'static str) -> Option<Result<()>> {
        let direct = self.direct.as_ref()?;
        let check_inputs = self.check_inputs.load(Ordering::Relaxed);
        if !direct.takes(c, check_inputs) {
            return None;
        }
        let queue = lock(&self.tx);
        // Shut down, or work queued ahead of this call: the thread keeps the order.
        if queue.is_none() || self.pending.load(Ordering::SeqCst) != 0 {
            return None;
        }
        if let Some(why) = self.broken() {
            let msg = broken_msg(&why, aborted(self.abort.as_deref()));
            return Some(Err(self.error(ErrorKind::Distributed, name, msg)));
        }
        // Taken before the queue is released: a collective queued after this one waits
        // for it on the communication thread.
        let _exec = lock(&self.exec);
        drop(queue);
        self.direct_runs.fetch_add(1, Ordering::Relaxed);
        let (deadline, timeout) = self.deadline();
        let ctx = RunCtx {
            deadline,
            check_inputs,
            producer: None,
        };
        let outcome = settle(direct.run(c, &ctx), name, timeout, self.rank, &self.broken);
        if let (Err(_), Some(_), Some(abort)) = (&outcome, self.broken(), &self.abort) {
            abort.fire();
        }
        Some(outcome.map_err(|(kind, e)| ember_autograd::Error::new(kind, e)))
    }

    /// How many collectives ran on the calling thread instead of the communication thread.
    pub(crate) fn direct_runs(&self) -> u64 {
        self.direct_runs.load(Ordering::Relaxed)
    }

    /// Drains the queue, finalizes the backend (unless broken) and joins the thread.
    pub(crate) fn shutdown(&self) -> Result<()> {
        let Some(tx) = lock(&self.tx).take() else {
            return Ok(());
        };
        let (ack_tx, ack_rx) = mpsc::channel();
        if tx.send(Msg::Shutdown(ack_tx)).is_err() {
            return Ok(());
        }
        if self.broken().is_some() {
            let Some(abort) = &self.abort else {
                // The thread may be inside a collective that will never complete (Note
                // [Blocking all-reduce] in `mpi.rs`): it is left to end with the process.
                return Ok(());
            };
            // Aborting the communicator ends whatever the thread waits for (Note
            // [Timeouts]); it then stops without finalizing the backend.
            abort.fire();
            return self.join_within(&ack_rx, ABORTED_STOP, || {
                format!(
                    "the communication thread did not stop within {ABORTED_STOP:?} of aborting the communicator"
                )
            });
        }
        // The queue ahead of the shutdown is bounded by the collectives' own deadlines.
        self.join_within(&ack_rx, self.timeout() + Duration::from_secs(5), || {
            "the communication thread did not stop within the timeout".to_string()
        })
    }

    /// Joins the communication thread once it acknowledges the shutdown on `ack` within
    /// `wait`; otherwise the error `late` describes.
    fn join_within(
        &self,
        ack: &mpsc::Receiver<()>,
        wait: Duration,
        late: impl FnOnce() -> String,
    ) -> Result<()> {
        if ack.recv_timeout(wait).is_err() {
            return Err(self.error(ErrorKind::Distributed, "destroy_process_group", late()));
        }
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        Ok(())
    }
}

/// How long the destruction of a broken group waits for its thread once the backend's
/// communicator is aborted.
const ABORTED_STOP: Duration = Duration::from_secs(10);

fn broken_msg(why: &str, aborted: bool) -> String {
    let how = if aborted {
        "; its communicator was aborted"
    } else {
        ""
    };
    format!(
        "the process group is unusable after an earlier failure ({why}{how}); destroy it and end the process"
    )
}

fn timeout_msg(timeout: Duration) -> String {
    format!(
        "timed out after {timeout:?} waiting for the other ranks (a rank that skipped this collective, issued another, or died); the process group is now unusable"
    )
}

/// What a backend's run came to, as a completion: an invalid input leaves the group
/// usable; a library failure or a timeout breaks it.
fn settle(
    r: std::result::Result<(), EngineError>,
    name: &str,
    timeout: Duration,
    rank: usize,
    broken: &Mutex<Option<String>>,
) -> Outcome {
    let err = |kind, msg: String| {
        Err((
            kind,
            DistError {
                rank: Some(rank),
                op: name.to_string(),
                msg,
            },
        ))
    };
    match r {
        Ok(()) => Ok(()),
        Err(EngineError::Invalid(kind, msg)) => err(kind, msg),
        Err(EngineError::Failed(msg)) => {
            lock(broken).get_or_insert_with(|| format!("{name} failed: {msg}"));
            err(ErrorKind::Distributed, msg)
        }
        Err(EngineError::TimedOut) => {
            lock(broken).get_or_insert_with(|| format!("{name} timed out"));
            err(ErrorKind::Distributed, timeout_msg(timeout))
        }
    }
}

/// What the communication thread shares with its group's handles.
struct ServeState<'a> {
    rank: usize,
    broken: &'a Mutex<Option<String>>,
    check_inputs: &'a AtomicBool,
    pending: &'a AtomicUsize,
    exec: &'a Mutex<()>,
    abort: Option<&'a Abort>,
}

/// The communication thread's loop: runs each queued collective in order.
fn serve(mut engine: Box<dyn Engine>, rx: mpsc::Receiver<Msg>, st: &ServeState<'_>) {
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Run {
                c,
                done,
                deadline,
                timeout,
                name,
                producer,
            } => {
                let outcome = if let Some(why) = lock(st.broken).clone() {
                    Err((
                        ErrorKind::Distributed,
                        DistError {
                            rank: Some(st.rank),
                            op: name.to_string(),
                            msg: broken_msg(&why, aborted(st.abort)),
                        },
                    ))
                } else {
                    let ctx = RunCtx {
                        deadline,
                        check_inputs: st.check_inputs.load(Ordering::Relaxed),
                        producer,
                    };
                    let r = {
                        let _exec = lock(st.exec);
                        engine.run(&c, &ctx)
                    };
                    let breaks = matches!(r, Err(EngineError::Failed(_) | EngineError::TimedOut));
                    let outcome = settle(r, name, timeout, st.rank, st.broken);
                    if let (true, Some(abort)) = (breaks, st.abort) {
                        abort.fire();
                    }
                    outcome
                };
                // Counted down before the completion wakes the waiter, so that its next
                // blocking call may run on its own thread.
                st.pending.fetch_sub(1, Ordering::SeqCst);
                done.complete(outcome);
            }
            Msg::Shutdown(ack) => {
                // A collective running on a caller's thread finishes first.
                let exec = lock(st.exec);
                if lock(st.broken).is_none() {
                    engine.finalize();
                } else {
                    // A broken backend is left as it is (see Note [Timeouts]).
                    std::mem::forget(engine);
                }
                drop(exec);
                let _ = ack.send(());
                return;
            }
        }
    }
}

/// A collective in flight (PyTorch's `Work`): [`wait`](Work::wait) for it.
#[derive(Debug)]
pub struct Work {
    done: Arc<Completion>,
    deadline: Instant,
    timeout: Duration,
    name: &'static str,
    rank: usize,
    broken: Arc<Mutex<Option<String>>>,
    abort: Option<Arc<Abort>>,
}

impl Work {
    /// Waits until the collective completes, at most until the group's timeout (counted
    /// from the issue) has passed; then fails naming the rank and the operation, and the
    /// group is unusable (see Note [Timeouts]).
    pub fn wait(&self) -> Result<()> {
        let mut g = lock(&self.done.outcome);
        loop {
            if let Some(o) = g.as_ref() {
                return match o {
                    Ok(()) => Ok(()),
                    Err((kind, e)) => Err(ember_autograd::Error::new(*kind, e.clone())),
                };
            }
            let now = Instant::now();
            if now >= self.deadline {
                drop(g);
                lock(&self.broken).get_or_insert_with(|| format!("{} timed out", self.name));
                // The communication thread may wait on the communicator: abort it.
                if let Some(abort) = &self.abort {
                    abort.fire();
                }
                return Err(dist_error(
                    ErrorKind::Distributed,
                    Some(self.rank),
                    self.name,
                    timeout_msg(self.timeout),
                ));
            }
            g = self
                .done
                .cv
                .wait_timeout(g, self.deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// `true` once the collective has finished (successfully or not).
    pub fn is_completed(&self) -> bool {
        lock(&self.done.outcome).is_some()
    }
}
