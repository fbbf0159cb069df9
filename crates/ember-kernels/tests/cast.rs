//! The cast kernels (`kernels/cast.cu`): all 64 pairs of the eight dtypes, contiguous and
//! strided, against the CPU backend's rules (`cast_elem`: into bool `x != 0` with NaN true;
//! float into integers truncating toward zero, saturating, NaN -> 0, u8 through i64 and
//! wrapping; integers wrap; into f16/bf16 through f32). Exact.
#![allow(clippy::unwrap_used)]

mod common;

use common::{B, Buf, Dt, gathered, setup, values};
use ember_kernels::{KernelArgs, StridedLayout};
use ember_testing::Lcg;
use half::{bf16, f16};

/// The CPU's `cast_elem::<S, D>`.
fn cast_ref<S: Dt, D: Dt>(x: S) -> D {
    if D::SUFFIX == "bool" || S::FLOAT {
        D::from_f64(x.to_f64())
    } else {
        D::from_i64(x.to_i64())
    }
}

fn bytes<T: Dt>(v: &[T]) -> Vec<Vec<u8>> {
    v.iter()
        .map(|&x| {
            let mut o = Vec::new();
            x.write(&mut o);
            o
        })
        .collect()
}

/// Inputs that exercise the rules: specials, values that truncate, overflow every integer
/// type, halves' rounding ties, large integers that f32 cannot hold.
fn inputs<S: Dt>() -> Vec<S> {
    let mut rng = Lcg(0xCA57_CA57_0000_0001);
    let mut v = values::<S>(&mut rng, 200, 400.0, true);
    if S::FLOAT {
        for x in [
            -2.7,
            2.7,
            -0.5,
            300.7,
            -1.0,
            1e20,
            -1e20,
            3e9,
            -3e9,
            2147483647.5,
            -2147483648.9,
            65519.0,
            1.0 + 2f64.powi(-11),
            24855.999999999993,
            f64::NAN,
            -f64::NAN,
        ] {
            v.push(S::from_f64(x));
        }
    } else {
        for x in [
            i64::MAX,
            i64::MIN,
            (1 << 24) + 1,
            (1 << 53) + 1,
            65519,
            -129,
            256,
            i32::MAX as i64 + 1,
        ] {
            v.push(S::from_i64(x));
        }
    }
    v
}

fn cast_pair<S: Dt, D: Dt>() {
    let (d, m) = setup(0);
    let input = inputs::<S>();
    let name = format!("cast_{}_{}", S::SUFFIX, D::SUFFIX);
    let n = input.len();
    // Contiguous, and the same values read backwards through a negative-free strided view:
    // [n/2, 2] transposed.
    let half = n / 2;
    for (shape, strides) in [(vec![n], vec![1isize]), (vec![2, half], vec![1isize, 2])] {
        let count: usize = shape.iter().product();
        let din = Buf::from_slice(&d, 0, &input);
        let out = Buf::<D>::zeros(&d, 0, count);
        let mut args = KernelArgs::new();
        args.push(count as i64)
            .push(StridedLayout::new(&shape, &strides).unwrap())
            .ptr(din.ptr)
            .ptr(out.ptr);
        common::launch(&d, m, &name, 2, 64, 0, &mut args).unwrap();
        let view = common::View {
            strides: strides.clone(),
            offset: 0,
        };
        let src = gathered(&input, &shape, &view);
        let want: Vec<D> = src.iter().map(|&x| cast_ref::<S, D>(x)).collect();
        let got = out.to_vec();
        // Same dtype: a bit copy of the input.
        let wb = if S::SUFFIX == D::SUFFIX {
            bytes(&src)
        } else {
            bytes(&want)
        };
        let gb = bytes(&got);
        for i in 0..count {
            // NaN payloads may differ between conversions; NaN-ness may not.
            let both_nan = D::FLOAT && got[i].to_f64().is_nan() && want[i].to_f64().is_nan();
            if both_nan && S::SUFFIX != D::SUFFIX {
                continue;
            }
            assert_eq!(
                gb[i], wb[i],
                "{name} {shape:?} element {i}: {:?} -> {:?}, want {:?}",
                src[i], got[i], want[i]
            );
        }
    }
}

macro_rules! cast_from {
    ($test:ident, $s:ty) => {
        #[test]
        fn $test() {
            cast_pair::<$s, f32>();
            cast_pair::<$s, f64>();
            cast_pair::<$s, f16>();
            cast_pair::<$s, bf16>();
            cast_pair::<$s, i64>();
            cast_pair::<$s, i32>();
            cast_pair::<$s, u8>();
            cast_pair::<$s, B>();
        }
    };
}

cast_from!(casts_from_f32, f32);
cast_from!(casts_from_f64, f64);
cast_from!(casts_from_f16, f16);
cast_from!(casts_from_bf16, bf16);
cast_from!(casts_from_i64, i64);
cast_from!(casts_from_i32, i32);
cast_from!(casts_from_u8, u8);
cast_from!(casts_from_bool, B);
