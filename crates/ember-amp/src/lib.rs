//! Automatic mixed precision, as `torch.amp`: [`autocast`] (a per-thread policy that
//! `ember-autograd` consults where ops are dispatched, Note [Autocast hook]) and
//! [`scaler::GradScaler`] (loss scaling with one fused inf/NaN check and unscale per device).

pub mod autocast;
pub mod scaler;

pub use scaler::{GradScaler, GradScalerOptions, ScalerError, ScalerState};
