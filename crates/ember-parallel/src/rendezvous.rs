//! Barriers on the rendezvous store that name the ranks that never came.
//!
//! Note [Rendezvous barriers]: forming an `nccl` group waits for the other ranks three
//! times: to reach the store, to read NCCL's unique id, and to join the communicator. NCCL
//! itself gives no deadline (`ncclCommInitRank` blocks until every rank joined) and no name
//! for a rank that is missing, so the ranks also meet on the store, as torch's store-based
//! barrier does: each rank sets `NAME/RANK` and counts itself in `NAME/count`; the rank that
//! completes the count sets `NAME/done`, which the others wait for until the group's
//! deadline. A rank that gives up lists the ranks whose `NAME/RANK` is still unset: "rank 1
//! never arrived" is the answer to "which process do I look at". The barrier before the id
//! is the store's own rendezvous (every rank started and reached the store, torch's
//! `wait_for_workers`); the one after `ncclCommInitRank` is the group's first barrier, and a
//! rank that read the id and died before joining is named there (or, when NCCL blocks in
//! its init, by the keys each rank sets just before calling it: see `group/nccl.rs`).

use std::time::{Duration, Instant};

use ember_autograd::Result;

use crate::error::distributed;
use crate::store::TcpStore;

/// One rank's view of a rendezvous: its store, rank, world and deadline.
pub(crate) struct Meeting<'a> {
    pub(crate) store: &'a TcpStore,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// When every wait gives up.
    pub(crate) deadline: Instant,
    /// The timeout the deadline comes from, for messages.
    pub(crate) timeout: Duration,
    /// The operation errors are reported under (`init_process_group`).
    pub(crate) op: &'static str,
    /// What the members are: ranks, or the nodes of `ember launch`.
    pub(crate) who: Members,
}

/// What the members of a [`Meeting`] are, for its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Members {
    /// The ranks of a process group.
    Ranks,
    /// The nodes of a launch (one `ember launch` each).
    Nodes,
}

impl Members {
    /// "rank 1" / "ranks [1, 3]" (or nodes).
    pub(crate) fn phrase(self, ids: &[usize]) -> String {
        let (one, many) = match self {
            Members::Ranks => ("rank", "ranks"),
            Members::Nodes => ("node", "nodes"),
        };
        match ids {
            [r] => format!("{one} {r}"),
            _ => format!("{many} {ids:?}"),
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Members::Ranks => "ranks",
            Members::Nodes => "nodes",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Members::Ranks => {
                "and that every rank uses the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE"
            }
            Members::Nodes => {
                "with its own --node-rank, and that every node gives the same --nnodes, --master-addr, --master-port and --rdzv-id"
            }
        }
    }
}

impl Meeting<'_> {
    /// Time left until the deadline.
    pub(crate) fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Marks this rank as having reached `name` (the key [`Meeting::missing`] looks at).
    pub(crate) fn mark(&self, name: &str) -> Result<()> {
        self.store.set(&format!("{name}/{}", self.rank), b"1")
    }

    /// The ranks whose `{name}/{rank}` key is unset.
    pub(crate) fn missing(&self, name: &str) -> Result<Vec<usize>> {
        let mut missing = Vec::new();
        for r in 0..self.world {
            if !self.store.check(&[&format!("{name}/{r}")])? {
                missing.push(r);
            }
        }
        Ok(missing)
    }

    /// The error of a wait that gave up on the ranks `missing`, which failed to `what`.
    pub(crate) fn late(&self, missing: &[usize], what: &str) -> ember_autograd::Error {
        let arrived = self.world - missing.len();
        let rank = (self.who == Members::Ranks).then_some(self.rank);
        distributed(
            rank,
            self.op,
            format!(
                "timed out after {:?} waiting for {} to {what} ({arrived}/{} {} did): check that {} started and is alive, {}",
                self.timeout,
                self.who.phrase(missing),
                self.world,
                self.who.plural(),
                if missing.len() == 1 {
                    "it was"
                } else {
                    "they were"
                },
                self.who.hint()
            ),
        )
    }

    /// Waits until every rank reached barrier `name`, at most until the deadline; then
    /// fails naming the ranks that did not (Note [Rendezvous barriers]). `what` says what
    /// the missing ranks failed to do, for the message ("reach the rendezvous store").
    pub(crate) fn barrier(&self, name: &str, what: &str) -> Result<()> {
        self.mark(name)?;
        let count = self.store.add(&format!("{name}/count"), 1)?;
        let done = format!("{name}/done");
        if usize::try_from(count).is_ok_and(|c| c >= self.world) {
            return self.store.set(&done, b"1");
        }
        if self.store.wait_for(&done, self.left())?.is_some() {
            return Ok(());
        }
        Err(self.late(&self.missing(name)?, what))
    }
}
