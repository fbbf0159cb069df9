//! Allocation and free events for `ember_device::trace` subscribers (the profiler's memory
//! timeline): point events named `memory.alloc` and `memory.free` whose metadata is a JSON
//! object `{"device", "addr", "bytes", "total_allocated", "total_reserved"}`: `bytes` is the
//! block's size as the allocator counts it in `memory_allocated` (the request rounded up, as
//! PyTorch reports it), the totals are those after the event. Emitted after the allocator's lock is released (see Note \[Locking\]); free of
//! cost beyond one relaxed atomic load while nobody subscribes, two while the subscriber
//! (a profiler without `profile_memory`) does not want them.

use ember_device::Device;
use ember_device::trace;

/// Whether anybody listens for allocation events (so that totals are worth reading under
/// the lock).
#[inline]
pub(crate) fn active() -> bool {
    trace::is_active() && trace::memory_wanted()
}

/// Emit `name` (`memory.alloc` or `memory.free`) for `bytes` at `addr`.
#[inline]
pub(crate) fn emit(
    name: &'static str,
    device: Device,
    addr: u64,
    bytes: usize,
    totals: (i64, i64),
) {
    trace::instant(name, || {
        format!(
            "{{\"device\":\"{device}\",\"addr\":{addr},\"bytes\":{bytes},\
             \"total_allocated\":{},\"total_reserved\":{}}}",
            totals.0, totals.1
        )
    });
}
