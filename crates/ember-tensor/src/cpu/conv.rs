//! CPU 2-D convolution: im2col + GEMM. See Note [Conv2d as im2col + GEMM].
//!
//! f32, f16 and bf16 compute in f32 through `ember-gemm`; f64 computes in f64 with a
//! row-parallel i-k-j loop here (ember-gemm has no f64 kernel, and f64 convolutions are
//! for checking, not training).

use ember_gemm::parallel::for_each_chunk_mut;

use crate::backend_nn::Conv2dParams;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{CpuStorage, PAR_THRESHOLD};

// Note [Conv2d as im2col + GEMM]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With K = C/groups·kH·kW and L = out_h·out_w, sample n's columns form a matrix
// `col[n]` of shape [C·kH·kW, L]: row (c, i, j), column (oh, ow) holds
// x[n, c, oh·sh - ph + i·dh, ow·sw - pw + j·dw] (0 in the padding). Group g's rows are
// the K rows starting at g·K, so with the weight packed as [O, K],
//     out[n, g·Og .. (g+1)·Og, :] = W[g·Og .. (g+1)·Og, :] · col[n][g·K .. (g+1)·K, :]
// — one batched GEMM per group over the samples (A broadcast over the batch, B and C
// batched with strides C·kH·kW·L and O·L). The output starts as the bias, so the GEMM
// accumulates with beta = 1. im2col reads the input through its strides, so
// non-contiguous inputs cost nothing extra; samples are processed in chunks so `col` stays
// under COL_BUDGET elements. The backward pass (autograd, later) is the same two GEMMs
// transposed plus col2im, over the same geometry in `Conv2dParams`.

/// Most elements of the im2col buffer at once (64 MiB of f32).
const COL_BUDGET: usize = 16 * 1024 * 1024;

/// Products of at least this many multiply-adds use every thread.
const GEMM_PAR_FLOPS: usize = 1 << 17;

fn corrupt() -> TensorError {
    super::corrupt("conv2d")
}

fn check_layout(len: usize, l: &Layout, rank: usize) -> Result<()> {
    if l.rank() != rank || (l.numel() > 0 && l.max_extent() > len) {
        return Err(corrupt());
    }
    Ok(())
}

/// The compute type of a convolution and its batched GEMM.
trait Acc: WithDType + std::ops::Mul<Output = Self> + std::ops::AddAssign {
    /// For `b` in `0..batch`: `c[b·cs ..][m×n] += a[m×k] · bm[b·bs ..][k×n]`, all row-major.
    #[allow(clippy::too_many_arguments)]
    fn gemm_acc(
        a: &[Self],
        bm: &[Self],
        c: &mut [Self],
        mkn: (usize, usize, usize),
        batch: usize,
        bs: usize,
        cs: usize,
    ) -> Result<()>;
}

impl Acc for f32 {
    fn gemm_acc(
        a: &[f32],
        bm: &[f32],
        c: &mut [f32],
        (m, k, n): (usize, usize, usize),
        batch: usize,
        bs: usize,
        cs: usize,
    ) -> Result<()> {
        use ember_gemm::{MatMut, MatRef, Parallelism};
        let par = if m * n * k * batch >= GEMM_PAR_FLOPS {
            Parallelism::All
        } else {
            Parallelism::None
        };
        ember_gemm::gemm(
            MatRef::row_major(a, m, k),
            MatRef::row_major(bm, k, n).batched(batch, bs),
            MatMut::new(c, m, n, n, 1).batched(batch, cs),
            1.0,
            1.0,
            par,
        )
        .map_err(|e| TensorError::invalid("conv2d", e.to_string()))?;
        Ok(())
    }
}

impl Acc for f64 {
    fn gemm_acc(
        a: &[f64],
        bm: &[f64],
        c: &mut [f64],
        (m, k, n): (usize, usize, usize),
        batch: usize,
        bs: usize,
        cs: usize,
    ) -> Result<()> {
        let one = |(bi, cb): (usize, &mut [f64])| {
            let Some(bb) = bm.get(bi * bs..) else { return };
            for (i, crow) in cb.chunks_mut(n).take(m).enumerate() {
                for p in 0..k {
                    let av = a.get(i * k + p).copied().unwrap_or(0.0);
                    let Some(brow) = bb.get(p * n..(p + 1) * n) else {
                        return;
                    };
                    for (cv, &bv) in crow.iter_mut().zip(brow) {
                        *cv += av * bv;
                    }
                }
            }
        };
        if (batch - 1) * cs + m * n > c.len() || (batch - 1) * bs + k * n > bm.len() {
            return Err(corrupt());
        }
        let cs = cs.max(1);
        let c = c.get_mut(..c.len().min(batch * cs)).ok_or_else(corrupt)?;
        if m * n * k * batch >= GEMM_PAR_FLOPS {
            for_each_chunk_mut(c, cs, |bi, cb| one((bi, cb)));
        } else {
            c.chunks_mut(cs).enumerate().for_each(one);
        }
        Ok(())
    }
}

/// `[N, O, out_h, out_w]` = conv2d(x, w) + bias, contiguous, in `x`'s dtype.
pub(crate) fn conv2d(
    x: &CpuStorage,
    lx: &Layout,
    w: &CpuStorage,
    lw: &Layout,
    bias: Option<(&CpuStorage, &Layout)>,
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    match x.dtype() {
        DType::F32 => conv_acc::<f32, f32>(x, lx, w, lw, bias, p),
        DType::F16 => conv_acc::<half::f16, f32>(x, lx, w, lw, bias, p),
        DType::Bf16 => conv_acc::<half::bf16, f32>(x, lx, w, lw, bias, p),
        DType::F64 => conv_acc::<f64, f64>(x, lx, w, lw, bias, p),
        d => Err(TensorError::unsupported("conv2d", d)),
    }
}

fn conv_acc<T: WithDType, A: Acc>(
    x: &CpuStorage,
    lx: &Layout,
    w: &CpuStorage,
    lw: &Layout,
    bias: Option<(&CpuStorage, &Layout)>,
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    let (dx, dw) = (x.as_slice::<T>()?, w.as_slice::<T>()?);
    check_layout(dx.len(), lx, 4)?;
    check_layout(dw.len(), lw, 4)?;
    let &[n, c, h, wd] = lx.dims() else {
        return Err(corrupt());
    };
    let &[o, cg, kh, kw] = lw.dims() else {
        return Err(corrupt());
    };
    let g = p.groups.max(1);
    let (og, kk) = (o / g, kh * kw);
    let k = cg * kk;
    let (oh, ow) = p.out;
    let l = oh * ow;
    let conv = |v: T| A::from_f64(v.to_f64());

    // Weight packed as [O, K], bias as [O].
    let wbuf: Vec<A> = lw
        .strided_index()
        .map(|i| dw.get(i).copied().map_or(A::ZERO, conv))
        .collect();
    let bbuf: Vec<A> = match bias {
        Some((b, lb)) => {
            let db = b.as_slice::<T>()?;
            check_layout(db.len(), lb, 1)?;
            lb.strided_index()
                .map(|i| db.get(i).copied().map_or(A::ZERO, conv))
                .collect()
        }
        None => vec![A::ZERO; o],
    };
    let mut out: Vec<A> = Vec::with_capacity(n * o * l);
    for _ in 0..n {
        for &b in &bbuf {
            out.extend(std::iter::repeat_n(b, l));
        }
    }

    if k > 0 && l > 0 && og > 0 && n > 0 {
        let rows = c * kk; // rows of one sample's col matrix (= g·K)
        let per_sample = rows * l;
        let nb = (COL_BUDGET / per_sample.max(1)).clamp(1, n);
        let mut col: Vec<A> = vec![A::ZERO; nb * per_sample];
        let (sn, sc, sh, sw) = (
            lx.strides()[0],
            lx.strides()[1],
            lx.strides()[2],
            lx.strides()[3],
        );
        let mut n0 = 0;
        while n0 < n {
            let nc = nb.min(n - n0);
            let col = &mut col[..nc * per_sample];
            // im2col: one row per (sample, channel, i, j).
            let fill = |(r, row): (usize, &mut [A])| {
                let (s, rem) = (n0 + r / rows, r % rows);
                let (ci, ij) = (rem / kk, rem % kk);
                let (i, j) = (ij / kw, ij % kw);
                let base = lx.offset() + s * sn + ci * sc;
                for (y, out_row) in row.chunks_mut(ow).enumerate() {
                    let iy = (y * p.stride.0 + i * p.dilation.0) as isize - p.pad.0 as isize;
                    if iy < 0 || iy >= h as isize {
                        out_row.fill(A::ZERO);
                        continue;
                    }
                    let rbase = base + iy as usize * sh;
                    for (xo, v) in out_row.iter_mut().enumerate() {
                        let ix = (xo * p.stride.1 + j * p.dilation.1) as isize - p.pad.1 as isize;
                        *v = if ix < 0 || ix >= wd as isize {
                            A::ZERO
                        } else {
                            dx.get(rbase + ix as usize * sw)
                                .copied()
                                .map_or(A::ZERO, conv)
                        };
                    }
                }
            };
            if col.len() >= PAR_THRESHOLD {
                for_each_chunk_mut(col, l, |i, c| fill((i, c)));
            } else {
                col.chunks_mut(l).enumerate().for_each(fill);
            }
            for gi in 0..g {
                let a = wbuf.get(gi * og * k..).ok_or_else(corrupt)?;
                let bm = col.get(gi * k * l..).ok_or_else(corrupt)?;
                let cm = out.get_mut((n0 * o + gi * og) * l..).ok_or_else(corrupt)?;
                A::gemm_acc(a, bm, cm, (og, k, l), nc, per_sample, o * l)?;
            }
            n0 += nc;
        }
    }
    let out = &out;
    CpuStorage::from_chunks(out.len(), |r| {
        out[r].iter().map(|&v| T::from_f64(v.to_f64()))
    })
}
