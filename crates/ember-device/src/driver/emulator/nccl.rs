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

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use half::{bf16, f16};

use super::Emulator;
use super::memory::MemoryState;
use crate::driver::{
    Collective, DevicePtr, NcclComm, NcclType, NcclUniqueId, ReduceOp, StreamHandle,
};
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
    /// Per rank, the number of the next collective it issues.
    issued: HashMap<usize, u64>,
    /// Collectives waiting for ranks: number → rank → call.
    pending: BTreeMap<u64, BTreeMap<usize, Collective>>,
    /// Collectives that ran: number → (outcome, ranks yet to collect it).
    done: HashMap<u64, (std::result::Result<(), DeviceError>, usize)>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    comms: HashMap<u64, CommState>,
    cliques: HashMap<u64, Clique>,
    /// Clique of a unique id made by `nccl_unique_id`.
    ids: HashMap<u64, u64>,
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

fn invalid(call: &'static str, detail: String) -> DeviceError {
    DeviceError::Driver {
        call,
        code: "ncclInvalidArgument".into(),
        detail,
    }
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
        self.nccl_state()
            .comms
            .get(&comm.0)
            .copied()
            .ok_or(DeviceError::InvalidHandle {
                what: call,
                kind: "NCCL communicator",
                handle: comm.0,
            })
    }

    pub(super) fn nccl_comm_info_impl(&self, comm: NcclComm) -> Result<(usize, usize, usize)> {
        let c = self.comm("ncclCommCount", comm)?;
        let state = self.nccl_state();
        let nranks = state.cliques.get(&c.clique).map_or(0, |q| q.nranks);
        Ok((c.device, c.rank, nranks))
    }

    pub(super) fn nccl_comm_destroy_impl(&self, comm: NcclComm) -> Result<()> {
        let mut state = self.nccl_state();
        let c = state
            .comms
            .remove(&comm.0)
            .ok_or(DeviceError::InvalidHandle {
                what: "ncclCommDestroy",
                kind: "NCCL communicator",
                handle: comm.0,
            })?;
        let empty = state.cliques.get_mut(&c.clique).is_some_and(|q| {
            q.members.remove(&c.rank);
            q.members.is_empty()
        });
        if empty {
            state.cliques.remove(&c.clique);
            state.ids.retain(|_, clique| *clique != c.clique);
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

/// Values of one buffer: floats in f64, integers in i64.
#[derive(Debug, Clone)]
enum Values {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

fn decode(dtype: NcclType, bytes: &[u8]) -> Values {
    let f = Values::Float;
    match dtype {
        NcclType::F32 => f(bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect()),
        NcclType::F64 => f(bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()),
        NcclType::F16 => f(bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect()),
        NcclType::Bf16 => f(bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect()),
        NcclType::I8 => Values::Int(bytes.iter().map(|&b| i64::from(b as i8)).collect()),
        NcclType::U8 => Values::Int(bytes.iter().map(|&b| i64::from(b)).collect()),
        NcclType::I32 => Values::Int(
            bytes
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        NcclType::I64 => Values::Int(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
    }
}

fn encode(dtype: NcclType, values: &Values, out: &mut [u8]) {
    let size = dtype.size();
    match values {
        Values::Float(v) => {
            for (x, o) in v.iter().zip(out.chunks_exact_mut(size)) {
                match dtype {
                    NcclType::F32 => o.copy_from_slice(&(*x as f32).to_le_bytes()),
                    NcclType::F64 => o.copy_from_slice(&x.to_le_bytes()),
                    NcclType::F16 => o.copy_from_slice(&f16::from_f64(*x).to_le_bytes()),
                    NcclType::Bf16 => o.copy_from_slice(&bf16::from_f64(*x).to_le_bytes()),
                    // Integer types decode to `Values::Int`.
                    _ => {}
                }
            }
        }
        Values::Int(v) => {
            for (x, o) in v.iter().zip(out.chunks_exact_mut(size)) {
                match dtype {
                    NcclType::I8 | NcclType::U8 => o[0] = *x as u8,
                    NcclType::I32 => o.copy_from_slice(&(*x as i32).to_le_bytes()),
                    NcclType::I64 => o.copy_from_slice(&x.to_le_bytes()),
                    _ => {}
                }
            }
        }
    }
}

/// Reduce the ranks' values (in rank order) with `op`.
fn reduce(op: ReduceOp, inputs: &[Values]) -> Values {
    let n = inputs.len();
    match inputs.first() {
        Some(Values::Float(first)) => {
            let mut acc = first.clone();
            for v in &inputs[1..] {
                let Values::Float(v) = v else { continue };
                for (a, &x) in acc.iter_mut().zip(v) {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => *a + x,
                        ReduceOp::Prod => *a * x,
                        ReduceOp::Max => a.max(x),
                        ReduceOp::Min => a.min(x),
                    };
                }
            }
            if op == ReduceOp::Avg {
                acc.iter_mut().for_each(|a| *a /= n as f64);
            }
            Values::Float(acc)
        }
        Some(Values::Int(first)) => {
            let mut acc = first.clone();
            for v in &inputs[1..] {
                let Values::Int(v) = v else { continue };
                for (a, &x) in acc.iter_mut().zip(v) {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(x),
                        ReduceOp::Prod => a.wrapping_mul(x),
                        ReduceOp::Max => (*a).max(x),
                        ReduceOp::Min => (*a).min(x),
                    };
                }
            }
            if op == ReduceOp::Avg {
                acc.iter_mut().for_each(|a| *a /= n as i64);
            }
            Values::Int(acc)
        }
        None => Values::Float(Vec::new()),
    }
}

fn slice_of(v: &Values, start: usize, len: usize) -> Values {
    match v {
        Values::Float(x) => Values::Float(x[start..start + len].to_vec()),
        Values::Int(x) => Values::Int(x[start..start + len].to_vec()),
    }
}

/// Run collective `number` of a clique: `calls` holds every rank's call.
fn run(
    mem: &mut MemoryState,
    calls: &BTreeMap<usize, Collective>,
    members: &BTreeMap<usize, usize>,
    number: u64,
) -> std::result::Result<(), DeviceError> {
    let Some(first) = calls.values().next().copied() else {
        return Ok(());
    };
    let call = first.call();
    if let Some((rank, other)) = calls.iter().find(|(_, c)| !c.matches(&first)) {
        let issued: Vec<String> = calls
            .iter()
            .map(|(r, c)| {
                format!(
                    "rank {r} (cuda:{}): {}",
                    members.get(r).copied().unwrap_or(0),
                    c.describe()
                )
            })
            .collect();
        return Err(invalid(
            call,
            format!(
                "collective #{number}: ranks disagree (rank {rank} issued {}, rank 0 {}): {}",
                other.describe(),
                first.describe(),
                issued.join("; ")
            ),
        ));
    }
    let nranks = calls.len();
    let dtype = first.dtype();
    let size = dtype.size();
    let count = first.count();
    let read = |mem: &MemoryState, ptr: DevicePtr, n: usize| -> Result<Values> {
        Ok(decode(dtype, mem.slice(call, ptr, n * size)?))
    };
    // Read every input first, then write: in-place calls see the inputs.
    let mut writes: Vec<(DevicePtr, Values)> = Vec::new();
    match first {
        Collective::AllReduce { op, .. } => {
            let inputs = calls
                .values()
                .map(|c| match *c {
                    Collective::AllReduce { send, .. } => read(mem, send, count),
                    _ => unreachable_kind(call),
                })
                .collect::<Result<Vec<_>>>()?;
            let out = reduce(op, &inputs);
            for c in calls.values() {
                if let Collective::AllReduce { recv, .. } = *c {
                    writes.push((recv, out.clone()));
                }
            }
        }
        Collective::Broadcast { root, .. } => {
            let Some(Collective::Broadcast { send, .. }) = calls.get(&root).copied() else {
                return unreachable_kind(call);
            };
            let value = read(mem, send, count)?;
            for c in calls.values() {
                if let Collective::Broadcast { recv, .. } = *c {
                    writes.push((recv, value.clone()));
                }
            }
        }
        Collective::Reduce { op, root, .. } => {
            let inputs = calls
                .values()
                .map(|c| match *c {
                    Collective::Reduce { send, .. } => read(mem, send, count),
                    _ => unreachable_kind(call),
                })
                .collect::<Result<Vec<_>>>()?;
            if let Some(Collective::Reduce { recv, .. }) = calls.get(&root).copied() {
                writes.push((recv, reduce(op, &inputs)));
            }
        }
        Collective::AllGather { .. } => {
            let mut all = Vec::with_capacity(nranks);
            for c in calls.values() {
                if let Collective::AllGather { send, .. } = *c {
                    all.push(read(mem, send, count)?);
                }
            }
            let joined = match all.first() {
                Some(Values::Int(_)) => Values::Int(
                    all.iter()
                        .flat_map(|v| match v {
                            Values::Int(x) => x.clone(),
                            Values::Float(_) => Vec::new(),
                        })
                        .collect(),
                ),
                _ => Values::Float(
                    all.iter()
                        .flat_map(|v| match v {
                            Values::Float(x) => x.clone(),
                            Values::Int(_) => Vec::new(),
                        })
                        .collect(),
                ),
            };
            for c in calls.values() {
                if let Collective::AllGather { recv, .. } = *c {
                    writes.push((recv, joined.clone()));
                }
            }
        }
        Collective::ReduceScatter { op, .. } => {
            let inputs = calls
                .values()
                .map(|c| match *c {
                    Collective::ReduceScatter { send, .. } => read(mem, send, count * nranks),
                    _ => unreachable_kind(call),
                })
                .collect::<Result<Vec<_>>>()?;
            let out = reduce(op, &inputs);
            for (rank, c) in calls.iter() {
                if let Collective::ReduceScatter { recv, .. } = *c {
                    writes.push((recv, slice_of(&out, rank * count, count)));
                }
            }
        }
    }
    for (ptr, values) in writes {
        let n = match &values {
            Values::Float(v) => v.len(),
            Values::Int(v) => v.len(),
        };
        let out = mem.slice_mut(call, ptr, n * size)?;
        encode(dtype, &values, out);
    }
    Ok(())
}

/// Calls were checked to be of one kind before `run` reads them.
fn unreachable_kind<T>(call: &'static str) -> Result<T> {
    Err(invalid(call, "ranks issued different collectives".into()))
}
