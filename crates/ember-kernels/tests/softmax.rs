//! The fused softmax/log-softmax kernels (`kernels/softmax.cu`) over [outer, size, inner]:
//! both work shapes, rows longer than the block, and the CPU's special values (a NaN or +inf
//! makes its row NaN, -inf elements give 0 / -inf, a row of -inf is NaN), against an f64
//! reference of crates/ember-tensor/src/cpu/softmax.rs's formulas (`reference::softmax_row`).
#![allow(clippy::unwrap_used)]

mod common;

use common::{Buf, Dt, setup};
use ember_kernels::KernelArgs;
use ember_testing::reference::softmax_row;
use ember_testing::{Lcg, is_close};
use half::{bf16, f16};

fn case<T: Dt>(shape: (usize, usize, usize), specials: bool, seed: u64) {
    let (d, m) = setup(0);
    let (outer, size, inner) = shape;
    let n = outer * size * inner;
    let mut rng = Lcg(seed);
    let mut x: Vec<T> = (0..n).map(|_| T::from_f64(rng.f32(8.0) as f64)).collect();
    if specials && size > 3 {
        // Column 0 gets a NaN, column 1 a +inf, column 2 some -inf, column 3 is all -inf.
        let at = |b: usize, r: usize, j: usize| (b * size + r) * inner + j;
        let cols = outer * inner;
        let col = |c: usize| (c / inner, c % inner);
        if cols > 3 {
            let (b, j) = col(0);
            x[at(b, size / 2, j)] = T::from_f64(f64::NAN);
            let (b, j) = col(1);
            x[at(b, 1, j)] = T::from_f64(f64::INFINITY);
            let (b, j) = col(2);
            x[at(b, 0, j)] = T::from_f64(f64::NEG_INFINITY);
            x[at(b, size - 1, j)] = T::from_f64(f64::NEG_INFINITY);
            let (b, j) = col(3);
            for r in 0..size {
                x[at(b, r, j)] = T::from_f64(f64::NEG_INFINITY);
            }
        }
    }
    let din = Buf::from_slice(&d, 0, &x);
    for log in [false, true] {
        let name = format!("{}softmax_{}", if log { "log_" } else { "" }, T::SUFFIX);
        let out = Buf::<T>::zeros(&d, 0, n);
        let mut args = KernelArgs::new();
        args.push(outer as i64)
            .push(size as i64)
            .push(inner as i64)
            .ptr(din.ptr)
            .ptr(out.ptr);
        common::launch(&d, m, &name, 2, 64, 0, &mut args).unwrap();
        let got = out.to_vec();
        for c in 0..outer * inner {
            let (b, j) = (c / inner, c % inner);
            let idx: Vec<usize> = (0..size).map(|r| (b * size + r) * inner + j).collect();
            let row: Vec<f64> = idx.iter().map(|&i| x[i].to_f64()).collect();
            let want = softmax_row(&row, log);
            for (k, &i) in idx.iter().enumerate() {
                let w = T::from_f64(want[k]).to_f64();
                // Softmax values are in [0, 1]: an absolute slack for the exp's error;
                // log-softmax values grow with the spread of the row: relative.
                let ok = if log {
                    is_close(got[i].to_f64(), w, 2.0 * T::TOL, 4.0 * T::TOL)
                } else {
                    is_close(got[i].to_f64(), w, 2.0 * T::TOL, T::TOL * 1e-2)
                };
                assert!(
                    ok,
                    "{name} {shape:?} column {c} element {k}: {:?}, want {w} (x = {})",
                    got[i], row[k]
                );
            }
        }
    }
}

fn every_shape<T: Dt>() {
    for (i, &shape) in [
        (3, 1000, 1),
        (6, 33, 1),
        (4, 7, 1),
        (1, 1, 1),
        (2, 17, 6),
        (1, 50, 70),
    ]
    .iter()
    .enumerate()
    {
        case::<T>(shape, false, 10 + i as u64);
        case::<T>(shape, true, 20 + i as u64);
    }
}

#[test]
fn softmax_f32() {
    every_shape::<f32>();
}

#[test]
fn softmax_f64() {
    every_shape::<f64>();
}

#[test]
fn softmax_f16() {
    every_shape::<f16>();
}

#[test]
fn softmax_bf16() {
    every_shape::<bf16>();
}
