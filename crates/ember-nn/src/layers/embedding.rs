//! `Embedding`.

use ember_tensor::{Options, Tensor as Raw};

use super::float_options;
use crate::module::{check_device, parameter};
use crate::{Module, ModuleHooks, Result, Tensor, TrainingFlag};

/// A lookup table of `num_embeddings` vectors of size `embedding_dim`; the input is
/// integer indices of any shape.
#[derive(Debug, Module)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`, initialised from `N(0, 1)`.
    #[param]
    pub weight: Tensor,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Embedding {
    /// A table with standard-normal rows.
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options("Embedding", opts)?;
        let weight = parameter(Raw::randn(
            [num_embeddings, embedding_dim],
            (device, dtype),
        )?)?;
        Ok(Embedding {
            weight,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }
}

impl Module for Embedding {
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        check_device("Embedding", "weight", &self.weight, indices)?;
        self.weight.embedding(indices)
    }
    fn extra_repr(&self) -> String {
        let d = self.weight.dims();
        format!("{}, {}", d[0], d[1])
    }
}
