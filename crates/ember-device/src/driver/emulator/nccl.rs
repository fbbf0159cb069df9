//! The emulator's NCCL: collectives among the emulated devices of one process.
//!
//! Note [Emulated NCCL]:
//!
//! A communicator is one rank of a clique. Cliques are made by `nccl_comm_init_all` (every
//! rank at once) or rank by rank with `nccl_comm_init_rank` from an id made by
//! `nccl_unique_id` (the id names this process, the emulator instance and a clique number;
//! an id of another emulator instance of this process is an error). A rank of another
//! process joins through the id's process, which runs the clique (Note [NCCL across
//! processes] in `nccl_net.rs`).
//!
//! Each rank numbers the collectives it issues (0, 1, 2, ...). Issuing deposits the call
//! under its number in the clique; the rank that completes a number (the last of the
//! clique's ranks to issue it) checks that every rank issued the same collective (kind,
//! count, type, operator, root: a mismatch is an error returned to every rank, never
//! undefined behaviour) and runs it on the host over the emulated memory, under the memory
//! lock: all inputs are read before any output is written, so in-place calls are exact.
//! Values are reduced in f64 (integers in i64, wrapping as the device would) and rounded
//! once to the element type, in rank order.
//!
//! Stream order follows Note [Emulated streams]: work runs at enqueue time. A rank's call
//! returns when its collective has run, so everything enqueued on that rank's stream before
//! it is done when the collective reads, and everything enqueued after sees the result. A
//! rank outside a group therefore waits for the other ranks (other threads) to issue theirs,
//! as a blocked stream would; after [`COLLECTIVE_TIMEOUT`] it fails naming the ranks that
//! never came, instead of hanging. Inside `nccl_group_start`/`nccl_group_end` a thread's calls
//! are queued and deposited together at the outermost `nccl_group_end`, which then waits for
//! all of them: one thread can drive every device of a clique, as with real NCCL.
//!
//! `nccl_comm_abort` releases the communicator as `nccl_comm_destroy` does (a later use of
//! the handle is an error saying it was aborted) and aborts its whole clique: the calls
//! deposited and not yet run are dropped, every rank waiting for one of the clique's
//! collectives is woken with an error naming the rank that aborted, and a later collective
//! on any of the clique's communicators fails the same way. A rank of another process whose
//! connection closes without `nccl_comm_destroy` (its process died) ends the clique the
//! same way, the error naming it as lost. Real NCCL leaves the other
//! ranks to notice a dead peer on their own (or hang until their own abort); failing them
//! at once keeps a half-run collective from pairing with a later call of a rank that had
//! skipped it, and nothing in the emulator waits past an abort.

use std::cell::RefCell;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use super::Emulator;
use super::nccl_clique::{Clique, CommState, Ended, State, Ticket, lookup};
use super::nccl_net::{self, Link};
use super::nccl_run::invalid;
use crate::driver::{Collective, DevicePtr, NcclComm, NcclUniqueId, StreamHandle};
use crate::error::{DeviceError, Result};

/// The NCCL version the emulator reports (2.23.4).
pub const EMULATED_NCCL_VERSION: i32 = 22304;

/// How long a rank waits for the other ranks of its clique to issue a collective.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(120);

const ID_MAGIC: &[u8; 8] = b"EMBEREMU";

#[derive(Debug)]
struct Queued {
    instance: u64,
    comm: NcclComm,
    stream: StreamHandle,
    op: Collective,
}

#[derive(Debug, Default)]
struct Group {
    depth: usize,
    queued: Vec<Queued>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// A communicator of this process: a rank of a clique run here, or one run by another
/// process (Note [NCCL across processes]).
#[derive(Debug, Clone)]
enum Comm {
    Local(CommState),
    Remote(Arc<Link>),
}

impl Comm {
    fn device(&self) -> usize {
        match self {
            Comm::Local(c) => c.device,
            Comm::Remote(l) => l.device,
        }
    }

    fn rank(&self) -> usize {
        match self {
            Comm::Local(c) => c.rank,
            Comm::Remote(l) => l.rank,
        }
    }
}

/// A deposited call: a ticket of a clique run here, or a call sent to another process.
enum Deposited {
    Local(Ticket),
    Remote(Arc<Link>, Collective),
}

impl Emulator {
    fn nccl_state(&self) -> MutexGuard<'_, State> {
        self.nccl.state()
    }

    pub(super) fn nccl_unique_id_impl(&self) -> Result<NcclUniqueId> {
        // Ranks of other processes join through this process (Note [NCCL across processes]).
        if let Err(why) = self
            .nccl
            .hub
            .get_or_init(|| nccl_net::serve(self.nccl.clone()))
        {
            return Err(DeviceError::Driver {
                call: "ncclGetUniqueId",
                code: "ncclSystemError".into(),
                detail: why.clone(),
            });
        }
        let mut state = self.nccl_state();
        let clique = state.issue();
        let key = state.issue();
        state.ids.insert(key, clique);
        let mut id = [0u8; NcclUniqueId::BYTES];
        id[..8].copy_from_slice(ID_MAGIC);
        id[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        id[12..20].copy_from_slice(&self.nccl.instance.to_le_bytes());
        id[20..28].copy_from_slice(&key.to_le_bytes());
        Ok(NcclUniqueId(id))
    }

    pub(super) fn nccl_comm_init_all_impl(&self, devices: &[usize]) -> Result<Vec<NcclComm>> {
        const CALL: &str = "ncclCommInitAll";
        if devices.is_empty() {
            return Err(invalid(CALL, "no devices given".into()));
        }
        for (i, &d) in devices.iter().enumerate() {
            self.check_device(d)?;
            if devices[..i].contains(&d) {
                return Err(invalid(
                    CALL,
                    format!("cuda:{d} is listed twice in {devices:?}"),
                ));
            }
        }
        let mut state = self.nccl_state();
        let clique = state.issue();
        let mut c = Clique {
            nranks: devices.len(),
            ..Clique::default()
        };
        let mut comms = Vec::with_capacity(devices.len());
        for (rank, &device) in devices.iter().enumerate() {
            c.members.insert(rank, device);
            c.joined += 1;
            let h = state.issue();
            state.comms.insert(
                h,
                CommState {
                    clique,
                    rank,
                    device,
                },
            );
            comms.push(NcclComm(h));
        }
        state.cliques.insert(clique, c);
        Ok(comms)
    }

    pub(super) fn nccl_comm_init_rank_impl(
        &self,
        device: usize,
        nranks: usize,
        id: &NcclUniqueId,
        rank: usize,
    ) -> Result<NcclComm> {
        const CALL: &str = "ncclCommInitRank";
        self.check_device(device)?;
        if nranks == 0 || rank >= nranks {
            return Err(invalid(CALL, format!("rank {rank} is not in 0..{nranks}")));
        }
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&id.0[r]);
            u64::from_le_bytes(b)
        };
        if &id.0[..8] != ID_MAGIC {
            return Err(invalid(
                CALL,
                "the unique id was not made by the emulator's nccl_unique_id".into(),
            ));
        }
        let (pid, instance, key) = (word(8..12) as u32, word(12..20), word(20..28));
        if pid != std::process::id() {
            let link = Link::join(pid, instance, key, nranks, rank, device)?;
            let mut state = self.nccl_state();
            let h = state.issue();
            state.links.insert(h, Arc::new(link));
            return Ok(NcclComm(h));
        }
        if instance != self.nccl.instance {
            return Err(invalid(
                CALL,
                "the unique id was made by another emulator instance".into(),
            ));
        }
        let c = self.nccl.join(key, nranks, rank, device, false)?;
        let mut state = self.nccl_state();
        let h = state.issue();
        state.comms.insert(h, c);
        Ok(NcclComm(h))
    }

    fn comm(&self, call: &'static str, comm: NcclComm) -> Result<Comm> {
        let state = self.nccl_state();
        if let Some(l) = state.links.get(&comm.0) {
            return Ok(Comm::Remote(l.clone()));
        }
        lookup(&state, call, comm).map(Comm::Local)
    }

    pub(super) fn nccl_comm_info_impl(&self, comm: NcclComm) -> Result<(usize, usize, usize)> {
        match self.comm("ncclCommCount", comm)? {
            Comm::Remote(l) => Ok((l.device, l.rank, l.nranks)),
            Comm::Local(c) => {
                let state = self.nccl_state();
                let nranks = state.cliques.get(&c.clique).map_or(0, |q| q.nranks);
                Ok((c.device, c.rank, nranks))
            }
        }
    }

    pub(super) fn nccl_comm_destroy_impl(&self, comm: NcclComm) -> Result<()> {
        match self.comm("ncclCommDestroy", comm)? {
            Comm::Remote(l) => {
                self.nccl_state().links.remove(&comm.0);
                l.close(false);
            }
            Comm::Local(c) => {
                self.nccl_state().comms.remove(&comm.0);
                self.nccl.leave(c, None);
            }
        }
        Ok(())
    }

    pub(super) fn nccl_comm_abort_impl(&self, comm: NcclComm) -> Result<()> {
        let c = self.comm("ncclCommAbort", comm)?;
        {
            let mut state = self.nccl_state();
            state.comms.remove(&comm.0);
            state.links.remove(&comm.0);
            state.aborted.insert(comm.0);
        }
        match c {
            // Wakes this process's thread waiting on the link, and the clique's owner ends
            // the clique for the other ranks.
            Comm::Remote(l) => l.close(true),
            // Wake every waiter: those of this clique find it aborted (or gone).
            Comm::Local(c) => self.nccl.leave(c, Some(Ended::Aborted(c.rank))),
        }
        Ok(())
    }

    pub(super) fn nccl_group_start_impl(&self) -> Result<()> {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    }

    pub(super) fn nccl_group_end_impl(&self) -> Result<()> {
        let instance = self.nccl.instance;
        let batch = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return Err(DeviceError::Driver {
                    call: "ncclGroupEnd",
                    code: "ncclInvalidUsage".into(),
                    detail: "no group was started on this thread".into(),
                });
            }
            g.depth -= 1;
            if g.depth > 0 {
                return Ok(Vec::new());
            }
            let (mine, others): (Vec<_>, Vec<_>) =
                g.queued.drain(..).partition(|q| q.instance == instance);
            g.queued = others;
            Ok(mine)
        })?;
        if batch.is_empty() {
            return Ok(());
        }
        // Check every call before depositing any, so that a bad call does not leave the
        // clique's other ranks waiting for a partner that was never deposited.
        let comms = batch
            .iter()
            .map(|q| self.check_collective(q.comm, q.stream, &q.op))
            .collect::<Result<Vec<_>>>()?;
        let deposited = batch
            .iter()
            .zip(comms)
            .map(|(q, c)| self.deposit(c, &q.op))
            .collect::<Result<Vec<_>>>()?;
        let mut first_err = None;
        for d in deposited {
            if let Err(e) = self.collect(d)
                && first_err.is_none()
            {
                first_err = Some(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    pub(super) fn nccl_collective_impl(
        &self,
        comm: NcclComm,
        stream: StreamHandle,
        op: &Collective,
    ) -> Result<()> {
        let c = self.check_collective(comm, stream, op)?;
        let instance = self.nccl.instance;
        let queued = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth > 0 {
                g.queued.push(Queued {
                    instance,
                    comm,
                    stream,
                    op: *op,
                });
                true
            } else {
                false
            }
        });
        if queued {
            return Ok(());
        }
        let d = self.deposit(c, op)?;
        self.collect(d)
    }

    /// Checks one rank's call on its own: the communicator, the stream's device, the root,
    /// and that the buffers this rank touches are memory of its device.
    fn check_collective(
        &self,
        comm: NcclComm,
        stream: StreamHandle,
        op: &Collective,
    ) -> Result<Comm> {
        let call = op.call();
        let c = self.comm(call, comm)?;
        let (device, rank) = (c.device(), c.rank());
        if let Some(d) = self.stream_device(call, stream)?
            && d != device
        {
            return Err(invalid(
                call,
                format!(
                    "the communicator's rank {rank} is on cuda:{device}, but the stream belongs to cuda:{d}"
                ),
            ));
        }
        let nranks = self.nccl_comm_info_impl(comm)?.2;
        if let Some(root) = op.root()
            && root >= nranks
        {
            return Err(invalid(call, format!("root {root} is not in 0..{nranks}")));
        }
        let size = op.dtype().size();
        let bytes = |n: usize| {
            n.checked_mul(size)
                .ok_or_else(|| invalid(call, format!("{n} elements overflow")))
        };
        let (send, recv) = buffer_sizes(op, rank, nranks);
        let mem = self.mem();
        for (name, ptr, n) in [("send", send.0, send.1), ("recv", recv.0, recv.1)] {
            let Some(n) = n else { continue };
            let b = bytes(n)?;
            if b == 0 {
                continue;
            }
            match super::device_of_address(ptr) {
                Some(d) if d == device => {}
                _ => {
                    return Err(invalid(
                        call,
                        format!(
                            "{name} buffer {ptr:?} of rank {rank} is not memory of cuda:{device}"
                        ),
                    ));
                }
            }
            mem.slice(call, ptr, b)?;
        }
        Ok(c)
    }

    /// Deposits this rank's call: in its clique here, or sent (with the send buffer's
    /// bytes) to the process that runs the clique.
    fn deposit(&self, c: Comm, op: &Collective) -> Result<Deposited> {
        match c {
            Comm::Local(c) => self.nccl.deposit(c, op, None).map(Deposited::Local),
            Comm::Remote(l) => {
                let (send, _) = buffer_sizes(op, l.rank, l.nranks);
                let input = match send.1 {
                    Some(n) if n > 0 => {
                        let mem = self.mem();
                        mem.slice(op.call(), send.0, n * op.dtype().size())?
                            .to_vec()
                    }
                    _ => Vec::new(),
                };
                l.send(op, &input)?;
                Ok(Deposited::Remote(l, *op))
            }
        }
    }

    /// Waits for a deposited call to run; a rank of a remote clique writes what it
    /// received into its recv buffer.
    fn collect(&self, d: Deposited) -> Result<()> {
        match d {
            Deposited::Local(t) => self.nccl.wait(t).map(|_| ()),
            Deposited::Remote(l, op) => {
                let out = l.receive(op.call())?;
                let (_, recv) = buffer_sizes(&op, l.rank, l.nranks);
                match recv.1 {
                    Some(n) if n > 0 => {
                        let b = n * op.dtype().size();
                        if out.len() != b {
                            return Err(invalid(
                                op.call(),
                                format!(
                                    "the clique's process sent {} bytes for rank {}, expected {b}",
                                    out.len(),
                                    l.rank
                                ),
                            ));
                        }
                        self.mem()
                            .slice_mut(op.call(), recv.0, b)?
                            .copy_from_slice(&out);
                        Ok(())
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

/// `((send, send elements), (recv, recv elements))` that `rank` touches; `None` for a buffer
/// the rank does not use.
pub(super) fn buffer_sizes(
    op: &Collective,
    rank: usize,
    nranks: usize,
) -> ((DevicePtr, Option<usize>), (DevicePtr, Option<usize>)) {
    let big = |n: usize| n.saturating_mul(nranks);
    match *op {
        Collective::AllReduce {
            send, recv, count, ..
        } => ((send, Some(count)), (recv, Some(count))),
        Collective::Broadcast {
            send,
            recv,
            count,
            root,
            ..
        } => ((send, (rank == root).then_some(count)), (recv, Some(count))),
        Collective::Reduce {
            send,
            recv,
            count,
            root,
            ..
        } => ((send, Some(count)), (recv, (rank == root).then_some(count))),
        Collective::AllGather {
            send, recv, count, ..
        } => ((send, Some(count)), (recv, Some(big(count)))),
        Collective::ReduceScatter {
            send, recv, count, ..
        } => ((send, Some(big(count))), (recv, Some(count))),
    }
}
