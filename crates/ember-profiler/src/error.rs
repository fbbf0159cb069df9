//! [`ProfilerError`]: what can go wrong while profiling or writing a trace.

use std::path::PathBuf;

/// An error of the profiler.
#[derive(Debug, thiserror::Error)]
pub enum ProfilerError {
    /// `profile` while another profiler records in this process.
    #[error(
        "profile: a profiler is already active in this process; stop it (or let it drop) before starting another"
    )]
    AlreadyActive,
    /// A call that needs a running profiler on one that has stopped.
    #[error("{op}: the profiler has stopped; call it between profile() and stop()")]
    Stopped {
        /// The call.
        op: &'static str,
    },
    /// A call that needs a finished trace while the profiler still records.
    #[error("{op}: the profiler is still running; call stop() first")]
    StillRunning {
        /// The call.
        op: &'static str,
    },
    /// A schedule that cannot run.
    #[error("schedule: {0}")]
    Schedule(String),
    /// A sort key the table does not know.
    #[error("table: unknown sort_by key {key:?}; expected one of: {}", valid.join(", "))]
    UnknownSortKey {
        /// What was asked.
        key: String,
        /// The keys it accepts.
        valid: Vec<&'static str>,
    },
    /// A file that could not be written.
    #[error("{op}: could not write {}: {source}", path.display())]
    Io {
        /// The call.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The trace handler given as `on_trace_ready` failed.
    #[error("on_trace_ready: {0}")]
    Handler(Box<ProfilerError>),
}

/// `Result` with [`ProfilerError`].
pub type Result<T, E = ProfilerError> = std::result::Result<T, E>;

impl ProfilerError {
    /// The kind it is carried as in Ember's one [`Error`](ember_error::Error).
    pub fn kind(&self) -> ember_device::ErrorKind {
        use ember_device::ErrorKind;
        match self {
            ProfilerError::Io { .. } => ErrorKind::Io,
            ProfilerError::Handler(inner) => inner.kind(),
            _ => ErrorKind::InvalidArgument,
        }
    }
}

impl From<ProfilerError> for ember_error::Error {
    fn from(e: ProfilerError) -> Self {
        ember_error::Error::new(e.kind(), e)
    }
}
