//! The element types a GEMM takes and writes: f32, and the 16-bit floats with f32
//! accumulation.

use half::{bf16, f16};

/// The element types this crate knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bf16,
    /// IEEE half precision.
    F16,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type of A, B or C. Products accumulate in f32 whatever the element type.
/// Sealed: implemented for `f32`, `half::bf16` and `half::f16`.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The runtime tag.
    const DTYPE: DType;
    /// Widening (exact) conversion.
    fn to_f32(self) -> f32;
    /// Rounding (to nearest even) conversion.
    fn from_f32(x: f32) -> Self;
    /// The slice as f32 when `Self` is f32.
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// The mutable slice as f32 when `Self` is f32.
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]>;
    /// The raw 16-bit pattern slice when `Self` is a 16-bit float.
    fn as_bits(s: &[Self]) -> Option<&[u16]>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
    fn as_bits(_: &[Self]) -> Option<&[u16]> {
        None
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    fn as_bits(s: &[Self]) -> Option<&[u16]> {
        Some(half::slice::HalfFloatSliceExt::reinterpret_cast(s))
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    fn as_bits(s: &[Self]) -> Option<&[u16]> {
        Some(half::slice::HalfFloatSliceExt::reinterpret_cast(s))
    }
}
