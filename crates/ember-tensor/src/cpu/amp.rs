//! The CPU kernels of the GradScaler's two ops (`ops/amp.rs`): the fused inf/NaN check and
//! unscale over many gradients in one parallel loop, and the scale update.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use half::{bf16, f16};

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{CpuStorage, PAR_THRESHOLD, par_chunk_len};

/// The hyperparameters of one `_amp_update_scale_`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScaleUpdate {
    /// Multiplies the scale after `growth_interval` successful steps.
    pub growth_factor: f64,
    /// Multiplies the scale after a step with an inf or NaN.
    pub backoff_factor: f64,
    /// Successful steps between two growths.
    pub growth_interval: i32,
}

/// A float element the unscale pass takes: computed in f32 (f64 for f64), PyTorch's opmath.
trait Unscale: WithDType + Send {
    /// `(x * inv, x is finite)`.
    fn unscale(self, inv: f32) -> (Self, bool);
}

impl Unscale for f32 {
    fn unscale(self, inv: f32) -> (Self, bool) {
        (self * inv, self.is_finite())
    }
}

impl Unscale for f64 {
    fn unscale(self, inv: f32) -> (Self, bool) {
        (self * f64::from(inv), self.is_finite())
    }
}

impl Unscale for f16 {
    fn unscale(self, inv: f32) -> (Self, bool) {
        let x = self.to_f32();
        (f16::from_f32(x * inv), x.is_finite())
    }
}

impl Unscale for bf16 {
    fn unscale(self, inv: f32) -> (Self, bool) {
        let x = self.to_f32();
        (bf16::from_f32(x * inv), x.is_finite())
    }
}

/// The one element of a one-element storage view.
fn one<T: WithDType>(s: &CpuStorage, l: &Layout) -> Result<T> {
    s.as_slice::<T>()?
        .get(l.offset())
        .copied()
        .ok_or_else(|| TensorError::invalid("amp", "internal error: empty one-element tensor"))
}

fn one_mut<'a, T: WithDType>(s: &'a mut CpuStorage, l: &Layout) -> Result<&'a mut T> {
    s.as_mut_slice::<T>()?
        .get_mut(l.offset())
        .ok_or_else(|| TensorError::invalid("amp", "internal error: empty one-element tensor"))
}

/// Multiplies every element of `pieces` by `inv` in one loop over all of them (parallel
/// from [`PAR_THRESHOLD`] elements in all); `true` if any was an infinity or a NaN. Every
/// element is multiplied, as PyTorch's kernel does, whatever it finds.
fn unscale_pieces<T: Unscale>(pieces: Vec<&mut [T]>, inv: f32) -> bool {
    fn run<T: Unscale>(x: &mut [T], inv: f32) -> bool {
        let mut finite = true;
        for v in x.iter_mut() {
            let (y, ok) = v.unscale(inv);
            *v = y;
            finite &= ok;
        }
        !finite
    }
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    if total < PAR_THRESHOLD {
        return pieces
            .into_iter()
            .fold(false, |found, p| run(p, inv) | found);
    }
    let chunk = par_chunk_len(total);
    // Each task takes one chunk; the mutexes are never contended (one index, one task) and
    // give each task its `&mut` without unsafe code.
    let chunks: Vec<Mutex<&mut [T]>> = pieces
        .into_iter()
        .flat_map(|p| p.chunks_mut(chunk))
        .map(Mutex::new)
        .collect();
    let found = AtomicBool::new(false);
    ember_gemm::parallel::for_each_index(chunks.len(), |i| {
        let mut c = chunks[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if run(&mut c, inv) {
            found.store(true, Ordering::Relaxed);
        }
    });
    found.load(Ordering::Relaxed)
}

fn unscale_dtype<T: Unscale>(
    grads: &mut [(&mut CpuStorage, &Layout)],
    dtype: DType,
    inv: f32,
) -> Result<bool> {
    let mut pieces: Vec<&mut [T]> = Vec::new();
    for (s, l) in grads.iter_mut().filter(|(s, _)| s.dtype() == dtype) {
        let (start, n) = (l.offset(), l.numel());
        let piece = s
            .as_mut_slice::<T>()?
            .get_mut(start..start + n)
            .ok_or_else(|| TensorError::invalid("amp", "internal error: view past its storage"))?;
        pieces.push(piece);
    }
    Ok(unscale_pieces(pieces, inv))
}

/// `_amp_foreach_non_finite_check_and_unscale_` on the CPU: per dtype present, one
/// (parallel) loop over all the gradients of that dtype (contiguous layouts, checked by
/// the front).
pub(crate) fn unscale(
    grads: &mut [(&mut CpuStorage, &Layout)],
    (found_inf, lf): (&mut CpuStorage, &Layout),
    (inv_scale, li): (&CpuStorage, &Layout),
) -> Result<()> {
    let inv: f32 = one(inv_scale, li)?;
    let found = unscale_dtype::<f32>(grads, DType::F32, inv)?
        | unscale_dtype::<f64>(grads, DType::F64, inv)?
        | unscale_dtype::<f16>(grads, DType::F16, inv)?
        | unscale_dtype::<bf16>(grads, DType::Bf16, inv)?;
    if found {
        *one_mut::<f32>(found_inf, lf)? = 1.0;
    }
    Ok(())
}

/// `_amp_update_scale_` on the CPU: PyTorch's `_amp_update_scale_cpu_` (the same math as
/// `amp_update_scale_f32` in kernels/amp.cu).
pub(crate) fn update_scale(
    (scale, ls): (&mut CpuStorage, &Layout),
    (tracker, lt): (&mut CpuStorage, &Layout),
    (found_inf, lf): (&CpuStorage, &Layout),
    u: ScaleUpdate,
) -> Result<()> {
    let found: f32 = one(found_inf, lf)?;
    let tracker = one_mut::<i32>(tracker, lt)?;
    let scale = one_mut::<f32>(scale, ls)?;
    if found != 0.0 {
        *scale = (f64::from(*scale) * u.backoff_factor) as f32;
        *tracker = 0;
    } else {
        let successful = tracker.wrapping_add(1);
        if successful == u.growth_interval {
            let grown = (f64::from(*scale) * u.growth_factor) as f32;
            if grown.is_finite() {
                *scale = grown;
            }
            *tracker = 0;
        } else {
            *tracker = successful;
        }
    }
    Ok(())
}
