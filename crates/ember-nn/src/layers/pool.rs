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
    /// `nn.MaxPool2d(kernel_size)`: stride the kernel size, no padding, dilation 1, floor
    /// mode; PyTorch's keyword arguments are builder methods:
    /// `MaxPool2d::new(3).stride(2).padding(1)` is `nn.MaxPool2d(3, stride=2, padding=1)`.
    ///
    /// ```
    /// use ember_nn::layers::MaxPool2d;
    /// use ember_nn::{Module, Tensor};
    /// let pool = MaxPool2d::new(3).stride(2).padding(1);
    /// assert_eq!(pool.call(&Tensor::randn([1, 2, 8, 8], ())?)?.dims(), [1, 2, 4, 4]);
    /// assert_eq!(pool.to_string(), "MaxPool2d(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))");
    /// # Ok::<(), ember_nn::Error>(())
    /// ```
    pub fn new(kernel: impl Into<Size2>) -> Self {
        Self::with_options(MaxPool2dOptions::new(kernel))
    }

    /// `stride=`: a number or a pair.
    pub fn stride(mut self, stride: impl Into<Size2>) -> Self {
        self.opts = self.opts.stride(stride);
        self
    }

    /// `padding=`: a number or a pair (at most half the kernel).
    pub fn padding(mut self, padding: impl Into<Size2>) -> Self {
        self.opts = self.opts.padding(padding);
        self
    }

    /// `dilation=`: a number or a pair.
    pub fn dilation(mut self, dilation: impl Into<Size2>) -> Self {
        self.opts = self.opts.dilation(dilation);
        self
    }

    /// `ceil_mode=`.
    pub fn ceil_mode(mut self, on: bool) -> Self {
        self.opts = self.opts.ceil_mode(on);
        self
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
    /// `nn.AvgPool2d(kernel_size)`: stride the kernel size, no padding; the keyword
    /// arguments are builder methods (`AvgPool2d::new(2).stride(1).padding(1)`).
    pub fn new(kernel: impl Into<Size2>) -> Self {
        Self::with_options(AvgPool2dOptions::new(kernel))
    }

    /// `stride=`: a number or a pair.
    pub fn stride(mut self, stride: impl Into<Size2>) -> Self {
        self.opts = self.opts.stride(stride);
        self
    }

    /// `padding=`: a number or a pair (at most half the kernel).
    pub fn padding(mut self, padding: impl Into<Size2>) -> Self {
        self.opts = self.opts.padding(padding);
        self
    }

    /// `ceil_mode=`.
    pub fn ceil_mode(mut self, on: bool) -> Self {
        self.opts = self.opts.ceil_mode(on);
        self
    }

    /// `count_include_pad=`.
    pub fn count_include_pad(mut self, on: bool) -> Self {
        self.opts = self.opts.count_include_pad(on);
        self
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
