//! The dispatch point of the neural-network op family (convolution, pooling, the
//! negative log-likelihood): one method per op on [`Storage`], each a single `match` on
//! the backend variant (the parameter structs the kernels take are in `params.rs`). It follows
//! Note [Dispatch] (in `backend.rs`) exactly; it sits in a file of its own only so that
//! op families can be edited side by side. A new backend adds one arm per method here.
//!
//! The fronts (`ops/conv.rs`, `ops/pool.rs`, `ops/loss.rs`) do every check and compute
//! every output size before calling down, so kernels can trust these parameters; they
//! still index through `get` and report a layout outside its storage as an error.

use crate::backend::mixed;
use crate::cpu;
use crate::cuda;
use crate::error::Result;
use crate::layout::Layout;
use crate::params::{AvgDivisor, Conv2dParams, Pool2dParams};
use crate::storage::Storage;

impl Storage {
    /// `[N, O, out_h, out_w]` = conv of `x` (`[N, C, H, W]`) with `w`, plus `bias` (`[O]`),
    /// all of one floating dtype; f16/bf16 compute in f32.
    pub(crate) fn conv2d(
        &self,
        lx: &Layout,
        w: &Storage,
        lw: &Layout,
        bias: Option<(&Storage, &Layout)>,
        p: &Conv2dParams,
    ) -> Result<Storage> {
        match (self, w, bias) {
            (Storage::Cpu(x), Storage::Cpu(w), None) => {
                Ok(Storage::Cpu(cpu::conv::conv2d(x, lx, w, lw, None, p)?))
            }
            (Storage::Cpu(x), Storage::Cpu(w), Some((Storage::Cpu(b), lb))) => Ok(Storage::Cpu(
                cpu::conv::conv2d(x, lx, w, lw, Some((b, lb)), p)?,
            )),
            (Storage::Cuda(x), Storage::Cuda(w), None) => {
                Ok(Storage::Cuda(cuda::conv2d(x, lx, w, lw, None, p)?))
            }
            (Storage::Cuda(x), Storage::Cuda(w), Some((Storage::Cuda(b), lb))) => {
                Ok(Storage::Cuda(cuda::conv2d(x, lx, w, lw, Some((b, lb)), p)?))
            }
            (x, w, b) => Err(mixed(
                x,
                match b {
                    Some((b, _)) if x.device() == w.device() => b,
                    _ => w,
                },
            )),
        }
    }

    /// The input gradient `[N, C, H, W]` of conv2d from the output gradient (`self`) and
    /// the weight, where the backend has a kernel for it (the CPU, CUDA with cuDNN); `None`
    /// tells the front to compose it from primitives (`ops/conv_grad.rs`).
    pub(crate) fn conv2d_backward_data(
        &self,
        ly: &Layout,
        w: &Storage,
        lw: &Layout,
        x_dims: [usize; 4],
        p: &Conv2dParams,
    ) -> Result<Option<Storage>> {
        match (self, w) {
            (Storage::Cpu(dy), Storage::Cpu(w)) => Ok(Some(Storage::Cpu(
                cpu::conv::conv2d_backward_data(dy, ly, w, lw, x_dims, p)?,
            ))),
            (Storage::Cuda(dy), Storage::Cuda(w)) => {
                Ok(cuda::conv2d_backward_data(dy, ly, w, lw, x_dims, p)?.map(Storage::Cuda))
            }
            (dy, w) => Err(mixed(dy, w)),
        }
    }

    /// The weight gradient `[O, C/groups, kH, kW]` of conv2d from the output gradient
    /// (`self`) and the input; `None` as for [`Storage::conv2d_backward_data`].
    pub(crate) fn conv2d_backward_filter(
        &self,
        ly: &Layout,
        x: &Storage,
        lx: &Layout,
        w_dims: [usize; 4],
        p: &Conv2dParams,
    ) -> Result<Option<Storage>> {
        match (self, x) {
            (Storage::Cpu(dy), Storage::Cpu(x)) => Ok(Some(Storage::Cpu(
                cpu::conv::conv2d_backward_filter(dy, ly, x, lx, w_dims, p)?,
            ))),
            (Storage::Cuda(dy), Storage::Cuda(x)) => {
                Ok(cuda::conv2d_backward_filter(dy, ly, x, lx, w_dims, p)?.map(Storage::Cuda))
            }
            (dy, x) => Err(mixed(dy, x)),
        }
    }

    /// Max pooling: the maxima (`[N, C, out_h, out_w]`, the input's dtype) and their
    /// positions (i64, flat `h * W + w` within each input plane, as PyTorch).
    pub(crate) fn max_pool2d(&self, l: &Layout, p: &Pool2dParams) -> Result<(Storage, Storage)> {
        match self {
            Storage::Cpu(x) => {
                let (v, i) = cpu::pool::max_pool2d(x, l, p)?;
                Ok((Storage::Cpu(v), Storage::Cpu(i)))
            }
            Storage::Cuda(x) => {
                let (v, i) = cuda::max_pool2d(x, l, p)?;
                Ok((Storage::Cuda(v), Storage::Cuda(i)))
            }
        }
    }

    /// Average pooling (`[N, C, out_h, out_w]`, the input's dtype).
    pub(crate) fn avg_pool2d(
        &self,
        l: &Layout,
        p: &Pool2dParams,
        divisor: AvgDivisor,
    ) -> Result<Storage> {
        match self {
            Storage::Cpu(x) => Ok(Storage::Cpu(cpu::pool::avg_pool2d(x, l, p, divisor)?)),
            Storage::Cuda(x) => Ok(Storage::Cuda(cuda::avg_pool2d(x, l, p, divisor)?)),
        }
    }

    /// Softmax (`log == false`) or log-softmax of `x` (f32 or f64) along `dim`, contiguous.
    pub(crate) fn softmax(&self, l: &Layout, dim: usize, log: bool) -> Result<Storage> {
        match self {
            Storage::Cpu(x) => Ok(Storage::Cpu(cpu::softmax::softmax(x, l, dim, log)?)),
            Storage::Cuda(x) => Ok(Storage::Cuda(cuda::softmax(x, l, dim, log)?)),
        }
    }

    /// The unreduced negative log-likelihood of log-probabilities `x` (`[N, C, L]`, f32 or
    /// f64) at class indices `target` (`[N, L]`, i64 or i32): per element `-w[t] * x[t]`
    /// and the weight `w[t]` used (both 0 where `t == ignore_index`), each `[N, L]` in
    /// `x`'s dtype. `weight` is `[C]` in `x`'s dtype. A target outside `[0, C)` that is not
    /// `ignore_index` is an error naming it.
    pub(crate) fn nll_loss(
        &self,
        lx: &Layout,
        target: &Storage,
        lt: &Layout,
        weight: Option<(&Storage, &Layout)>,
        ignore_index: i64,
    ) -> Result<(Storage, Storage)> {
        match (self, target, weight) {
            (Storage::Cpu(x), Storage::Cpu(t), None) => {
                let (l, w) = cpu::loss::nll_loss(x, lx, t, lt, None, ignore_index)?;
                Ok((Storage::Cpu(l), Storage::Cpu(w)))
            }
            (Storage::Cpu(x), Storage::Cpu(t), Some((Storage::Cpu(w), lw))) => {
                let (l, w) = cpu::loss::nll_loss(x, lx, t, lt, Some((w, lw)), ignore_index)?;
                Ok((Storage::Cpu(l), Storage::Cpu(w)))
            }
            (Storage::Cuda(x), Storage::Cuda(t), None) => {
                let (l, w) = cuda::nll_loss(x, lx, t, lt, None, ignore_index)?;
                Ok((Storage::Cuda(l), Storage::Cuda(w)))
            }
            (Storage::Cuda(x), Storage::Cuda(t), Some((Storage::Cuda(w), lw))) => {
                let (l, w) = cuda::nll_loss(x, lx, t, lt, Some((w, lw)), ignore_index)?;
                Ok((Storage::Cuda(l), Storage::Cuda(w)))
            }
            (x, t, w) => Err(mixed(
                x,
                match w {
                    Some((w, _)) if x.device() == t.device() => w,
                    _ => t,
                },
            )),
        }
    }
}
