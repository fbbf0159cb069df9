//! Elementwise unary ops and `clamp`.

use crate::dtype::{DType, Operand as Promo, result_type};
use crate::error::{Result, TensorError};
use crate::op::{self, UnaryOpT, unary_compute_dtype};
use crate::raw::RawTensor;
use crate::scalar::ClampBound;

impl RawTensor {
    fn unary_op<O: UnaryOpT>(&self) -> Result<RawTensor> {
        let _op = crate::profile::op1(O::NAME, self);
        let dtype =
            unary_compute_dtype(O::KIND, self.dtype()).ok_or(TensorError::UnsupportedDType {
                op: O::NAME,
                dtype: self.dtype(),
                hint: "",
            })?;
        let x = self.to_dtype(dtype)?;
        let s = x.with_storage(|s, l| s.unary::<O>(l))?;
        Ok(RawTensor::from_storage(s, self.shape()))
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ty;)*) => {
        impl RawTensor {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> Result<RawTensor> {
                    self.unary_op::<$op>()
                }
            )*
        }
    };
}

unary_methods! {
    /// `-x` (not for bool).
    neg => op::Neg;
    /// `|x|` (not for bool).
    abs => op::Abs;
    /// -1, 0 or 1 by the sign of `x` (NaN stays NaN).
    sign => op::Sign;
    /// `e^x` (integers compute in f32).
    exp => op::Exp;
    /// Natural log (integers compute in f32).
    log => op::Log;
    /// `ln(1 + x)`, accurate near 0.
    log1p => op::Log1p;
    /// Square root.
    sqrt => op::Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => op::Rsqrt;
    /// Sine.
    sin => op::Sin;
    /// Cosine.
    cos => op::Cos;
    /// Hyperbolic tangent.
    tanh => op::Tanh;
    /// `1 / (1 + e^-x)`.
    sigmoid => op::Sigmoid;
    /// `1 / x`.
    reciprocal => op::Reciprocal;
    /// `max(x, 0)`; NaN stays NaN.
    relu => op::Relu;
    /// Exact GELU, `x/2 (1 + erf(x / sqrt 2))`: `gelu(Approximate::None)`.
    #[doc(hidden)]
    gelu_erf => op::GeluErf;
    /// GELU with the tanh approximation: `gelu(Approximate::Tanh)`.
    #[doc(hidden)]
    gelu_tanh => op::GeluTanh;
    /// `x * sigmoid(x)` (floating dtypes only).
    silu => op::Silu;
    /// `ln(1 + e^x)`, linear above 20 (PyTorch's defaults `beta=1, threshold=20`).
    softplus => op::Softplus;
}

/// GELU's `approximate` argument (PyTorch's `'none'` and `'tanh'`); `()` means `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Approximate {
    /// The exact form, `x/2 (1 + erf(x / sqrt 2))`.
    #[default]
    None,
    /// The tanh approximation, `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Tanh,
}

impl From<()> for Approximate {
    fn from(_: ()) -> Self {
        Approximate::None
    }
}

impl std::str::FromStr for Approximate {
    type Err = TensorError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Approximate::None),
            "tanh" => Ok(Approximate::Tanh),
            other => Err(TensorError::invalid(
                "gelu",
                format!("approximate argument must be either none or tanh, found {other:?}"),
            )),
        }
    }
}

impl RawTensor {
    /// `x * x`.
    pub fn square(&self) -> Result<RawTensor> {
        self.mul(self)
    }

    /// Clamps into `[min, max]`; either bound may be `None` (not both). Float bounds on an
    /// integer tensor give a float result, as PyTorch.
    ///
    /// ```
    /// use ember_tensor::{Device, Scalar, Tensor};
    /// let x = Tensor::new(&[-2i64, 0, 5], &Device::Cpu)?;
    /// let c = x.clamp(-1, 3)?;
    /// assert_eq!(c.to_vec::<i64>()?, vec![-1, 0, 3]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn clamp(&self, min: impl ClampBound, max: impl ClampBound) -> Result<RawTensor> {
        let _op = crate::profile::op1("clamp", self);
        let (min, max) = (min.bound(), max.bound());
        if min.is_none() && max.is_none() {
            return Err(TensorError::invalid(
                "clamp",
                "at least one of 'min' or 'max' must not be None",
            ));
        }
        let mut ops = vec![Promo::Tensor(self.dtype(), self.rank())];
        ops.extend(min.into_iter().chain(max).map(Promo::Scalar));
        let dtype = result_type(&ops);
        if dtype == DType::Bool {
            return Err(TensorError::unsupported("clamp", dtype));
        }
        let x = self.to_dtype(dtype)?;
        let s = x.with_storage(|s, l| s.clamp(l, min, max))?;
        Ok(RawTensor::from_storage(s, self.shape()))
    }
}
