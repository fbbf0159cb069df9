//! The crate's error types: [`MemoryError`] for callers, [`RawAllocError`] at the raw
//! allocator edge.

use std::fmt;

use ember_device::{Device, DeviceError, ErrorKind};
use thiserror::Error;

use crate::stats::format_size;

/// Failure of a [`crate::RawAllocator`] call.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RawAllocError {
    /// The device (or host) has no memory left for this request.
    #[error("out of memory")]
    OutOfMemory,
    /// Anything else, with the underlying message.
    #[error("{0}")]
    Other(String),
}

impl From<DeviceError> for RawAllocError {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::OutOfMemory { .. } => RawAllocError::OutOfMemory,
            other => RawAllocError::Other(other.to_string()),
        }
    }
}

/// A per-process memory fraction in force when an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FractionLimit {
    /// The fraction given to `set_per_process_memory_fraction`.
    pub fraction: f64,
    /// The cap it sets on reserved memory, in bytes.
    pub bytes: u64,
}

/// The clauses of an out-of-memory message (PyTorch's), each dropping out when its facts are
/// unknown.
#[allow(clippy::too_many_arguments)]
fn oom_message(
    f: &mut fmt::Formatter<'_>,
    device: &Device,
    requested: u64,
    total: &Option<u64>,
    free: &Option<u64>,
    allocated: u64,
    reserved_unallocated: u64,
    fraction_limit: &Option<FractionLimit>,
) -> fmt::Result {
    let (kind, unit) = match device {
        Device::Cpu => ("cpu".to_string(), "The host".to_string()),
        Device::Cuda(i) => ("CUDA".to_string(), format!("GPU {i}")),
    };
    write!(
        f,
        "{kind} out of memory. Tried to allocate {}.",
        format_size(requested)
    )?;
    match (total, free) {
        (Some(total), Some(free)) => write!(
            f,
            " {unit} has a total capacity of {} of which {} is free.",
            format_size(*total),
            format_size(*free)
        )?,
        (Some(total), None) => write!(
            f,
            " {unit} has a total capacity of {}.",
            format_size(*total)
        )?,
        _ => {}
    }
    if let Some(limit) = fraction_limit {
        write!(
            f,
            " Ember may reserve at most {} (set_per_process_memory_fraction({})).",
            format_size(limit.bytes),
            limit.fraction
        )?;
    }
    write!(
        f,
        " Of the allocated memory {} is allocated by Ember, and {} is reserved by Ember but \
         unallocated. If reserved but unallocated memory is large, call `empty_cache`; \
         otherwise try a smaller batch size",
        format_size(allocated),
        format_size(reserved_unallocated)
    )?;
    if fraction_limit.is_some() {
        write!(
            f,
            ", or raise the limit set with `set_per_process_memory_fraction`"
        )?;
    }
    Ok(())
}

/// Display adapter for [`MemoryError::OutOfMemory`].
struct OomDisplay<'a>(&'a MemoryError);

impl fmt::Display for OomDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            MemoryError::OutOfMemory {
                device,
                requested,
                total,
                free,
                allocated,
                reserved_unallocated,
                fraction_limit,
            } => oom_message(
                f,
                device,
                *requested,
                total,
                free,
                *allocated,
                *reserved_unallocated,
                fraction_limit,
            ),
            _ => Ok(()),
        }
    }
}

/// Errors of the caching allocator and the memory statistics calls.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum MemoryError {
    // --- allocation ----------------------------------------------------------------------
    /// No memory for the request, even after freeing every cached segment. The message is
    /// PyTorch's: what was requested, the capacity, what is free, allocated and reserved.
    #[error("{}", OomDisplay(self))]
    OutOfMemory {
        /// Device the allocation was for.
        device: Device,
        /// Bytes of the segment the allocator tried to take from the raw allocator.
        requested: u64,
        /// The device's total capacity, if the raw allocator knows it.
        total: Option<u64>,
        /// Free bytes on the device as the raw allocator reports them, if it knows.
        free: Option<u64>,
        /// Bytes in live allocations of this allocator (`allocated_bytes.all.current`).
        allocated: u64,
        /// Bytes reserved by this allocator but not allocated (cached, or split off).
        reserved_unallocated: u64,
        /// The memory fraction in force, if one was set and the total is known.
        fraction_limit: Option<FractionLimit>,
    },
    /// The raw allocator failed for a reason other than running out of memory.
    #[error("{device}: {op} of {bytes} bytes failed: {message}")]
    Raw {
        /// Device of the allocator.
        device: Device,
        /// `allocate`, `deallocate`, `record_event`, ...
        op: &'static str,
        /// Size involved (0 where none).
        bytes: u64,
        /// The raw allocator's message.
        message: String,
    },

    // --- configuration -------------------------------------------------------------------
    /// A memory fraction outside `0..=1` (or NaN).
    #[error("invalid memory fraction {fraction}: expected a value in 0..=1")]
    InvalidFraction {
        /// The value given.
        fraction: f64,
    },

    // --- devices -------------------------------------------------------------------------
    /// The device does not exist or CUDA is unavailable (the message says which and why).
    #[error(transparent)]
    Device(#[from] DeviceError),

    // --- output --------------------------------------------------------------------------
    /// A snapshot or history could not be serialised.
    #[error("cannot serialise {what} as JSON: {message}")]
    Serialize {
        /// `snapshot` or `history`.
        what: &'static str,
        /// serde_json's message.
        message: String,
    },
}

/// Into Ember's one error (Note [One error] in `ember-error`): a device error is carried as
/// itself, the innermost error.
impl From<MemoryError> for ember_error::Error {
    fn from(e: MemoryError) -> Self {
        match e {
            MemoryError::Device(d) => d.into(),
            e => ember_error::Error::new(e.kind(), e),
        }
    }
}

impl MemoryError {
    /// `true` for [`MemoryError::OutOfMemory`] (and a device's own out-of-memory).
    pub fn is_out_of_memory(&self) -> bool {
        self.kind() == ErrorKind::OutOfMemory
    }

    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            MemoryError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            MemoryError::Raw { .. } => ErrorKind::Driver,
            MemoryError::InvalidFraction { .. } => ErrorKind::InvalidArgument,
            MemoryError::Device(e) => e.kind(),
            MemoryError::Serialize { .. } => ErrorKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn oom() -> MemoryError {
        MemoryError::OutOfMemory {
            device: Device::Cuda(0),
            requested: 20 * MIB,
            total: Some(1024 * MIB),
            free: Some(3 * MIB),
            allocated: 900 * MIB,
            reserved_unallocated: 20 * MIB,
            fraction_limit: None,
        }
    }

    #[test]
    fn oom_message_reads_like_pytorch() {
        assert_eq!(
            oom().to_string(),
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of \
             1.00 GiB of which 3.00 MiB is free. Of the allocated memory 900.00 MiB is allocated \
             by Ember, and 20.00 MiB is reserved by Ember but unallocated. If reserved but \
             unallocated memory is large, call `empty_cache`; otherwise try a smaller batch size"
        );
        assert!(oom().is_out_of_memory());
    }

    #[test]
    fn oom_clauses_drop_out_and_fraction_appears() {
        let mut e = oom();
        if let MemoryError::OutOfMemory {
            device,
            total,
            free,
            ..
        } = &mut e
        {
            *device = Device::Cpu;
            *total = None;
            *free = None;
        }
        let msg = e.to_string();
        assert!(msg.starts_with("cpu out of memory. Tried to allocate 20.00 MiB. Of the"));
        assert!(!msg.contains("capacity"));
        let mut e = oom();
        if let MemoryError::OutOfMemory { fraction_limit, .. } = &mut e {
            *fraction_limit = Some(FractionLimit {
                fraction: 0.5,
                bytes: 512 * MIB,
            });
        }
        let msg = e.to_string();
        assert!(msg.contains("at most 512.00 MiB (set_per_process_memory_fraction(0.5))"));
        assert!(msg.ends_with("raise the limit set with `set_per_process_memory_fraction`"));
    }

    #[test]
    fn invalid_fraction_names_value() {
        let msg = MemoryError::InvalidFraction { fraction: 1.5 }.to_string();
        assert_eq!(
            msg,
            "invalid memory fraction 1.5: expected a value in 0..=1"
        );
    }
}
