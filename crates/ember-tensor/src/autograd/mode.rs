//! Grad modes (per thread, as scoped guards) and the autocast hook.
//!
//! ```
//! use ember_tensor::{Tensor, no_grad, is_grad_enabled};
//! let w = Tensor::ones([3], ())?.requires_grad_(true)?;
//! {
//!     let _g = no_grad();
//!     assert!(!is_grad_enabled());
//!     let y = w.mul(2.0)?;           // not recorded
//!     assert!(!y.requires_grad());
//! }
//! assert!(w.mul(2.0)?.requires_grad());
//! # Ok::<(), ember_tensor::Error>(())
//! ```

use std::cell::Cell;
use std::sync::Arc;

use crate::{DType, Device, OpInfo};

use crate::autograd::error::Result;
use crate::tensor::Tensor;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static INFERENCE: Cell<bool> = const { Cell::new(false) };
    static AUTOCAST: Cell<bool> = const { Cell::new(false) };
    static AUTOCAST_POLICY: std::cell::RefCell<Option<Arc<dyn AutocastPolicy>>> =
        const { std::cell::RefCell::new(None) };
}

/// `true` unless a [`no_grad`]/[`inference_mode`] guard (or `set_grad_enabled(false)`) is
/// live on this thread. PyTorch's `torch.is_grad_enabled()`.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// `true` inside an [`inference_mode`] guard on this thread.
pub fn is_inference_mode_enabled() -> bool {
    INFERENCE.with(Cell::get)
}

/// Restores the grad mode (and inference mode) it saved when dropped. Made by [`no_grad`],
/// [`enable_grad`], [`set_grad_enabled`] and [`inference_mode`]; guards nest.
#[derive(Debug)]
#[must_use = "the mode lasts only while the guard lives: `let _g = no_grad();`"]
pub struct GradModeGuard {
    grad: bool,
    inference: bool,
    // Per-thread state: the guard must be dropped on the thread that made it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl GradModeGuard {
    fn set(grad: bool, inference: bool) -> GradModeGuard {
        let old = GradModeGuard {
            grad: is_grad_enabled(),
            inference: is_inference_mode_enabled(),
            _not_send: std::marker::PhantomData,
        };
        GRAD_ENABLED.with(|c| c.set(grad));
        INFERENCE.with(|c| c.set(inference));
        old
    }
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|c| c.set(self.grad));
        INFERENCE.with(|c| c.set(self.inference));
    }
}

/// Ops run while the guard lives are not recorded (`with torch.no_grad():`).
pub fn no_grad() -> GradModeGuard {
    GradModeGuard::set(false, is_inference_mode_enabled())
}

/// Recording back on inside a [`no_grad`] region (`with torch.enable_grad():`). It does not
/// lift [`inference_mode`].
pub fn enable_grad() -> GradModeGuard {
    let inference = is_inference_mode_enabled();
    GradModeGuard::set(!inference, inference)
}

/// Recording on or off while the guard lives (`torch.set_grad_enabled(mode)`).
pub fn set_grad_enabled(enabled: bool) -> GradModeGuard {
    let inference = is_inference_mode_enabled();
    GradModeGuard::set(enabled && !inference, inference)
}

/// No recording, and tensors made inside are *inference tensors*: they carry no tape at all
/// and cannot later be saved for backward (`with torch.inference_mode():`).
pub fn inference_mode() -> GradModeGuard {
    GradModeGuard::set(false, true)
}

/// Runs `f` under [`no_grad`].
pub fn with_no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = no_grad();
    f()
}

// --- the autocast hook --------------------------------------------------------------------

/// What autocast (a later crate, `ember-amp`) plugs in: for an op, the device its inputs
/// live on and the dtypes of its eligible inputs, the dtype to compute in, or `None` to
/// leave the op alone; and how to cast an input to it.
///
/// Note [Autocast hook]: every op with an autocast category in the op table (the
/// products, the ops that run in f32, the ops that promote to the widest input; the
/// `autocast` column of `op_table`, Note [The op table]) calls [`autocast_inputs`] first,
/// with its row. While no policy is installed on the thread that is one read
/// of a thread-local `bool`, so the hook costs nothing when autocast is off. Otherwise the
/// *eligible* inputs are the floating ones other than f64 on the device type of the first
/// of them (as PyTorch's `is_eligible`); the policy answers a dtype for the op on that
/// device type, and each eligible input not already in it is cast through
/// [`AutocastPolicy::cast`] (a recorded `to_dtype`, so gradients come back in each input's
/// own dtype; `ember-amp` caches the casts of f32 leaves there). The op then reruns on the
/// cast inputs, which all have the answered dtype, so the hook answers "nothing to do" the
/// second time and the recursion ends. Ops built from other ops (`linear`, `layer_norm`,
/// `mse_loss` in `ember-nn`) call the hook once at their top in the same way; the ops
/// inside them then see inputs already in the answered dtype. The dependency runs one way:
/// this crate defines the trait and calls it, `ember-amp` implements and installs it.
pub trait AutocastPolicy: Send + Sync {
    /// The compute dtype for `op` (its row of the op table) on `device`'s type, given its
    /// eligible inputs' dtypes (never empty); `None` leaves the op alone.
    fn compute_dtype(&self, op: &'static OpInfo, device: Device, inputs: &[DType])
    -> Option<DType>;

    /// `t` cast to `dtype` for an op under autocast: a recorded [`Tensor::to_dtype`]
    /// unless the policy keeps a cache.
    fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        t.to_dtype(dtype)
    }
}

/// Installs `policy` on this thread until the returned guard drops (nesting restores the
/// previous one).
pub fn set_autocast_policy(policy: Option<Arc<dyn AutocastPolicy>>) -> AutocastGuard {
    let prev = AUTOCAST_POLICY.with(|p| std::mem::replace(&mut *p.borrow_mut(), policy));
    AUTOCAST.with(|c| c.set(AUTOCAST_POLICY.with(|p| p.borrow().is_some())));
    AutocastGuard {
        prev: Some(prev),
        _not_send: std::marker::PhantomData,
    }
}

/// Restores the previous autocast policy when dropped.
#[must_use = "the policy lasts only while the guard lives"]
pub struct AutocastGuard {
    prev: Option<Option<Arc<dyn AutocastPolicy>>>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for AutocastGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AutocastGuard")
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let prev = self.prev.take().flatten();
        AUTOCAST.with(|c| c.set(prev.is_some()));
        AUTOCAST_POLICY.with(|p| *p.borrow_mut() = prev);
    }
}

/// The policy installed on this thread, if any (one thread-local read when none is).
/// `checkpoint` keeps it to recompute under the forward's autocast state; `DataParallel`
/// hands it to the threads that run its replicas.
#[inline]
pub fn current_policy() -> Option<Arc<dyn AutocastPolicy>> {
    if !AUTOCAST.with(Cell::get) {
        return None;
    }
    AUTOCAST_POLICY.with(|p| p.borrow().clone())
}

/// The dtype autocast wants `op` computed in on `device`'s type for eligible inputs of
/// `inputs` dtypes, or `None` (always `None` while no policy is installed: one
/// thread-local read). See Note [Autocast hook].
#[inline]
pub fn autocast_dtype(op: &'static OpInfo, device: Device, inputs: &[DType]) -> Option<DType> {
    current_policy()?.compute_dtype(op, device, inputs)
}

/// `true` for an input autocast may cast: floating, not f64 (PyTorch's `is_eligible`).
fn eligible(t: &Tensor) -> bool {
    let dt = t.dtype();
    dt.is_float() && dt != DType::F64
}

/// The autocast hook of an op (Note [Autocast hook]): `None` when autocast leaves `op`'s
/// `inputs` as they are (always, and after one thread-local read, while autocast is off);
/// otherwise every input, in order, the eligible ones cast to the policy's dtype and the
/// others as given. The op then runs on the returned tensors. `inputs` is any iterator
/// (`[x, w]`, or `[x, w].into_iter().chain(bias)` for optional inputs): it is only walked
/// when a policy is installed, so an op pays nothing for it while autocast is off.
pub fn autocast_inputs<'t>(
    op: &'static OpInfo,
    inputs: impl IntoIterator<Item = &'t Tensor>,
) -> Result<Option<Vec<Tensor>>> {
    let Some(policy) = current_policy() else {
        return Ok(None);
    };
    let inputs: Vec<&Tensor> = inputs.into_iter().collect();
    let Some(device) = inputs.iter().find(|t| eligible(t)).map(|t| t.device()) else {
        return Ok(None);
    };
    let on_type = |t: &Tensor| eligible(t) && t.device().is_cuda() == device.is_cuda();
    let dtypes: Vec<DType> = inputs
        .iter()
        .filter(|t| on_type(t))
        .map(|t| t.dtype())
        .collect();
    let Some(dt) = policy.compute_dtype(op, device, &dtypes) else {
        return Ok(None);
    };
    if dtypes.iter().all(|&d| d == dt) {
        return Ok(None);
    }
    inputs
        .iter()
        .map(|t| {
            if on_type(t) && t.dtype() != dt {
                policy.cast(t, dt)
            } else {
                Ok((*t).clone())
            }
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_and_restore() {
        assert!(is_grad_enabled());
        {
            let _a = no_grad();
            assert!(!is_grad_enabled());
            {
                let _b = enable_grad();
                assert!(is_grad_enabled());
            }
            assert!(!is_grad_enabled());
            {
                let _c = inference_mode();
                assert!(is_inference_mode_enabled());
                let _d = enable_grad();
                assert!(
                    !is_grad_enabled(),
                    "enable_grad does not lift inference mode"
                );
            }
            assert!(!is_inference_mode_enabled());
        }
        assert!(is_grad_enabled());
        let _e = set_grad_enabled(false);
        assert!(!is_grad_enabled());
    }

    #[test]
    fn modes_are_per_thread() {
        let _g = no_grad();
        let other = std::thread::spawn(is_grad_enabled).join().expect("thread");
        assert!(other);
        assert!(!is_grad_enabled());
    }

    use crate::op_table;

    struct Half;
    impl AutocastPolicy for Half {
        fn compute_dtype(&self, op: &'static OpInfo, _: Device, _: &[DType]) -> Option<DType> {
            (op.name == "matmul").then_some(DType::Bf16)
        }
    }

    #[test]
    fn autocast_hook_answers_only_while_installed() -> Result<()> {
        let cpu = Device::Cpu;
        assert_eq!(autocast_dtype(&op_table::matmul, cpu, &[DType::F32]), None);
        let x = Tensor::ones([2, 2], ())?;
        let i = Tensor::ones([2], (cpu, DType::I64))?;
        {
            let _g = set_autocast_policy(Some(Arc::new(Half)));
            assert_eq!(
                autocast_dtype(&op_table::matmul, cpu, &[DType::F32]),
                Some(DType::Bf16)
            );
            assert_eq!(autocast_dtype(&op_table::add, cpu, &[DType::F32]), None);
            let cast = autocast_inputs(&op_table::matmul, [&x, &i])?
                .map(|v| v.iter().map(Tensor::dtype).collect::<Vec<_>>());
            assert_eq!(cast, Some(vec![DType::Bf16, DType::I64]));
            assert!(autocast_inputs(&op_table::add, [&x])?.is_none());
            assert!(
                autocast_inputs(&op_table::matmul, [&i])?.is_none(),
                "no eligible input"
            );
        }
        assert_eq!(autocast_dtype(&op_table::matmul, cpu, &[DType::F32]), None);
        assert!(autocast_inputs(&op_table::matmul, [&x])?.is_none());
        Ok(())
    }
}
