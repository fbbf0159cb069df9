//! The binary elementwise kernels, comparisons and where (`kernels/elementwise.cu`): every op
//! of crates/ember-tensor/src/op.rs for every dtype it takes, on contiguous (vector path and
//! tail), misaligned, transposed, broadcast and rank-8 layouts, against Rust references with
//! the CPU backend's semantics (f16/bf16 in f32, one rounding). Exact, except float pow.
#![allow(clippy::unwrap_used)]

mod common;

use common::{B, Buf, Dt, gathered, layouts, setup, values};
use ember_kernels::{KernelArgs, StridedLayout};
use ember_testing::reference::{int_pow, span};
use ember_testing::{Lcg, is_close};
use half::{bf16, f16};

/// Runs kernel `name` (a binary-shaped kernel: n, la, lb, a, b, out) over every layout with
/// inputs cycled from `xa`/`xb`, checking each element with `check(a, b, out)`.
fn run_binary<T: Dt, O: Dt>(name: &str, xa: &[T], xb: &[T], check: &dyn Fn(T, T, O) -> bool) {
    let (d, m) = setup(0);
    for (shape, views) in layouts() {
        let (va, vb, vo) = (&views[0], &views[1], &views[2]);
        let n: usize = shape.iter().product();
        let a: Vec<T> = xa
            .iter()
            .copied()
            .cycle()
            .take(va.offset + span(&shape, &va.strides))
            .collect();
        let b: Vec<T> = xb
            .iter()
            .copied()
            .cycle()
            .take(vb.offset + span(&shape, &vb.strides))
            .collect();
        let (da, db) = (Buf::from_slice(&d, 0, &a), Buf::from_slice(&d, 0, &b));
        let out = Buf::<O>::zeros(&d, 0, n + vo.offset);
        let mut args = KernelArgs::new();
        args.push(n as i64)
            .push(StridedLayout::new(&shape, &va.strides).unwrap())
            .push(StridedLayout::new(&shape, &vb.strides).unwrap())
            .ptr(da.at(va.offset))
            .ptr(db.at(vb.offset))
            .ptr(out.at(vo.offset));
        common::launch(&d, m, name, 3, 128, 0, &mut args).unwrap();
        let got = out.to_vec();
        let (ga, gb) = (gathered(&a, &shape, va), gathered(&b, &shape, vb));
        for i in 0..n {
            assert!(
                check(ga[i], gb[i], got[vo.offset + i]),
                "{name} {shape:?} element {i}: {:?}, {:?} -> {:?}",
                ga[i],
                gb[i],
                got[vo.offset + i]
            );
        }
    }
}

/// Same value, NaN matching NaN (payloads may differ), -0 distinct from +0.
fn same_float(x: f64, y: f64) -> bool {
    (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()
}

type F64Op = fn(f64, f64) -> f64;

/// The float references, computed in f64 from operands that are exact in f32: a single
/// IEEE operation rounded to f32 and then to T is what the kernel's f32 operation gives
/// (f64 has more than twice f32's precision, so the double rounding is innocuous).
const FLOAT_OPS: &[(&str, F64Op)] = &[
    ("badd", |a, b| a + b),
    ("bsub", |a, b| a - b),
    ("bmul", |a, b| a * b),
    ("bdiv", |a, b| a / b),
    ("bmaximum", |a, b| {
        if a.is_nan() {
            a
        } else if b.is_nan() || b > a {
            b
        } else {
            a
        }
    }),
    ("bminimum", |a, b| {
        if a.is_nan() {
            a
        } else if b.is_nan() || b < a {
            b
        } else {
            a
        }
    }),
];

fn float_binary<T: Dt>() {
    let mut rng = Lcg(0xDEAD_BEEF_0123_4567);
    let xa = values::<T>(&mut rng, 517, 300.0, true);
    let xb = values::<T>(&mut rng, 389, 300.0, true);
    for &(op, f) in FLOAT_OPS {
        let name = format!("{op}_{}", T::SUFFIX);
        run_binary::<T, T>(&name, &xa, &xb, &|a, b, y| {
            // f32 arithmetic then one rounding to T, as the CPU: through f32 for the halves.
            let want = if T::SUFFIX == "f64" {
                f(a.to_f64(), b.to_f64())
            } else {
                T::from_f64(f(a.to_f64(), b.to_f64()) as f32 as f64).to_f64()
            };
            same_float(y.to_f64(), want)
        });
    }
    // pow: library functions on both sides, so within tolerance; small bases and exponents.
    let xa = values::<T>(&mut rng, 300, 4.0, true);
    let xb = values::<T>(&mut rng, 200, 6.0, true);
    run_binary::<T, T>(&format!("bpow_{}", T::SUFFIX), &xa, &xb, &|a, b, y| {
        let want = T::from_f64(a.to_f64().powf(b.to_f64())).to_f64();
        is_close(y.to_f64(), want, 2.0 * T::TOL, T::TOL * 1e-3)
    });
    // logaddexp: library exp and log1p on both sides, so within tolerance.
    let xa = values::<T>(&mut rng, 300, 30.0, true);
    let xb = values::<T>(&mut rng, 200, 30.0, true);
    run_binary::<T, T>(
        &format!("blogaddexp_{}", T::SUFFIX),
        &xa,
        &xb,
        &|a, b, y| {
            let (a, b) = (a.to_f64(), b.to_f64());
            let want = if a == b && a.is_infinite() {
                a // the same infinity twice: itself, not NaN
            } else {
                a.max(b) + (-(a - b).abs()).exp().ln_1p()
            };
            let (y, want) = (y.to_f64(), T::from_f64(want).to_f64());
            y == want || is_close(y, want, 2.0 * T::TOL, T::TOL * 1e-3)
        },
    );
}

#[test]
fn float_binary_f32() {
    float_binary::<f32>();
}

#[test]
fn float_binary_f64() {
    float_binary::<f64>();
}

#[test]
fn float_binary_f16() {
    float_binary::<f16>();
}

#[test]
fn float_binary_bf16() {
    float_binary::<bf16>();
}

type IntOp = fn(i64, i64) -> i64;

/// Integer ops computed in i64 and wrapped into T (the same as wrapping in T).
fn int_binary<T: Dt + PartialOrd>() {
    let mut rng = Lcg(0x5151_7777_0000_1234);
    let xa = values::<T>(&mut rng, 517, 0.0, true);
    let xb = values::<T>(&mut rng, 389, 0.0, true);
    let ops: [(&str, IntOp); 5] = [
        ("badd", i64::wrapping_add),
        ("bsub", i64::wrapping_sub),
        ("bmul", i64::wrapping_mul),
        ("bmaximum", i64::max),
        ("bminimum", i64::min),
    ];
    for (op, f) in ops {
        run_binary::<T, T>(&format!("{op}_{}", T::SUFFIX), &xa, &xb, &|a, b, y| {
            y == T::from_i64(f(a.to_i64(), b.to_i64()))
        });
    }
    // pow with exponents in [-3, 70): wrapping, negative exponents as PyTorch.
    let exps: Vec<T> = (0..97)
        .map(|i| {
            T::from_i64(if T::SUFFIX == "u8" {
                i % 70
            } else {
                i % 73 - 3
            })
        })
        .collect();
    let bases: Vec<T> = (0..61)
        .map(|i| T::from_i64(if T::SUFFIX == "u8" { i } else { i - 7 }))
        .collect();
    run_binary::<T, T>(&format!("bpow_{}", T::SUFFIX), &bases, &exps, &|a, b, y| {
        y == T::from_i64(int_pow(a.to_i64(), b.to_i64()))
    });
}

#[test]
fn integer_binary_ops_wrap_like_the_cpu() {
    int_binary::<i64>();
    int_binary::<i32>();
    int_binary::<u8>();
}

#[test]
fn bool_binary_ops() {
    let mut rng = Lcg(99);
    let xa = values::<B>(&mut rng, 117, 0.0, false);
    let xb = values::<B>(&mut rng, 89, 0.0, false);
    type BoolOp = fn(bool, bool) -> bool;
    let ops: [(&str, BoolOp); 7] = [
        ("badd", |a, b| a | b),
        ("bmul", |a, b| a & b),
        ("bmaximum", |a, b| a | b),
        ("bminimum", |a, b| a & b),
        ("bland", |a, b| a & b),
        ("blor", |a, b| a | b),
        ("blxor", |a, b| a ^ b),
    ];
    for (op, f) in ops {
        run_binary::<B, B>(&format!("{op}_bool"), &xa, &xb, &|a, b, y| {
            y.0 == f(a.0, b.0)
        });
    }
}

fn comparisons<T: Dt>() {
    let mut rng = Lcg(0xC0C0_A5A5_1111_2222);
    // Few distinct values so that equality happens; specials for floats (NaN, ±0, ±inf).
    let xa: Vec<T> = values::<T>(&mut rng, 301, 3.0, true);
    let small = |rng: &mut Lcg, n: usize| -> Vec<T> {
        (0..n)
            .map(|i| {
                if T::FLOAT && i % 11 == 3 {
                    T::from_f64([f64::NAN, -0.0, 0.0, f64::INFINITY][i % 4])
                } else {
                    T::from_i64((rng.next_u64() % 5) as i64)
                }
            })
            .collect()
    };
    let (sa, sb) = (small(&mut rng, 211), small(&mut rng, 157));
    type Cmp = fn(f64, f64) -> bool;
    let ops: [(&str, Cmp); 6] = [
        ("eq", |a, b| a == b),
        ("ne", |a, b| a != b),
        ("lt", |a, b| a < b),
        ("le", |a, b| a <= b),
        ("gt", |a, b| a > b),
        ("ge", |a, b| a >= b),
    ];
    for (op, f) in ops {
        let name = format!("cmp_{op}_{}", T::SUFFIX);
        // i64 compares exactly (to_f64 would merge large neighbours): compare as i128 there.
        let check = |a: T, b: T, y: B| {
            let want = if T::FLOAT {
                f(a.to_f64(), b.to_f64())
            } else {
                let (x, z) = (a.to_i64() as i128, b.to_i64() as i128);
                f(x.cmp(&z) as i64 as f64, 0.0)
            };
            y.0 == want
        };
        run_binary::<T, B>(&name, &sa, &sb, &check);
        run_binary::<T, B>(&name, &xa, &sa, &check);
    }
}

#[test]
fn comparisons_every_dtype() {
    comparisons::<f32>();
    comparisons::<f64>();
    comparisons::<f16>();
    comparisons::<bf16>();
    comparisons::<i64>();
    comparisons::<i32>();
    comparisons::<u8>();
    comparisons::<B>();
}

fn where_case<T: Dt>() {
    let (d, m) = setup(0);
    let mut rng = Lcg(0x7777_1234_4321_0001);
    let xa = values::<T>(&mut rng, 301, 50.0, true);
    let xb = values::<T>(&mut rng, 203, 50.0, true);
    let xc = values::<B>(&mut rng, 97, 0.0, false);
    let name = format!("where_{}", T::SUFFIX);
    for (shape, views) in layouts() {
        // cond takes the second view (broadcast in several layouts), a the first, b the third.
        let (vc, va, vb) = (&views[1], &views[0], &views[2]);
        let n: usize = shape.iter().product();
        let take = |x: &[T], v: &common::View| -> Vec<T> {
            x.iter()
                .copied()
                .cycle()
                .take(v.offset + span(&shape, &v.strides))
                .collect()
        };
        let (a, b) = (take(&xa, va), take(&xb, vb));
        let c: Vec<B> = xc
            .iter()
            .copied()
            .cycle()
            .take(vc.offset + span(&shape, &vc.strides))
            .collect();
        let (dc, da, db) = (
            Buf::from_slice(&d, 0, &c),
            Buf::from_slice(&d, 0, &a),
            Buf::from_slice(&d, 0, &b),
        );
        let out = Buf::<T>::zeros(&d, 0, n);
        let mut args = KernelArgs::new();
        args.push(n as i64)
            .push(StridedLayout::new(&shape, &vc.strides).unwrap())
            .push(StridedLayout::new(&shape, &va.strides).unwrap())
            .push(StridedLayout::new(&shape, &vb.strides).unwrap())
            .ptr(dc.at(vc.offset))
            .ptr(da.at(va.offset))
            .ptr(db.at(vb.offset))
            .ptr(out.ptr);
        common::launch(&d, m, &name, 2, 96, 0, &mut args).unwrap();
        let (gc, ga, gb) = (
            gathered(&c, &shape, vc),
            gathered(&a, &shape, va),
            gathered(&b, &shape, vb),
        );
        let want: Vec<T> = (0..n)
            .map(|i| if gc[i].0 { ga[i] } else { gb[i] })
            .collect();
        // Bit copies: compare the bytes (NaN payloads included).
        let bytes = |v: &[T]| {
            let mut o = Vec::new();
            v.iter().for_each(|&x| x.write(&mut o));
            o
        };
        assert_eq!(bytes(&out.to_vec()), bytes(&want), "{name} {shape:?}");
    }
}

#[test]
fn where_every_dtype() {
    where_case::<f32>();
    where_case::<f64>();
    where_case::<f16>();
    where_case::<bf16>();
    where_case::<i64>();
    where_case::<i32>();
    where_case::<u8>();
    where_case::<B>();
}
