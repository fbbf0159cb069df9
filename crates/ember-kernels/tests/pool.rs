//! The pooling kernels (`kernels/pool.cu`) against a transcription of the CPU backend's
//! loops (`crates/ember-tensor/src/cpu/pool.rs`), bit for bit: strided inputs with an offset,
//! padding, dilation, ceil mode (clipped last windows), non-square geometry, NaN (the last
//! NaN of a window wins), ties and ±0 (the first wins), all -inf windows, the three average
//! divisors, empty outputs and more outputs than threads; f32 f64 f16 bf16.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Buf, Dt, setup};
use ember_kernels::KernelArgs;
use ember_testing::Lcg;
use ember_testing::reference::{self, contiguous_strides, offset_of};
use half::{bf16, f16};

/// The pooling geometry (`reference::Pool2d`).
type Geom = reference::Pool2d;

/// The output size of a geometry the test uses (each has one).
fn out_size(g: &Geom) -> (usize, usize) {
    g.out().unwrap()
}

fn bits<T: Dt>(x: T) -> Vec<u8> {
    let mut o = Vec::new();
    x.write(&mut o);
    o
}

/// The CPU's `T::from_f64` (bf16: nearest-even on the double's high word, the `half` crate).
fn from_f64_cpu<T: Dt>(v: f64) -> T {
    if T::SUFFIX == "bf16" {
        T::read(&bf16::from_f64(v).to_le_bytes())
    } else {
        T::from_f64(v)
    }
}

/// The input: row-major values of [N, C, H, W] stored with the dims in order (W, H, N, C)
/// (strided, non-contiguous) after 5 filler elements. Returns (buffer, strides, values).
fn input<T: Dt>(rng: &mut Lcg, g: &Geom, specials: bool) -> (Vec<T>, [isize; 4], Vec<T>) {
    let (n, c, h, w) = g.nchw;
    let count = n * c * h * w;
    let vals: Vec<T> = (0..count)
        .map(|i| {
            if specials && i % 11 == 4 {
                T::from_f64([f64::NAN, 0.0, -0.0, f64::NEG_INFINITY, f64::INFINITY][i / 11 % 5])
            } else if specials {
                T::from_i64((rng.next_u64() % 7) as i64 - 3) // ties
            } else {
                T::from_f64(rng.f32(3.0) as f64)
            }
        })
        .collect();
    // Physical order (c, n, h, w) with w... : strides for [N, C, H, W].
    let phys = contiguous_strides(&[c, n, w, h]);
    let strides = [phys[1], phys[0], phys[3], phys[2]];
    let mut buf = vec![T::from_f64(7.0); 5 + count];
    for (i, &v) in vals.iter().enumerate() {
        buf[5 + offset_of(i, &[n, c, h, w], &strides)] = v;
    }
    (buf, strides, vals)
}

/// `reference::max_pool2d` (the CPU's loop) on the values of T.
fn max_ref<T: Dt>(x: &[T], g: &Geom) -> Vec<(T, i64)> {
    let x: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    reference::max_pool2d(&x, g)
        .into_iter()
        .map(|(v, i)| (T::from_f64(v), i))
        .collect()
}

/// `reference::avg_pool2d` rounded into T as the CPU does; `over` 0 is no override.
fn avg_ref<T: Dt>(x: &[T], g: &Geom, include_pad: bool, over: i64) -> Vec<T> {
    let x: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    reference::avg_pool2d(&x, g, include_pad, (over != 0).then_some(over))
        .into_iter()
        .map(from_f64_cpu)
        .collect()
}

fn geometry_args(
    args: &mut KernelArgs,
    g: &Geom,
    n_out: usize,
    strides: &[isize; 4],
    x: &Buf<impl Dt>,
) {
    let (_, c, h, w) = g.nchw;
    let (oh, ow) = out_size(g);
    args.push(n_out as i64)
        .push(c as i64)
        .push(h as i64)
        .push(w as i64)
        .push(oh as i64)
        .push(ow as i64)
        .ptr(x.at(5));
    for s in strides {
        args.push(*s as i64);
    }
    args.push(g.kernel.0 as i64)
        .push(g.kernel.1 as i64)
        .push(g.stride.0 as i64)
        .push(g.stride.1 as i64)
        .push(g.pad.0 as i64)
        .push(g.pad.1 as i64);
}

fn check<T: Dt>(seed: u64) {
    let (d, m) = setup(0);
    let mut rng = Lcg(seed);
    let sfx = T::SUFFIX;
    let geoms = [
        Geom {
            nchw: (2, 3, 7, 9),
            kernel: (3, 2),
            stride: (2, 1),
            pad: (1, 1),
            dil: (1, 2),
            ceil: false,
        },
        Geom {
            nchw: (2, 3, 7, 9),
            kernel: (3, 3),
            stride: (2, 2),
            pad: (1, 1),
            dil: (1, 1),
            ceil: true,
        },
        Geom {
            nchw: (1, 2, 8, 5),
            kernel: (2, 4),
            stride: (3, 2),
            pad: (1, 2),
            dil: (2, 1),
            ceil: true,
        },
        Geom {
            nchw: (3, 4, 6, 6),
            kernel: (2, 2),
            stride: (2, 2),
            pad: (0, 0),
            dil: (1, 1),
            ceil: false,
        },
        Geom {
            nchw: (1, 1, 1, 1),
            kernel: (1, 1),
            stride: (1, 1),
            pad: (0, 0),
            dil: (1, 1),
            ceil: false,
        },
        Geom {
            nchw: (0, 3, 4, 4),
            kernel: (2, 2),
            stride: (2, 2),
            pad: (0, 0),
            dil: (1, 1),
            ceil: false,
        },
        Geom {
            nchw: (2, 2, 1, 4),
            kernel: (3, 2),
            stride: (1, 1),
            pad: (1, 0),
            dil: (1, 1),
            ceil: false,
        },
    ];
    // Windows of -inf only: the value is -inf and the index the window's first position
    // (after stepping over the padding).
    let g = geoms[2];
    let (n, c, h, w) = g.nchw;
    let (oh, ow) = out_size(&g);
    let n_out = n * c * oh * ow;
    let ninf = vec![T::from_f64(f64::NEG_INFINITY); 5 + n * c * h * w];
    let x = Buf::from_slice(&d, 0, &ninf);
    let out = Buf::<T>::zeros(&d, 0, n_out);
    let idx = Buf::<i64>::zeros(&d, 0, n_out);
    let mut args = KernelArgs::new();
    let strides = [(c * h * w) as isize, (h * w) as isize, w as isize, 1];
    geometry_args(&mut args, &g, n_out, &strides, &x);
    args.push(g.dil.0 as i64)
        .push(g.dil.1 as i64)
        .ptr(out.ptr)
        .ptr(idx.ptr);
    common::launch(&d, m, &format!("max_pool2d_{sfx}"), 2, 64, 0, &mut args).unwrap();
    let want = max_ref(&ninf[5..], &g);
    assert_eq!(
        idx.to_vec(),
        want.iter().map(|v| v.1).collect::<Vec<_>>(),
        "all -inf: indices"
    );
    assert!(
        out.to_vec().iter().all(|v| v.to_f64() == f64::NEG_INFINITY),
        "all -inf: values"
    );
    for g in geoms {
        let (n, c, _, _) = g.nchw;
        let (oh, ow) = out_size(&g);
        let n_out = n * c * oh * ow;
        // Max pooling: ties, ±0, NaN, ±inf.
        let (buf, strides, vals) = input::<T>(&mut rng, &g, true);
        let x = Buf::from_slice(&d, 0, &buf);
        let out = Buf::<T>::zeros(&d, 0, n_out);
        let idx = Buf::<i64>::zeros(&d, 0, n_out);
        let mut args = KernelArgs::new();
        geometry_args(&mut args, &g, n_out, &strides, &x);
        args.push(g.dil.0 as i64)
            .push(g.dil.1 as i64)
            .ptr(out.ptr)
            .ptr(idx.ptr);
        let name = format!("max_pool2d_{sfx}");
        common::launch(&d, m, &name, 2, 64, 0, &mut args).unwrap();
        let (got, gi) = (out.to_vec(), idx.to_vec());
        for (o, (v, i)) in max_ref(&vals, &g).into_iter().enumerate() {
            let what = format!("{name} {g:?} output {o}");
            assert_eq!(gi[o], i, "{what}: index");
            if v.to_f64().is_nan() {
                assert!(got[o].to_f64().is_nan(), "{what}: {:?}, want NaN", got[o]);
            } else {
                assert_eq!(bits(got[o]), bits(v), "{what}: value");
            }
        }
        // Average pooling: the three divisors (dilation 1 only).
        if g.dil != (1, 1) {
            continue;
        }
        let (buf, strides, vals) = input::<T>(&mut rng, &g, false);
        let x = Buf::from_slice(&d, 0, &buf);
        for (include, over) in [(true, 0i64), (false, 0), (true, 3), (false, -2)] {
            let out = Buf::<T>::zeros(&d, 0, n_out);
            let mut args = KernelArgs::new();
            geometry_args(&mut args, &g, n_out, &strides, &x);
            args.push(i64::from(include)).push(over).ptr(out.ptr);
            let name = format!("avg_pool2d_{sfx}");
            common::launch(&d, m, &name, 2, 64, 0, &mut args).unwrap();
            let got = out.to_vec();
            for (o, v) in avg_ref(&vals, &g, include, over).into_iter().enumerate() {
                assert_eq!(
                    bits(got[o]),
                    bits(v),
                    "{name} {g:?} include_pad {include} override {over} output {o}: {:?}, want {v:?}",
                    got[o]
                );
            }
        }
    }
}

#[test]
fn pool_f32() {
    check::<f32>(21);
}
#[test]
fn pool_f64() {
    check::<f64>(22);
}
#[test]
fn pool_f16() {
    check::<f16>(23);
}
#[test]
fn pool_bf16() {
    check::<bf16>(24);
}
