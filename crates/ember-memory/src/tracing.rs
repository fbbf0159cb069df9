//! Allocation and free events for `ember_device::trace` subscribers (the profiler's memory
//! timeline). Called after the allocator's lock is released; see Note [Locking].

use ember_device::Device;

/// An allocation of `bytes` at `addr` on `device` was handed out.
#[inline]
pub(crate) fn alloc(device: Device, addr: u64, bytes: usize) {
    let _ = (device, addr, bytes);
}

/// An allocation of `bytes` at `addr` on `device` was freed.
#[inline]
pub(crate) fn free(device: Device, addr: u64, bytes: usize) {
    let _ = (device, addr, bytes);
}
