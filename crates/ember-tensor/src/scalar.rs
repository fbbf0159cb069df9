//! [`Scalar`]: a Rust number used as an operand (`x.mul(2.0)`), and [`Operand`], what the
//! binary ops accept on their right-hand side: a tensor or a scalar.

use half::{bf16, f16};

use crate::dtype::{DType, WithDType};
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
/// # Ok::<(), ember_tensor::TensorError>(())
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
/// `impl Into<Operand>`, so `a.add(&b)`, `a.add(1)` and `a.mul(0.5)` all work.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// A tensor (broadcast against the left-hand side).
    Tensor(&'a Tensor),
    /// A scalar.
    Scalar(Scalar),
}

impl<'a> From<&'a Tensor> for Operand<'a> {
    fn from(t: &'a Tensor) -> Self {
        Operand::Tensor(t)
    }
}

impl From<Scalar> for Operand<'_> {
    fn from(s: Scalar) -> Self {
        Operand::Scalar(s)
    }
}

macro_rules! operand_from {
    ($($t:ty),*) => {
        $(impl From<$t> for Operand<'_> {
            fn from(x: $t) -> Self {
                Operand::Scalar(Scalar::from(x))
            }
        })*
    };
}

operand_from!(bool, u8, i32, i64, u32, usize, isize, f32, f64, f16, bf16);
