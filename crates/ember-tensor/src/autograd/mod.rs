//! The tape behind [`Tensor`](crate::Tensor): the graph of recorded ops, the backward
//! engine, grad modes and the autocast hook, views rebased after in-place writes, custom
//! ops and activation checkpointing.
//!
//! - `graph`: nodes, edges, saved tensors (Note [Graph ownership]).
//! - `engine`: the backward engine (Note [Backward engine]), [`backward`], [`grad`].
//! - [`mode`]: [`no_grad`], [`enable_grad`], [`inference_mode`], [`set_grad_enabled`],
//!   and the autocast hook (Note [Autocast hook]).
//! - `rebase`: views and in-place writes through them (Note [View rebase]).
//! - `function`: [`custom_op`] (Note [Custom ops]); `checkpoint`: [`checkpoint`]
//!   (Note [Checkpoint]); `error`: [`AutogradError`].

mod checkpoint;
pub(crate) mod engine;
pub(crate) mod error;
mod function;
pub(crate) mod graph;
pub mod mode;
pub(crate) mod rebase;

pub use checkpoint::checkpoint;
pub use engine::{GradOptions, backward, grad, reachable_leaves};
pub use error::AutogradError;
pub use function::custom_op;
pub use mode::{
    GradModeGuard, enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled,
    no_grad, set_grad_enabled, with_no_grad,
};
