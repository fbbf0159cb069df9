//! The dispatch point of the fused neural-network ops: cross-entropy with class-index
//! targets (forward and backward), batch normalisation and scaled-dot-product attention
//! (forward and backward, docs/attention.md). Each is one kernel (or two) per
//! device in place of a chain of generic ops, so one autograd op serves every device. It
//! follows Note [Dispatch] (in `backend.rs`): one method per op on [`Storage`], a single
//! `match` on the first operand's backend, the others taken from the same backend or a
//! device-mismatch error.
//!
//! The fronts (`ops/loss.rs`, `raw/norm.rs`, `raw/attention.rs`) check shapes, dtypes and
//! devices and bring the operands to the layouts the kernels take before calling down.

use crate::backend::mixed;
use crate::cpu;
use crate::cpu::attention::AttnOptions;
use crate::cuda::{self, CudaStorage};
use crate::error::Result;
use crate::layout::Layout;
use crate::params::{BnBackward, BnGrads, BnStats, CrossEntropyParams};
use crate::storage::{CpuStorage, Storage};

impl Storage {
    /// The `mean` reduction of a cross-entropy in one launch where there is a kernel for it
    /// (CUDA, up to `CE_MEAN_MAX_ROWS` rows): `(Σ loss / Σ w, Σ w)` over the `rows` per-row
    /// losses and target weights of [`CeOperands::cross_entropy_fwd`], as one-element
    /// storages; `None` elsewhere, and the front composes it from reductions.
    pub(crate) fn cross_entropy_mean(
        loss: &Storage,
        w: &Storage,
        rows: usize,
    ) -> Result<Option<(Storage, Storage)>> {
        match (loss, w) {
            (Storage::Cuda(l), Storage::Cuda(ws))
                if (1..=cuda::CE_MEAN_MAX_ROWS).contains(&rows) =>
            {
                let (m, t) = cuda::cross_entropy_mean(l, ws, rows)?;
                Ok(Some((Storage::Cuda(m), Storage::Cuda(t))))
            }
            _ => Ok(None),
        }
    }
}

/// `other` as a host storage, or the device-mismatch error against `first`.
fn on_cpu<'a>(first: &Storage, other: &'a Storage) -> Result<&'a CpuStorage> {
    match other {
        Storage::Cpu(s) => Ok(s),
        o => Err(mixed(first, o)),
    }
}

/// `other` as a CUDA storage, or the device-mismatch error against `first`.
fn on_cuda<'a>(first: &Storage, other: &'a Storage) -> Result<&'a CudaStorage> {
    match other {
        Storage::Cuda(s) => Ok(s),
        o => Err(mixed(first, o)),
    }
}

/// An optional operand with its layout on the host.
fn opt_cpu<'a>(
    first: &Storage,
    o: Option<(&'a Storage, &'a Layout)>,
) -> Result<Option<(&'a CpuStorage, &'a Layout)>> {
    o.map(|(s, l)| Ok((on_cpu(first, s)?, l))).transpose()
}

/// An optional operand with its layout on a CUDA device.
fn opt_cuda<'a>(
    first: &Storage,
    o: Option<(&'a Storage, &'a Layout)>,
) -> Result<Option<(&'a CudaStorage, &'a Layout)>> {
    o.map(|(s, l)| Ok((on_cuda(first, s)?, l))).transpose()
}

/// The operands of the fused cross-entropy: contiguous scores `[N, C, L]` (any float
/// dtype), targets `[N, L]` (i64 or i32), an optional weight `[C]` in the compute dtype
/// (f32, or f64 for f64 scores).
#[derive(Clone, Copy)]
pub(crate) struct CeOperands<'a> {
    pub x: (&'a Storage, &'a Layout),
    pub target: (&'a Storage, &'a Layout),
    pub weight: Option<(&'a Storage, &'a Layout)>,
}

/// What the backward reads besides [`CeOperands`], all in the compute dtype: the forward's
/// per-row `lse` (`[N·L]`), the upstream gradient (`[N·L]` contiguous when the flag is
/// set, else one value), the mean's divisor `Σ w[t]` (`None` for sum and no reduction) and
/// `Σ_c w_c` (needed with a weight and label smoothing).
#[derive(Clone, Copy)]
pub(crate) struct CeBackward<'a> {
    pub lse: &'a Storage,
    pub grad: (&'a Storage, bool),
    pub total: Option<&'a Storage>,
    pub wsum: Option<&'a Storage>,
}

impl<'a> CeOperands<'a> {
    /// Per row of scores: the loss (with label smoothing), the weight `w[t]` it used (0 at
    /// `ignore_index`) and `max + ln Σ exp(x - max)`, each `[N·L]` in the compute dtype. A
    /// target outside `[0, C)` that is not `ignore_index` is the `nll_loss` error naming the
    /// first one.
    pub(crate) fn cross_entropy_fwd(
        &self,
        p: &CrossEntropyParams,
    ) -> Result<(Storage, Storage, Storage)> {
        let ((x, lx), (t, lt)) = (self.x, self.target);
        match x {
            Storage::Cpu(xs) => {
                let (l, w, s) = cpu::cross_entropy::forward(
                    xs,
                    lx,
                    on_cpu(x, t)?,
                    lt,
                    opt_cpu(x, self.weight)?,
                    p,
                )?;
                Ok((Storage::Cpu(l), Storage::Cpu(w), Storage::Cpu(s)))
            }
            Storage::Cuda(xs) => {
                let (l, w, s) = cuda::cross_entropy_fwd(
                    xs,
                    lx,
                    on_cuda(x, t)?,
                    lt,
                    opt_cuda(x, self.weight)?,
                    p,
                )?;
                Ok((Storage::Cuda(l), Storage::Cuda(w), Storage::Cuda(s)))
            }
        }
    }

    /// The gradient of the scores, `[N, C, L]` in their dtype, written once:
    /// `scale·(softmax(x)·A - a)` (Note [Cross-entropy backward]).
    pub(crate) fn cross_entropy_bwd(
        &self,
        b: &CeBackward<'a>,
        p: &CrossEntropyParams,
    ) -> Result<Storage> {
        let ((x, lx), (t, lt)) = (self.x, self.target);
        match x {
            Storage::Cpu(xs) => {
                let opt = |s: Option<&'a Storage>| s.map(|s| on_cpu(x, s)).transpose();
                Ok(Storage::Cpu(cpu::cross_entropy::backward(
                    xs,
                    lx,
                    on_cpu(x, b.lse)?,
                    on_cpu(x, t)?,
                    lt,
                    opt_cpu(x, self.weight)?,
                    opt(b.wsum)?,
                    (on_cpu(x, b.grad.0)?, b.grad.1),
                    opt(b.total)?,
                    p,
                )?))
            }
            Storage::Cuda(xs) => {
                let opt = |s: Option<&'a Storage>| s.map(|s| on_cuda(x, s)).transpose();
                Ok(Storage::Cuda(cuda::cross_entropy_bwd(
                    xs,
                    lx,
                    on_cuda(x, b.lse)?,
                    on_cuda(x, t)?,
                    lt,
                    opt_cuda(x, self.weight)?,
                    opt(b.wsum)?,
                    (on_cuda(x, b.grad.0)?, b.grad.1),
                    opt(b.total)?,
                    p,
                )?))
            }
        }
    }
}

impl Storage {
    /// Batch statistics of contiguous `[N, C, S]` `self`: per channel the mean and the
    /// inverse standard deviation `1 / sqrt(var + eps)` (biased variance), `[C]` in the
    /// compute dtype; with `running` (contiguous `[C]` mean and variance in the compute
    /// dtype) also PyTorch's momentum update with the unbiased variance, in place.
    pub(crate) fn batch_norm_stats(
        &self,
        lx: &Layout,
        running: Option<(&mut Storage, &mut Storage)>,
        momentum: f64,
        eps: f64,
    ) -> Result<(Storage, Storage)> {
        match self {
            Storage::Cpu(x) => {
                let running = match running {
                    None => None,
                    Some((Storage::Cpu(m), Storage::Cpu(v))) => Some((m, v)),
                    Some((m, v)) => {
                        let odd = if matches!(m, Storage::Cpu(_)) { v } else { m };
                        return Err(mixed(self, odd));
                    }
                };
                let (m, k) = cpu::batch_norm::stats(x, lx, running, momentum, eps)?;
                Ok((Storage::Cpu(m), Storage::Cpu(k)))
            }
            Storage::Cuda(x) => {
                let running = match running {
                    None => None,
                    Some((Storage::Cuda(m), Storage::Cuda(v))) => Some((&*m, &*v)),
                    Some((m, v)) => {
                        let odd = if matches!(m, Storage::Cuda(_)) { v } else { m };
                        return Err(mixed(self, odd));
                    }
                };
                let (m, k) = cuda::batch_norm_stats(x, lx, running, momentum, eps)?;
                Ok((Storage::Cuda(m), Storage::Cuda(k)))
            }
        }
    }

    /// `(self - mean)·k·weight + bias` per channel of contiguous `[N, C, S]` `self`, in its
    /// dtype (`weight`, `bias`: `[C]`, compute dtype).
    pub(crate) fn batch_norm_apply(
        &self,
        lx: &Layout,
        st: &BnStats<'_, Storage>,
        weight: Option<&Storage>,
        bias: Option<&Storage>,
    ) -> Result<Storage> {
        match self {
            Storage::Cpu(x) => {
                let st = BnStats {
                    mean: on_cpu(self, st.mean)?,
                    v: on_cpu(self, st.v)?,
                    is_var: st.is_var,
                    eps: st.eps,
                };
                let w = weight.map(|s| on_cpu(self, s)).transpose()?;
                let b = bias.map(|s| on_cpu(self, s)).transpose()?;
                Ok(Storage::Cpu(cpu::batch_norm::apply(x, lx, &st, w, b)?))
            }
            Storage::Cuda(x) => {
                let st = BnStats {
                    mean: on_cuda(self, st.mean)?,
                    v: on_cuda(self, st.v)?,
                    is_var: st.is_var,
                    eps: st.eps,
                };
                let w = weight.map(|s| on_cuda(self, s)).transpose()?;
                let b = bias.map(|s| on_cuda(self, s)).transpose()?;
                Ok(Storage::Cuda(cuda::batch_norm_apply(x, lx, &st, w, b)?))
            }
        }
    }

    /// The batch-norm backward for upstream `self` (`dy`, contiguous, `x`'s shape and dtype):
    /// one reduction pass for the sums, one elementwise pass for the input gradient.
    pub(crate) fn batch_norm_backward(
        &self,
        x: &Storage,
        lx: &Layout,
        st: &BnStats<'_, Storage>,
        weight: Option<&Storage>,
        b: &BnBackward,
    ) -> Result<BnGrads> {
        match self {
            Storage::Cpu(dy) => {
                let st = BnStats {
                    mean: on_cpu(self, st.mean)?,
                    v: on_cpu(self, st.v)?,
                    is_var: st.is_var,
                    eps: st.eps,
                };
                let w = weight.map(|w| on_cpu(self, w)).transpose()?;
                let (dx, sums) = cpu::batch_norm::backward(dy, on_cpu(self, x)?, lx, &st, w, b)?;
                Ok((
                    dx.map(Storage::Cpu),
                    sums.map(|(a, b)| (Storage::Cpu(a), Storage::Cpu(b))),
                ))
            }
            Storage::Cuda(dy) => {
                let st = BnStats {
                    mean: on_cuda(self, st.mean)?,
                    v: on_cuda(self, st.v)?,
                    is_var: st.is_var,
                    eps: st.eps,
                };
                let w = weight.map(|w| on_cuda(self, w)).transpose()?;
                let (dx, sums) = cuda::batch_norm_backward(dy, on_cuda(self, x)?, lx, &st, w, b)?;
                Ok((
                    dx.map(Storage::Cuda),
                    sums.map(|(a, b)| (Storage::Cuda(a), Storage::Cuda(b))),
                ))
            }
        }
    }
}

/// The operands of the fused attention: q `[B, H, L, E]`, k `[B, G, S, E]`, v
/// `[B, G, S, Ev]` (4-D layouts with unit last stride, one float dtype) and an optional
/// mask expanded to `[B, H, L, S]` (bool or the operands' dtype).
#[derive(Clone, Copy)]
pub(crate) struct AttnOperands<'a> {
    pub q: (&'a Storage, &'a Layout),
    pub k: (&'a Storage, &'a Layout),
    pub v: (&'a Storage, &'a Layout),
    pub mask: Option<(&'a Storage, &'a Layout)>,
}

/// The attention's results: `(out, lse)` of the forward.
pub(crate) type AttnFwd = (Storage, Storage);

/// The attention's gradients `(dq, dk, dv)`.
pub(crate) type AttnGrads = (Storage, Storage, Storage);

impl AttnOperands<'_> {
    /// The forward: out `[B, H, L, Ev]` contiguous in the operands' dtype and the
    /// log-sum-exp `[B, H, L]` (f32 on CUDA; the CPU's compute dtype, f64 for f64).
    pub(crate) fn attention_fwd(&self, opts: &AttnOptions) -> Result<AttnFwd> {
        let ((q, lq), (k, lk), (v, lv)) = (self.q, self.k, self.v);
        match q {
            Storage::Cpu(qs) => {
                let (o, l) = cpu::attention::storage::forward(
                    (qs, lq),
                    (on_cpu(q, k)?, lk),
                    (on_cpu(q, v)?, lv),
                    opt_cpu(q, self.mask)?,
                    opts,
                )?;
                Ok((Storage::Cpu(o), Storage::Cpu(l)))
            }
            Storage::Cuda(qs) => {
                let (o, l) = cuda::attention::attention_forward(
                    (qs, lq),
                    (on_cuda(q, k)?, lk),
                    (on_cuda(q, v)?, lv),
                    opt_cuda(q, self.mask)?,
                    opts,
                )?;
                Ok((Storage::Cuda(o), Storage::Cuda(l)))
            }
        }
    }

    /// The backward from the forward's `out` and `lse` (as [`Self::attention_fwd`] made
    /// them) and the output gradient `dout` (`[B, H, L, Ev]`, unit last stride): dq, dk, dv
    /// contiguous in the operands' dtype.
    pub(crate) fn attention_bwd(
        &self,
        opts: &AttnOptions,
        out: &Storage,
        lse: &Storage,
        (d, ld): (&Storage, &Layout),
    ) -> Result<AttnGrads> {
        let ((q, lq), (k, lk), (v, lv)) = (self.q, self.k, self.v);
        match q {
            Storage::Cpu(qs) => {
                let (a, b, c) = cpu::attention::storage::backward(
                    (qs, lq),
                    (on_cpu(q, k)?, lk),
                    (on_cpu(q, v)?, lv),
                    opt_cpu(q, self.mask)?,
                    opts,
                    on_cpu(q, out)?,
                    on_cpu(q, lse)?,
                    (on_cpu(q, d)?, ld),
                )?;
                Ok((Storage::Cpu(a), Storage::Cpu(b), Storage::Cpu(c)))
            }
            Storage::Cuda(qs) => {
                let (a, b, c) = cuda::attention::attention_backward(
                    (qs, lq),
                    (on_cuda(q, k)?, lk),
                    (on_cuda(q, v)?, lv),
                    opt_cuda(q, self.mask)?,
                    opts,
                    on_cuda(q, out)?,
                    on_cuda(q, lse)?,
                    (on_cuda(q, d)?, ld),
                )?;
                Ok((Storage::Cuda(a), Storage::Cuda(b), Storage::Cuda(c)))
            }
        }
    }
}
