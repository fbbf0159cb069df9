//! Fused softmax and log-softmax along one dim: per row, one pass for the max, one for
//! `Σ exp(x - max)`, one to write the result — instead of the five tensors the composite
//! form (`max`, `sub`, `exp`, `sum`, `div`) allocates and walks.
//!
//! The input is made contiguous first (a no-op for contiguous inputs); a row is then the
//! `size` elements of the dim, `inner` apart. For the last dim (`inner == 1`) rows are
//! slices; otherwise a block `[size, inner]` is processed with the inner positions as
//! vector lanes.

use ember_gemm::parallel::for_each_chunk_mut;

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::math::FastExp;
use crate::storage::{CpuStorage, PAR_THRESHOLD};

/// The float types softmax computes in (f16/bf16 are computed in f32 by the front).
pub(crate) trait SoftmaxFloat: WithDType + FastExp + std::ops::Sub<Output = Self> {
    fn max(self, o: Self) -> Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn ln(self) -> Self;
    fn recip(self) -> Self;
    const NEG_INF: Self;
}

macro_rules! softmax_float {
    ($t:ty) => {
        impl SoftmaxFloat for $t {
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                // Not `<$t>::max`: NaN must not be skipped here, but it need not win either:
                // a NaN input reaches the sum through `exp(x - max)` and poisons the row.
                if o > self { o } else { self }
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn recip(self) -> Self {
                1.0 / self
            }
            const NEG_INF: Self = <$t>::NEG_INFINITY;
        }
    };
}
softmax_float!(f32);
softmax_float!(f64);

/// Softmax (or log-softmax) of `src` along `dim`, into a new contiguous storage.
pub(crate) fn softmax(src: &CpuStorage, l: &Layout, dim: usize, log: bool) -> Result<CpuStorage> {
    match src.dtype() {
        DType::F32 => softmax_t::<f32>(src, l, dim, log),
        DType::F64 => softmax_t::<f64>(src, l, dim, log),
        d => Err(TensorError::UnsupportedDType {
            op: if log { "log_softmax" } else { "softmax" },
            dtype: d,
            hint: "the CPU kernel computes in f32 or f64",
        }),
    }
}

fn softmax_t<T: SoftmaxFloat>(
    src: &CpuStorage,
    l: &Layout,
    dim: usize,
    log: bool,
) -> Result<CpuStorage> {
    let dims = l.dims();
    let Some(&size) = dims.get(dim) else {
        return Err(TensorError::invalid(
            "softmax",
            format!("dim {dim} out of range for rank {}", dims.len()),
        ));
    };
    let inner: usize = dims[dim + 1..].iter().product();
    let n = l.numel();
    let owned;
    let x: &[T] = match super::contiguous_slice(src.as_slice::<T>()?, l) {
        Some(x) => x,
        None => {
            owned = super::cast(src, l, T::DTYPE)?;
            owned.as_slice::<T>()?
        }
    };
    if n == 0 || size == 0 {
        return CpuStorage::from_slice(x);
    }
    let mut out = CpuStorage::from_chunks(n, |_| std::iter::empty::<T>())?;
    let y = out.as_mut_slice::<T>()?;
    let block = size * inner;
    // `#[inline(always)]` on the closure and on `rows`: a large closure called from
    // `widest`'s three paths is otherwise not inlined into the trampolines and stays SSE2
    // code (seen with `perf annotate`).
    let run = |xs: &[T], ys: &mut [T]| {
        super::simd::widest(
            #[inline(always)]
            || rows(xs, ys, size, inner, log),
        );
    };
    if n >= PAR_THRESHOLD && n / block > 1 {
        // Whole blocks per task, at least PAR_THRESHOLD elements each.
        let per = block * (PAR_THRESHOLD / block).max(1);
        for_each_chunk_mut(y, per, |i, ys| {
            let start = i * per;
            run(x.get(start..start + ys.len()).unwrap_or(&[]), ys);
        });
    } else {
        run(x, y);
    }
    Ok(out)
}

/// Per row of contiguous `[rows, c]` scores (`c > 0`): the max and `ln Σ exp(x - max)`,
/// the two terms [`row`] subtracts, so `(x - max) - ln Σ` is `log_softmax` to the bit.
/// For the fused cross-entropy, which needs the log-probability at the target alone.
pub(crate) fn row_log_normalizers<T: SoftmaxFloat>(x: &[T], c: usize) -> Vec<(T, T)> {
    let rows = x.len() / c.max(1);
    let mut out = vec![(T::ZERO, T::ZERO); rows];
    if c == 0 {
        return out;
    }
    let run = |xs: &[T], os: &mut [(T, T)]| {
        super::simd::widest(
            #[inline(always)]
            || {
                for (r, o) in xs.chunks_exact(c).zip(os.iter_mut()) {
                    let m = row_max(r);
                    *o = (m, sum_exp(r, m).ln());
                }
            },
        );
    };
    let per = (PAR_THRESHOLD / c).max(1);
    if x.len() >= PAR_THRESHOLD && rows > per {
        for_each_chunk_mut(&mut out, per, |i, os| {
            let start = i * per * c;
            run(x.get(start..start + os.len() * c).unwrap_or(&[]), os);
        });
    } else {
        run(x, &mut out);
    }
    out
}

/// Every row of `x` (whole `[size, inner]` blocks) into `y`.
#[inline(always)]
fn rows<T: SoftmaxFloat>(x: &[T], y: &mut [T], size: usize, inner: usize, log: bool) {
    let block = size * inner;
    for (xb, yb) in x.chunks(block).zip(y.chunks_mut(block)) {
        if inner == 1 {
            row(xb, yb, log);
        } else {
            block_rows(xb, yb, size, inner, log);
        }
    }
}

/// Sum of `exp(x - m)`: `exp` into a small buffer (a plain map loop, which vectorises as
/// the elementwise `exp` does), then added into 16 independent accumulators. Written as
/// one loop with the accumulators, LLVM vectorised `exp` poorly (scalar FMAs and shuffles,
/// seen with `perf annotate`).
#[inline(always)]
fn sum_exp<T: SoftmaxFloat>(x: &[T], m: T) -> T {
    const LANES: usize = 16;
    const BUF: usize = 4 * LANES;
    let mut buf = [T::ZERO; BUF];
    let mut lanes = [T::ZERO; LANES];
    let chunks = x.chunks_exact(BUF);
    let rest = chunks.remainder();
    for c in chunks {
        buf.iter_mut()
            .zip(c)
            .for_each(|(o, &v)| *o = (v - m).fast_exp());
        for part in buf.chunks_exact(LANES) {
            for (a, &e) in lanes.iter_mut().zip(part) {
                *a = a.add(e);
            }
        }
    }
    let mut s = rest.iter().fold(T::ZERO, |a, &v| a.add((v - m).fast_exp()));
    for a in lanes {
        s = s.add(a);
    }
    s
}

/// The row's maximum, with 16 independent lanes (a single running max does not vectorise).
#[inline(always)]
fn row_max<T: SoftmaxFloat>(x: &[T]) -> T {
    let mut lanes = [T::NEG_INF; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in lanes.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    lanes.iter().chain(rest).fold(T::NEG_INF, |a, &v| a.max(v))
}

/// One contiguous row. Inlined into `simd::widest`'s trampoline with everything it calls, so
/// it is compiled for the wide vector instructions.
#[inline(always)]
fn row<T: SoftmaxFloat>(x: &[T], y: &mut [T], log: bool) {
    let m = row_max(x);
    if log {
        // (x - max) - ln Σ, not x - (max + ln Σ): the latter rounds at max's magnitude.
        let ln_s = sum_exp(x, m).ln();
        y.iter_mut().zip(x).for_each(|(o, &v)| *o = (v - m) - ln_s);
    } else {
        y.iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = (v - m).fast_exp());
        let mut lanes = [T::ZERO; 8];
        let chunks = y.chunks_exact(8);
        let rest: T = chunks.remainder().iter().fold(T::ZERO, |a, &v| a.add(v));
        for c in chunks {
            for (a, &v) in lanes.iter_mut().zip(c) {
                *a = a.add(v);
            }
        }
        let r = lanes.iter().fold(rest, |a, &v| a.add(v)).recip();
        y.iter_mut().for_each(|o| *o = o.mul(r));
    }
}

/// A block `[size, inner]`: `inner` rows, element `k` of row `j` at `k * inner + j`.
#[inline(always)]
fn block_rows<T: SoftmaxFloat>(x: &[T], y: &mut [T], size: usize, inner: usize, log: bool) {
    let mut m = vec![T::NEG_INF; inner];
    for xk in x.chunks_exact(inner).take(size) {
        m.iter_mut().zip(xk).for_each(|(a, &v)| *a = a.max(v));
    }
    let mut s = vec![T::ZERO; inner];
    for xk in x.chunks_exact(inner).take(size) {
        s.iter_mut()
            .zip(xk.iter().zip(&m))
            .for_each(|(a, (&v, &mj))| *a = a.add((v - mj).fast_exp()));
    }
    if log {
        // ln s_j, kept in `s`; y = (x - m) - ln s as in `row`.
        s.iter_mut().for_each(|a| *a = a.ln());
        for (yk, xk) in y.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
            yk.iter_mut()
                .zip(xk.iter().zip(m.iter().zip(&s)))
                .for_each(|(o, (&v, (&mj, &ls)))| *o = (v - mj) - ls);
        }
    } else {
        s.iter_mut().for_each(|a| *a = a.recip());
        for (yk, xk) in y.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
            yk.iter_mut()
                .zip(xk.iter().zip(m.iter().zip(&s)))
                .for_each(|(o, (&v, (&mj, &r)))| *o = (v - mj).fast_exp().mul(r));
        }
    }
}
