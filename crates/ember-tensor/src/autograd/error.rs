//! [`AutogradError`], what the tape and the backward engine report, and its conversion into
//! Ember's one [`Error`] (Note [One error] in `ember-error`).

use ember_error::ErrorKind;
pub use ember_error::{Error, Result};

impl From<AutogradError> for Error {
    fn from(e: AutogradError) -> Self {
        Error::new(e.kind(), e)
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
        dtype: crate::DType,
        /// The saved tensor's shape.
        shape: crate::Shape,
        /// Its version when saved.
        expected: u64,
        /// Its version now.
        found: u64,
    },
    /// `backward()` without a gradient on a tensor with more than one element.
    #[error("grad can be implicitly created only for scalar outputs (got shape {shape})")]
    ImplicitGradNonScalar {
        /// The output's shape.
        shape: crate::Shape,
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
