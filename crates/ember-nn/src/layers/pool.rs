//! `MaxPool2d`, `AvgPool2d`.

use ember_tensor::{AvgPool2dOptions, MaxPool2dOptions, Size2};

use crate::{Module, ModuleHooks, Result, Tensor, TrainingFlag};

/// 2-D max pooling (`torch.nn.MaxPool2d`).
#[derive(Debug, Clone, Module)]
pub struct MaxPool2d {
    #[module(skip)]
    opts: MaxPool2dOptions,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl MaxPool2d {
    /// Pooling with a `kernel` (stride defaults to the kernel size).
    pub fn new(kernel: impl Into<Size2>) -> Self {
        Self::with_options(MaxPool2dOptions::new(kernel))
    }

    /// Pooling with all of PyTorch's options.
    pub fn with_options(opts: MaxPool2dOptions) -> Self {
        MaxPool2d {
            opts,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        }
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(&self.opts)
    }
    fn extra_repr(&self) -> String {
        let k = self.opts.kernel;
        let s = self.opts.stride.unwrap_or(k);
        format!(
            "kernel_size=({}, {}), stride=({}, {}), padding=({}, {})",
            k.0, k.1, s.0, s.1, self.opts.padding.0, self.opts.padding.1
        )
    }
}

/// 2-D average pooling (`torch.nn.AvgPool2d`).
#[derive(Debug, Clone, Module)]
pub struct AvgPool2d {
    #[module(skip)]
    opts: AvgPool2dOptions,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl AvgPool2d {
    /// Pooling with a `kernel` (stride defaults to the kernel size).
    pub fn new(kernel: impl Into<Size2>) -> Self {
        Self::with_options(AvgPool2dOptions::new(kernel))
    }

    /// Pooling with all of PyTorch's options.
    pub fn with_options(opts: AvgPool2dOptions) -> Self {
        AvgPool2d {
            opts,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(&self.opts)
    }
    fn extra_repr(&self) -> String {
        let k = self.opts.kernel;
        let s = self.opts.stride.unwrap_or(k);
        format!("kernel_size=({}, {}), stride=({}, {})", k.0, k.1, s.0, s.1)
    }
}
