//! CPU matrix products: a simple row-parallel kernel (i-k-j loop order, so the inner loop
//! runs along contiguous rows of B and C and vectorises). f16/bf16 accumulate in f32,
//! integers in wrapping i64. The fast GEMM (see CPU-NOTES.md) is a later decision; this is
//! the correctness baseline it will be checked against.

use rayon::prelude::*;

use crate::cpu::dispatch;
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{CpuStorage, PAR_THRESHOLD};

/// An accumulator type.
trait Acc: Copy + Send + Sync + Default {
    fn fma(self, a: Self, b: Self) -> Self;
    fn from_elem<T: WithDType>(x: T) -> Self;
    fn to_elem<T: WithDType>(self) -> T;
}

impl Acc for f32 {
    #[inline(always)]
    fn fma(self, a: f32, b: f32) -> f32 {
        self + a * b
    }
    fn from_elem<T: WithDType>(x: T) -> f32 {
        x.to_f64() as f32
    }
    fn to_elem<T: WithDType>(self) -> T {
        T::from_f64(self as f64)
    }
}

impl Acc for f64 {
    #[inline(always)]
    fn fma(self, a: f64, b: f64) -> f64 {
        self + a * b
    }
    fn from_elem<T: WithDType>(x: T) -> f64 {
        x.to_f64()
    }
    fn to_elem<T: WithDType>(self) -> T {
        T::from_f64(self)
    }
}

impl Acc for i64 {
    #[inline(always)]
    fn fma(self, a: i64, b: i64) -> i64 {
        self.wrapping_add(a.wrapping_mul(b))
    }
    fn from_elem<T: WithDType>(x: T) -> i64 {
        x.to_i64()
    }
    fn to_elem<T: WithDType>(self) -> T {
        T::from_i64(self)
    }
}

/// Batched `C = A @ B`: `la` is `[batch.., m, k]`, `lb` is `[batch.., k, n]` (batch dims
/// already broadcast, stride 0 allowed). Output `[batch.., m, n]`, contiguous.
pub(crate) fn matmul(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    match a.dtype() {
        d if d.is_float() && d != crate::dtype::DType::F64 => {
            dispatch!(d, T => matmul_acc::<T, f32>(a, la, b, lb))
        }
        crate::dtype::DType::F64 => matmul_acc::<f64, f64>(a, la, b, lb),
        d => dispatch!(d, T => matmul_acc::<T, i64>(a, la, b, lb)),
    }
}

fn matmul_acc<T: WithDType, A: Acc>(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    let (da, db) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    let r = la.rank();
    if r < 2 || lb.rank() != r {
        return Err(TensorError::invalid(
            "matmul",
            "kernel expects [batch.., m, k] x [batch.., k, n]",
        ));
    }
    let (m, k, n) = (la.dims()[r - 2], la.dims()[r - 1], lb.dims()[r - 1]);
    let (sam, sak) = (la.strides()[r - 2], la.strides()[r - 1]);
    let (sbk, sbn) = (lb.strides()[r - 2], lb.strides()[r - 1]);
    let batch_a = Layout::new(
        la.dims()[..r - 2].to_vec().into(),
        la.strides()[..r - 2].to_vec(),
        la.offset(),
    );
    let batch_b = Layout::new(
        lb.dims()[..r - 2].to_vec().into(),
        lb.strides()[..r - 2].to_vec(),
        lb.offset(),
    );
    let get = |d: &[T], i: usize| d.get(i).copied().unwrap_or(T::ZERO);
    let mut out: Vec<T> = Vec::with_capacity(batch_a.numel() * m * n);
    for (oa, ob) in batch_a.strided_index().zip(batch_b.strided_index()) {
        // Pack both operands into contiguous accumulator-typed buffers.
        let pa: Vec<A> = (0..m * k)
            .map(|x| A::from_elem(get(da, oa + (x / k) * sam + (x % k) * sak)))
            .collect();
        let pb: Vec<A> = (0..k * n)
            .map(|x| A::from_elem(get(db, ob + (x / n) * sbk + (x % n) * sbn)))
            .collect();
        let mut c = vec![A::default(); m * n];
        let row = |(i, crow): (usize, &mut [A])| {
            for p in 0..k {
                let av = pa[i * k + p];
                let brow = &pb[p * n..(p + 1) * n];
                for (cv, &bv) in crow.iter_mut().zip(brow) {
                    *cv = cv.fma(av, bv);
                }
            }
        };
        if n > 0 {
            if m * n * k >= PAR_THRESHOLD * 8 {
                c.par_chunks_mut(n).enumerate().for_each(row);
            } else {
                c.chunks_mut(n).enumerate().for_each(row);
            }
        }
        out.extend(c.into_iter().map(A::to_elem::<T>));
    }
    CpuStorage::from_slice(&out)
}
