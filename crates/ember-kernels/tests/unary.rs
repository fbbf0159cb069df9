//! The unary elementwise kernels (`kernels/unary.cu`): every op of
//! crates/ember-tensor/src/op.rs for every dtype it takes, on contiguous (vector path and
//! tail), misaligned, transposed, broadcast and rank-8 layouts, against an f64 (or exact
//! integer) reference with the CPU backend's semantics.
#![allow(clippy::unwrap_used)]

mod common;

use common::{B, Buf, Dt, gathered, layouts, setup, values};
use ember_kernels::{KernelArgs, StridedLayout};
use ember_testing::reference::{self, span};
use ember_testing::{Lcg, is_close};
use half::{bf16, f16};

/// The float ops: kernel base name, f64 reference, input scale.
#[allow(clippy::type_complexity)]
const FLOAT_OPS: &[(&str, fn(f64) -> f64, f32)] = &[
    ("uneg", |x| -x, 100.0),
    ("uabs", |x| x.abs(), 100.0),
    (
        "usign",
        |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0 * x
            }
        },
        100.0,
    ),
    ("urelu", |x| if x < 0.0 { 0.0 } else { x }, 100.0),
    ("uexp", f64::exp, 20.0),
    ("ulog", f64::ln, 100.0),
    ("ulog1p", f64::ln_1p, 100.0),
    ("usqrt", f64::sqrt, 100.0),
    ("ursqrt", |x| 1.0 / x.sqrt(), 100.0),
    ("usin", f64::sin, 10.0),
    ("ucos", f64::cos, 10.0),
    ("utanh", f64::tanh, 5.0),
    ("usigmoid", reference::sigmoid, 20.0),
    ("ureciprocal", |x| 1.0 / x, 100.0),
    ("usilu", reference::silu, 20.0),
    ("usoftplus", reference::softplus, 30.0),
    ("ugelu_tanh", reference::gelu_tanh, 6.0),
    ("ugelu_erf", reference::gelu_erf, 6.0),
    ("uhardswish", |x| x * (x + 3.0).clamp(0.0, 6.0) / 6.0, 6.0),
];

/// Runs `{name}_{T}` over every layout of `common::layouts` with inputs from `gen`, and
/// checks each output element with `check(input, output)`.
fn run_unary<T: Dt>(name: &str, input: &[T], check: &dyn Fn(T, T) -> bool) {
    let (d, m) = setup(0);
    let kernel = format!("{name}_{}", T::SUFFIX);
    for (shape, views) in layouts() {
        let (vin, vout) = (&views[0], &views[2]);
        let n: usize = shape.iter().product();
        let len = vin.offset + span(&shape, &vin.strides);
        let data: Vec<T> = input.iter().copied().cycle().take(len).collect();
        let din = Buf::from_slice(&d, 0, &data);
        let out = Buf::<T>::zeros(&d, 0, n + vout.offset);
        let l = StridedLayout::new(&shape, &vin.strides).unwrap();
        let mut args = KernelArgs::new();
        args.push(n as i64)
            .push(l)
            .ptr(din.at(vin.offset))
            .ptr(out.at(vout.offset));
        common::launch(&d, m, &kernel, 3, 128, 0, &mut args).unwrap();
        let got = out.to_vec();
        for (i, (&x, &y)) in gathered(&data, &shape, vin)
            .iter()
            .zip(&got[vout.offset..])
            .enumerate()
        {
            assert!(
                check(x, y),
                "{kernel} {shape:?} element {i}: {x:?} -> {y:?}"
            );
        }
    }
}

fn float_ops<T: Dt>() {
    let mut rng = Lcg(0x1234_5678_9ABC_DEF1);
    // Absolute slack: a few units of the dtype's precision at magnitude 1 (results that
    // cancel, like gelu of a negative number, are only that accurate).
    let abs = T::TOL;
    for &(name, f, scale) in FLOAT_OPS {
        let input = values::<T>(&mut rng, 600, scale, true);
        run_unary::<T>(name, &input, &|x, y| {
            let want = T::from_f64(f(x.to_f64())).to_f64();
            is_close(y.to_f64(), want, 2.0 * T::TOL, abs)
        });
    }
}

#[test]
fn float_ops_f32() {
    float_ops::<f32>();
}

#[test]
fn float_ops_f64() {
    float_ops::<f64>();
}

#[test]
fn float_ops_f16() {
    float_ops::<f16>();
}

#[test]
fn float_ops_bf16() {
    float_ops::<bf16>();
}

/// The integer ops (wrapping as Rust's `wrapping_*`), exact.
fn int_ops<T: Dt>(neg: fn(T) -> T, abs: fn(T) -> T, sign: fn(T) -> T, relu: fn(T) -> T) {
    let mut rng = Lcg(0x0F0F_1234_5555_AAAA);
    let input = values::<T>(&mut rng, 700, 0.0, true);
    for (name, f) in [
        ("uneg", neg),
        ("uabs", abs),
        ("usign", sign),
        ("urelu", relu),
    ] {
        run_unary::<T>(name, &input, &|x, y| y == f(x));
    }
}

#[test]
fn integer_ops_wrap_like_the_cpu() {
    int_ops::<i64>(i64::wrapping_neg, i64::wrapping_abs, i64::signum, |x| {
        x.max(0)
    });
    int_ops::<i32>(i32::wrapping_neg, i32::wrapping_abs, i32::signum, |x| {
        x.max(0)
    });
    int_ops::<u8>(u8::wrapping_neg, |x| x, |x| u8::from(x > 0), |x| x);
    let mut rng = Lcg(7);
    let input = values::<B>(&mut rng, 300, 0.0, false);
    run_unary::<B>("usign", &input, &|x, y| x == y);
}

#[test]
fn special_float_values() {
    // Bit-level checks the tolerance cannot see: sign(-0) = -0, relu(-0) = -0, relu(NaN) NaN.
    let input = [-0.0f32, 0.0, f32::NAN, -3.0];
    run_unary::<f32>("usign", &input, &|x, y| {
        if x.is_nan() {
            y.is_nan()
        } else if x == 0.0 {
            y.to_bits() == x.to_bits()
        } else {
            y == x.signum()
        }
    });
    run_unary::<f32>("urelu", &input, &|x, y| {
        if x.is_nan() {
            y.is_nan()
        } else if x < 0.0 {
            y.to_bits() == 0
        } else {
            y.to_bits() == x.to_bits()
        }
    });
    run_unary::<f16>(
        "usoftplus",
        &[f16::from_f32(20.5), f16::from_f32(-30.0)],
        &|x, y| {
            let x = x.to_f64();
            let want = if x > 20.0 { x } else { x.exp().ln_1p() };
            is_close(y.to_f64(), want, 2e-3, 1e-7)
        },
    );
}
