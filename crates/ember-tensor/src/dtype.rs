//! [`DType`], the sealed [`WithDType`] trait for Rust element types, and PyTorch's type
//! promotion ([`promote_types`], [`result_type`]).
//!
//! See Note [Type promotion].

use std::fmt;

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::scalar::Scalar;

/// The element type of a tensor.
///
/// ```
/// use ember_tensor::DType;
/// assert_eq!(DType::F16.size_in_bytes(), 2);
/// assert_eq!(DType::F32.to_string(), "torch.float32");
/// assert!(DType::Bf16.is_float() && DType::I32.is_int());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// 32-bit IEEE float, PyTorch's default dtype.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    Bf16,
    /// Signed 64-bit integer, PyTorch's default integer dtype.
    I64,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 8-bit integer.
    U8,
    /// Boolean, stored as one byte that is 0 or 1.
    Bool,
}

/// Every dtype, in declaration order.
pub const ALL_DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::Bf16,
    DType::I64,
    DType::I32,
    DType::U8,
    DType::Bool,
];

/// The category of a dtype for type promotion: bool < integral < floating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Category {
    Bool,
    Int,
    Float,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// PyTorch's name, e.g. `torch.float32`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "torch.float32",
            DType::F64 => "torch.float64",
            DType::F16 => "torch.float16",
            DType::Bf16 => "torch.bfloat16",
            DType::I64 => "torch.int64",
            DType::I32 => "torch.int32",
            DType::U8 => "torch.uint8",
            DType::Bool => "torch.bool",
        }
    }

    /// The short name used in kernel symbols, e.g. `f32` (the CUDA symbol of a kernel is
    /// `{kernel}_{short_name}`).
    pub fn short_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// `true` for f32, f64, f16, bf16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::Bf16)
    }

    /// `true` for i64, i32, u8 (not bool, as PyTorch's `is_floating_point`/integral split;
    /// bool is its own category).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::U8)
    }

    /// `true` for the reduced-precision floats that CPU kernels compute in f32.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::Bf16)
    }

    pub(crate) fn category(self) -> Category {
        if self.is_float() {
            Category::Float
        } else if self.is_int() {
            Category::Int
        } else {
            Category::Bool
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// PyTorch's `torch.promote_types`: the smallest dtype both `a` and `b` convert to without
/// leaving their category (bool < integral < floating).
///
/// ```
/// use ember_tensor::{promote_types, DType::*};
/// assert_eq!(promote_types(I32, F16), F16);
/// assert_eq!(promote_types(F16, Bf16), F32);
/// assert_eq!(promote_types(U8, I32), I32);
/// assert_eq!(promote_types(Bool, U8), U8);
/// ```
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a.category(), b.category()) {
        (Category::Bool, _) => b,
        (_, Category::Bool) => a,
        (Category::Float, Category::Float) => match (a, b) {
            (F64, _) | (_, F64) => F64,
            // f32 with a half, or f16 with bf16.
            _ => F32,
        },
        (Category::Float, Category::Int) => a,
        (Category::Int, Category::Float) => b,
        (Category::Int, Category::Int) => {
            if a.size_in_bytes() >= b.size_in_bytes() {
                a
            } else {
                b
            }
        }
    }
}

// Note [Type promotion]:
// ~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's `torch.result_type` sorts operands into three priority groups: tensors with at
// least one dimension, zero-dimensional tensors, and Python scalars ("wrapped numbers").
// Each group is promoted within itself (`promote_types`); a float scalar counts as the
// default dtype (f32), an int scalar as i64, a bool scalar as bool. The groups are then
// combined from the lowest priority up with `combine_categories`: the higher group's dtype
// wins unless the lower group is of a higher category (int tensor with float scalar ->
// the float; bool tensor with int scalar -> i64). So `u8_tensor + 1000` stays u8 and
// `f16_tensor * 2.5` stays f16, as in PyTorch.

/// One operand of [`result_type`]: a tensor's dtype and rank, or a scalar.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operand {
    /// A tensor of this dtype with this rank.
    Tensor(DType, usize),
    /// A scalar (Rust number).
    Scalar(Scalar),
}

fn promote_opt(a: Option<DType>, b: DType) -> Option<DType> {
    Some(match a {
        None => b,
        Some(a) => promote_types(a, b),
    })
}

fn combine_categories(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    let Some(h) = higher else {
        return lower;
    };
    if h.is_float() {
        return Some(h);
    }
    match lower {
        Some(l) if h == DType::Bool || l.is_float() => Some(promote_types(h, l)),
        _ => Some(h),
    }
}

/// PyTorch's `torch.result_type` over tensors and scalars. See Note [Type promotion].
pub(crate) fn result_type(operands: &[Operand]) -> DType {
    let (mut dim, mut zero, mut wrapped) = (None, None, None);
    for op in operands {
        match *op {
            Operand::Tensor(dt, rank) if rank > 0 => dim = promote_opt(dim, dt),
            Operand::Tensor(dt, _) => zero = promote_opt(zero, dt),
            Operand::Scalar(s) => wrapped = promote_opt(wrapped, s.default_dtype()),
        }
    }
    combine_categories(dim, combine_categories(zero, wrapped)).unwrap_or(DType::F32)
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type that a tensor can hold: f32, f64, [`f16`], [`bf16`], i64, i32, u8,
/// bool. Sealed: the set is the [`DType`] enum.
pub trait WithDType:
    sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static
{
    /// The dtype of this Rust type.
    const DTYPE: DType;
    /// Zero (false).
    const ZERO: Self;
    /// One (true).
    const ONE: Self;
    /// Widens to f64 (exact for every type but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64 with PyTorch's cast rules (see [`WithDType::from_f64`] on each
    /// type; float -> int truncates toward zero, saturating, NaN -> 0).
    fn from_f64(v: f64) -> Self;
    /// Exact conversion to i64 for integer types (floats truncate as `from_f64`).
    fn to_i64(self) -> i64;
    /// Conversion from i64 with wrapping for narrower integers (as a C cast).
    fn from_i64(v: i64) -> Self;
}

macro_rules! with_dtype_float {
    ($t:ty, $dt:expr, $zero:expr, $one:expr, $to:expr, $from:expr, $from_int:expr) => {
        impl sealed::Sealed for $t {}
        impl WithDType for $t {
            const DTYPE: DType = $dt;
            const ZERO: Self = $zero;
            const ONE: Self = $one;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $to(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                // `as` saturates and maps NaN to 0: the documented float -> int rule.
                self.to_f64() as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                $from_int(v)
            }
        }
    };
}

with_dtype_float!(
    f32,
    DType::F32,
    0.0,
    1.0,
    |x: f32| x as f64,
    |v: f64| v as f32,
    |v: i64| v as f32
);
with_dtype_float!(
    f64,
    DType::F64,
    0.0,
    1.0,
    |x: f64| x,
    |v: f64| v,
    |v: i64| v as f64
);
with_dtype_float!(
    f16,
    DType::F16,
    f16::ZERO,
    f16::ONE,
    |x: f16| x.to_f64(),
    // Through f32, as PyTorch's `Half(float)` constructor does (and the same on every CPU:
    // `half`'s own `from_f64` rounds differently with and without F16C).
    |v: f64| f16::from_f32(v as f32),
    |v: i64| f16::from_f32(v as f32)
);
with_dtype_float!(
    bf16,
    DType::Bf16,
    bf16::ZERO,
    bf16::ONE,
    |x: bf16| bf16_to_f32(x) as f64,
    |v: f64| bf16_from_f32(v as f32),
    |v: i64| bf16_from_f32(v as f32)
);

/// f32 → bf16 as `half::bf16::from_f32` rounds, without its branches, so that loops of it
/// vectorise (autocast's casts of every weight, and the bf16 kernels that compute in f32, go
/// through it; `half`'s branching version made a cast of 2M elements several times slower).
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> bf16 {
    <bf16 as ember_gemm::Element>::from_f32(x)
}

/// bf16 → f32: exact (`half`'s, a shift; `to_f64` branches on zeros, subnormals and NaNs).
#[inline(always)]
pub(crate) fn bf16_to_f32(x: bf16) -> f32 {
    x.to_f32()
}

macro_rules! with_dtype_int {
    ($t:ty, $dt:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        impl WithDType for $t {
            const DTYPE: DType = $dt;
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                // See Note [Float to int casts].
                $from(v)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}

with_dtype_int!(i64, DType::I64, |v: f64| v as i64);
with_dtype_int!(i32, DType::I32, |v: f64| v as i32);
with_dtype_int!(u8, DType::U8, |v: f64| (v as i64) as u8);

impl sealed::Sealed for bool {}
impl WithDType for bool {
    const DTYPE: DType = DType::Bool;
    const ZERO: Self = false;
    const ONE: Self = true;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        if self { 1.0 } else { 0.0 }
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        // NaN != 0, so NaN -> true, as PyTorch.
        v != 0.0
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}

// Note [Float to int casts]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch truncates toward zero; out-of-range values and NaN are undefined behaviour in its
// C++ casts (x86 gives INT_MIN). Ember uses Rust's `as`: truncation toward zero, saturating
// at the target's bounds, NaN -> 0. Into u8 PyTorch goes through int64 and wraps for
// in-range-of-i64 values (`torch.tensor([-1.]).to(torch.uint8)` is 255); Ember does the same
// (float -> i64 saturating, then wrapping to u8). Into f16/bf16 rounds to nearest even (the
// `half` crate); into bool is `x != 0` (NaN -> true).

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promotion_table_matches_pytorch() {
        let cases = [
            (Bool, Bool, Bool),
            (Bool, U8, U8),
            (U8, I32, I32),
            (I32, I64, I64),
            (U8, F16, F16),
            (I64, Bf16, Bf16),
            (F16, Bf16, F32),
            (F16, F32, F32),
            (Bf16, F64, F64),
            (F32, F64, F64),
            (I64, F32, F32),
        ];
        for (a, b, c) in cases {
            assert_eq!(promote_types(a, b), c, "{a} {b}");
            assert_eq!(promote_types(b, a), c, "{b} {a}");
        }
    }

    #[test]
    fn scalar_category_rule() {
        let t = |d| Operand::Tensor(d, 1);
        let f = Operand::Scalar(Scalar::Float(2.5));
        let i = Operand::Scalar(Scalar::Int(1000));
        assert_eq!(result_type(&[t(I32), f]), F32);
        assert_eq!(result_type(&[t(I64), f]), F32);
        assert_eq!(result_type(&[t(F16), f]), F16);
        assert_eq!(result_type(&[t(F64), f]), F64);
        assert_eq!(result_type(&[t(Bool), i]), I64);
        assert_eq!(result_type(&[t(U8), i]), U8);
        assert_eq!(
            result_type(&[t(Bool), Operand::Scalar(Scalar::Bool(true))]),
            Bool
        );
        // zero-dim tensors do not promote dimensioned ones within a category
        assert_eq!(result_type(&[t(F16), Operand::Tensor(F64, 0)]), F16);
        assert_eq!(result_type(&[t(I32), Operand::Tensor(F64, 0)]), F64);
        assert_eq!(result_type(&[Operand::Tensor(I32, 0), f]), F32);
    }

    #[test]
    fn casts_follow_pytorch() {
        assert_eq!(i64::from_f64(-2.7), -2);
        assert_eq!(i32::from_f64(f64::NAN), 0);
        assert_eq!(i32::from_f64(1e20), i32::MAX);
        assert_eq!(u8::from_f64(-1.0), 255);
        assert_eq!(u8::from_f64(300.7), 44);
        assert!(bool::from_f64(f64::NAN));
        assert!(!bool::from_f64(0.0));
        // 1 + 2^-11 is halfway between two f16 values: ties to even (1.0).
        assert_eq!(<f16 as WithDType>::from_f64(1.0 + 2f64.powi(-11)), f16::ONE);
        assert_eq!(
            <bf16 as WithDType>::from_f64(1.0 + 2f64.powi(-8)),
            bf16::ONE
        );
        // f64 -> f16 goes through f32 as in PyTorch: 24855.999999999993 -> 24856f32, a tie
        // between 24848 and 24864 that rounds to even (24864).
        assert_eq!(
            <f16 as WithDType>::from_f64(24855.999999999993),
            f16::from_f32(24864.0)
        );
        assert_eq!(<f16 as WithDType>::from_i64(65519), f16::from_f32(65504.0));
    }
}
