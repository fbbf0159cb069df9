//! CPU negative log-likelihood: the per-element terms `-w[t]·x[n, t, l]` and weights
//! `w[t]` that the `nll_loss` / `cross_entropy` fronts reduce.

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::CpuStorage;

pub(super) fn corrupt() -> TensorError {
    super::corrupt("nll_loss")
}

/// A loss's class weights (`weight=`) gathered into a vector of `T`, if given.
pub(super) fn class_weights<T: WithDType>(
    weight: Option<(&CpuStorage, &Layout)>,
) -> Result<Option<Vec<T>>> {
    Ok(match weight {
        Some((ws, lw)) => {
            let d = ws.as_slice::<T>()?;
            check_layout(d.len(), lw, 1)?;
            Some(
                lw.strided_index()
                    .map(|i| d.get(i).copied().unwrap_or(T::ZERO))
                    .collect(),
            )
        }
        None => None,
    })
}

pub(super) fn check_layout(len: usize, l: &Layout, rank: usize) -> Result<()> {
    if l.rank() != rank || (l.numel() > 0 && l.max_extent() > len) {
        return Err(corrupt());
    }
    Ok(())
}

/// Class indices of `t` (`[N, L]`, i64 or i32) in row-major order, as i64.
pub(super) fn targets(t: &CpuStorage, lt: &Layout) -> Result<Vec<i64>> {
    fn read<I: WithDType>(t: &CpuStorage, lt: &Layout) -> Result<Vec<i64>> {
        let d = t.as_slice::<I>()?;
        check_layout(d.len(), lt, 2)?;
        Ok(lt
            .strided_index()
            .map(|i| d.get(i).map_or(0, |v| v.to_i64()))
            .collect())
    }
    match t.dtype() {
        DType::I64 => read::<i64>(t, lt),
        DType::I32 => read::<i32>(t, lt),
        found => Err(TensorError::IndexDType {
            op: "nll_loss",
            found,
        }),
    }
}

/// Per element of `[N, L]`: `(-w[t]·x[n, t, l], w[t])`, or `(0, 0)` where
/// `t == ignore_index`; `x` is `[N, C, L]` (f32 or f64), `weight` `[C]` of `x`'s dtype.
pub(crate) fn nll_loss(
    x: &CpuStorage,
    lx: &Layout,
    t: &CpuStorage,
    lt: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
    ignore_index: i64,
) -> Result<(CpuStorage, CpuStorage)> {
    match x.dtype() {
        DType::F32 => nll::<f32>(x, lx, t, lt, weight, ignore_index),
        DType::F64 => nll::<f64>(x, lx, t, lt, weight, ignore_index),
        d => Err(TensorError::unsupported("nll_loss", d)),
    }
}

fn nll<T: NllFloat>(
    x: &CpuStorage,
    lx: &Layout,
    t: &CpuStorage,
    lt: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
    ignore_index: i64,
) -> Result<(CpuStorage, CpuStorage)> {
    let dx = x.as_slice::<T>()?;
    check_layout(dx.len(), lx, 3)?;
    let (st, off) = (lx.strides(), lx.offset());
    nll_with(lx, t, lt, weight, ignore_index, |s, cls, li| {
        dx.get(off + s * st[0] + cls * st[1] + li * st[2])
            .copied()
            .ok_or_else(corrupt)
    })
}

trait NllFloat: WithDType + std::ops::Neg<Output = Self> + std::ops::Mul<Output = Self> {}
impl NllFloat for f32 {}
impl NllFloat for f64 {}

/// The terms of [`nll_loss`] over `[N, C, L]` (`lx`'s dims), with `x[s, cls, li]` read
/// through `value`.
fn nll_with<T: NllFloat>(
    lx: &Layout,
    t: &CpuStorage,
    lt: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
    ignore_index: i64,
    value: impl Fn(usize, usize, usize) -> Result<T>,
) -> Result<(CpuStorage, CpuStorage)> {
    let &[n, c, l] = lx.dims() else {
        return Err(corrupt());
    };
    if lt.dims() != [n, l] {
        return Err(corrupt());
    }
    let w: Option<Vec<T>> = class_weights(weight)?;
    let tv = targets(t, lt)?;
    let mut loss = Vec::with_capacity(tv.len());
    let mut wt = Vec::with_capacity(tv.len());
    for (pos, &cls) in tv.iter().enumerate() {
        if cls == ignore_index {
            loss.push(T::ZERO);
            wt.push(T::ZERO);
            continue;
        }
        if cls < 0 || cls >= c as i64 {
            return Err(TensorError::invalid(
                "nll_loss",
                format!(
                    "target {cls} is out of bounds: expected a class index in [0, {c}) or ignore_index = {ignore_index}"
                ),
            ));
        }
        let (s, li) = (pos / l.max(1), pos % l.max(1));
        let v = value(s, cls as usize, li)?;
        let wc = match &w {
            Some(w) => w.get(cls as usize).copied().ok_or_else(corrupt)?,
            None => T::ONE,
        };
        loss.push(-(wc * v));
        wt.push(wc);
    }
    Ok((CpuStorage::from_slice(&loss)?, CpuStorage::from_slice(&wt)?))
}
