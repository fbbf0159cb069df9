//! Autograd for Ember: the functions around the tape of `ember-tensor`'s [`Tensor`].
//!
//! [`Tensor`] is PyTorch's `torch.Tensor`, defined once in `ember-tensor`: when grad mode is
//! on and an input requires grad, each op records a node whose backward is written beside
//! its forward in the op table, so it runs on every device the forward runs on. This crate
//! is where users find autograd (`backward`, `grad`, grad modes, hooks, custom ops,
//! checkpointing) and adds [`gradcheck`], the finite-difference check every differentiable
//! op passes.
//!
//! ```
//! use ember_autograd::{Tensor, no_grad};
//! use ember_tensor::Device;
//! let w = Tensor::from_vec(vec![0.5f32, -1.0], [2, 1], &Device::Cpu)?.requires_grad_(true)?;
//! let x = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2], &Device::Cpu)?;
//! let loss = x.matmul(&w)?.relu()?.sum_all()?;
//! loss.backward()?;
//! println!("{}", w.grad().unwrap());            // tensor([[1.], [2.]]) for the live row
//! {
//!     let _g = no_grad();                       // an optimizer step: not recorded
//!     w.sub_(&w.grad().unwrap().mul(0.1)?)?;
//! }
//! # Ok::<(), ember_autograd::Error>(())
//! ```
//!
//! Modules: [`mode`] (grad modes and the autocast hook, from `ember-tensor`), `gradcheck`.

mod gradcheck;

pub use ember_error::{Error, ErrorKind, Result};
pub use ember_tensor::autograd::mode;
pub use ember_tensor::{
    AutogradError, CrossEntropyOptions, GradModeGuard, GradOptions, HookHandle, NllLossOptions,
    Operand, Reduction, Tensor, backward, checkpoint, custom_op, enable_grad, grad, inference_mode,
    is_grad_enabled, is_inference_mode_enabled, no_grad, reachable_leaves, set_grad_enabled,
    r#where, with_no_grad,
};
pub use gradcheck::{GradcheckOptions, gradcheck};
