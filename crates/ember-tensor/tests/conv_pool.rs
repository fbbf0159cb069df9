#![allow(clippy::unwrap_used)]
//! conv2d, max_pool2d and avg_pool2d against direct f64 loops (`ember_testing::reference`;
//! proptest over shapes, options, dtypes and layouts), hand-computed values, and error cases
//! that must be error values, never panics; on every device (`ember_testing::test_device!`:
//! `cpu` and the emulated or real `cuda:0`).

mod common_nn;

use common_nn::*;
use ember_tensor::{
    AvgPool2dOptions, Conv2dOptions, DType, Device, MaxPool2dOptions, Padding, Size2, Tensor,
};
use ember_testing::reference::{self, Conv2d, Pool2d};
use ember_testing::{rand_vec, test_device, values};
use proptest::prelude::*;

// --- conv2d ------------------------------------------------------------------------------

#[allow(clippy::type_complexity)]
fn conv_strategy() -> impl Strategy<
    Value = (
        (usize, usize, usize, usize, usize, usize),
        (usize, usize, usize, usize, usize, usize),
        (usize, usize, usize, usize),
        (bool, usize, u8, u64),
    ),
> {
    (
        (
            1usize..=3,
            1usize..=3,
            1usize..=2,
            1usize..=2,
            1usize..=9,
            1usize..=9,
        ),
        (
            1usize..=4,
            1usize..=4,
            1usize..=3,
            1usize..=3,
            0usize..=2,
            0usize..=2,
        ),
        (1usize..=2, 1usize..=2, 0usize..=3, 0usize..=3),
        (any::<bool>(), 0usize..4, 0u8..3, any::<u64>()),
    )
}

fn conv2d_matches_direct_loops(device: &Device) {
    proptest!(ProptestConfig::with_cases(200), |(
        ((n, g, cg, og, h, w), (kh, kw, sh, sw, ph, pw), (dh, dw, _, _), (has_bias, di, layout, seed))
            in conv_strategy()
    )| {
        let dtype = FLOAT_DTYPES[di];
        let (c, o) = (g * cg, g * og);
        let case = Conv2d::symmetric((n, c, h, w), o, (kh, kw), (sh, sw), (ph, pw), (dh, dw), g);
        let x = make(&rand_vec(n * c * h * w, seed), &[n, c, h, w], dtype, layout, device);
        let wt = make(&rand_vec(o * cg * kh * kw, seed ^ 1), &[o, cg, kh, kw], dtype, layout, device);
        let b = make(&rand_vec(o, seed ^ 2), &[o], dtype, 0, device);
        let opts = Conv2dOptions::new().stride((sh, sw)).padding((ph, pw)).dilation((dh, dw)).groups(g);
        let r = x.conv2d(&wt, has_bias.then_some(&b), &opts);
        match case.out() {
            None => prop_assert!(r.is_err()),
            Some((oh, ow)) => {
                let y = r.unwrap();
                prop_assert_eq!(y.dims(), &[n, o, oh, ow]);
                prop_assert_eq!(y.dtype(), dtype);
                prop_assert_eq!(y.device(), *device);
                let bv = values(&b);
                let (want, _) = reference::conv2d(&case, &values(&x), &values(&wt), has_bias.then_some(bv.as_slice()));
                within(tol(dtype), 1.0, "conv2d").assert(&y, &want);
                // Non-contiguous inputs equal contiguous copies exactly.
                let yc = x.contiguous().unwrap()
                    .conv2d(&wt.contiguous().unwrap(), has_bias.then_some(&b), &opts).unwrap();
                prop_assert_eq!(values(&y), values(&yc));
            }
        }
    });
}
test_device!(conv2d_matches_direct_loops, conv2d_matches_direct_loops);

fn conv2d_same_and_valid_padding(device: &Device) {
    proptest!(ProptestConfig::with_cases(200), |(
        ((n, g, cg, og, h, w), (kh, kw, _, _, _, _), (dh, dw, _, _), (_, di, layout, seed))
            in conv_strategy()
    )| {
        let dtype = FLOAT_DTYPES[di % 2];
        let (c, o) = (g * cg, g * og);
        let x = make(&rand_vec(n * c * h * w, seed), &[n, c, h, w], dtype, layout, device);
        let wt = make(&rand_vec(o * cg * kh * kw, seed ^ 1), &[o, cg, kh, kw], dtype, 0, device);
        let (th, tw) = (dh * (kh - 1), dw * (kw - 1));
        let same = Conv2d {
            nchw: (n, c, h, w), out_channels: o, kernel: (kh, kw), stride: (1, 1),
            pad: (th / 2, tw / 2), pad_total: (th, tw), dilation: (dh, dw), groups: g,
        };
        let y = x.conv2d(&wt, None, &Conv2dOptions::new().padding(Padding::Same).dilation((dh, dw)).groups(g)).unwrap();
        prop_assert_eq!(y.dims(), &[n, o, h, w]);
        let (want, _) = reference::conv2d(&same, &values(&x), &values(&wt), None);
        within(tol(dtype), 1.0, "same").assert(&y, &want);
        let valid = Conv2d { pad: (0, 0), pad_total: (0, 0), ..same };
        let r = x.conv2d(&wt, None, &Conv2dOptions::new().padding(Padding::Valid).dilation((dh, dw)).groups(g));
        match valid.out() {
            None => prop_assert!(r.is_err()),
            Some(_) => {
                let (want, _) = reference::conv2d(&valid, &values(&x), &values(&wt), None);
                within(tol(dtype), 1.0, "valid").assert(&r.unwrap(), &want);
            }
        }
    });
}
test_device!(conv2d_same_and_valid_padding, conv2d_same_and_valid_padding);

/// Random (often inconsistent) shapes and options: an error or a result, never a panic.
fn conv2d_random_arguments_never_panic(device: &Device) {
    proptest!(ProptestConfig::with_cases(200), |(
        xs in prop::collection::vec(0usize..=5, 0..=5),
        ws in prop::collection::vec(0usize..=5, 0..=5),
        bs in prop::collection::vec(0usize..=5, 0..=2),
        (s, p, d, g) in (0usize..=3, 0usize..=3, 0usize..=2, 0usize..=3),
        mode in 0u8..3,
    )| {
        let x = Tensor::ones(xs, device).unwrap();
        let wt = Tensor::ones(ws, device).unwrap();
        let b = Tensor::ones(bs, device).unwrap();
        let padding = match mode { 0 => Padding::from(p), 1 => Padding::Same, _ => Padding::Valid };
        let opts = Conv2dOptions { stride: Size2(s, s.max(1)), padding, dilation: Size2(d, 1), groups: g };
        let _ = x.conv2d(&wt, None, &opts);
        let _ = x.conv2d(&wt, Some(&b), &opts);
    });
}
test_device!(
    conv2d_random_arguments_never_panic,
    conv2d_random_arguments_never_panic
);

fn conv2d_unbatched_and_known_values(device: &Device) {
    // x = 0..16 as 4×4, w = [[1, 0], [0, -1]], stride 1, padding 0:
    // y[i, j] = x[i, j] - x[i+1, j+1] = -5 everywhere; plus bias 2 -> -3.
    let x = Tensor::arange(0f32, 16., device)
        .unwrap()
        .reshape([1, 4, 4])
        .unwrap();
    let w = Tensor::from_vec(vec![1f32, 0., 0., -1.], [1, 1, 2, 2], device).unwrap();
    let b = Tensor::new(&[2f32], device).unwrap();
    let y = x.conv2d(&w, Some(&b), &Conv2dOptions::new()).unwrap();
    assert_eq!(y.dims(), &[1, 3, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![-3.0; 9]);
    // Padding 1, stride 2, a 3×3 box filter of ones on a 3×3 input of ones: corners see 4.
    let x = Tensor::ones([1, 1, 3, 3], device).unwrap();
    let w = Tensor::ones([1, 1, 3, 3], device).unwrap();
    let y = x
        .conv2d(&w, None, &Conv2dOptions::new().stride(2).padding(1))
        .unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![4., 4., 4., 4.]);
    // Depthwise (groups = C): each channel scaled by its own weight.
    let x = Tensor::from_vec(vec![1f64, 2., 3., 4.], [1, 2, 1, 2], device).unwrap();
    let w = Tensor::from_vec(vec![10f64, 100.], [2, 1, 1, 1], device).unwrap();
    let y = x.conv2d(&w, None, &Conv2dOptions::new().groups(2)).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![10., 20., 300., 400.]);
    // Empty batch.
    let x = Tensor::zeros([0, 2, 5, 5], device).unwrap();
    let y = x
        .conv2d(
            &Tensor::ones([3, 2, 3, 3], device).unwrap(),
            None,
            &Conv2dOptions::new(),
        )
        .unwrap();
    assert_eq!(y.dims(), &[0, 3, 3, 3]);
}
test_device!(
    conv2d_unbatched_and_known_values,
    conv2d_unbatched_and_known_values
);

fn conv2d_errors_name_op_and_shapes(device: &Device) {
    let err = |x: &[usize], w: &[usize], b: Option<&[usize]>, o: Conv2dOptions| {
        let x = Tensor::ones(x.to_vec(), device).unwrap();
        let w = Tensor::ones(w.to_vec(), device).unwrap();
        let b = b.map(|b| Tensor::ones(b.to_vec(), device).unwrap());
        x.conv2d(&w, b.as_ref(), &o).unwrap_err().to_string()
    };
    let d = Conv2dOptions::new;
    let e = err(&[1, 4, 8, 8], &[16, 3, 3, 3], None, d());
    assert!(
        e.starts_with(
            "conv2d: expected weight with C/groups = 3 input channels, but input [1, 4, 8, 8] has 4"
        ) && e.contains("[16, 3, 3, 3]"),
        "{e}"
    );
    let e = err(&[1, 4, 8, 8], &[4, 3, 3, 3], None, d().groups(2));
    assert!(
        e.contains("[1, 4, 8, 8]") && e.contains("[4, 3, 3, 3]"),
        "{e}"
    );
    let e = err(&[1, 4, 8, 8], &[3, 2, 3, 3], None, d().groups(2));
    assert!(
        e.contains("divisible by 2") && e.contains("[3, 2, 3, 3]"),
        "{e}"
    );
    let e = err(&[1, 3, 8, 8], &[16, 3, 3, 3], Some(&[15]), d());
    assert!(e.contains("bias [15]") && e.contains("[16]"), "{e}");
    let e = err(&[1, 3, 2, 2], &[16, 3, 3, 3], None, d());
    assert!(
        e.contains("kernel size can't be greater than actual input size"),
        "{e}"
    );
    assert!(err(&[1, 3, 8, 8], &[16, 3, 3, 3], None, d().stride(0)).contains("stride"));
    assert!(err(&[1, 3, 8, 8], &[16, 3, 3, 3], None, d().groups(0)).contains("groups"));
    assert!(err(&[1, 3, 8, 8], &[16, 3, 3, 3], None, d().dilation(0)).contains("dilation"));
    let e = err(
        &[1, 3, 8, 8],
        &[16, 3, 3, 3],
        None,
        d().stride(2).padding(Padding::Same),
    );
    assert!(e.contains("'same'"), "{e}");
    let e = err(&[3, 8], &[16, 3, 3, 3], None, d());
    assert!(e.contains("[3, 8]") && e.contains("[16, 3, 3, 3]"), "{e}");
    let e = err(&[1, 3, 8, 8], &[16, 3, 3], None, d());
    assert!(e.contains("[16, 3, 3]"), "{e}");
    // dtypes
    let x = Tensor::ones([1, 1, 3, 3], (device, DType::I64)).unwrap();
    let w = Tensor::ones([1, 1, 1, 1], (device, DType::I64)).unwrap();
    assert!(x.conv2d(&w, None, &d()).is_err());
    let x = Tensor::ones([1, 1, 3, 3], device).unwrap();
    let w = Tensor::ones([1, 1, 1, 1], (device, DType::F64)).unwrap();
    let e = x.conv2d(&w, None, &d()).unwrap_err().to_string();
    assert!(
        e.contains("torch.float32") && e.contains("torch.float64"),
        "{e}"
    );
}
test_device!(
    conv2d_errors_name_op_and_shapes,
    conv2d_errors_name_op_and_shapes
);

// --- pooling -----------------------------------------------------------------------------

fn pools_match_direct_loops(device: &Device) {
    proptest!(ProptestConfig::with_cases(200), |(
        (n, c, h, w) in (1usize..=3, 1usize..=6, 1usize..=9, 1usize..=9),
        (kh, kw, sh, sw) in (1usize..=4, 1usize..=4, 1usize..=3, 1usize..=3),
        (ph, pw, dh, dw) in (0usize..=2, 0usize..=2, 1usize..=2, 1usize..=2),
        (ceil, include_pad, div, di, layout, batched, seed)
            in (any::<bool>(), any::<bool>(), prop::option::of(1i64..=5), 0usize..4, 0u8..3, any::<bool>(), any::<u64>()),
    )| {
        let dtype = FLOAT_DTYPES[di];
        let shape: Vec<usize> = if batched { vec![n, c, h, w] } else { vec![c, h, w] };
        let n = if batched { n } else { 1 };
        let case = Pool2d { nchw: (n, c, h, w), kernel: (kh, kw), stride: (sh, sw), pad: (ph, pw), dil: (dh, dw), ceil };
        let x = make(&rand_vec(n * c * h * w, seed), &shape, dtype, layout, device);
        let xv = values(&x);
        let mo = MaxPool2dOptions::new((kh, kw)).stride((sh, sw)).padding((ph, pw)).dilation((dh, dw)).ceil_mode(ceil);
        let r = x.max_pool2d_with_indices(&mo);
        let bad_pad = ph > kh / 2 || pw > kw / 2;
        match case.out() {
            Some((oh, ow)) if !bad_pad => {
                let (v, i) = r.unwrap();
                let mut want_shape = shape.clone();
                let r = want_shape.len();
                want_shape[r - 2] = oh;
                want_shape[r - 1] = ow;
                prop_assert_eq!(v.dims(), want_shape.as_slice());
                prop_assert_eq!(v.device(), *device);
                prop_assert_eq!(i.dtype(), DType::I64);
                let got_i = i.to_vec::<i64>().unwrap();
                for ((gv, gi), (wv, wi)) in values(&v).iter().zip(&got_i).zip(reference::max_pool2d(&xv, &case)) {
                    prop_assert_eq!(*gv, wv);
                    prop_assert_eq!(*gi, wi);
                }
                prop_assert_eq!(values(&v), values(&x.contiguous().unwrap().max_pool2d(&mo).unwrap()));
            }
            _ => prop_assert!(r.is_err()),
        }
        // Average pooling has no dilation.
        let case = Pool2d { dil: (1, 1), ..case };
        let mut ao = AvgPool2dOptions::new((kh, kw)).stride((sh, sw)).padding((ph, pw))
            .ceil_mode(ceil).count_include_pad(include_pad);
        if let Some(d) = div {
            ao = ao.divisor_override(d);
        }
        let r = x.avg_pool2d(&ao);
        match case.out() {
            Some(_) if !bad_pad => {
                let y = r.unwrap();
                within(tol(dtype), 1.0, "avg_pool2d").assert(&y, &reference::avg_pool2d(&xv, &case, include_pad, div));
                prop_assert_eq!(values(&y), values(&x.contiguous().unwrap().avg_pool2d(&ao).unwrap()));
            }
            _ => prop_assert!(r.is_err()),
        }
    });
}
test_device!(pools_match_direct_loops, pools_match_direct_loops);

/// Inputs big enough for the CPU kernels' parallel path (planes split across threads),
/// in every layout, against the same direct loops.
fn pools_match_direct_loops_in_parallel(device: &Device) {
    let (n, c, h, w) = (2, 8, 41, 40);
    let case = Pool2d {
        nchw: (n, c, h, w),
        kernel: (3, 3),
        stride: (2, 2),
        pad: (1, 1),
        dil: (1, 1),
        ceil: false,
    };
    let (oh, ow) = case.out().unwrap();
    assert!(n * c * oh * ow * 9 > 32 * 1024, "not above the threshold");
    for (di, layout) in [(0, 0), (1, 1), (2, 2), (3, 0)] {
        let dtype = FLOAT_DTYPES[di];
        let mut xs = rand_vec(n * c * h * w, 7 + di as u64);
        xs[5] = f64::NAN;
        let x = make(&xs, &[n, c, h, w], dtype, layout, device);
        let xv = values(&x);
        let mo = MaxPool2dOptions::new(3).stride(2).padding(1);
        let (v, i) = x.max_pool2d_with_indices(&mo).unwrap();
        let got_i = i.to_vec::<i64>().unwrap();
        for ((gv, gi), (wv, wi)) in values(&v)
            .iter()
            .zip(&got_i)
            .zip(reference::max_pool2d(&xv, &case))
        {
            assert!(
                gv == &wv || (gv.is_nan() && wv.is_nan()),
                "{dtype:?}: {gv} vs {wv}"
            );
            assert_eq!(*gi, wi, "{dtype:?}");
        }
        let ao = AvgPool2dOptions::new(3).stride(2).padding(1);
        within(tol(dtype), 1.0, "avg_pool2d").assert(
            &x.avg_pool2d(&ao).unwrap(),
            &reference::avg_pool2d(&xv, &case, true, None),
        );
    }
}
test_device!(
    pools_match_direct_loops_in_parallel,
    pools_match_direct_loops_in_parallel
);

fn pools_random_arguments_never_panic(device: &Device) {
    proptest!(ProptestConfig::with_cases(200), |(
        xs in prop::collection::vec(0usize..=5, 0..=5),
        (k, s, p, d) in (0usize..=4, 0usize..=3, 0usize..=3, 0usize..=2),
        (ceil, div) in (any::<bool>(), prop::option::of(-2i64..=2)),
    )| {
        let x = Tensor::ones(xs, device).unwrap();
        let _ = x.max_pool2d_with_indices(&MaxPool2dOptions::new(k).stride(s).padding(p).dilation(d).ceil_mode(ceil));
        let mut o = AvgPool2dOptions::new((k, 2)).stride(s).padding(p).ceil_mode(ceil);
        o.divisor_override = div;
        let _ = x.avg_pool2d(&o);
    });
}
test_device!(
    pools_random_arguments_never_panic,
    pools_random_arguments_never_panic
);

fn pools_known_values(device: &Device) {
    // 4×4 of 0..16; 2×2 windows, stride 2: maxima 5, 7, 13, 15 at flat indices 5, 7, 13, 15.
    let x = Tensor::arange(0f32, 16., device)
        .unwrap()
        .reshape([1, 1, 4, 4])
        .unwrap();
    let (v, i) = x
        .max_pool2d_with_indices(&MaxPool2dOptions::new(2))
        .unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![5., 7., 13., 15.]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![5, 7, 13, 15]);
    // Averages of those windows: (0+1+4+5)/4 = 2.5, 4.5, 10.5, 12.5.
    let a = x.avg_pool2d(&AvgPool2dOptions::new(2)).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.5, 4.5, 10.5, 12.5]);
    // ceil_mode on a 5-wide row, k = 2, s = 2: windows [0,1], [2,3], [4] -> 3 outputs.
    let x = Tensor::arange(0f32, 5., device)
        .unwrap()
        .reshape([1, 1, 5])
        .unwrap();
    let m = x
        .max_pool2d(&MaxPool2dOptions::new((1, 2)).ceil_mode(true))
        .unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), vec![1., 3., 4.]);
    // Average of the partial last window divides by 1 (it is clipped at W + pad = 5).
    let a = x
        .avg_pool2d(&AvgPool2dOptions::new((1, 2)).ceil_mode(true))
        .unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![0.5, 2.5, 4.]);
    // count_include_pad = false and divisor_override.
    let x = Tensor::ones([1, 1, 2, 2], device).unwrap();
    let o = AvgPool2dOptions::new(2).stride(1).padding(1);
    let a = x.avg_pool2d(&o.count_include_pad(false)).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0; 9]);
    let a = x.avg_pool2d(&o.divisor_override(2)).unwrap();
    assert_eq!(
        a.to_vec::<f32>().unwrap(),
        vec![0.5, 1., 0.5, 1., 2., 1., 0.5, 1., 0.5]
    );
    // NaN wins a max-pool window, as in PyTorch.
    let x = Tensor::from_vec(vec![1f32, f32::NAN, 3., 2.], [1, 1, 4], device).unwrap();
    let (v, i) = x
        .max_pool2d_with_indices(&MaxPool2dOptions::new((1, 4)))
        .unwrap();
    assert!(v.to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1]);
}
test_device!(pools_known_values, pools_known_values);

fn pool_errors(device: &Device) {
    let x = Tensor::ones([1, 1, 4, 4], device).unwrap();
    let e = x
        .max_pool2d(&MaxPool2dOptions::new(2).padding(2))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("max_pool2d: pad should be smaller than or equal to half of kernel size"),
        "{e}"
    );
    assert!(x.max_pool2d(&MaxPool2dOptions::new(0)).is_err());
    assert!(x.max_pool2d(&MaxPool2dOptions::new(2).stride(0)).is_err());
    assert!(x.max_pool2d(&MaxPool2dOptions::new(2).dilation(0)).is_err());
    let e = x
        .max_pool2d(&MaxPool2dOptions::new(5))
        .unwrap_err()
        .to_string();
    assert!(e.contains("too small") && e.contains("[1, 1, 4, 4]"), "{e}");
    let e = Tensor::ones([4, 4], device)
        .unwrap()
        .avg_pool2d(&AvgPool2dOptions::new(2))
        .unwrap_err();
    assert!(e.to_string().contains("[4, 4]"), "{e}");
    let e = x
        .avg_pool2d(&AvgPool2dOptions::new(2).divisor_override(0))
        .unwrap_err();
    assert!(e.to_string().contains("divisor"), "{e}");
    let xi = Tensor::ones([1, 1, 4, 4], (device, DType::I64)).unwrap();
    assert!(xi.max_pool2d(&MaxPool2dOptions::new(2)).is_err());
    assert!(
        Tensor::ones([1, 0, 4, 4], device)
            .unwrap()
            .max_pool2d(&MaxPool2dOptions::new(2))
            .is_err()
    );
    // An empty batch is fine.
    let y = Tensor::ones([0, 2, 4, 4], device)
        .unwrap()
        .max_pool2d(&MaxPool2dOptions::new(2))
        .unwrap();
    assert_eq!(y.dims(), &[0, 2, 2, 2]);
}
test_device!(pool_errors, pool_errors);
