//! The `nccl` backend's rendezvous on the calling thread (Note [NCCL rendezvous] in
//! `nccl.rs`, Note [Rendezvous barriers] in `rendezvous.rs`): connect to the store (serving
//! it on rank 0 unless `ember launch` does), wait for every rank there, hand the unique id
//! around, and after `ncclCommInitRank` meet once more; every wait ends at the group's
//! deadline with an error naming the ranks that never came.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_autograd::Result;
use ember_device::cuda;
use ember_device::driver::NcclUniqueId;

use super::UNIQUE_ID_KEY;
use super::nccl::{INIT, NcclSetup, Rendezvous};
use crate::error::distributed;
use crate::rendezvous::{Meeting, Members};
use crate::store::TcpStore;

/// Barrier: every rank reached the store.
const ARRIVED: &str = "init/arrived";
/// Set by each rank just before it calls `ncclCommInitRank`.
const JOINING: &str = "nccl/joining";
/// Barrier: every rank's `ncclCommInitRank` returned (the group's first barrier).
const JOINED: &str = "nccl/joined";

/// torchrun's flag for workers whose store is served by the agent (`ember launch`).
pub const AGENT_STORE_ENV: &str = "TORCHELASTIC_USE_AGENT_STORE";
/// torchrun's count of restarts so far; the agent store's keys carry it.
pub const RESTART_COUNT_ENV: &str = "TORCHELASTIC_RESTART_COUNT";

/// `true` when `ember launch` (or torchrun) serves the store (Note [Agent store]).
pub fn agent_store() -> bool {
    std::env::var(AGENT_STORE_ENV)
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

/// The key prefix of the workers of the launcher's attempt (torch's
/// `/worker/attempt_{TORCHELASTIC_RESTART_COUNT}`).
pub fn attempt_prefix() -> String {
    let n = std::env::var(RESTART_COUNT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    format!("/worker/attempt_{n}/")
}

/// Waits for every rank on the store, then hands the clique's id around: rank 0 makes it
/// with `make_id` and publishes it, the others read it.
pub(crate) fn exchange_id(
    meeting: &Meeting<'_>,
    make_id: impl FnOnce() -> Result<NcclUniqueId>,
) -> Result<NcclUniqueId> {
    meeting.barrier(ARRIVED, "reach the rendezvous store")?;
    let store = meeting.store;
    if meeting.rank == 0 {
        let id = make_id()?;
        store.set(UNIQUE_ID_KEY, &id.0)?;
        return Ok(id);
    }
    let Some(bytes) = store.wait_for(UNIQUE_ID_KEY, meeting.left())? else {
        return Err(meeting.late(&[0], "publish the NCCL unique id"));
    };
    let id: [u8; NcclUniqueId::BYTES] = bytes.as_slice().try_into().map_err(|_| {
        distributed(
            Some(meeting.rank),
            INIT,
            format!(
                "the store's {UNIQUE_ID_KEY:?} holds {} bytes, not an NCCL unique id of {} (is another program using MASTER_PORT?)",
                bytes.len(),
                NcclUniqueId::BYTES
            ),
        )
    })?;
    Ok(NcclUniqueId(id))
}

/// What a rank of an `nccl` group does on `store` before it calls `ncclCommInitRank`:
/// meet the others and read the clique's id (rank 0 makes it). For tests that play a rank
/// which dies right after reading the id.
#[doc(hidden)]
pub fn rendezvous_until_id(
    store: &TcpStore,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<NcclUniqueId> {
    let meeting = Meeting {
        store,
        rank,
        world,
        deadline: Instant::now() + timeout,
        timeout,
        op: INIT,
        who: Members::Ranks,
    };
    exchange_id(&meeting, || {
        cuda::driver()
            .and_then(|d| d.nccl_unique_id())
            .map_err(|e| distributed(Some(rank), INIT, format!("ncclGetUniqueId failed: {e}")))
    })
}

/// A rank that met the others and holds the clique's id, ready to join.
pub(crate) struct Joining {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) device: usize,
    pub(crate) id: NcclUniqueId,
    pub(crate) store: Option<Arc<TcpStore>>,
    pub(crate) deadline: Instant,
    timeout: Duration,
}

impl Joining {
    /// Meets the other ranks on the store and gets the clique's id (rank 0 makes it).
    pub(crate) fn meet(setup: NcclSetup) -> Result<Joining> {
        let NcclSetup {
            rank,
            size,
            device,
            rendezvous,
            timeout,
        } = setup;
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(u32::MAX.into()));
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            distributed(Some(rank), INIT, format!("{what}: {e}"))
        };
        let store = match rendezvous {
            None => None,
            Some(Rendezvous::Store(s)) => Some(s),
            Some(Rendezvous::Addr(host, port)) => {
                let agent = agent_store();
                let s = TcpStore::new(&host, port, rank == 0 && !agent, timeout)?;
                Some(Arc::new(if agent {
                    s.with_prefix(attempt_prefix())
                } else {
                    s
                }))
            }
        };
        let make_id = || {
            cuda::driver()
                .and_then(|d| d.nccl_unique_id())
                .map_err(|e| fail("ncclGetUniqueId failed", &e))
        };
        let Some(s) = store.as_deref() else {
            if size > 1 {
                return Err(distributed(
                    Some(rank),
                    INIT,
                    "no rendezvous store to get the NCCL id from",
                ));
            }
            return Ok(Joining {
                rank,
                size,
                device,
                id: make_id()?,
                store,
                deadline,
                timeout,
            });
        };
        let meeting = Meeting {
            store: s,
            rank,
            world: size,
            deadline,
            timeout,
            op: INIT,
            who: Members::Ranks,
        };
        let id = exchange_id(&meeting, make_id)?;
        meeting.mark(JOINING)?;
        Ok(Joining {
            rank,
            size,
            device,
            id,
            store,
            deadline,
            timeout,
        })
    }

    fn meeting(&self) -> Option<Meeting<'_>> {
        self.store.as_deref().map(|store| Meeting {
            store,
            rank: self.rank,
            world: self.size,
            deadline: self.deadline,
            timeout: self.timeout,
            op: INIT,
            who: Members::Ranks,
        })
    }

    /// The error when `ncclCommInitRank` did not return by the deadline: names the ranks
    /// that never called it (they read the id and died, or hang before it).
    pub(crate) fn init_late(&self) -> ember_autograd::Error {
        let missing = self
            .meeting()
            .and_then(|m| m.missing(JOINING).ok().map(|missing| (m, missing)));
        match missing {
            Some((m, missing)) if !missing.is_empty() => m.late(&missing, "call ncclCommInitRank"),
            _ => distributed(
                Some(self.rank),
                INIT,
                format!(
                    "ncclCommInitRank on cuda:{} did not return within {:?}, though every rank called it",
                    self.device, self.timeout
                ),
            ),
        }
    }

    /// The group's first barrier, after `ncclCommInitRank` returned on this rank.
    pub(crate) fn first_barrier(&self) -> Result<()> {
        match self.meeting() {
            Some(m) => m.barrier(JOINED, "join the NCCL communicator"),
            None => Ok(()),
        }
    }
}
