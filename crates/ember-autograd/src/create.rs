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

use ember_tensor::{Options, Scalar, Shape, Tensor as Raw, WithDType};

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
    /// From a slice with a shape, as `torch.tensor(data, dtype=, device=, requires_grad=)`:
    /// `opts` is `()`, a device (by value or reference), a dtype to convert to, a
    /// `(device, dtype)` pair, or [`Options`].
    ///
    /// ```
    /// use ember_autograd::Tensor;
    /// use ember_tensor::{DType, Device};
    /// let x = Tensor::from_slice(&[1f32, 2.], [2], (Device::Cpu, DType::F64))?;
    /// assert_eq!((x.dtype(), x.to_vec::<f64>()?), (DType::F64, vec![1.0, 2.0]));
    /// # Ok::<(), ember_autograd::Error>(())
    /// ```
    pub fn from_slice<T: WithDType>(
        data: &[T],
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::from_slice(data, shape, o))
    }

    /// From a `Vec` with a shape (`opts` as [`from_slice`](Tensor::from_slice)).
    pub fn from_vec<T: WithDType>(
        data: Vec<T>,
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::from_vec(data, shape, o))
    }

    /// A 1-D tensor of `data` (`opts` as [`from_slice`](Tensor::from_slice)).
    pub fn new<T: WithDType>(data: &[T], opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::new(data, o))
    }

    /// A 0-dim tensor (`opts` as [`from_slice`](Tensor::from_slice)).
    pub fn scalar<T: WithDType>(value: T, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::scalar(value, o))
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
