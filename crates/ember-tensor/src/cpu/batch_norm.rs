//! CPU batch normalisation over contiguous `[N, C, S]`: the formulas of
//! `kernels/batch_norm.cu` (per-channel statistics, one normalising pass; the backward's
//! per-channel sums, one elementwise pass), parallel over channels for the reductions and
//! over elements for the elementwise passes. f16/bf16 are computed in f32.

use ember_gemm::parallel::for_each_chunk_mut;

use crate::cpu::cast;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::{BnBackward, BnGrads, BnStats};
use crate::storage::{CpuStorage, for_each_piece};

fn corrupt() -> TensorError {
    TensorError::invalid(
        "batch_norm",
        "expected contiguous [N, C, S] operands (internal error)",
    )
}

/// The float types batch norm computes in.
trait BnFloat:
    WithDType
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    fn sqrt(self) -> Self;
}
impl BnFloat for f32 {
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
}
impl BnFloat for f64 {
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

/// The elements of a contiguous `[N, C, S]` operand (16-bit widened to f32) and its dims.
fn operand<T: BnFloat>(x: &CpuStorage, lx: &Layout) -> Result<(Vec<T>, [usize; 3])> {
    let &[n, c, s] = lx.dims() else {
        return Err(corrupt());
    };
    let wide = cast(x, lx, T::DTYPE)?;
    let d = wide.as_slice::<T>()?;
    Ok((d.get(..n * c * s).ok_or_else(corrupt)?.to_vec(), [n, c, s]))
}

/// A `[C]` vector of the compute dtype.
fn vector<T: BnFloat>(v: Option<&CpuStorage>, c: usize) -> Result<Option<Vec<T>>> {
    v.map(|v| {
        let d = v.as_slice::<T>()?;
        d.get(..c).map(<[T]>::to_vec).ok_or_else(corrupt)
    })
    .transpose()
}

fn compute_dtype(x: DType) -> Result<DType> {
    match x {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::Bf16 => Ok(DType::F32),
        d => Err(TensorError::unsupported("batch_norm", d)),
    }
}

/// Per channel of `[N, C, S]` `x`: mean and `1 / sqrt(var + eps)` (biased variance), each
/// `[C]` in the compute dtype; updates `running` (mean, var; compute dtype) in place with
/// `momentum` and the unbiased variance.
pub(crate) fn stats(
    x: &CpuStorage,
    lx: &Layout,
    running: Option<(&mut CpuStorage, &mut CpuStorage)>,
    momentum: f64,
    eps: f64,
) -> Result<(CpuStorage, CpuStorage)> {
    match compute_dtype(x.dtype())? {
        DType::F64 => stats_t::<f64>(x, lx, running, momentum, eps),
        _ => stats_t::<f32>(x, lx, running, momentum, eps),
    }
}

fn stats_t<T: BnFloat>(
    x: &CpuStorage,
    lx: &Layout,
    running: Option<(&mut CpuStorage, &mut CpuStorage)>,
    momentum: f64,
    eps: f64,
) -> Result<(CpuStorage, CpuStorage)> {
    let (d, [n, c, s]) = operand::<T>(x, lx)?;
    let m = (n * s) as f64;
    // (mean, biased var) per channel: two passes over the channel in f64.
    let mut st = vec![(0f64, 0f64); c];
    for_each_chunk_mut(&mut st, 1, |ch, o| {
        let each = |f: &mut dyn FnMut(f64)| {
            for b in 0..n {
                let base = (b * c + ch) * s;
                for v in d.get(base..base + s).unwrap_or(&[]) {
                    f(v.to_f64());
                }
            }
        };
        let mut sum = 0.0;
        each(&mut |v| sum += v);
        let mean = sum / m;
        let mut sq = 0.0;
        each(&mut |v| sq += (v - mean) * (v - mean));
        if let Some(o) = o.first_mut() {
            *o = (mean, sq / m);
        }
    });
    let mean: Vec<T> = st.iter().map(|p| T::from_f64(p.0)).collect();
    let invstd: Vec<T> = st
        .iter()
        .map(|p| T::ONE / (T::from_f64(p.1) + T::from_f64(eps)).sqrt())
        .collect();
    if let Some((rm, rv)) = running {
        let mom = T::from_f64(momentum);
        let rm = rm.as_mut_slice::<T>()?;
        for (r, p) in rm.iter_mut().zip(&st) {
            *r = (T::ONE - mom) * *r + mom * T::from_f64(p.0);
        }
        let rv = rv.as_mut_slice::<T>()?;
        for (r, p) in rv.iter_mut().zip(&st) {
            let unbiased = T::from_f64(p.1) * T::from_f64(m / (m - 1.0));
            *r = (T::ONE - mom) * *r + mom * unbiased;
        }
    }
    Ok((
        CpuStorage::from_slice(&mean)?,
        CpuStorage::from_slice(&invstd)?,
    ))
}

/// `k[ch]`: the invstd, or `1 / sqrt(var + eps)` from a variance.
fn ks<T: BnFloat>(st: &BnStats<'_, CpuStorage>, c: usize) -> Result<(Vec<T>, Vec<T>)> {
    let mean = vector::<T>(Some(st.mean), c)?.ok_or_else(corrupt)?;
    let v = vector::<T>(Some(st.v), c)?.ok_or_else(corrupt)?;
    let k = if st.is_var {
        v.iter()
            .map(|&v| T::ONE / (v + T::from_f64(st.eps)).sqrt())
            .collect()
    } else {
        v
    };
    Ok((mean, k))
}

/// `y = (x - mean)·k·weight + bias` per channel, in `x`'s dtype.
pub(crate) fn apply(
    x: &CpuStorage,
    lx: &Layout,
    st: &BnStats<'_, CpuStorage>,
    weight: Option<&CpuStorage>,
    bias: Option<&CpuStorage>,
) -> Result<CpuStorage> {
    match compute_dtype(x.dtype())? {
        DType::F64 => apply_t::<f64>(x, lx, st, weight, bias),
        _ => apply_t::<f32>(x, lx, st, weight, bias),
    }
}

fn apply_t<T: BnFloat>(
    x: &CpuStorage,
    lx: &Layout,
    st: &BnStats<'_, CpuStorage>,
    weight: Option<&CpuStorage>,
    bias: Option<&CpuStorage>,
) -> Result<CpuStorage> {
    let (mut d, [_, c, s]) = operand::<T>(x, lx)?;
    let (mean, k) = ks::<T>(st, c)?;
    let w = vector::<T>(weight, c)?;
    let b = vector::<T>(bias, c)?;
    let s1 = s.max(1);
    for_each_piece(&mut d, |start, piece| {
        for (j, v) in piece.iter_mut().enumerate() {
            let ch = ((start + j) / s1) % c.max(1);
            let get = |v: &[T]| v.get(ch).copied().unwrap_or(T::ZERO);
            let mut r = (*v - get(&mean)) * get(&k);
            if let Some(w) = &w {
                r = r * get(w);
            }
            if let Some(b) = &b {
                r = r + get(b);
            }
            *v = r;
        }
    });
    let out = CpuStorage::from_slice(&d)?;
    if x.dtype() == T::DTYPE {
        Ok(out)
    } else {
        cast(&out, &Layout::contiguous(lx.shape().clone()), x.dtype())
    }
}

/// The backward: `(dx in x's dtype, Σ dy, Σ dy·x̂)`, the sums `[C]` in the compute dtype
/// (computed when `b.training` or `b.sums`; dx when `b.need_input`).
pub(crate) fn backward(
    dy: &CpuStorage,
    x: &CpuStorage,
    lx: &Layout,
    st: &BnStats<'_, CpuStorage>,
    weight: Option<&CpuStorage>,
    b: &BnBackward,
) -> Result<BnGrads<CpuStorage>> {
    match compute_dtype(x.dtype())? {
        DType::F64 => backward_t::<f64>(dy, x, lx, st, weight, b),
        _ => backward_t::<f32>(dy, x, lx, st, weight, b),
    }
}

fn backward_t<T: BnFloat>(
    dy: &CpuStorage,
    x: &CpuStorage,
    lx: &Layout,
    st: &BnStats<'_, CpuStorage>,
    weight: Option<&CpuStorage>,
    b: &BnBackward,
) -> Result<BnGrads<CpuStorage>> {
    let (xd, [n, c, s]) = operand::<T>(x, lx)?;
    // dy is contiguous from its storage's start (the front's `from_start`).
    let (mut g, _) = operand::<T>(dy, &Layout::contiguous(lx.shape().clone()))?;
    let (mean, k) = ks::<T>(st, c)?;
    let w = vector::<T>(weight, c)?;
    let get = |v: &[T], ch: usize| v.get(ch).copied().unwrap_or(T::ZERO);
    let sums = if b.training || b.sums {
        let mut acc = vec![(0f64, 0f64); c];
        for_each_chunk_mut(&mut acc, 1, |ch, o| {
            let (mut sd, mut sdx) = (0f64, 0f64);
            for bi in 0..n {
                let base = (bi * c + ch) * s;
                for j in base..base + s {
                    let gv = get(&g, j).to_f64();
                    let xh = ((get(&xd, j) - get(&mean, ch)) * get(&k, ch)).to_f64();
                    sd += gv;
                    sdx += gv * xh;
                }
            }
            if let Some(o) = o.first_mut() {
                *o = (sd, sdx);
            }
        });
        Some(acc)
    } else {
        None
    };
    let dx = if b.need_input {
        let inv_m = T::ONE / T::from_f64((n * s) as f64);
        let s1 = s.max(1);
        for_each_piece(&mut g, |start, piece| {
            for (j, v) in piece.iter_mut().enumerate() {
                let i = start + j;
                let ch = (i / s1) % c.max(1);
                let kk = get(&k, ch);
                let wk = w.as_ref().map_or(kk, |w| get(w, ch) * kk);
                *v = match &sums {
                    Some(sm) if b.training => {
                        let (sd, sdx) = sm.get(ch).copied().unwrap_or((0.0, 0.0));
                        let xh = (get(&xd, i) - get(&mean, ch)) * kk;
                        wk * (*v - T::from_f64(sd) * inv_m - xh * (T::from_f64(sdx) * inv_m))
                    }
                    _ => *v * wk,
                };
            }
        });
        let out = CpuStorage::from_slice(&g)?;
        Some(if x.dtype() == T::DTYPE {
            out
        } else {
            cast(&out, &Layout::contiguous(lx.shape().clone()), x.dtype())?
        })
    } else {
        None
    };
    let sums = match sums {
        Some(sm) => {
            let sd: Vec<T> = sm.iter().map(|p| T::from_f64(p.0)).collect();
            let sdx: Vec<T> = sm.iter().map(|p| T::from_f64(p.1)).collect();
            Some((CpuStorage::from_slice(&sd)?, CpuStorage::from_slice(&sdx)?))
        }
        None => None,
    };
    Ok((dx, sums))
}
