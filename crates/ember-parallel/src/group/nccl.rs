//! The `nccl` backend: NCCL's collectives through the driver seam (Note [NCCL through the
//! seam] in `ember-device`), one communicator per rank made from a unique id handed around
//! by the rendezvous store, run on the group's communication thread (Note [One
//! communication thread]).
//!
//! Note [NCCL rendezvous]: rank 0 makes the clique's id (`ncclGetUniqueId`) and sets it in
//! the [`TcpStore`] under [`UNIQUE_ID_KEY`]; the other ranks get it, and every rank joins
//! with `ncclCommInitRank` on its device. As in PyTorch, rank 0 serves the store on
//! `MASTER_ADDR:MASTER_PORT` and every rank is a client, unless `ember launch` serves it
//! (`TORCHELASTIC_USE_AGENT_STORE`, Note [Agent store] in `launch.rs`: then every rank is a
//! client and the keys carry the attempt's prefix); a store handed in with
//! [`InitOptions::with_store`](super::InitOptions::with_store) is used as it is (one store
//! per group: the keys are fixed). Every wait of the rendezvous (connecting to the store,
//! the other ranks reaching it, the id, `ncclCommInitRank` and the first barrier after it)
//! ends at one deadline, the group's timeout after `init_process_group` was called, with an
//! error naming the ranks that never came (Note [Rendezvous barriers] in `rendezvous.rs`;
//! `nccl_init.rs`). The engine keeps the store for the group's life, so rank 0 serves it
//! until every rank is done with it. A world of one needs no store. The id is not exchanged
//! through MPI: with [`InitMethod::Mpi`] the backend says to start the ranks with `ember
//! launch` (or torchrun) instead.
//!
//! Note [NCCL device]: a group's communicator is bound to one CUDA device for its life: the
//! one given by [`InitOptions::with_device`](super::InitOptions::with_device), else
//! `LOCAL_RANK` with [`InitMethod::Env`] (torchrun's convention, what `torch.cuda.set_device(
//! local_rank)` before `init_process_group` arranges), else the calling thread's current
//! device (PyTorch's ProcessGroupNCCL follows the tensors' device and guesses `rank %
//! device_count` for a barrier; binding the device up front is its `device_id=` argument,
//! and keeps one communicator per group). A tensor on another device is an error naming
//! both devices.
//!
//! Note [NCCL streams]: every collective runs on the group's own communication stream of
//! its device (PyTorch's NCCL stream). The issuing thread's current stream on that device
//! (the producing stream, captured when the collective is issued) gets an event that the
//! communication stream waits for, so the collective reads what earlier work wrote; after
//! the collective an event on the communication stream is waited for by the producing
//! stream, so later work there sees the result. The tensors are marked as used by the
//! communication stream (`record_stream`, through `with_cuda_buffers`), so the caching
//! allocator does not hand their memory out again while the collective may still touch it.
//! The communication thread then polls the last event until it completes or the deadline
//! passes (Note [Timeouts]), and only then completes the [`Work`](super::Work): a collective
//! is done on the device when `wait` returns, and one collective is in flight per group at
//! a time. Under the emulator, whose streams run work when it is enqueued, the NCCL call
//! itself waits for the other ranks (Note [Emulated NCCL]); there a missing rank is caught
//! by `Work::wait`'s own deadline. After a timeout or a failed call the group is broken, the
//! tensors involved are leaked and the communicator is aborted (`ncclCommAbort`, from the
//! thread that found the group broken: the communication thread, or the `Work::wait` that
//! gave up, which wakes a communication thread still waiting in the emulator's NCCL), as
//! PyTorch's watchdog aborts its communicators; destroying a broken group aborts it too
//! (once), and then waits for the communication thread to stop.
//!
//! Collectives whose tensors NCCL cannot take as they are (strided views, several outputs of
//! an all-gather or inputs of a reduce-scatter) go through contiguous buffers on the
//! communication stream, copied back on the same stream, as PyTorch does. Bool tensors are
//! reduced as bytes (sum and max as "or", min and product as "and"; avg is an error).

use std::sync::Arc;
use std::time::Instant;

use ember_autograd::{ErrorKind, Result};
use ember_device::driver::{
    Collective as NcclCall, Driver, NcclComm, NcclType, ReduceOp as NcclOp, StreamHandle,
};
use ember_device::{DeviceError, cuda};
use ember_tensor::{CudaBuffer, DType, Device, Tensor as Raw, with_cuda_buffers};

use super::meta::{META, compare, describe};
use super::nccl_init::Joining;
use super::{
    Abort, Collective, Engine, EngineError, InitMethod, InitOptions, ReduceOp, RunCtx, env_usize,
    poll_until,
};
use crate::comm::nccl_type;
use crate::error::{dist_error, distributed};
use crate::store::TcpStore;

/// The store key under which rank 0 publishes the clique's unique id.
pub const UNIQUE_ID_KEY: &str = "nccl/unique_id";

pub(crate) const INIT: &str = "init_process_group";

/// Where the ranks meet: a store handed in, or one on an address (rank 0 serves it, or
/// `ember launch` does: Note [Agent store] in `launch.rs`).
pub(crate) enum Rendezvous {
    Store(Arc<TcpStore>),
    Addr(String, u16),
}

/// Everything the rendezvous and [`NcclEngine::start`] need, resolved on the calling thread.
pub(crate) struct NcclSetup {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) device: usize,
    pub(crate) rendezvous: Option<Rendezvous>,
    pub(crate) timeout: std::time::Duration,
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn required(name: &str, value: Option<usize>) -> Result<usize> {
    value.ok_or_else(|| {
        distributed(
            None,
            INIT,
            format!(
                "{name} is not set: start the ranks with `ember launch` or torchrun (which set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT), or use InitMethod::Explicit"
            ),
        )
    })
}

impl NcclSetup {
    /// Rank, world size, device and rendezvous from `opts` (Note [NCCL rendezvous], Note
    /// [NCCL device]); checks that NCCL and the device are usable.
    pub(crate) fn resolve(opts: &InitOptions) -> Result<NcclSetup> {
        let (rank, size, local_rank) = match opts.init {
            InitMethod::Env => (
                required("RANK", env_usize("RANK")?)?,
                required("WORLD_SIZE", env_usize("WORLD_SIZE")?)?,
                env_usize("LOCAL_RANK")?,
            ),
            InitMethod::Explicit { rank, world_size } => (rank, world_size, None),
            InitMethod::Mpi => {
                return Err(dist_error(
                    ErrorKind::Unsupported,
                    None,
                    INIT,
                    "the nccl backend exchanges its unique id through the TCP store, not MPI: start the ranks with `ember launch` (or torchrun) and use InitMethod::Env",
                ));
            }
        };
        if size == 0 || rank >= size {
            return Err(dist_error(
                ErrorKind::InvalidArgument,
                Some(rank),
                INIT,
                format!("rank {rank} is not a rank of a world of size {size}"),
            ));
        }
        let unusable = |why: String| {
            dist_error(
                ErrorKind::Unsupported,
                Some(rank),
                INIT,
                format!("the nccl backend cannot run here: {why}; use the mpi backend"),
            )
        };
        let driver = cuda::driver().map_err(|e| unusable(e.to_string()))?;
        driver.nccl_version().map_err(|e| unusable(e.to_string()))?;
        let device = match (opts.device, local_rank) {
            (Some(d), _) | (None, Some(d)) => d,
            (None, None) => cuda::current_device().map_err(|e| unusable(e.to_string()))?,
        };
        let count = cuda::device_count();
        if device >= count {
            return Err(dist_error(
                ErrorKind::DeviceMismatch,
                Some(rank),
                INIT,
                format!(
                    "rank {rank} is to use cuda:{device}, but this process sees {count} CUDA device(s) (LOCAL_RANK or the device given must name one of them)"
                ),
            ));
        }
        let rendezvous = match (&opts.store, size) {
            (Some(s), _) => Some(Rendezvous::Store(s.clone())),
            (None, 1) => None,
            (None, _) => {
                let addr = env_var("MASTER_ADDR").ok_or_else(|| {
                    distributed(
                        Some(rank),
                        INIT,
                        "MASTER_ADDR is not set: the nccl backend meets the other ranks at MASTER_ADDR:MASTER_PORT (`ember launch` sets both), or give a store with InitOptions::with_store",
                    )
                })?;
                let port = env_usize("MASTER_PORT")?
                    .and_then(|p| u16::try_from(p).ok())
                    .ok_or_else(|| {
                        distributed(
                            Some(rank),
                            INIT,
                            "MASTER_PORT is not set to a port number (`ember launch` sets it)",
                        )
                    })?;
                Some(Rendezvous::Addr(addr, port))
            }
        };
        Ok(NcclSetup {
            rank,
            size,
            device,
            rendezvous,
            timeout: opts.timeout,
        })
    }
}

/// One rank's NCCL communicator and communication stream, on the communication thread.
pub(crate) struct NcclEngine {
    driver: Arc<dyn Driver>,
    comm: NcclComm,
    rank: usize,
    size: usize,
    device: usize,
    stream: cuda::Stream,
    /// Kept for the group's life (Note [NCCL rendezvous]).
    _store: Option<Arc<TcpStore>>,
}

fn dev_err(e: DeviceError) -> EngineError {
    EngineError::Failed(e.to_string())
}

fn tensor_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Invalid(ErrorKind::InvalidArgument, e.to_string())
}

/// NCCL's operator for `op` on `dtype`.
fn nccl_op(op: ReduceOp, dtype: DType) -> std::result::Result<NcclOp, EngineError> {
    if dtype == DType::Bool {
        return match op {
            ReduceOp::Sum | ReduceOp::Max => Ok(NcclOp::Max),
            ReduceOp::Min | ReduceOp::Product => Ok(NcclOp::Min),
            ReduceOp::Avg => Err(EngineError::Invalid(
                ErrorKind::DType,
                "ReduceOp::Avg is not defined for bool tensors".into(),
            )),
        };
    }
    Ok(match op {
        ReduceOp::Sum => NcclOp::Sum,
        ReduceOp::Avg => NcclOp::Avg,
        ReduceOp::Max => NcclOp::Max,
        ReduceOp::Min => NcclOp::Min,
        ReduceOp::Product => NcclOp::Prod,
    })
}

fn elem_type(dtype: DType) -> std::result::Result<NcclType, EngineError> {
    nccl_type(dtype).ok_or_else(|| {
        EngineError::Invalid(ErrorKind::DType, format!("NCCL has no type for {dtype}"))
    })
}

/// The tensors a collective touches (kept alive, leaked, after a timeout).
fn tensors(c: &Collective) -> Vec<Raw> {
    match c {
        Collective::AllReduce { tensor, .. } | Collective::Broadcast { tensor, .. } => {
            vec![tensor.clone()]
        }
        Collective::AllGather { outputs, input } => {
            let mut v = outputs.clone();
            v.push(input.clone());
            v
        }
        Collective::ReduceScatter { output, inputs, .. } => {
            let mut v = inputs.clone();
            v.push(output.clone());
            v
        }
        Collective::Barrier => Vec::new(),
    }
}

impl NcclEngine {
    /// The closure that joins the clique on the communication thread, once the ranks met on
    /// the store and hold the clique's id (`nccl_init.rs`).
    pub(crate) fn start(
        joining: &Joining,
    ) -> impl FnOnce() -> Result<Box<dyn Engine>> + Send + 'static {
        let (rank, size, device, id) = (joining.rank, joining.size, joining.device, joining.id);
        let store = joining.store.clone();
        move || {
            let fail = |what: &str, e: &dyn std::fmt::Display| {
                distributed(Some(rank), INIT, format!("{what}: {e}"))
            };
            // The thread is the group's: its current device is the communicator's.
            cuda::set_device(device).map_err(|e| fail("cannot select the device", &e))?;
            let driver = cuda::driver().map_err(|e| fail("no CUDA driver", &e))?;
            let comm = driver
                .nccl_comm_init_rank(device, size, &id, rank)
                .map_err(|e| fail(&format!("ncclCommInitRank on cuda:{device} failed"), &e))?;
            let stream = cuda::Stream::new(device)
                .map_err(|e| fail("cannot create the communication stream", &e))?;
            Ok(Box::new(NcclEngine {
                driver,
                comm,
                rank,
                size,
                device,
                stream,
                _store: store,
            }) as Box<dyn Engine>)
        }
    }

    fn cuda(&self) -> Device {
        Device::Cuda(self.device)
    }

    /// Enqueues one NCCL call over `reads` and `writes` on the communication stream (the
    /// current stream of this thread); `make` builds it from their buffers. A call of no
    /// elements is skipped, as NCCL would do nothing.
    fn enqueue(
        &self,
        reads: &[&Raw],
        writes: &[&Raw],
        deadline: Instant,
        make: impl FnOnce(&[CudaBuffer], &[CudaBuffer]) -> std::result::Result<NcclCall, EngineError>,
    ) -> std::result::Result<(), EngineError> {
        let mut outcome = Ok(());
        with_cuda_buffers(reads, writes, |r, w| {
            outcome = make(r, w).and_then(|call| {
                if call.count() == 0 {
                    return Ok(());
                }
                self.driver
                    .nccl_collective(self.comm, self.stream.handle(), &call)
                    .map_err(|e| {
                        // The emulator's call waits for the other ranks itself (Note [NCCL
                        // streams]): past the deadline that is the group's timeout.
                        if Instant::now() >= deadline {
                            EngineError::TimedOut
                        } else {
                            dev_err(e)
                        }
                    })
            });
            Ok(())
        })
        .map_err(tensor_err)?;
        outcome
    }

    /// Runs `f` over `t` in place: directly when `t` is contiguous, else over a contiguous
    /// copy written back afterwards (both on the communication stream).
    fn in_place(
        &self,
        t: &Raw,
        f: impl FnOnce(&Raw) -> std::result::Result<(), EngineError>,
    ) -> std::result::Result<(), EngineError> {
        if t.is_contiguous() {
            return f(t);
        }
        let tmp = t.contiguous().map_err(tensor_err)?;
        f(&tmp)?;
        t.copy_(&tmp).map_err(tensor_err)?;
        Ok(())
    }

    fn all_reduce(
        &self,
        t: &Raw,
        op: ReduceOp,
        d: Instant,
    ) -> std::result::Result<(), EngineError> {
        let (dtype, op) = (elem_type(t.dtype())?, nccl_op(op, t.dtype())?);
        self.in_place(t, |t| {
            self.enqueue(&[], &[t], d, |_, w| {
                Ok(NcclCall::AllReduce {
                    send: w[0].ptr,
                    recv: w[0].ptr,
                    count: w[0].len,
                    dtype,
                    op,
                })
            })
        })
    }

    fn broadcast(&self, t: &Raw, src: usize, d: Instant) -> std::result::Result<(), EngineError> {
        let dtype = elem_type(t.dtype())?;
        self.in_place(t, |t| {
            self.enqueue(&[], &[t], d, |_, w| {
                Ok(NcclCall::Broadcast {
                    send: w[0].ptr,
                    recv: w[0].ptr,
                    count: w[0].len,
                    dtype,
                    root: src,
                })
            })
        })
    }

    fn all_gather(
        &self,
        outputs: &[Raw],
        input: &Raw,
        d: Instant,
    ) -> std::result::Result<(), EngineError> {
        let dtype = elem_type(input.dtype())?;
        let input = input.contiguous().map_err(tensor_err)?;
        let n = input.numel();
        let flat = Raw::empty([n * self.size], (self.cuda(), input.dtype())).map_err(tensor_err)?;
        self.enqueue(&[&input], &[&flat], d, |r, w| {
            Ok(NcclCall::AllGather {
                send: r[0].ptr,
                recv: w[0].ptr,
                count: n,
                dtype,
            })
        })?;
        for (r, out) in outputs.iter().enumerate() {
            let part = flat
                .narrow(0, r * n, n)
                .and_then(|p| p.reshape(out.dims()))
                .map_err(tensor_err)?;
            out.copy_(&part).map_err(tensor_err)?;
        }
        Ok(())
    }

    fn reduce_scatter(
        &self,
        output: &Raw,
        inputs: &[Raw],
        op: ReduceOp,
        d: Instant,
    ) -> std::result::Result<(), EngineError> {
        let (dtype, op) = (elem_type(output.dtype())?, nccl_op(op, output.dtype())?);
        let flats = inputs
            .iter()
            .map(|t| t.reshape([t.numel()]))
            .collect::<ember_tensor::Result<Vec<_>>>()
            .map_err(tensor_err)?;
        let refs: Vec<&Raw> = flats.iter().collect();
        let send = Raw::cat(&refs, 0).map_err(tensor_err)?;
        let n = output.numel();
        // The output is written whole: a fresh buffer unless it is contiguous.
        let recv = if output.is_contiguous() {
            output.clone()
        } else {
            Raw::empty(output.shape().clone(), (self.cuda(), output.dtype())).map_err(tensor_err)?
        };
        self.enqueue(&[&send], &[&recv], d, |r, w| {
            Ok(NcclCall::ReduceScatter {
                send: r[0].ptr,
                recv: w[0].ptr,
                count: n,
                dtype,
                op,
            })
        })?;
        if !recv.shares_storage(output) {
            output.copy_(&recv).map_err(tensor_err)?;
        }
        Ok(())
    }

    fn barrier(&self, d: Instant) -> std::result::Result<(), EngineError> {
        // As PyTorch's ProcessGroupNCCL: an all-reduce of one element.
        let one = Raw::zeros([1], (self.cuda(), DType::F32)).map_err(tensor_err)?;
        self.all_reduce(&one, ReduceOp::Sum, d)
    }

    /// Records an event after the enqueued work, makes `producer` wait for it, and polls it
    /// until done or `deadline` (then `keep` is leaked: Note [NCCL streams]).
    fn finish(
        &self,
        producer: Option<StreamHandle>,
        deadline: Instant,
        keep: Vec<Raw>,
    ) -> std::result::Result<(), EngineError> {
        let end = self.stream.record_event(false).map_err(dev_err)?;
        if let Some(p) = producer {
            self.driver
                .stream_wait_event(p, end.handle())
                .map_err(dev_err)?;
        }
        let r = poll_until(deadline, || end.query().map_err(dev_err));
        if matches!(r, Err(EngineError::TimedOut)) {
            std::mem::forget(keep);
            std::mem::forget(end);
        }
        r
    }

    /// Exchanges every rank's description of its call with a small NCCL all-gather and
    /// fails on every rank alike when they differ (as the mpi backend's check).
    fn check_inputs(
        &self,
        c: &Collective,
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        let mine = describe(c);
        let send = Raw::from_slice(&mine, [META], self.cuda()).map_err(tensor_err)?;
        let all = Raw::empty([META * self.size], (self.cuda(), DType::I64)).map_err(tensor_err)?;
        self.enqueue(&[&send], &[&all], deadline, |r, w| {
            Ok(NcclCall::AllGather {
                send: r[0].ptr,
                recv: w[0].ptr,
                count: META,
                dtype: NcclType::I64,
            })
        })?;
        self.finish(None, deadline, vec![send, all.clone()])?;
        let all = all.to_vec::<i64>().map_err(tensor_err)?;
        compare(&mine, &all)
    }
}

impl Engine for NcclEngine {
    fn rank_and_size(&self) -> (usize, usize) {
        (self.rank, self.size)
    }

    fn device(&self) -> Option<usize> {
        Some(self.device)
    }

    fn run(&mut self, c: &Collective, ctx: &RunCtx) -> std::result::Result<(), EngineError> {
        let _on_comm_stream = cuda::StreamGuard::new(&self.stream);
        let d = ctx.deadline;
        if ctx.check_inputs && self.size > 1 {
            self.check_inputs(c, d)?;
        }
        // The communication stream waits for the producing stream (Note [NCCL streams]).
        let producer = ctx.producer.unwrap_or(StreamHandle::DEFAULT);
        let ready = cuda::Event::new(self.device, false).map_err(dev_err)?;
        self.driver
            .event_record(ready.handle(), producer)
            .map_err(dev_err)?;
        self.stream.wait_event(&ready).map_err(dev_err)?;
        let issued = match c {
            Collective::AllReduce { tensor, op } => self.all_reduce(tensor, *op, d),
            Collective::Broadcast { tensor, src } => self.broadcast(tensor, *src, d),
            Collective::AllGather { outputs, input } => self.all_gather(outputs, input, d),
            Collective::ReduceScatter { output, inputs, op } => {
                self.reduce_scatter(output, inputs, *op, d)
            }
            Collective::Barrier => self.barrier(d),
        };
        if matches!(issued, Err(EngineError::TimedOut)) {
            std::mem::forget(tensors(c));
        }
        issued?;
        self.finish(Some(producer), d, tensors(c))
    }

    fn abort(&self) -> Option<Arc<Abort>> {
        let (driver, comm) = (self.driver.clone(), self.comm);
        // A failed abort leaves the communicator as it was; the group is broken either way.
        Some(Abort::new(move || {
            let _ = driver.nccl_comm_abort(comm);
        }))
    }

    fn finalize(self: Box<Self>) {
        // A failed destroy only leaks the communicator; the process goes on.
        let _ = self.stream.synchronize();
        let _ = self.driver.nccl_comm_destroy(self.comm);
    }
}
