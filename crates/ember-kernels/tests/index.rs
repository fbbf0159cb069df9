//! The indexing kernels (`kernels/index.cu`): `index_select`, `gather`, `scatter_add` for
//! every dtype and both index dtypes, against the CPU backend's semantics
//! (`crates/ember-tensor/src/cpu/index.rs`): strided inputs with offsets, every dim, empty
//! sizes, sizes that do not fill the grid, duplicate indices for scatter_add, and the error
//! slot for out-of-range indices (negative and >= size; first position and a bad value).
#![allow(clippy::unwrap_used)]

mod common;

use common::{B, Buf, Dt, setup, values};
use ember_device::driver::{DevicePtr, Driver, ModuleHandle};
use ember_kernels::{KernelArgs, StridedLayout};
use ember_testing::reference::{contiguous_strides, offset_of};
use ember_testing::{Lcg, is_close};
use half::{bf16, f16};
use std::sync::Arc;

const GRID: u32 = 3;
const BLOCK: u32 = 64;

/// A strided operand: `data` is the buffer, element `i` (row-major over `shape`) at
/// `offset + offset_of(i, shape, strides)`.
struct Strided<T> {
    data: Vec<T>,
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
}

impl<T: Copy> Strided<T> {
    /// `vals` (row-major over `shape`) stored column-major (non-contiguous for rank >= 2)
    /// after `offset` filler elements.
    fn colmajor(vals: &[T], shape: &[usize], offset: usize, fill: T) -> Strided<T> {
        let rev: Vec<usize> = shape.iter().rev().copied().collect();
        let mut strides = contiguous_strides(&rev);
        strides.reverse();
        let n: usize = shape.iter().product();
        let mut data = vec![fill; offset + n];
        for (i, &v) in vals.iter().enumerate() {
            data[offset + offset_of(i, shape, &strides)] = v;
        }
        Strided {
            data,
            shape: shape.to_vec(),
            strides,
            offset,
        }
    }

    fn get(&self, i: usize) -> T {
        self.data[self.offset + offset_of(i, &self.shape, &self.strides)]
    }
}

fn bits<T: Dt>(x: T) -> Vec<u8> {
    let mut o = Vec::new();
    x.write(&mut o);
    o
}

fn err_slot(d: &Arc<dyn Driver>) -> Buf<i64> {
    Buf::from_slice(d, 0, &[i64::MAX, 0])
}

fn layout(sizes: &[usize], strides: &[isize]) -> StridedLayout {
    StridedLayout::new(sizes, strides).unwrap()
}

/// Row-major index of `pos` in `shape`, as a multi-index.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |a, (&i, &s)| a * s + i)
}

/// Indices for a dim of `size`: in range (with repeats), except at `bad` positions.
fn indices<I: Dt>(rng: &mut Lcg, n: usize, size: usize, bad: &[(usize, i64)]) -> Vec<I> {
    (0..n)
        .map(|p| match bad.iter().find(|b| b.0 == p) {
            Some(&(_, v)) => I::from_i64(v),
            None => I::from_i64((rng.next_u64() % size.max(1) as u64) as i64),
        })
        .collect()
}

fn check_err(err: &Buf<i64>, bad: &[(usize, i64)], what: &str) {
    let e = err.to_vec();
    match bad.iter().map(|b| b.0).min() {
        None => assert_eq!(e[0], i64::MAX, "{what}: error reported with no bad index"),
        Some(first) => {
            assert_eq!(e[0], first as i64, "{what}: first bad position");
            assert!(
                bad.iter().any(|b| b.1 == e[1]),
                "{what}: reported value {} is not a bad index of {bad:?}",
                e[1]
            );
        }
    }
}

fn index_select_case<T: Dt, I: Dt>(
    (d, m): &(Arc<dyn Driver>, ModuleHandle),
    rng: &mut Lcg,
    shape: &[usize],
    dim: usize,
    count: usize,
    bad: &[(usize, i64)],
) {
    let name = format!("index_select_{}_{}", T::SUFFIX, I::SUFFIX);
    let what = format!("{name} {shape:?} dim {dim} count {count}");
    let n_src: usize = shape.iter().product();
    let src = Strided::colmajor(
        &values::<T>(rng, n_src, 50.0, true),
        shape,
        3,
        T::from_i64(7),
    );
    let size = shape[dim];
    let iv: Vec<I> = indices(rng, count, size, bad);
    // idx is 1-D with stride 2 after one filler element.
    let mut idx_buf = vec![I::from_i64(-5); 1 + 2 * count];
    for (p, &v) in iv.iter().enumerate() {
        idx_buf[1 + 2 * p] = v;
    }
    let mut out_shape = shape.to_vec();
    out_shape[dim] = count;
    let n: usize = out_shape.iter().product();
    let inner: usize = out_shape[dim + 1..].iter().product();
    let mut strides = src.strides.clone();
    let sd = strides[dim];
    strides[dim] = 0;

    let dsrc = Buf::from_slice(d, 0, &src.data);
    let didx = Buf::from_slice(d, 0, &idx_buf);
    let out = Buf::<T>::zeros(d, 0, n);
    let err = err_slot(d);
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(inner as i64)
        .push(count as i64)
        .push(size as i64)
        .push(layout(&out_shape, &strides))
        .push(sd as i64)
        .ptr(dsrc.at(src.offset))
        .ptr(didx.at(1))
        .push(2i64)
        .ptr(out.ptr)
        .ptr(err.ptr);
    common::launch(d, *m, &name, GRID, BLOCK, 0, &mut args).unwrap();
    check_err(&err, bad, &what);
    if !bad.is_empty() {
        // not a skip: with a bad index the error slot was the check; the output is undefined.
        return;
    }
    let got = out.to_vec();
    for (o, g) in got.iter().enumerate() {
        let mut at = unravel(o, &out_shape);
        at[dim] = iv[at[dim]].to_i64() as usize;
        let want = src.get(ravel(&at, shape));
        assert_eq!(bits(*g), bits(want), "{what}: output {o}");
    }
}

fn gather_case<T: Dt, I: Dt>(
    (d, m): &(Arc<dyn Driver>, ModuleHandle),
    rng: &mut Lcg,
    shape: &[usize],
    ishape: &[usize],
    dim: usize,
    bad: &[(usize, i64)],
) {
    let name = format!("gather_{}_{}", T::SUFFIX, I::SUFFIX);
    let what = format!("{name} {shape:?} index {ishape:?} dim {dim}");
    let n_src: usize = shape.iter().product();
    let src = Strided::colmajor(
        &values::<T>(rng, n_src, 50.0, true),
        shape,
        1,
        T::from_i64(7),
    );
    let n: usize = ishape.iter().product();
    let iv: Vec<I> = indices(rng, n, shape[dim], bad);
    let idx = Strided::colmajor(&iv, ishape, 2, I::from_i64(-9));
    let mut strides = src.strides.clone();
    let sd = strides[dim];
    strides[dim] = 0;

    let dsrc = Buf::from_slice(d, 0, &src.data);
    let didx = Buf::from_slice(d, 0, &idx.data);
    let out = Buf::<T>::zeros(d, 0, n);
    let err = err_slot(d);
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(shape[dim] as i64)
        .push(layout(ishape, &strides))
        .push(sd as i64)
        .ptr(dsrc.at(src.offset))
        .push(layout(ishape, &idx.strides))
        .ptr(didx.at(idx.offset))
        .ptr(out.ptr)
        .ptr(err.ptr);
    common::launch(d, *m, &name, GRID, BLOCK, 0, &mut args).unwrap();
    check_err(&err, bad, &what);
    if !bad.is_empty() {
        // not a skip: with a bad index the error slot was the check; the output is undefined.
        return;
    }
    for (o, g) in out.to_vec().iter().enumerate() {
        let mut at = unravel(o, ishape);
        at[dim] = iv[o].to_i64() as usize;
        let want = src.get(ravel(&at, shape));
        assert_eq!(bits(*g), bits(want), "{what}: output {o}");
    }
}

/// The CPU's element add of scatter_add: f64 sum rounded for floats, wrapping for integers,
/// `!= 0` for bool.
fn add_ref<T: Dt>(a: T, b: T) -> T {
    if T::FLOAT {
        T::from_f64(a.to_f64() + b.to_f64())
    } else {
        T::from_i64(a.to_i64().wrapping_add(b.to_i64()))
    }
}

#[allow(clippy::too_many_arguments)]
fn scatter_add_case<T: Dt, I: Dt>(
    (d, m): &(Arc<dyn Driver>, ModuleHandle),
    rng: &mut Lcg,
    shape: &[usize],
    ishape: &[usize],
    sshape: &[usize],
    dim: usize,
    bad: &[(usize, i64)],
) {
    let name = format!("scatter_add_{}_{}", T::SUFFIX, I::SUFFIX);
    let what = format!("{name} self {shape:?} index {ishape:?} src {sshape:?} dim {dim}");
    let numel: usize = shape.iter().product();
    // Small values so that float sums stay exact enough to compare.
    let this = Strided::colmajor(
        &values::<T>(rng, numel, 8.0, false),
        shape,
        2,
        T::from_i64(3),
    );
    let n: usize = ishape.iter().product();
    let iv: Vec<I> = indices(rng, n, shape[dim], bad);
    let idx = Strided::colmajor(&iv, ishape, 1, I::from_i64(-9));
    let ns: usize = sshape.iter().product();
    let src = Strided::colmajor(&values::<T>(rng, ns, 8.0, false), sshape, 3, T::from_i64(5));

    // Step 1, the host's copy of self: cast_{T}_{T} into out (rounded up to 4 bytes for the
    // byte atomics).
    let dthis = Buf::from_slice(d, 0, &this.data);
    let out = Buf::<T>::zeros(d, 0, (numel * T::SIZE).div_ceil(4) * 4 / T::SIZE);
    let mut args = KernelArgs::new();
    args.push(numel as i64)
        .push(layout(shape, &this.strides))
        .ptr(dthis.at(this.offset))
        .ptr(out.ptr);
    let cast = format!("cast_{}_{}", T::SUFFIX, T::SUFFIX);
    common::launch(d, *m, &cast, GRID, BLOCK, 0, &mut args).unwrap();

    // Step 2: the scatter.
    let mut ostrides = contiguous_strides(shape);
    let od = ostrides[dim];
    ostrides[dim] = 0;
    let didx = Buf::from_slice(d, 0, &idx.data);
    let dsrc = Buf::from_slice(d, 0, &src.data);
    let err = err_slot(d);
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(shape[dim] as i64)
        .push(layout(ishape, &ostrides))
        .push(od as i64)
        .ptr(out.ptr)
        .push(layout(ishape, &idx.strides))
        .ptr(didx.at(idx.offset))
        .push(layout(ishape, &src.strides))
        .ptr(dsrc.at(src.offset));
    args.ptr(err.ptr);
    common::launch(d, *m, &name, GRID, BLOCK, 0, &mut args).unwrap();
    check_err(&err, bad, &what);
    if !bad.is_empty() {
        // not a skip: with a bad index the error slot was the check; the output is undefined.
        return;
    }
    // Reference: sequential, in row-major order of idx; floats also as exact f64 sums with
    // the magnitude of the terms for the tolerance (the kernel's atomic order differs).
    let mut want: Vec<T> = (0..numel).map(|i| this.get(i)).collect();
    let mut exact: Vec<f64> = want.iter().map(|v| v.to_f64()).collect();
    let mut mag: Vec<f64> = exact.iter().map(|v| v.abs()).collect();
    for (o, v) in iv.iter().enumerate() {
        let mut at = unravel(o, ishape);
        let s = src.get(ravel(&at, sshape));
        at[dim] = v.to_i64() as usize;
        let t = ravel(&at, shape);
        want[t] = add_ref(want[t], s);
        exact[t] += s.to_f64();
        mag[t] += s.to_f64().abs();
    }
    let got = out.to_vec();
    for i in 0..numel {
        if T::FLOAT {
            assert!(
                is_close(got[i].to_f64(), exact[i], 0.0, T::TOL * mag[i] * 2.0),
                "{what}: output {i}: {:?}, want {}",
                got[i],
                exact[i]
            );
        } else {
            assert_eq!(got[i], want[i], "{what}: output {i}");
        }
    }
}

fn check<T: Dt, I: Dt>(seed: u64) {
    let dm = setup(0);
    let mut rng = Lcg(seed);
    let r = &mut rng;
    // index_select: every dim of a rank-3 strided source, a 1-D source (embedding rows are
    // dim 0 of [V, D]), more outputs than threads, empty cases, bad indices.
    for dim in 0..3 {
        index_select_case::<T, I>(&dm, r, &[4, 7, 9], dim, 5, &[]);
    }
    index_select_case::<T, I>(&dm, r, &[50, 6], 0, 61, &[]);
    index_select_case::<T, I>(&dm, r, &[11], 0, 3, &[]);
    index_select_case::<T, I>(&dm, r, &[4, 7], 1, 0, &[]);
    index_select_case::<T, I>(&dm, r, &[0, 7], 1, 3, &[]);
    index_select_case::<T, I>(&dm, r, &[4, 7], 1, 6, &[(4, 7), (2, -1)]);
    index_select_case::<T, I>(&dm, r, &[4, 0], 0, 6, &[(5, -3)]);
    index_select_case::<T, I>(&dm, r, &[4, 7], 0, 3, &[(0, i64::from(i32::MIN))]);
    // gather: index smaller than the source outside dim, every dim.
    gather_case::<T, I>(&dm, r, &[3, 4, 5], &[3, 6, 5], 1, &[]);
    gather_case::<T, I>(&dm, r, &[3, 4, 5], &[2, 4, 3], 0, &[]);
    gather_case::<T, I>(&dm, r, &[3, 4, 5], &[3, 2, 9], 2, &[]);
    gather_case::<T, I>(&dm, r, &[13, 11], &[20, 11], 0, &[]);
    gather_case::<T, I>(&dm, r, &[7], &[4], 0, &[]);
    let rank8 = [2, 1, 3, 2, 1, 2, 3, 2];
    gather_case::<T, I>(&dm, r, &rank8, &[2, 1, 3, 2, 1, 4, 3, 2], 5, &[]);
    index_select_case::<T, I>(&dm, r, &rank8, 6, 4, &[]);
    gather_case::<T, I>(&dm, r, &[3, 4], &[0, 4], 0, &[]);
    gather_case::<T, I>(&dm, r, &[3, 4], &[3, 4], 1, &[(9, 4), (5, -2), (11, 100)]);
    // scatter_add: duplicates (index extent > self's dim), src larger than index.
    scatter_add_case::<T, I>(&dm, r, &[3, 4, 5], &[3, 6, 5], &[3, 7, 6], 1, &[]);
    scatter_add_case::<T, I>(&dm, r, &[3, 4, 5], &[5, 4, 3], &[6, 4, 5], 0, &[]);
    scatter_add_case::<T, I>(&dm, r, &[3, 4, 5], &[3, 2, 9], &[3, 3, 9], 2, &[]);
    scatter_add_case::<T, I>(&dm, r, &[9, 23], &[40, 23], &[40, 23], 0, &[]);
    scatter_add_case::<T, I>(&dm, r, &[5], &[0], &[2], 0, &[]);
    scatter_add_case::<T, I>(
        &dm,
        r,
        &rank8,
        &[2, 1, 2, 2, 1, 5, 3, 2],
        &[2, 1, 3, 2, 1, 5, 3, 2],
        5,
        &[],
    );
    scatter_add_case::<T, I>(&dm, r, &[3, 4], &[3, 4], &[3, 4], 1, &[(7, -1), (3, 4)]);
}

fn check_dtype<T: Dt>(seed: u64) {
    check::<T, i64>(seed);
    check::<T, i32>(seed ^ 0x5555);
}

#[test]
fn index_f32() {
    check_dtype::<f32>(1);
}
#[test]
fn index_f64() {
    check_dtype::<f64>(2);
}
#[test]
fn index_f16() {
    check_dtype::<f16>(3);
}
#[test]
fn index_bf16() {
    check_dtype::<bf16>(4);
}
#[test]
fn index_i64() {
    check_dtype::<i64>(5);
}
#[test]
fn index_i32() {
    check_dtype::<i32>(6);
}
#[test]
fn index_u8() {
    check_dtype::<u8>(7);
}
#[test]
fn index_bool() {
    check_dtype::<B>(8);
}

/// Byte scatter into a buffer whose element 1 is at an odd address (the word holding the
/// byte straddles neighbours that must stay untouched) with heavy duplication.
#[test]
fn scatter_add_bytes_keep_neighbours() {
    let (d, m) = setup(0);
    for (name, add) in [
        ("scatter_add_u8_i64", true),
        ("scatter_add_bool_i64", false),
    ] {
        let base: Vec<u8> = (0..16).map(|i| if add { 200 + i } else { i % 2 }).collect();
        let out = Buf::from_slice(&d, 0, &base);
        // 40 adds of 3 onto element 1 of the view out[5..9] (u8: wraps), or of true (bool).
        let idx = Buf::from_slice(&d, 0, &[1i64; 40]);
        let src = Buf::from_slice(&d, 0, &[if add { 3u8 } else { 1 }; 40]);
        let err = err_slot(&d);
        let l = layout(&[40], &[0]);
        let mut args = KernelArgs::new();
        args.push(40i64)
            .push(4i64)
            .push(l)
            .push(1i64)
            .ptr(DevicePtr(out.at(5).0))
            .push(layout(&[40], &[1]))
            .ptr(idx.ptr)
            .push(layout(&[40], &[1]))
            .ptr(src.ptr)
            .ptr(err.ptr);
        common::launch(&d, m, name, GRID, BLOCK, 0, &mut args).unwrap();
        let mut want = base.clone();
        want[6] = if add { want[6].wrapping_add(120) } else { 1 };
        assert_eq!(out.to_vec(), want, "{name}");
        assert_eq!(err.to_vec()[0], i64::MAX);
    }
}
