//! [`TensorError`], the crate's one error type.

use ember_device::Device;
use ember_memory::MemoryError;
use thiserror::Error;

use crate::dtype::DType;
use crate::shape::Shape;

/// Errors of tensor creation, views and ops. Messages follow PyTorch's wording where it
/// has one, prefixed with the op's name.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TensorError {
    // --- shapes --------------------------------------------------------------------------
    /// Two shapes that do not broadcast together.
    #[error("{op}: shapes {lhs} and {rhs} cannot be broadcast")]
    Broadcast {
        /// The op.
        op: &'static str,
        /// Left-hand shape.
        lhs: Shape,
        /// Right-hand shape.
        rhs: Shape,
    },
    /// A matrix product whose inner dimensions differ.
    #[error("{op}: cannot multiply {lhs} by {rhs}")]
    MatmulShape {
        /// The op.
        op: &'static str,
        /// Left-hand shape.
        lhs: Shape,
        /// Right-hand shape.
        rhs: Shape,
    },
    /// A shape whose element count does not match the data or the tensor.
    #[error("{op}: shape {shape} is invalid for input of size {numel}")]
    ElementCount {
        /// The op.
        op: &'static str,
        /// The requested shape (as written; may contain `-1` as a dim).
        shape: String,
        /// The number of elements available.
        numel: usize,
    },
    /// `view` on a tensor whose strides do not allow it.
    #[error(
        "view: view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces); use reshape instead"
    )]
    ViewStrides,
    /// Two or more shapes that disagree where an op needs them equal.
    #[error("{op}: {msg}")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// What disagrees, naming the shapes.
        msg: String,
    },

    // --- dims and indices ----------------------------------------------------------------
    /// A dimension index outside `[-rank, rank - 1]`.
    #[error(
        "{op}: dimension out of range (expected to be in range of [{min}, {max}], but got {dim})"
    )]
    DimOutOfRange {
        /// The op.
        op: &'static str,
        /// The dim as given.
        dim: isize,
        /// Lowest valid value (`-rank`, or -1 for a scalar).
        min: isize,
        /// Highest valid value (`rank - 1`, or 0 for a scalar).
        max: isize,
    },
    /// The same dim named twice.
    #[error("{op}: dim {dim} appears multiple times in the list of dims")]
    DuplicateDim {
        /// The op.
        op: &'static str,
        /// The repeated dim (normalised).
        dim: usize,
    },
    /// An index outside a dimension.
    #[error("{op}: index {index} is out of bounds for dimension {dim} with size {size}")]
    IndexOutOfRange {
        /// The op.
        op: &'static str,
        /// The index as given.
        index: i64,
        /// The dimension.
        dim: usize,
        /// The dimension's size.
        size: usize,
    },
    /// An argument outside what the op accepts (negative step, bad split sizes, ...).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What is wrong and what was expected.
        msg: String,
    },

    // --- dtypes --------------------------------------------------------------------------
    /// A tensor of one dtype where another was required.
    #[error("{op}: expected dtype {expected}, but found {found}")]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// The dtype needed.
        expected: DType,
        /// The dtype given.
        found: DType,
    },
    /// An op that has no kernel for this dtype.
    #[error("{op}: not implemented for {dtype}{}", if hint.is_empty() { String::new() } else { format!("; {hint}") })]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What to do instead; empty if nothing to add.
        hint: &'static str,
    },
    /// Indices of a non-integer dtype.
    #[error("{op}: expected indices of dtype torch.int64 or torch.int32, but found {found}")]
    IndexDType {
        /// The op.
        op: &'static str,
        /// The dtype given.
        found: DType,
    },
    /// An in-place op whose result dtype cannot be stored in the tensor.
    #[error("{op}: result type {result} can't be cast to the desired output type {output}")]
    InPlaceDType {
        /// The op.
        op: &'static str,
        /// The dtype the op computes.
        result: DType,
        /// The dtype of the written-to tensor.
        output: DType,
    },
    /// `item` on a tensor of other than one element.
    #[error("item: a Tensor with {numel} elements cannot be converted to Scalar")]
    NotOneElement {
        /// Elements in the tensor.
        numel: usize,
    },

    // --- in-place writes -----------------------------------------------------------------
    /// An in-place write into a view where several elements share memory (an expanded dim).
    #[error(
        "{op}: unsupported operation: more than one element of the written-to tensor refers to a single memory location; clone() the tensor before performing the operation"
    )]
    InPlaceOverlap {
        /// The op.
        op: &'static str,
    },

    // --- devices -------------------------------------------------------------------------
    /// Tensors of one op on two devices.
    #[error(
        "Expected all tensors to be on the same device, but found at least two devices, {first} and {second}!"
    )]
    DeviceMismatch {
        /// The first device seen.
        first: Device,
        /// The other device.
        second: Device,
    },
    /// CUDA was asked for but is unavailable on this machine.
    #[error("{op}: cannot use {device}: CUDA is not available: {reason}")]
    CudaUnavailable {
        /// The op.
        op: &'static str,
        /// The device asked for.
        device: Device,
        /// `ember_device::cuda::unavailable_reason()`.
        reason: String,
    },

    // --- files ---------------------------------------------------------------------------
    /// Reading or writing a tensor file failed: an I/O error, or a malformed file.
    #[error("{op} {}: {what}", path.display())]
    File {
        /// The operation (`save`, `load`).
        op: &'static str,
        /// The file (`<bytes>` for in-memory data).
        path: std::path::PathBuf,
        /// What went wrong, with what was expected and found.
        what: String,
        /// The kind of the I/O error, for I/O failures.
        io_kind: Option<std::io::ErrorKind>,
    },

    /// A device that does not parse or does not exist (from `ember-device`).
    #[error(transparent)]
    Device(#[from] ember_device::DeviceError),

    // --- memory --------------------------------------------------------------------------
    /// The allocator failed (out of memory, ...).
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A CUDA kernel could not be loaded or launched (including "this build has no CUDA
    /// kernels: run `cargo xtask kernels`" on a real GPU without the fatbin).
    #[error(transparent)]
    Kernels(#[from] ember_kernels::KernelsError),
    /// A size computation overflowed `usize`.
    #[error("{op}: tensor of shape {shape} is too large (element count overflows)")]
    TooLarge {
        /// The op.
        op: &'static str,
        /// The shape as written.
        shape: String,
    },
}

/// Into Ember's one error (Note [One error] in `ember-error`): the innermost error is
/// carried (a `TensorError::Memory(MemoryError::OutOfMemory { .. })` as the `MemoryError`).
impl From<TensorError> for ember_error::Error {
    fn from(e: TensorError) -> Self {
        match e {
            TensorError::Device(d) => d.into(),
            TensorError::Memory(m) => m.into(),
            TensorError::Kernels(k) => k.into(),
            e => ember_error::Error::new(e.kind(), e),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;

impl TensorError {
    /// The error for using CUDA device `device` where CUDA is unavailable, with the
    /// driver's reason.
    pub(crate) fn cuda_unavailable(op: &'static str, device: Device) -> TensorError {
        TensorError::CudaUnavailable {
            op,
            device,
            reason: ember_device::cuda::unavailable_reason()
                .map_or_else(|| "no usable driver".to_string(), |r| r.to_string()),
        }
    }

    /// What kind of failure this is (see [`ErrorKind`](ember_device::ErrorKind)).
    pub fn kind(&self) -> ember_device::ErrorKind {
        use ember_device::ErrorKind as K;
        match self {
            TensorError::Broadcast { .. }
            | TensorError::MatmulShape { .. }
            | TensorError::ElementCount { .. }
            | TensorError::ViewStrides
            | TensorError::ShapeMismatch { .. }
            | TensorError::NotOneElement { .. }
            | TensorError::TooLarge { .. } => K::Shape,
            TensorError::DimOutOfRange { .. }
            | TensorError::DuplicateDim { .. }
            | TensorError::IndexOutOfRange { .. } => K::Index,
            TensorError::InvalidArgument { .. } | TensorError::InPlaceOverlap { .. } => {
                K::InvalidArgument
            }
            TensorError::DTypeMismatch { .. }
            | TensorError::UnsupportedDType { .. }
            | TensorError::IndexDType { .. }
            | TensorError::InPlaceDType { .. } => K::DType,
            TensorError::DeviceMismatch { .. } => K::DeviceMismatch,
            TensorError::CudaUnavailable { .. } => K::Device,
            TensorError::File { .. } => K::Io,
            TensorError::Device(e) => e.kind(),
            TensorError::Memory(e) => e.kind(),
            TensorError::Kernels(e) => e.kind(),
        }
    }

    /// `true` when an allocation failed for lack of memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.kind() == ember_device::ErrorKind::OutOfMemory
    }

    pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        TensorError::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }

    pub(crate) fn unsupported(op: &'static str, dtype: DType) -> Self {
        TensorError::UnsupportedDType {
            op,
            dtype,
            hint: "",
        }
    }
}
