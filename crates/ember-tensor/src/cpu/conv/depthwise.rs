//! Direct kernels for convolutions with one input channel per group (depthwise, groups = C,
//! with any channel multiplier), where each group's product would be `Og × kH·kW × L`:
//! far too thin for a GEMM. Each task owns one output plane (forward), one input-gradient
//! plane (backward data) or one output channel's weights (backward weight), and accumulates
//! in `T::Acc`, so nothing is scattered or shared.

use ember_gemm::parallel::{for_each_chunk_mut, map_indices};

use super::geometry::{Elem, Geo, Strided, corrupt};
use crate::error::Result;
use crate::storage::CpuStorage;

/// `acc[y·ow + xo] += wv · src(iy, ix)` over the valid positions of kernel tap (i, j), with
/// `src(iy, ix)` read from `x` at `base + iy·sh + ix·sw`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn tap<T: Elem>(
    geo: &Geo,
    (i, j): (usize, usize),
    wv: T::Acc,
    x: &[T],
    base: usize,
    (xsh, xsw): (usize, usize),
    acc: &mut [T::Acc],
) {
    let (sh, sw) = geo.p.stride;
    let (ylo, yhi) = Geo::valid(geo.oh, geo.h, sh, geo.off_h(i));
    let (lo, hi) = Geo::valid(geo.ow, geo.w, sw, geo.off_w(j));
    for y in ylo..yhi {
        let iy = ((y * sh) as isize + geo.off_h(i)) as usize;
        let row = &mut acc[y * geo.ow..(y + 1) * geo.ow];
        for (xo, a) in row.iter_mut().enumerate().take(hi).skip(lo) {
            let ix = ((xo * sw) as isize + geo.off_w(j)) as usize;
            let v = x
                .get(base + iy * xsh + ix * xsw)
                .copied()
                .unwrap_or(T::ZERO);
            *a += wv * v.acc();
        }
    }
}

/// Forward: output plane (s, oc) reads input plane (s, oc / Og).
pub(crate) fn forward<T: Elem>(
    x: &[T],
    xs: Strided,
    w: &[T],
    bias: Option<&[T]>,
    geo: &Geo,
) -> Result<CpuStorage> {
    let (o, l, kk) = (geo.o, geo.l(), geo.kk());
    let mut out = CpuStorage::zeroed(T::DTYPE, geo.n * o * l)?;
    let y = out.as_mut_slice::<T>()?;
    if w.len() < o * kk {
        return Err(corrupt());
    }
    for_each_chunk_mut(y, l.max(1), |pi, plane| {
        let (s, oc) = (pi / o, pi % o);
        let b = bias
            .and_then(|b| b.get(oc))
            .map_or(<T::Acc as crate::dtype::WithDType>::ZERO, |v| v.acc());
        let mut acc = vec![b; plane.len()];
        let base = xs.off + s * xs.sn + (oc / geo.og.max(1)) * xs.sc;
        for i in 0..geo.kh {
            for j in 0..geo.kw {
                let wv = w[oc * kk + i * geo.kw + j].acc();
                tap(geo, (i, j), wv, x, base, (xs.sh, xs.sw), &mut acc);
            }
        }
        for (d, &a) in plane.iter_mut().zip(&acc) {
            *d = T::from_acc(a);
        }
    });
    Ok(out)
}

/// Backward data: input plane (s, ci) gathers from output planes (s, ci·Og ..).
pub(crate) fn backward_data<T: Elem>(dy: &[T], w: &[T], geo: &Geo) -> Result<CpuStorage> {
    let (o, l, kk, hw) = (geo.o, geo.l(), geo.kk(), geo.hw());
    let mut out = CpuStorage::zeroed(T::DTYPE, geo.n * geo.c * hw)?;
    let dx = out.as_mut_slice::<T>()?;
    if w.len() < o * kk || dy.len() < geo.n * o * l {
        return Err(corrupt());
    }
    let (sh, sw) = geo.p.stride;
    for_each_chunk_mut(dx, hw.max(1), |pi, plane| {
        let (s, ci) = (pi / geo.c, pi % geo.c);
        let mut acc = vec![<T::Acc as crate::dtype::WithDType>::ZERO; plane.len()];
        for oc in ci * geo.og..(ci + 1) * geo.og {
            let g = &dy[(s * o + oc) * l..][..l];
            for i in 0..geo.kh {
                let (ylo, yhi) = Geo::valid(geo.oh, geo.h, sh, geo.off_h(i));
                for j in 0..geo.kw {
                    let wv = w[oc * kk + i * geo.kw + j].acc();
                    let (lo, hi) = Geo::valid(geo.ow, geo.w, sw, geo.off_w(j));
                    for y in ylo..yhi {
                        let iy = ((y * sh) as isize + geo.off_h(i)) as usize;
                        for xo in lo..hi {
                            let ix = ((xo * sw) as isize + geo.off_w(j)) as usize;
                            acc[iy * geo.w + ix] += wv * g[y * geo.ow + xo].acc();
                        }
                    }
                }
            }
        }
        for (d, &a) in plane.iter_mut().zip(&acc) {
            *d = T::from_acc(a);
        }
    });
    Ok(out)
}

/// Backward weight: output channel oc's `kH·kW` weights, summed over samples and positions.
pub(crate) fn backward_filter<T: Elem>(
    dy: &[T],
    x: &[T],
    xs: Strided,
    geo: &Geo,
) -> Result<CpuStorage> {
    let (o, l, kk) = (geo.o, geo.l(), geo.kk());
    if dy.len() < geo.n * o * l {
        return Err(corrupt());
    }
    let (sh, sw) = geo.p.stride;
    let rows: Vec<Vec<T::Acc>> = map_indices(o, |oc| {
        let mut acc = vec![<T::Acc as crate::dtype::WithDType>::ZERO; kk];
        let ci = oc / geo.og.max(1);
        for s in 0..geo.n {
            let g = &dy[(s * o + oc) * l..][..l];
            let base = xs.off + s * xs.sn + ci * xs.sc;
            for i in 0..geo.kh {
                let (ylo, yhi) = Geo::valid(geo.oh, geo.h, sh, geo.off_h(i));
                for j in 0..geo.kw {
                    let (lo, hi) = Geo::valid(geo.ow, geo.w, sw, geo.off_w(j));
                    let mut sum = <T::Acc as crate::dtype::WithDType>::ZERO;
                    for y in ylo..yhi {
                        let iy = ((y * sh) as isize + geo.off_h(i)) as usize;
                        for xo in lo..hi {
                            let ix = ((xo * sw) as isize + geo.off_w(j)) as usize;
                            let v = x
                                .get(base + iy * xs.sh + ix * xs.sw)
                                .copied()
                                .unwrap_or(T::ZERO);
                            sum += g[y * geo.ow + xo].acc() * v.acc();
                        }
                    }
                    acc[i * geo.kw + j] += sum;
                }
            }
        }
        acc
    });
    CpuStorage::from_chunks(o * kk, |r| {
        r.map(|i| T::from_acc(rows[i / kk.max(1)][i % kk.max(1)]))
    })
}
