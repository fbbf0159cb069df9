//! The contiguous loops of the elementwise kernels (kernels/ember.cuh, Note [Elementwise
//! loops]) at the sizes where they change course: around one group (16 bytes of the widest
//! operand), one thread's pass (4 groups), one block's and one grid's pass (several passes of
//! a small grid), with aligned pointers (vector loop and scalar tail) and pointers one element
//! off (scalar loop). Every dtype of the unary (`usign`), binary (`badd`), comparison
//! (`cmp_lt`) and where kernels and all 64 casts, against naive references; the elements
//! just past the output must stay untouched.
#![allow(clippy::unwrap_used)]

mod common;

use std::any::Any;
use std::sync::Arc;

use common::{B, Buf, Dt, setup, values};
use ember_device::driver::{DevicePtr, Driver};
use ember_kernels::{KernelArgs, StridedLayout};
use ember_testing::Lcg;
use half::{bf16, f16};

/// A device copy of an input of any dtype, kept alive while its address is used.
struct Dev {
    _buf: Box<dyn Any>,
    ptr: DevicePtr,
    size: usize,
}

impl Dev {
    fn at(&self, i: usize) -> DevicePtr {
        self.ptr.offset((i * self.size) as u64)
    }
}

/// Host inputs of any dtype, uploaded cycled to a length.
trait Upload {
    fn upload(&self, driver: &Arc<dyn Driver>, len: usize) -> Dev;
}

impl<T: Dt> Upload for Vec<T> {
    fn upload(&self, driver: &Arc<dyn Driver>, len: usize) -> Dev {
        let buf = Buf::from_slice(driver, 0, &take(self, 0, len));
        Dev {
            ptr: buf.ptr,
            size: T::SIZE,
            _buf: Box::new(buf),
        }
    }
}

/// Sizes around the group (up to 16 elements), a thread's pass (64 u8 elements), a block of
/// 128 threads (up to 8192 u8 elements) and a pass of 3 such blocks (24576 u8 elements, 6144
/// f32): the last ones take several passes for every dtype.
const SIZES: &[usize] = &[
    0, 1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 4095, 4099, 6150, 49_185,
];
/// Grid and block of the launches: 3 blocks of 128 threads, and one warp alone.
const GEOMETRIES: &[(u32, u32)] = &[(3, 128), (1, 32)];
/// Untouched elements after each output (and before it, for the offset outputs).
const GUARD: usize = 20;

/// Elements of `n` starting `skew` elements into a buffer (`skew` = 1: misaligned).
fn take<T: Copy>(src: &[T], skew: usize, n: usize) -> Vec<T> {
    src.iter().copied().cycle().take(skew + n).collect()
}

fn bytes<T: Dt>(v: &[T]) -> Vec<u8> {
    let mut o = Vec::new();
    v.iter().for_each(|&x| x.write(&mut o));
    o
}

/// Launches `name` over `n` contiguous elements of each input in `ins` (already skewed by
/// `skew`), returns the output (skewed the same way) with its guards, checked untouched.
fn launch_contiguous<O: Dt>(
    name: &str,
    n: usize,
    skew: usize,
    ins: &[Dev],
    (grid, block): (u32, u32),
) -> Vec<O> {
    let (d, m) = setup(0);
    let out = Buf::<O>::zeros(&d, 0, skew + n + GUARD);
    let l = StridedLayout::contiguous(&[n]).unwrap();
    let mut args = KernelArgs::new();
    args.push(n as i64);
    for _ in ins {
        args.push(l);
    }
    for p in ins {
        args.ptr(p.at(skew));
    }
    args.ptr(out.at(skew));
    common::launch(&d, m, name, grid, block, 0, &mut args).unwrap();
    let got = out.to_vec();
    let zero = bytes(&[O::from_i64(0)]);
    for (i, g) in got.iter().enumerate() {
        if i < skew || i >= skew + n {
            assert_eq!(
                bytes(&[*g]),
                zero,
                "{name} n={n} skew={skew}: wrote element {i}"
            );
        }
    }
    got[skew..skew + n].to_vec()
}

/// Runs `check(i, out[i])` for every size, skew and geometry of kernel `name` with inputs
/// `ins` (host copies, each at least `1 + max size` long after cycling).
fn each_case<O: Dt>(name: &str, ins: &[&dyn Upload], check: &dyn Fn(usize, usize, O) -> bool) {
    let (d, _) = setup(0);
    for &n in SIZES {
        for skew in [0, 1] {
            let ptrs: Vec<Dev> = ins.iter().map(|x| x.upload(&d, skew + n)).collect();
            for &geometry in GEOMETRIES {
                if geometry.0 == 1 && n > 5000 {
                    continue; // one warp over 49k elements: slow on the emulator, nothing new
                }
                let got = launch_contiguous::<O>(name, n, skew, &ptrs, geometry);
                for (i, &g) in got.iter().enumerate() {
                    assert!(
                        check(skew, i, g),
                        "{name} n={n} skew={skew} grid {geometry:?}: element {i} = {g:?}"
                    );
                }
            }
        }
    }
}

/// Inputs without specials: floats in [-50, 50), small and large integers.
fn inputs<T: Dt>(seed: u64) -> Vec<T> {
    values::<T>(&mut Lcg(seed), 6007, 50.0, false)
}

fn same_bits<T: Dt>(a: T, b: T) -> bool {
    bytes(&[a]) == bytes(&[b])
}

fn families<T: Dt + PartialOrd>() {
    let sfx = T::SUFFIX;
    let (a, b) = (inputs::<T>(1), inputs::<T>(2));
    let at = |x: &[T], skew: usize, i: usize| x[(skew + i) % x.len()];
    // usign: every dtype (bool: the identity).
    each_case::<T>(&format!("usign_{sfx}"), &[&a], &|skew, i, y| {
        let x = at(&a, skew, i);
        let want = if T::FLOAT {
            let v = x.to_f64();
            T::from_f64(if v > 0.0 {
                1.0
            } else if v < 0.0 {
                -1.0
            } else {
                v
            })
        } else {
            T::from_i64(x.to_i64().signum())
        };
        same_bits(y, want)
    });
    // badd: every dtype (floats: one f32 or f64 addition rounded to T; ints wrap; bool or).
    each_case::<T>(&format!("badd_{sfx}"), &[&a, &b], &|skew, i, y| {
        let (x, z) = (at(&a, skew, i), at(&b, skew, i));
        let want = if sfx == "f64" {
            T::from_f64(x.to_f64() + z.to_f64())
        } else if T::FLOAT {
            T::from_f64((x.to_f64() + z.to_f64()) as f32 as f64)
        } else if sfx == "bool" {
            T::from_i64(x.to_i64() | z.to_i64())
        } else {
            T::from_i64(x.to_i64().wrapping_add(z.to_i64()))
        };
        same_bits(y, want)
    });
    each_case::<B>(&format!("cmp_lt_{sfx}"), &[&a, &b], &|skew, i, y| {
        y.0 == (at(&a, skew, i) < at(&b, skew, i))
    });
    let c = inputs::<B>(3);
    each_case::<T>(&format!("where_{sfx}"), &[&c, &a, &b], &|skew, i, y| {
        let pick = if c[(skew + i) % c.len()].0 { &a } else { &b };
        same_bits(y, at(pick, skew, i))
    });
}

#[test]
fn unary_binary_compare_where_at_every_size_and_dtype() {
    families::<f32>();
    families::<f64>();
    families::<f16>();
    families::<bf16>();
    families::<i64>();
    families::<i32>();
    families::<u8>();
}

#[test]
fn bool_families_at_every_size() {
    let (a, b) = (inputs::<B>(4), inputs::<B>(5));
    let at = |x: &[B], skew: usize, i: usize| x[(skew + i) % x.len()].0;
    each_case::<B>("usign_bool", &[&a], &|skew, i, y| y.0 == at(&a, skew, i));
    each_case::<B>("badd_bool", &[&a, &b], &|skew, i, y| {
        y.0 == (at(&a, skew, i) | at(&b, skew, i))
    });
    each_case::<B>("cmp_lt_bool", &[&a, &b], &|skew, i, y| {
        y.0 == (!at(&a, skew, i) & at(&b, skew, i))
    });
    let c = inputs::<B>(6);
    each_case::<B>("where_bool", &[&c, &a, &b], &|skew, i, y| {
        y.0 == if at(&c, skew, i) {
            at(&a, skew, i)
        } else {
            at(&b, skew, i)
        }
    });
}

/// Every cast pair with integer values in [0, 100] (exact in every dtype, so the expected
/// value is the same integer, or `x != 0` for bool): every pair of element widths.
fn casts_from<S: Dt>() {
    let src: Vec<S> = (0..6007)
        .map(|i| S::from_i64((i * 37 % 101) as i64))
        .collect();
    let at = |skew: usize, i: usize| src[(skew + i) % src.len()].to_i64();
    macro_rules! to {
        ($($d:ty),*) => {$(
            each_case::<$d>(&format!("cast_{}_{}", S::SUFFIX, <$d>::SUFFIX), &[&src], &|skew, i, y| {
                y == <$d>::from_i64(at(skew, i))
            });
        )*};
    }
    to!(f32, f64, f16, bf16, i64, i32, u8, B);
}

#[test]
fn casts_at_every_size() {
    casts_from::<f32>();
    casts_from::<f64>();
    casts_from::<f16>();
    casts_from::<bf16>();
    casts_from::<i64>();
    casts_from::<i32>();
    casts_from::<u8>();
    casts_from::<B>();
}
