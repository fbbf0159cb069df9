//! [`NnError`]: what modules, optimizers and data loading report, carried by the one
//! [`Error`] (Note [One error] in `ember-error`).

pub use ember_autograd::{Error, ErrorKind};
use ember_tensor::Shape;

/// Errors of `ember-nn` itself. Every call of the crate returns [`Error`], which carries
/// these and the failures of the layers below.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NnError {
    /// A call with an argument that is not valid, named in the message.
    #[error("{op}: {msg}")]
    Invalid {
        /// The call, e.g. `Linear::new` or `SGD`.
        op: &'static str,
        /// What was expected and what was found.
        msg: String,
    },
    /// A layer's parameter and its input are on different devices.
    #[error(
        "Expected all tensors to be on the same device, but found at least two devices, {input_device} and {param_device}! ({module} parameter `{param}` is on {param_device}, its input on {input_device}; move the model and its input to one device with `to(device)`)"
    )]
    DeviceMismatch {
        /// The layer type, e.g. `Linear`.
        module: &'static str,
        /// The parameter's dotted name in the model (`0.weight`).
        param: String,
        /// Where the parameter is.
        param_device: ember_device::Device,
        /// Where the input is.
        input_device: ember_device::Device,
    },
    /// `load_state_dict` found keys it could not match (PyTorch's wording).
    #[error("Error(s) in loading state_dict for {module}:{}", state_dict_details(.missing, .unexpected, .mismatched))]
    StateDict {
        /// The module (or optimizer) the dict was loaded into.
        module: String,
        /// Keys the module has that the dict lacks.
        missing: Vec<String>,
        /// Keys the dict has that the module lacks.
        unexpected: Vec<String>,
        /// Keys whose shapes differ: (key, shape in the dict, shape in the module).
        mismatched: Vec<(String, Shape, Shape)>,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A dataset file that could not be parsed, with where and why.
    #[error("{0}")]
    Data(String),
}

impl From<NnError> for Error {
    fn from(e: NnError) -> Self {
        Error::new(e.kind(), e)
    }
}

impl NnError {
    /// An [`NnError::Invalid`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        NnError::Invalid {
            op,
            msg: msg.into(),
        }
    }

    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            NnError::Invalid { .. } => ErrorKind::InvalidArgument,
            NnError::DeviceMismatch { .. } => ErrorKind::DeviceMismatch,
            NnError::StateDict { .. } => ErrorKind::StateDict,
            NnError::Io { .. } => ErrorKind::Io,
            NnError::Data(_) => ErrorKind::Data,
        }
    }
}

fn state_dict_details(
    missing: &[String],
    unexpected: &[String],
    mismatched: &[(String, Shape, Shape)],
) -> String {
    let quoted = |keys: &[String]| {
        keys.iter()
            .map(|k| format!("\"{k}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    if !missing.is_empty() {
        out += &format!("\n\tMissing key(s) in state_dict: {}.", quoted(missing));
    }
    if !unexpected.is_empty() {
        out += &format!(
            "\n\tUnexpected key(s) in state_dict: {}.",
            quoted(unexpected)
        );
    }
    for (key, found, expected) in mismatched {
        out += &format!(
            "\n\tsize mismatch for {key}: copying a param with shape {found} from checkpoint, the shape in current model is {expected}."
        );
    }
    out
}

/// `Result` with the one [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
