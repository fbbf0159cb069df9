//! [`Error`], the one error of every user-facing call, and [`AutogradError`], what the tape
//! and the backward engine report.
//!
//! Note [One error]: each crate keeps its own `thiserror` enum with structured fields
//! (`DeviceError`, `MemoryError`, `TensorError`, `AutogradError`, `NnError`, ...), but a user
//! meets one type: every op of the autograd [`Tensor`](crate::Tensor), every module, loss,
//! optimizer and data call returns [`Error`] (`ember::Error`). It holds the innermost
//! crate error (a `TensorError::Memory(MemoryError::OutOfMemory { .. })` is stored as the
//! `MemoryError`), classifies it once as an [`ErrorKind`] to match on, displays its message
//! unchanged, and hands out the detail with [`Error::downcast_ref`]. It lives here, the
//! lowest crate whose calls users make, so that `Module::forward` and tensor ops share it;
//! crates above convert their own enums into it with `From`.

use ember_device::{DeviceError, ErrorKind};
use ember_memory::MemoryError;
use ember_tensor::TensorError;

/// The error of every user-facing Ember call: one type to match on, whichever layer failed.
/// See Note [One error].
///
/// ```
/// use ember_autograd::{ErrorKind, Tensor};
/// use ember_tensor::Device;
/// let a = Tensor::zeros([2, 3], ())?;
/// let e = a.matmul(&Tensor::zeros([2, 3], ())?).unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::Shape);
/// assert!(!e.is_out_of_memory());
/// assert!(e.to_string().contains("cannot multiply"));
/// assert!(e.downcast_ref::<ember_tensor::TensorError>().is_some());
/// # Ok::<(), ember_autograd::Error>(())
/// ```
pub struct Error {
    kind: ErrorKind,
    inner: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl Error {
    /// An error of `kind` carrying `inner` (a crate's own error, or any error of the
    /// caller's), displayed as `inner` is.
    pub fn new(
        kind: ErrorKind,
        inner: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error {
            kind,
            inner: inner.into(),
        }
    }

    /// What kind of failure this is: the classification to match on.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// `true` when an allocation failed for lack of memory (on any device).
    pub fn is_out_of_memory(&self) -> bool {
        self.kind == ErrorKind::OutOfMemory
    }

    /// The crate error inside, if it is an `E` (`TensorError`, `AutogradError`, `NnError`,
    /// `MemoryError`, `DeviceError`, `std::io::Error`, ...): the innermost one, as Note
    /// [One error] says.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.inner.downcast_ref::<E>()
    }

    /// The crate error inside, by value, if it is an `E`; otherwise `self` back.
    pub fn downcast<E: std::error::Error + 'static>(self) -> std::result::Result<E, Self> {
        let kind = self.kind;
        self.inner
            .downcast::<E>()
            .map(|b| *b)
            .map_err(|inner| Error { kind, inner })
    }

    /// An [`ErrorKind::InvalidArgument`] error: `op: msg`.
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        AutogradError::Invalid {
            op,
            msg: msg.into(),
        }
        .into()
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The message first, as `unwrap()` and `main`'s `Err` print it.
        write!(f, "{} ({:?}: {:?})", self.inner, self.kind, self.inner)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for Error {
    /// The inner error's own source (an I/O error behind a file error, ...): `Error` is
    /// displayed as its inner error, so that error is not repeated as a cause.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        Error::new(e.kind(), e)
    }
}

impl From<MemoryError> for Error {
    fn from(e: MemoryError) -> Self {
        match e {
            MemoryError::Device(d) => d.into(),
            e => Error::new(e.kind(), e),
        }
    }
}

impl From<ember_kernels::KernelsError> for Error {
    fn from(e: ember_kernels::KernelsError) -> Self {
        match e {
            ember_kernels::KernelsError::Device(d) => d.into(),
            e => Error::new(e.kind(), e),
        }
    }
}

impl From<TensorError> for Error {
    fn from(e: TensorError) -> Self {
        match e {
            TensorError::Device(d) => d.into(),
            TensorError::Memory(m) => m.into(),
            TensorError::Kernels(k) => k.into(),
            e => Error::new(e.kind(), e),
        }
    }
}

impl From<AutogradError> for Error {
    fn from(e: AutogradError) -> Self {
        Error::new(e.kind(), e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::new(ErrorKind::Io, e)
    }
}

/// Errors of autograd itself (the graph, the engine, hooks, gradcheck). Tensor-level
/// failures are [`TensorError`]s, carried by [`Error`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AutogradError {
    /// A node's saved tensors were already freed by an earlier backward.
    #[error(
        "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph ({node}) are freed when you call backward() or autograd::grad(). Pass retain_graph = true if you need to backward through the graph a second time"
    )]
    GraphFreed {
        /// The node whose saved state is gone.
        node: &'static str,
    },
    /// A tensor a node saved for backward was modified in place afterwards.
    #[error(
        "one of the variables needed for gradient computation has been modified by an inplace operation: [{dtype} {shape}], which is saved by {node}, is at version {found}; expected version {expected} instead"
    )]
    ModifiedInplace {
        /// The node that saved the tensor.
        node: &'static str,
        /// The saved tensor's dtype.
        dtype: ember_tensor::DType,
        /// The saved tensor's shape.
        shape: ember_tensor::Shape,
        /// Its version when saved.
        expected: u64,
        /// Its version now.
        found: u64,
    },
    /// `backward()` without a gradient on a tensor with more than one element.
    #[error("grad can be implicitly created only for scalar outputs (got shape {shape})")]
    ImplicitGradNonScalar {
        /// The output's shape.
        shape: ember_tensor::Shape,
    },
    /// A tensor given to backward or `grad` that is not part of a graph.
    #[error(
        "{what} does not require grad and does not have a grad_fn (create it with requires_grad, or call requires_grad_() on a leaf)"
    )]
    NoGradFn {
        /// Which tensor, e.g. "element 0 of tensors".
        what: String,
    },
    /// `autograd::grad` input that the outputs do not depend on.
    #[error(
        "one of the differentiated tensors (input {index}) appears to not have been used in the graph; pass allow_unused = true if this is the desired behavior"
    )]
    UnusedInput {
        /// The input's position.
        index: usize,
    },
    /// A gradient whose shape, dtype or device does not fit the tensor it belongs to.
    #[error("{node}: {msg}")]
    BadGradient {
        /// The node (or hook) that produced it.
        node: &'static str,
        /// What was expected and what was found.
        msg: String,
    },
    /// An in-place op that autograd cannot record.
    #[error("{0}")]
    Inplace(String),
    /// A tensor made under `inference_mode` used where autograd must save it.
    #[error(
        "Inference tensors cannot be saved for backward ({node}). To work around this, make a clone outside inference_mode to get a normal tensor and use that in autograd"
    )]
    InferenceTensor {
        /// The node that wanted to save it.
        node: &'static str,
    },
    /// `gradcheck` found an analytical gradient that disagrees with finite differences.
    #[error("gradcheck: {0}")]
    Gradcheck(String),
    /// Something the caller asked for that is not valid (named in the message).
    #[error("{op}: {msg}")]
    Invalid {
        /// The call.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
}

/// `Result` with [`Error`]: what every user-facing call returns.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl AutogradError {
    pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        AutogradError::Invalid {
            op,
            msg: msg.into(),
        }
    }

    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            AutogradError::BadGradient { .. } | AutogradError::Invalid { .. } => {
                ErrorKind::InvalidArgument
            }
            _ => ErrorKind::Autograd,
        }
    }
}
