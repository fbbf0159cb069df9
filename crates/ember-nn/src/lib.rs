//! `torch.nn`, `torch.optim` and `torch.utils.data` for Ember.
//!
//! - [`Module`] (with [`ModuleParts`], written by `#[derive(Module)]`) and the layers in
//!   [`layers`], the losses in [`loss`], initialisers in [`init`]; parameters and buffers
//!   are autograd [`Tensor`]s that `to(device)` moves in place, so everything holding them
//!   (an optimizer, a hook) follows; [`Replicate`] copies a module around new tensors.
//! - [`optim`]: `SGD`, `Adam`, `AdamW`, learning-rate schedulers, gradient clipping.
//! - [`data`]: `Dataset`, `TensorDataset`, `DataLoader`, and the shipped digits dataset.
//!
//! A model is a struct; `#[derive(Module)]` registers its fields as PyTorch registers
//! attributes, and the user writes `forward`:
//!
//! ```
//! use ember_nn::layers::{Linear, ReLU};
//! use ember_nn::{Module, Result, Tensor};
//!
//! #[derive(Debug, Module)]
//! struct Mlp {
//!     fc1: Linear,
//!     act: ReLU,
//!     fc2: Linear,
//! }
//!
//! impl Module for Mlp {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         self.fc2.call(&self.act.call(&self.fc1.call(x)?)?)
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! let model = Mlp {
//!     fc1: Linear::new(4, 8, ())?,
//!     act: ReLU::new(),
//!     fc2: Linear::new(8, 2, ())?,
//! };
//! let sd = model.state_dict()?;
//! let keys: Vec<&str> = sd.keys().map(String::as_str).collect();
//! assert_eq!(keys, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
//! assert_eq!(model.call(&Tensor::randn([3, 4], ())?)?.dims(), [3, 2]);
//! # Ok(()) }
//! ```

// The derive's generated code names this crate `::ember_nn`, also from inside it.
extern crate self as ember_nn;

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
pub use ember_derive::Module;
pub use error::{Error, ErrorKind, NnError, Result};
pub use loss::Loss;
pub use module::{
    ChildModules, ClonePlainField, DynReplicate, ForwardHook, ForwardPreHook, FromValue,
    HookHandle, IncompatibleKeys, Module, ModuleHooks, ModuleParts, ModuleTarget, ReplicaMemo,
    Replicate, StateDict, StateItem, TensorField, TrainingFlag, Value, check_device, checkpoint,
    parameter, prefix_error,
};

/// What `#[derive(Module)]`'s generated code names, at one path whichever crate re-exports
/// it (`::ember_nn::__derive`, `::ember::nn::__derive`). Not an API.
#[doc(hidden)]
pub mod __derive {
    pub use crate::{
        ChildModules, ClonePlainField, DynReplicate, Module, ModuleHooks, ModuleParts, ReplicaMemo,
        Replicate, Result, Tensor, TensorField, TrainingFlag,
    };
}
