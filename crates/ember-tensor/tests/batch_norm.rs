#![allow(clippy::unwrap_used)]
//! The fused batch norm (`batch_norm_forward`/`batch_norm_backward`) against f64 loops, for
//! the shapes that pick each path of the CUDA reductions (Note [Split channel reductions]
//! in `src/cuda/fused.rs`): few channels of many values (each channel split over several
//! blocks and combined; long rows and short rows), many channels of few values (one block
//! per channel), and `[N, C]`; in every float dtype, on every device (`test_device!`: `cpu`
//! and the emulated or real `cuda:0`, whose 132 SMs make the emulator split as an H100
//! does).

use ember_tensor::aten;
use ember_tensor::{DType, Device, Tensor};
use ember_testing::test_device;

/// `n` values in `[lo, lo + 4)` from `seed`, as f64.
fn values(n: usize, seed: u64, lo: f64) -> Vec<f64> {
    ember_testing::rand_vec(n, seed)
        .iter()
        .map(|u| lo + 2.0 * (u + 1.0))
        .collect()
}

fn tensor(v: &[f64], dims: &[usize], dtype: DType, device: &Device) -> Tensor {
    Tensor::from_slice(v, dims, *device)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// [`tensor`] as a contiguous view `shift` elements into a larger storage (an unaligned
/// start for a shift that is not a multiple of 16 bytes).
fn shifted(v: &[f64], dims: &[usize], dtype: DType, device: &Device, shift: usize) -> Tensor {
    if shift == 0 {
        return tensor(v, dims, dtype, device);
    }
    let mut padded = vec![0.0; shift];
    padded.extend_from_slice(v);
    let all = tensor(&padded, &[padded.len()], dtype, device);
    let t = all.narrow(0, shift, v.len()).unwrap().view(dims).unwrap();
    assert!(t.is_contiguous());
    t
}

fn read(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// `|got - want| <= tol · scale` element by element.
fn check(what: &str, got: &[f64], want: &[f64], scale: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(
            (g - w).abs() <= tol * s.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// The f64 reference of one training step: per channel mean, biased variance, the
/// normalised output, the running statistics' update, and the three gradients.
struct Reference {
    y: Vec<f64>,
    running_mean: Vec<f64>,
    running_var: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
    /// Σ|dy| and Σ|dy·x̂| per channel: the scale of the sums' rounding.
    dw_scale: Vec<f64>,
    db_scale: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    dy: &[f64],
    (n, c, s): (usize, usize, usize),
    w: &[f64],
    b: &[f64],
    (rm0, rv0): (&[f64], &[f64]),
    momentum: f64,
    eps: f64,
) -> Reference {
    let m = (n * s) as f64;
    let at = |i: usize, ch: usize, k: usize| (i * c + ch) * s + k;
    let mut r = Reference {
        y: vec![0.0; x.len()],
        running_mean: vec![0.0; c],
        running_var: vec![0.0; c],
        dx: vec![0.0; x.len()],
        dw: vec![0.0; c],
        db: vec![0.0; c],
        dw_scale: vec![0.0; c],
        db_scale: vec![0.0; c],
    };
    for ch in 0..c {
        let idx: Vec<usize> = (0..n)
            .flat_map(|i| (0..s).map(move |k| at(i, ch, k)))
            .collect();
        let mean = idx.iter().map(|&i| x[i]).sum::<f64>() / m;
        let var = idx.iter().map(|&i| (x[i] - mean).powi(2)).sum::<f64>() / m;
        let invstd = 1.0 / (var + eps).sqrt();
        r.running_mean[ch] = (1.0 - momentum) * rm0[ch] + momentum * mean;
        r.running_var[ch] = (1.0 - momentum) * rv0[ch] + momentum * var * m / (m - 1.0);
        for &i in &idx {
            let xhat = (x[i] - mean) * invstd;
            r.y[i] = xhat * w[ch] + b[ch];
            r.db[ch] += dy[i];
            r.dw[ch] += dy[i] * xhat;
            r.db_scale[ch] += dy[i].abs();
            r.dw_scale[ch] += (dy[i] * xhat).abs();
        }
        for &i in &idx {
            let xhat = (x[i] - mean) * invstd;
            r.dx[i] = w[ch] * invstd * (dy[i] - r.db[ch] / m - xhat * r.dw[ch] / m);
        }
    }
    r
}

/// One training step of `dims` in `dtype` on `device` against [`reference`].
fn step_matches(dims: &[usize], dtype: DType, device: &Device) {
    step_matches_shifted(dims, dtype, device, 0);
}

/// [`step_matches`] with the input and the upstream gradient `shift` elements into their
/// storages.
fn step_matches_shifted(dims: &[usize], dtype: DType, device: &Device, shift: usize) {
    let (n, c) = (dims[0], dims[1]);
    let s: usize = dims[2..].iter().product();
    let total = n * c * s;
    let cd = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    // Values away from 0 (mean near 4), where a one-pass variance would lose digits.
    let x = shifted(&values(total, 1, 2.0), dims, dtype, device, shift);
    let dy = shifted(&values(total, 2, -2.0), dims, dtype, device, shift);
    let (xv, dyv) = (read(&x), read(&dy));
    let (wv, bv) = (values(c, 3, -1.0), values(c, 4, -2.0));
    let (rm0, rv0) = (values(c, 5, -2.0), values(c, 6, 0.5));
    let w = tensor(&wv, &[c], cd, device);
    let b = tensor(&bv, &[c], cd, device);
    let rm = tensor(&rm0, &[c], cd, device);
    let rv = tensor(&rv0, &[c], cd, device);
    let (momentum, eps) = (0.1, 1e-5);
    let (y, saved) = aten::batch_norm_forward(
        &x,
        Some(&rm),
        Some(&rv),
        Some(&w),
        Some(&b),
        true,
        momentum,
        eps,
    )
    .unwrap();
    let (dx, dw, db) =
        aten::batch_norm_backward(&x, &dy, Some(&w), &saved, [true, true, true]).unwrap();
    let want = reference(&xv, &dyv, (n, c, s), &wv, &bv, (&rm0, &rv0), momentum, eps);
    assert_eq!(y.dtype(), dtype);
    let what = |t: &str| format!("{t} of {dims:?} {dtype} (shift {shift}) on {device}");
    // Elementwise results are rounded once to the dtype; the statistics and sums are in the
    // compute dtype (f32 for 16-bit input).
    // The sums' tolerance is relative to Σ|term|: x̂ carries f32's rounding of the statistics,
    // amplified where a channel's few values lie close together.
    let (elem, stat, sum) = match dtype {
        DType::F64 => (1e-10, 1e-10, 1e-10),
        DType::F32 => (2e-4, 1e-5, 1e-4),
        DType::F16 => (4e-3, 1e-5, 1e-4),
        _ => (2e-2, 1e-5, 1e-4),
    };
    check(&what("y"), &read(&y), &want.y, &want.y, elem);
    check(
        &what("running_mean"),
        &read(&rm),
        &want.running_mean,
        &want.running_mean,
        stat,
    );
    check(
        &what("running_var"),
        &read(&rv),
        &want.running_var,
        &want.running_var,
        stat,
    );
    check(&what("dx"), &read(&dx.unwrap()), &want.dx, &want.dx, elem);
    check(
        &what("dw"),
        &read(&dw.unwrap()),
        &want.dw,
        &want.dw_scale,
        sum,
    );
    check(
        &what("db"),
        &read(&db.unwrap()),
        &want.db,
        &want.db_scale,
        sum,
    );
}

const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];

/// Few channels of many values: split over several blocks per channel on CUDA; rows longer
/// than a block ([4, 2, 48, 48]), rows shorter than a block ([300, 2, 5, 5]), and `[N, C]`.
fn few_channels_of_many_values(device: &Device) {
    let emulated = device.is_cuda() && !ember_testing::real_gpu_requested();
    let before = ember_device::driver::emulator::thread_launch_counts();
    for dims in [&[4usize, 2, 48, 48][..], &[300, 2, 5, 5], &[5000, 3]] {
        for dtype in DTYPES {
            step_matches(dims, dtype, device);
        }
    }
    if emulated {
        // The split path ran: per shape, one combine kernel after the statistics and one
        // after the backward's sums, f32 (f32, f16, bf16 inputs) and f64.
        let after = ember_device::driver::emulator::thread_launch_counts();
        let count = |k: &str| after.get(k).unwrap_or(&0) - before.get(k).unwrap_or(&0);
        for (k, want) in [
            ("batch_norm_stats_combine_f32", 9),
            ("batch_norm_bwd_combine_f32", 9),
            ("batch_norm_stats_combine_f64", 3),
            ("batch_norm_bwd_combine_f64", 3),
        ] {
            assert_eq!(count(k), want, "{k}");
        }
    }
}
test_device!(
    batch_norm_of_few_channels_of_many_values,
    few_channels_of_many_values
);

/// Many channels of few values: one block per channel.
fn many_channels_of_few_values(device: &Device) {
    let before = ember_device::driver::emulator::thread_launch_counts();
    for dims in [&[2usize, 600, 2, 3][..], &[3, 700]] {
        for dtype in DTYPES {
            step_matches(dims, dtype, device);
        }
    }
    // One block per channel: no combine kernels.
    let after = ember_device::driver::emulator::thread_launch_counts();
    assert!(
        after
            .iter()
            .all(|(k, v)| !k.contains("_combine_") || before.get(k) == Some(v)),
        "a combine kernel ran"
    );
}
test_device!(
    batch_norm_of_many_channels_of_few_values,
    many_channels_of_few_values
);

/// Rows that hold whole 16-byte groups (Note [Grouped channel walks] in
/// `kernels/batch_norm.cu`): [161, 2, 5, 8] splits each channel into parts whose bounds fall
/// inside groups (the elements around them taken one by one) in every dtype; the same shapes
/// at an unaligned start take the element loops.
fn grouped_walks(device: &Device) {
    for dtype in DTYPES {
        step_matches(&[161, 2, 5, 8], dtype, device);
        step_matches_shifted(&[4, 2, 48, 48], dtype, device, 1);
        step_matches_shifted(&[161, 2, 5, 8], dtype, device, 3);
    }
}
test_device!(batch_norm_grouped_walks, grouped_walks);
