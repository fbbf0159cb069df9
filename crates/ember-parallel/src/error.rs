//! [`DistError`]: what a process group, a collective, the rendezvous store or the launcher
//! reports, carried in the one [`Error`] of Ember (Note [One error] in `ember-error`).

use ember_autograd::{Error, ErrorKind};

/// A distributed failure: the rank it happened on (when known), the operation, and what
/// went wrong. Displayed as `rank R: OP: MSG`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistError {
    /// The rank that reports the failure (`None` before a rank is known).
    pub rank: Option<usize>,
    /// The operation, named as PyTorch's profiler names it (`mpi:all_reduce`,
    /// `init_process_group`, `TCPStore.get`, ...).
    pub op: String,
    /// What was wrong and what to do.
    pub msg: String,
}

impl std::fmt::Display for DistError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rank {
            Some(r) => write!(f, "rank {r}: {}: {}", self.op, self.msg),
            None => write!(f, "{}: {}", self.op, self.msg),
        }
    }
}

impl std::error::Error for DistError {}

/// An [`Error`] of `kind` carrying a [`DistError`].
pub(crate) fn dist_error(
    kind: ErrorKind,
    rank: Option<usize>,
    op: impl Into<String>,
    msg: impl Into<String>,
) -> Error {
    Error::new(
        kind,
        DistError {
            rank,
            op: op.into(),
            msg: msg.into(),
        },
    )
}

/// An [`ErrorKind::Distributed`] error.
pub(crate) fn distributed(
    rank: Option<usize>,
    op: impl Into<String>,
    msg: impl Into<String>,
) -> Error {
    dist_error(ErrorKind::Distributed, rank, op, msg)
}
