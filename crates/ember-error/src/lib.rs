//! Ember's one error, at the ground floor of the crate stack: [`Error`], its [`ErrorKind`],
//! and [`Result`].
//!
//! Note [One error]: each crate keeps its own `thiserror` enum with structured fields
//! (`DeviceError`, `MemoryError`, `TensorError`, `AutogradError`, `NnError`, ...), but a user
//! meets one type: every tensor op, module, loss, optimizer and data call returns [`Error`]
//! (`ember::Error`). It holds the innermost crate error (a `TensorError::Memory(
//! MemoryError::OutOfMemory { .. })` is stored as the `MemoryError`), classifies it once as
//! an [`ErrorKind`] to match on, displays its message unchanged, and hands out the detail
//! with [`Error::downcast_ref`]. It lives here, below every other crate, so that each crate
//! converts its own enum into it with `From` (written in that crate) and no crate depends on
//! another only for its error type.
//!
//! ```
//! use ember_error::{Error, ErrorKind};
//! let e = Error::invalid("conv2d", "expected stride > 0, found 0");
//! assert_eq!(e.kind(), ErrorKind::InvalidArgument);
//! assert_eq!(e.to_string(), "conv2d: expected stride > 0, found 0");
//! ```

use std::fmt;

/// What kind of failure an error of any Ember crate is: the one classification users match
/// on, whichever layer the error came from (`ember::Error::kind()`, and `kind()` on every
/// crate's own error enum).
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

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

/// The error of every user-facing Ember call: one type to match on, whichever layer failed.
/// See Note [One error].
pub struct Error {
    kind: ErrorKind,
    inner: Box<dyn std::error::Error + Send + Sync + 'static>,
}

/// `Result` with [`Error`]: what every user-facing call returns.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An argument a call does not accept: `op: msg` (what [`Error::invalid`] carries).
#[derive(Debug)]
pub struct InvalidArgument {
    /// The call.
    pub op: &'static str,
    /// What was expected and what was found.
    pub msg: String,
}

impl fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.msg)
    }
}

impl std::error::Error for InvalidArgument {}

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

    /// An [`ErrorKind::InvalidArgument`] error: `op: msg`.
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::new(
            ErrorKind::InvalidArgument,
            InvalidArgument {
                op,
                msg: msg.into(),
            },
        )
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
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The message first, as `unwrap()` and `main`'s `Err` print it.
        write!(f, "{} ({:?}: {:?})", self.inner, self.kind, self.inner)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for Error {
    /// The inner error's own source (an I/O error behind a file error, ...): `Error` is
    /// displayed as its inner error, so that error is not repeated as a cause.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::new(ErrorKind::Io, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_shows_its_inner_message_and_hands_it_back() {
        let e = Error::from(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no file x",
        ));
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(!e.is_out_of_memory());
        assert_eq!(e.to_string(), "no file x");
        assert!(format!("{e:?}").starts_with("no file x (Io: "));
        assert!(e.downcast_ref::<std::io::Error>().is_some());
        assert!(e.downcast_ref::<InvalidArgument>().is_none());
        let e = Error::invalid("op", "bad");
        assert_eq!(e.to_string(), "op: bad");
        let back = e.downcast::<InvalidArgument>().map(|i| i.op);
        assert_eq!(back.ok(), Some("op"));
        let e = Error::new(ErrorKind::OutOfMemory, "full");
        assert!(e.is_out_of_memory());
        assert_eq!(
            e.downcast::<std::io::Error>().err().map(|e| e.kind()),
            Some(ErrorKind::OutOfMemory)
        );
    }
}
