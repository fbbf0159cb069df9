//! Device activity records through the seam: CUPTI's activity API on a real GPU, its
//! emulation on the emulator.
//!
//! Note [CUPTI through the seam]:
//!
//! PyTorch's profiler (Kineto) times device work with CUPTI's activity API: the driver
//! itself stamps each kernel, copy and memset with its device start and end, and hands the
//! records over in buffers, so a launch costs the host no more than CUPTI's bookkeeping
//! inside the driver call. Ember's first profiler bracketed every launch with two CUDA events
//! (Note [Device activity] in `trace/device.rs`), which on an H200 cost about 8 µs per
//! launch (`bench/results/2026-11-28-nvidia-h200-cuda.json`, `profiler_*` records). The seam
//! now carries the activity API:
//!
//! - [`Driver::activity_version`](super::Driver::activity_version): CUPTI's API version,
//!   loading `libcupti` on first use; absent or unusable is
//!   [`crate::DeviceError::Unsupported`] saying why (the profiler then uses events);
//! - `activity_enable` / `activity_disable`: start and stop recording kernels, copies and
//!   memsets of every device (`cuptiActivityEnable` of `EXTERNAL_CORRELATION`; `DRIVER` and
//!   `RUNTIME`, whose API records the external ids are linked to, Ember's own calls being
//!   driver calls and a library's launches possibly runtime calls; `CONCURRENT_KERNEL`,
//!   `MEMCPY` and `MEMSET`);
//! - `activity_push_correlation` / `activity_pop_correlation`: around one launch, tag the
//!   work the calling thread enqueues with Ember's correlation id
//!   (`cuptiActivityPushExternalCorrelationId`, Kineto's way of linking an op to its
//!   kernels); a library call (a cuBLAS GEMM, a cuDNN convolution) may run several kernels,
//!   and each record carries the id;
//! - `activity_flush`: flush CUPTI's buffers and take every record completed since the last
//!   flush, with its external id joined from the `EXTERNAL_CORRELATION` records;
//! - `activity_timestamp_ns`: the clock the records are stamped with
//!   (`cuptiGetTimestamp`), read beside the host clock to place the records on it.
//!
//! The emulator serves the same calls (`emulator/activity.rs`): while enabled, each kernel,
//! copy, memset, GEMM and convolution it runs leaves a record stamped with the host clock
//! around the work, tagged with the calling thread's pushed id, so every profiler path that
//! reads CUPTI on a GPU runs in CI. The real part (`real/cupti.rs`) is thin: load, enable,
//! push/pop, flush, and the parsing of the record layouts, which only a GPU exercises.

use serde::{Deserialize, Serialize};

/// What a piece of device work did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActivityKind {
    /// A kernel, or a library call that runs kernels (a cuBLAS GEMM).
    Kernel,
    /// A copy from host to device.
    MemcpyHtoD,
    /// A copy from device to host.
    MemcpyDtoH,
    /// A copy between device buffers.
    MemcpyDtoD,
    /// A memset.
    Memset,
}

impl ActivityKind {
    /// PyTorch's trace category: `kernel`, `gpu_memcpy` or `gpu_memset`.
    pub fn category(self) -> &'static str {
        match self {
            ActivityKind::Kernel => "kernel",
            ActivityKind::Memset => "gpu_memset",
            _ => "gpu_memcpy",
        }
    }
}

/// One kernel, copy or memset as the activity API recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivityRecord {
    /// What it was.
    pub kind: ActivityKind,
    /// The kernel's name as the device ran it (a library's own kernels included); empty for
    /// copies and memsets.
    pub name: String,
    /// The device's ordinal.
    pub device: usize,
    /// Device start, on the [`activity_timestamp_ns`](super::Driver::activity_timestamp_ns)
    /// clock; 0 when the driver could not time the work (CUPTI's `CUPTI_TIMESTAMP_UNKNOWN`,
    /// written when it lacked the device memory to stamp a kernel; the emulator's clock
    /// starts when it is made, so its records are never 0).
    pub start_ns: u64,
    /// Device end, on the same clock; 0 when unknown, as `start_ns`.
    pub end_ns: u64,
    /// The id pushed on the enqueuing thread when it was enqueued, if any.
    pub external: Option<u64>,
    /// Bytes copied or set (0 for kernels).
    pub bytes: u64,
    /// A kernel's grid (zeros otherwise).
    pub grid: [u32; 3],
    /// A kernel's block (zeros otherwise).
    pub block: [u32; 3],
}

impl ActivityRecord {
    /// A kernel named `name` on `device`, its times and external id still to be set.
    pub fn kernel(name: String, device: usize, grid: [u32; 3], block: [u32; 3]) -> Self {
        ActivityRecord {
            kind: ActivityKind::Kernel,
            name,
            device,
            start_ns: 0,
            end_ns: 0,
            external: None,
            bytes: 0,
            grid,
            block,
        }
    }

    /// A copy or memset (`kind`) of `bytes` on `device`, its times and external id still to
    /// be set.
    pub fn transfer(kind: ActivityKind, device: usize, bytes: u64) -> Self {
        ActivityRecord {
            kind,
            bytes,
            grid: [0; 3],
            block: [0; 3],
            ..ActivityRecord::kernel(String::new(), device, [0; 3], [0; 3])
        }
    }
}
