//! `Sequential`.

use crate::module::prefix_error;
use crate::{
    Module, ModuleHooks, ModuleParts, ReplicaMemo, Replicate, Result, Tensor, TrainingFlag,
};

/// Children run in order (`torch.nn.Sequential`); named `"0"`, `"1"`, ...
///
/// Implements [`ModuleParts`] by hand rather than with `#[derive(Module)]`: the derive
/// would name the layers after their field (`layers.0`), and PyTorch's `Sequential` names
/// them by position alone (`0.weight`).
#[derive(Debug, Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Sequential {
    /// An empty sequence (the identity).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a layer.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Module + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// Appends a boxed layer.
    pub fn push(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The layer at `index`.
    pub fn get(&self, index: usize) -> Option<&dyn Module> {
        self.layers.get(index).map(|b| b.as_ref())
    }
}

impl std::fmt::Display for Sequential {
    /// PyTorch's `print(model)`: `Sequential(\n  (0): Linear(...)\n  ...\n)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ModuleParts for Sequential {
    fn name(&self) -> &'static str {
        "Sequential"
    }
    fn as_module(&self) -> &dyn Module {
        self
    }
    fn named_children(&self) -> Vec<(String, &dyn Module)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), l.as_ref()))
            .collect()
    }
    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
    fn hooks(&self) -> Option<&ModuleHooks> {
        Some(&self.hooks)
    }
    fn replicate_boxed_with(&self, memo: &mut ReplicaMemo) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.replicate_with(memo)?))
    }
}

/// Each layer's replica (through its `replicate_boxed_with`), in order, with the flag and
/// the hooks copied (Note [Replicas of a module]).
impl Replicate for Sequential {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        Ok(Sequential {
            layers: self.layers.replicate_with(memo)?,
            training: self.training.clone(),
            hooks: self.hooks.clone(),
        })
    }
}

impl Module for Sequential {
    /// Each layer through its [`call`](Module::call) (so the layers' hooks run), in order.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            y = layer
                .call(&y)
                .map_err(|e| prefix_error(&i.to_string(), e))?;
        }
        Ok(y)
    }
}
