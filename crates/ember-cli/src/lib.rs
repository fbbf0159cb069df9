//! The `ember` program's library half: what `ember train` and `ember info` do, as functions
//! the binary (`src/main.rs`) and the tests call. It sits on top of every Ember crate, so the
//! umbrella library `ember` carries no command-line dependency (`clap`, `indicatif`).
//!
//! - [`train`]: `ember train` — the digits, a model, the loop, validation, checkpoints.
//! - [`info`]: `ember info` — what `torch.cuda` would report, as text or JSON.

pub mod info;
pub mod train;
