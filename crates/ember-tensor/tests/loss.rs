#![allow(clippy::unwrap_used)]
//! cross_entropy and nll_loss against a direct f64 log-sum-exp reference
//! (`ember_testing::reference::cross_entropy`; proptest over shapes, weights, ignore_index,
//! smoothing, reductions, dtypes and layouts), hand-computed values, and error cases, on
//! every device (`ember_testing::test_device!`: `cpu` and the emulated or real `cuda:0`).

mod common_nn;

use common_nn::*;
use ember_tensor::aten;
use ember_tensor::{CrossEntropyOptions, DType, Device, NllLossOptions, Reduction, Tensor};
use ember_testing::reference::{self, CrossEntropy};
use ember_testing::{rand_vec, test_device, values};
use proptest::prelude::*;

/// The reference of `cross_entropy` (`log_input`: `nll_loss`) with these options.
#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    ncl: (usize, usize, usize),
    t: &[i64],
    weight: Option<&[f64]>,
    ignore_index: i64,
    label_smoothing: f64,
    reduction: Reduction,
    log_input: bool,
) -> Vec<f64> {
    let o = CrossEntropy {
        weight,
        ignore_index,
        label_smoothing,
        reduction,
        log_input,
    };
    reference::cross_entropy(x, ncl, t, &o)
}

fn cross_entropy_and_nll_match_reference(device: &Device) {
    proptest!(ProptestConfig::with_cases(300), |(
        (n, c, extra) in (1usize..=3, 1usize..=6, prop::collection::vec(1usize..=3, 0..=2)),
        (weighted, eps_i, red_i, ign_i, di, layout, i32_target, seed)
            in (any::<bool>(), 0usize..4, 0usize..3, 0usize..3, 0usize..4, 0u8..3, any::<bool>(), any::<u64>()),
        unbatched in any::<bool>(),
    )| {
        let dtype = FLOAT_DTYPES[di];
        let eps = [0.0, 0.1, 0.37, 1.0][eps_i];
        let red = [Reduction::None, Reduction::Sum, Reduction::Mean][red_i];
        let unbatched = unbatched && extra.is_empty();
        let (n, extra) = if unbatched { (1, vec![]) } else { (n, extra) };
        let l: usize = extra.iter().product();
        let mut xshape = if unbatched { vec![c] } else { vec![n, c] };
        xshape.extend(&extra);
        let mut tshape = if unbatched { vec![] } else { vec![n] };
        tshape.extend(&extra);
        let raw = rand_vec(n * c * l, seed);
        let logits: Vec<f64> = raw.iter().map(|v| v * 4.0).collect();
        let x = make(&logits, &xshape, dtype, layout, device);
        let xv = values(&x);
        // Targets: random classes; ignore_index is -100, class 0, or unused 7.
        let ignore = [-100i64, 0, 7][ign_i];
        let tv: Vec<i64> = rand_vec(n * l, seed ^ 5).iter().enumerate().map(|(i, r)| {
            if i % 4 == 3 && ign_i == 0 { -100 } else { ((r + 1.0) / 2.0 * c as f64) as i64 % c as i64 }
        }).collect();
        let t = Tensor::from_vec(tv.clone(), tshape.clone(), device).unwrap();
        let t = if i32_target { t.to_dtype(DType::I32).unwrap() } else { t };
        let wv: Vec<f64> = rand_vec(c, seed ^ 9).iter().map(|v| v + 1.5).collect();
        let w = Tensor::from_vec(wv.clone(), [c], device).unwrap().to_dtype(dtype).unwrap();
        let wv = values(&w);
        let wopt = weighted.then_some(wv.as_slice());

        let mut o = CrossEntropyOptions::new().ignore_index(ignore).reduction(red).label_smoothing(eps);
        if weighted {
            o = o.weight(&w);
        }
        let got = x.cross_entropy(&t, &o).unwrap();
        prop_assert_eq!(got.dtype(), dtype);
        prop_assert_eq!(got.device(), *device);
        let want = reference(&xv, (n, c, l), &tv, wopt, ignore, eps, red, false);
        if red == Reduction::None {
            prop_assert_eq!(got.dims(), tshape.as_slice());
        } else {
            prop_assert_eq!(got.rank(), 0);
        }
        within(tol(dtype) * 4.0, 1.0, "cross_entropy").assert(&got, &want);
        let gc = x.contiguous().unwrap().cross_entropy(&t, &o).unwrap();
        within(0.0, 0.0, "layouts").assert(&got, &gc);

        // nll_loss on the same numbers read as log-probabilities.
        let mut no = NllLossOptions::new().ignore_index(ignore).reduction(red);
        if weighted {
            no = no.weight(&w);
        }
        let got = x.nll_loss(&t, &no).unwrap();
        let want = reference(&xv, (n, c, l), &tv, wopt, ignore, 0.0, red, true);
        within(tol(dtype) * 4.0, 1.0, "nll_loss").assert(&got, &want);
    });
}
test_device!(
    cross_entropy_and_nll_match_reference,
    cross_entropy_and_nll_match_reference
);

/// Random shapes, dtypes and options: an error or a result, never a panic.
fn losses_random_arguments_never_panic(device: &Device) {
    proptest!(|(
        xs in prop::collection::vec(0usize..=4, 0..=4),
        ts in prop::collection::vec(0usize..=4, 0..=3),
        ws in prop::collection::vec(0usize..=4, 0..=2),
        (tval, ignore, eps, xdt, tdt) in (-3i64..6, -3i64..3, -0.5f64..1.5, 0usize..8, 0usize..8),
    )| {
        let dts = ember_tensor::ALL_DTYPES;
        let x = Tensor::ones(xs, (device, dts[xdt % dts.len()])).unwrap();
        let t = Tensor::full(ts, tval, (device, dts[tdt % dts.len()])).unwrap();
        let w = Tensor::ones(ws, device).unwrap();
        let _ = x.cross_entropy(&t, &CrossEntropyOptions::new().weight(&w).ignore_index(ignore).label_smoothing(eps));
        let _ = x.nll_loss(&t, &NllLossOptions::new().ignore_index(ignore).reduction(Reduction::None));
        let _ = aten::nll_loss_terms(&x, &t, None, ignore);
    });
}
test_device!(
    losses_random_arguments_never_panic,
    losses_random_arguments_never_panic
);

/// The CPU's fused cross-entropy (row max and `ln Σ exp`, log-probability at the target
/// only; parallel over rows from 32Ki elements; CUDA runs the composite) against
/// `log_softmax` then `nll_loss`, to the bit, and against the f64 reference, on shapes large enough for the parallel path;
/// with a row holding `-inf` and one holding `+inf` (NaN loss, as in PyTorch), ignored
/// targets and class weights.
fn fused_cross_entropy_matches_log_softmax_then_nll(device: &Device) {
    for (n, c, seed) in [(300usize, 1000usize, 1u64), (97, 513, 2), (5, 40_000, 3)] {
        let mut logits: Vec<f64> = rand_vec(n * c, seed).iter().map(|v| v * 6.0).collect();
        logits[c + 3] = f64::NEG_INFINITY;
        logits[2 * c + 1] = f64::INFINITY;
        let tv: Vec<i64> = rand_vec(n, seed ^ 5)
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if i % 7 == 6 {
                    -100
                } else {
                    ((r + 1.0) / 2.0 * c as f64) as i64 % c as i64
                }
            })
            .collect();
        let t = Tensor::from_vec(tv.clone(), [n], device).unwrap();
        let wv: Vec<f64> = rand_vec(c, seed ^ 9).iter().map(|v| v + 1.5).collect();
        for dtype in [DType::F32, DType::F64] {
            let x = Tensor::from_vec(logits.clone(), [n, c], device)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let w = Tensor::from_vec(wv.clone(), [c], device)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            for weighted in [false, true] {
                let mut o = CrossEntropyOptions::new().reduction(Reduction::None);
                let mut no = NllLossOptions::new().reduction(Reduction::None);
                if weighted {
                    o = o.weight(&w);
                    no = no.weight(&w);
                }
                let got = values(&x.cross_entropy(&t, &o).unwrap());
                let composite = values(&x.log_softmax(1).unwrap().nll_loss(&t, &no).unwrap());
                let same = got
                    .iter()
                    .zip(&composite)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{dtype} [{n}, {c}] weighted {weighted}: fused differs from composite"
                );
                assert!(
                    got[2].is_nan() || tv[2] == -100,
                    "a +inf logit gives NaN as in PyTorch"
                );
                let xv = values(&x);
                let wopt = weighted.then_some(wv.as_slice());
                let want = reference(&xv, (n, c, 1), &tv, wopt, -100, 0.0, Reduction::None, false);
                // Rows 1 and 2 hold the infinities, which the reference turns into NaN
                // through its smoothing term (0 * inf).
                let finite = |v: &[f64]| -> Vec<f64> {
                    v.iter()
                        .enumerate()
                        .filter(|&(i, _)| i > 2)
                        .map(|(_, &v)| v)
                        .collect()
                };
                within(tol(dtype) * 4.0, 1.0, "fused cross_entropy")
                    .assert(&finite(&got), &finite(&want));
            }
        }
    }
}
test_device!(
    fused_cross_entropy_matches_log_softmax_then_nll,
    fused_cross_entropy_matches_log_softmax_then_nll
);

fn cross_entropy_known_values(device: &Device) {
    // logits [1, 2, 3], target 0. lse = 3 + ln(1 + e^-1 + e^-2) = 3.4076059644;
    // logp = [-2.4076059644, -1.4076059644, -0.4076059644]; nll = 2.4076059644.
    // With ε = 0.1: smooth = Σ -logp = 4.2228178933, loss = 0.9·2.4076059644 +
    // (0.1/3)·4.2228178933 = 2.1668453680 + 0.1407605964 = 2.3076059644.
    let x = Tensor::from_vec(vec![1f64, 2., 3.], [1, 3], device).unwrap();
    let t = Tensor::new(&[0i64], device).unwrap();
    let l = x.cross_entropy(&t, &CrossEntropyOptions::new()).unwrap();
    assert!((l.item::<f64>().unwrap() - 2.4076059644).abs() < 1e-9);
    let l = x
        .cross_entropy(&t, &CrossEntropyOptions::new().label_smoothing(0.1))
        .unwrap();
    assert!((l.item::<f64>().unwrap() - 2.3076059644).abs() < 1e-9);
    // Unbatched [C] input with a scalar target.
    let l = x
        .reshape([3])
        .unwrap()
        .cross_entropy(
            &Tensor::scalar(0i64, device).unwrap(),
            &CrossEntropyOptions::new(),
        )
        .unwrap();
    assert_eq!(l.rank(), 0);
    assert!((l.item::<f64>().unwrap() - 2.4076059644).abs() < 1e-9);
    // Weighted mean divides by the summed weights of the targets: targets 0 and 2 with
    // weights 2 and 0.5 on logp rows: loss = (2·2.4076 + 0.5·0.4076) / 2.5.
    let x2 = Tensor::from_vec(vec![1f64, 2., 3., 1., 2., 3.], [2, 3], device).unwrap();
    let t2 = Tensor::new(&[0i64, 2], device).unwrap();
    let w = Tensor::new(&[2f64, 1., 0.5], device).unwrap();
    let l = x2
        .cross_entropy(&t2, &CrossEntropyOptions::new().weight(&w))
        .unwrap();
    let want = (2.0 * 2.4076059644 + 0.5 * 0.4076059644) / 2.5;
    assert!((l.item::<f64>().unwrap() - want).abs() < 1e-9);
    // Ignored targets drop out of the mean; all ignored gives NaN (as PyTorch).
    let ti = Tensor::new(&[0i64, -100], device).unwrap();
    let l = x2.cross_entropy(&ti, &CrossEntropyOptions::new()).unwrap();
    assert!((l.item::<f64>().unwrap() - 2.4076059644).abs() < 1e-9);
    let ta = Tensor::new(&[-100i64, -100], device).unwrap();
    for eps in [0.0, 0.2] {
        let o = CrossEntropyOptions::new().label_smoothing(eps);
        assert!(
            x2.cross_entropy(&ta, &o)
                .unwrap()
                .item::<f64>()
                .unwrap()
                .is_nan()
        );
        let s = x2.cross_entropy(&ta, &o.reduction(Reduction::Sum)).unwrap();
        assert_eq!(s.item::<f64>().unwrap(), 0.0);
    }
    // nll_loss_terms: per-element loss and weight (0 where ignored).
    let (lt, wt) = aten::nll_loss_terms(&x2, &ti, Some(&w), -100).unwrap();
    assert_eq!(lt.to_vec::<f64>().unwrap(), vec![-2.0, 0.0]);
    assert_eq!(wt.to_vec::<f64>().unwrap(), vec![2.0, 0.0]);
}
test_device!(cross_entropy_known_values, cross_entropy_known_values);

fn loss_errors(device: &Device) {
    let x = Tensor::zeros([2, 3], device).unwrap();
    let e = x
        .cross_entropy(
            &Tensor::new(&[0i64, 5], device).unwrap(),
            &CrossEntropyOptions::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("target 5 is out of bounds"), "{e}");
    let e = x
        .nll_loss(
            &Tensor::new(&[-1i64, 0], device).unwrap(),
            &NllLossOptions::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("target -1"), "{e}");
    let e = x
        .cross_entropy(
            &Tensor::zeros([2], device).unwrap(),
            &CrossEntropyOptions::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("torch.float32"), "{e}");
    let e = x
        .cross_entropy(
            &Tensor::new(&[0i64, 1, 2], device).unwrap(),
            &CrossEntropyOptions::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("batch_size (2)") && e.contains("[2, 3]") && e.contains("[3]"),
        "{e}"
    );
    let x3 = Tensor::zeros([2, 3, 4], device).unwrap();
    let e = x3
        .cross_entropy(
            &Tensor::zeros([2, 5], (device, DType::I64)).unwrap(),
            &CrossEntropyOptions::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[2, 4]") && e.contains("[2, 5]") && e.contains("[2, 3, 4]"),
        "{e}"
    );
    let t = Tensor::new(&[0i64, 1], device).unwrap();
    let e = x
        .cross_entropy(&t, &CrossEntropyOptions::new().label_smoothing(1.5))
        .unwrap_err()
        .to_string();
    assert!(e.contains("label_smoothing"), "{e}");
    let w = Tensor::ones([2], device).unwrap();
    let e = x
        .cross_entropy(&t, &CrossEntropyOptions::new().weight(&w))
        .unwrap_err()
        .to_string();
    assert!(e.contains("weight"), "{e}");
    assert!(
        Tensor::zeros([2, 3], (device, DType::I64))
            .unwrap()
            .cross_entropy(&t, &CrossEntropyOptions::new())
            .is_err()
    );
    assert!(
        Tensor::scalar(1f32, device)
            .unwrap()
            .cross_entropy(
                &Tensor::scalar(0i64, device).unwrap(),
                &CrossEntropyOptions::new()
            )
            .is_err()
    );
}
test_device!(loss_errors, loss_errors);

/// The fused backward (`cross_entropy_backward`, one kernel) against the f64 gradient of
/// the reference formula (`reference::cross_entropy_grad`), over shapes (`[C]`, `[N, C]`,
/// `[N, C, d...]`), weights, ignore_index, smoothing, reductions, f32/f64/f16/bf16 logits
/// in several layouts and i64/i32 targets; the gradient has the logits' dtype and shape.
fn cross_entropy_backward_matches_reference(device: &Device) {
    proptest!(ProptestConfig::with_cases(200), |(
        (n, c, extra) in (1usize..=3, 1usize..=6, prop::collection::vec(1usize..=3, 0..=2)),
        (weighted, eps_i, red_i, di, layout, i32_target, seed)
            in (any::<bool>(), 0usize..4, 0usize..3, 0usize..4, 0u8..3, any::<bool>(), any::<u64>()),
    )| {
        let dtype = FLOAT_DTYPES[di];
        let eps = [0.0, 0.1, 0.37, 1.0][eps_i];
        let red = [Reduction::None, Reduction::Sum, Reduction::Mean][red_i];
        let l: usize = extra.iter().product();
        let mut xshape = vec![n, c];
        xshape.extend(&extra);
        let mut tshape = vec![n];
        tshape.extend(&extra);
        let logits: Vec<f64> = rand_vec(n * c * l, seed).iter().map(|v| v * 4.0).collect();
        let x = make(&logits, &xshape, dtype, layout, device);
        let xv = values(&x);
        let tv: Vec<i64> = rand_vec(n * l, seed ^ 5).iter().enumerate().map(|(i, r)| {
            if i % 3 == 2 { -100 } else { ((r + 1.0) / 2.0 * c as f64) as i64 % c as i64 }
        }).collect();
        let t = Tensor::from_vec(tv.clone(), tshape.clone(), device).unwrap();
        let t = if i32_target { t.to_dtype(DType::I32).unwrap() } else { t };
        let wv: Vec<f64> = rand_vec(c, seed ^ 9).iter().map(|v| v + 1.5).collect();
        let w = Tensor::from_vec(wv, [c], device).unwrap().to_dtype(dtype).unwrap();
        let wv = values(&w);
        let mut o = CrossEntropyOptions::new().reduction(red).label_smoothing(eps);
        if weighted {
            o = o.weight(&w);
        }
        let (loss, saved) = aten::cross_entropy_forward(&x, &t, &o).unwrap();
        let gv: Vec<f64> = rand_vec(loss.numel(), seed ^ 11).iter().map(|v| v + 0.25).collect();
        let g = Tensor::from_vec(gv.clone(), loss.dims(), device).unwrap().to_dtype(dtype).unwrap();
        let gv = values(&g);
        let got = aten::cross_entropy_backward(&x, &t, &o, &saved, &g).unwrap();
        prop_assert_eq!(got.dtype(), dtype);
        prop_assert_eq!(got.dims(), xshape.as_slice());
        let r = CrossEntropy {
            weight: weighted.then_some(wv.as_slice()),
            ignore_index: -100,
            label_smoothing: eps,
            reduction: red,
            log_input: false,
        };
        let want = reference::cross_entropy_grad(&xv, (n, c, l), &tv, &r, &gv);
        within(tol(dtype) * 4.0, 1.0, "cross_entropy backward").assert(&got, &want);
    });
}
test_device!(
    cross_entropy_backward_matches_reference,
    cross_entropy_backward_matches_reference
);

/// The backward's operand checks: a gradient of the wrong size is an error, not a read past
/// its end.
fn cross_entropy_backward_rejects_a_mismatched_gradient(device: &Device) {
    let x = Tensor::zeros([2, 3], device).unwrap();
    let t = Tensor::new(&[0i64, 2], device).unwrap();
    let o = CrossEntropyOptions::new().reduction(Reduction::None);
    let (_, saved) = aten::cross_entropy_forward(&x, &t, &o).unwrap();
    let e = aten::cross_entropy_backward(&x, &t, &o, &saved, &Tensor::ones([5], device).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gradient"), "{e}");
}
test_device!(
    cross_entropy_backward_rejects_a_mismatched_gradient,
    cross_entropy_backward_rejects_a_mismatched_gradient
);

/// The `mean` reduction of many rows: on CUDA one launch after the forward up to 2^16 rows
/// (`cross_entropy_mean`), the whole-tensor reductions past it; both against the f64
/// reference, with ignored targets and class weights, in f32 and f64. The rows are `[N, L]`
/// positions of `[N, C, L]` scores (one thread per row in the forward, which the emulator
/// runs quickly; the mean does not depend on the layout).
fn cross_entropy_mean_of_many_rows(device: &Device) {
    let emulated = device.is_cuda() && !ember_testing::real_gpu_requested();
    let c = 3;
    for (nb, l, fused) in [
        (64usize, 64usize, true),
        (1024, 64, true),
        (1, (1 << 16) + 1, false),
    ] {
        let n = nb * l;
        let logits: Vec<f64> = rand_vec(n * c, n as u64).iter().map(|v| v * 4.0).collect();
        let tv: Vec<i64> = (0..n)
            .map(|i| if i % 5 == 4 { -100 } else { (i % c) as i64 })
            .collect();
        let t = Tensor::from_vec(tv.clone(), [nb, l], device).unwrap();
        let wv = [0.5, 1.0, 2.0];
        for dtype in [DType::F32, DType::F64] {
            let x = Tensor::from_vec(logits.clone(), [nb, c, l], device)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let w = Tensor::from_vec(wv.to_vec(), [c], device)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let o = CrossEntropyOptions::new().weight(&w);
            let before = ember_device::driver::emulator::thread_launch_counts();
            let got = x.cross_entropy(&t, &o).unwrap();
            let after = ember_device::driver::emulator::thread_launch_counts();
            let want = reference(
                &values(&x),
                (nb, c, l),
                &tv,
                Some(&wv),
                -100,
                0.0,
                Reduction::Mean,
                false,
            );
            within(tol(dtype) * 4.0, 1.0, "mean of many rows").assert(&got, &want);
            if emulated {
                let launched: Vec<(&String, u64)> = after
                    .iter()
                    .map(|(k, v)| (k, v - before.get(k).unwrap_or(&0)))
                    .filter(|&(_, v)| v > 0)
                    .collect();
                let mean = format!("cross_entropy_mean_{}", dtype.short_name());
                let has = |k: &str| launched.iter().any(|(name, _)| name.as_str() == k);
                assert_eq!(has(&mean), fused, "{n} rows {dtype}: {launched:?}");
                if fused {
                    // The forward and the mean; the targets hold -100, so their range does
                    // not prove them valid and an error slot is filled first.
                    let kernels: Vec<&str> = launched.iter().map(|(k, _)| k.as_str()).collect();
                    let fwd = format!("cross_entropy_fwd_{}_i64", dtype.short_name());
                    assert_eq!(
                        kernels,
                        [fwd.as_str(), mean.as_str(), "ember_fill_i64"],
                        "{n} rows {dtype}"
                    );
                }
            }
        }
    }
}
test_device!(
    cross_entropy_mean_of_many_rows,
    cross_entropy_mean_of_many_rows
);
