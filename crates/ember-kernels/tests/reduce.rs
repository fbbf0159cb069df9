//! The reduction kernels (`kernels/reduce.cu`) over [outer, size, inner]: both work shapes
//! (block per row for inner = 1, thread per column otherwise), rows longer than the block,
//! empty rows, every dtype. Sums and products against f64/i64 references within the
//! accumulation's tolerance; max/min/argmax/argmin exactly, with the CPU's NaN and
//! first-index rules.
#![allow(clippy::unwrap_used)]

mod common;

use common::{B, Buf, Dt, setup, values};
use ember_kernels::KernelArgs;
use ember_testing::reference::extreme;
use ember_testing::{Lcg, is_close};
use half::{bf16, f16};

const SHAPES: &[(usize, usize, usize)] = &[
    (3, 1000, 1),
    (5, 33, 1),
    (2, 1, 1),
    (2, 37, 5),
    (1, 300, 40),
    (3, 0, 1),
    (2, 0, 4),
];

fn run<T: Dt, O: Dt>(name: &str, shape: (usize, usize, usize), x: &[T]) -> Vec<O> {
    let (d, m) = setup(0);
    let (outer, size, inner) = shape;
    let din = Buf::from_slice(&d, 0, x);
    let out = Buf::<O>::zeros(&d, 0, outer * inner);
    let mut args = KernelArgs::new();
    args.push(outer as i64)
        .push(size as i64)
        .push(inner as i64)
        .ptr(din.ptr)
        .ptr(out.ptr);
    // Block of 128 (a multiple of 32, shorter than the long rows), grid of 2 (fewer blocks
    // than rows: the grid-stride loop over rows).
    common::launch(&d, m, name, 2, 128, 0, &mut args).unwrap();
    out.to_vec()
}

/// The column of output `o`: its `size` elements.
fn column<T: Copy>(x: &[T], shape: (usize, usize, usize), o: usize) -> Vec<T> {
    let (_, size, inner) = shape;
    let (b, j) = (o / inner, o % inner);
    (0..size).map(|r| x[(b * size + r) * inner + j]).collect()
}

fn bits<T: Dt>(x: T) -> Vec<u8> {
    let mut o = Vec::new();
    x.write(&mut o);
    o
}

fn check_dtype<T: Dt, S: Dt>(seed: u64) {
    let mut rng = Lcg(seed);
    for &shape in SHAPES {
        let (outer, size, inner) = shape;
        let n = outer * size * inner;
        let sfx = T::SUFFIX;
        // Sum: values in [-4, 4) without specials, so the tolerance is meaningful.
        let x = values::<T>(&mut rng, n, 4.0, false);
        let got: Vec<S> = run(&format!("reduce_sum_{sfx}"), shape, &x);
        for (o, g) in got.iter().enumerate() {
            let col = column(&x, shape, o);
            if T::FLOAT {
                let want: f64 = col.iter().map(|v| v.to_f64()).sum();
                let mag: f64 = col.iter().map(|v| v.to_f64().abs()).sum();
                let tol = if sfx == "f64" { 1e-14 } else { 1e-5 };
                assert!(
                    is_close(g.to_f64(), want, T::TOL, tol * mag + 1e-30),
                    "reduce_sum_{sfx} {shape:?} output {o}: {g:?}, want {want}"
                );
            } else {
                let want = col.iter().fold(0i64, |a, v| a.wrapping_add(v.to_i64()));
                assert_eq!(g.to_i64(), want, "reduce_sum_{sfx} {shape:?} output {o}");
            }
        }
        // Prod: floats near 1 (so long rows stay finite), integers as they come (wrapping).
        let x: Vec<T> = if T::FLOAT {
            (0..n)
                .map(|_| T::from_f64(1.0 + rng.f32(0.05) as f64))
                .collect()
        } else {
            values::<T>(&mut rng, n, 0.0, false)
        };
        let got: Vec<S> = run(&format!("reduce_prod_{sfx}"), shape, &x);
        for (o, g) in got.iter().enumerate() {
            let col = column(&x, shape, o);
            if T::FLOAT {
                let want: f64 = col.iter().map(|v| v.to_f64()).product();
                let tol: f64 = if sfx == "f64" { 1e-13 } else { 2e-4 };
                assert!(
                    is_close(g.to_f64(), want, tol.max(T::TOL), 0.0),
                    "reduce_prod_{sfx} {shape:?} output {o}: {g:?}, want {want}"
                );
            } else {
                let want = col.iter().fold(1i64, |a, v| a.wrapping_mul(v.to_i64()));
                assert_eq!(g.to_i64(), want, "reduce_prod_{sfx} {shape:?} output {o}");
            }
        }
        if size == 0 {
            continue;
        }
        // Extremes: few distinct values (ties), specials (NaN, ±0, ±inf) for floats.
        let x: Vec<T> = (0..n)
            .map(|i| {
                if T::FLOAT && i % 17 == 9 {
                    T::from_f64([f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY][i % 5])
                } else if T::FLOAT && i % 7 == 2 {
                    T::from_f64(-0.0)
                } else {
                    T::from_i64((rng.next_u64() % 9) as i64 - 4)
                }
            })
            .collect();
        for (op, max) in [("max", true), ("min", false)] {
            let got: Vec<T> = run(&format!("reduce_{op}_{sfx}"), shape, &x);
            let args: Vec<i64> = run(&format!("reduce_arg{op}_{sfx}"), shape, &x);
            for o in 0..outer * inner {
                // The CPU's fold (reference::extreme), on the values as f64 (floats) or
                // i64 (integers), which order as in T.
                let col = column(&x, shape, o);
                let i = if T::FLOAT {
                    let col: Vec<f64> = col.iter().map(|v| v.to_f64()).collect();
                    extreme(&col, max).unwrap().1
                } else {
                    let col: Vec<i64> = col.iter().map(|v| v.to_i64()).collect();
                    extreme(&col, max).unwrap().1
                };
                let (v, i) = (col[i], i as i64);
                assert_eq!(
                    bits(got[o]),
                    bits(v),
                    "reduce_{op}_{sfx} {shape:?} output {o}"
                );
                assert_eq!(args[o], i, "reduce_arg{op}_{sfx} {shape:?} output {o}");
            }
        }
    }
}

#[test]
fn reductions_of_floats() {
    check_dtype::<f32, f32>(1);
    check_dtype::<f64, f64>(2);
    check_dtype::<f16, f16>(3);
    check_dtype::<bf16, bf16>(4);
}

#[test]
fn reductions_of_integers_and_bool() {
    check_dtype::<i64, i64>(5);
    check_dtype::<i32, i64>(6);
    check_dtype::<u8, i64>(7);
    check_dtype::<B, i64>(8);
}
