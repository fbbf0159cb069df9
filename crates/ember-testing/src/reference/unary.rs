//! Elementwise functions in f64: the ones with no `f64` method of the same name.

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, PI};

/// The error function, to about one ulp of f64: the Maclaurin series below 3, Laplace's
/// continued fraction up to 6, 1 above (the CPU backend's algorithm,
/// `crates/ember-tensor/src/op.rs`).
///
/// ```
/// use ember_testing::reference::erf;
/// assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
/// assert_eq!(erf(-10.0), -1.0);
/// ```
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 3.0 {
        let x2 = a * a;
        let (mut term, mut sum) = (a, a);
        let mut k = 1.0;
        while term > sum * 1e-17 {
            term *= 2.0 * x2 / (2.0 * k + 1.0);
            sum += term;
            k += 1.0;
        }
        FRAC_2_SQRT_PI * (-x2).exp() * sum
    } else if a > 6.0 {
        1.0
    } else {
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (PI.sqrt() * f)
    };
    if x < 0.0 { -r } else { r }
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x · sigmoid(x)`.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, and `x` itself above 20 (PyTorch's default `threshold`).
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// GELU, exact: `x/2 · (1 + erf(x/√2))`.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2))
}

/// GELU, tanh approximation: `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: f64) -> f64 {
    let k = (2.0 / PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044_715 * x * x * x)).tanh())
}

/// PyTorch's integer `pow`: by squaring, wrapping on overflow; a negative exponent gives
/// `1` for base 1, `±1` for base -1 and 0 otherwise (`crates/ember-tensor/src/op.rs`).
///
/// ```
/// use ember_testing::reference::int_pow;
/// assert_eq!(int_pow(3, 4), 81);
/// assert_eq!(int_pow(-1, -3), -1);
/// assert_eq!(int_pow(2, -1), 0);
/// assert_eq!(int_pow(2, 64), 0); // wraps
/// ```
pub fn int_pow(mut base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut e, mut acc) = (exp as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}
