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

/// What kind of failure an error of any Ember crate is: the one classification users match
/// on, whichever layer the error came from (`ember::Error::kind()`, and `kind()` on every
/// crate's own error enum).
///
/// ```
/// use ember_device::{Device, ErrorKind};
/// let e = "gpu:0".parse::<Device>().unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::Device);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An allocation failed: the device (or the host) has no memory left for it.
    OutOfMemory,
    /// Tensors (or a module and its input) on two different devices.
    DeviceMismatch,
    /// A device that does not parse or does not exist, or CUDA that is unavailable.
    Device,
    /// Shapes that do not fit together (broadcasting, matrix products, views, element
    /// counts).
    Shape,
    /// A dtype an op does not take, or dtypes that disagree.
    DType,
    /// An index or a dimension out of range.
    Index,
    /// An argument outside what the call accepts (named in the message).
    InvalidArgument,
    /// A failure of the autograd graph (backward twice, a modified saved tensor, ...).
    Autograd,
    /// A `state_dict` whose keys or shapes do not match the module or optimizer.
    StateDict,
    /// Reading or writing a file failed, or a file is malformed.
    Io,
    /// A dataset or a sample that could not be read or collated.
    Data,
    /// A CUDA driver or library call failed.
    Driver,
    /// Something this build or driver does not offer.
    Unsupported,
    /// A collective failed or timed out, or a process group could not be formed (named
    /// with the rank and the operation).
    Distributed,
    /// Anything else.
    Other,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            ErrorKind::OutOfMemory => "out of memory",
            ErrorKind::DeviceMismatch => "device mismatch",
            ErrorKind::Device => "device",
            ErrorKind::Shape => "shape",
            ErrorKind::DType => "dtype",
            ErrorKind::Index => "index",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Autograd => "autograd",
            ErrorKind::StateDict => "state_dict",
            ErrorKind::Io => "i/o",
            ErrorKind::Data => "data",
            ErrorKind::Driver => "driver",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Distributed => "distributed",
            ErrorKind::Other => "other",
        };
        f.write_str(s)
    }
}

/// Result alias of this crate.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;
