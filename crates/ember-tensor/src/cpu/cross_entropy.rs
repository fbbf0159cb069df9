//! CPU fused cross-entropy with class-index targets: the forward gives each row of scores
//! (the `C` scores of one `(n, l)` of `[N, C, L]`) its `max` and `ln Σ exp(x - max)` in one
//! vectorised pass (`softmax::row_log_normalizers`, parallel over rows), then one loss per
//! row; the backward writes `scale·(softmax·A - a)` once per score, parallel over rows.
//! The formulas are those of `kernels/cross_entropy.cu`.

use std::borrow::Cow;

use ember_gemm::parallel::for_each_chunk_mut;

use crate::cpu::loss::{check_layout, class_weights, corrupt, targets};
use crate::cpu::softmax::{self, SoftmaxFloat};
use crate::cpu::{cast, contiguous_slice};
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::CrossEntropyParams;
use crate::storage::{CpuStorage, PAR_THRESHOLD};

/// The float types the fused loss computes in.
trait CeFloat:
    SoftmaxFloat
    + std::ops::Neg<Output = Self>
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
}
impl CeFloat for f32 {}
impl CeFloat for f64 {}

/// `x` (16-bit) widened to f32, contiguous: the compute copy of f16/bf16 scores.
fn widened(x: &CpuStorage, lx: &Layout) -> Result<(CpuStorage, Layout)> {
    Ok((
        cast(x, lx, DType::F32)?,
        Layout::contiguous(lx.shape().clone()),
    ))
}

/// Per row of contiguous `[N, C, L]` scores `x` (any float dtype): the loss, the weight
/// `w[t]` it used and `lse = max + ln Σ exp(x - max)`, each `[N·L]` in the compute dtype
/// (f32, f64 for f64). A bad target is the CPU `nll_loss` error naming the first.
pub(crate) fn forward(
    x: &CpuStorage,
    lx: &Layout,
    t: &CpuStorage,
    lt: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
    p: &CrossEntropyParams,
) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    match x.dtype() {
        DType::F32 => fwd::<f32>(x, lx, t, lt, weight, p),
        DType::F64 => fwd::<f64>(x, lx, t, lt, weight, p),
        DType::F16 | DType::Bf16 => {
            let (x32, l32) = widened(x, lx)?;
            fwd::<f32>(&x32, &l32, t, lt, weight, p)
        }
        d => Err(TensorError::unsupported("cross_entropy", d)),
    }
}

/// The gradient of the scores (`[N, C, L]`, `x`'s dtype) for upstream `grad` (`[N·L]`
/// when `per_row`, else one value), with `lse` from [`forward`], the mean's divisor `total`
/// and `wsum = Σ w` (read with smoothing and a weight), all in the compute dtype.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    x: &CpuStorage,
    lx: &Layout,
    lse: &CpuStorage,
    t: &CpuStorage,
    lt: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
    wsum: Option<&CpuStorage>,
    grad: (&CpuStorage, bool),
    total: Option<&CpuStorage>,
    p: &CrossEntropyParams,
) -> Result<CpuStorage> {
    match x.dtype() {
        DType::F32 => bwd::<f32>(x, lx, lse, t, lt, weight, wsum, grad, total, p),
        DType::F64 => bwd::<f64>(x, lx, lse, t, lt, weight, wsum, grad, total, p),
        d @ (DType::F16 | DType::Bf16) => {
            let (x32, l32) = widened(x, lx)?;
            let g = bwd::<f32>(&x32, &l32, lse, t, lt, weight, wsum, grad, total, p)?;
            cast(&g, &Layout::contiguous(lx.shape().clone()), d)
        }
        d => Err(TensorError::unsupported("cross_entropy", d)),
    }
}

/// The operands every pass reads: the scores as rows of `C` (transposed to `[N, L, C]`
/// when `L > 1`), the targets, the weights.
struct Rows<'a, T: Clone> {
    rows: Cow<'a, [T]>,
    classes: usize,
    targets: Vec<i64>,
    weight: Option<Vec<T>>,
}

impl<'a, T: CeFloat> Rows<'a, T> {
    fn new(
        x: &'a CpuStorage,
        lx: &Layout,
        t: &CpuStorage,
        lt: &Layout,
        weight: Option<(&CpuStorage, &Layout)>,
    ) -> Result<Rows<'a, T>> {
        let dx = x.as_slice::<T>()?;
        check_layout(dx.len(), lx, 3)?;
        let (&[n, c, l], Some(data)) = (lx.dims(), contiguous_slice(dx, lx)) else {
            return Err(corrupt());
        };
        if lt.dims() != [n, l] {
            return Err(corrupt());
        }
        let rows = if l == 1 {
            Cow::Borrowed(data)
        } else {
            let mut r = Vec::with_capacity(data.len());
            for s in 0..n {
                let block = data.get(s * c * l..(s + 1) * c * l).ok_or_else(corrupt)?;
                for li in 0..l {
                    r.extend((0..c).map(|k| block.get(k * l + li).copied().unwrap_or(T::ZERO)));
                }
            }
            Cow::Owned(r)
        };
        let weight = class_weights(weight)?;
        Ok(Rows {
            rows,
            classes: c,
            targets: targets(t, lt)?,
            weight,
        })
    }

    fn w(&self, k: usize) -> T {
        self.weight
            .as_ref()
            .and_then(|w| w.get(k).copied())
            .unwrap_or(T::ONE)
    }
}

/// The error for the first target that is neither a class nor `ignore_index`.
fn check_targets(tv: &[i64], c: usize, ignore_index: i64) -> Result<()> {
    match tv
        .iter()
        .find(|&&k| k != ignore_index && (k < 0 || k >= c as i64))
    {
        Some(k) => Err(TensorError::invalid(
            "nll_loss",
            format!(
                "target {k} is out of bounds: expected a class index in [0, {c}) or ignore_index = {ignore_index}"
            ),
        )),
        None => Ok(()),
    }
}

fn fwd<T: CeFloat>(
    x: &CpuStorage,
    lx: &Layout,
    t: &CpuStorage,
    lt: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
    p: &CrossEntropyParams,
) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    let r = Rows::<T>::new(x, lx, t, lt, weight)?;
    let c = r.classes;
    check_targets(&r.targets, c, p.ignore_index)?;
    let n = r.targets.len();
    if c == 0 {
        let zeros = vec![T::ZERO; n];
        let s = || CpuStorage::from_slice(&zeros);
        return Ok((s()?, s()?, s()?));
    }
    let norm = softmax::row_log_normalizers(&r.rows, c);
    let eps = T::from_f64(p.smoothing);
    let share = T::from_f64(p.smoothing / c as f64);
    let one_minus = T::ONE - eps;
    // (loss, w[t]) per row.
    let mut out = vec![(T::ZERO, T::ZERO); n];
    let per = (PAR_THRESHOLD / c).max(1);
    let body = |start: usize, os: &mut [(T, T)]| {
        for (j, o) in os.iter_mut().enumerate() {
            let i = start + j;
            let k = r.targets.get(i).copied().unwrap_or(p.ignore_index);
            if k == p.ignore_index {
                continue;
            }
            let (m, ln_s) = norm.get(i).copied().unwrap_or((T::ZERO, T::ZERO));
            let row = r.rows.get(i * c..(i + 1) * c).unwrap_or(&[]);
            let k = k as usize;
            let wt = r.w(k);
            let logp = |v: T| (v - m) - ln_s;
            let mut loss = -(wt * logp(row.get(k).copied().unwrap_or(T::ZERO)));
            if p.smoothing != 0.0 {
                let smooth = row
                    .iter()
                    .enumerate()
                    .fold(T::ZERO, |a, (kk, &v)| a + r.w(kk) * logp(v));
                loss = one_minus * loss + share * (-smooth);
            }
            *o = (loss, wt);
        }
    };
    if n * c >= PAR_THRESHOLD && n > per {
        for_each_chunk_mut(&mut out, per, |i, os| body(i * per, os));
    } else {
        body(0, &mut out);
    }
    let loss: Vec<T> = out.iter().map(|o| o.0).collect();
    let wt: Vec<T> = out.iter().map(|o| o.1).collect();
    let lse: Vec<T> = norm.iter().map(|&(m, ln_s)| m + ln_s).collect();
    Ok((
        CpuStorage::from_slice(&loss)?,
        CpuStorage::from_slice(&wt)?,
        CpuStorage::from_slice(&lse)?,
    ))
}

/// The first element of a one-element compute-dtype storage.
fn scalar<T: WithDType>(s: Option<&CpuStorage>) -> Result<Option<T>> {
    s.map(|s| s.as_slice::<T>()?.first().copied().ok_or_else(corrupt))
        .transpose()
}

#[allow(clippy::too_many_arguments)]
fn bwd<T: CeFloat>(
    x: &CpuStorage,
    lx: &Layout,
    lse: &CpuStorage,
    t: &CpuStorage,
    lt: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
    wsum: Option<&CpuStorage>,
    (grad, per_row): (&CpuStorage, bool),
    total: Option<&CpuStorage>,
    p: &CrossEntropyParams,
) -> Result<CpuStorage> {
    let dx = x.as_slice::<T>()?;
    check_layout(dx.len(), lx, 3)?;
    let (&[n, c, l], Some(data)) = (lx.dims(), contiguous_slice(dx, lx)) else {
        return Err(corrupt());
    };
    let tv = targets(t, lt)?;
    let lse = lse.as_slice::<T>()?;
    let g = grad.as_slice::<T>()?;
    let total = scalar::<T>(total)?;
    let wsum = scalar::<T>(wsum)?;
    let w: Option<Vec<T>> = class_weights(weight)?;
    let wc = |k: usize| w.as_ref().and_then(|w| w.get(k).copied()).unwrap_or(T::ONE);
    let eps = T::from_f64(p.smoothing);
    let share = T::from_f64(p.smoothing / c.max(1) as f64);
    let big_w = if p.smoothing == 0.0 {
        T::ZERO
    } else {
        wsum.unwrap_or(T::from_f64(c as f64))
    };
    // Per row: (A, (1-ε)·w[t], ε/C or 0, scale, t or usize::MAX).
    let row = |i: usize| {
        let k = tv.get(i).copied().unwrap_or(p.ignore_index);
        let valid = k != p.ignore_index && k >= 0 && (k as usize) < c;
        let wt = if valid { wc(k as usize) } else { T::ZERO };
        let hit = (T::ONE - eps) * wt;
        let sh = if valid { share } else { T::ZERO };
        let a = if valid { hit + sh * big_w } else { T::ZERO };
        let mut scale = g
            .get(if per_row { i } else { 0 })
            .copied()
            .unwrap_or(T::ZERO);
        if let Some(tot) = total {
            scale = scale / tot;
        }
        let k = if valid { k as usize } else { usize::MAX };
        (a, hit, sh, scale, k)
    };
    let mut out = CpuStorage::zeroed(T::DTYPE, n * c * l)?;
    let o = out.as_mut_slice::<T>()?;
    let block = (c * l).max(1);
    let per = (PAR_THRESHOLD / block).max(1) * block;
    // `fast_exp`'s `mul_add`s are FMA instructions only in code compiled for them (see
    // `cpu::simd`); in baseline code each is a call to libm's `fmaf`, which made this loop
    // ~30x slower. So the loop is inlined into `widest`'s trampoline.
    let body = |start: usize, os: &mut [T]| {
        super::simd::widest(
            #[inline(always)]
            || {
                for (sb, ob) in os.chunks_mut(block).enumerate() {
                    let s = start / block + sb;
                    let xb = data.get(s * block..(s + 1) * block).unwrap_or(&[]);
                    for li in 0..l {
                        let i = s * l + li;
                        let (a, hit, sh, scale, k) = row(i);
                        let m = lse.get(i).copied().unwrap_or(T::ZERO);
                        for kk in 0..c {
                            let at = kk * l + li;
                            let v = xb.get(at).copied().unwrap_or(T::ZERO);
                            let a_c = (if kk == k { hit } else { T::ZERO }) + sh * wc(kk);
                            if let Some(d) = ob.get_mut(at) {
                                *d = scale * ((v - m).fast_exp() * a - a_c);
                            }
                        }
                    }
                }
            },
        )
    };
    if o.len() >= PAR_THRESHOLD {
        for_each_chunk_mut(o, per, |i, os| body(i * per, os));
    } else {
        body(0, o);
    }
    Ok(out)
}
