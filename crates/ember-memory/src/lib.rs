//! PyTorch's caching allocator made device-agnostic: one algorithm over any raw allocator
//! (aligned host memory, pinned host memory, CUDA device memory), with memory statistics,
//! snapshots and a recorded history for every device, the CPU included.
//!
//! ```
//! use ember_memory::{Device, allocator, memory_allocated, memory_reserved, empty_cache};
//! # fn main() -> Result<(), ember_memory::MemoryError> {
//! let cpu = allocator(Device::Cpu)?;
//! let before = memory_allocated(Device::Cpu)?;
//! let buf = cpu.allocate(1 << 20)?; // 1 MiB: small pool, a 2 MiB segment
//! // SAFETY: host memory, valid for `len()` bytes while `buf` lives.
//! unsafe { std::ptr::write_bytes(buf.as_ptr(), 0, buf.len()) };
//! assert!(memory_allocated(Device::Cpu)? >= before + (1 << 20));
//! drop(buf); // back to the cache, still reserved
//! empty_cache(Device::Cpu)?;
//! # let _ = memory_reserved(Device::Cpu)?;
//! # Ok(()) }
//! ```
//!
//! - [`policy`]: the caching policy as a list, its size constants and pure functions.
//! - [`CachingAllocator`] and its RAII [`Allocation`]; Note \[Locking\] in `allocator.rs`.
//! - [`RawAllocator`] and [`HostAllocator`], [`PinnedHostAllocator`], [`CudaRawAllocator`].
//! - Statistics: [`Stat`], [`StatType`], [`DeviceStats`], [`MemoryStats`], [`format_size`].
//! - [`MemorySnapshot`] and the history ([`HistoryEntry`]).
//! - The per-device registry and `torch.cuda`'s memory functions: [`allocator`],
//!   [`memory_allocated`], [`memory_summary`], [`set_per_process_memory_fraction`], ...
//! - [`testing::FakeRawAllocator`] for tests without real memory.

mod allocator;
mod error;
pub mod policy;
mod raw;
mod registry;
mod snapshot;
mod state;
mod stats;
pub mod testing;
mod tracing;

pub use allocator::{Allocation, CachingAllocator, ZERO_SIZE_ADDR};
pub use ember_device::driver::{EventHandle, StreamHandle};
pub use ember_device::{Device, DeviceError};
pub use error::{FractionLimit, MemoryError, RawAllocError};
pub use policy::PoolKind;
pub use raw::{CudaRawAllocator, HostAllocator, PinnedHostAllocator, RawAllocator};
pub use registry::{
    allocator, empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
    memory_history, memory_reserved, memory_snapshot, memory_stats, memory_summary,
    pinned_allocator, record_memory_history, reset_accumulated_memory_stats,
    reset_peak_memory_stats, set_per_process_memory_fraction,
};
pub use snapshot::{
    BlockSnapshot, BlockState, DEFAULT_HISTORY_ENTRIES, HistoryAction, HistoryEntry,
    MemorySnapshot, SegmentSnapshot, history_to_json,
};
pub use stats::{DeviceStats, MemoryStats, Stat, StatArray, StatType, format_size};
