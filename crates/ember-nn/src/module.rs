//! The [`Module`] trait: `torch.nn.Module`'s parameters, buffers, children, device moves,
//! train/eval and `state_dict`.

use std::collections::BTreeMap;

use crate::{Result, Tensor};

/// Named tensors, as `state_dict()` returns them: parameters and buffers of a module by their
/// dotted names (`0.weight`), or an optimizer's state. Saveable with safetensors as is.
pub type StateDict = BTreeMap<String, Tensor>;

/// A layer or a model: `torch.nn.Module`.
pub trait Module: Send + Sync + std::fmt::Debug {
    /// The forward pass.
    fn forward(&self, input: &Tensor) -> Result<Tensor>;
}
