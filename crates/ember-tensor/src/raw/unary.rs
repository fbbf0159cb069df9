//! Elementwise unary ops and `clamp`.

use crate::dtype::{DType, Operand as Promo, result_type};
use crate::error::{Result, TensorError};
use crate::op::{UnaryOpT, unary_compute_dtype};
use crate::raw::RawTensor;
use crate::scalar::ClampBound;

impl RawTensor {
    /// The dispatch of a unary op of the op table (`ops/table.rs`), named `name`: the
    /// dtype rule of its kernel `O`, then the CPU or CUDA kernel.
    pub(crate) fn unary_op<O: UnaryOpT>(&self, name: &'static str) -> Result<RawTensor> {
        let _op = crate::profile::op1(name, self);
        let dtype =
            unary_compute_dtype(O::KIND, self.dtype()).ok_or(TensorError::UnsupportedDType {
                op: name,
                dtype: self.dtype(),
                hint: "",
            })?;
        let x = self.to_dtype(dtype)?;
        let s = x.with_storage(|s, l| s.unary::<O>(name, l))?;
        Ok(RawTensor::from_storage(s, self.shape()))
    }
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
