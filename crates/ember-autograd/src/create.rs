//! Creating autograd tensors: the constructors of `ember-tensor`, giving leaves. They require
//! grad when the options say so (`Options::new().requires_grad(true)`), or after
//! [`Tensor::requires_grad_`].
//!
//! ```
//! use ember_autograd::Tensor;
//! use ember_tensor::{DType, Options};
//! let w = Tensor::randn([3, 2], Options::new().dtype(DType::F64).requires_grad(true))?;
//! assert!(w.requires_grad() && w.is_leaf());
//! # Ok::<(), ember_autograd::Error>(())
//! ```

use ember_tensor::{Device, Options, Scalar, Shape, Tensor as Raw, WithDType};

use crate::error::Result;
use crate::tensor::Tensor;

fn w(r: ember_tensor::Result<Raw>) -> Result<Tensor> {
    Ok(Tensor::wrap(r?))
}

/// A new leaf from `make(opts)`, requiring grad when the options say so
/// (`Options::new().requires_grad(true)`, PyTorch's `requires_grad=True`).
fn leaf(
    opts: impl Into<Options>,
    make: impl FnOnce(Options) -> ember_tensor::Result<Raw>,
) -> Result<Tensor> {
    let o = opts.into();
    let t = w(make(o))?;
    if o.requires_grad {
        t.requires_grad_(true)
    } else {
        Ok(t)
    }
}

impl Tensor {
    /// From a slice with a shape, on `device`.
    pub fn from_slice<T: WithDType>(
        data: &[T],
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        w(Raw::from_slice(data, shape, device))
    }

    /// From a `Vec` with a shape, on `device`.
    pub fn from_vec<T: WithDType>(
        data: Vec<T>,
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        w(Raw::from_vec(data, shape, device))
    }

    /// A 1-D tensor of `data`.
    pub fn new<T: WithDType>(data: &[T], device: &Device) -> Result<Tensor> {
        w(Raw::new(data, device))
    }

    /// A 0-dim tensor.
    pub fn scalar<T: WithDType>(value: T, device: &Device) -> Result<Tensor> {
        w(Raw::scalar(value, device))
    }

    /// Filled with `value`.
    pub fn full(
        shape: impl Into<Shape>,
        value: impl Into<Scalar>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::full(shape, value, o))
    }

    /// Zeros.
    pub fn zeros(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::zeros(shape, o))
    }

    /// Ones.
    pub fn ones(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::ones(shape, o))
    }

    /// Uninitialised in PyTorch; zeros here.
    pub fn empty(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::empty(shape, o))
    }

    /// `start, start + 1, ...` below `end`.
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::arange(start, end, o))
    }

    /// `steps` evenly spaced values from `start` to `end`.
    pub fn linspace(
        start: f64,
        end: f64,
        steps: usize,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::linspace(start, end, steps, o))
    }

    /// The `n × n` identity.
    pub fn eye(n: usize, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::eye(n, o))
    }

    /// Uniform on `[0, 1)` from the device's default generator.
    pub fn rand(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::rand(shape, o))
    }

    /// Standard normal from the device's default generator.
    pub fn randn(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::randn(shape, o))
    }

    /// Integers in `[low, high)`.
    pub fn randint(
        low: i64,
        high: i64,
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::randint(low, high, shape, o))
    }

    /// Zeros like this tensor (not requiring grad).
    pub fn zeros_like(&self) -> Result<Tensor> {
        w(self.data().zeros_like())
    }

    /// Ones like this tensor.
    pub fn ones_like(&self) -> Result<Tensor> {
        w(self.data().ones_like())
    }

    /// `value` everywhere, like this tensor.
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        w(self.data().full_like(value))
    }

    /// Uniform like this tensor.
    pub fn rand_like(&self) -> Result<Tensor> {
        w(self.data().rand_like())
    }

    /// Normal like this tensor.
    pub fn randn_like(&self) -> Result<Tensor> {
        w(self.data().randn_like())
    }
}
