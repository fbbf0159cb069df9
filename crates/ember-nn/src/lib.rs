//! `torch.nn`, `torch.optim` and `torch.utils.data` for Ember.
//!
//! - [`Module`] and the layers in [`layers`], the losses in [`loss`], initialisers in [`init`];
//!   parameters and buffers are autograd [`Tensor`]s that `to(device)` moves in place, so
//!   everything holding them (an optimizer, a hook) follows.
//! - [`optim`]: `SGD`, `Adam`, `AdamW`, learning-rate schedulers, gradient clipping.
//! - [`data`]: `Dataset`, `TensorDataset`, `DataLoader`, and the shipped digits dataset.

mod error;

pub mod data;
pub mod functional;
pub mod init;
pub mod io;
pub mod layers;
pub mod loss;
mod module;
pub mod optim;

pub use ember_autograd::Tensor;
pub use error::{Error, ErrorKind, NnError, Result};
pub use loss::Loss;
pub use module::{
    IncompatibleKeys, Module, ModuleTarget, StateDict, TrainingFlag, check_device, checkpoint,
    parameter, prefix_error,
};
