#![allow(clippy::unwrap_used)]
//! The elementwise kernels' contiguous loops (Note [Elementwise loops] in kernels/ember.cuh)
//! and the split whole reductions (Note [Split whole reductions] in
//! crates/ember-tensor/src/cuda/reduce.rs) through the tensor API, so with the host's own
//! launch geometry (a grid sized from the SM count: 132 on the emulator): sizes around the
//! vector and block boundaries, views one element off (misaligned), every dtype, against the
//! CPU backend; a long f32 sum against an f64 reference; ties and NaNs across the blocks of a
//! split reduction.

mod common_cuda;

use common_cuda::{CPU, GPU, same, same_within, setup, values};
use ember_tensor::{ALL_DTYPES, DType, Tensor};

/// One group is 16 bytes; one block of 256 threads takes 4 groups each per pass: 4096 f32
/// elements, 16384 u8. 70 001 is past a block for every dtype.
const SIZES: &[usize] = &[1, 7, 8, 9, 4095, 4096 + 3, 70_001];

#[test]
fn elementwise_ops_at_vector_and_block_boundaries() {
    setup();
    for &n in SIZES {
        for dt in ALL_DTYPES {
            let (a, b) = (values(dt, n + 1, 1, true), values(dt, n + 1, 2, false));
            let c = values(DType::Bool, n + 1, 3, false);
            for skew in [0, 1] {
                let v = |t: &Tensor| t.narrow(0, skew, n);
                let what = |op: &str| format!("{op} {dt} n={n} skew={skew}");
                same(&what("sign"), &[&a], |t| v(&t[0])?.sign());
                same(&what("exp"), &[&a], |t| v(&t[0])?.exp());
                same(&what("add"), &[&a, &b], |t| v(&t[0])?.add(&v(&t[1])?));
                same(&what("lt"), &[&a, &b], |t| v(&t[0])?.lt(&v(&t[1])?));
                same(&what("where"), &[&c, &a, &b], |t| {
                    ember_tensor::r#where(&v(&t[0])?, &v(&t[1])?, &v(&t[2])?)
                });
                for to in [DType::F32, DType::F16, DType::I64, DType::U8] {
                    same(&what(&format!("to {to}")), &[&a], |t| {
                        v(&t[0])?.to_dtype(to)
                    });
                }
            }
        }
    }
}

/// Every op and dtype of the split path (so every `reduce_part_*` and `reduce_combine_*`
/// kernel runs), against the CPU.
#[test]
fn whole_reductions_split_over_blocks_every_dtype() {
    setup();
    // 40 000 elements: 4 blocks (one per 8192 elements), the first taking a second pass.
    let n = 40_000;
    for dt in ALL_DTYPES {
        let x = values(dt, n, 7, false);
        same(&format!("sum_all {dt}"), &[&x], |t| t[0].sum_all());
        same(&format!("max_all {dt}"), &[&x], |t| t[0].max_all());
        same(&format!("min_all {dt}"), &[&x], |t| t[0].min_all());
        same(&format!("argmax_all {dt}"), &[&x], |t| t[0].argmax_all());
        same(&format!("argmin {dt}"), &[&x], |t| t[0].argmin(0));
        // Products of values near 1 (floats) stay finite; integers wrap the same either way.
        let near_one = if dt.is_float() {
            x.mul(0.001).unwrap().add(1).unwrap().to_dtype(dt).unwrap()
        } else {
            x.clone()
        };
        // Another multiplication order than the CPU's: f32 rounding errors of 40 000 factors.
        same_within(&format!("prod {dt}"), &[&near_one], 20.0, |t| t[0].prod(0));
    }
    // With specials: NaNs propagate, argmax/argmin find the first.
    for dt in [DType::F32, DType::F16] {
        let x = values(dt, n, 8, true);
        same(&format!("max_all {dt} with NaN"), &[&x], |t| t[0].max_all());
        same(&format!("argmin {dt} with NaN"), &[&x], |t| t[0].argmin(0));
    }
}

/// Ties and NaNs planted so that the first one lies in a later block than another: with 4
/// blocks of 256 threads and 4096 f32 elements per block and pass, element 8197 is in block 2
/// and element 16_385 in block 0's second pass.
#[test]
fn split_reductions_keep_the_first_index_across_blocks() {
    setup();
    let n = 40_000;
    let base: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
    let planted = |at: &[usize], v: f32| {
        let mut x = base.clone();
        at.iter().for_each(|&i| x[i] = v);
        Tensor::from_slice(&x, [n], CPU).unwrap()
    };
    let big = planted(&[16_385, 8197, 30_000], 5.0);
    let g = big.to_device(GPU).unwrap();
    assert_eq!(g.argmax_all().unwrap().item::<i64>().unwrap(), 8197);
    assert_eq!(g.max_all().unwrap().item::<f32>().unwrap(), 5.0);
    let small = planted(&[16_385, 8197], -5.0);
    let g = small.to_device(GPU).unwrap();
    assert_eq!(g.argmin(0).unwrap().item::<i64>().unwrap(), 8197);
    let nan = planted(&[20_000, 12_290], f32::NAN);
    let g = nan.to_device(GPU).unwrap();
    assert_eq!(g.argmax_all().unwrap().item::<i64>().unwrap(), 12_290);
    assert_eq!(g.argmin(0).unwrap().item::<i64>().unwrap(), 12_290);
    assert!(g.min_all().unwrap().item::<f32>().unwrap().is_nan());
    // The CPU agrees.
    assert_eq!(big.argmax_all().unwrap().item::<i64>().unwrap(), 8197);
    assert_eq!(nan.argmin(0).unwrap().item::<i64>().unwrap(), 12_290);
}

/// A sum of 2^20 f32 values against the f64 sum: within 8·log2(n) f32 ulps of Σ|x| (the
/// split sums short runs per thread and then a tree, so its error grows with the depth, not
/// with n).
#[test]
fn long_f32_sum_is_accurate() {
    setup();
    let n = 1usize << 20;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i as u64 * 2_654_435_761) % 1_000_003) as f32 / 1_000_003.0 - 0.3)
        .collect();
    let want: f64 = x.iter().map(|&v| f64::from(v)).sum();
    let mag: f64 = x.iter().map(|&v| f64::from(v).abs()).sum();
    let g = Tensor::from_slice(&x, [n], GPU).unwrap();
    let got = f64::from(g.sum_all().unwrap().item::<f32>().unwrap());
    let tol = 8.0 * (n as f64).log2() * f64::from(f32::EPSILON) * mag;
    assert!(
        (got - want).abs() <= tol,
        "sum of {n} f32: {got}, want {want} (tolerance {tol})"
    );
}
