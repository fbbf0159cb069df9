//! `assert_close`: values within a tolerance per dtype, as `torch.testing.assert_close`.

use ember_tensor::{DType, Device, Tensor};
use half::{bf16, f16};

/// How far apart two values may be: `|actual - expected| <= atol + rtol * |expected|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// The relative part, a fraction of `|expected|`.
    pub rtol: f64,
    /// The absolute part.
    pub atol: f64,
}

impl Tolerance {
    /// Exact equality (integers, bools, copies).
    pub const EXACT: Tolerance = Tolerance::new(0.0, 0.0);

    /// A tolerance of `rtol` relative and `atol` absolute.
    pub const fn new(rtol: f64, atol: f64) -> Tolerance {
        Tolerance { rtol, atol }
    }

    /// `torch.testing.assert_close`'s defaults: f32 1.3e-6 / 1e-5, f64 1e-7 / 1e-7,
    /// f16 1e-3 / 1e-5, bf16 1.6e-2 / 1e-5 (rtol / atol); integers and bools exact.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance::new(1.3e-6, 1e-5),
            DType::F64 => Tolerance::new(1e-7, 1e-7),
            DType::F16 => Tolerance::new(1e-3, 1e-5),
            DType::Bf16 => Tolerance::new(1.6e-2, 1e-5),
            _ => Tolerance::EXACT,
        }
    }

    /// Both parts multiplied by `factor` (a longer accumulation, a device whose
    /// transcendentals differ).
    pub fn scaled(self, factor: f64) -> Tolerance {
        Tolerance::new(self.rtol * factor, self.atol * factor)
    }

    /// Whether `actual` is within this tolerance of `expected` (see [`is_close`]).
    pub fn accepts(self, actual: f64, expected: f64) -> bool {
        is_close(actual, expected, self.rtol, self.atol)
    }
}

/// Whether `actual ≈ expected`: both NaN, or equal (infinities must be equal), or
/// `|actual - expected| <= rtol * |expected| + atol`.
pub fn is_close(actual: f64, expected: f64, rtol: f64, atol: f64) -> bool {
    if actual.is_nan() || expected.is_nan() {
        return actual.is_nan() && expected.is_nan();
    }
    if actual == expected {
        return true;
    }
    if actual.is_infinite() || expected.is_infinite() {
        return false;
    }
    (actual - expected).abs() <= rtol * expected.abs() + atol
}

/// The values of one side of a comparison, read back to the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Compared {
    /// The values as f64, row-major.
    pub values: Vec<f64>,
    /// The shape, where the side has one (a tensor).
    pub dims: Option<Vec<usize>>,
    /// The dtype: a tensor's, or the element type of a slice.
    pub dtype: Option<DType>,
    /// The device of a tensor.
    pub device: Option<Device>,
}

impl Compared {
    fn flat(values: Vec<f64>, dtype: DType) -> Compared {
        Compared {
            values,
            dims: None,
            dtype: Some(dtype),
            device: None,
        }
    }
}

/// What `assert_close` compares: [`Tensor`]s (on any device, any dtype: read back as f64),
/// slices, arrays and `Vec`s of `f64`, `f32`, `f16` and `bf16`, and references to them.
pub trait Comparable {
    /// The values, read back to the host; an error in words when they cannot be read.
    fn compared(&self) -> Result<Compared, String>;
}

impl<T: Comparable + ?Sized> Comparable for &T {
    fn compared(&self) -> Result<Compared, String> {
        (**self).compared()
    }
}

impl Comparable for Tensor {
    fn compared(&self) -> Result<Compared, String> {
        let read = || -> ember_tensor::Result<Vec<f64>> {
            self.to_device(Device::Cpu)?
                .to_dtype(DType::F64)?
                .to_vec::<f64>()
        };
        let values = read().map_err(|e| format!("cannot read the tensor back: {e}"))?;
        Ok(Compared {
            values,
            dims: Some(self.dims().to_vec()),
            dtype: Some(self.dtype()),
            device: Some(self.device()),
        })
    }
}

macro_rules! comparable_slice {
    ($t:ty, $dtype:expr, $to:expr) => {
        impl Comparable for [$t] {
            fn compared(&self) -> Result<Compared, String> {
                Ok(Compared::flat(self.iter().map($to).collect(), $dtype))
            }
        }
        impl Comparable for Vec<$t> {
            fn compared(&self) -> Result<Compared, String> {
                self.as_slice().compared()
            }
        }
        impl<const N: usize> Comparable for [$t; N] {
            fn compared(&self) -> Result<Compared, String> {
                self.as_slice().compared()
            }
        }
    };
}
comparable_slice!(f64, DType::F64, |&v: &f64| v);
comparable_slice!(f32, DType::F32, |&v: &f32| f64::from(v));
comparable_slice!(f16, DType::F16, |v: &f16| v.to_f64());
comparable_slice!(bf16, DType::Bf16, |v: &bf16| v.to_f64());

/// A comparison's settings: the tolerance (by default [`Tolerance::for_dtype`] of the actual
/// side's dtype), whether NaN equals NaN (by default it does: Ember's tests check that NaN
/// propagates; `torch.testing.assert_close` needs `equal_nan=True` for that), whether the
/// dtypes must agree, and a context line for the message.
#[derive(Clone, Debug)]
pub struct Close {
    tolerance: Option<Tolerance>,
    equal_nan: bool,
    check_dtype: bool,
    context: Option<String>,
}

impl Default for Close {
    fn default() -> Self {
        Close::new()
    }
}

impl Close {
    /// The defaults: tolerance by dtype, NaN equals NaN, dtypes of two tensors must agree.
    pub fn new() -> Close {
        Close {
            tolerance: None,
            equal_nan: true,
            check_dtype: true,
            context: None,
        }
    }

    /// With this tolerance instead of the dtype's.
    pub fn tol(mut self, tolerance: Tolerance) -> Close {
        self.tolerance = Some(tolerance);
        self
    }

    /// With this relative and absolute tolerance.
    pub fn rtol_atol(self, rtol: f64, atol: f64) -> Close {
        self.tol(Tolerance::new(rtol, atol))
    }

    /// Whether NaN equals NaN (`false`: any NaN is a mismatch, as PyTorch's default).
    pub fn equal_nan(mut self, on: bool) -> Close {
        self.equal_nan = on;
        self
    }

    /// Whether two tensors' dtypes must agree (on by default, as PyTorch's).
    pub fn check_dtype(mut self, on: bool) -> Close {
        self.check_dtype = on;
        self
    }

    /// A line naming what is compared (the op, the case), first in the message.
    pub fn context(mut self, what: impl Into<String>) -> Close {
        self.context = Some(what.into());
        self
    }

    /// Compares `actual` with `expected`: the same number of elements (and the same shape
    /// when both have one; the same dtype when both are tensors and `check_dtype`), each
    /// element within the tolerance.
    ///
    /// # Errors
    ///
    /// A [`Mismatch`] whose message names the first mismatching index (flat, and per
    /// dimension where there is a shape), both values, the count of mismatches, and the
    /// greatest absolute and relative differences.
    pub fn check(
        &self,
        actual: &(impl Comparable + ?Sized),
        expected: &(impl Comparable + ?Sized),
    ) -> Result<(), Mismatch> {
        let fail = |message: String| Mismatch {
            message: match &self.context {
                Some(c) => format!("{c}: {message}"),
                None => message,
            },
        };
        let a = actual
            .compared()
            .map_err(|e| fail(format!("actual: {e}")))?;
        let e = expected
            .compared()
            .map_err(|e| fail(format!("expected: {e}")))?;
        if let (Some(da), Some(de)) = (&a.dims, &e.dims)
            && da != de
        {
            return Err(fail(format!(
                "shapes differ: actual {da:?}, expected {de:?}"
            )));
        }
        if a.values.len() != e.values.len() {
            return Err(fail(format!(
                "lengths differ: actual has {} elements, expected {}",
                a.values.len(),
                e.values.len()
            )));
        }
        if self.check_dtype
            && a.dims.is_some()
            && e.dims.is_some()
            && let (Some(ta), Some(te)) = (a.dtype, e.dtype)
            && ta != te
        {
            return Err(fail(format!("dtypes differ: actual {ta}, expected {te}")));
        }
        let dtype = a.dtype.or(e.dtype).unwrap_or(DType::F64);
        let tol = self
            .tolerance
            .unwrap_or_else(|| Tolerance::for_dtype(dtype));
        let ok = |x: f64, y: f64| {
            if x.is_nan() && y.is_nan() {
                self.equal_nan
            } else {
                tol.accepts(x, y)
            }
        };
        let mut first = None;
        let mut count = 0usize;
        let (mut max_abs, mut max_rel) = ((0.0f64, 0usize), (0.0f64, 0usize));
        for (i, (&x, &y)) in a.values.iter().zip(&e.values).enumerate() {
            if !ok(x, y) {
                count += 1;
                first.get_or_insert(i);
            }
            if x.is_finite() && y.is_finite() {
                let abs = (x - y).abs();
                let rel = if abs == 0.0 {
                    0.0
                } else if y == 0.0 {
                    f64::INFINITY
                } else {
                    abs / y.abs()
                };
                if abs > max_abs.0 {
                    max_abs = (abs, i);
                }
                if rel > max_rel.0 {
                    max_rel = (rel, i);
                }
            }
        }
        let Some(i) = first else {
            return Ok(());
        };
        let dims = a.dims.as_deref().or(e.dims.as_deref());
        let at = |i: usize| match dims {
            Some(d) if !d.is_empty() => format!("index {i} {:?}", unravel(i, d)),
            _ => format!("index {i}"),
        };
        let on = match a.device {
            Some(d) => format!(" on {d}"),
            None => String::new(),
        };
        let n = a.values.len();
        Err(fail(format!(
            "not close{on}: {count} of {n} elements differ ({dtype}: rtol {:e}, atol {:e}{})\n  \
             first mismatch at {}: actual {}, expected {}\n  \
             greatest absolute difference {} at {} (up to {:e} allowed)\n  \
             greatest relative difference {} at {} (up to {:e} allowed)",
            tol.rtol,
            tol.atol,
            if self.equal_nan { "" } else { ", NaN unequal" },
            at(i),
            a.values[i],
            e.values[i],
            max_abs.0,
            at(max_abs.1),
            tol.atol,
            max_rel.0,
            at(max_rel.1),
            tol.rtol,
        )))
    }

    /// [`check`](Close::check), panicking with the mismatch's message.
    ///
    /// # Panics
    ///
    /// When the values are not close.
    #[track_caller]
    pub fn assert(
        &self,
        actual: &(impl Comparable + ?Sized),
        expected: &(impl Comparable + ?Sized),
    ) {
        if let Err(m) = self.check(actual, expected) {
            panic!("{m}");
        }
    }
}

/// The multi-index of flat index `i` in a row-major `dims`.
fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for (d, &n) in dims.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = i % n;
            i /= n;
        }
    }
    idx
}

/// Why two sides are not close: the whole message of [`Close::check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The message.
    pub message: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Mismatch {}

/// Asserts that `actual` and `expected` are close with the tolerance of `actual`'s dtype
/// ([`Tolerance::for_dtype`]; f64 for a slice of f64): PyTorch's
/// `torch.testing.assert_close(actual, expected, equal_nan=True)`. Tensors on any device,
/// slices and `Vec`s of floats compare with each other.
///
/// ```
/// use ember_tensor::{Device, Tensor};
/// use ember_testing::assert_close;
/// let x = Tensor::from_slice(&[1f32, 2.], [2], &Device::Cpu)?;
/// assert_close(&x.mul(3.0)?, &[3.0, 6.0000001][..]);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
///
/// # Panics
///
/// When they are not close, with a message naming the first mismatching index, both values,
/// and the greatest absolute and relative differences.
#[track_caller]
pub fn assert_close(actual: &(impl Comparable + ?Sized), expected: &(impl Comparable + ?Sized)) {
    Close::new().assert(actual, expected);
}

/// [`assert_close`] with an explicit tolerance.
///
/// # Panics
///
/// When they are not close.
#[track_caller]
pub fn assert_close_tol(
    actual: &(impl Comparable + ?Sized),
    expected: &(impl Comparable + ?Sized),
    tolerance: Tolerance,
) {
    Close::new().tol(tolerance).assert(actual, expected);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_torch() {
        assert_eq!(
            Tolerance::for_dtype(DType::F32),
            Tolerance::new(1.3e-6, 1e-5)
        );
        assert_eq!(Tolerance::for_dtype(DType::F64), Tolerance::new(1e-7, 1e-7));
        assert_eq!(Tolerance::for_dtype(DType::F16), Tolerance::new(1e-3, 1e-5));
        assert_eq!(
            Tolerance::for_dtype(DType::Bf16),
            Tolerance::new(1.6e-2, 1e-5)
        );
        assert_eq!(Tolerance::for_dtype(DType::I64), Tolerance::EXACT);
    }

    #[test]
    fn nan_and_infinities() {
        assert!(is_close(f64::NAN, f64::NAN, 0.0, 0.0));
        assert!(!is_close(f64::NAN, 1.0, 1.0, 1.0));
        assert!(is_close(f64::INFINITY, f64::INFINITY, 0.0, 0.0));
        assert!(!is_close(f64::INFINITY, f64::NEG_INFINITY, 1.0, 1.0));
        assert!(!is_close(f64::INFINITY, 1e300, 1.0, 1.0));
        assert!(
            Close::new()
                .equal_nan(false)
                .check(&[f64::NAN], &[f64::NAN])
                .is_err()
        );
    }

    #[test]
    fn the_message_names_index_values_and_errors() {
        let m = Close::new()
            .context("case 3")
            .check(&[1.0f64, 2.0, 3.5, 4.0], &[1.0f64, 2.0, 3.0, 4.5])
            .expect_err("not close")
            .to_string();
        assert!(
            m.starts_with("case 3: not close: 2 of 4 elements differ (torch.float64: rtol 1e-7"),
            "{m}"
        );
        assert!(
            m.contains("first mismatch at index 2: actual 3.5, expected 3"),
            "{m}"
        );
        assert!(
            m.contains("greatest absolute difference 0.5 at index 2 (up to 1e-7 allowed)"),
            "{m}"
        );
        assert!(m.contains("greatest relative difference 0.1666"), "{m}");
        let short = Close::new()
            .check(&[1.0f64], &[1.0f64, 2.0])
            .expect_err("not close");
        assert!(short.message.contains("lengths differ"), "{short}");
    }

    #[test]
    fn slices_of_every_float_type() {
        assert_close(&[1.0f32, 2.0], &[1.0f64, 2.000001][..]);
        assert_close(&vec![f16::from_f32(0.1)], &[0.1f64]);
        assert_close(&[bf16::from_f32(3.0)], &[3.01f64]);
        let e = Close::new()
            .check(&[1.0f32], &[1.1f64])
            .expect_err("not close");
        assert!(e.message.contains("float32"), "{e}");
    }

    #[test]
    fn tensors_compare_shape_dtype_and_values() {
        let t = |v: &[f64], dims: &[usize]| {
            Tensor::from_slice(v, dims.to_vec(), Device::Cpu).expect("tensor")
        };
        let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        assert_close(&a, &a);
        assert_close(&a, &[1.0, 2.0, 3.0, 4.0]);
        let m = Close::new()
            .check(&a, &t(&[1.0, 2.0, 3.0, 4.0], &[4]))
            .expect_err("not close");
        assert!(m.message.contains("shapes differ"), "{m}");
        let m = Close::new()
            .check(&a, &t(&[1.0, 2.0, 3.0, 5.0], &[2, 2]))
            .expect_err("not close");
        assert!(m.message.contains("not close on cpu"), "{m}");
        assert!(m.message.contains("index 3 [1, 1]"), "{m}");
        let f = a.to_dtype(DType::F32).expect("cast");
        assert!(
            Close::new()
                .check(&f, &a)
                .expect_err("not close")
                .message
                .contains("dtypes differ")
        );
        Close::new().check_dtype(false).assert(&f, &a);
    }
}
