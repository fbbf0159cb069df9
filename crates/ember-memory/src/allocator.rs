//! [`CachingAllocator`] (one per device, over any [`RawAllocator`]) and the RAII
//! [`Allocation`] it hands out.
//!
//! Note \[Locking\]:
//!
//! All of an allocator's state (blocks, pools, statistics, pending events, history) lives in
//! one `Mutex`. Every public method takes it once and calls into `state.rs`, which works on
//! `&mut State` and never locks. The raw allocator is called *with the lock held* — its
//! `allocate` (as PyTorch calls `cudaMalloc` under its mutex), `deallocate`, and the event
//! calls of `record_stream` — so:
//!
//! - a [`RawAllocator`] must never call back into a caching allocator, and
//! - nothing done under the lock may drop an [`Allocation`] (its `Drop` takes the lock:
//!   `std::sync::Mutex` is not re-entrant, so that would deadlock).
//!
//! Trace events (`ember_device::trace`) are emitted *after* the lock is released, because a
//! subscriber (the profiler) may itself allocate. A poisoned lock is recovered rather than
//! propagated: state updates do not panic part-way (there is no user code under the lock),
//! and `Drop` must never panic.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use ember_device::Device;
use ember_device::driver::StreamHandle;

use crate::error::{FractionLimit, MemoryError};
use crate::policy::HOST_ALIGNMENT;
use crate::raw::RawAllocator;
use crate::snapshot::{HistoryEntry, MemorySnapshot, history_to_json};
use crate::state::{NIL, State};
use crate::stats::{DeviceStats, MemoryStats, StatType, summary_table};
use crate::tracing;

/// The address of every zero-byte allocation: non-null, aligned to [`HOST_ALIGNMENT`], and
/// never to be dereferenced (like `NonNull::dangling` for a 64-byte alignment).
pub const ZERO_SIZE_ADDR: u64 = HOST_ALIGNMENT as u64;

/// PyTorch's caching allocator over one device's [`RawAllocator`]. See [`crate::policy`] for
/// the policy and Note \[Locking\] above for the locking rule.
///
/// ```
/// use std::sync::Arc;
/// use ember_memory::{CachingAllocator, HostAllocator};
/// let alloc = CachingAllocator::new(Arc::new(HostAllocator));
/// let a = alloc.allocate(1000).unwrap();
/// assert_eq!(a.len(), 1000);
/// assert_eq!(alloc.stats().allocated_bytes.0[0].current, 1024);
/// drop(a);
/// alloc.empty_cache().unwrap();
/// assert_eq!(alloc.stats().reserved_bytes.0[0].current, 0);
/// ```
pub struct CachingAllocator {
    raw: Arc<dyn RawAllocator>,
    device: Device,
    state: Mutex<State>,
    /// Set for allocators that live as long as the process (the registry's): a leaked
    /// handle to this allocator, so that allocations need not count references.
    immortal: OnceLock<&'static Arc<CachingAllocator>>,
}

impl fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("device", &self.device)
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

impl CachingAllocator {
    /// A caching allocator over `raw`, with empty pools.
    pub fn new(raw: Arc<dyn RawAllocator>) -> Arc<Self> {
        let device = raw.device();
        Arc::new(CachingAllocator {
            raw,
            device,
            state: Mutex::new(State::new(device)),
            immortal: OnceLock::new(),
        })
    }

    /// Keep this allocator alive for the rest of the process, so that its allocations hold
    /// a `'static` reference instead of counting references (two atomic operations fewer per
    /// allocate/free pair). For the registry's allocators, which live that long anyway.
    pub(crate) fn make_immortal(self: &Arc<Self>) {
        let _ = self
            .immortal
            .get_or_init(|| Box::leak(Box::new(Arc::clone(self))));
    }

    /// How an allocation refers back to this allocator.
    #[inline]
    fn owner(self: &Arc<Self>) -> Owner {
        match self.immortal.get() {
            Some(&a) => Owner::Immortal(a),
            None => Owner::Shared(Arc::clone(self)),
        }
    }

    /// The device whose memory this allocator hands out.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The raw allocator segments come from.
    pub fn raw(&self) -> &Arc<dyn RawAllocator> {
        &self.raw
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Allocate `bytes` on the default stream.
    pub fn allocate(self: &Arc<Self>, bytes: usize) -> Result<Allocation, MemoryError> {
        self.allocate_on(bytes, StreamHandle::DEFAULT)
    }

    /// Allocate `bytes` for use on `stream`. Zero bytes succeed without consuming anything
    /// (address [`ZERO_SIZE_ADDR`]). Out of memory, after freeing cached segments and
    /// retrying, is [`MemoryError::OutOfMemory`].
    pub fn allocate_on(
        self: &Arc<Self>,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<Allocation, MemoryError> {
        if bytes == 0 {
            return Ok(Allocation {
                allocator: self.owner(),
                addr: ZERO_SIZE_ADDR,
                len: 0,
                block: NIL,
                stream,
            });
        }
        let (block, addr, totals) = {
            let mut state = self.lock();
            let block = state.malloc(self.raw.as_ref(), bytes, stream)?;
            let (addr, size, _) = state.block_info(block);
            let totals = tracing::active().then(|| (state.totals(), size));
            (block, addr, totals)
        };
        if let Some((totals, size)) = totals {
            tracing::emit("memory.alloc", self.device, addr, size, totals);
        }
        Ok(Allocation {
            allocator: self.owner(),
            addr,
            len: bytes,
            block,
            stream,
        })
    }

    fn free(&self, block: u32, addr: u64) {
        let totals = {
            let mut state = self.lock();
            let size = state.block_info(block).1;
            state.free(self.raw.as_ref(), block);
            tracing::active().then(|| (state.totals(), size))
        };
        if let Some((totals, size)) = totals {
            tracing::emit("memory.free", self.device, addr, size, totals);
        }
    }

    /// Return every cached, unsplit segment to the raw allocator, after waiting for pending
    /// stream events. Segments holding a live block stay.
    pub fn empty_cache(&self) -> Result<(), MemoryError> {
        self.lock().release_cached_blocks(self.raw.as_ref())
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> DeviceStats {
        self.lock().stats
    }

    /// PyTorch's flattened statistics (`"allocated_bytes.all.current"`, ...).
    pub fn memory_stats(&self) -> MemoryStats {
        self.stats().to_memory_stats()
    }

    /// Bytes in live allocations (`allocated_bytes.all.current`).
    pub fn memory_allocated(&self) -> u64 {
        self.stats().allocated_bytes[StatType::Aggregate]
            .current
            .max(0) as u64
    }

    /// Bytes reserved from the raw allocator (`reserved_bytes.all.current`).
    pub fn memory_reserved(&self) -> u64 {
        self.stats().reserved_bytes[StatType::Aggregate]
            .current
            .max(0) as u64
    }

    /// Set every peak to its current value.
    pub fn reset_peak_stats(&self) {
        self.lock().stats.reset_peak();
    }

    /// Zero the accumulated totals (`allocated`, `freed`) and the event counters.
    pub fn reset_accumulated_stats(&self) {
        self.lock().stats.reset_accumulated();
    }

    /// Cap reserved memory at `fraction` of the device's total memory (as the raw allocator
    /// reports it). Raw allocators that know no total (host memory) accept the fraction but
    /// are not limited by it. Values outside `0..=1`, and NaN, are
    /// [`MemoryError::InvalidFraction`].
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), MemoryError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(MemoryError::InvalidFraction { fraction });
        }
        let total = self.raw.mem_info().map(|(_, total)| total);
        let mut state = self.lock();
        state.fraction = Some(fraction);
        state.limit = total.map(|total| FractionLimit {
            fraction,
            bytes: (fraction * total as f64) as u64,
        });
        Ok(())
    }

    /// The fraction set with [`CachingAllocator::set_memory_fraction`], if any.
    pub fn memory_fraction(&self) -> Option<f64> {
        self.lock().fraction
    }

    /// Every segment and its blocks.
    pub fn snapshot(&self) -> MemorySnapshot {
        self.lock().snapshot()
    }

    /// `torch.cuda.memory_summary()`: a readable table of the statistics.
    pub fn summary(&self) -> String {
        summary_table(self.device, &self.stats())
    }

    /// Switch history recording on (keeping the last `max_entries` events) or off (which
    /// clears it).
    pub fn record_history(&self, enabled: bool, max_entries: usize) {
        self.lock().history.configure(enabled, max_entries);
    }

    /// The recorded history, oldest first.
    pub fn history(&self) -> Vec<HistoryEntry> {
        self.lock().history.entries()
    }

    /// The recorded history as a JSON array.
    pub fn history_json(&self) -> Result<String, MemoryError> {
        history_to_json(&self.history())
    }

    /// Check that blocks, pools and statistics agree; the first violation found. For tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.lock().check_invariants()
    }
}

/// An allocation's reference to its allocator.
enum Owner {
    /// A counted reference.
    Shared(Arc<CachingAllocator>),
    /// The allocator lives for the rest of the process.
    Immortal(&'static Arc<CachingAllocator>),
}

impl Owner {
    #[inline]
    fn get(&self) -> &Arc<CachingAllocator> {
        match self {
            Owner::Shared(a) => a,
            Owner::Immortal(a) => a,
        }
    }
}

/// Memory from a [`CachingAllocator`]; dropping it gives the block back (never panics).
///
/// `len()` is the requested size; the block behind it may be larger (rounded to 512 bytes).
pub struct Allocation {
    allocator: Owner,
    addr: u64,
    len: usize,
    /// Slab index of the block, or [`NIL`] for a zero-byte allocation.
    block: u32,
    stream: StreamHandle,
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("device", &self.allocator.get().device)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("stream", &self.stream)
            .finish()
    }
}

impl Allocation {
    /// Address of the first byte (a device address for CUDA memory: never dereference it on
    /// the host).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-byte allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.allocator.get().device
    }

    /// The address as a pointer. Valid for reads and writes of `len()` bytes for host
    /// allocations (`cpu`, pinned) while `self` lives; for device allocations it is a device
    /// address that must not be dereferenced on the host.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// The stream the memory was allocated on; it is reused by that stream's allocations
    /// once freed.
    pub fn stream(&self) -> StreamHandle {
        self.stream
    }

    /// The allocator this memory came from.
    pub fn allocator(&self) -> &Arc<CachingAllocator> {
        self.allocator.get()
    }

    /// PyTorch's `record_stream`: the memory is also used by work on `stream`, so when it is
    /// freed it is not reused until the work enqueued on `stream` by then has completed.
    pub fn record_stream(&self, stream: StreamHandle) {
        if self.block != NIL {
            self.allocator
                .get()
                .lock()
                .record_stream(self.block, stream);
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.block != NIL {
            self.allocator.get().free(self.block, self.addr);
        }
    }
}
