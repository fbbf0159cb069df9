//! The crate's error type.

use thiserror::Error;

/// Errors of device parsing, CUDA discovery and the driver seam.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum DeviceError {
    // --- parsing -------------------------------------------------------------------------
    /// A device string that is not `cpu`, `cuda` or `cuda:N`.
    #[error(
        "invalid device string {found:?}: expected \"cpu\", \"cuda\" or \"cuda:N\" with N a non-negative integer"
    )]
    Parse {
        /// The string that was given.
        found: String,
    },

    // --- discovery -----------------------------------------------------------------------
    /// CUDA was asked for but is not usable on this machine.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable {
        /// Why (no driver library, no device, driver too old, ...).
        reason: String,
    },
    /// A CUDA ordinal past the number of devices.
    #[error("invalid CUDA device index {index}: there {} {count} CUDA device{}", if *count == 1 { "is" } else { "are" }, if *count == 1 { "" } else { "s" })]
    InvalidIndex {
        /// The ordinal asked for.
        index: usize,
        /// How many devices exist.
        count: usize,
    },
    /// The emulator was asked for with a configuration that cannot be honoured.
    #[error("CUDA emulator: {0}")]
    Emulator(String),

    // --- driver calls --------------------------------------------------------------------
    /// A driver or library call failed; names the call and the driver's code.
    #[error("{call} failed: {code}{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    Driver {
        /// The call, e.g. `cuMemAlloc`.
        call: &'static str,
        /// The driver's status name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        code: String,
        /// Extra context; empty if none.
        detail: String,
    },
    /// The device has no memory left for a raw allocation of this size.
    #[error("CUDA out of memory on cuda:{device}: tried to allocate {bytes} bytes")]
    OutOfMemory {
        /// The ordinal.
        device: usize,
        /// Bytes requested.
        bytes: usize,
    },
    /// An operation that this driver does not offer.
    #[error("{what} is not supported by the {driver} driver")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// `real` or `emulator`.
        driver: &'static str,
    },
    /// A handle (pointer, stream, event, module, function) this driver never issued, or
    /// already released.
    #[error("{what}: invalid {kind} handle {handle:#x}")]
    InvalidHandle {
        /// The call that received it.
        what: &'static str,
        /// `device pointer`, `stream`, `event`, ...
        kind: &'static str,
        /// The raw value.
        handle: u64,
    },
}

impl DeviceError {
    /// Shorthand for a failed driver call.
    pub fn driver(call: &'static str, code: impl Into<String>) -> Self {
        DeviceError::Driver {
            call,
            code: code.into(),
            detail: String::new(),
        }
    }
}

impl DeviceError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            DeviceError::Parse { .. } | DeviceError::InvalidIndex { .. } => ErrorKind::Device,
            DeviceError::CudaUnavailable { .. } | DeviceError::Emulator(_) => ErrorKind::Device,
            DeviceError::Driver { .. } | DeviceError::InvalidHandle { .. } => ErrorKind::Driver,
            DeviceError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            DeviceError::Unsupported { .. } => ErrorKind::Unsupported,
        }
    }

    /// `true` when the device ran out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.kind() == ErrorKind::OutOfMemory
    }
}

pub use ember_error::ErrorKind;

impl From<DeviceError> for ember_error::Error {
    fn from(e: DeviceError) -> Self {
        ember_error::Error::new(e.kind(), e)
    }
}

/// Result alias of this crate.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;
