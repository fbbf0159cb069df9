//! CPU matrix products, `C = A @ B` over broadcast batch dims, into a fresh contiguous C.
//!
//! - f32, f16, bf16: `ember-gemm` on the operands' own storage and strides (nothing is
//!   copied here; ember-gemm widens 16-bit operands itself where its backend needs f32),
//!   accumulating in f32 as PyTorch does, written straight into the output. See
//!   Note [Matmul batches as GEMM views].
//! - f64 and integers: a row-parallel i-k-j loop here (the inner loop runs along a packed row
//!   of B and a row of accumulators, so it vectorises); f64 accumulates in f64, integers in
//!   wrapping i64. ember-gemm has no f64 kernel, and these dtypes are for checking, not
//!   training.

use ember_gemm::parallel::{for_each_chunk_mut, try_for_each_chunk_mut};

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::CpuStorage;

// Note [Matmul batches as GEMM views]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The kernel gets A `[batch.., m, k]` and B `[batch.., k, n]` whose batch dims are already
// broadcast (stride 0 where an operand repeats). Batch dims of size 1 are dropped. The
// innermost run of the remaining batch dims that both A and B step through with a single
// stride each (dim i folds into the run below it when its stride is the run's stride times
// the run's count; 0 = 0·count folds a broadcast) becomes one ember-gemm batch
// `(count, stride_a, stride_b)`; C is contiguous, so it always folds. Batch dims left
// outside that run are iterated, one batched call per index. Contiguous operands, operands
// with their last two dims transposed, and `[b.., m, k] @ [k, n]` (B's batch strides all 0)
// make a single call; mixed broadcasts such as `[5, 1, m, k] @ [7, k, n]` iterate (5 calls
// of 7), as do batch dims permuted in memory.
// An operand with batch stride 0 is passed as a batch of 1, which ember-gemm broadcasts
// without widening it once per member. The f64/integer loop walks the same (outer × run)
// offsets one matrix at a time.

/// Products (or batches of them) of at least this many multiply-adds use every thread.
const PAR_MACS: usize = 1 << 17;

fn corrupt(what: &str) -> TensorError {
    TensorError::invalid("matmul", format!("{what} (internal error)"))
}

/// The checked shape of a batched product and where its batch members sit.
#[derive(Debug)]
struct Geometry {
    m: usize,
    k: usize,
    n: usize,
    /// A's (row, column) strides.
    a_rc: (usize, usize),
    /// B's (row, column) strides.
    b_rc: (usize, usize),
    /// The batch dims left outside the folded run, as layouts whose strided indices are A's
    /// and B's start offsets for each outer index.
    outer_a: Layout,
    outer_b: Layout,
    /// The folded run: `count` members, A's and B's strides between them.
    count: usize,
    run_a: usize,
    run_b: usize,
    /// Elements of the output (0 when any of its dims is 0).
    out_len: usize,
}

impl Geometry {
    /// Checks the layouts against each other and against their storages' lengths (so every
    /// offset computed from the result is in bounds), and folds the batch dims.
    fn new(la: &Layout, a_len: usize, lb: &Layout, b_len: usize) -> Result<Geometry> {
        let r = la.rank();
        if r < 2 || lb.rank() != r || la.dims()[..r - 2] != lb.dims()[..r - 2] {
            return Err(corrupt(
                "kernel expects [batch.., m, k] x [batch.., k, n] with equal batch dims",
            ));
        }
        let (m, k, n) = (la.dims()[r - 2], la.dims()[r - 1], lb.dims()[r - 1]);
        if lb.dims()[r - 2] != k {
            return Err(corrupt("inner dimensions differ"));
        }
        if (la.numel() > 0 && la.max_extent() > a_len)
            || (lb.numel() > 0 && lb.max_extent() > b_len)
        {
            return Err(corrupt("layout reaches outside its storage"));
        }
        let bdims = &la.dims()[..r - 2];
        let all = || bdims.iter().chain([&m, &n]);
        let out_len = if all().any(|&d| d == 0) {
            0
        } else {
            all()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| TensorError::TooLarge {
                    op: "matmul",
                    shape: format!("{:?}", all().collect::<Vec<_>>()),
                })?
        };
        // (size, A stride, B stride) of the batch dims that matter.
        let kept: Vec<(usize, usize, usize)> = (0..r - 2)
            .filter(|&i| bdims[i] != 1)
            .map(|i| (bdims[i], la.strides()[i], lb.strides()[i]))
            .collect();
        let (mut count, mut run_a, mut run_b) = (1usize, 0usize, 0usize);
        let mut split = kept.len();
        while let Some(&(d, sa, sb)) = split.checked_sub(1).and_then(|i| kept.get(i)) {
            if count == 1 {
                (count, run_a, run_b) = (d, sa, sb);
            } else if let Some(c) = count.checked_mul(d)
                && run_a.checked_mul(count) == Some(sa)
                && run_b.checked_mul(count) == Some(sb)
            {
                count = c;
            } else {
                break;
            }
            split -= 1;
        }
        let outer = |l: &Layout, stride: fn(&(usize, usize, usize)) -> usize| {
            let dims: Vec<usize> = kept[..split].iter().map(|x| x.0).collect();
            let strides = kept[..split].iter().map(stride).collect();
            Layout::new(dims.into(), strides, l.offset())
        };
        Ok(Geometry {
            m,
            k,
            n,
            a_rc: (la.strides()[r - 2], la.strides()[r - 1]),
            b_rc: (lb.strides()[r - 2], lb.strides()[r - 1]),
            outer_a: outer(la, |x| x.1),
            outer_b: outer(lb, |x| x.2),
            count,
            run_a,
            run_b,
            out_len,
        })
    }

    /// A's and B's start offsets for each outer index (one batched call each).
    fn outer(&self) -> Vec<(usize, usize)> {
        self.outer_a
            .strided_index()
            .zip(self.outer_b.strided_index())
            .collect()
    }
}

/// A new storage of `len` zeros.
fn zeros<T: WithDType>(len: usize) -> Result<CpuStorage> {
    CpuStorage::from_chunks(len, |r| std::iter::repeat_n(T::ZERO, r.len()))
}

/// Batched `C = A @ B`: `la` is `[batch.., m, k]`, `lb` is `[batch.., k, n]` (batch dims
/// already broadcast, stride 0 allowed). Output `[batch.., m, n]`, contiguous.
pub(crate) fn matmul(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    if a.dtype() != b.dtype() {
        return Err(corrupt("operands of different dtypes"));
    }
    let g = Geometry::new(la, a.len(), lb, b.len())?;
    match a.dtype() {
        DType::F32 => gemm_path::<f32>(a, b, &g),
        DType::F16 => gemm_path::<half::f16>(a, b, &g),
        DType::Bf16 => gemm_path::<half::bf16>(a, b, &g),
        DType::F64 => loop_path::<f64, f64>(a, b, &g),
        DType::I64 => loop_path::<i64, i64>(a, b, &g),
        DType::I32 => loop_path::<i32, i64>(a, b, &g),
        DType::U8 => loop_path::<u8, i64>(a, b, &g),
        DType::Bool => Err(TensorError::unsupported("matmul", DType::Bool)),
    }
}

// --- f32, f16, bf16: ember-gemm --------------------------------------------------------

fn gemm_path<T: WithDType + ember_gemm::Element>(
    a: &CpuStorage,
    b: &CpuStorage,
    g: &Geometry,
) -> Result<CpuStorage> {
    use ember_gemm::{MatMut, MatRef, Parallelism};
    let (da, db) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    let mut out = zeros::<T>(g.out_len)?;
    let (m, k, n) = (g.m, g.k, g.n);
    // Empty, or k == 0: the zeros are the answer.
    if g.out_len == 0 || k == 0 {
        return Ok(out);
    }
    let c = out.as_mut_slice::<T>()?;
    let per_call = g.count * m * n;
    let call_macs = per_call.saturating_mul(k);
    // A broadcast operand is a batch of 1 (see the Note).
    let (ba, bb) = (
        if g.run_a == 0 { 1 } else { g.count },
        if g.run_b == 0 { 1 } else { g.count },
    );
    let one = |(oa, ob): (usize, usize), cb: &mut [T], par: Parallelism| -> Result<()> {
        // An offset past the end can only come with an empty view (Geometry checked the
        // extents); ember-gemm rejects anything else as out of bounds.
        let av =
            MatRef::new(da.get(oa..).unwrap_or(&[]), m, k, g.a_rc.0, g.a_rc.1).batched(ba, g.run_a);
        let bv =
            MatRef::new(db.get(ob..).unwrap_or(&[]), k, n, g.b_rc.0, g.b_rc.1).batched(bb, g.run_b);
        let cv = MatMut::row_major(cb, m, n).batched(g.count, m * n);
        ember_gemm::gemm(av, bv, cv, 1.0, 0.0, par)
            .map_err(|e| TensorError::invalid("matmul", e.to_string()))?;
        Ok(())
    };
    let outer = g.outer();
    if outer.len() > 1 && call_macs < PAR_MACS && call_macs.saturating_mul(outer.len()) >= PAR_MACS
    {
        // Many small calls: one per task.
        try_for_each_chunk_mut(c, per_call, |i, cb| match outer.get(i) {
            Some(&o) => one(o, cb, Parallelism::None),
            None => Ok(()),
        })
    } else {
        let par = if call_macs >= PAR_MACS {
            Parallelism::All
        } else {
            Parallelism::None
        };
        c.chunks_mut(per_call)
            .zip(outer)
            .try_for_each(|(cb, o)| one(o, cb, par))
    }?;
    Ok(out)
}

// --- f64 and integers: the i-k-j loop ------------------------------------------------------

/// An accumulator type.
trait Acc: Copy + Send + Sync + Default {
    fn fma(self, a: Self, b: Self) -> Self;
    fn from_elem<T: WithDType>(x: T) -> Self;
    fn to_elem<T: WithDType>(self) -> T;
}

impl Acc for f64 {
    #[inline(always)]
    fn fma(self, a: f64, b: f64) -> f64 {
        self + a * b
    }
    #[inline(always)]
    fn from_elem<T: WithDType>(x: T) -> f64 {
        x.to_f64()
    }
    #[inline(always)]
    fn to_elem<T: WithDType>(self) -> T {
        T::from_f64(self)
    }
}

impl Acc for i64 {
    #[inline(always)]
    fn fma(self, a: i64, b: i64) -> i64 {
        self.wrapping_add(a.wrapping_mul(b))
    }
    #[inline(always)]
    fn from_elem<T: WithDType>(x: T) -> i64 {
        x.to_i64()
    }
    #[inline(always)]
    fn to_elem<T: WithDType>(self) -> T {
        T::from_i64(self)
    }
}

/// B of one batch member packed row-major as accumulators, kept while consecutive members
/// share it (a broadcast B is packed once).
#[derive(Debug, Default)]
struct PackedB<A> {
    data: Vec<A>,
    from: Option<usize>,
}

impl<A: Acc> PackedB<A> {
    fn pack<T: WithDType>(&mut self, db: &[T], ob: usize, g: &Geometry) {
        if self.from == Some(ob) {
            return;
        }
        let (k, n, (rs, cs)) = (g.k, g.n, g.b_rc);
        self.data.clear();
        self.data.reserve(k * n);
        for p in 0..k {
            let row = ob + p * rs;
            if cs == 1 {
                self.data
                    .extend(db[row..row + n].iter().map(|&x| A::from_elem(x)));
            } else {
                self.data
                    .extend((0..n).map(|j| A::from_elem(db[row + j * cs])));
            }
        }
        self.from = Some(ob);
    }
}

fn loop_path<T: WithDType, A: Acc>(
    a: &CpuStorage,
    b: &CpuStorage,
    g: &Geometry,
) -> Result<CpuStorage> {
    let (da, db) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    let mut out = zeros::<T>(g.out_len)?;
    let (m, k, n) = (g.m, g.k, g.n);
    if g.out_len == 0 || k == 0 {
        return Ok(out);
    }
    let c = out.as_mut_slice::<T>()?;
    let offsets: Vec<(usize, usize)> = g
        .outer()
        .into_iter()
        .flat_map(|(oa, ob)| (0..g.count).map(move |j| (oa + j * g.run_a, ob + j * g.run_b)))
        .collect();
    let macs = m.saturating_mul(n).saturating_mul(k);
    // One matrix: rows of C, each accumulated in `acc` then converted once.
    let product = |oa: usize, pb: &[A], cb: &mut [T], par: bool| {
        let (rs, cs) = g.a_rc;
        let row = |acc: &mut Vec<A>, (i, crow): (usize, &mut [T])| {
            acc.clear();
            acc.resize(n, A::default());
            let arow = oa + i * rs;
            for (p, brow) in pb.chunks_exact(n).enumerate() {
                let av = A::from_elem(da[arow + p * cs]);
                for (cv, &bv) in acc.iter_mut().zip(brow) {
                    *cv = cv.fma(av, bv);
                }
            }
            for (o, &v) in crow.iter_mut().zip(acc.iter()) {
                *o = v.to_elem();
            }
        };
        if par {
            // Rows in groups, about four per thread, each with its own accumulator.
            let per = m.div_ceil(4 * rayon::current_num_threads()).max(1);
            for_each_chunk_mut(cb, per * n, |t, rows| {
                let mut acc = Vec::new();
                for (r, crow) in rows.chunks_mut(n).enumerate() {
                    row(&mut acc, (t * per + r, crow));
                }
            });
        } else {
            let mut acc = Vec::new();
            cb.chunks_mut(n).enumerate().for_each(|x| row(&mut acc, x));
        }
    };
    if offsets.len() > 1 && macs < PAR_MACS && macs.saturating_mul(offsets.len()) >= PAR_MACS {
        // Many small matrices: one per task.
        // Matrices in groups, about four per thread, each with its own packed B.
        let per = offsets
            .len()
            .div_ceil(4 * rayon::current_num_threads())
            .max(1);
        for_each_chunk_mut(c, per * m * n, |t, cs| {
            let mut pb = PackedB::default();
            for (j, cb) in cs.chunks_mut(m * n).enumerate() {
                if let Some(&(oa, ob)) = offsets.get(t * per + j) {
                    pb.pack(db, ob, g);
                    product(oa, &pb.data, cb, false);
                }
            }
        });
    } else {
        let mut pb = PackedB::default();
        for (cb, (oa, ob)) in c.chunks_mut(m * n).zip(offsets) {
            pb.pack(db, ob, g);
            product(oa, &pb.data, cb, macs >= PAR_MACS);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(da: &[usize], sa: &[usize], db: &[usize], sb: &[usize]) -> Geometry {
        let (la, lb) = (
            Layout::new(da.to_vec().into(), sa.to_vec(), 0),
            Layout::new(db.to_vec().into(), sb.to_vec(), 0),
        );
        let g = Geometry::new(&la, la.max_extent(), &lb, lb.max_extent());
        g.unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn batch_dims_fold_into_one_run_where_strides_allow() {
        // Contiguous [4, 3, m, k] @ broadcast [k, n]: one call of 12.
        let g = geometry(&[4, 3, 2, 5], &[30, 10, 5, 1], &[4, 3, 5, 6], &[0, 0, 6, 1]);
        assert_eq!((g.count, g.run_a, g.run_b, g.outer().len()), (12, 10, 0, 1));
        // Size-1 batch dims are ignored whatever their stride.
        let g = geometry(
            &[4, 1, 2, 5],
            &[10, 99, 5, 1],
            &[4, 1, 5, 6],
            &[30, 7, 6, 1],
        );
        assert_eq!((g.count, g.run_a, g.run_b, g.outer().len()), (4, 10, 30, 1));
        // [5, 1, m, k] @ [7, k, n] broadcast to [5, 7]: a run of 7, iterated 5 times.
        let g = geometry(&[5, 7, 2, 3], &[6, 0, 3, 1], &[5, 7, 3, 4], &[0, 12, 4, 1]);
        assert_eq!((g.count, g.run_a, g.run_b), (7, 0, 12));
        assert_eq!(g.outer(), vec![(0, 0), (6, 0), (12, 0), (18, 0), (24, 0)]);
        assert_eq!(g.out_len, 35 * 2 * 4);
        // No batch dims.
        let g = geometry(&[2, 3], &[3, 1], &[3, 4], &[1, 3]);
        assert_eq!((g.count, g.outer().len(), g.out_len), (1, 1, 8));
    }

    #[test]
    fn bad_layouts_are_errors() {
        let l = |d: &[usize]| Layout::contiguous(d.to_vec());
        assert!(Geometry::new(&l(&[2, 3]), 6, &l(&[4, 2]), 8).is_err());
        assert!(Geometry::new(&l(&[2, 3]), 5, &l(&[3, 2]), 6).is_err());
        assert!(Geometry::new(&l(&[3]), 3, &l(&[3, 2]), 6).is_err());
        assert!(Geometry::new(&l(&[2, 2, 3]), 12, &l(&[3, 3, 2]), 18).is_err());
        // Output element count overflows: an error, not a panic.
        let big = Layout::new(vec![usize::MAX / 2, 2, 1].into(), vec![0, 0, 0], 0);
        let bigb = Layout::new(vec![usize::MAX / 2, 1, 2].into(), vec![0, 0, 0], 0);
        assert!(matches!(
            Geometry::new(&big, 1, &bigb, 1),
            Err(TensorError::TooLarge { .. })
        ));
    }
}
