//! Process groups, as `torch.distributed`: [`init_process_group`] and the default group,
//! [`ProcessGroup`] with its collectives (`all_reduce`, `broadcast`, `all_gather`,
//! `reduce_scatter`, `barrier`, each with an `_async` twin returning a [`Work`]), over a
//! [`Backend`].
//!
//! ```no_run
//! use ember_autograd::Tensor;
//! use ember_parallel::group::{self, Backend, InitMethod, ReduceOp};
//! // Started as `ember launch --nproc-per-node 2 -- prog` (or `mpirun -n 2 prog`).
//! let pg = group::init_process_group(Backend::Mpi, InitMethod::Env)?;
//! let t = Tensor::full([4], pg.rank() as f64, ())?;
//! pg.all_reduce(&t, ReduceOp::Sum)?; // every rank now holds 0 + 1 + ...
//! group::destroy_process_group()?;
//! # Ok::<(), ember_autograd::Error>(())
//! ```
//!
//! Backends: `mpi` (`mpi.rs`, the `mpi` feature) for CPU tensors and CUDA tensors staged
//! through host memory; `nccl` (`nccl.rs`) for CUDA tensors, on a communication stream of
//! the group's device (Note [NCCL rendezvous], Note [NCCL device], Note [NCCL streams]).
//! Besides the default group of [`init_process_group`], [`ProcessGroup::new`] forms a group
//! with every option spelled out, e.g. several ranks as threads of one process
//! (Note [Explicit groups]):
//!
//! ```no_run
//! use std::sync::Arc;
//! use ember_parallel::group::{Backend, InitMethod, InitOptions, ProcessGroup};
//! use ember_parallel::store::TcpStore;
//! let store = Arc::new(TcpStore::new("127.0.0.1", 0, true, std::time::Duration::from_secs(30))?);
//! let port = store.addr().port();
//! let ranks: Vec<_> = (0..2)
//!     .map(|rank| {
//!         let store = if rank == 0 { store.clone() } else {
//!             Arc::new(TcpStore::new("127.0.0.1", port, false, std::time::Duration::from_secs(30)).unwrap())
//!         };
//!         std::thread::spawn(move || {
//!             let opts = InitOptions::new(Backend::Nccl, InitMethod::Explicit { rank, world_size: 2 })
//!                 .with_store(store)
//!                 .with_device(rank);
//!             ProcessGroup::new(opts).map(|pg| pg.rank())
//!         })
//!     })
//!     .collect();
//! # Ok::<(), ember_autograd::Error>(())
//! ```
//!
//! Note [Explicit groups]: PyTorch forms a group from an explicit rank, world size and store
//! (`init_process_group(backend, store=..., rank=..., world_size=...)`). Here that is
//! [`InitMethod::Explicit`] with [`InitOptions::with_store`] (without a store, the ranks
//! meet at `MASTER_ADDR:MASTER_PORT`, rank 0 serving it), and [`ProcessGroup::new`] forms
//! such a group without making it the default one, so that a process may hold several
//! (one per thread in tests: the emulator's NCCL meets only within one process). The `mpi`
//! backend takes its world from MPI and refuses `Explicit`.
//!
//! Note [One communication thread]: every group owns one thread that runs its collectives
//! one after another, in the order they were issued. MPI (and NCCL) require every rank to
//! issue the collectives of a communicator in the same order; a queue drained by one thread
//! keeps the order of the issuing code even when collectives are issued from autograd hooks
//! (DDP's buckets) while the caller goes on. The `_async` forms return as soon as the
//! collective is queued; the sync forms are `_async` followed by [`Work::wait`]. A trace
//! range named as PyTorch's (`mpi:all_reduce`, ...) opens when a collective is issued, on the
//! issuing thread: it covers the issue for the `_async` forms and the issue and the wait for
//! the sync ones.
//!
//! Note [Collectives on the caller's thread]: handing a collective to the communication
//! thread and back costs two thread wake-ups, which is most of a small all-reduce's time
//! (a 1 KiB `MPI_Allreduce` takes a few microseconds). So a sync collective runs on the
//! calling thread itself when the backend offers that (`Engine::direct`: the `mpi` backend,
//! when MPI granted `MPI_THREAD_SERIALIZED`) and nothing is queued: no `_async` collective
//! issued earlier is still waiting or running on the thread. The order is kept: the queue's
//! lock is held while a collective is queued or started here, and the execution lock (held
//! by whichever thread runs a collective, so the backend's calls never overlap) is taken
//! before the queue's is released, so a collective queued later waits on the thread until
//! this one is done. `_async` collectives always go through the thread, and a sync one issued
//! while earlier work is queued waits behind it there, as before. The timeout holds on both
//! paths, with one difference: the `mpi` backend's all-reduce is a blocking `MPI_Allreduce`
//! that no deadline interrupts (Note [Blocking all-reduce] in `mpi.rs`), and on the caller's
//! thread no `Work::wait` stands beside it to give up. So it runs there only behind the
//! input check, a non-blocking exchange polled against the deadline: a rank whose peer
//! skipped the collective, issued another or died fails in the check, within the timeout.
//! Once the check passed, every rank has reached this collective and calls `MPI_Allreduce`
//! next. What the check cannot see (a peer that dies, or fails to allocate a staging copy,
//! between its check and its call) leaves the caller inside MPI, where a dead peer makes
//! `mpirun` end the job. With the check off, the sync all-reduce goes through the thread as
//! before, and keeps `Work::wait`'s deadline. The check stays one small non-blocking
//! exchange per collective, a round trip of its own that a 1 KiB all-reduce pays (what
//! `set_check_inputs(false)` saves): the smaller alternatives (one MAX all-reduce of the
//! description and its complement, a hash) cost the same round trip, and a blocking
//! exchange would give up the bound on the wait that the caller's thread relies on.
//!
//! Note [Timeouts]: a collective must finish within the group's timeout (30 minutes unless
//! set, [`ProcessGroup::set_timeout`]), counted from its issue. The communication thread
//! polls a non-blocking collective and gives up at that deadline; [`Work::wait`] gives up at
//! the same deadline even if the thread does not answer (the `mpi` backend's all-reduce is
//! a blocking call, so for it `Work::wait` alone keeps the deadline: Note [Blocking
//! all-reduce] in `mpi.rs`; a sync collective run on the caller's thread polls against the
//! same deadline there, Note [Collectives on the caller's thread]). Either way the error
//! names the rank, the operation and the timeout, and the group is marked broken: a
//! collective left half-done on one rank cannot be resumed, so every later call on the
//! group fails at once (as in PyTorch, the `nccl` backend then aborts its communicator with
//! `ncclCommAbort`, once, from whichever thread first finds the group broken, waking its
//! communication thread; destroying the broken group aborts it as well and waits for that
//! thread to stop). The tensor of the abandoned collective is kept alive, but its contents
//! are undefined (the library may still write into it). A broken group is never finalized (`MPI_Finalize`
//! would wait for the abandoned collective; MPI has no abort that leaves the process
//! running); end the process, and `mpirun` ends the job.

mod comm;
mod meta;
#[cfg(feature = "mpi")]
mod mpi;
mod nccl;
mod nccl_init;

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ember_autograd::{ErrorKind, Result, Tensor};
use ember_tensor::{DType, Device, Tensor as Raw};

use crate::error::{dist_error, distributed};
use crate::store::TcpStore;

#[cfg(feature = "mpi")]
pub(crate) use comm::Direct;
pub use comm::Work;
pub(crate) use comm::{Abort, Collective, Engine, EngineError, RunCtx, poll_until};
pub use nccl::UNIQUE_ID_KEY;
pub use nccl_init::{
    AGENT_STORE_ENV, RESTART_COUNT_ENV, agent_store, attempt_prefix, rendezvous_until_id,
};

/// Which library runs a group's collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// NCCL, for CUDA tensors: each rank's communicator on one CUDA device, collectives on
    /// a communication stream of that device (Note [NCCL streams]). Loaded at run time;
    /// under the emulator, the ranks must be threads of one process (Note [Emulated NCCL]).
    Nccl,
    /// Open MPI, for CPU tensors (CUDA tensors are staged through host memory); the `mpi`
    /// feature.
    Mpi,
}

impl Backend {
    /// The name as PyTorch spells it: `nccl`, `mpi`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nccl => "nccl",
            Backend::Mpi => "mpi",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = ember_autograd::Error;
    fn from_str(s: &str) -> Result<Backend> {
        match s.to_ascii_lowercase().as_str() {
            "nccl" => Ok(Backend::Nccl),
            "mpi" => Ok(Backend::Mpi),
            _ => Err(dist_error(
                ErrorKind::InvalidArgument,
                None,
                "Backend",
                format!("unknown backend {s:?}: expected \"nccl\" or \"mpi\""),
            )),
        }
    }
}

/// How a reduction combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The sum divided by the world size (integer tensors: truncated, as NCCL's `ncclAvg`).
    Avg,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
    /// The product.
    Product,
}

/// Where a group learns its rank and world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InitMethod {
    /// From the environment as torchrun and `ember launch` set it: `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`. With the `mpi` backend the world itself
    /// comes from MPI (the ranks must run under `mpirun`, which `ember launch` arranges), and
    /// `RANK`/`WORLD_SIZE`, when set, must agree with it; when they are absent (a program
    /// started by `mpirun` directly) MPI's own rank and size are used, as with
    /// [`InitMethod::Mpi`].
    Env,
    /// MPI's own rank and size (a program started by `mpirun -n N`); the `mpi` backend only.
    Mpi,
    /// This rank and world size, as given (PyTorch's `init_process_group(rank=...,
    /// world_size=...)`); the ranks meet through the store of [`InitOptions::with_store`],
    /// or at `MASTER_ADDR:MASTER_PORT`. The `nccl` backend only (Note [Explicit groups]).
    Explicit {
        /// This process's (or thread's) rank.
        rank: usize,
        /// The number of ranks.
        world_size: usize,
    },
}

/// The settings of [`init_process_group_with`] and [`ProcessGroup::new`].
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The library that runs the collectives.
    pub backend: Backend,
    /// Where rank and world size come from.
    pub init: InitMethod,
    /// How long a collective may take before it fails (see Note [Timeouts]); also how long
    /// the `nccl` backend's rendezvous waits.
    pub timeout: Duration,
    /// The rendezvous store of the `nccl` backend (`None`: one on `MASTER_ADDR:MASTER_PORT`,
    /// served by rank 0; see Note [NCCL rendezvous]).
    pub store: Option<Arc<TcpStore>>,
    /// The CUDA device of the `nccl` backend's communicator (`None`: `LOCAL_RANK`, else the
    /// calling thread's current device; see Note [NCCL device]).
    pub device: Option<usize>,
}

/// PyTorch's default process-group timeout: 30 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

impl InitOptions {
    /// `backend` and `init` with the default timeout.
    pub fn new(backend: Backend, init: InitMethod) -> InitOptions {
        InitOptions {
            backend,
            init,
            timeout: DEFAULT_TIMEOUT,
            store: None,
            device: None,
        }
    }

    /// The same options with a rendezvous store (PyTorch's `store=`): rank 0 publishes the
    /// NCCL id there. Every rank passes a client of the same store.
    pub fn with_store(mut self, store: Arc<TcpStore>) -> InitOptions {
        self.store = Some(store);
        self
    }

    /// The same options with the `nccl` backend's communicator on `cuda:device`.
    pub fn with_device(mut self, device: usize) -> InitOptions {
        self.device = Some(device);
        self
    }

    /// The same options with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> InitOptions {
        self.timeout = timeout;
        self
    }
}

impl Default for InitOptions {
    /// The `mpi` backend, rank and size from the environment, a 30-minute timeout.
    fn default() -> InitOptions {
        InitOptions::new(Backend::Mpi, InitMethod::Env)
    }
}

/// A set of ranks that run collectives together. Cloning is cheap (a handle to one
/// group); see Note [One communication thread] and Note [Timeouts].
#[derive(Clone)]
pub struct ProcessGroup {
    shared: std::sync::Arc<comm::Shared>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("backend", &self.backend())
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("timeout", &self.timeout())
            .finish()
    }
}

static DEFAULT_GROUP: Mutex<Option<ProcessGroup>> = Mutex::new(None);

fn default_slot() -> std::sync::MutexGuard<'static, Option<ProcessGroup>> {
    DEFAULT_GROUP
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Forms the default process group (PyTorch's `init_process_group(backend, init_method=...)`)
/// with the default timeout, and returns it. An error if it is already initialized.
pub fn init_process_group(backend: Backend, init: InitMethod) -> Result<ProcessGroup> {
    init_process_group_with(InitOptions::new(backend, init))
}

/// [`init_process_group`] with every option.
pub fn init_process_group_with(opts: InitOptions) -> Result<ProcessGroup> {
    let mut slot = default_slot();
    if let Some(pg) = slot.as_ref() {
        return Err(distributed(
            Some(pg.rank()),
            "init_process_group",
            "the default process group is already initialized; call destroy_process_group() first",
        ));
    }
    let pg = ProcessGroup::new(opts)?;
    *slot = Some(pg.clone());
    Ok(pg)
}

fn new_group(opts: &InitOptions) -> Result<ProcessGroup> {
    match opts.backend {
        Backend::Nccl => {
            let joining = nccl_init::Joining::meet(nccl::NcclSetup::resolve(opts)?)?;
            let late = || joining.init_late();
            let shared = comm::Shared::start_within(
                opts,
                nccl::NcclEngine::start(&joining),
                Some((joining.deadline, &late)),
            )?;
            if let Err(e) = joining.first_barrier() {
                shared.abandon("the rendezvous after ncclCommInitRank failed");
                return Err(e);
            }
            Ok(ProcessGroup { shared })
        }
        #[cfg(feature = "mpi")]
        Backend::Mpi if matches!(opts.init, InitMethod::Explicit { .. }) => Err(dist_error(
            ErrorKind::InvalidArgument,
            None,
            "init_process_group",
            "the mpi backend takes its rank and world size from MPI: use InitMethod::Env or InitMethod::Mpi",
        )),
        #[cfg(feature = "mpi")]
        Backend::Mpi => {
            let shared = comm::Shared::start(opts, mpi::MpiEngine::start(opts.init))?;
            Ok(ProcessGroup { shared })
        }
        #[cfg(not(feature = "mpi"))]
        Backend::Mpi => Err(dist_error(
            ErrorKind::Unsupported,
            None,
            "init_process_group",
            MPI_NOT_BUILT,
        )),
    }
}

/// The message when the `mpi` backend is asked for in a build without the `mpi` feature.
pub const MPI_NOT_BUILT: &str = "MPI support was not built in: build with --features mpi";

/// The environment variable `name` as a non-negative integer (`None` when unset).
pub(crate) fn env_usize(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
            distributed(
                None,
                "init_process_group",
                format!("environment variable {name}={v:?} is not a non-negative integer"),
            )
        }),
    }
}

/// `true` if `ember-parallel` was built with the `mpi` feature.
pub fn mpi_built() -> bool {
    cfg!(feature = "mpi")
}

fn not_initialized(op: &str) -> ember_autograd::Error {
    distributed(
        None,
        op,
        "the default process group has not been initialized: call init_process_group first",
    )
}

/// The default process group, formed by [`init_process_group`].
pub fn default_group() -> Result<ProcessGroup> {
    default_slot()
        .clone()
        .ok_or_else(|| not_initialized("default_group"))
}

/// This process's rank in the default group.
pub fn get_rank() -> Result<usize> {
    default_slot()
        .as_ref()
        .map(ProcessGroup::rank)
        .ok_or_else(|| not_initialized("get_rank"))
}

/// The number of ranks in the default group.
pub fn get_world_size() -> Result<usize> {
    default_slot()
        .as_ref()
        .map(ProcessGroup::world_size)
        .ok_or_else(|| not_initialized("get_world_size"))
}

/// `true` once [`init_process_group`] succeeded and until [`destroy_process_group`].
pub fn is_initialized() -> bool {
    default_slot().is_some()
}

/// Ends the default group: waits for its queued collectives, stops its communication
/// thread and finalizes the backend (MPI can be initialized once per process: a later
/// `init_process_group` with the `mpi` backend fails). An error if none is initialized.
pub fn destroy_process_group() -> Result<()> {
    let pg = default_slot()
        .take()
        .ok_or_else(|| not_initialized("destroy_process_group"))?;
    pg.shared.shutdown()
}

impl ProcessGroup {
    /// Forms a group that is not the default one (Note [Explicit groups]): every rank of
    /// the group calls it with its own options. Destroy it with [`ProcessGroup::destroy`].
    pub fn new(opts: InitOptions) -> Result<ProcessGroup> {
        new_group(&opts)
    }

    /// Ends this group as [`destroy_process_group`] ends the default one: waits for its
    /// queued collectives, stops its communication thread and releases the backend.
    pub fn destroy(&self) -> Result<()> {
        self.shared.shutdown()
    }

    /// The CUDA device of the group's communicator (the `nccl` backend; `None` for `mpi`),
    /// where its collectives' tensors must be (Note [NCCL device]).
    pub fn device(&self) -> Option<Device> {
        self.shared.device.map(Device::Cuda)
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.world_size
    }

    /// The library that runs the collectives.
    pub fn backend(&self) -> Backend {
        self.shared.backend
    }

    /// How long a collective may take (see Note [Timeouts]).
    pub fn timeout(&self) -> Duration {
        self.shared.timeout()
    }

    /// Sets the timeout of collectives issued from now on.
    pub fn set_timeout(&self, t: Duration) {
        self.shared.set_timeout(t);
    }

    /// Whether each collective first checks, with a tiny all-gather of its inputs' dtype,
    /// element count and shape, that every rank passed matching tensors (on by default).
    /// Switching it off saves that exchange on every call; it must then be off on every
    /// rank (the exchange is itself a collective), and mismatched inputs are the library's
    /// undefined behaviour (a hang until the timeout, or garbage). With the `mpi` backend
    /// the check also lets a sync `all_reduce` run on the calling thread (Note [Collectives
    /// on the caller's thread]); with it off, that goes through the communication thread.
    pub fn set_check_inputs(&self, on: bool) {
        self.shared.set_check_inputs(on);
    }

    /// How many collectives of this group ran on the calling thread rather than on the
    /// communication thread (Note [Collectives on the caller's thread]); for tests.
    #[doc(hidden)]
    pub fn caller_thread_runs(&self) -> u64 {
        self.shared.direct_runs()
    }

    /// `true` once a collective timed out or failed mid-way: every later call fails.
    pub fn is_broken(&self) -> bool {
        self.shared.broken().is_some()
    }

    // --- collectives ---------------------------------------------------------------------

    /// Reduces `t` across ranks in place: every rank ends with the result.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        let c = Collective::AllReduce {
            tensor: self.input(t, "all_reduce")?,
            op,
        };
        self.shared.run_sync(c)
    }

    /// [`all_reduce`](ProcessGroup::all_reduce), returning once queued.
    pub fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        let c = Collective::AllReduce {
            tensor: self.input(t, "all_reduce")?,
            op,
        };
        self.shared.run_async(c)
    }

    /// Copies `src`'s `t` into `t` on every rank.
    pub fn broadcast(&self, t: &Tensor, src: usize) -> Result<()> {
        let c = self.broadcast_op(t, src)?;
        self.shared.run_sync(c)
    }

    /// [`broadcast`](ProcessGroup::broadcast), returning once queued.
    pub fn broadcast_async(&self, t: &Tensor, src: usize) -> Result<Work> {
        let c = self.broadcast_op(t, src)?;
        self.shared.run_async(c)
    }

    /// Gathers every rank's `input` into `outputs` (one tensor per rank, in rank order, each
    /// of `input`'s shape and dtype) on every rank.
    pub fn all_gather(&self, outputs: &[Tensor], input: &Tensor) -> Result<()> {
        let c = self.all_gather_op(outputs, input)?;
        self.shared.run_sync(c)
    }

    /// [`all_gather`](ProcessGroup::all_gather), returning once queued.
    pub fn all_gather_async(&self, outputs: &[Tensor], input: &Tensor) -> Result<Work> {
        let c = self.all_gather_op(outputs, input)?;
        self.shared.run_async(c)
    }

    /// Reduces `inputs` (one tensor per rank, each of `output`'s shape and dtype) across
    /// ranks and leaves the reduction of `inputs[r]` in rank `r`'s `output`.
    pub fn reduce_scatter(&self, output: &Tensor, inputs: &[Tensor], op: ReduceOp) -> Result<()> {
        let c = self.reduce_scatter_op(output, inputs, op)?;
        self.shared.run_sync(c)
    }

    /// [`reduce_scatter`](ProcessGroup::reduce_scatter), returning once queued.
    pub fn reduce_scatter_async(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
    ) -> Result<Work> {
        let c = self.reduce_scatter_op(output, inputs, op)?;
        self.shared.run_async(c)
    }

    /// Waits until every rank has reached the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.shared.run_sync(Collective::Barrier)
    }

    /// [`barrier`](ProcessGroup::barrier), returning once queued.
    pub fn barrier_async(&self) -> Result<Work> {
        self.shared.run_async(Collective::Barrier)
    }

    // --- local argument checks -----------------------------------------------------------

    fn bad(&self, op: &str, kind: ErrorKind, msg: String) -> ember_autograd::Error {
        dist_error(
            kind,
            Some(self.rank()),
            format!("{}:{op}", self.backend()),
            msg,
        )
    }

    /// The tensor's data, after the checks every backend shares (its device).
    fn input(&self, t: &Tensor, op: &str) -> Result<Raw> {
        let raw = t.data();
        check_device(self.backend(), raw.device())
            .map_err(|msg| self.bad(op, ErrorKind::DeviceMismatch, msg))?;
        if let Some(d) = self.device()
            && raw.device() != d
        {
            return Err(self.bad(
                op,
                ErrorKind::DeviceMismatch,
                format!(
                    "rank {}'s nccl communicator is on {d}, but found a tensor on {} (move it to {d}, or form the group on its device)",
                    self.rank(),
                    raw.device()
                ),
            ));
        }
        Ok(raw)
    }

    fn broadcast_op(&self, t: &Tensor, src: usize) -> Result<Collective> {
        if src >= self.world_size() {
            return Err(self.bad(
                "broadcast",
                ErrorKind::InvalidArgument,
                format!(
                    "src {src} is not a rank of a group of world size {}",
                    self.world_size()
                ),
            ));
        }
        Ok(Collective::Broadcast {
            tensor: self.input(t, "broadcast")?,
            src,
        })
    }

    fn per_rank(&self, op: &str, what: &str, one: &Raw, list: &[Tensor]) -> Result<Vec<Raw>> {
        if list.len() != self.world_size() {
            return Err(self.bad(
                op,
                ErrorKind::InvalidArgument,
                format!(
                    "expected {} {what} (one per rank), but found {}",
                    self.world_size(),
                    list.len()
                ),
            ));
        }
        list.iter()
            .enumerate()
            .map(|(i, t)| {
                let raw = self.input(t, op)?;
                if raw.shape() != one.shape() || raw.dtype() != one.dtype() {
                    return Err(self.bad(
                        op,
                        ErrorKind::Shape,
                        format!(
                            "{what}[{i}] is {} {}, but expected {} {}",
                            raw.dtype(),
                            raw.shape(),
                            one.dtype(),
                            one.shape()
                        ),
                    ));
                }
                Ok(raw)
            })
            .collect()
    }

    fn all_gather_op(&self, outputs: &[Tensor], input: &Tensor) -> Result<Collective> {
        let input = self.input(input, "all_gather")?;
        let outputs = self.per_rank("all_gather", "outputs", &input, outputs)?;
        Ok(Collective::AllGather { outputs, input })
    }

    fn reduce_scatter_op(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
    ) -> Result<Collective> {
        let output = self.input(output, "reduce_scatter")?;
        let inputs = self.per_rank("reduce_scatter", "inputs", &output, inputs)?;
        Ok(Collective::ReduceScatter { output, inputs, op })
    }
}

/// `Err(message)` when `backend` cannot take a tensor on `device`: NCCL takes CUDA tensors
/// only; MPI takes CPU tensors and stages CUDA tensors through host memory.
pub fn check_device(backend: Backend, device: Device) -> std::result::Result<(), String> {
    match (backend, device) {
        (Backend::Nccl, Device::Cpu) => Err(
            "the nccl backend takes CUDA tensors, but found a tensor on cpu (use the mpi backend for CPU tensors)"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// A small code for each dtype, exchanged by the input checks.
pub(crate) fn dtype_code(d: DType) -> i64 {
    ember_tensor::ALL_DTYPES
        .iter()
        .position(|&x| x == d)
        .map_or(-1, |p| p as i64)
}

/// The dtype of a [`dtype_code`].
pub(crate) fn dtype_of_code(c: i64) -> Option<DType> {
    usize::try_from(c)
        .ok()
        .and_then(|i| ember_tensor::ALL_DTYPES.get(i).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_round_trip() {
        for b in [Backend::Nccl, Backend::Mpi] {
            assert_eq!(b.to_string().parse::<Backend>().ok(), Some(b));
        }
        let e = "gloo".parse::<Backend>().unwrap_err();
        assert!(e.to_string().contains("unknown backend \"gloo\""), "{e}");
    }

    #[test]
    fn nccl_rejects_cpu_tensors_and_mpi_takes_both() {
        assert!(
            check_device(Backend::Nccl, Device::Cpu)
                .unwrap_err()
                .contains("found a tensor on cpu")
        );
        assert!(check_device(Backend::Nccl, Device::Cuda(0)).is_ok());
        assert!(check_device(Backend::Mpi, Device::Cpu).is_ok());
        assert!(check_device(Backend::Mpi, Device::Cuda(1)).is_ok());
    }

    #[test]
    fn dtype_codes_round_trip() {
        for d in ember_tensor::ALL_DTYPES {
            assert_eq!(dtype_of_code(dtype_code(d)), Some(d));
        }
        assert_eq!(dtype_of_code(-1), None);
    }

    #[test]
    fn without_a_group_calls_say_so() {
        if is_initialized() {
            return;
        }
        let e = get_rank().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Distributed);
        assert!(e.to_string().contains("has not been initialized"), "{e}");
        assert!(destroy_process_group().is_err());
    }

    #[test]
    fn nccl_refuses_the_mpi_init_method_and_a_rank_outside_the_world() {
        let e = ProcessGroup::new(InitOptions::new(Backend::Nccl, InitMethod::Mpi)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.to_string().contains("ember launch"), "{e}");
        let e = ProcessGroup::new(InitOptions::new(
            Backend::Nccl,
            InitMethod::Explicit {
                rank: 2,
                world_size: 2,
            },
        ))
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.to_string()
                .contains("rank 2 is not a rank of a world of size 2"),
            "{e}"
        );
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn mpi_without_the_feature_says_how_to_build_it() {
        let e = init_process_group(Backend::Mpi, InitMethod::Env).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.to_string().ends_with(MPI_NOT_BUILT), "{e}");
    }
}
