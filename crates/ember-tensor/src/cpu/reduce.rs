//! CPU reduction kernels: one driver ([`reduce_with`]) over a [`Fold`] per op.
//!
//! The driver splits the layout into the kept dims (one output each, row-major) and the
//! reduced dims. Each output folds its reduced elements: a plain slice when they are
//! contiguous, a precomputed offset table otherwise. Outputs run in parallel when there
//! are many; a reduction to few outputs over a long contiguous run splits that run across
//! threads and merges the partial results in order.

use ember_gemm::parallel::map_indices;

use crate::cpu::dispatch;
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::op::ReduceOp;
use crate::storage::{CpuStorage, PAR_THRESHOLD, par_chunk_len};
use crate::strided::{StridedIndex, coalesce};

/// A reduction: an accumulator folded over elements in order, partial results mergeable
/// (`merge(a, b)` with `a` from earlier elements).
trait Fold<T: WithDType>: Sync {
    type Acc: Copy + Send;
    fn init(&self) -> Self::Acc;
    fn step(&self, acc: Self::Acc, x: T, index: usize) -> Self::Acc;
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Folds a contiguous run whose first element has reduced-index `start`.
    fn fold_slice(&self, acc: Self::Acc, xs: &[T], start: usize) -> Self::Acc {
        xs.iter()
            .enumerate()
            .fold(acc, |a, (i, &x)| self.step(a, x, start + i))
    }
}

/// Sum in f64 (floats) with 8 independent lanes so the loop vectorises.
struct SumF;
impl<T: WithDType> Fold<T> for SumF {
    type Acc = f64;
    fn init(&self) -> f64 {
        0.0
    }
    fn step(&self, acc: f64, x: T, _: usize) -> f64 {
        acc + x.to_f64()
    }
    fn merge(&self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn fold_slice(&self, acc: f64, xs: &[T], _: usize) -> f64 {
        let mut lanes = [0f64; 8];
        let chunks = xs.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for (l, &x) in lanes.iter_mut().zip(c) {
                *l += x.to_f64();
            }
        }
        let tail: f64 = rest.iter().map(|x| x.to_f64()).sum();
        acc + lanes.iter().sum::<f64>() + tail
    }
}

/// Sum of f32: blocks of 4096 elements in 64 f32 lanes (vectorised, at memory speed), the
/// block totals in f64. PyTorch sums f32 in f32 with a cascade; this is at least as
/// accurate (each lane adds at most 64 values before going to f64).
///
/// 64 lanes are four AVX-512 registers (eight AVX2 ones) added independently: with 16 lanes,
/// one register, every add waited for the one before, which halved the rate on data in L1
/// and slowed it in L2.
struct SumF32;
impl Fold<f32> for SumF32 {
    type Acc = f64;
    fn init(&self) -> f64 {
        0.0
    }
    fn step(&self, acc: f64, x: f32, _: usize) -> f64 {
        acc + x as f64
    }
    fn merge(&self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn fold_slice(&self, acc: f64, xs: &[f32], _: usize) -> f64 {
        crate::cpu::simd::widest(
            #[inline(always)]
            || sum_f32_blocks(acc, xs),
        )
    }
}

/// The body of [`SumF32::fold_slice`], inlined into `simd::widest`'s trampolines.
#[inline(always)]
fn sum_f32_blocks(acc: f64, xs: &[f32]) -> f64 {
    // Four accumulators of one AVX-512 register each, as four arrays indexed alike, which
    // LLVM keeps in registers (one array of 64 lanes, or an array of four, went through
    // the stack on every step).
    const W: usize = 16;
    const LANES: usize = 4 * W;
    let mut total = acc;
    for block in xs.chunks(64 * LANES) {
        let (mut l0, mut l1, mut l2, mut l3) = ([0f32; W], [0f32; W], [0f32; W], [0f32; W]);
        let chunks = block.chunks_exact(LANES);
        let mut sum = chunks.remainder().iter().map(|&x| x as f64).sum::<f64>();
        for c in chunks {
            let (c0, rest) = c.split_at(W);
            let (c1, rest) = rest.split_at(W);
            let (c2, c3) = rest.split_at(W);
            for i in 0..W {
                l0[i] += c0[i];
                l1[i] += c1[i];
                l2[i] += c2[i];
                l3[i] += c3[i];
            }
        }
        for i in 0..W {
            sum += (l0[i] as f64 + l1[i] as f64) + (l2[i] as f64 + l3[i] as f64);
        }
        total += sum;
    }
    total
}

/// Sum of integers (and bools) in i64, wrapping.
struct SumI;
impl<T: WithDType> Fold<T> for SumI {
    type Acc = i64;
    fn init(&self) -> i64 {
        0
    }
    fn step(&self, acc: i64, x: T, _: usize) -> i64 {
        acc.wrapping_add(x.to_i64())
    }
    fn merge(&self, a: i64, b: i64) -> i64 {
        a.wrapping_add(b)
    }
}

struct ProdF;
impl<T: WithDType> Fold<T> for ProdF {
    type Acc = f64;
    fn init(&self) -> f64 {
        1.0
    }
    fn step(&self, acc: f64, x: T, _: usize) -> f64 {
        acc * x.to_f64()
    }
    fn merge(&self, a: f64, b: f64) -> f64 {
        a * b
    }
}

struct ProdI;
impl<T: WithDType> Fold<T> for ProdI {
    type Acc = i64;
    fn init(&self) -> i64 {
        1
    }
    fn step(&self, acc: i64, x: T, _: usize) -> i64 {
        acc.wrapping_mul(x.to_i64())
    }
    fn merge(&self, a: i64, b: i64) -> i64 {
        a.wrapping_mul(b)
    }
}

/// Max (or min) with the index of its first occurrence; NaN wins and propagates.
struct Extreme {
    max: bool,
}
impl<T: WithDType + PartialOrd> Fold<T> for Extreme {
    // (value, index), None before the first element.
    type Acc = Option<(T, usize)>;
    fn init(&self) -> Self::Acc {
        None
    }
    #[allow(clippy::eq_op)]
    fn step(&self, acc: Self::Acc, x: T, i: usize) -> Self::Acc {
        match acc {
            None => Some((x, i)),
            Some((a, _)) if a != a => acc,
            Some((a, _)) => {
                let better = if self.max { x > a } else { x < a };
                if better || x != x { Some((x, i)) } else { acc }
            }
        }
    }
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc {
        match (a, b) {
            (None, b) => b,
            (a, None) => a,
            (Some(_), Some((x, i))) => self.step(a, x, i),
        }
    }
}

/// Runs `fold` for every output of reducing `dims` (sorted, unique) of layout `l`.
fn reduce_with<T, F, U>(
    src: &CpuStorage,
    l: &Layout,
    dims: &[usize],
    fold: &F,
    finish: impl Fn(F::Acc) -> U + Sync,
) -> Result<CpuStorage>
where
    T: WithDType,
    F: Fold<T>,
    U: WithDType,
{
    let data = src.as_slice::<T>()?;
    if l.numel() > 0 && l.max_extent() > data.len() {
        return Err(TensorError::invalid(
            "reduce",
            "layout outside storage (internal error)",
        ));
    }
    let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
    for (i, (&d, &s)) in l.dims().iter().zip(l.strides()).enumerate() {
        if dims.contains(&i) {
            rd.push(d);
            rs.push(s);
        } else {
            kd.push(d);
            ks.push(s);
        }
    }
    let kept = Layout::new(kd.into(), ks, l.offset());
    let red = Layout::new(rd.into(), rs, 0);
    let n_red = red.numel();
    let (cd, cs) = coalesce(red.dims(), red.strides());
    let contiguous_run = cd.is_empty() || (cd.len() == 1 && cs[0] == 1);
    let get = |i: usize| data.get(i).copied().unwrap_or(T::ZERO);

    // Few outputs over long contiguous runs: split each run across threads.
    // Pieces of `par_chunk_len` (a few per thread), not of `PAR_THRESHOLD`: each thread
    // then reads long stretches, which the hardware prefetchers follow, where 32K-element
    // pieces claimed in turn made both threads jump every 128 KiB.
    if contiguous_run && kept.numel() < 64 && n_red >= PAR_THRESHOLD {
        let chunk = par_chunk_len(n_red);
        let outs: Vec<U> = kept
            .strided_index()
            .map(|base| {
                let run = data.get(base..base + n_red).unwrap_or(&[]);
                let acc = map_indices(run.len().div_ceil(chunk), |c| {
                    let start = c * chunk;
                    let xs = run.get(start..(start + chunk).min(run.len()));
                    fold.fold_slice(fold.init(), xs.unwrap_or(&[]), start)
                })
                .into_iter()
                .fold(fold.init(), |a, b| fold.merge(a, b));
                finish(acc)
            })
            .collect();
        return CpuStorage::from_slice(&outs);
    }

    let offsets: Vec<usize> = if contiguous_run {
        Vec::new()
    } else {
        red.strided_index().collect()
    };
    let one = |base: usize| -> U {
        let acc = if contiguous_run {
            let run = data.get(base..base + n_red).unwrap_or(&[]);
            fold.fold_slice(fold.init(), run, 0)
        } else {
            offsets
                .iter()
                .enumerate()
                .fold(fold.init(), |a, (i, &o)| fold.step(a, get(base + o), i))
        };
        finish(acc)
    };
    CpuStorage::from_chunks(kept.numel(), |r| {
        let len = r.len();
        StridedIndex::from_position(&kept, r.start)
            .take(len)
            .map(one)
    })
}

pub(crate) fn empty_extreme(op: ReduceOp) -> TensorError {
    TensorError::invalid(
        op.name(),
        "expected reduction dim to be specified for input.numel() == 0, or a reduced dim of non-zero size",
    )
}

/// Reduces `dims` (sorted, unique) of `l` with `op`. Output dtypes: sum/prod of ints and
/// bools are i64, of floats their dtype; max/min keep the dtype; argmax/argmin are i64.
pub(crate) fn reduce(
    op: ReduceOp,
    src: &CpuStorage,
    l: &Layout,
    dims: &[usize],
) -> Result<CpuStorage> {
    let dt = src.dtype();
    let n_red: usize = dims.iter().map(|&d| l.dims()[d]).product();
    match op {
        ReduceOp::Sum if dt == crate::dtype::DType::F32 => {
            reduce_with::<f32, _, f32>(src, l, dims, &SumF32, |a| a as f32)
        }
        ReduceOp::Sum if dt.is_float() => {
            dispatch!(dt, T => reduce_with::<T, _, T>(src, l, dims, &SumF, T::from_f64))
        }
        ReduceOp::Sum => dispatch!(dt, T => reduce_with::<T, _, i64>(src, l, dims, &SumI, |a| a)),
        ReduceOp::Prod if dt.is_float() => {
            dispatch!(dt, T => reduce_with::<T, _, T>(src, l, dims, &ProdF, T::from_f64))
        }
        ReduceOp::Prod => dispatch!(dt, T => reduce_with::<T, _, i64>(src, l, dims, &ProdI, |a| a)),
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin => {
            if n_red == 0 {
                return Err(empty_extreme(op));
            }
            let fold = Extreme {
                max: matches!(op, ReduceOp::Max | ReduceOp::ArgMax),
            };
            let index = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
            dispatch!(dt, T => {
                if index {
                    reduce_with::<T, _, i64>(src, l, dims, &fold, |a| a.map_or(0, |(_, i)| i as i64))
                } else {
                    reduce_with::<T, _, T>(src, l, dims, &fold, |a| a.map_or(T::ZERO, |(v, _)| v))
                }
            })
        }
    }
}
