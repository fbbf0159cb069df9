//! Grad modes (per thread, as scoped guards) and the autocast hook.
//!
//! ```
//! use ember_autograd::{Tensor, no_grad, is_grad_enabled};
//! let w = Tensor::ones([3], ())?.requires_grad_(true)?;
//! {
//!     let _g = no_grad();
//!     assert!(!is_grad_enabled());
//!     let y = w.mul(2.0)?;           // not recorded
//!     assert!(!y.requires_grad());
//! }
//! assert!(w.mul(2.0)?.requires_grad());
//! # Ok::<(), ember_autograd::Error>(())
//! ```

use std::cell::Cell;
use std::sync::Arc;

use ember_tensor::DType;

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

/// What autocast (a later crate, `ember-amp`) plugs in: for an op and the dtypes of its
/// floating inputs, the dtype to compute in, or `None` to leave the op alone.
///
/// Note [Autocast hook]: ops that autocast may change (matmul, mm, bmm, addmm, conv2d,
/// softmax, log_softmax, cross_entropy, ...) call [`autocast_dtype`] before running. While
/// no policy is installed on the thread that is one read of a thread-local `bool`, so the
/// hook costs nothing when autocast is off. When a policy answers a dtype, the op casts its
/// floating inputs to it (recorded, so gradients come back in each input's own dtype).
pub trait AutocastPolicy: Send + Sync {
    /// The compute dtype for `op` given its floating inputs' dtypes.
    fn compute_dtype(&self, op: &'static str, inputs: &[DType]) -> Option<DType>;
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

/// The dtype autocast wants `op` computed in, or `None` (always `None` while no policy is
/// installed: one thread-local read). See Note [Autocast hook].
#[inline]
pub fn autocast_dtype(op: &'static str, inputs: &[DType]) -> Option<DType> {
    if !AUTOCAST.with(Cell::get) {
        return None;
    }
    AUTOCAST_POLICY.with(|p| p.borrow().as_ref()?.compute_dtype(op, inputs))
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

    struct Half;
    impl AutocastPolicy for Half {
        fn compute_dtype(&self, op: &'static str, _: &[DType]) -> Option<DType> {
            (op == "matmul").then_some(DType::Bf16)
        }
    }

    #[test]
    fn autocast_hook_answers_only_while_installed() {
        assert_eq!(autocast_dtype("matmul", &[DType::F32]), None);
        {
            let _g = set_autocast_policy(Some(Arc::new(Half)));
            assert_eq!(autocast_dtype("matmul", &[DType::F32]), Some(DType::Bf16));
            assert_eq!(autocast_dtype("add", &[DType::F32]), None);
        }
        assert_eq!(autocast_dtype("matmul", &[DType::F32]), None);
    }
}
