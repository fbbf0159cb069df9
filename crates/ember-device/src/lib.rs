//! Devices, CUDA discovery, the CUDA driver seam, and trace hooks.
//!
//! ```
//! use ember_device::{cuda, Device};
//! let device = Device::cuda_if_available();
//! println!("training on {device}; {} CUDA device(s)", cuda::device_count());
//! ```
//!
//! - [`Device`] (`cpu`, `cuda:N`) and d2l's [`try_gpu`] / [`try_all_gpus`].
//! - [`cuda`]: `torch.cuda`'s discovery calls, the current device and [`cuda::DeviceGuard`].
//! - [`driver`]: the [`driver::Driver`] trait with its real (cudarc) and emulated
//!   implementations. See Note [The driver seam].
//! - [`trace`]: scoped ranges and subscribers for the profiler.

pub mod cuda;
mod device;
pub mod driver;
mod error;
pub mod trace;

pub use device::{Device, try_all_gpus, try_gpu};
pub use error::{DeviceError, ErrorKind, Result};
