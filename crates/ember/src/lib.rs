//! Ember: a deep-learning framework in Rust with PyTorch's GPU workflow.
//!
//! This umbrella crate re-exports the layered crates so users write `ember::Device`,
//! `ember::cuda::is_available()`, `ember::memory::memory_allocated(..)`:
//!
//! ```
//! use ember::{cuda, memory, Device};
//! let device = Device::cuda_if_available();
//! println!("CUDA available: {}, using {device}", cuda::is_available());
//! println!("{} bytes allocated on cpu", memory::memory_allocated(Device::Cpu)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Device`], [`try_gpu`], [`try_all_gpus`] — from `ember-device`.
//! - [`cuda`] — `torch.cuda`'s discovery calls, streams and events; [`driver`] the seam.
//! - [`memory`] — the caching allocator and its statistics (`ember-memory`).
//! - [`trace`] — scoped ranges the profiler subscribes to.
//! - [`info`] — what `ember info` prints, as a value.

pub mod info;

pub use ember_device::{Device, DeviceError, cuda, driver, trace, try_all_gpus, try_gpu};

/// The caching allocator and memory statistics, for every device (the CPU included).
pub mod memory {
    pub use ember_memory::*;
}
