#![allow(clippy::unwrap_used)]
//! conv2d, max_pool2d and avg_pool2d against direct f64 loops (proptest over shapes,
//! options, dtypes and layouts), hand-computed values, and error cases that must be error
//! values, never panics.

mod common_nn;

use common_nn::*;
use ember_tensor::{
    AvgPool2dOptions, Conv2dOptions, DType, MaxPool2dOptions, Padding, Size2, Tensor,
};
use proptest::prelude::*;

// --- references ------------------------------------------------------------------------

struct ConvCase {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    k: (usize, usize),
    stride: (usize, usize),
    /// Padding before (top, left) and in total (h, w).
    pad: (usize, usize),
    pad_total: (usize, usize),
    dil: (usize, usize),
    groups: usize,
}

impl ConvCase {
    fn out(&self) -> Option<(usize, usize)> {
        let eh = self.dil.0 * (self.k.0 - 1) + 1;
        let ew = self.dil.1 * (self.k.1 - 1) + 1;
        let (hp, wp) = (self.h + self.pad_total.0, self.w + self.pad_total.1);
        if hp < eh || wp < ew {
            return None;
        }
        Some(((hp - eh) / self.stride.0 + 1, (wp - ew) / self.stride.1 + 1))
    }

    /// The direct 7-loop convolution.
    fn reference(&self, x: &[f64], wt: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
        let (oh, ow) = self.out().unwrap();
        let (cg, og) = (self.c / self.groups, self.o / self.groups);
        let (kh, kw) = self.k;
        let mut out = vec![0.0; self.n * self.o * oh * ow];
        for n in 0..self.n {
            for o in 0..self.o {
                let g = o / og;
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut acc = bias.map_or(0.0, |b| b[o]);
                        for ci in 0..cg {
                            let c = g * cg + ci;
                            for i in 0..kh {
                                for j in 0..kw {
                                    let iy = (y * self.stride.0 + i * self.dil.0) as isize
                                        - self.pad.0 as isize;
                                    let ix = (xo * self.stride.1 + j * self.dil.1) as isize
                                        - self.pad.1 as isize;
                                    if iy < 0
                                        || ix < 0
                                        || iy >= self.h as isize
                                        || ix >= self.w as isize
                                    {
                                        continue;
                                    }
                                    let xv = x[((n * self.c + c) * self.h + iy as usize) * self.w
                                        + ix as usize];
                                    let wv = wt[((o * cg + ci) * kh + i) * kw + j];
                                    acc += xv * wv;
                                }
                            }
                        }
                        out[((n * self.o + o) * oh + y) * ow + xo] = acc;
                    }
                }
            }
        }
        out
    }
}

/// PyTorch's pooling output size (None if below 1).
fn pool_out(size: usize, k: usize, p: usize, s: usize, d: usize, ceil: bool) -> Option<usize> {
    let (size, k, p, s, d) = (size as i64, k as i64, p as i64, s as i64, d as i64);
    let num = size + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    let mut o = num.div_euclid(s) + 1;
    if ceil && (o - 1) * s >= size + p {
        o -= 1;
    }
    (o >= 1).then_some(o as usize)
}

struct PoolCase {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: (usize, usize),
    s: (usize, usize),
    p: (usize, usize),
    d: (usize, usize),
    ceil: bool,
}

impl PoolCase {
    fn out(&self) -> Option<(usize, usize)> {
        Some((
            pool_out(self.h, self.k.0, self.p.0, self.s.0, self.d.0, self.ceil)?,
            pool_out(self.w, self.k.1, self.p.1, self.s.1, self.d.1, self.ceil)?,
        ))
    }

    /// Direct max pooling: (value, index); an all-padding window gives -inf and no index.
    fn max_ref(&self, x: &[f64]) -> Vec<(f64, Option<i64>)> {
        let (oh, ow) = self.out().unwrap();
        let mut out = Vec::new();
        for plane in 0..self.n * self.c {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut best = (f64::NEG_INFINITY, None);
                    for i in 0..self.k.0 {
                        for j in 0..self.k.1 {
                            let iy = (y * self.s.0 + i * self.d.0) as isize - self.p.0 as isize;
                            let ix = (xo * self.s.1 + j * self.d.1) as isize - self.p.1 as isize;
                            if iy < 0 || ix < 0 || iy >= self.h as isize || ix >= self.w as isize {
                                continue;
                            }
                            let idx = iy as usize * self.w + ix as usize;
                            let v = x[plane * self.h * self.w + idx];
                            if best.1.is_none() || v > best.0 {
                                best = (v, Some(idx as i64));
                            }
                        }
                    }
                    out.push(best);
                }
            }
        }
        out
    }

    /// Direct average pooling with PyTorch's divisor rules.
    fn avg_ref(&self, x: &[f64], include_pad: bool, div: Option<i64>) -> Vec<f64> {
        let (oh, ow) = self.out().unwrap();
        let (h, w) = (self.h as isize, self.w as isize);
        let (ph, pw) = (self.p.0 as isize, self.p.1 as isize);
        let mut out = Vec::new();
        for plane in 0..self.n * self.c {
            for y in 0..oh {
                for xo in 0..ow {
                    let y0 = (y * self.s.0) as isize - ph;
                    let x0 = (xo * self.s.1) as isize - pw;
                    let y1 = (y0 + self.k.0 as isize).min(h + ph);
                    let x1 = (x0 + self.k.1 as isize).min(w + pw);
                    let padded = (y1 - y0) * (x1 - x0);
                    let (mut sum, mut cnt) = (0.0, 0);
                    for iy in y0.max(0)..y1.min(h) {
                        for ix in x0.max(0)..x1.min(w) {
                            sum += x[plane * self.h * self.w + (iy * w + ix) as usize];
                            cnt += 1;
                        }
                    }
                    out.push(if cnt == 0 {
                        0.0
                    } else if let Some(d) = div {
                        sum / d as f64
                    } else if include_pad {
                        sum / padded as f64
                    } else {
                        sum / cnt as f64
                    });
                }
            }
        }
        out
    }
}

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn conv2d_matches_direct_loops(
        ((n, g, cg, og, h, w), (kh, kw, sh, sw, ph, pw), (dh, dw, _, _), (has_bias, di, layout, seed))
            in conv_strategy()
    ) {
        let dtype = FLOAT_DTYPES[di];
        let case = ConvCase {
            n, c: g * cg, h, w, o: g * og, k: (kh, kw), stride: (sh, sw),
            pad: (ph, pw), pad_total: (2 * ph, 2 * pw), dil: (dh, dw), groups: g,
        };
        let x = make(&rand_vec(n * case.c * h * w, seed), &[n, case.c, h, w], dtype, layout);
        let wt = make(&rand_vec(case.o * cg * kh * kw, seed ^ 1), &[case.o, cg, kh, kw], dtype, layout);
        let b = make(&rand_vec(case.o, seed ^ 2), &[case.o], dtype, 0);
        let opts = Conv2dOptions::new().stride((sh, sw)).padding((ph, pw)).dilation((dh, dw)).groups(g);
        let r = x.conv2d(&wt, has_bias.then_some(&b), &opts);
        match case.out() {
            None => prop_assert!(r.is_err()),
            Some((oh, ow)) => {
                let y = r.unwrap();
                prop_assert_eq!(y.dims(), &[n, case.o, oh, ow]);
                prop_assert_eq!(y.dtype(), dtype);
                let bv = values(&b);
                let want = case.reference(&values(&x), &values(&wt), has_bias.then_some(bv.as_slice()));
                assert_close(&values(&y), &want, tol(dtype), 1.0, "conv2d");
                // Non-contiguous inputs equal contiguous copies exactly.
                let yc = x.contiguous().unwrap()
                    .conv2d(&wt.contiguous().unwrap(), has_bias.then_some(&b), &opts).unwrap();
                prop_assert_eq!(values(&y), values(&yc));
            }
        }
    }

    #[test]
    fn conv2d_same_and_valid_padding(
        ((n, g, cg, og, h, w), (kh, kw, _, _, _, _), (dh, dw, _, _), (_, di, layout, seed))
            in conv_strategy()
    ) {
        let dtype = FLOAT_DTYPES[di % 2];
        let (c, o) = (g * cg, g * og);
        let x = make(&rand_vec(n * c * h * w, seed), &[n, c, h, w], dtype, layout);
        let wt = make(&rand_vec(o * cg * kh * kw, seed ^ 1), &[o, cg, kh, kw], dtype, 0);
        let (th, tw) = (dh * (kh - 1), dw * (kw - 1));
        let same = ConvCase {
            n, c, h, w, o, k: (kh, kw), stride: (1, 1), pad: (th / 2, tw / 2),
            pad_total: (th, tw), dil: (dh, dw), groups: g,
        };
        let y = x.conv2d(&wt, None, &Conv2dOptions::new().padding(Padding::Same).dilation((dh, dw)).groups(g)).unwrap();
        prop_assert_eq!(y.dims(), &[n, o, h, w]);
        assert_close(&values(&y), &same.reference(&values(&x), &values(&wt), None), tol(dtype), 1.0, "same");
        let valid = ConvCase { pad: (0, 0), pad_total: (0, 0), ..same };
        let r = x.conv2d(&wt, None, &Conv2dOptions::new().padding(Padding::Valid).dilation((dh, dw)).groups(g));
        match valid.out() {
            None => prop_assert!(r.is_err()),
            Some(_) => assert_close(&values(&r.unwrap()), &valid.reference(&values(&x), &values(&wt), None), tol(dtype), 1.0, "valid"),
        }
    }

    /// Random (often inconsistent) shapes and options: an error or a result, never a panic.
    #[test]
    fn conv2d_random_arguments_never_panic(
        xs in prop::collection::vec(0usize..=5, 0..=5),
        ws in prop::collection::vec(0usize..=5, 0..=5),
        bs in prop::collection::vec(0usize..=5, 0..=2),
        (s, p, d, g) in (0usize..=3, 0usize..=3, 0usize..=2, 0usize..=3),
        mode in 0u8..3,
    ) {
        let x = Tensor::ones(xs, ()).unwrap();
        let wt = Tensor::ones(ws, ()).unwrap();
        let b = Tensor::ones(bs, ()).unwrap();
        let padding = match mode { 0 => Padding::from(p), 1 => Padding::Same, _ => Padding::Valid };
        let opts = Conv2dOptions { stride: Size2(s, s.max(1)), padding, dilation: Size2(d, 1), groups: g };
        let _ = x.conv2d(&wt, None, &opts);
        let _ = x.conv2d(&wt, Some(&b), &opts);
    }
}

#[test]
fn conv2d_unbatched_and_known_values() {
    // x = 0..16 as 4×4, w = [[1, 0], [0, -1]], stride 1, padding 0:
    // y[i, j] = x[i, j] - x[i+1, j+1] = -5 everywhere; plus bias 2 -> -3.
    let x = Tensor::arange(0f32, 16., ())
        .unwrap()
        .reshape([1, 4, 4])
        .unwrap();
    let w = Tensor::from_vec(vec![1f32, 0., 0., -1.], [1, 1, 2, 2], CPU).unwrap();
    let b = Tensor::new(&[2f32], CPU).unwrap();
    let y = x.conv2d(&w, Some(&b), &Conv2dOptions::new()).unwrap();
    assert_eq!(y.dims(), &[1, 3, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![-3.0; 9]);
    // Padding 1, stride 2, a 3×3 box filter of ones on a 3×3 input of ones: corners see 4.
    let x = Tensor::ones([1, 1, 3, 3], ()).unwrap();
    let w = Tensor::ones([1, 1, 3, 3], ()).unwrap();
    let y = x
        .conv2d(&w, None, &Conv2dOptions::new().stride(2).padding(1))
        .unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![4., 4., 4., 4.]);
    // Depthwise (groups = C): each channel scaled by its own weight.
    let x = Tensor::from_vec(vec![1f64, 2., 3., 4.], [1, 2, 1, 2], CPU).unwrap();
    let w = Tensor::from_vec(vec![10f64, 100.], [2, 1, 1, 1], CPU).unwrap();
    let y = x.conv2d(&w, None, &Conv2dOptions::new().groups(2)).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![10., 20., 300., 400.]);
    // Empty batch.
    let x = Tensor::zeros([0, 2, 5, 5], ()).unwrap();
    let y = x
        .conv2d(
            &Tensor::ones([3, 2, 3, 3], ()).unwrap(),
            None,
            &Conv2dOptions::new(),
        )
        .unwrap();
    assert_eq!(y.dims(), &[0, 3, 3, 3]);
}

#[test]
fn conv2d_errors_name_op_and_shapes() {
    let err = |x: &[usize], w: &[usize], b: Option<&[usize]>, o: Conv2dOptions| {
        let x = Tensor::ones(x.to_vec(), ()).unwrap();
        let w = Tensor::ones(w.to_vec(), ()).unwrap();
        let b = b.map(|b| Tensor::ones(b.to_vec(), ()).unwrap());
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
    let x = Tensor::ones([1, 1, 3, 3], DType::I64).unwrap();
    let w = Tensor::ones([1, 1, 1, 1], DType::I64).unwrap();
    assert!(x.conv2d(&w, None, &d()).is_err());
    let x = Tensor::ones([1, 1, 3, 3], ()).unwrap();
    let w = Tensor::ones([1, 1, 1, 1], DType::F64).unwrap();
    let e = x.conv2d(&w, None, &d()).unwrap_err().to_string();
    assert!(
        e.contains("torch.float32") && e.contains("torch.float64"),
        "{e}"
    );
}

// --- pooling -----------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn pools_match_direct_loops(
        (n, c, h, w) in (1usize..=3, 1usize..=6, 1usize..=9, 1usize..=9),
        (kh, kw, sh, sw) in (1usize..=4, 1usize..=4, 1usize..=3, 1usize..=3),
        (ph, pw, dh, dw) in (0usize..=2, 0usize..=2, 1usize..=2, 1usize..=2),
        (ceil, include_pad, div, di, layout, batched, seed)
            in (any::<bool>(), any::<bool>(), prop::option::of(1i64..=5), 0usize..4, 0u8..3, any::<bool>(), any::<u64>()),
    ) {
        let dtype = FLOAT_DTYPES[di];
        let case = PoolCase { n, c, h, w, k: (kh, kw), s: (sh, sw), p: (ph, pw), d: (dh, dw), ceil };
        let shape: Vec<usize> = if batched { vec![n, c, h, w] } else { vec![c, h, w] };
        let case = PoolCase { n: if batched { n } else { 1 }, ..case };
        let x = make(&rand_vec(case.n * c * h * w, seed), &shape, dtype, layout);
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
                prop_assert_eq!(i.dtype(), DType::I64);
                let got_i = i.to_vec::<i64>().unwrap();
                for ((gv, gi), (wv, wi)) in values(&v).iter().zip(&got_i).zip(case.max_ref(&xv)) {
                    prop_assert_eq!(*gv, wv);
                    if let Some(wi) = wi {
                        prop_assert_eq!(*gi, wi);
                    }
                }
                prop_assert_eq!(values(&v), values(&x.contiguous().unwrap().max_pool2d(&mo).unwrap()));
            }
            _ => prop_assert!(r.is_err()),
        }
        // Average pooling has no dilation.
        let case = PoolCase { d: (1, 1), ..case };
        let mut ao = AvgPool2dOptions::new((kh, kw)).stride((sh, sw)).padding((ph, pw))
            .ceil_mode(ceil).count_include_pad(include_pad);
        if let Some(d) = div {
            ao = ao.divisor_override(d);
        }
        let r = x.avg_pool2d(&ao);
        match case.out() {
            Some(_) if !bad_pad => {
                let y = r.unwrap();
                assert_close(&values(&y), &case.avg_ref(&xv, include_pad, div), tol(dtype), 1.0, "avg_pool2d");
                prop_assert_eq!(values(&y), values(&x.contiguous().unwrap().avg_pool2d(&ao).unwrap()));
            }
            _ => prop_assert!(r.is_err()),
        }
    }

    #[test]
    fn pools_random_arguments_never_panic(
        xs in prop::collection::vec(0usize..=5, 0..=5),
        (k, s, p, d) in (0usize..=4, 0usize..=3, 0usize..=3, 0usize..=2),
        (ceil, div) in (any::<bool>(), prop::option::of(-2i64..=2)),
    ) {
        let x = Tensor::ones(xs, ()).unwrap();
        let _ = x.max_pool2d_with_indices(&MaxPool2dOptions::new(k).stride(s).padding(p).dilation(d).ceil_mode(ceil));
        let mut o = AvgPool2dOptions::new((k, 2)).stride(s).padding(p).ceil_mode(ceil);
        o.divisor_override = div;
        let _ = x.avg_pool2d(&o);
    }
}

#[test]
fn pools_known_values() {
    // 4×4 of 0..16; 2×2 windows, stride 2: maxima 5, 7, 13, 15 at flat indices 5, 7, 13, 15.
    let x = Tensor::arange(0f32, 16., ())
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
    let x = Tensor::arange(0f32, 5., ())
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
    let x = Tensor::ones([1, 1, 2, 2], ()).unwrap();
    let o = AvgPool2dOptions::new(2).stride(1).padding(1);
    let a = x.avg_pool2d(&o.count_include_pad(false)).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0; 9]);
    let a = x.avg_pool2d(&o.divisor_override(2)).unwrap();
    assert_eq!(
        a.to_vec::<f32>().unwrap(),
        vec![0.5, 1., 0.5, 1., 2., 1., 0.5, 1., 0.5]
    );
    // NaN wins a max-pool window, as in PyTorch.
    let x = Tensor::from_vec(vec![1f32, f32::NAN, 3., 2.], [1, 1, 4], CPU).unwrap();
    let (v, i) = x
        .max_pool2d_with_indices(&MaxPool2dOptions::new((1, 4)))
        .unwrap();
    assert!(v.to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1]);
}

#[test]
fn pool_errors() {
    let x = Tensor::ones([1, 1, 4, 4], ()).unwrap();
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
    let e = Tensor::ones([4, 4], ())
        .unwrap()
        .avg_pool2d(&AvgPool2dOptions::new(2))
        .unwrap_err();
    assert!(e.to_string().contains("[4, 4]"), "{e}");
    let e = x
        .avg_pool2d(&AvgPool2dOptions::new(2).divisor_override(0))
        .unwrap_err();
    assert!(e.to_string().contains("divisor"), "{e}");
    let xi = Tensor::ones([1, 1, 4, 4], DType::I64).unwrap();
    assert!(xi.max_pool2d(&MaxPool2dOptions::new(2)).is_err());
    assert!(
        Tensor::ones([1, 0, 4, 4], ())
            .unwrap()
            .max_pool2d(&MaxPool2dOptions::new(2))
            .is_err()
    );
    // An empty batch is fine.
    let y = Tensor::ones([0, 2, 4, 4], ())
        .unwrap()
        .max_pool2d(&MaxPool2dOptions::new(2))
        .unwrap();
    assert_eq!(y.dims(), &[0, 2, 2, 2]);
}
