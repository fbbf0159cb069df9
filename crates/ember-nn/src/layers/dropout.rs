//! `Dropout`.

use super::py_float;
use crate::{Module, ModuleHooks, NnError, Result, Tensor, TrainingFlag};

/// Zeroes elements with probability `p` in training, scaling the rest by `1/(1-p)`; the
/// identity in eval mode. Masks come from the device's default generator.
#[derive(Debug, Clone, Module)]
pub struct Dropout {
    p: f64,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`.
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            return Err(NnError::invalid(
                "Dropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            )
            .into());
        }
        Ok(Dropout {
            p,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.dropout(self.p, self.training.get())
    }
    fn extra_repr(&self) -> String {
        format!("p={}, inplace=False", py_float(self.p))
    }
}
