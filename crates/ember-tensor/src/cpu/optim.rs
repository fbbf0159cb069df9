//! CPU kernels of the optimizers' multi-tensor steps ([`Tensor::fused_sgd_`] and
//! [`Tensor::fused_adam_`], `kernels/optim.cu` on CUDA): one pass over each parameter's
//! tensors, reading the param, its gradient and its state once and writing the param and
//! the state once, where the per-op path makes a pass per op.
//!
//! Every parameter of a step is cut into pieces ([`par_chunk_len`] elements from
//! [`PAR_THRESHOLD`] up, else one piece), and the pieces of all the parameters run as one
//! parallel loop (one loop rather than one per parameter, so that the many small tensors of
//! a model, its biases, do not each pay for a loop of their own); a step of fewer than
//! [`PAR_THRESHOLD`] elements in all runs on the calling thread.
//!
//! Note [Fused optimizer bits on the CPU]:
//! the update of each element is the per-op path's (`ember-nn`'s `sgd_single` and
//! `adam_single`) operation for operation, in the param's dtype (f32 or f64, the only ones
//! taken here: f16/bf16 params keep the per-op path on the CPU, whose every op rounds to the
//! half type as PyTorch's CPU ops do): each scalar is cast once to the dtype as the per-op
//! path's scalar operands are, the products and sums are the per-op kernels' in their order
//! (`s + (v·x)·y` for `addcmul_`, `s + (v·x)/y` for `addcdiv_`, `lerp` forwards for
//! `|w| < 0.5`, else backwards from the end), and `sqrt`, `maximum` and `neg` are the op
//! table's own functions. Rust contracts no `a * b + c` into an FMA, on any instruction set
//! [`simd::widest`] picks, so the results are the per-op path's bits.
//!
//! [`Tensor::fused_sgd_`]: crate::Tensor::fused_sgd_
//! [`Tensor::fused_adam_`]: crate::Tensor::fused_adam_

use std::ops::{Add, Div, Mul, Sub};

use ember_gemm::parallel::for_each_chunk_mut;

use crate::cpu::{corrupt, simd};
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::op::{self, Elem};
use crate::params::{FusedAdamOptions, FusedSgdOptions};
use crate::storage::{CpuStorage, PAR_THRESHOLD, par_chunk_len};

/// The float types the kernels take: f32 and f64, computed in themselves.
pub(crate) trait Real:
    Elem
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Send
    + Sync
{
}
impl Real for f32 {}
impl Real for f64 {}

/// One parameter of a step: the param and its states (written; `None` for a state the
/// options leave out), its gradient (read), and the optimizer's per-parameter values.
pub(crate) struct Row<'a> {
    /// The param first, then the optimizer's states in its order.
    pub(crate) written: Vec<Option<(&'a mut CpuStorage, &'a Layout)>>,
    /// The gradient.
    pub(crate) grad: (&'a CpuStorage, &'a Layout),
    /// Per-parameter values (SGD: its first-step flag; Adam: step size and `sqrt(1 - β₂ᵗ)`).
    pub(crate) extras: [f64; 2],
}

/// Up to four written slices of one piece: the param and its states.
type Written<'a, T> = [Option<&'a mut [T]>; 4];

/// A piece of one parameter's elements: its written slices, its gradient, its row's extras.
struct Piece<'a, T> {
    written: Written<'a, T>,
    grad: &'a [T],
    extras: [f64; 2],
}

/// A piece of either float dtype, so that one parallel loop takes both.
enum AnyPiece<'a> {
    F32(Piece<'a, f32>),
    F64(Piece<'a, f64>),
}

/// An optimizer's elementwise update of one piece.
pub(crate) trait Update: Sync {
    /// Updates the piece's elements in place: `written` holds the param and the states (as
    /// [`Row::written`]), all as long as `grad`.
    fn apply<T: Real>(&self, written: &mut Written<'_, T>, grad: &[T], extras: [f64; 2]);
}

/// The row's slices in `T`, cut into pieces of `chunk` elements, appended to `out`.
fn cut<'a, T: WithDType>(
    op: &'static str,
    row: Row<'a>,
    chunk: usize,
    out: &mut Vec<Piece<'a, T>>,
) -> Result<()> {
    let (g, lg) = row.grad;
    let (lo, hi) = lg.contiguous_range().ok_or_else(|| corrupt(op))?;
    let grad = g.as_slice::<T>()?.get(lo..hi).ok_or_else(|| corrupt(op))?;
    let pieces = grad.len().div_ceil(chunk);
    // Each written tensor's pieces, in order (`None` pieces for a missing state).
    let mut columns: Vec<std::vec::IntoIter<Option<&'a mut [T]>>> = Vec::with_capacity(4);
    for w in row.written {
        let column: Vec<Option<&'a mut [T]>> = match w {
            Some((s, l)) => {
                let (lo, hi) = l.contiguous_range().ok_or_else(|| corrupt(op))?;
                let x = s.as_mut_slice::<T>()?.get_mut(lo..hi);
                let x = x
                    .filter(|x| x.len() == grad.len())
                    .ok_or_else(|| corrupt(op))?;
                x.chunks_mut(chunk).map(Some).collect()
            }
            None => (0..pieces).map(|_| None).collect(),
        };
        columns.push(column.into_iter());
    }
    for grad in grad.chunks(chunk) {
        let mut written: Written<'a, T> = [None, None, None, None];
        for (slot, column) in written.iter_mut().zip(&mut columns) {
            *slot = column.next().flatten();
        }
        out.push(Piece {
            written,
            grad,
            extras: row.extras,
        });
    }
    Ok(())
}

/// Runs `update` over every row: one parallel loop over the pieces of all of them (on this
/// thread when there are fewer than [`PAR_THRESHOLD`] elements in all). Every row's tensors
/// are contiguous f32 or f64 ones of its param's dtype and element count.
pub(crate) fn step<U: Update>(op: &'static str, rows: Vec<Row<'_>>, update: &U) -> Result<()> {
    let total: usize = rows.iter().map(|r| r.grad.1.numel()).sum();
    let mut pieces: Vec<AnyPiece<'_>> = Vec::new();
    for row in rows {
        let n = row.grad.1.numel();
        if n == 0 {
            continue;
        }
        let chunk = if n >= PAR_THRESHOLD {
            par_chunk_len(n)
        } else {
            n
        };
        match row.grad.0.dtype() {
            DType::F32 => {
                let mut typed = Vec::new();
                cut::<f32>(op, row, chunk, &mut typed)?;
                pieces.extend(typed.into_iter().map(AnyPiece::F32));
            }
            DType::F64 => {
                let mut typed = Vec::new();
                cut::<f64>(op, row, chunk, &mut typed)?;
                pieces.extend(typed.into_iter().map(AnyPiece::F64));
            }
            dtype => return Err(TensorError::unsupported(op, dtype)),
        }
    }
    let run = |piece: &mut AnyPiece<'_>| {
        simd::widest(|| match piece {
            AnyPiece::F32(p) => update.apply(&mut p.written, p.grad, p.extras),
            AnyPiece::F64(p) => update.apply(&mut p.written, p.grad, p.extras),
        })
    };
    if total >= PAR_THRESHOLD {
        for_each_chunk_mut(&mut pieces, 1, |_, piece| piece.iter_mut().for_each(run));
    } else {
        pieces.iter_mut().for_each(run);
    }
    Ok(())
}

/// SGD's update (`kernels/optim.cu`'s `optim_sgd`): `written` is `[param, momentum buffer
/// (with momentum)]`, `extras[0]` is 1 where the buffer is new (its first step: `b = g`).
impl Update for FusedSgdOptions {
    fn apply<T: Real>(&self, written: &mut Written<'_, T>, grad: &[T], extras: [f64; 2]) {
        let [Some(param), buf, ..] = written else {
            return;
        };
        // `sgd_single`'s scalar operands, each in the param's dtype.
        let neg_lr = T::from_f64(-self.lr);
        let mom = T::from_f64(self.momentum);
        let damp_c = T::from_f64(1.0 - self.dampening);
        let wd = T::from_f64(self.weight_decay);
        let has_wd = self.weight_decay != 0.0;
        let (maximize, nesterov, first) = (self.maximize, self.nesterov, extras[0] != 0.0);
        let grad_of = |p: T, g: T| {
            let g = if maximize { g.unary::<op::Neg>() } else { g };
            if has_wd { g + p * wd } else { g }
        };
        match (buf, self.momentum != 0.0) {
            (Some(buf), true) => {
                for ((p, &g), b) in param.iter_mut().zip(grad).zip(buf.iter_mut()) {
                    let g = grad_of(*p, g);
                    let nb = if first { g } else { *b * mom + g * damp_c };
                    *b = nb;
                    let g = if nesterov { g + nb * mom } else { nb };
                    *p = *p + g * neg_lr;
                }
            }
            _ => {
                for (p, &g) in param.iter_mut().zip(grad) {
                    *p = *p + grad_of(*p, g) * neg_lr;
                }
            }
        }
    }
}

/// Adam's and AdamW's update (`kernels/optim.cu`'s `optim_adam`): `written` is `[param,
/// exp_avg, exp_avg_sq, max_exp_avg_sq (with amsgrad)]`; `extras` are the param's step size
/// `lr / (1 - β₁ᵗ)` and `sqrt(1 - β₂ᵗ)`, computed in f64 as `adam_single` does.
impl Update for FusedAdamOptions {
    fn apply<T: Real>(&self, written: &mut Written<'_, T>, grad: &[T], extras: [f64; 2]) {
        let [Some(param), Some(exp_avg), Some(exp_avg_sq), max_sq] = written else {
            return;
        };
        let (beta1, beta2) = self.betas;
        // `adam_single`'s scalar operands, each in the param's dtype.
        let decay = T::from_f64(1.0 - self.lr * self.weight_decay);
        let wd = T::from_f64(self.weight_decay);
        let w = T::from_f64(1.0 - beta1);
        let one_minus_w = T::from_f64(1.0) - w;
        let forwards = w.to_f64().abs() < 0.5;
        let b2 = T::from_f64(beta2);
        let one_minus_b2 = T::from_f64(1.0 - beta2);
        let eps = T::from_f64(self.eps);
        let neg_step_size = T::from_f64(-extras[0]);
        let bc2_sqrt = T::from_f64(extras[1]);
        let (maximize, has_wd, decoupled) = (
            self.maximize,
            self.weight_decay != 0.0,
            self.decoupled_weight_decay,
        );
        // Param, gradient, moments and the second moment the denominator uses (`v`, or
        // amsgrad's running max given as `x`): the new param, `m` and `v`.
        let update = |p: T, g: T, m: T, v: T| {
            let g = if maximize { g.unary::<op::Neg>() } else { g };
            let (p, g) = match (has_wd, decoupled) {
                (true, true) => (p * decay, g),
                (true, false) => (p, g + p * wd),
                _ => (p, g),
            };
            let m = if forwards {
                m + w * (g - m)
            } else {
                g - (g - m) * one_minus_w
            };
            let v = v * b2 + one_minus_b2 * g * g;
            (p, m, v)
        };
        let denom = |second: T| second.unary::<op::Sqrt>() / bc2_sqrt + eps;
        let it = param
            .iter_mut()
            .zip(grad)
            .zip(exp_avg.iter_mut().zip(exp_avg_sq.iter_mut()));
        match (max_sq, self.amsgrad) {
            (Some(max_sq), true) => {
                for (((p, &g), (m, v)), x) in it.zip(max_sq.iter_mut()) {
                    let (np, nm, nv) = update(*p, g, *m, *v);
                    let second = x.binary::<op::Maximum>(nv);
                    (*m, *v, *x) = (nm, nv, second);
                    *p = np + neg_step_size * nm / denom(second);
                }
            }
            _ => {
                for ((p, &g), (m, v)) in it {
                    let (np, nm, nv) = update(*p, g, *m, *v);
                    (*m, *v) = (nm, nv);
                    *p = np + neg_step_size * nm / denom(nv);
                }
            }
        }
    }
}
