//! Creating autograd tensors: the constructors of `ember-tensor`, giving leaves. They require
//! grad when the options say so (`Options::new().requires_grad(true)`), or after
//! [`Tensor::requires_grad_`].
//!
//! ```
//! use ember_tensor::Tensor;
//! use ember_tensor::{DType, Options};
//! let w = Tensor::randn([3, 2], Options::new().dtype(DType::F64).requires_grad(true))?;
//! assert!(w.requires_grad() && w.is_leaf());
//! # Ok::<(), ember_tensor::Error>(())
//! ```

use crate::{Options, RawTensor as Raw, Scalar, Shape, WithDType};

use crate::autograd::error::Result;
use crate::random::Generator;
use crate::tensor::Tensor;

fn w(r: std::result::Result<Raw, crate::TensorError>) -> Result<Tensor> {
    Ok(Tensor::wrap(r?))
}

/// A new leaf from `make(opts)`, requiring grad when the options say so
/// (`Options::new().requires_grad(true)`, PyTorch's `requires_grad=True`).
fn leaf(
    opts: impl Into<Options>,
    make: impl FnOnce(Options) -> std::result::Result<Raw, crate::TensorError>,
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
    /// use ember_tensor::Tensor;
    /// use ember_tensor::{DType, Device};
    /// let x = Tensor::from_slice(&[1f32, 2.], [2], (Device::Cpu, DType::F64))?;
    /// assert_eq!((x.dtype(), x.to_vec::<f64>()?), (DType::F64, vec![1.0, 2.0]));
    /// # Ok::<(), ember_tensor::Error>(())
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
        w(self.raw().zeros_like())
    }

    /// Ones like this tensor.
    pub fn ones_like(&self) -> Result<Tensor> {
        w(self.raw().ones_like())
    }

    /// Like this tensor, for writing into (`torch.empty_like`; zeroed here).
    pub fn empty_like(&self) -> Result<Tensor> {
        w(self.raw().empty_like())
    }

    /// `value` everywhere, like this tensor.
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        w(self.raw().full_like(value))
    }

    /// Uniform like this tensor.
    pub fn rand_like(&self) -> Result<Tensor> {
        w(self.raw().rand_like())
    }

    /// Normal like this tensor.
    pub fn randn_like(&self) -> Result<Tensor> {
        w(self.raw().randn_like())
    }

    /// Independent Bernoulli(`p`) samples: 1 with probability `p` (bool unless told).
    pub fn bernoulli_mask(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::bernoulli_mask(shape, p, o))
    }

    /// [`bernoulli_mask`](Tensor::bernoulli_mask) from `generator`.
    pub fn bernoulli_mask_with(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::bernoulli_mask_with(shape, p, o, generator))
    }

    /// Dropout's scaled keep mask: `1 / (1 - p)` with probability `1 - p`, else 0.
    pub fn dropout_mask(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::dropout_mask(shape, p, o))
    }

    /// [`dropout_mask`](Tensor::dropout_mask) from `generator`.
    pub fn dropout_mask_with(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::dropout_mask_with(shape, p, o, generator))
    }

    /// `start, start + step, ...` up to `end` (exclusive), as `torch.arange(start, end, step)`.
    pub fn arange_step(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        opts: impl Into<Options>,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::arange_step(start, end, step, o))
    }

    /// The `n × m` identity (`torch.eye(n, m)`).
    pub fn eye_rect(n: usize, m: usize, opts: impl Into<Options>) -> Result<Tensor> {
        leaf(opts, |o| Raw::eye_rect(n, m, o))
    }

    /// [`rand`](Tensor::rand) from `generator` (PyTorch's `generator=`), which must be for
    /// the tensor's device.
    pub fn rand_with(
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::rand_with(shape, o, generator))
    }

    /// [`randn`](Tensor::randn) from `generator`.
    pub fn randn_with(
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::randn_with(shape, o, generator))
    }

    /// [`randint`](Tensor::randint) from `generator`.
    pub fn randint_with(
        low: i64,
        high: i64,
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<Tensor> {
        leaf(opts, |o| Raw::randint_with(low, high, shape, o, generator))
    }

    /// [`rand_like`](Tensor::rand_like) from `generator`.
    pub fn rand_like_with(&self, generator: &Generator) -> Result<Tensor> {
        w(self.raw().rand_like_with(generator))
    }

    /// [`randn_like`](Tensor::randn_like) from `generator`.
    pub fn randn_like_with(&self, generator: &Generator) -> Result<Tensor> {
        w(self.raw().randn_like_with(generator))
    }
}
