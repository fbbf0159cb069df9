//! CPU 2-D max and average pooling, one output plane per task, following PyTorch's CPU
//! kernels element for element (window clipping, NaN propagation, divisor rules).

use ember_gemm::parallel::for_each_chunk_mut;

use crate::cpu::corrupt;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::{AvgDivisor, Pool2dParams};
use crate::storage::{CpuStorage, PAR_THRESHOLD};

fn check_layout(len: usize, l: &Layout, op: &'static str) -> Result<()> {
    if l.rank() != 4 || (l.numel() > 0 && l.max_extent() > len) {
        return Err(corrupt(op));
    }
    Ok(())
}

/// Runs `f(plane, out)` for each `[N·C]` output plane (`out` has `out_h·out_w` elements),
/// in parallel above the threshold, and returns the planes concatenated.
fn per_plane<U, F>(planes: usize, plane_len: usize, work: usize, f: F) -> Vec<U>
where
    U: Copy + Default + Send,
    F: Fn(usize, &mut [U]) + Sync,
{
    let mut out = vec![U::default(); planes * plane_len];
    if plane_len == 0 {
        return out;
    }
    if work >= PAR_THRESHOLD {
        for_each_chunk_mut(&mut out, plane_len, f);
    } else {
        out.chunks_mut(plane_len)
            .enumerate()
            .for_each(|(i, o)| f(i, o));
    }
    out
}

/// Max pooling: values in the input's dtype and flat `h·W + w` indices (i64).
pub(crate) fn max_pool2d(
    x: &CpuStorage,
    l: &Layout,
    p: &Pool2dParams,
) -> Result<(CpuStorage, CpuStorage)> {
    match x.dtype() {
        DType::F32 => max_pool::<f32>(x, l, p),
        DType::F64 => max_pool::<f64>(x, l, p),
        DType::F16 => max_pool::<half::f16>(x, l, p),
        DType::Bf16 => max_pool::<half::bf16>(x, l, p),
        d => Err(TensorError::unsupported("max_pool2d", d)),
    }
}

fn max_pool<T: WithDType>(
    x: &CpuStorage,
    l: &Layout,
    p: &Pool2dParams,
) -> Result<(CpuStorage, CpuStorage)> {
    let d = x.as_slice::<T>()?;
    check_layout(d.len(), l, "max_pool2d")?;
    let &[n, c, h, w] = l.dims() else {
        return Err(corrupt("max_pool2d"));
    };
    let st = l.strides();
    let (oh, ow) = p.out;
    let (kh, kw) = p.kernel;
    let (dh, dw) = p.dilation;
    let work = n * c * oh * ow * kh * kw;
    // Each output element: (value as f64, index).
    let res: Vec<(f64, i64)> = per_plane(n * c, oh * ow, work, |plane, out| {
        let base = l.offset() + (plane / c.max(1)) * st[0] + (plane % c.max(1)) * st[1];
        for (y, row) in out.chunks_mut(ow).enumerate() {
            // PyTorch: the window starts at y·s - pad, ends (exclusive) at
            // min(start + (k-1)·d + 1, H); the start steps by d until it is >= 0.
            let mut h0 = (y * p.stride.0) as isize - p.pad.0 as isize;
            let h1 = (h0 + ((kh - 1) * dh) as isize + 1).min(h as isize);
            while h0 < 0 {
                h0 += dh as isize;
            }
            for (xo, slot) in row.iter_mut().enumerate() {
                let mut w0 = (xo * p.stride.1) as isize - p.pad.1 as isize;
                let w1 = (w0 + ((kw - 1) * dw) as isize + 1).min(w as isize);
                while w0 < 0 {
                    w0 += dw as isize;
                }
                let mut best = f64::NEG_INFINITY;
                let mut arg = h0 as i64 * w as i64 + w0 as i64;
                let mut iy = h0;
                while iy < h1 {
                    let mut ix = w0;
                    while ix < w1 {
                        let v = d
                            .get(base + iy as usize * st[2] + ix as usize * st[3])
                            .map_or(0.0, |v| v.to_f64());
                        if v > best || v.is_nan() {
                            best = v;
                            arg = iy as i64 * w as i64 + ix as i64;
                        }
                        ix += dw as isize;
                    }
                    iy += dh as isize;
                }
                *slot = (best, arg);
            }
        }
    });
    let res = &res;
    let vals = CpuStorage::from_chunks(res.len(), |r| res[r].iter().map(|&(v, _)| T::from_f64(v)))?;
    let idx = CpuStorage::from_chunks(res.len(), |r| res[r].iter().map(|&(_, i)| i))?;
    Ok((vals, idx))
}

/// Average pooling in the input's dtype (sums in f64).
pub(crate) fn avg_pool2d(
    x: &CpuStorage,
    l: &Layout,
    p: &Pool2dParams,
    divisor: AvgDivisor,
) -> Result<CpuStorage> {
    match x.dtype() {
        DType::F32 => avg_pool::<f32>(x, l, p, divisor),
        DType::F64 => avg_pool::<f64>(x, l, p, divisor),
        DType::F16 => avg_pool::<half::f16>(x, l, p, divisor),
        DType::Bf16 => avg_pool::<half::bf16>(x, l, p, divisor),
        d => Err(TensorError::unsupported("avg_pool2d", d)),
    }
}

fn avg_pool<T: WithDType>(
    x: &CpuStorage,
    l: &Layout,
    p: &Pool2dParams,
    divisor: AvgDivisor,
) -> Result<CpuStorage> {
    let d = x.as_slice::<T>()?;
    check_layout(d.len(), l, "avg_pool2d")?;
    let &[n, c, h, w] = l.dims() else {
        return Err(corrupt("avg_pool2d"));
    };
    let st = l.strides();
    let (oh, ow) = p.out;
    let (kh, kw) = p.kernel;
    let (ph, pw) = (p.pad.0 as isize, p.pad.1 as isize);
    let (hi, wi) = (h as isize, w as isize);
    let work = n * c * oh * ow * kh * kw;
    let res: Vec<f64> = per_plane(n * c, oh * ow, work, |plane, out| {
        let base = l.offset() + (plane / c.max(1)) * st[0] + (plane % c.max(1)) * st[1];
        for (y, row) in out.chunks_mut(ow).enumerate() {
            // PyTorch: the window [start, start + k) is clipped to [-pad, H + pad) for the
            // count-include-pad size, then to [0, H) for the sum.
            let h0 = (y * p.stride.0) as isize - ph;
            let h1 = (h0 + kh as isize).min(hi + ph);
            for (xo, slot) in row.iter_mut().enumerate() {
                let w0 = (xo * p.stride.1) as isize - pw;
                let w1 = (w0 + kw as isize).min(wi + pw);
                let pool_size = (h1 - h0) * (w1 - w0);
                let (a0, a1) = (h0.max(0), h1.min(hi));
                let (b0, b1) = (w0.max(0), w1.min(wi));
                if a0 >= a1 || b0 >= b1 {
                    *slot = 0.0;
                    continue;
                }
                let mut sum = 0.0;
                for iy in a0..a1 {
                    let rb = base + iy as usize * st[2];
                    for ix in b0..b1 {
                        sum += d.get(rb + ix as usize * st[3]).map_or(0.0, |v| v.to_f64());
                    }
                }
                let div = match divisor {
                    AvgDivisor::Override(v) => v as f64,
                    AvgDivisor::IncludePad => pool_size as f64,
                    AvgDivisor::ExcludePad => ((a1 - a0) * (b1 - b0)) as f64,
                };
                *slot = sum / div;
            }
        }
    });
    let res = &res;
    CpuStorage::from_chunks(res.len(), |r| res[r].iter().map(|&v| T::from_f64(v)))
}
