//! Creating autograd tensors: the constructors of `ember-tensor`, giving leaves that do not
//! require grad (call [`Tensor::requires_grad_`] to mark one).

use ember_tensor::{Device, Options, Scalar, Shape, Tensor as Raw, WithDType};

use crate::error::Result;
use crate::tensor::Tensor;

fn w(r: ember_tensor::Result<Raw>) -> Result<Tensor> {
    Ok(Tensor::wrap(r?))
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
        w(Raw::full(shape, value, opts))
    }

    /// Zeros.
    pub fn zeros(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        w(Raw::zeros(shape, opts))
    }

    /// Ones.
    pub fn ones(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        w(Raw::ones(shape, opts))
    }

    /// Uninitialised in PyTorch; zeros here.
    pub fn empty(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        w(Raw::empty(shape, opts))
    }

    /// `start, start + 1, ...` below `end`.
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        w(Raw::arange(start, end, opts))
    }

    /// `steps` evenly spaced values from `start` to `end`.
    pub fn linspace(
        start: f64,
        end: f64,
        steps: usize,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        w(Raw::linspace(start, end, steps, opts))
    }

    /// The `n × n` identity.
    pub fn eye(n: usize, opts: impl Into<Options>) -> Result<Tensor> {
        w(Raw::eye(n, opts))
    }

    /// Uniform on `[0, 1)` from the device's default generator.
    pub fn rand(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        w(Raw::rand(shape, opts))
    }

    /// Standard normal from the device's default generator.
    pub fn randn(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<Tensor> {
        w(Raw::randn(shape, opts))
    }

    /// Integers in `[low, high)`.
    pub fn randint(
        low: i64,
        high: i64,
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        w(Raw::randint(low, high, shape, opts))
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
