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

/// Runs `f(plane, out)` for each `[N·C]` output plane `out[plane]`, in parallel when the
/// pooling's `work` is above the threshold.
fn per_plane<U, F>(out: &mut [U], work: usize, f: F)
where
    U: Send,
    F: Fn(usize, &mut U) + Sync,
{
    if work >= PAR_THRESHOLD {
        for_each_chunk_mut(out, 1, |i, o| f(i, &mut o[0]));
    } else {
        out.iter_mut().enumerate().for_each(|(i, o)| f(i, o));
    }
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
    // The outputs are written in place, plane by plane, into storage from the caching
    // allocator (a step reuses it instead of faulting in fresh pages).
    let plane = oh * ow;
    let mut vals = CpuStorage::zeroed(T::DTYPE, n * c * plane)?;
    let mut idx = CpuStorage::zeroed(DType::I64, n * c * plane)?;
    if plane > 0 {
        let mut planes: Vec<(&mut [T], &mut [i64])> = vals
            .as_mut_slice::<T>()?
            .chunks_mut(plane)
            .zip(idx.as_mut_slice::<i64>()?.chunks_mut(plane))
            .collect();
        per_plane(&mut planes, work, |pl, (vo, io)| {
            let base = l.offset() + (pl / c.max(1)) * st[0] + (pl % c.max(1)) * st[1];
            for y in 0..oh {
                // PyTorch: the window starts at y·s - pad, ends (exclusive) at
                // min(start + (k-1)·d + 1, H); the start steps by d until it is >= 0.
                let mut h0 = (y * p.stride.0) as isize - p.pad.0 as isize;
                let h1 = (h0 + ((kh - 1) * dh) as isize + 1).min(h as isize);
                while h0 < 0 {
                    h0 += dh as isize;
                }
                let rows =
                    (vo[y * ow..(y + 1) * ow].iter_mut()).zip(io[y * ow..(y + 1) * ow].iter_mut());
                for (xo, (vslot, islot)) in rows.enumerate() {
                    let mut w0 = (xo * p.stride.1) as isize - p.pad.1 as isize;
                    let w1 = (w0 + ((kw - 1) * dw) as isize + 1).min(w as isize);
                    while w0 < 0 {
                        w0 += dw as isize;
                    }
                    // Compared in f64: exact for every float dtype, so the same order.
                    let mut best = f64::NEG_INFINITY;
                    let mut arg = h0 as i64 * w as i64 + w0 as i64;
                    let mut iy = h0;
                    while iy < h1 {
                        let rb = base + iy as usize * st[2];
                        let mut ix = w0;
                        while ix < w1 {
                            let v = d.get(rb + ix as usize * st[3]).map_or(0.0, |v| v.to_f64());
                            if v > best || v.is_nan() {
                                best = v;
                                arg = iy as i64 * w as i64 + ix as i64;
                            }
                            ix += dw as isize;
                        }
                        iy += dh as isize;
                    }
                    *vslot = T::from_f64(best);
                    *islot = arg;
                }
            }
        });
    }
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
    let plane = oh * ow;
    let mut res = CpuStorage::zeroed(T::DTYPE, n * c * plane)?;
    if plane > 0 {
        let mut planes: Vec<&mut [T]> = res.as_mut_slice::<T>()?.chunks_mut(plane).collect();
        per_plane(&mut planes, work, |pl, out| {
            let base = l.offset() + (pl / c.max(1)) * st[0] + (pl % c.max(1)) * st[1];
            for (y, row) in out.chunks_mut(ow).enumerate() {
                // PyTorch: the window [start, start + k) is clipped to [-pad, H + pad) for
                // the count-include-pad size, then to [0, H) for the sum.
                let h0 = (y * p.stride.0) as isize - ph;
                let h1 = (h0 + kh as isize).min(hi + ph);
                for (xo, slot) in row.iter_mut().enumerate() {
                    let w0 = (xo * p.stride.1) as isize - pw;
                    let w1 = (w0 + kw as isize).min(wi + pw);
                    let pool_size = (h1 - h0) * (w1 - w0);
                    let (a0, a1) = (h0.max(0), h1.min(hi));
                    let (b0, b1) = (w0.max(0), w1.min(wi));
                    if a0 >= a1 || b0 >= b1 {
                        *slot = T::from_f64(0.0);
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
                    *slot = T::from_f64(sum / div);
                }
            }
        });
    }
    Ok(res)
}
