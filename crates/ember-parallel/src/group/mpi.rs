//! The `mpi` backend: Open MPI's non-blocking collectives (`MPI_Iallreduce`, ...) on the
//! group's communication thread, polled until done or until the deadline (Note [Timeouts]).
//!
//! CPU tensors that are contiguous and of an MPI dtype are reduced in their own memory
//! (`MPI_IN_PLACE`); CUDA tensors, strided views and f16/bf16 (no MPI type; reduced in f32)
//! are staged through a host copy that is written back afterwards, as PyTorch's gloo does.
//! The only `unsafe` of the crate is here: the MPI calls, each over a buffer that outlives
//! the request (or is leaked with it when the request is abandoned).

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Instant;

use ember_autograd::{ErrorKind, Result};
use ember_tensor::{DType, Device, Tensor as Raw, WithDType};
use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::meta::{META, compare, describe};
use super::{
    Collective, Direct, Engine, EngineError, InitMethod, ReduceOp, RunCtx, env_usize, poll_until,
};
use crate::error::distributed;

// Note [Input check by messages]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Before each collective the ranks compare what they are about to do (Note [Timeouts]: the
// check is polled, so a rank that never comes is a timeout, not a hang). As a non-blocking
// all-gather (`MPI_Iallgather`, Open MPI's libnbc) it cost about as much as a small
// all-reduce itself; instead each rank posts one `MPI_Irecv` and one `MPI_Isend` of its
// 16-value description per peer, which Open MPI's point-to-point path delivers faster
// (`all_reduce_mpi_1kib`). The messages use the world communicator with a tag of their own
// (`CHECK_TAG`); MPI delivers the messages of one sender, tag and communicator in order, so
// the k-th check of every rank meets the k-th of every other. Each rank sends 2(n - 1)
// small messages per collective: fine for the single-node worlds `ember launch` starts; a
// world of hundreds of ranks would want a tree again.

/// The tag of the input check's messages (Note [Input check by messages]).
const CHECK_TAG: c_int = 0x3e_b0;

/// Open MPI's world on the communication thread.
pub(crate) struct MpiEngine {
    // Dropping the universe finalizes MPI; `None` never happens while serving.
    universe: Option<mpi::environment::Universe>,
    core: Arc<MpiCore>,
    /// MPI granted `MPI_THREAD_SERIALIZED` or more: any thread may call it, one at a time
    /// (Note [Collectives on the caller's thread]).
    serialized: bool,
}

/// The world's handle and what the collectives need, usable from any thread.
#[derive(Debug)]
pub(crate) struct MpiCore {
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// The library's `MPI_IN_PLACE` (a C macro the bindings cannot carry); `None` for a
    /// library we do not recognise, whose reductions then go through a send copy.
    in_place: Option<usize>,
}

// SAFETY: `comm` is MPI_COMM_WORLD's handle, a pointer to MPI's own object that lives until
// MPI_Finalize. MPI is called through it from the communication thread, and from a caller's
// thread only when MPI granted MPI_THREAD_SERIALIZED (`MpiEngine::direct`); every call is
// made under the group's execution lock, so calls never overlap, and none is made after
// finalizing (the group's queue is closed first, Note [Collectives on the caller's thread]).
unsafe impl Send for MpiCore {}
// SAFETY: as for `Send`: shared use is serialized by the group's execution lock.
unsafe impl Sync for MpiCore {}

/// `MPI_IN_PLACE` by implementation: Open MPI's `(void *) 1`, MPICH's `(void *) -1`, read
/// from `MPI_Get_library_version`.
fn in_place_sentinel() -> Option<usize> {
    let mut buf = vec![0u8; 8192];
    let mut len: c_int = 0;
    // SAFETY: `buf` is larger than MPI_MAX_LIBRARY_VERSION_STRING (256 in Open MPI, 8192 in
    // MPICH); MPI writes at most that many bytes and sets `len`.
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return None;
    }
    buf.truncate(usize::try_from(len).unwrap_or(0));
    let v = String::from_utf8_lossy(&buf);
    if v.contains("Open MPI") {
        Some(1)
    } else if v.contains("MPICH") {
        Some(usize::MAX)
    } else {
        None
    }
}

impl MpiEngine {
    /// The closure that initializes MPI on the communication thread.
    pub(crate) fn start(
        init: InitMethod,
    ) -> impl FnOnce() -> Result<Box<dyn Engine>> + Send + 'static {
        move || {
            let op = "init_process_group";
            let (universe, threading) =
                mpi::initialize_with_threading(mpi::Threading::Serialized).ok_or_else(|| {
                    distributed(
                        None,
                        op,
                        "MPI is already initialized or was finalized in this process (MPI can be initialized once per process)",
                    )
                })?;
            let world: SimpleCommunicator = universe.world();
            // SAFETY: `world` is MPI_COMM_WORLD of an initialized MPI; MPI_ERRORS_RETURN is
            // a predefined handler. Errors then come back as return codes, never an abort.
            unsafe {
                ffi::MPI_Comm_set_errhandler(world.as_raw(), ffi::RSMPI_ERRORS_RETURN);
            }
            let core = MpiCore {
                comm: world.as_raw(),
                rank: usize::try_from(world.rank()).unwrap_or(0),
                size: usize::try_from(world.size()).unwrap_or(1),
                in_place: in_place_sentinel(),
            };
            let engine = MpiEngine {
                universe: Some(universe),
                core: Arc::new(core),
                serialized: matches!(
                    threading,
                    mpi::Threading::Serialized | mpi::Threading::Multiple
                ),
            };
            if init == InitMethod::Env {
                // On a mismatch the universe is dropped (MPI finalized) with the error.
                engine.core.check_env()?;
            }
            Ok(Box::new(engine) as Box<dyn Engine>)
        }
    }
}

impl MpiCore {
    /// `WORLD_SIZE` and `RANK`, when set, must be MPI's.
    fn check_env(&self) -> Result<()> {
        let op = "init_process_group";
        if let Some(ws) = env_usize("WORLD_SIZE")?
            && ws != self.size
        {
            return Err(distributed(
                Some(self.rank),
                op,
                format!(
                    "WORLD_SIZE is {ws}, but MPI started {} process{}: start the ranks with `ember launch --nproc-per-node {ws}` or `mpirun -n {ws}` (processes started apart do not form one MPI world)",
                    self.size,
                    if self.size == 1 { "" } else { "es" }
                ),
            ));
        }
        if let Some(r) = env_usize("RANK")?
            && r != self.rank
        {
            return Err(distributed(
                Some(self.rank),
                op,
                format!(
                    "RANK is {r}, but MPI gave this process rank {} of {}",
                    self.rank, self.size
                ),
            ));
        }
        Ok(())
    }

    fn comm(&self) -> ffi::MPI_Comm {
        self.comm
    }
}

// --- element types -------------------------------------------------------------------------

/// A dtype MPI reduces natively.
trait Elem: Equivalence + WithDType + Copy + Default {
    /// MPI's op for `op`, or why there is none.
    fn mpi_op(op: ReduceOp) -> std::result::Result<ffi::MPI_Op, String> {
        // SAFETY: reading MPI's predefined op handles (link-time constants).
        Ok(unsafe {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
                ReduceOp::Max => ffi::RSMPI_MAX,
                ReduceOp::Min => ffi::RSMPI_MIN,
                ReduceOp::Product => ffi::RSMPI_PROD,
            }
        })
    }
    /// Divides each element by `n` (the `Avg` after a `Sum`).
    fn divide(buf: &mut [Self], n: usize);
}

macro_rules! elem_float {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn divide(buf: &mut [Self], n: usize) {
                let n = n as $t;
                buf.iter_mut().for_each(|x| *x /= n);
            }
        }
    )*};
}
elem_float!(f32, f64);

macro_rules! elem_int {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn divide(buf: &mut [Self], n: usize) {
                // Truncating, as NCCL's ncclAvg on integers.
                let n = <$t>::try_from(n).unwrap_or(<$t>::MAX);
                buf.iter_mut().for_each(|x| *x /= n);
            }
        }
    )*};
}
elem_int!(i64, i32, u8);

impl Elem for bool {
    fn mpi_op(op: ReduceOp) -> std::result::Result<ffi::MPI_Op, String> {
        // SAFETY: reading MPI's predefined op handles.
        unsafe {
            match op {
                ReduceOp::Sum | ReduceOp::Max => Ok(ffi::RSMPI_LOR),
                ReduceOp::Min | ReduceOp::Product => Ok(ffi::RSMPI_LAND),
                ReduceOp::Avg => Err("ReduceOp::Avg is not defined for bool tensors".into()),
            }
        }
    }
    fn divide(_: &mut [Self], _: usize) {}
}

/// The dtype a tensor is reduced in: its own, or f32 for f16/bf16 (no MPI type).
fn work_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::Bf16 => DType::F32,
        d => d,
    }
}

/// Runs `$body` with `$T` the Rust type of the work dtype `$d`.
macro_rules! typed {
    ($d:expr, $T:ident => $body:expr) => {
        match work_dtype($d) {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::Bool => {
                type $T = bool;
                $body
            }
            other => Err(EngineError::Invalid(
                ErrorKind::DType,
                format!("no MPI type for {other}"),
            )),
        }
    };
}

fn tensor_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Invalid(ErrorKind::InvalidArgument, e.to_string())
}

fn count(n: usize) -> std::result::Result<c_int, EngineError> {
    c_int::try_from(n).map_err(|_| {
        EngineError::Invalid(
            ErrorKind::InvalidArgument,
            format!(
                "{n} elements are more than one MPI call takes ({})",
                c_int::MAX
            ),
        )
    })
}

fn mpi_error(call: &str, rc: c_int) -> EngineError {
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds more than MPI_MAX_ERROR_STRING (256) bytes; MPI writes at most
    // that many and sets `len`.
    let got = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr().cast(), &mut len) };
    let text = if got == 0 {
        buf.truncate(usize::try_from(len).unwrap_or(0));
        String::from_utf8_lossy(&buf).into_owned()
    } else {
        format!("error code {rc}")
    };
    EngineError::Failed(format!("{call} failed: {text}"))
}

/// `true` when `t` can be handed to MPI as it is: a contiguous CPU tensor of an MPI dtype.
fn direct(t: &Raw) -> bool {
    t.device() == Device::Cpu && t.is_contiguous() && work_dtype(t.dtype()) == t.dtype()
}

/// A contiguous host copy of `t` in its work dtype, never sharing `t`'s storage.
fn host_copy(t: &Raw) -> std::result::Result<Raw, EngineError> {
    let h = t
        .to_device(Device::Cpu)
        .and_then(|h| h.to_dtype(work_dtype(t.dtype())))
        .and_then(|h| h.contiguous())
        .map_err(tensor_err)?;
    if h.shares_storage(t) {
        h.copy().map_err(tensor_err)
    } else {
        Ok(h)
    }
}

/// Writes `data` (in `out`'s work dtype) into `out`.
fn write_into<T: Elem>(out: &Raw, data: &[T]) -> std::result::Result<(), EngineError> {
    if direct(out) && out.dtype() == T::DTYPE {
        return out
            .with_cpu_slice_mut::<T, _>("mpi", |s| s.copy_from_slice(data))
            .map_err(tensor_err);
    }
    let src = Raw::from_slice(data, out.shape().clone(), Device::Cpu).map_err(tensor_err)?;
    out.copy_(&src).map(|_| ()).map_err(tensor_err)
}

impl MpiCore {
    /// Polls `req` until it completes or `deadline` passes. On a timeout the request is
    /// abandoned: the caller must leak the buffers it uses (Note [Timeouts]).
    fn wait(
        &self,
        req: &mut ffi::MPI_Request,
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        poll_until(deadline, || {
            let mut flag: c_int = 0;
            // SAFETY: `req` is a live request from a non-blocking call on this thread;
            // MPI_Test sets it to MPI_REQUEST_NULL when done; the status is ignored.
            let rc = unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                return Err(mpi_error("MPI_Test", rc));
            }
            Ok(flag != 0)
        })
    }

    /// Starts a non-blocking call (`start` fills the request) and waits for it.
    fn call(
        &self,
        name: &str,
        deadline: Instant,
        start: impl FnOnce(*mut ffi::MPI_Request) -> c_int,
    ) -> std::result::Result<(), EngineError> {
        // SAFETY: reading MPI's null request handle.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = start(&mut req);
        if rc != 0 {
            return Err(mpi_error(name, rc));
        }
        self.wait(&mut req, deadline)
    }

    fn all_reduce_slice<T: Elem>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> std::result::Result<(), EngineError> {
        let mpi_op = T::mpi_op(op).map_err(|m| EngineError::Invalid(ErrorKind::DType, m))?;
        let n = count(buf.len())?;
        let comm = self.comm();
        // Without a known MPI_IN_PLACE the input goes through a send copy.
        let copy: Vec<T> = if self.in_place.is_some() {
            Vec::new()
        } else {
            buf.to_vec()
        };
        let send = match self.in_place {
            Some(p) => p as *const c_void,
            None => copy.as_ptr().cast::<c_void>(),
        };
        // Note [Blocking all-reduce]: the blocking MPI_Allreduce, not MPI_Iallreduce:
        // Open MPI's non-blocking all-reduce (libnbc) is 2-3x slower than the blocking one
        // from 64 KiB up (measured from mpi4py on the same library; see the benchmark
        // records `all_reduce_mpi_*`), and the all-reduce carries DDP's gradients. PyTorch's
        // ProcessGroupMPI issues blocking calls on its worker thread as well. The timeout
        // then comes from `Work::wait`'s deadline alone (Note [Timeouts]): a rank whose peer
        // never joins keeps this thread inside MPI, and `buf` alive (the collective holds
        // its tensor), until the process ends. On a caller's thread there is no `Work::wait`:
        // there it runs only behind the polled input check (Note [Collectives on the
        // caller's thread]).
        // SAFETY: `buf` is `n` valid `T`s, borrowed (and so kept alive and unaliased) for
        // the whole call, and `send` is MPI_IN_PLACE or `copy` (`n` `T`s, alive as long).
        let rc = unsafe {
            ffi::MPI_Allreduce(
                send,
                buf.as_mut_ptr().cast::<c_void>(),
                n,
                T::equivalent_datatype().as_raw(),
                mpi_op,
                comm,
            )
        };
        drop(copy);
        if rc != 0 {
            return Err(mpi_error("MPI_Allreduce", rc));
        }
        if op == ReduceOp::Avg {
            T::divide(buf, self.size);
        }
        Ok(())
    }

    fn bcast_slice<T: Elem>(
        &self,
        buf: &mut [T],
        src: usize,
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        let n = count(buf.len())?;
        let root = count(src)?;
        let comm = self.comm();
        self.call("MPI_Ibcast", deadline, |req| {
            // SAFETY: `buf` is `n` valid `T`s, borrowed (and so kept alive and unaliased)
            // until `call` returns; on a timeout the caller leaks the storage behind `buf`.
            unsafe {
                ffi::MPI_Ibcast(
                    buf.as_mut_ptr().cast::<c_void>(),
                    n,
                    T::equivalent_datatype().as_raw(),
                    root,
                    comm,
                    req,
                )
            }
        })
    }

    /// Runs `f` on `t`'s elements in place: directly, or on a host copy written back.
    fn in_place<R>(
        &self,
        t: &Raw,
        f: impl FnOnce(&Raw) -> std::result::Result<R, EngineError>,
    ) -> std::result::Result<R, EngineError> {
        if direct(t) {
            let r = f(t);
            if matches!(r, Err(EngineError::TimedOut)) {
                // MPI may still write into this storage (see Note [Timeouts]).
                std::mem::forget(t.clone());
            }
            return r;
        }
        let h = host_copy(t)?;
        let r = f(&h);
        match r {
            Ok(r) => {
                t.copy_(&h).map_err(tensor_err)?;
                Ok(r)
            }
            Err(e) => {
                if matches!(e, EngineError::TimedOut) {
                    std::mem::forget(h);
                }
                Err(e)
            }
        }
    }

    fn all_reduce(
        &self,
        t: &Raw,
        op: ReduceOp,
        // A blocking call: `Work::wait`, or the input check before it, keeps the deadline
        // (Note [Blocking all-reduce]).
        _deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        self.in_place(t, |h| {
            typed!(h.dtype(), T => h
                .with_cpu_slice_mut::<T, _>("mpi:all_reduce", |s| self.all_reduce_slice(s, op))
                .map_err(tensor_err)?)
        })
    }

    fn broadcast(
        &self,
        t: &Raw,
        src: usize,
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        self.in_place(t, |h| {
            typed!(h.dtype(), T => h
                .with_cpu_slice_mut::<T, _>("mpi:broadcast", |s| self.bcast_slice(s, src, deadline))
                .map_err(tensor_err)?)
        })
    }

    fn all_gather(
        &self,
        outputs: &[Raw],
        input: &Raw,
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        typed!(input.dtype(), T => {
            let send: Vec<T> = input.to_vec::<T>().map_err(tensor_err)?;
            let n = send.len();
            let mut recv = vec![T::default(); n * self.size];
            let c = count(n)?;
            let comm = self.comm();
            let r = self.call("MPI_Iallgather", deadline, |req| {
                let dt = T::equivalent_datatype().as_raw();
                // SAFETY: `send` holds `n` and `recv` `n * size` valid `T`s, alive until
                // `call` returns (leaked below on a timeout).
                unsafe {
                    ffi::MPI_Iallgather(send.as_ptr().cast::<c_void>(), c, dt,
                        recv.as_mut_ptr().cast::<c_void>(), c, dt, comm, req)
                }
            });
            if let Err(e) = r {
                if matches!(e, EngineError::TimedOut) {
                    std::mem::forget(send);
                    std::mem::forget(recv);
                }
                return Err(e);
            }
            for (out, chunk) in outputs.iter().zip(recv.chunks(n.max(1))) {
                write_into::<T>(out, chunk)?;
            }
            Ok(())
        })
    }

    fn reduce_scatter(
        &self,
        output: &Raw,
        inputs: &[Raw],
        op: ReduceOp,
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        typed!(output.dtype(), T => {
            let mpi_op = T::mpi_op(op).map_err(|m| EngineError::Invalid(ErrorKind::DType, m))?;
            let mut send: Vec<T> = Vec::with_capacity(output.numel() * self.size);
            for t in inputs {
                send.extend(t.to_vec::<T>().map_err(tensor_err)?);
            }
            let n = output.numel();
            let mut recv = vec![T::default(); n];
            let c = count(n)?;
            let comm = self.comm();
            let r = self.call("MPI_Ireduce_scatter_block", deadline, |req| {
                let dt = T::equivalent_datatype().as_raw();
                // SAFETY: `send` holds `n * size` and `recv` `n` valid `T`s, alive until
                // `call` returns (leaked below on a timeout).
                unsafe {
                    ffi::MPI_Ireduce_scatter_block(send.as_ptr().cast::<c_void>(),
                        recv.as_mut_ptr().cast::<c_void>(), c, dt, mpi_op, comm, req)
                }
            });
            if let Err(e) = r {
                if matches!(e, EngineError::TimedOut) {
                    std::mem::forget(send);
                    std::mem::forget(recv);
                }
                return Err(e);
            }
            if op == ReduceOp::Avg {
                T::divide(&mut recv, self.size);
            }
            write_into::<T>(output, &recv)
        })
    }

    fn barrier(&self, deadline: Instant) -> std::result::Result<(), EngineError> {
        let comm = self.comm();
        // SAFETY: a barrier has no buffers.
        self.call("MPI_Ibarrier", deadline, |req| unsafe {
            ffi::MPI_Ibarrier(comm, req)
        })
    }

    // --- input checks ------------------------------------------------------------------

    /// Exchanges every rank's description of its call (Note [One communication thread]:
    /// same order everywhere, so this small all-gather pairs up) and fails on every rank
    /// alike when they differ.
    fn check_inputs(
        &self,
        c: &Collective,
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        let mine = describe(c);
        // Heap buffers: on a timeout they are leaked with the requests that still use them.
        let send = mine.to_vec();
        let mut all = vec![0i64; META * self.size];
        let r = self.exchange_p2p(&send, &mut all, deadline);
        if let Err(e) = r {
            // A request may still use the buffers (a timeout, or a failure after some
            // messages were posted).
            std::mem::forget(send);
            std::mem::forget(all);
            return Err(e);
        }
        compare(&mine, &all)
    }

    /// The input check's all-gather as point-to-point messages (Note [Input check by
    /// messages]): `all[rank]` is `send`, every other row comes from its rank.
    fn exchange_p2p(
        &self,
        send: &[i64],
        all: &mut [i64],
        deadline: Instant,
    ) -> std::result::Result<(), EngineError> {
        let comm = self.comm();
        let dt = i64::equivalent_datatype().as_raw();
        let me = self.rank * META;
        all[me..me + META].copy_from_slice(send);
        // SAFETY: reading MPI's null request handle.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut reqs = vec![null; 2 * (self.size - 1)];
        let peers = (0..self.size).filter(|&p| p != self.rank);
        for (k, peer) in peers.enumerate() {
            let row = &mut all[peer * META..(peer + 1) * META];
            let (recv_req, send_req): (*mut ffi::MPI_Request, *mut ffi::MPI_Request) =
                (&mut reqs[2 * k], &mut reqs[2 * k + 1]);
            // SAFETY: `row` is META i64s of `all` and `send` META i64s, both alive until the
            // requests complete (the caller leaks them on a timeout); the requests are
            // distinct slots of `reqs`; `peer` is a rank of the world other than this one.
            let rc = unsafe {
                ffi::MPI_Irecv(
                    row.as_mut_ptr().cast::<c_void>(),
                    META as c_int,
                    dt,
                    peer as c_int,
                    CHECK_TAG,
                    comm,
                    recv_req,
                )
            };
            if rc != 0 {
                std::mem::forget(reqs);
                return Err(mpi_error("MPI_Irecv", rc));
            }
            // SAFETY: as above.
            let rc = unsafe {
                ffi::MPI_Isend(
                    send.as_ptr().cast::<c_void>(),
                    META as c_int,
                    dt,
                    peer as c_int,
                    CHECK_TAG,
                    comm,
                    send_req,
                )
            };
            if rc != 0 {
                std::mem::forget(reqs);
                return Err(mpi_error("MPI_Isend", rc));
            }
        }
        let r = poll_until(deadline, || {
            let mut flag: c_int = 0;
            // SAFETY: `reqs` holds live requests of this thread (or null ones, which test as
            // done); MPI_Testall sets each to MPI_REQUEST_NULL when all are done.
            let rc = unsafe {
                ffi::MPI_Testall(
                    reqs.len() as c_int,
                    reqs.as_mut_ptr(),
                    &mut flag,
                    ffi::RSMPI_STATUSES_IGNORE,
                )
            };
            if rc != 0 {
                return Err(mpi_error("MPI_Testall", rc));
            }
            Ok(flag != 0)
        });
        if r.is_err() {
            // The requests still point into the buffers the caller leaks.
            std::mem::forget(reqs);
        }
        r
    }
}

impl Direct for MpiCore {
    /// Every collective, but the all-reduce (a blocking `MPI_Allreduce` that no deadline
    /// interrupts) only behind the input check (Note [Collectives on the caller's thread]).
    fn takes(&self, c: &Collective, check_inputs: bool) -> bool {
        check_inputs || !matches!(c, Collective::AllReduce { .. })
    }

    fn run(&self, c: &Collective, ctx: &RunCtx) -> std::result::Result<(), EngineError> {
        if ctx.check_inputs {
            self.check_inputs(c, ctx.deadline)?;
        }
        let d = ctx.deadline;
        match c {
            Collective::AllReduce { tensor, op } => self.all_reduce(tensor, *op, d),
            Collective::Broadcast { tensor, src } => self.broadcast(tensor, *src, d),
            Collective::AllGather { outputs, input } => self.all_gather(outputs, input, d),
            Collective::ReduceScatter { output, inputs, op } => {
                self.reduce_scatter(output, inputs, *op, d)
            }
            Collective::Barrier => self.barrier(d),
        }
    }
}

impl Engine for MpiEngine {
    fn rank_and_size(&self) -> (usize, usize) {
        (self.core.rank, self.core.size)
    }

    fn run(&mut self, c: &Collective, ctx: &RunCtx) -> std::result::Result<(), EngineError> {
        Direct::run(&*self.core, c, ctx)
    }

    fn direct(&self) -> Option<Arc<dyn Direct>> {
        self.serialized
            .then(|| self.core.clone() as Arc<dyn Direct>)
    }

    fn finalize(mut self: Box<Self>) {
        // Dropping the universe calls MPI_Finalize.
        drop(self.universe.take());
    }
}
