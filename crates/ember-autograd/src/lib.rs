//! Autograd for Ember: a tape over the eager tensor of `ember-tensor`.
//!
//! [`Tensor`] is PyTorch's `torch.Tensor`: the same ops as `ember_tensor::Tensor`, and
//! when grad mode is on and an input requires grad each op records a node whose backward
//! is written with `ember-tensor` ops, so it runs on every device the forward runs on.
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
//! Modules:
//! - `tensor`: [`Tensor`], leaf state (`requires_grad`, `.grad`, hooks), `backward`.
//! - `graph`: nodes, edges, saved tensors (Note [Graph ownership]).
//! - `engine`: the backward engine (Note [Backward engine]), [`backward`], [`grad`].
//! - [`mode`]: [`no_grad`], [`enable_grad`], [`inference_mode`], [`set_grad_enabled`],
//!   and the autocast hook (Note [Autocast hook]).
//! - `rebase`: views and in-place writes through them (Note [View rebase]).
//! - `ops/*`: the differentiable ops; `checkpoint`: [`checkpoint`] (Note [Checkpoint]);
//!   `gradcheck`: [`gradcheck`]; `function`: [`custom_op`] (Note [Custom ops]).

mod checkpoint;
mod create;
mod engine;
mod error;
mod function;
mod gradcheck;
mod graph;
pub mod mode;
mod ops;
mod rebase;
mod tensor;

pub use checkpoint::checkpoint;
pub use ember_device::ErrorKind;
pub use ember_tensor::Reduction;
pub use engine::{GradOptions, backward, grad, reachable_leaves};
pub use error::{AutogradError, Error, Result};
pub use function::custom_op;
pub use gradcheck::{GradcheckOptions, gradcheck};
pub use mode::{
    GradModeGuard, enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled,
    no_grad, set_grad_enabled, with_no_grad,
};
pub use ops::{CrossEntropyOptions, NllLossOptions, Operand, r#where};
pub use tensor::{HookHandle, Tensor};
