//! The `ember` program's library half: what `ember train` and `ember info` do, as functions
//! the binary (`src/main.rs`) and the tests call. It sits on top of every Ember crate, so the
//! umbrella library `ember` carries no command-line dependency (`clap`, `indicatif`).
//!
//! - [`train`]: `ember train` — the digits, a model, the loop, validation, checkpoints.
//! - [`generate`]: `ember generate` — text sampled from a checkpoint of `--model gpt`.
//! - [`info`]: `ember info` — what `torch.cuda` would report, as text or JSON.

pub mod generate;
pub mod info;
pub mod train;
