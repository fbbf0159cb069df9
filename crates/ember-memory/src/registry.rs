//! The process's allocators, one per device, created on first use, and the `torch.cuda`
//! memory functions over them (`memory_allocated(device)`, `empty_cache(device)`, ...).
//!
//! `cpu` is served by a [`HostAllocator`]; `cuda:N` by a [`CudaRawAllocator`] over
//! [`ember_device::cuda::driver`]. Pinned host memory has its own allocator
//! ([`pinned_allocator`]); the `cpu` statistics do not include it.

use std::sync::{Arc, OnceLock, RwLock};

use ember_device::Device;

use crate::allocator::CachingAllocator;
use crate::error::MemoryError;
use crate::raw::{CudaRawAllocator, HostAllocator, PinnedHostAllocator};
use crate::snapshot::{DEFAULT_HISTORY_ENTRIES, HistoryEntry, MemorySnapshot};
use crate::stats::{MemoryStats, StatType};

static CPU: OnceLock<Arc<CachingAllocator>> = OnceLock::new();
static PINNED: OnceLock<Arc<CachingAllocator>> = OnceLock::new();
static CUDA: RwLock<Vec<Option<Arc<CachingAllocator>>>> = RwLock::new(Vec::new());

/// The registry's allocators live as long as the process.
fn immortal(a: Arc<CachingAllocator>) -> Arc<CachingAllocator> {
    a.make_immortal();
    a
}

/// The caching allocator of `device`, created on first use. `cuda:N` fails when CUDA is
/// unavailable (the error says why) or `N` is out of range (the error names the index and
/// the count).
pub fn allocator(device: impl Into<Device>) -> Result<Arc<CachingAllocator>, MemoryError> {
    match device.into() {
        Device::Cpu => {
            Ok(Arc::clone(CPU.get_or_init(|| {
                immortal(CachingAllocator::new(Arc::new(HostAllocator)))
            })))
        }
        Device::Cuda(index) => cuda_allocator(index),
    }
}

fn cuda_allocator(index: usize) -> Result<Arc<CachingAllocator>, MemoryError> {
    {
        let table = CUDA.read().unwrap_or_else(|p| p.into_inner());
        if let Some(Some(a)) = table.get(index) {
            return Ok(Arc::clone(a));
        }
    }
    let driver = ember_device::cuda::driver()?;
    let raw = CudaRawAllocator::new(driver, index)?;
    let mut table = CUDA.write().unwrap_or_else(|p| p.into_inner());
    if table.len() <= index {
        table.resize(index + 1, None);
    }
    let entry = table[index].get_or_insert_with(|| immortal(CachingAllocator::new(Arc::new(raw))));
    Ok(Arc::clone(entry))
}

/// The caching allocator of pinned host memory (page-locked when the CUDA driver is real).
pub fn pinned_allocator() -> Arc<CachingAllocator> {
    Arc::clone(
        PINNED
            .get_or_init(|| immortal(CachingAllocator::new(Arc::new(PinnedHostAllocator::new())))),
    )
}

/// Bytes in live allocations on `device` (`torch.cuda.memory_allocated`).
pub fn memory_allocated(device: impl Into<Device>) -> Result<u64, MemoryError> {
    Ok(allocator(device)?.memory_allocated())
}

/// Peak of [`memory_allocated`] since creation or the last peak reset.
pub fn max_memory_allocated(device: impl Into<Device>) -> Result<u64, MemoryError> {
    let s = allocator(device)?.stats();
    Ok(s.allocated_bytes[StatType::Aggregate].peak.max(0) as u64)
}

/// Bytes reserved from the device by the allocator (`torch.cuda.memory_reserved`).
pub fn memory_reserved(device: impl Into<Device>) -> Result<u64, MemoryError> {
    Ok(allocator(device)?.memory_reserved())
}

/// Peak of [`memory_reserved`] since creation or the last peak reset.
pub fn max_memory_reserved(device: impl Into<Device>) -> Result<u64, MemoryError> {
    let s = allocator(device)?.stats();
    Ok(s.reserved_bytes[StatType::Aggregate].peak.max(0) as u64)
}

/// Set every peak statistic of `device` to its current value.
pub fn reset_peak_memory_stats(device: impl Into<Device>) -> Result<(), MemoryError> {
    allocator(device)?.reset_peak_stats();
    Ok(())
}

/// Zero the accumulated totals and counters of `device`.
pub fn reset_accumulated_memory_stats(device: impl Into<Device>) -> Result<(), MemoryError> {
    allocator(device)?.reset_accumulated_stats();
    Ok(())
}

/// Return `device`'s cached, unused segments to the device (`torch.cuda.empty_cache`).
pub fn empty_cache(device: impl Into<Device>) -> Result<(), MemoryError> {
    allocator(device)?.empty_cache()
}

/// `torch.cuda.memory_stats`: PyTorch's flattened keys.
pub fn memory_stats(device: impl Into<Device>) -> Result<MemoryStats, MemoryError> {
    Ok(allocator(device)?.memory_stats())
}

/// `torch.cuda.memory_summary`: a readable table.
pub fn memory_summary(device: impl Into<Device>) -> Result<String, MemoryError> {
    Ok(allocator(device)?.summary())
}

/// Cap what the allocator of `device` may reserve at `fraction` of its total memory
/// (`torch.cuda.set_per_process_memory_fraction`). Rejects values outside `0..=1` and NaN.
/// On `cpu` the total is unknown, so the fraction is accepted but does not limit anything.
pub fn set_per_process_memory_fraction(
    fraction: f64,
    device: impl Into<Device>,
) -> Result<(), MemoryError> {
    allocator(device)?.set_memory_fraction(fraction)
}

/// `torch.cuda.memory_snapshot`: every segment and its blocks.
pub fn memory_snapshot(device: impl Into<Device>) -> Result<MemorySnapshot, MemoryError> {
    Ok(allocator(device)?.snapshot())
}

/// Switch allocation history recording of `device` on (keeping the last
/// [`DEFAULT_HISTORY_ENTRIES`] events) or off.
pub fn record_memory_history(device: impl Into<Device>, enabled: bool) -> Result<(), MemoryError> {
    allocator(device)?.record_history(enabled, DEFAULT_HISTORY_ENTRIES);
    Ok(())
}

/// The recorded allocation history of `device`, oldest first.
pub fn memory_history(device: impl Into<Device>) -> Result<Vec<HistoryEntry>, MemoryError> {
    Ok(allocator(device)?.history())
}
