//! The portable CPU convolutions: im2col and col2im around `ember-gemm`'s products. See
//! Note [Convolutions as products without a scatter].

use std::mem::MaybeUninit;

use ember_gemm::parallel::for_each_chunk_mut;

use super::geometry::{Elem, GemmOut, Geo, Prod, Strided, corrupt};
use super::scratch::Scratch;
use crate::error::Result;
use crate::storage::CpuStorage;

// Note [Convolutions as products without a scatter]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With K = C/groups·kH·kW and L = out_h·out_w, sample n's column matrix `col[n]` is
// [C·kH·kW, L]: row (c, i, j), column (oh, ow) holds x[n, c, oh·sh - ph + i·dh,
// ow·sw - pw + j·dw] (0 in the padding). Group g's rows are the K rows from g·K, and with
// the weight as [O, K]:
//   forward          y[n, g]  = W_g · col[n]_g                      (Og×K · K×L)
//   backward data    col[n]_g = W_gᵀ · dy[n, g], then col2im        (K×Og · Og×L)
//   backward weight  dW_g    += dy[n, g] · col[n]_gᵀ, over n        (Og×L · L×K)
// col2im adds each column entry into the input position it came from. It runs per
// (sample, channel) plane: one task owns a plane and walks the kH·kW rows of `col` that
// read from it, so nothing is scattered and no two threads write one element (the old
// composite backward built the whole column matrix as a tensor and scattered it back with
// `scatter_add`, which was most of `ConvolutionBackward0`'s time). A 1×1 kernel with stride
// 1 and no padding needs neither: the input is its own column matrix. Samples go in chunks
// so `col` stays under COL_BUDGET elements, taken from the caching allocator (Note
// [Convolution scratch from the caching allocator]). 16-bit inputs go into the products as
// they are (`ember-gemm`'s bf16 kernels), accumulating in f32; f64 computes in f64.

/// Most elements of a column matrix at once (16 MiB of f32).
const COL_BUDGET: usize = 4 * 1024 * 1024;

/// Rows of `col` per parallel task: about 16K elements.
fn rows_per_task(l: usize) -> usize {
    (16 * 1024 / l.max(1)).max(1)
}

/// Samples per chunk.
fn chunk(geo: &Geo) -> usize {
    (COL_BUDGET / (geo.rows() * geo.l()).max(1)).clamp(1, geo.n.max(1))
}

/// Writes `col` (`nc × rows × L`, every element) for samples `n0 .. n0 + nc` of `x`.
fn im2col<T: Elem>(
    x: &[T],
    xs: Strided,
    geo: &Geo,
    n0: usize,
    col: &mut [MaybeUninit<T>],
) -> Result<()> {
    let (l, rows, kk) = (geo.l(), geo.rows(), geo.kk());
    let (sh, sw) = geo.p.stride;
    let per = rows_per_task(l);
    let fill_row = |r: usize, row: &mut [MaybeUninit<T>]| {
        let (s, rem) = (n0 + r / rows, r % rows);
        let (ci, ij) = (rem / kk, rem % kk);
        let (i, j) = (ij / geo.kw, ij % geo.kw);
        let base = xs.off + s * xs.sn + ci * xs.sc;
        let (lo, hi) = Geo::valid(geo.ow, geo.w, sw, geo.off_w(j));
        let ix0 = (lo * sw) as isize + geo.off_w(j);
        for (y, out) in row.chunks_mut(geo.ow).enumerate() {
            let iy = (y * sh) as isize + geo.off_h(i);
            if iy < 0 || iy >= geo.h as isize || lo >= hi {
                out.fill(MaybeUninit::new(T::ZERO));
                continue;
            }
            out[..lo].fill(MaybeUninit::new(T::ZERO));
            out[hi..].fill(MaybeUninit::new(T::ZERO));
            let start = base + iy as usize * xs.sh + ix0 as usize * xs.sw;
            let mid = &mut out[lo..hi];
            if sw == 1 && xs.sw == 1 {
                match x.get(start..start + mid.len()) {
                    Some(src) => {
                        for (d, &v) in mid.iter_mut().zip(src) {
                            d.write(v);
                        }
                    }
                    None => mid.fill(MaybeUninit::new(T::ZERO)),
                }
            } else {
                let step = sw * xs.sw;
                for (q, d) in mid.iter_mut().enumerate() {
                    d.write(x.get(start + q * step).copied().unwrap_or(T::ZERO));
                }
            }
        }
    };
    let task = |t: usize, rows_of: &mut [MaybeUninit<T>]| {
        for (q, row) in rows_of.chunks_mut(l).enumerate() {
            fill_row(t * per + q, row);
        }
    };
    if col.len() >= 32 * 1024 {
        for_each_chunk_mut(col, per * l, task);
    } else {
        task(0, col);
    }
    Ok(())
}

/// Adds sample `s`'s column rows of channel `ci` (`kk` rows of `L`, from `col`) into the
/// channel's input-gradient plane (`H·W`). See Note [Convolutions as products without a
/// scatter].
fn col2im_plane<A: Copy + std::ops::AddAssign>(geo: &Geo, col: &[A], plane: &mut [A]) {
    let (sh, sw) = geo.p.stride;
    for i in 0..geo.kh {
        let (ylo, yhi) = Geo::valid(geo.oh, geo.h, sh, geo.off_h(i));
        for j in 0..geo.kw {
            let (lo, hi) = Geo::valid(geo.ow, geo.w, sw, geo.off_w(j));
            if lo >= hi {
                continue;
            }
            let row = &col[(i * geo.kw + j) * geo.l()..][..geo.l()];
            for y in ylo..yhi {
                let iy = ((y * sh) as isize + geo.off_h(i)) as usize;
                let ix0 = ((lo * sw) as isize + geo.off_w(j)) as usize;
                let src = &row[y * geo.ow + lo..y * geo.ow + hi];
                let dst = &mut plane[iy * geo.w..(iy + 1) * geo.w];
                if sw == 1 {
                    for (d, &v) in dst[ix0..ix0 + src.len()].iter_mut().zip(src) {
                        *d += v;
                    }
                } else {
                    for (q, &v) in src.iter().enumerate() {
                        dst[ix0 + q * sw] += v;
                    }
                }
            }
        }
    }
}

/// `[N, O, oh, ow]` = conv(x, w) + bias; `w` contiguous `[O, K]`, `bias` `[O]`.
pub(crate) fn forward<T: Elem>(
    x: &[T],
    xs: Strided,
    w: &[T],
    bias: Option<&[T]>,
    geo: &Geo,
) -> Result<CpuStorage> {
    let (o, l, k) = (geo.o, geo.l(), geo.k());
    let mut out = CpuStorage::zeroed(T::DTYPE, geo.n * o * l)?;
    let y = out.as_mut_slice::<T>()?;
    if let Some(b) = bias {
        for_each_chunk_mut(y, l.max(1), |pi, plane| {
            plane.fill(b.get(pi % o.max(1)).copied().unwrap_or(T::ZERO));
        });
    }
    if k == 0 || l == 0 || geo.og == 0 || geo.n == 0 {
        return Ok(out);
    }
    let accumulate = bias.is_some();
    let wg = |gi: usize| w.get(gi * geo.og * k..).ok_or_else(corrupt);
    if geo.pointwise() && xs.dense_planes(geo.w) {
        for gi in 0..geo.g {
            let b = x.get(xs.off + gi * geo.cg * xs.sc..).ok_or_else(corrupt)?;
            let c = y.get_mut(gi * geo.og * l..).ok_or_else(corrupt)?;
            let p = Prod {
                m: geo.og,
                n: l,
                k,
                batch: geo.n,
                a: (k, 1, 0),
                b: (xs.sc, 1, xs.sn),
                c_bs: o * l,
            };
            T::gemm(wg(gi)?, b, c, p, accumulate)?;
        }
        return Ok(out);
    }
    let per_sample = geo.rows() * l;
    let nb = chunk(geo);
    let mut n0 = 0;
    while n0 < geo.n {
        let nc = nb.min(geo.n - n0);
        // SAFETY: `im2col` writes every element of the slice it gets.
        let col =
            unsafe { Scratch::<T>::init_with(nc * per_sample, |c| im2col(x, xs, geo, n0, c)) }?;
        let col = col.as_slice();
        for gi in 0..geo.g {
            let b = col.get(gi * k * l..).ok_or_else(corrupt)?;
            let c = y
                .get_mut((n0 * o + gi * geo.og) * l..)
                .ok_or_else(corrupt)?;
            let p = Prod {
                m: geo.og,
                n: l,
                k,
                batch: nc,
                a: (k, 1, 0),
                b: (l, 1, per_sample),
                c_bs: o * l,
            };
            T::gemm(wg(gi)?, b, c, p, accumulate)?;
        }
        n0 += nc;
    }
    Ok(out)
}

/// The product of the transposed weight with the output gradient, for samples
/// `n0 .. n0 + nc` of group `gi`: `C[s] (K×L) = W_gᵀ · dy[n0 + s, g]`.
fn wt_dy<T: Elem, O: GemmOut<T>>(
    w: &[T],
    dy: &[T],
    c: &mut [O],
    geo: &Geo,
    (n0, nc, gi): (usize, usize, usize),
    c_bs: usize,
) -> Result<()> {
    let (k, l) = (geo.k(), geo.l());
    let a = w.get(gi * geo.og * k..).ok_or_else(corrupt)?;
    let b = dy
        .get((n0 * geo.o + gi * geo.og) * l..)
        .ok_or_else(corrupt)?;
    let p = Prod {
        m: k,
        n: l,
        k: geo.og,
        batch: nc,
        a: (1, k, 0),
        b: (l, 1, geo.o * l),
        c_bs,
    };
    O::gemm(a, b, c, p, false)
}

/// The input gradient `[N, C, H, W]` from `dy` (contiguous `[N, O, L]`) and `w`
/// (contiguous `[O, K]`).
pub(crate) fn backward_data<T: Elem>(dy: &[T], w: &[T], geo: &Geo) -> Result<CpuStorage> {
    let (c, hw, l) = (geo.c, geo.hw(), geo.l());
    let len = geo.n * c * hw;
    if geo.pointwise() {
        let mut out = CpuStorage::zeroed(T::DTYPE, len)?;
        let dx = out.as_mut_slice::<T>()?;
        if geo.k() > 0 && l > 0 && geo.og > 0 {
            for gi in 0..geo.g {
                let cg = dx.get_mut(gi * geo.cg * hw..).ok_or_else(corrupt)?;
                wt_dy(w, dy, cg, geo, (0, geo.n, gi), c * hw)?;
            }
        }
        return Ok(out);
    }
    // The gradient accumulates in `T::Acc`: in the output itself when that is its dtype.
    let same = T::DTYPE == <T::Acc as crate::dtype::WithDType>::DTYPE;
    let mut out = if same {
        Some(CpuStorage::zeroed(T::DTYPE, len)?)
    } else {
        None
    };
    let mut acc_buf = if same {
        None
    } else {
        Some(Scratch::<T::Acc>::zeroed(len)?)
    };
    let dx: &mut [T::Acc] = match (&mut out, &mut acc_buf) {
        (Some(s), _) => s.as_mut_slice::<T::Acc>()?,
        (None, Some(b)) => b.as_mut(),
        (None, None) => return Err(corrupt()),
    };
    if geo.k() > 0 && l > 0 && geo.og > 0 {
        let per_sample = geo.rows() * l;
        let nb = chunk(geo);
        let mut col = Scratch::<T::Acc>::zeroed(nb * per_sample)?;
        let mut n0 = 0;
        while n0 < geo.n {
            let nc = nb.min(geo.n - n0);
            let col = &mut col.as_mut()[..nc * per_sample];
            for gi in 0..geo.g {
                let cg = col.get_mut(gi * geo.k() * l..).ok_or_else(corrupt)?;
                wt_dy(w, dy, cg, geo, (n0, nc, gi), per_sample)?;
            }
            let col: &[T::Acc] = col;
            let planes = dx
                .get_mut(n0 * c * hw..(n0 + nc) * c * hw)
                .ok_or_else(corrupt)?;
            for_each_chunk_mut(planes, hw.max(1), |pi, plane| {
                let (s, ci) = (pi / c, pi % c);
                let rows = &col[(s * geo.rows() + ci * geo.kk()) * l..][..geo.kk() * l];
                col2im_plane(geo, rows, plane);
            });
            n0 += nc;
        }
    }
    match (out, acc_buf) {
        (Some(s), _) => Ok(s),
        (None, Some(b)) => {
            let b = b.as_slice();
            CpuStorage::from_chunks(len, |r| b[r].iter().map(|&v| T::from_acc(v)))
        }
        (None, None) => Err(corrupt()),
    }
}

/// The weight gradient `[O, C/groups, kh, kw]` from `dy` (contiguous `[N, O, L]`) and `x`.
pub(crate) fn backward_filter<T: Elem>(
    dy: &[T],
    x: &[T],
    xs: Strided,
    geo: &Geo,
) -> Result<CpuStorage> {
    let (o, k, l) = (geo.o, geo.k(), geo.l());
    let mut dw = Scratch::<T::Acc>::zeroed(o * k)?;
    let acc = dw.as_mut();
    // dW_g += dy[s, g] (Og×L) · B, B the L×K transposed column rows of sample s, group g.
    let mut step = |s: usize, gi: usize, b: &[T], b_strides: (usize, usize)| -> Result<()> {
        let a = dy.get((s * o + gi * geo.og) * l..).ok_or_else(corrupt)?;
        let c = acc.get_mut(gi * geo.og * k..).ok_or_else(corrupt)?;
        let p = Prod {
            m: geo.og,
            n: k,
            k: l,
            batch: 1,
            a: (l, 1, 0),
            b: (b_strides.0, b_strides.1, 0),
            c_bs: 0,
        };
        <T::Acc as GemmOut<T>>::gemm(a, b, c, p, true)
    };
    if k > 0 && l > 0 && geo.og > 0 {
        if geo.pointwise() && xs.dense_planes(geo.w) {
            for s in 0..geo.n {
                for gi in 0..geo.g {
                    let b = x
                        .get(xs.off + s * xs.sn + gi * geo.cg * xs.sc..)
                        .ok_or_else(corrupt)?;
                    step(s, gi, b, (1, xs.sc))?;
                }
            }
        } else {
            let per_sample = geo.rows() * l;
            let nb = chunk(geo);
            let mut n0 = 0;
            while n0 < geo.n {
                let nc = nb.min(geo.n - n0);
                // SAFETY: `im2col` writes every element of the slice it gets.
                let col = unsafe {
                    Scratch::<T>::init_with(nc * per_sample, |c| im2col(x, xs, geo, n0, c))
                }?;
                let col = col.as_slice();
                for s in 0..nc {
                    for gi in 0..geo.g {
                        let b = col.get(s * per_sample + gi * k * l..).ok_or_else(corrupt)?;
                        step(n0 + s, gi, b, (1, l))?;
                    }
                }
                n0 += nc;
            }
        }
    }
    let acc = dw.as_slice();
    CpuStorage::from_chunks(o * k, |r| acc[r].iter().map(|&v| T::from_acc(v)))
}
