//! Automatic mixed precision, as `torch.amp`: [`autocast`](mod@autocast) (a per-thread policy that
//! `ember-autograd` consults where ops are dispatched, Note [Autocast hook]) and
//! [`scaler::GradScaler`] (loss scaling with one fused inf/NaN check and unscale per device).
//!
//! - [`autocast`](mod@autocast): regions ([`autocast()`], [`autocast_with`],
//!   [`with_autocast`]) and their state ([`is_autocast_enabled`], [`get_autocast_dtype`]),
//!   Notes [Autocast regions] and [Autocast cache].
//! - [`policy`]: the one table of which ops run in f16/bf16, in f32, or in the widest input
//!   dtype (Note [Autocast policy]).
//! - [`scaler`]: [`GradScaler`] (`torch.amp.GradScaler`): `scale`, `unscale_`, `step`,
//!   `update`, `state_dict`, over two fused tensor ops (Note [GradScaler state]).

pub mod autocast;
pub mod policy;
pub mod scaler;

pub use autocast::{
    AutocastGuard, AutocastOptions, autocast, autocast_with, get_autocast_dtype,
    is_autocast_enabled, with_autocast, with_autocast_opts,
};
pub use scaler::{GradScaler, GradScalerOptions, ScalerError};
