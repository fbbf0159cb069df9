//! [`Scalar`]: a Rust number used as an operand (`x.mul(2.0)`), and [`Operand`], what the
//! binary ops accept on their right-hand side: a tensor or a scalar.

use half::{bf16, f16};

use crate::dtype::{DType, WithDType};
use crate::raw::RawTensor;
use crate::tensor::Tensor;

/// A number given as an op operand, kept in its category as PyTorch keeps Python's
/// `bool`/`int`/`float` (see Note [Type promotion]).
///
/// ```
/// use ember_tensor::Scalar;
/// assert_eq!(Scalar::from(2), Scalar::Int(2));
/// assert_eq!(Scalar::from(0.5f32), Scalar::Float(0.5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
}

impl Scalar {
    /// The dtype this scalar counts as in type promotion: f32 (the default float dtype) for
    /// floats, i64 for ints, bool for bools.
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }

    /// The value as f64.
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b.to_f64(),
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// The value converted to element type `T` with the cast rules of [`WithDType`]
    /// (integers convert exactly into integer types, wrapping like a C cast).
    pub fn to_dtype<T: WithDType>(self) -> T {
        match self {
            Scalar::Bool(b) => T::from_i64(b as i64),
            Scalar::Int(i) => T::from_i64(i),
            Scalar::Float(f) => T::from_f64(f),
        }
    }

    /// `true` if this is a float scalar.
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::Float(_))
    }

    /// Checks that the value can be stored as `dtype` without overflow, as PyTorch checks a
    /// Python number given to `torch.full`, `torch.tensor` or `fill_` ("value cannot be
    /// converted to type int32_t without overflow"). Floats truncate into integer dtypes
    /// (2.5 fits i32) but NaN and ±inf do not; u8 also takes -255..=-1, which wraps as in
    /// PyTorch; a finite float beyond a float dtype's range overflows (inf and NaN fit);
    /// every value fits bool.
    pub fn check_fits(self, op: &'static str, dtype: DType) -> crate::error::Result<()> {
        let (lo, hi): (f64, f64) = match dtype {
            DType::Bool => return Ok(()),
            DType::F64 => return Ok(()),
            DType::F32 => (-(f32::MAX as f64), f32::MAX as f64),
            DType::F16 => (-65504.0, 65504.0),
            DType::Bf16 => (-3.3895313892515355e38, 3.3895313892515355e38),
            DType::I64 => (i64::MIN as f64, i64::MAX as f64),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            DType::U8 => (-255.0, 255.0),
        };
        let fits = match self {
            Scalar::Bool(_) => true,
            Scalar::Int(i) => match dtype {
                DType::I64 => true,
                DType::I32 => i32::try_from(i).is_ok(),
                DType::U8 => (-255..=255).contains(&i),
                _ => (i as f64) >= lo && (i as f64) <= hi,
            },
            Scalar::Float(f) if dtype.is_float() => !f.is_finite() || (f >= lo && f <= hi),
            // Truncation toward zero, then the range (i64's upper bound 2^63 is exclusive).
            Scalar::Float(f) => {
                let t = f.trunc();
                f.is_finite() && t >= lo && (t < hi || (dtype != DType::I64 && t <= hi))
            }
        };
        if fits {
            return Ok(());
        }
        let ty = match dtype {
            DType::F32 => "float",
            DType::F16 => "c10::Half",
            DType::Bf16 => "c10::BFloat16",
            DType::I64 => "int64_t",
            DType::I32 => "int32_t",
            DType::U8 => "uint8_t",
            DType::F64 => "double",
            DType::Bool => "bool",
        };
        let v = match self {
            Scalar::Bool(b) => b.to_string(),
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => format!("{f:?}"),
        };
        Err(crate::TensorError::invalid(
            op,
            format!("value cannot be converted to type {ty} without overflow ({v} as {dtype})"),
        ))
    }
}

/// One bound of `clamp(min, max)`: a number, `()` for no bound (PyTorch's `None`), or an
/// `Option` of a number.
///
/// ```
/// use ember_tensor::Tensor;
/// let x = Tensor::arange(-3, 4, ())?;
/// assert_eq!(x.clamp(-1, 2)?.to_vec::<i64>()?, vec![-1, -1, -1, 0, 1, 2, 2]);
/// assert_eq!(x.clamp((), 0)?.to_vec::<i64>()?, vec![-3, -2, -1, 0, 0, 0, 0]);
/// assert_eq!(x.to_dtype(ember_tensor::DType::F32)?.clamp(0.5, ())?.to_vec::<f32>()?[6], 3.0);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub trait ClampBound {
    /// The bound, or `None` for none.
    fn bound(self) -> Option<Scalar>;
}

impl ClampBound for () {
    fn bound(self) -> Option<Scalar> {
        None
    }
}
impl<T: Into<Scalar>> ClampBound for T {
    fn bound(self) -> Option<Scalar> {
        Some(self.into())
    }
}
impl<T: Into<Scalar>> ClampBound for Option<T> {
    fn bound(self) -> Option<Scalar> {
        self.map(Into::into)
    }
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident, $conv:expr);* $(;)?) => {
        $(impl From<$t> for Scalar {
            fn from(x: $t) -> Self {
                Scalar::$v($conv(x))
            }
        })*
    };
}

scalar_from! {
    bool => Bool, |x| x;
    u8 => Int, i64::from;
    i32 => Int, i64::from;
    i64 => Int, |x| x;
    u32 => Int, i64::from;
    usize => Int, |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
    isize => Int, |x: isize| x as i64;
    f32 => Float, f64::from;
    f64 => Float, |x| x;
    f16 => Float, |x: f16| x.to_f64();
    bf16 => Float, |x: bf16| x.to_f64();
}

/// The right-hand side of a binary op: a tensor or a scalar. Every binary op takes
/// `impl Into<Operand>`, so `a.add(&b)`, `a.add(1)` and `a.mul(0.5)` all work. (The op
/// fronts of the raw layer take the same enum over the crate's untracked tensor.)
#[derive(Debug)]
pub enum Operand<'a, T = Tensor> {
    /// A tensor (broadcast against the left-hand side).
    Tensor(&'a T),
    /// A scalar.
    Scalar(Scalar),
}

/// The operand of the raw layer's fronts.
pub(crate) type RawOperand<'a> = Operand<'a, RawTensor>;

impl<T> Clone for Operand<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Operand<'_, T> {}

impl<'a, T> From<&'a T> for Operand<'a, T> {
    fn from(t: &'a T) -> Self {
        Operand::Tensor(t)
    }
}

impl<T> From<Scalar> for Operand<'_, T> {
    fn from(s: Scalar) -> Self {
        Operand::Scalar(s)
    }
}

macro_rules! operand_from {
    ($($t:ty),*) => {
        $(impl<T> From<$t> for Operand<'_, T> {
            fn from(x: $t) -> Self {
                Operand::Scalar(Scalar::from(x))
            }
        })*
    };
}

operand_from!(bool, u8, i32, i64, u32, usize, isize, f32, f64, f16, bf16);
