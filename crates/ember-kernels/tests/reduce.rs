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

/// The two passes of a whole reduction (Note [Split whole reductions] in
/// crates/ember-tensor/src/cuda/reduce.rs): `reduce_part_{op}` on `parts` blocks of 64
/// threads, then `reduce_combine_{op}` on one block.
fn run_split<T: Dt, O: Dt>(op: &str, x: &[T], parts: u32) -> O {
    let (d, m) = setup(0);
    let din = Buf::from_slice(&d, 0, x);
    // 16 bytes per partial, the largest accumulator.
    let partials = Buf::<i64>::zeros(&d, 0, 2 * parts as usize);
    let out = Buf::<O>::zeros(&d, 0, 1);
    let mut args = KernelArgs::new();
    args.push(x.len() as i64).ptr(din.ptr).ptr(partials.ptr);
    let part = format!("reduce_part_{op}_{}", T::SUFFIX);
    common::launch(&d, m, &part, parts, 64, 0, &mut args).unwrap();
    let mut args = KernelArgs::new();
    args.push(i64::from(parts)).ptr(partials.ptr).ptr(out.ptr);
    let combine = format!("reduce_combine_{op}_{}", T::SUFFIX);
    common::launch(&d, m, &combine, 1, 64, 0, &mut args).unwrap();
    out.to_vec()[0]
}

/// Whole reductions split over 1 and 3 blocks (block-tiled shares of 1024 f32 or 4096 u8
/// elements per block and pass, so the longer sizes take several passes). Sums and products
/// against f64/i64 references; for max/min and the arg forms, the winners are planted where
/// the first one lies in a later block than another equal one (and, for floats, the first of
/// two NaNs likewise), so the combine must keep the first index, not the first block.
fn check_split<T: Dt, S: Dt>(seed: u64) {
    let mut rng = Lcg(seed);
    let sfx = T::SUFFIX;
    for size in [1usize, 37, 1000, 13_001] {
        for parts in [1u32, 3] {
            let x = values::<T>(&mut rng, size, 4.0, false);
            let got: S = run_split("sum", &x, parts);
            if T::FLOAT {
                let want: f64 = x.iter().map(|v| v.to_f64()).sum();
                let mag: f64 = x.iter().map(|v| v.to_f64().abs()).sum();
                let tol = if sfx == "f64" { 1e-14 } else { 1e-5 };
                let ok = is_close(got.to_f64(), want, T::TOL, tol * mag + 1e-30);
                assert!(ok, "split sum_{sfx} n={size}/{parts}: {got:?}, want {want}");
            } else {
                let want = x.iter().fold(0i64, |a, v| a.wrapping_add(v.to_i64()));
                assert_eq!(got.to_i64(), want, "split sum_{sfx} n={size}/{parts}");
            }
            let x: Vec<T> = if T::FLOAT {
                let near_one = |_| T::from_f64(1.0 + rng.f32(0.01) as f64);
                (0..size).map(near_one).collect()
            } else {
                values::<T>(&mut rng, size, 0.0, false)
            };
            let got: S = run_split("prod", &x, parts);
            if T::FLOAT {
                let want: f64 = x.iter().map(|v| v.to_f64()).product();
                let tol: f64 = if sfx == "f64" { 1e-13 } else { 2e-4 };
                let ok = is_close(got.to_f64(), want, tol.max(T::TOL), 0.0);
                assert!(
                    ok,
                    "split prod_{sfx} n={size}/{parts}: {got:?}, want {want}"
                );
            } else {
                let want = x.iter().fold(1i64, |a, v| a.wrapping_mul(v.to_i64()));
                assert_eq!(got.to_i64(), want, "split prod_{sfx} n={size}/{parts}");
            }
            for (op, max) in [("max", true), ("min", false)] {
                // Background 0 or 1 (bool) or -1 / +1; the winners ±2 (true/false for bool).
                let (bg, win) = match (sfx, max) {
                    ("bool", true) => (0, 1),
                    ("bool", false) => (1, 0),
                    ("u8", true) => (1, 2),
                    ("u8", false) => (1, 0),
                    (_, true) => (-1, 2),
                    (_, false) => (1, -2),
                };
                let mut x: Vec<T> = (0..size).map(|_| T::from_i64(bg)).collect();
                // Element 3000 is in the third block's first tile (f32), 7000 in the first
                // block's second pass; scaled down for short sizes.
                let plant = |p: usize| p * size / 13_001;
                for p in [plant(7000), plant(3000), plant(12_000)] {
                    x[p] = T::from_i64(win);
                }
                let first = plant(3000).min(plant(7000));
                let (v, i): (T, i64) = (
                    run_split(op, &x, parts),
                    run_split(&format!("arg{op}"), &x, parts),
                );
                assert_eq!(i, first as i64, "split arg{op}_{sfx} n={size}/{parts}");
                assert_eq!(
                    bits(v),
                    bits(T::from_i64(win)),
                    "split {op}_{sfx} n={size}/{parts}"
                );
                if T::FLOAT && size > 1 {
                    // Two NaNs: the first wins, wherever the blocks put them.
                    x[plant(9000)] = T::from_f64(f64::NAN);
                    x[plant(5000)] = T::from_f64(f64::NAN);
                    let nan_at = plant(5000).min(plant(9000)) as i64;
                    let i: i64 = run_split(&format!("arg{op}"), &x, parts);
                    assert_eq!(i, nan_at, "split arg{op}_{sfx} with NaN n={size}/{parts}");
                    let v: T = run_split(op, &x, parts);
                    assert!(
                        v.to_f64().is_nan(),
                        "split {op}_{sfx} with NaN n={size}/{parts}"
                    );
                }
            }
        }
    }
}

#[test]
fn split_whole_reductions_of_floats() {
    check_split::<f32, f32>(11);
    check_split::<f64, f64>(12);
    check_split::<f16, f16>(13);
    check_split::<bf16, bf16>(14);
}

#[test]
fn split_whole_reductions_of_integers_and_bool() {
    check_split::<i64, i64>(15);
    check_split::<i32, i64>(16);
    check_split::<u8, i64>(17);
    check_split::<B, i64>(18);
}
