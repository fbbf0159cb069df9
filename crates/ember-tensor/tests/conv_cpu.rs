#![allow(clippy::unwrap_used)]
//! The CPU convolutions' three directions (forward, input gradient, weight gradient) in every
//! floating dtype against direct f64 loops, on both CPU paths: Ember's own kernels (im2col /
//! col2im around `ember-gemm`, direct depthwise) and oneDNN where it loads
//! (`cargo xtask onednn`; without it those runs say `SKIPPED` and the portable path is still
//! checked). The shapes CNNs use (1×1, 3×3 stride 1 and 2, 7×7 stride 2, depthwise, batch 1
//! to 64) and proptest over the rest (padding, dilation, groups, layouts).

mod common_nn;

use std::sync::Mutex;

use common_nn::*;
use ember_tensor::backends::mkldnn;
use ember_tensor::{Conv2dOptions, DType, Tensor};
use ember_testing::{rand_vec, values};
use proptest::prelude::*;

/// The backend switch is process-wide: the tests of this binary take turns with it.
static BACKEND: Mutex<()> = Mutex::new(());

/// The paths to check: Ember's kernels always, oneDNN where it loads.
fn backends() -> Vec<bool> {
    if mkldnn::is_available() {
        vec![false, true]
    } else {
        eprintln!(
            "SKIPPED: oneDNN convolution runs (oneDNN absent: {})",
            mkldnn::conv_path(DType::F32).1
        );
        vec![false]
    }
}

#[derive(Clone, Copy, Debug)]
struct Geo {
    x: [usize; 4],
    w: [usize; 4],
    stride: (usize, usize),
    pad: (usize, usize),
    dil: (usize, usize),
    groups: usize,
}

impl Geo {
    fn out(&self) -> Option<(usize, usize)> {
        let e = |k: usize, d: usize| d * (k - 1) + 1;
        let (hp, wp) = (self.x[2] + 2 * self.pad.0, self.x[3] + 2 * self.pad.1);
        let (eh, ew) = (e(self.w[2], self.dil.0), e(self.w[3], self.dil.1));
        (hp >= eh && wp >= ew)
            .then(|| ((hp - eh) / self.stride.0 + 1, (wp - ew) / self.stride.1 + 1))
    }

    fn opts(&self) -> Conv2dOptions {
        Conv2dOptions::new()
            .stride(self.stride)
            .padding(self.pad)
            .dilation(self.dil)
            .groups(self.groups)
    }

    /// Every (output, input, weight) index triple of the convolution's sum.
    fn terms(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [n, c, h, w] = self.x;
        let [o, cg, kh, kw] = self.w;
        let (oh, ow) = self.out().unwrap();
        let og = o / self.groups;
        for s in 0..n {
            for oc in 0..o {
                let g = oc / og;
                for y in 0..oh {
                    for xo in 0..ow {
                        let yi = ((s * o + oc) * oh + y) * ow + xo;
                        for ci in 0..cg {
                            let ch = g * cg + ci;
                            for i in 0..kh {
                                for j in 0..kw {
                                    let iy = (y * self.stride.0 + i * self.dil.0) as isize
                                        - self.pad.0 as isize;
                                    let ix = (xo * self.stride.1 + j * self.dil.1) as isize
                                        - self.pad.1 as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let xi = ((s * c + ch) * h + iy as usize) * w + ix as usize;
                                    let wi = ((oc * cg + ci) * kh + i) * kw + j;
                                    f(yi, xi, wi);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Values and the magnitude of their terms (`Σ |a·b|`), for tolerances.
struct Want {
    v: Vec<f64>,
    mag: Vec<f64>,
}

impl Want {
    fn zeros(n: usize) -> Want {
        Want {
            v: vec![0.0; n],
            mag: vec![0.0; n],
        }
    }

    fn add(&mut self, i: usize, t: f64) {
        self.v[i] += t;
        self.mag[i] += t.abs();
    }
}

/// Each result element within `rtol · (1 + Σ|terms|)` of the f64 sum.
fn check(what: &str, got: &Tensor, want: &Want, rtol: f64) {
    let g = values(got);
    assert_eq!(g.len(), want.v.len(), "{what}: length");
    for (i, (&a, (&b, &m))) in g.iter().zip(want.v.iter().zip(&want.mag)).enumerate() {
        assert!(
            (a - b).abs() <= rtol * (1.0 + m),
            "{what}: element {i}: {a} against {b} (magnitude {m}, rtol {rtol})"
        );
    }
}

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

/// Forward, input gradient and weight gradient of `geo` in `dtype` against f64 loops, with
/// inputs in `layout` (see `common_nn::make`).
fn check_all(geo: &Geo, dtype: DType, layout: u8, seed: u64, what: &str) {
    let (oh, ow) = geo.out().unwrap();
    let y_dims = [geo.x[0], geo.w[0], oh, ow];
    let x = make(&rand_vec(numel(&geo.x), seed), &geo.x, dtype, layout, &CPU);
    let w = make(
        &rand_vec(numel(&geo.w), seed ^ 1),
        &geo.w,
        dtype,
        layout,
        &CPU,
    );
    let gy = make(
        &rand_vec(numel(&y_dims), seed ^ 2),
        &y_dims,
        dtype,
        layout,
        &CPU,
    );
    let (xv, wv, gv) = (values(&x), values(&w), values(&gy));
    let mut y = Want::zeros(numel(&y_dims));
    let mut gx = Want::zeros(numel(&geo.x));
    let mut gw = Want::zeros(numel(&geo.w));
    geo.terms(|yi, xi, wi| {
        y.add(yi, xv[xi] * wv[wi]);
        gx.add(xi, gv[yi] * wv[wi]);
        gw.add(wi, gv[yi] * xv[xi]);
    });
    let opts = geo.opts();
    let rtol = tol(dtype);
    let fwd = x.conv2d(&w, None, &opts).unwrap();
    assert_eq!(fwd.dims(), &y_dims, "{what}");
    assert_eq!(fwd.dtype(), dtype, "{what}");
    check(&format!("{what} forward"), &fwd, &y, rtol);
    let dx = ember_tensor::aten::conv2d_backward_input(&gy, geo.x, &w, &opts).unwrap();
    assert_eq!((dx.dims(), dx.dtype()), (geo.x.to_vec(), dtype), "{what}");
    check(&format!("{what} input gradient"), &dx, &gx, rtol);
    let dw = ember_tensor::aten::conv2d_backward_weight(&gy, &x, geo.w, &opts).unwrap();
    assert_eq!((dw.dims(), dw.dtype()), (geo.w.to_vec(), dtype), "{what}");
    check(&format!("{what} weight gradient"), &dw, &gw, rtol);
}

/// The shapes the issue names, small in space so that f64 loops stay quick.
#[test]
fn cnn_shapes_in_every_dtype_on_every_path() {
    let _turn = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    let g = |x: [usize; 4], w: [usize; 4], stride: usize, pad: usize, groups: usize| Geo {
        x,
        w,
        stride: (stride, stride),
        pad: (pad, pad),
        dil: (1, 1),
        groups,
    };
    let shapes = [
        ("1x1", g([2, 16, 7, 7], [24, 16, 1, 1], 1, 0, 1)),
        ("1x1 stride 2", g([2, 16, 8, 8], [32, 16, 1, 1], 2, 0, 1)),
        ("3x3", g([2, 16, 9, 9], [16, 16, 3, 3], 1, 1, 1)),
        ("3x3 stride 2", g([3, 8, 9, 10], [16, 8, 3, 3], 2, 1, 1)),
        ("7x7 stride 2", g([2, 3, 20, 20], [16, 3, 7, 7], 2, 3, 1)),
        ("depthwise", g([2, 16, 9, 9], [16, 1, 3, 3], 1, 1, 16)),
        (
            "depthwise stride 2",
            g([2, 8, 10, 9], [16, 1, 3, 3], 2, 1, 8),
        ),
        ("groups", g([2, 8, 6, 6], [12, 2, 3, 3], 1, 1, 4)),
        ("batch 1", g([1, 8, 6, 6], [8, 8, 3, 3], 1, 1, 1)),
        ("batch 64", g([64, 4, 5, 5], [8, 4, 3, 3], 1, 1, 1)),
    ];
    for onednn in backends() {
        mkldnn::set_enabled(onednn);
        for (name, geo) in &shapes {
            for dtype in FLOAT_DTYPES {
                let what = format!("{name} {dtype} (oneDNN {onednn})");
                check_all(geo, dtype, 0, 7, &what);
            }
        }
    }
    mkldnn::set_enabled(true);
}

#[allow(clippy::type_complexity)]
fn geo_strategy() -> impl Strategy<Value = (Geo, usize, u8, u64)> {
    (
        (1usize..=3, 1usize..=3, 1usize..=3, 1usize..=3),
        (1usize..=9, 1usize..=9, 1usize..=3, 1usize..=3),
        (1usize..=2, 1usize..=2, 0usize..=2, 0usize..=2, 1usize..=2),
        (0usize..4, 0u8..3, any::<u64>(), 1usize..=2),
    )
        .prop_map(
            |((n, g, cg, og), (h, w, kh, kw), (sh, sw, ph, pw, d), (di, layout, seed, dw))| {
                (
                    Geo {
                        x: [n, g * cg, h, w],
                        w: [g * og, cg, kh, kw],
                        stride: (sh, sw),
                        pad: (ph, pw),
                        dil: (d, dw),
                        groups: g,
                    },
                    di,
                    layout,
                    seed,
                )
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Padding, dilation, groups, odd sizes and non-contiguous layouts, every dtype, both
    /// paths.
    #[test]
    fn every_direction_matches_direct_loops((geo, di, layout, seed) in geo_strategy()) {
        prop_assume!(geo.out().is_some());
        let _turn = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
        for onednn in backends() {
            mkldnn::set_enabled(onednn);
            let dtype = FLOAT_DTYPES[di];
            check_all(&geo, dtype, layout, seed, &format!("{geo:?} {dtype} (oneDNN {onednn})"));
        }
        mkldnn::set_enabled(true);
    }
}

/// `backends::mkldnn` says which path runs and why; switched off, everything is Ember's.
#[test]
fn conv_path_follows_the_switch() {
    let _turn = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    let (path, why) = mkldnn::conv_path(DType::F32);
    if std::env::var_os("EMBER_CPU_CONV").is_some() {
        eprintln!("SKIPPED: oneDNN path check (EMBER_CPU_CONV is set: {path}, {why})");
    } else if mkldnn::is_available() {
        assert_eq!(path, "onednn", "{why}");
        assert!(why.starts_with("oneDNN 3."), "{why}");
        assert_eq!(mkldnn::conv_path(DType::F64).0, "rust");
        assert_eq!(mkldnn::conv_path(DType::F16).0, "rust");
    } else {
        eprintln!("SKIPPED: oneDNN path check (oneDNN absent: {why})");
        assert_eq!(path, "rust");
    }
    mkldnn::set_enabled(false);
    let (path, why) = mkldnn::conv_path(DType::Bf16);
    assert_eq!(path, "rust", "{why}");
    if std::env::var_os("EMBER_CPU_CONV").is_none() && mkldnn::is_available() {
        assert_eq!(why, "backends::mkldnn::set_enabled(false)");
    }
    mkldnn::set_enabled(true);
}
