//! `Flatten`.

use crate::{Module, ModuleHooks, Result, Tensor, TrainingFlag};

/// Flattens dimensions `start..=end` (by default all but the batch dimension).
#[derive(Debug, Clone, Module)]
pub struct Flatten {
    start: isize,
    end: isize,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Default for Flatten {
    fn default() -> Self {
        Self::dims(1, -1)
    }
}

impl Flatten {
    /// `Flatten(start_dim=1, end_dim=-1)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Flattens `start..=end` (negative dims count from the end).
    pub fn dims(start: isize, end: isize) -> Self {
        Flatten {
            start,
            end,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        }
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start, self.end)
    }
    fn extra_repr(&self) -> String {
        format!("start_dim={}, end_dim={}", self.start, self.end)
    }
}
