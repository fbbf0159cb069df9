//! conv2d on the device as the host will run it (`kernels/conv.cu`'s header): the bias
//! broadcast with `cast_{T}_{T}`, `im2col_{T}` per chunk of samples, one `Driver::gemm` per
//! group, against a naive f64 convolution (`reference::conv2d`); and im2col's columns
//! exactly. Strided input with an offset, groups > 1 (depthwise too), stride, padding,
//! dilation, non-square geometry, chunks of samples, with and without bias; f32 f64 f16 bf16.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Buf, Dt, setup};
use ember_device::driver::{GemmDesc, GemmType};
use ember_kernels::{KernelArgs, StridedLayout};
use ember_testing::reference::{self, contiguous_strides, offset_of};
use ember_testing::{Lcg, is_close};
use half::{bf16, f16};

#[derive(Clone, Copy, Debug)]
struct Conv {
    nchw: (usize, usize, usize, usize),
    out_ch: usize,
    kernel: (usize, usize),
    stride: (usize, usize),
    pad: (usize, usize),
    dil: (usize, usize),
    groups: usize,
    bias: bool,
    /// Samples per im2col chunk.
    chunk: usize,
}

impl Conv {
    /// The geometry of `reference::conv2d`.
    fn geometry(&self) -> reference::Conv2d {
        reference::Conv2d::symmetric(
            self.nchw,
            self.out_ch,
            self.kernel,
            self.stride,
            self.pad,
            self.dil,
            self.groups,
        )
    }

    fn out(&self) -> (usize, usize) {
        self.geometry().out().unwrap()
    }
}

/// x[s, c, h, w] with zero padding outside (im2col's expected columns).
fn at(
    x: &[f64],
    (_, c, h, w): (usize, usize, usize, usize),
    s: usize,
    ci: usize,
    iy: isize,
    ix: isize,
) -> f64 {
    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
        return 0.0;
    }
    x[((s * c + ci) * h + iy as usize) * w + ix as usize]
}

fn gemm_type<T: Dt>() -> GemmType {
    match T::SUFFIX {
        "f32" => GemmType::F32,
        "f64" => GemmType::F64,
        "f16" => GemmType::F16,
        _ => GemmType::Bf16,
    }
}

fn run<T: Dt>(p: &Conv, rng: &mut Lcg) {
    let (d, m) = setup(0);
    let sfx = T::SUFFIX;
    let (n, c, h, w) = p.nchw;
    let (oh, ow) = p.out();
    let (kh, kw) = p.kernel;
    let o_ch = p.out_ch;
    let (og, k) = (o_ch / p.groups, c / p.groups * kh * kw);
    let l = oh * ow;
    let rows = c * kh * kw;
    let what = format!("conv2d_{sfx} {p:?}");

    let xv: Vec<T> = (0..n * c * h * w)
        .map(|_| T::from_f64(rng.f32(2.0) as f64))
        .collect();
    let wv: Vec<T> = (0..o_ch * k)
        .map(|_| T::from_f64(rng.f32(1.0) as f64))
        .collect();
    let bv: Vec<T> = (0..o_ch)
        .map(|_| T::from_f64(rng.f32(1.0) as f64))
        .collect();
    // x stored with its dims in the physical order (C, N, H, W) after 7 filler elements.
    let phys = contiguous_strides(&[c, n, h, w]);
    let xs = [phys[1], phys[0], phys[2], phys[3]];
    let mut xb = vec![T::from_f64(f64::NAN); 7 + xv.len()];
    for (i, &v) in xv.iter().enumerate() {
        xb[7 + offset_of(i, &[n, c, h, w], &xs)] = v;
    }
    // Bias with stride 3 after one filler element.
    let mut bb = vec![T::from_f64(f64::NAN); 1 + 3 * o_ch];
    for (i, &v) in bv.iter().enumerate() {
        bb[1 + 3 * i] = v;
    }
    let dx = Buf::from_slice(&d, 0, &xb);
    let dw = Buf::from_slice(&d, 0, &wv);
    let db = Buf::from_slice(&d, 0, &bb);
    let out = Buf::<T>::zeros(&d, 0, n * o_ch * l);

    // 1. The bias, broadcast by the strided copy.
    if p.bias {
        let mut args = KernelArgs::new();
        args.push((n * o_ch * l) as i64)
            .push(StridedLayout::new(&[n, o_ch, l], &[0, 3, 0]).unwrap())
            .ptr(db.at(1))
            .ptr(out.ptr);
        common::launch(&d, m, &format!("cast_{sfx}_{sfx}"), 3, 64, 0, &mut args).unwrap();
    }
    // 2. Per chunk: im2col, then a GEMM per group.
    let col = Buf::<T>::zeros(&d, 0, p.chunk * rows * l);
    let mut n0 = 0;
    while n0 < n {
        let nc = p.chunk.min(n - n0);
        let total = nc * rows * l;
        let mut args = KernelArgs::new();
        args.push(total as i64)
            .push(c as i64)
            .push(h as i64)
            .push(w as i64)
            .ptr(dx.at(7 + n0 * xs[0] as usize));
        for s in xs {
            args.push(s as i64);
        }
        for v in [
            kh, kw, p.stride.0, p.stride.1, p.pad.0, p.pad.1, p.dil.0, p.dil.1, oh, ow,
        ] {
            args.push(v as i64);
        }
        args.ptr(col.ptr);
        common::launch(&d, m, &format!("im2col_{sfx}"), 3, 64, 0, &mut args).unwrap();
        // im2col exactly, for the first chunk.
        if n0 == 0 {
            let got = col.to_vec();
            let xf: Vec<f64> = xv.iter().map(|v| v.to_f64()).collect();
            for (e, g) in got.iter().take(total).enumerate() {
                let (s, r, q) = (e / (rows * l), e / l % rows, e % l);
                let (ci, i, j) = (r / (kh * kw), r / kw % kh, r % kw);
                let (y, xo) = (q / ow, q % ow);
                let iy = (y * p.stride.0 + i * p.dil.0) as isize - p.pad.0 as isize;
                let ix = (xo * p.stride.1 + j * p.dil.1) as isize - p.pad.1 as isize;
                let want = at(&xf, p.nchw, s, ci, iy, ix);
                assert_eq!(
                    g.to_f64().to_bits(),
                    want.to_bits(),
                    "{what}: im2col element {e}"
                );
            }
        }
        for g in 0..p.groups {
            let desc = GemmDesc {
                trans_a: false,
                trans_b: false,
                m: l,
                n: og,
                k,
                alpha: 1.0,
                beta: if p.bias { 1.0 } else { 0.0 },
                a: col.at(g * k * l),
                lda: l,
                stride_a: rows * l,
                b: dw.at(g * og * k),
                ldb: k,
                stride_b: 0,
                c: out.at((n0 * o_ch + g * og) * l),
                ldc: l,
                stride_c: o_ch * l,
                batch: nc,
                dtype: gemm_type::<T>(),
                allow_tf32: false,
            };
            d.gemm(0, common::S0, &desc).unwrap();
        }
        n0 += nc;
    }

    let f = |v: &[T]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let bias = p.bias.then(|| f(&bv));
    let (want, mag) = reference::conv2d(&p.geometry(), &f(&xv), &f(&wv), bias.as_deref());
    let got = out.to_vec();
    assert_eq!(got.len(), want.len());
    for (i, g) in got.iter().enumerate() {
        assert!(
            is_close(g.to_f64(), want[i], T::TOL, 1e-12 * mag[i] + 1e-7),
            "{what}: output {i}: {g:?}, want {}",
            want[i]
        );
    }
}

fn check<T: Dt>(seed: u64) {
    let mut rng = Lcg(seed);
    let c = |nchw, out_ch, kernel, stride, pad, dil, groups, bias, chunk| Conv {
        nchw,
        out_ch,
        kernel,
        stride,
        pad,
        dil,
        groups,
        bias,
        chunk,
    };
    let cases = [
        // groups 2, non-square everything, two chunks (2 + 1 samples).
        c((3, 4, 7, 6), 6, (3, 2), (2, 1), (1, 0), (1, 2), 2, true, 2),
        // plain 3x3 "same", no bias.
        c((2, 3, 5, 5), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, false, 2),
        // depthwise with dilation and stride.
        c((2, 4, 9, 8), 4, (1, 3), (1, 2), (0, 2), (2, 1), 4, true, 1),
        // 1x1 and a single output pixel.
        c((1, 5, 1, 1), 3, (1, 1), (1, 1), (0, 0), (1, 1), 1, true, 1),
        // groups 3 with 2 outputs per group, wide padding, 4x? output larger than the grid.
        c(
            (2, 6, 11, 13),
            6,
            (2, 3),
            (1, 1),
            (2, 1),
            (1, 1),
            3,
            true,
            2,
        ),
    ];
    for p in &cases {
        run::<T>(p, &mut rng);
    }
}

#[test]
fn conv2d_f32() {
    check::<f32>(31);
}
#[test]
fn conv2d_f64() {
    check::<f64>(32);
}
#[test]
fn conv2d_f16() {
    check::<f16>(33);
}
#[test]
fn conv2d_bf16() {
    check::<bf16>(34);
}
