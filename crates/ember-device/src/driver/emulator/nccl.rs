//! The emulator's NCCL: collectives among the emulated devices of one process.
//!
//! Note [Emulated NCCL]:
//!
//! A communicator is one rank of a clique. Cliques are made by `nccl_comm_init_all` (every
//! rank at once) or rank by rank with `nccl_comm_init_rank` from an id made by
//! `nccl_unique_id` (the id names this process and a clique number; an id from another
//! process is an error: emulated devices live in one process).
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
//! on any of the clique's communicators fails the same way. Real NCCL leaves the other
//! ranks to notice a dead peer on their own (or hang until their own abort); failing them
//! at once keeps a half-run collective from pairing with a later call of a rank that had
//! skipped it, and nothing in the emulator waits past an abort.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Emulator;
use super::nccl_run::{invalid, run};
use crate::driver::{Collective, DevicePtr, NcclComm, NcclUniqueId, StreamHandle};
use crate::error::{DeviceError, Result};

/// The NCCL version the emulator reports (2.23.4).
pub const EMULATED_NCCL_VERSION: i32 = 22304;

/// How long a rank waits for the other ranks of its clique to issue a collective.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(120);

const ID_MAGIC: &[u8; 8] = b"EMBEREMU";

/// Emulator instances, to keep one thread's group queue per emulator.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone, Copy)]
struct CommState {
    clique: u64,
    rank: usize,
    device: usize,
}

#[derive(Debug, Default)]
struct Clique {
    nranks: usize,
    /// Ranks that joined (a rank's device), by rank.
    members: BTreeMap<usize, usize>,
    /// How many ranks ever joined: the clique (and its unique id) is dropped only once all
    /// `nranks` joined and all left, so a rank that leaves before a slower one joins does
    /// not take the id away from it.
    joined: usize,
    /// Per rank, the number of the next collective it issues.
    issued: HashMap<usize, u64>,
    /// Collectives waiting for ranks: number → rank → call.
    pending: BTreeMap<u64, BTreeMap<usize, Collective>>,
    /// Collectives that ran: number → (outcome, ranks yet to collect it).
    done: HashMap<u64, (std::result::Result<(), DeviceError>, usize)>,
    /// The rank whose communicator was aborted (`nccl_comm_abort`): the clique is unusable.
    aborted_by: Option<usize>,
}

/// The error of `rank`'s call on a clique whose rank `by` aborted its communicator.
fn clique_aborted(call: &'static str, by: usize, rank: usize) -> DeviceError {
    DeviceError::Driver {
        call,
        code: "ncclInvalidUsage".into(),
        detail: format!(
            "the communicator of rank {by} of this clique was aborted (ncclCommAbort); rank {rank}'s collectives on the clique cannot complete"
        ),
    }
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    comms: HashMap<u64, CommState>,
    cliques: HashMap<u64, Clique>,
    /// Clique of a unique id made by `nccl_unique_id`.
    ids: HashMap<u64, u64>,
    /// Communicators released by `nccl_comm_abort`, for a clear error on later use.
    aborted: std::collections::HashSet<u64>,
}

impl State {
    fn issue(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// The emulator's NCCL state (one per [`Emulator`]).
#[derive(Debug)]
pub(crate) struct NcclShared {
    instance: u64,
    state: Mutex<State>,
    ran: Condvar,
}

impl Default for NcclShared {
    fn default() -> Self {
        NcclShared {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::default()),
            ran: Condvar::new(),
        }
    }
}

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

/// A deposited call: which clique and which collective number to wait for.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    clique: u64,
    number: u64,
    rank: usize,
}

impl Emulator {
    fn nccl_state(&self) -> MutexGuard<'_, State> {
        self.nccl.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn nccl_unique_id_impl(&self) -> Result<NcclUniqueId> {
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
        let pid = word(8..12) as u32;
        if pid != std::process::id() {
            return Err(DeviceError::Unsupported {
                what: format!(
                    "an NCCL communicator across processes (the unique id comes from process \
                     {pid}, this is process {}; emulated devices belong to one process)",
                    std::process::id()
                ),
                driver: "emulator",
            });
        }
        if word(12..20) != self.nccl.instance {
            return Err(invalid(
                CALL,
                "the unique id was made by another emulator instance".into(),
            ));
        }
        let mut state = self.nccl_state();
        let clique = *state
            .ids
            .get(&word(20..28))
            .ok_or_else(|| invalid(CALL, "unknown unique id".into()))?;
        let c = state.cliques.entry(clique).or_insert_with(|| Clique {
            nranks,
            ..Clique::default()
        });
        if c.nranks != nranks {
            return Err(invalid(
                CALL,
                format!(
                    "rank {rank} says the clique has {nranks} ranks, an earlier rank said {}",
                    c.nranks
                ),
            ));
        }
        if let Some(d) = c.members.get(&rank) {
            return Err(invalid(
                CALL,
                format!("rank {rank} joined the clique already (on cuda:{d})"),
            ));
        }
        if let Some((r, _)) = c.members.iter().find(|&(_, &d)| d == device) {
            return Err(invalid(
                CALL,
                format!(
                    "cuda:{device} is rank {r} of this clique already; rank {rank} needs another device"
                ),
            ));
        }
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
        Ok(NcclComm(h))
    }

    fn comm(&self, call: &'static str, comm: NcclComm) -> Result<CommState> {
        lookup(&self.nccl_state(), call, comm)
    }

    pub(super) fn nccl_comm_info_impl(&self, comm: NcclComm) -> Result<(usize, usize, usize)> {
        let c = self.comm("ncclCommCount", comm)?;
        let state = self.nccl_state();
        let nranks = state.cliques.get(&c.clique).map_or(0, |q| q.nranks);
        Ok((c.device, c.rank, nranks))
    }

    pub(super) fn nccl_comm_destroy_impl(&self, comm: NcclComm) -> Result<()> {
        let mut state = self.nccl_state();
        let c = lookup(&state, "ncclCommDestroy", comm)?;
        state.comms.remove(&comm.0);
        release(&mut state, c);
        Ok(())
    }

    pub(super) fn nccl_comm_abort_impl(&self, comm: NcclComm) -> Result<()> {
        let mut state = self.nccl_state();
        let c = lookup(&state, "ncclCommAbort", comm)?;
        state.comms.remove(&comm.0);
        state.aborted.insert(comm.0);
        if let Some(q) = state.cliques.get_mut(&c.clique) {
            q.aborted_by.get_or_insert(c.rank);
            q.pending.clear();
        }
        release(&mut state, c);
        // Wake every waiter: those of this clique find it aborted (or gone).
        self.nccl.ran.notify_all();
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
        for q in &batch {
            self.check_collective(q.comm, q.stream, &q.op)?;
        }
        let tickets = batch
            .iter()
            .map(|q| self.deposit(q.comm, &q.op))
            .collect::<Result<Vec<_>>>()?;
        let mut first_err = None;
        for t in tickets {
            if let Err(e) = self.wait(t)
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
        self.check_collective(comm, stream, op)?;
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
        let ticket = self.deposit(comm, op)?;
        self.wait(ticket)
    }

    /// Checks one rank's call on its own: the communicator, the stream's device, the root,
    /// and that the buffers this rank touches are memory of its device.
    fn check_collective(
        &self,
        comm: NcclComm,
        stream: StreamHandle,
        op: &Collective,
    ) -> Result<()> {
        let call = op.call();
        let c = self.comm(call, comm)?;
        if let Some(d) = self.stream_device(call, stream)?
            && d != c.device
        {
            return Err(invalid(
                call,
                format!(
                    "the communicator's rank {} is on cuda:{}, but the stream belongs to cuda:{d}",
                    c.rank, c.device
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
        let (send, recv) = buffer_sizes(op, c.rank, nranks);
        let mem = self.mem();
        for (name, ptr, n) in [("send", send.0, send.1), ("recv", recv.0, recv.1)] {
            let Some(n) = n else { continue };
            let b = bytes(n)?;
            if b == 0 {
                continue;
            }
            match super::device_of_address(ptr) {
                Some(d) if d == c.device => {}
                _ => {
                    return Err(invalid(
                        call,
                        format!(
                            "{name} buffer {ptr:?} of rank {} is not memory of cuda:{}",
                            c.rank, c.device
                        ),
                    ));
                }
            }
            mem.slice(call, ptr, b)?;
        }
        Ok(())
    }

    /// Deposit this rank's call; the rank that completes the collective runs it.
    fn deposit(&self, comm: NcclComm, op: &Collective) -> Result<Ticket> {
        let mut state = self.nccl_state();
        let c = *state.comms.get(&comm.0).ok_or(DeviceError::InvalidHandle {
            what: op.call(),
            kind: "NCCL communicator",
            handle: comm.0,
        })?;
        let clique = state
            .cliques
            .get_mut(&c.clique)
            .ok_or_else(|| invalid(op.call(), "the communicator's clique is gone".into()))?;
        if let Some(by) = clique.aborted_by {
            return Err(clique_aborted(op.call(), by, c.rank));
        }
        let number = {
            let n = clique.issued.entry(c.rank).or_insert(0);
            *n += 1;
            *n - 1
        };
        let calls = clique.pending.entry(number).or_default();
        calls.insert(c.rank, *op);
        if calls.len() == clique.nranks {
            let calls = clique.pending.remove(&number).unwrap_or_default();
            let outcome = {
                let mut mem = self.mem();
                run(&mut mem, &calls, &clique.members, number)
            };
            clique.done.insert(number, (outcome, clique.nranks));
            self.nccl.ran.notify_all();
        }
        Ok(Ticket {
            clique: c.clique,
            number,
            rank: c.rank,
        })
    }

    /// Wait until the ticket's collective ran; its outcome.
    fn wait(&self, t: Ticket) -> Result<()> {
        let deadline = Instant::now() + COLLECTIVE_TIMEOUT;
        let mut state = self.nccl_state();
        loop {
            let Some(clique) = state.cliques.get_mut(&t.clique) else {
                return Err(invalid(
                    "ncclGroupEnd",
                    "the communicator's clique was destroyed while a collective waited".into(),
                ));
            };
            if let Some((outcome, left)) = clique.done.get_mut(&t.number) {
                let outcome = outcome.clone();
                *left -= 1;
                if *left == 0 {
                    clique.done.remove(&t.number);
                }
                return outcome;
            }
            if let Some(by) = clique.aborted_by {
                return Err(clique_aborted("ncclCollective", by, t.rank));
            }
            let now = Instant::now();
            if now >= deadline {
                let arrived: Vec<usize> = clique
                    .pending
                    .get(&t.number)
                    .map(|m| m.keys().copied().collect())
                    .unwrap_or_default();
                let missing: Vec<usize> = (0..clique.nranks)
                    .filter(|r| !arrived.contains(r))
                    .collect();
                return Err(DeviceError::Driver {
                    call: "ncclCollective",
                    code: "ncclSystemError".into(),
                    detail: format!(
                        "rank {} waited {}s for collective #{} of ranks {missing:?}, which never \
                         issued it (one thread driving several devices must use \
                         nccl_group_start/nccl_group_end)",
                        t.rank,
                        COLLECTIVE_TIMEOUT.as_secs(),
                        t.number
                    ),
                });
            }
            state = self
                .nccl
                .ran
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The state of a live communicator, or why there is none (unknown, or aborted).
fn lookup(state: &State, call: &'static str, comm: NcclComm) -> Result<CommState> {
    if let Some(c) = state.comms.get(&comm.0) {
        return Ok(*c);
    }
    if state.aborted.contains(&comm.0) {
        return Err(DeviceError::Driver {
            call,
            code: "ncclInvalidUsage".into(),
            detail: format!(
                "NCCL communicator {:#x} was aborted (ncclCommAbort) and cannot be used",
                comm.0
            ),
        });
    }
    Err(DeviceError::InvalidHandle {
        what: call,
        kind: "NCCL communicator",
        handle: comm.0,
    })
}

/// Takes a released communicator's rank out of its clique, dropping the clique (and its
/// id) once every rank joined and left.
fn release(state: &mut State, c: CommState) {
    let empty = state.cliques.get_mut(&c.clique).is_some_and(|q| {
        q.members.remove(&c.rank);
        q.members.is_empty() && q.joined >= q.nranks
    });
    if empty {
        state.cliques.remove(&c.clique);
        state.ids.retain(|_, clique| *clique != c.clique);
    }
}

/// `((send, send elements), (recv, recv elements))` that `rank` touches; `None` for a buffer
/// the rank does not use.
fn buffer_sizes(
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
