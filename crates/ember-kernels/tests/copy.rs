#![allow(clippy::unwrap_used)]
//! `copy_{dtype}` and `clamp_{dtype}` (kernels/copy.cu) on the emulator, every dtype,
//! against Rust references: a strided (transposed, offset) read into a strided write, and
//! clamp with either bound, NaN kept, out of place and in place.

mod common;

use common::{Buf, Elem, launch, setup};
use ember_kernels::{KernelArgs, StridedLayout};
use half::{bf16, f16};

/// Copies a transposed 3x4 view (stored at an offset) into the transposed positions of a
/// 4x3 output, so both sides are strided, and checks every element.
fn copy_case<T: Elem>(suffix: &str, data: &[T]) {
    assert!(data.len() >= 13);
    let (d, m) = setup(0);
    let src = Buf::<T>::from_slice(&d, 0, data);
    let zero = T::read(&vec![0u8; T::SIZE]);
    let out = Buf::<T>::from_slice(&d, 0, &[zero; 12]);
    // Iterate [4, 3]: element (i, j) reads src[1 + i + 4j] (a transposed 3x4 at offset 1)
    // and writes out[i + 4j] (the output's transposed view): strides (1, 4) on both sides.
    let lin = StridedLayout::new(&[4, 3], &[1, 4]).unwrap();
    let lout = StridedLayout::new(&[4, 3], &[1, 4]).unwrap();
    let mut args = KernelArgs::new();
    args.push(12i64)
        .push(lin)
        .push(lout)
        .ptr(src.at(1))
        .ptr(out.ptr);
    launch(&d, m, &format!("copy_{suffix}"), 2, 64, 0, &mut args).unwrap();
    let got = out.to_vec();
    for i in 0..4 {
        for j in 0..3 {
            assert_eq!(
                got[i + 4 * j],
                data[1 + i + 4 * j],
                "copy_{suffix} ({i}, {j})"
            );
        }
    }
    // The contiguous fast path (16-byte vectors when aligned).
    let n = data.len();
    let out = Buf::<T>::from_slice(&d, 0, &vec![zero; n]);
    let c = StridedLayout::contiguous(&[n]).unwrap();
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(c)
        .push(c)
        .ptr(src.ptr)
        .ptr(out.ptr);
    launch(&d, m, &format!("copy_{suffix}"), 1, 32, 0, &mut args).unwrap();
    assert_eq!(out.to_vec(), data, "copy_{suffix} contiguous");
}

/// Clamps `data` to [lo, hi] (each bound optional) out of place and in place.
fn clamp_case<T: Elem>(suffix: &str, data: &[T], lo: T, hi: T, want: impl Fn(T, bool, bool) -> T) {
    let (d, m) = setup(0);
    let n = data.len();
    let c = StridedLayout::contiguous(&[n]).unwrap();
    for (has_lo, has_hi) in [(true, true), (true, false), (false, true)] {
        let src = Buf::<T>::from_slice(&d, 0, data);
        let out = Buf::<T>::from_slice(&d, 0, data);
        for (dst, what) in [(&out, "out of place"), (&src, "in place")] {
            let mut args = KernelArgs::new();
            args.push(n as i64)
                .push(c)
                .push(c)
                .ptr(src.ptr)
                .ptr(dst.ptr)
                .push(lo)
                .push(hi)
                .push(i32::from(has_lo))
                .push(i32::from(has_hi));
            launch(&d, m, &format!("clamp_{suffix}"), 1, 64, 0, &mut args).unwrap();
            let expect: Vec<T> = data.iter().map(|&x| want(x, has_lo, has_hi)).collect();
            let got = dst.to_vec();
            for (i, (g, w)) in got.iter().zip(&expect).enumerate() {
                let same = format!("{g:?}") == format!("{w:?}");
                assert!(
                    same,
                    "clamp_{suffix} {what} lo={has_lo} hi={has_hi} [{i}]: {g:?} vs {w:?}"
                );
            }
        }
    }
}

fn float_clamp(x: f64, lo: f64, hi: f64, has_lo: bool, has_hi: bool) -> f64 {
    if x.is_nan() {
        return x;
    }
    let mut y = x;
    if has_lo && y < lo {
        y = lo;
    }
    if has_hi && y > hi {
        y = hi;
    }
    y
}

#[test]
fn copy_every_dtype() {
    let f: Vec<f64> = (0..20).map(|i| i as f64 * 1.5 - 7.0).collect();
    copy_case("f32", &f.iter().map(|&v| v as f32).collect::<Vec<_>>());
    copy_case("f64", &f);
    copy_case(
        "f16",
        &f.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>(),
    );
    copy_case(
        "bf16",
        &f.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(),
    );
    copy_case(
        "i64",
        &f.iter()
            .map(|&v| v as i64 * 1_000_000_007)
            .collect::<Vec<_>>(),
    );
    copy_case("i32", &f.iter().map(|&v| v as i32 - 3).collect::<Vec<_>>());
    copy_case("u8", &(0..20u8).map(|v| v * 13).collect::<Vec<_>>());
    // bool: one byte 0/1, moved as u8 through the bool kernel.
    let bytes: Vec<u8> = (0..20).map(|i| u8::from(i % 3 == 0)).collect();
    let (d, m) = setup(0);
    let src = Buf::<u8>::from_slice(&d, 0, &bytes);
    let out = Buf::<u8>::zeros(&d, 0, 20);
    let c = StridedLayout::contiguous(&[20]).unwrap();
    let mut args = KernelArgs::new();
    args.push(20i64).push(c).push(c).ptr(src.ptr).ptr(out.ptr);
    launch(&d, m, "copy_bool", 1, 32, 0, &mut args).unwrap();
    assert_eq!(out.to_vec(), bytes);
}

#[test]
fn clamp_every_dtype() {
    let f: Vec<f64> = vec![
        -5.0,
        -1.5,
        0.0,
        0.5,
        2.0,
        7.25,
        f64::NAN,
        -0.0,
        f64::INFINITY,
    ];
    clamp_case(
        "f32",
        &f.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        -1.0f32,
        2.0,
        |x, a, b| float_clamp(f64::from(x), -1.0, 2.0, a, b) as f32,
    );
    clamp_case("f64", &f, -1.0f64, 2.0, |x, a, b| {
        float_clamp(x, -1.0, 2.0, a, b)
    });
    clamp_case(
        "f16",
        &f.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>(),
        f16::from_f32(-1.0),
        f16::from_f32(2.0),
        |x, a, b| f16::from_f64(float_clamp(x.to_f64(), -1.0, 2.0, a, b)),
    );
    clamp_case(
        "bf16",
        &f.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(),
        bf16::from_f32(-1.0),
        bf16::from_f32(2.0),
        |x, a, b| bf16::from_f64(float_clamp(x.to_f64(), -1.0, 2.0, a, b)),
    );
    let ints = [-9i64, -1, 0, 1, 2, 3, 100];
    clamp_case("i64", &ints, -1i64, 2, |x, a, b| {
        if a && x < -1 {
            -1
        } else if b && x > 2 {
            2
        } else {
            x
        }
    });
    let i32s: Vec<i32> = ints.iter().map(|&v| v as i32).collect();
    clamp_case("i32", &i32s, -1i32, 2, |x, a, b| {
        if a && x < -1 {
            -1
        } else if b && x > 2 {
            2
        } else {
            x
        }
    });
    clamp_case("u8", &[0u8, 1, 2, 5, 200, 255], 1u8, 5, |x, a, b| {
        if a && x < 1 {
            1
        } else if b && x > 5 {
            5
        } else {
            x
        }
    });
    // bool through u8 bytes: clamp to [true, true] turns everything true; to [false, false]
    // with only the upper bound, everything false.
    let (d, m) = setup(0);
    let data = [0u8, 1, 0, 1, 1];
    let c = StridedLayout::contiguous(&[5]).unwrap();
    for (lo, hi, has_lo, has_hi, want) in [(true, true, 1, 0, 1u8), (false, false, 0, 1, 0u8)] {
        let src = Buf::<u8>::from_slice(&d, 0, &data);
        let out = Buf::<u8>::zeros(&d, 0, 5);
        let mut args = KernelArgs::new();
        args.push(5i64)
            .push(c)
            .push(c)
            .ptr(src.ptr)
            .ptr(out.ptr)
            .push(lo)
            .push(hi)
            .push(has_lo)
            .push(has_hi);
        launch(&d, m, "clamp_bool", 1, 32, 0, &mut args).unwrap();
        assert_eq!(out.to_vec(), vec![want; 5], "clamp_bool lo={lo} hi={hi}");
    }
}
