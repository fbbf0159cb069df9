//! The geometry every CPU convolution kernel shares, and the element types they run on.

use ember_gemm::{MatMut, MatRef, Parallelism};
use half::{bf16, f16};

use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::Conv2dParams;

/// One convolution: input `[n, c, h, w]`, weight `[o, cg, kh, kw]` in `g` groups, output
/// `[n, o, oh, ow]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geo {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub g: usize,
    pub cg: usize,
    pub og: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: Conv2dParams,
}

impl Geo {
    pub(crate) fn new(x: [usize; 4], wt: [usize; 4], p: &Conv2dParams) -> Geo {
        let g = p.groups.max(1);
        Geo {
            n: x[0],
            c: x[1],
            h: x[2],
            w: x[3],
            o: wt[0],
            g,
            cg: wt[1],
            og: wt[0] / g,
            kh: wt[2],
            kw: wt[3],
            oh: p.out.0,
            ow: p.out.1,
            p: *p,
        }
    }

    /// Kernel positions.
    pub(crate) fn kk(&self) -> usize {
        self.kh * self.kw
    }

    /// Columns of one group's weight matrix: `cg·kh·kw`.
    pub(crate) fn k(&self) -> usize {
        self.cg * self.kk()
    }

    /// Output positions per plane.
    pub(crate) fn l(&self) -> usize {
        self.oh * self.ow
    }

    /// Input positions per plane.
    pub(crate) fn hw(&self) -> usize {
        self.h * self.w
    }

    /// Rows of one sample's column matrix: `c·kh·kw` (all groups).
    pub(crate) fn rows(&self) -> usize {
        self.c * self.kk()
    }

    /// A 1×1 kernel with stride 1 and no padding: the input is its own column matrix.
    pub(crate) fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.p.stride == (1, 1) && self.p.pad == (0, 0)
    }

    /// Output positions `lo..hi` along one dim whose input index `p·stride + off` lies in
    /// `0..inp` (`out` positions in all).
    pub(crate) fn valid(out: usize, inp: usize, stride: usize, off: isize) -> (usize, usize) {
        let lo = if off >= 0 {
            0
        } else {
            off.unsigned_abs().div_ceil(stride)
        };
        let lim = inp as isize - off;
        let hi = if lim <= 0 {
            0
        } else {
            (lim as usize).div_ceil(stride)
        };
        let lo = lo.min(out);
        (lo, hi.min(out).max(lo))
    }

    /// Offset of kernel row `i` (column `j`) in input rows (columns): `i·d - pad`.
    pub(crate) fn off_h(&self, i: usize) -> isize {
        (i * self.p.dilation.0) as isize - self.p.pad.0 as isize
    }

    pub(crate) fn off_w(&self, j: usize) -> isize {
        (j * self.p.dilation.1) as isize - self.p.pad.1 as isize
    }
}

/// An `[N, C, H, W]` operand read through its strides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided {
    pub off: usize,
    pub sn: usize,
    pub sc: usize,
    pub sh: usize,
    pub sw: usize,
}

impl Strided {
    pub(crate) fn of(l: &Layout) -> Strided {
        let s = l.strides();
        Strided {
            off: l.offset(),
            sn: s.first().copied().unwrap_or(0),
            sc: s.get(1).copied().unwrap_or(0),
            sh: s.get(2).copied().unwrap_or(0),
            sw: s.get(3).copied().unwrap_or(0),
        }
    }

    /// Each plane's `H·W` elements are contiguous in row-major order.
    pub(crate) fn dense_planes(&self, w: usize) -> bool {
        self.sw == 1 && self.sh == w
    }
}

pub(crate) fn corrupt() -> TensorError {
    crate::cpu::corrupt("conv2d")
}

/// Products of at least this many multiply-adds use every thread.
const GEMM_PAR_FLOPS: usize = 1 << 17;

/// One (batched) product `C (m×n) ← A (m×k) · B (k×n) [+ C]`: each operand's (row, column,
/// batch) strides; C is dense rows (row stride n) with its own batch stride. A batch stride
/// of 0 broadcasts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prod {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: (usize, usize, usize),
    pub b: (usize, usize, usize),
    pub c_bs: usize,
}

/// A product with `Self` as C and `T` as A and B, accumulating in f32 (f64 for f64).
pub(crate) trait GemmOut<T>: WithDType {
    /// `C = A·B`, or `C += A·B` when `accumulate`.
    fn gemm(a: &[T], b: &[T], c: &mut [Self], p: Prod, accumulate: bool) -> Result<()>;
}

fn ember_gemm<T: ember_gemm::Element, O: ember_gemm::Element>(
    a: &[T],
    b: &[T],
    c: &mut [O],
    p: Prod,
    accumulate: bool,
) -> Result<()> {
    let par = if p.m * p.n * p.k * p.batch >= GEMM_PAR_FLOPS {
        Parallelism::All
    } else {
        Parallelism::None
    };
    ember_gemm::gemm(
        MatRef::new(a, p.m, p.k, p.a.0, p.a.1).batched(p.batch, p.a.2),
        MatRef::new(b, p.k, p.n, p.b.0, p.b.1).batched(p.batch, p.b.2),
        MatMut::new(c, p.m, p.n, p.n, 1).batched(p.batch, p.c_bs),
        1.0,
        if accumulate { 1.0 } else { 0.0 },
        par,
    )
    .map_err(|e| TensorError::invalid("conv2d", e.to_string()))?;
    Ok(())
}

macro_rules! gemm_out {
    ($($t:ty => $o:ty),*) => {$(
        impl GemmOut<$t> for $o {
            fn gemm(a: &[$t], b: &[$t], c: &mut [$o], p: Prod, accumulate: bool) -> Result<()> {
                ember_gemm(a, b, c, p, accumulate)
            }
        }
    )*};
}
gemm_out!(f32 => f32, bf16 => bf16, bf16 => f32, f16 => f16, f16 => f32);

impl GemmOut<f64> for f64 {
    /// f64 has no `ember-gemm` kernel (f64 convolutions are for checking): an i-k-j loop,
    /// rows in parallel.
    fn gemm(a: &[f64], b: &[f64], c: &mut [f64], p: Prod, accumulate: bool) -> Result<()> {
        let last = |(rs, cs, bs): (usize, usize, usize), r: usize, cl: usize| {
            (p.batch.max(1) - 1) * bs + r.saturating_sub(1) * rs + cl.saturating_sub(1) * cs + 1
        };
        if p.m == 0 || p.n == 0 || p.batch == 0 {
            return Ok(());
        }
        if (p.k > 0 && (last(p.a, p.m, p.k) > a.len() || last(p.b, p.k, p.n) > b.len()))
            || (p.batch - 1) * p.c_bs + p.m * p.n > c.len()
        {
            return Err(corrupt());
        }
        for bi in 0..p.batch {
            let cb = &mut c[bi * p.c_bs..bi * p.c_bs + p.m * p.n];
            let row = |i: usize, crow: &mut [f64]| {
                if !accumulate {
                    crow.fill(0.0);
                }
                for q in 0..p.k {
                    let av = a[bi * p.a.2 + i * p.a.0 + q * p.a.1];
                    let b0 = bi * p.b.2 + q * p.b.0;
                    for (j, cv) in crow.iter_mut().enumerate() {
                        *cv += av * b[b0 + j * p.b.1];
                    }
                }
            };
            if p.m * p.n * p.k >= GEMM_PAR_FLOPS {
                ember_gemm::parallel::for_each_chunk_mut(cb, p.n, row);
            } else {
                cb.chunks_mut(p.n).enumerate().for_each(|(i, r)| row(i, r));
            }
        }
        Ok(())
    }
}

/// A dtype the CPU convolutions run in, with the type they accumulate in.
pub(crate) trait Elem: WithDType + GemmOut<Self> {
    /// f32 for f32, bf16 and f16; f64 for f64.
    type Acc: WithDType + GemmOut<Self> + std::ops::AddAssign + std::ops::Mul<Output = Self::Acc>;
    fn acc(self) -> Self::Acc;
    fn from_acc(a: Self::Acc) -> Self;
}

impl Elem for f32 {
    type Acc = f32;
    #[inline(always)]
    fn acc(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_acc(a: f32) -> f32 {
        a
    }
}

impl Elem for f64 {
    type Acc = f64;
    #[inline(always)]
    fn acc(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_acc(a: f64) -> f64 {
        a
    }
}

impl Elem for bf16 {
    type Acc = f32;
    #[inline(always)]
    fn acc(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_acc(a: f32) -> bf16 {
        bf16::from_f32(a)
    }
}

impl Elem for f16 {
    type Acc = f32;
    #[inline(always)]
    fn acc(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_acc(a: f32) -> f16 {
        f16::from_f32(a)
    }
}
