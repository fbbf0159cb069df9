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
    /// `dst[i] = src[i].to_f32()` over equal-length slices, vectorised where the type allows.
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = x.to_f32();
        }
    }
    /// `dst[i] = Self::from_f32(src[i])` over equal-length slices, vectorised where the type
    /// allows.
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(x);
        }
    }
}

/// `bf16::from_f32` without branches, so that a loop over it vectorises: round to nearest
/// even by adding `0x7fff` plus the kept low bit (a carry into the exponent gives the next
/// binade or infinity, as it should), and keep a NaN quiet with its high payload, as `half`
/// does. Bit-identical to `half::bf16::from_f32` (tested on every rounding case below).
#[inline]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((b >> 16) | 0x0040) as u16;
    if b & 0x7fff_ffff > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }
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
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    // Inlined into other crates too: `ember-tensor`'s bf16 kernels and casts use it.
    #[inline]
    fn from_f32(x: f32) -> Self {
        bf16::from_bits(bf16_bits(x))
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = bf16::from_bits(bf16_bits(x));
        }
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
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        // `half` converts slices with F16C where the CPU has it (detected at run time).
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(&src[..n], &mut dst[..n]);
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        let n = src.len().min(dst.len());
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut dst[..n], &src[..n]);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free bf16 rounding against `half`'s: ties both ways, carries into the
    /// exponent and to infinity, subnormals, signed zeros, infinities and NaN payloads.
    #[test]
    fn bf16_bits_matches_half() {
        let mut bits: Vec<u32> = vec![
            0,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0xff81_2345,
            0x7fff_ffff,
            0x7f7f_ffff,
            0x7f7f_8000,
            0x7f7f_7fff,
            0x0000_8000,
            0x0001_8000,
            0x0000_7fff,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x3f80_7fff,
            0x807f_ffff,
        ];
        let mut s: u32 = 12345;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            bits.push(s);
        }
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut out = vec![bf16::ZERO; src.len()];
        bf16::narrow_slice(&src, &mut out);
        for (&x, y) in src.iter().zip(&out) {
            assert_eq!(
                y.to_bits(),
                half::bf16::from_f32(x).to_bits(),
                "{:#010x}",
                x.to_bits()
            );
        }
    }

    #[test]
    fn f16_slices_match_scalar() {
        let src: Vec<f32> = (0..1000)
            .map(|i| (i as f32 - 500.0) * 0.37 + 1e-6)
            .collect();
        let mut h = vec![f16::ZERO; src.len()];
        f16::narrow_slice(&src, &mut h);
        let mut back = vec![0.0f32; src.len()];
        f16::widen_slice(&h, &mut back);
        for ((&x, y), &z) in src.iter().zip(&h).zip(&back) {
            assert_eq!(y.to_bits(), f16::from_f32(x).to_bits());
            assert_eq!(z.to_bits(), y.to_f32().to_bits());
        }
    }
}
