//! The emulator's NCCL cliques: their members, the collectives deposited and run, and how
//! a clique ends (Note [Emulated NCCL] in `nccl.rs`). Shared by the driver calls of this
//! process and the threads serving ranks of other processes (Note [NCCL across processes]
//! in `nccl_net.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use super::memory::MemoryState;
use super::nccl::COLLECTIVE_TIMEOUT;
use super::nccl_net::Link;
use super::nccl_run::{RemoteBuffers, invalid, run};
use crate::driver::{Collective, NcclComm};
use crate::error::{DeviceError, Result};

/// Emulator instances, to keep one thread's group queue per emulator.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone, Copy)]
pub(super) struct CommState {
    pub(super) clique: u64,
    pub(super) rank: usize,
    pub(super) device: usize,
}

/// Why a clique can no longer run collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// This rank's communicator was aborted (`ncclCommAbort`).
    Aborted(usize),
    /// This rank's process closed its connection without destroying its communicator.
    Lost(usize),
}

/// A collective that ran: its outcome, the ranks yet to collect it, and the bytes the ranks
/// of other processes receive.
#[derive(Debug)]
pub(super) struct Done {
    pub(super) outcome: std::result::Result<(), DeviceError>,
    pub(super) left: usize,
    pub(super) outputs: HashMap<usize, Vec<u8>>,
}

#[derive(Debug, Default)]
pub(super) struct Clique {
    pub(super) nranks: usize,
    /// Ranks that joined (a rank's device), by rank.
    pub(super) members: BTreeMap<usize, usize>,
    /// The members in other processes (Note [NCCL across processes]).
    pub(super) remote: BTreeSet<usize>,
    /// How many ranks ever joined: the clique (and its unique id) is dropped only once all
    /// `nranks` joined and all left, so a rank that leaves before a slower one joins does
    /// not take the id away from it.
    pub(super) joined: usize,
    /// Per rank, the number of the next collective it issues.
    pub(super) issued: HashMap<usize, u64>,
    /// Collectives waiting for ranks: number → rank → call.
    pub(super) pending: BTreeMap<u64, BTreeMap<usize, Collective>>,
    /// The send buffers of remote ranks' pending calls: (number, rank) → bytes.
    pub(super) inputs: HashMap<(u64, usize), Vec<u8>>,
    /// Collectives that ran, by number.
    pub(super) done: HashMap<u64, Done>,
    /// Why the clique is unusable (an aborted communicator, a lost rank).
    pub(super) ended: Option<Ended>,
}

/// The error of `rank`'s call on a clique that ended as `how` says.
pub(super) fn clique_ended(call: &'static str, how: Ended, rank: usize) -> DeviceError {
    let why = match how {
        Ended::Aborted(by) => {
            format!("the communicator of rank {by} of this clique was aborted (ncclCommAbort)")
        }
        Ended::Lost(by) => format!(
            "rank {by} of this clique was lost: its process ended (or closed its connection) without destroying its communicator"
        ),
    };
    DeviceError::Driver {
        call,
        code: if matches!(how, Ended::Lost(_)) {
            "ncclRemoteError".into()
        } else {
            "ncclInvalidUsage".into()
        },
        detail: format!("{why}; rank {rank}'s collectives on the clique cannot complete"),
    }
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) next: u64,
    pub(super) comms: HashMap<u64, CommState>,
    /// Communicators of this process in cliques run by another process.
    pub(super) links: HashMap<u64, Arc<Link>>,
    pub(super) cliques: HashMap<u64, Clique>,
    /// Clique of a unique id made by `nccl_unique_id`.
    pub(super) ids: HashMap<u64, u64>,
    /// Communicators released by `nccl_comm_abort`, for a clear error on later use.
    pub(super) aborted: std::collections::HashSet<u64>,
}

impl State {
    pub(super) fn issue(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// The emulator's NCCL state (one per [`Emulator`]), shared with the threads that serve
/// the ranks of other processes.
#[derive(Debug)]
pub(crate) struct NcclShared {
    pub(super) instance: u64,
    pub(super) state: Mutex<State>,
    pub(super) ran: Condvar,
    pub(super) memory: Arc<Mutex<MemoryState>>,
    /// The listener for ranks of other processes, started with the first unique id.
    pub(super) hub: OnceLock<std::result::Result<(), String>>,
}

impl NcclShared {
    pub(super) fn new(memory: Arc<Mutex<MemoryState>>) -> NcclShared {
        NcclShared {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::default()),
            ran: Condvar::new(),
            memory,
            hub: OnceLock::new(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn mem(&self) -> MutexGuard<'_, MemoryState> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds rank `rank` on `device` to the clique of id `key` (`remote`: a rank of another
    /// process, Note [NCCL across processes]).
    pub(super) fn join(
        &self,
        key: u64,
        nranks: usize,
        rank: usize,
        device: usize,
        remote: bool,
    ) -> Result<CommState> {
        const CALL: &str = "ncclCommInitRank";
        if nranks == 0 || rank >= nranks {
            return Err(invalid(CALL, format!("rank {rank} is not in 0..{nranks}")));
        }
        let mut state = self.state();
        let clique = *state
            .ids
            .get(&key)
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
        // Devices of other processes are other (emulated) GPUs.
        let same_device = c
            .members
            .iter()
            .find(|&(r, &d)| d == device && !c.remote.contains(r));
        if let (false, Some((r, _))) = (remote, same_device) {
            return Err(invalid(
                CALL,
                format!(
                    "cuda:{device} is rank {r} of this clique already; rank {rank} needs another device"
                ),
            ));
        }
        c.members.insert(rank, device);
        if remote {
            c.remote.insert(rank);
        }
        c.joined += 1;
        Ok(CommState {
            clique,
            rank,
            device,
        })
    }

    /// Takes a released communicator's rank out of its clique (`ended`: and ends the
    /// clique for the others, waking them).
    pub(super) fn leave(&self, c: CommState, ended: Option<Ended>) {
        let mut state = self.state();
        if let (Some(how), Some(q)) = (ended, state.cliques.get_mut(&c.clique)) {
            q.ended.get_or_insert(how);
            q.pending.clear();
            q.inputs.clear();
        }
        release(&mut state, c);
        drop(state);
        self.ran.notify_all();
    }

    /// Deposit rank `c`'s call (with its send buffer's bytes when the rank is in another
    /// process); the rank that completes the collective runs it.
    pub(super) fn deposit(
        &self,
        c: CommState,
        op: &Collective,
        input: Option<Vec<u8>>,
    ) -> Result<Ticket> {
        let mut state = self.state();
        let clique = state
            .cliques
            .get_mut(&c.clique)
            .ok_or_else(|| invalid(op.call(), "the communicator's clique is gone".into()))?;
        if let Some(how) = clique.ended {
            return Err(clique_ended(op.call(), how, c.rank));
        }
        let number = {
            let n = clique.issued.entry(c.rank).or_insert(0);
            *n += 1;
            *n - 1
        };
        if let Some(bytes) = input {
            clique.inputs.insert((number, c.rank), bytes);
        }
        let calls = clique.pending.entry(number).or_default();
        calls.insert(c.rank, *op);
        if calls.len() == clique.nranks {
            let calls = clique.pending.remove(&number).unwrap_or_default();
            let mut remote = RemoteBuffers {
                ranks: Some(&clique.remote),
                ..RemoteBuffers::default()
            };
            for &r in &clique.remote {
                if let Some(b) = clique.inputs.remove(&(number, r)) {
                    remote.inputs.insert(r, b);
                }
            }
            let outcome = {
                let mut mem = self.mem();
                run(&mut mem, &calls, &clique.members, number, &mut remote)
            };
            let outputs = std::mem::take(&mut remote.outputs);
            clique.done.insert(
                number,
                Done {
                    outcome,
                    left: clique.nranks,
                    outputs,
                },
            );
            self.ran.notify_all();
        }
        Ok(Ticket {
            clique: c.clique,
            number,
            rank: c.rank,
        })
    }

    /// Wait until the ticket's collective ran; its outcome, with the bytes the ticket's
    /// rank receives when it is in another process.
    pub(super) fn wait(&self, t: Ticket) -> Result<Option<Vec<u8>>> {
        let deadline = Instant::now() + COLLECTIVE_TIMEOUT;
        let mut state = self.state();
        loop {
            let Some(clique) = state.cliques.get_mut(&t.clique) else {
                return Err(invalid(
                    "ncclGroupEnd",
                    "the communicator's clique was destroyed while a collective waited".into(),
                ));
            };
            if let Some(done) = clique.done.get_mut(&t.number) {
                let outcome = done.outcome.clone();
                let output = done.outputs.remove(&t.rank);
                done.left -= 1;
                if done.left == 0 {
                    clique.done.remove(&t.number);
                }
                return outcome.map(|()| output);
            }
            if let Some(how) = clique.ended {
                return Err(clique_ended("ncclCollective", how, t.rank));
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
                .ran
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A deposited call: which clique and which collective number to wait for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    pub(super) clique: u64,
    pub(super) number: u64,
    pub(super) rank: usize,
}

/// The state of a live communicator, or why there is none (unknown, or aborted).
pub(super) fn lookup(state: &State, call: &'static str, comm: NcclComm) -> Result<CommState> {
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
pub(super) fn release(state: &mut State, c: CommState) {
    let empty = state.cliques.get_mut(&c.clique).is_some_and(|q| {
        q.members.remove(&c.rank);
        q.members.is_empty() && q.joined >= q.nranks
    });
    if empty {
        state.cliques.remove(&c.clique);
        state.ids.retain(|_, clique| *clique != c.clique);
    }
}
