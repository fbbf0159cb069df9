//! `isclose`, `allclose` and `equal`, PyTorch's semantics, composed from the comparison and
//! arithmetic kernels (so they run wherever those run).
//!
//! Note [Closeness]: as `at::native::isclose`, `a` is close to `b` where `a == b` (so
//! infinities only to themselves, same sign), or, with `equal_nan`, both are NaN, or
//! `|a - b|` is finite and `<= atol + |rtol·b|`. Both tolerances 0 is plain equality (no
//! rounding of large integers through floats). Bool and integer operands are compared in
//! f32, PyTorch's default dtype (so no wrap-around of a `u8` difference; integers beyond
//! 2^24 round, as in PyTorch). `self` and `other` must have one dtype (PyTorch: "Float did not match Double");
//! they broadcast. `equal` promotes instead (`torch.equal` since PyTorch 1.13) and does not
//! broadcast: another shape is `false`.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::raw::{RawTensor, same_device};

/// Options of [`Tensor::isclose`](crate::Tensor::isclose) and
/// [`Tensor::allclose`](crate::Tensor::allclose): PyTorch's `rtol` (default `1e-5`), `atol`
/// (default `1e-8`) and `equal_nan` (default `false`). `()` is the defaults, `(rtol, atol)`
/// and `(rtol, atol, equal_nan)` set them.
///
/// ```
/// use ember_tensor::{IscloseOptions, Tensor};
/// let a = Tensor::new(&[1f32, f32::NAN], ())?;
/// let b = Tensor::new(&[1.001f32, f32::NAN], ())?;
/// assert!(!a.allclose(&b, ())?);
/// assert!(a.allclose(&b, (1e-2, 0.0, true))?);
/// assert!(a.allclose(&b, IscloseOptions::new().rtol(1e-2).equal_nan(true))?);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IscloseOptions {
    /// Relative tolerance, `>= 0`.
    pub rtol: f64,
    /// Absolute tolerance, `>= 0`.
    pub atol: f64,
    /// Whether two NaNs are close.
    pub equal_nan: bool,
}

impl Default for IscloseOptions {
    fn default() -> Self {
        IscloseOptions {
            rtol: 1e-5,
            atol: 1e-8,
            equal_nan: false,
        }
    }
}

impl IscloseOptions {
    /// PyTorch's defaults: `rtol = 1e-5`, `atol = 1e-8`, `equal_nan = false`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `rtol`.
    pub fn rtol(mut self, rtol: f64) -> Self {
        self.rtol = rtol;
        self
    }

    /// Sets `atol`.
    pub fn atol(mut self, atol: f64) -> Self {
        self.atol = atol;
        self
    }

    /// Sets `equal_nan`.
    pub fn equal_nan(mut self, equal_nan: bool) -> Self {
        self.equal_nan = equal_nan;
        self
    }
}

/// `()` is PyTorch's defaults.
impl From<()> for IscloseOptions {
    fn from(_: ()) -> Self {
        Self::default()
    }
}

/// `(rtol, atol)`, NaNs not equal.
impl From<(f64, f64)> for IscloseOptions {
    fn from((rtol, atol): (f64, f64)) -> Self {
        IscloseOptions {
            rtol,
            atol,
            equal_nan: false,
        }
    }
}

/// `(rtol, atol, equal_nan)`.
impl From<(f64, f64, bool)> for IscloseOptions {
    fn from((rtol, atol, equal_nan): (f64, f64, bool)) -> Self {
        IscloseOptions {
            rtol,
            atol,
            equal_nan,
        }
    }
}

impl From<&IscloseOptions> for IscloseOptions {
    fn from(o: &IscloseOptions) -> Self {
        *o
    }
}

impl RawTensor {
    /// Elementwise closeness as bool, broadcast (Note [Closeness]).
    pub fn isclose(&self, other: &RawTensor, o: &IscloseOptions) -> Result<RawTensor> {
        let _op = crate::profile::op("isclose", &[self.as_input(), other.as_input()]);
        same_device(&[self, other])?;
        if self.dtype() != other.dtype() {
            return Err(TensorError::DTypeMismatch {
                op: "isclose",
                expected: self.dtype(),
                found: other.dtype(),
            });
        }
        for (name, v) in [("rtol", o.rtol), ("atol", o.atol)] {
            // NaN is refused too.
            if v.is_nan() || v < 0.0 {
                return Err(TensorError::invalid(
                    "isclose",
                    format!("{name} must be greater than or equal to zero, but got {v}"),
                ));
            }
        }
        let float = self.dtype().is_float();
        let mut close = self.eq(other)?;
        if o.equal_nan && float {
            close = close.logical_or(&self.ne(self)?.logical_and(&other.ne(other)?)?)?;
        }
        if o.rtol == 0.0 && o.atol == 0.0 {
            return Ok(close);
        }
        let (a, b) = if float {
            (self.clone(), other.clone())
        } else {
            (self.to_dtype(DType::F32)?, other.to_dtype(DType::F32)?)
        };
        let allowed = b.mul(o.rtol)?.abs()?.add(o.atol)?;
        let actual = a.sub(&b)?.abs()?;
        // A finite error only: `1` and `inf` are not close although `inf <= inf`.
        let within = actual
            .le(&allowed)?
            .logical_and(&actual.ne(f64::INFINITY)?)?;
        close.logical_or(&within)
    }

    /// Whether every element is close (Note [Closeness]); `true` for no elements.
    pub fn allclose(&self, other: &RawTensor, o: &IscloseOptions) -> Result<bool> {
        let far = self
            .isclose(other, o)?
            .logical_not()?
            .to_dtype(DType::I64)?
            .sum_all()?;
        Ok(far.item::<i64>()? == 0)
    }

    /// `torch.equal`: the same shape and equal values (after promotion; NaN is never
    /// equal). Another shape is `false`, not an error; another device is an error.
    pub fn equal(&self, other: &RawTensor) -> Result<bool> {
        same_device(&[self, other])?;
        if self.dims() != other.dims() {
            return Ok(false);
        }
        let differ = self.ne(other)?.to_dtype(DType::I64)?.sum_all()?;
        Ok(differ.item::<i64>()? == 0)
    }
}
