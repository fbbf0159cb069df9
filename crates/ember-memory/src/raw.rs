//! Raw allocators: where segments come from. The caching allocator is one algorithm over
//! any [`RawAllocator`]; this module has the three real ones:
//!
//! - [`HostAllocator`]: aligned host memory (64 bytes; 2 MiB, advised as transparent huge
//!   pages, for segments of 2 MiB or more) from `std::alloc`.
//! - [`PinnedHostAllocator`]: page-locked host memory from the driver when CUDA is real;
//!   plain aligned host memory under the emulator or without CUDA.
//! - [`CudaRawAllocator`]: device memory of one CUDA ordinal through
//!   [`ember_device::driver::Driver`].
//!
//! This is the crate's `unsafe` edge: the host allocators hand out memory from
//! `std::alloc` and give it back with the same layout.

use std::alloc::Layout;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};

use ember_device::Device;
use ember_device::driver::{DevicePtr, Driver, DriverKind, EventHandle, StreamHandle};

use crate::error::RawAllocError;
use crate::policy::HOST_ALIGNMENT;

/// A source of segments for one device. Implementations must be thread-safe and must
/// never call back into a [`crate::CachingAllocator`] (the caching allocator calls them with
/// its lock held; see Note \[Locking\] in the allocator).
pub trait RawAllocator: Send + Sync + Debug {
    /// The device whose memory this allocator hands out.
    fn device(&self) -> Device;

    /// Allocate `bytes` (> 0) bytes; returns the address of the first byte.
    /// [`RawAllocError::OutOfMemory`] when there is no memory left for it.
    fn allocate(&self, bytes: usize) -> Result<u64, RawAllocError>;

    /// Give back memory from [`RawAllocator::allocate`].
    ///
    /// # Safety
    /// `addr` must come from `allocate` on this allocator with the same `bytes`, must not be
    /// given back already, and nothing may use the memory afterwards.
    unsafe fn deallocate(&self, addr: u64, bytes: usize) -> Result<(), RawAllocError>;

    /// `(free, total)` bytes of the device, or `None` where unknown (host memory).
    fn mem_info(&self) -> Option<(u64, u64)>;

    /// Record an event on `stream` that completes when the work enqueued on it so far has.
    /// `Ok(None)` means that work is already complete (host memory, no streams).
    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>, RawAllocError> {
        let _ = stream;
        Ok(None)
    }

    /// Whether an event from [`RawAllocator::record_event`] has completed.
    fn event_done(&self, event: EventHandle) -> Result<bool, RawAllocError> {
        let _ = event;
        Ok(true)
    }

    /// Wait for an event from [`RawAllocator::record_event`] to complete.
    fn synchronize_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        while !self.event_done(event)? {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Release an event from [`RawAllocator::record_event`] (completed or not).
    fn release_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        let _ = event;
        Ok(())
    }

    /// Wait for all work on all of the device's streams. Used when an event could not be
    /// recorded: the block waits for a full synchronisation instead.
    fn synchronize(&self) -> Result<(), RawAllocError> {
        Ok(())
    }
}

/// Host segments of at least this many bytes (every large-pool segment: they are rounded
/// to 2 MiB) are aligned to it and advised as transparent huge pages. See Note [Huge pages].
pub const HUGE_PAGE: usize = 2 << 20;

// Note [Huge pages]:
// With 4 KiB pages, a stream over a 64 MB tensor crosses 16 Ki pages: a TLB miss and a
// hardware-prefetch restart at each. Linux backs `madvise(MADV_HUGEPAGE)` ranges with 2 MiB
// pages where transparent huge pages are in `madvise` mode (the default of most
// distributions) or `always`. Long streaming reads (a two-thread sum over 16M f32) gain a
// little from it and writes do not change (`sum_f32_16m`, `add_f32_16m` in
// docs/performance.md). PyTorch has the same behind `THP_MEM_ALLOC_ENABLE=1`; the caching allocator keeps segments, so the cost of a
// huge page's first touch (2 MiB zeroed at once) is paid once. `EMBER_CPU_HUGEPAGES=0`
// turns the advice off (e.g. where compaction stalls at fault time matter more); the 2 MiB
// alignment stays, so layouts do not depend on the variable.

/// The layout of a host segment of `bytes` bytes.
fn host_layout(bytes: usize) -> Result<Layout, RawAllocError> {
    let align = if bytes >= HUGE_PAGE {
        HUGE_PAGE
    } else {
        HOST_ALIGNMENT
    };
    Layout::from_size_align(bytes, align).map_err(|_| RawAllocError::OutOfMemory)
}

/// Whether to advise large host segments as huge pages (`EMBER_CPU_HUGEPAGES`, default on).
fn huge_pages_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("EMBER_CPU_HUGEPAGES").as_deref() != Ok("0"))
}

/// Advise `bytes` at `ptr` (2 MiB aligned, owned by the caller) as transparent huge pages.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    // SAFETY: the range is one live allocation of the caller's; MADV_HUGEPAGE only changes
    // how the kernel backs it with pages, never its contents. An error (transparent huge
    // pages disabled, an old kernel) leaves the range as it was, which is fine.
    let _ = unsafe { libc::madvise(ptr.cast(), bytes, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _bytes: usize) {}

/// Allocate `bytes` of host memory aligned to [`HOST_ALIGNMENT`] (to [`HUGE_PAGE`] from
/// that size on).
fn host_alloc(bytes: usize) -> Result<u64, RawAllocError> {
    if bytes == 0 {
        return Err(RawAllocError::Other("zero-byte raw allocation".into()));
    }
    let layout = host_layout(bytes)?;
    // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two alignment.
    let ptr = unsafe { std::alloc::alloc(layout) };
    if ptr.is_null() {
        return Err(RawAllocError::OutOfMemory);
    }
    if bytes >= HUGE_PAGE && huge_pages_wanted() {
        advise_huge_pages(ptr, bytes);
    }
    Ok(ptr as u64)
}

/// Free host memory from [`host_alloc`].
///
/// # Safety
/// As [`RawAllocator::deallocate`]: `addr` from `host_alloc(bytes)`, not freed yet.
unsafe fn host_free(addr: u64, bytes: usize) -> Result<(), RawAllocError> {
    let layout = host_layout(bytes)?;
    // SAFETY: the caller guarantees `addr` came from `std::alloc::alloc` with this same
    // layout (`host_alloc(bytes)`) and has not been freed.
    unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
    Ok(())
}

/// Aligned host memory ([`HOST_ALIGNMENT`] = 64 bytes, [`HUGE_PAGE`] for segments of that
/// size or more, advised as huge pages) from `std::alloc`, for `cpu`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostAllocator;

impl RawAllocator for HostAllocator {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn allocate(&self, bytes: usize) -> Result<u64, RawAllocError> {
        host_alloc(bytes)
    }

    unsafe fn deallocate(&self, addr: u64, bytes: usize) -> Result<(), RawAllocError> {
        // SAFETY: forwarded contract: `addr` came from `allocate(bytes)` on this allocator.
        unsafe { host_free(addr, bytes) }
    }

    fn mem_info(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Host memory for fast, asynchronous copies to and from devices. Page-locked through the
/// driver ([`Driver::malloc_host`]) when the CUDA driver is real; plain aligned host memory
/// (like [`HostAllocator`]) under the emulator or without CUDA.
///
/// Stream events: with a driver, `record_stream` on a pinned block records an event on the
/// given stream through the driver, on the thread's current CUDA device; a stream of
/// another device makes that fail, and the block then waits for a full synchronisation of
/// that device.
#[derive(Debug, Clone)]
pub struct PinnedHostAllocator {
    driver: Option<Arc<dyn Driver>>,
    events: Option<Arc<EventPool>>,
}

impl PinnedHostAllocator {
    /// Over the process's CUDA driver when there is one (real or emulated), else plain host
    /// memory.
    pub fn new() -> Self {
        Self::with_driver(ember_device::cuda::driver().ok())
    }

    /// Over a given driver (`None`: plain host memory, trivially complete events).
    pub fn with_driver(driver: Option<Arc<dyn Driver>>) -> Self {
        let events = driver.clone().map(EventPool::new);
        PinnedHostAllocator { driver, events }
    }

    /// Whether memory really is page-locked (a real driver).
    pub fn is_page_locked(&self) -> bool {
        self.real_driver().is_some()
    }

    fn real_driver(&self) -> Option<&Arc<dyn Driver>> {
        self.driver
            .as_ref()
            .filter(|d| d.kind() == DriverKind::Real)
    }
}

impl Default for PinnedHostAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl RawAllocator for PinnedHostAllocator {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn allocate(&self, bytes: usize) -> Result<u64, RawAllocError> {
        match self.real_driver() {
            Some(d) => Ok(d.malloc_host(bytes)? as u64),
            None => host_alloc(bytes),
        }
    }

    unsafe fn deallocate(&self, addr: u64, bytes: usize) -> Result<(), RawAllocError> {
        match self.real_driver() {
            // SAFETY: forwarded contract: `addr` came from `allocate(bytes)`, which used
            // `malloc_host(bytes)` on this same driver, and is not in use any more.
            Some(d) => Ok(unsafe { d.free_host(addr as *mut u8, bytes) }?),
            // SAFETY: forwarded contract: `addr` came from `host_alloc(bytes)`.
            None => unsafe { host_free(addr, bytes) },
        }
    }

    fn mem_info(&self) -> Option<(u64, u64)> {
        None
    }

    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>, RawAllocError> {
        let Some(pool) = &self.events else {
            return Ok(None);
        };
        let device = ember_device::cuda::current_device().unwrap_or(0);
        pool.record(device, stream).map(Some)
    }

    fn event_done(&self, event: EventHandle) -> Result<bool, RawAllocError> {
        match &self.driver {
            Some(d) => Ok(d.event_query(event)?),
            None => Ok(true),
        }
    }

    fn synchronize_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        match &self.driver {
            Some(d) => Ok(d.event_synchronize(event)?),
            None => Ok(()),
        }
    }

    fn release_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        match &self.events {
            Some(pool) => pool.release(event),
            None => Ok(()),
        }
    }

    fn synchronize(&self) -> Result<(), RawAllocError> {
        if let Some(d) = &self.driver {
            for device in 0..d.device_count() {
                d.synchronize(device)?;
            }
        }
        Ok(())
    }
}

/// Spare events kept per allocator (beyond them, released events are destroyed).
const EVENT_POOL_MAX: usize = 64;

/// Note [Allocator event pool]: a block used on another stream (or, for pinned host memory,
/// on any stream: Note [Host blocks wait for every stream]) waits for an event recorded at
/// its free. Creating and destroying one per free costs two driver calls each time (a
/// multi-tensor optimizer step frees a pinned table every step), so released events go on
/// a free list per device and the next record takes one from there, as PyTorch's
/// allocators keep an event pool. The pool destroys its spare events when the allocator
/// goes away.
#[derive(Debug)]
struct EventPool {
    driver: Arc<dyn Driver>,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Spare events and their devices.
    free: Vec<(usize, EventHandle)>,
    /// The device of each event handed out and not yet released.
    out: HashMap<EventHandle, usize>,
}

impl EventPool {
    fn new(driver: Arc<dyn Driver>) -> Arc<Self> {
        Arc::new(EventPool {
            driver,
            state: Mutex::new(PoolState::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An event of `device` (a spare one, else a new one) recorded on `stream`.
    fn record(&self, device: usize, stream: StreamHandle) -> Result<EventHandle, RawAllocError> {
        let spare = {
            let mut st = self.lock();
            let at = st.free.iter().rposition(|&(d, _)| d == device);
            at.map(|i| st.free.swap_remove(i).1)
        };
        let event = match spare {
            Some(e) => e,
            None => self.driver.event_create(device, false)?,
        };
        if let Err(e) = self.driver.event_record(event, stream) {
            let _ = self.driver.event_destroy(event);
            return Err(e.into());
        }
        self.lock().out.insert(event, device);
        Ok(event)
    }

    /// Back to the free list (or destroyed when the list is full or the event is unknown).
    fn release(&self, event: EventHandle) -> Result<(), RawAllocError> {
        {
            let mut st = self.lock();
            if let Some(device) = st.out.remove(&event)
                && st.free.len() < EVENT_POOL_MAX
            {
                st.free.push((device, event));
                return Ok(());
            }
        }
        Ok(self.driver.event_destroy(event)?)
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        let st = std::mem::take(&mut *self.lock());
        for (_, e) in st.free {
            let _ = self.driver.event_destroy(e);
        }
    }
}

/// Device memory of one CUDA ordinal, through the driver seam ([`Driver::malloc`] /
/// [`Driver::free`]); stream events through the driver's events.
#[derive(Debug, Clone)]
pub struct CudaRawAllocator {
    driver: Arc<dyn Driver>,
    ordinal: usize,
    events: Arc<EventPool>,
}

impl CudaRawAllocator {
    /// Over `driver`'s device `ordinal`; an ordinal out of range is
    /// [`ember_device::DeviceError::InvalidIndex`].
    pub fn new(driver: Arc<dyn Driver>, ordinal: usize) -> ember_device::Result<Self> {
        let count = driver.device_count();
        if ordinal >= count {
            return Err(ember_device::DeviceError::InvalidIndex {
                index: ordinal,
                count,
            });
        }
        let events = EventPool::new(driver.clone());
        Ok(CudaRawAllocator {
            driver,
            ordinal,
            events,
        })
    }

    /// The driver behind this allocator.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }
}

impl RawAllocator for CudaRawAllocator {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn allocate(&self, bytes: usize) -> Result<u64, RawAllocError> {
        Ok(self.driver.malloc(self.ordinal, bytes)?.0)
    }

    unsafe fn deallocate(&self, addr: u64, _bytes: usize) -> Result<(), RawAllocError> {
        Ok(self.driver.free(self.ordinal, DevicePtr(addr))?)
    }

    fn mem_info(&self) -> Option<(u64, u64)> {
        self.driver.mem_get_info(self.ordinal).ok()
    }

    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>, RawAllocError> {
        self.events.record(self.ordinal, stream).map(Some)
    }

    fn event_done(&self, event: EventHandle) -> Result<bool, RawAllocError> {
        Ok(self.driver.event_query(event)?)
    }

    fn synchronize_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        Ok(self.driver.event_synchronize(event)?)
    }

    fn release_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        self.events.release(event)
    }

    fn synchronize(&self) -> Result<(), RawAllocError> {
        Ok(self.driver.synchronize(self.ordinal)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_aligned_and_writable() {
        let raw = HostAllocator;
        for bytes in [
            1usize,
            64,
            4096,
            HUGE_PAGE - 64,
            HUGE_PAGE,
            3 << 20,
            64 << 20,
        ] {
            let addr = raw.allocate(bytes).unwrap();
            assert_eq!(addr % HOST_ALIGNMENT as u64, 0);
            if bytes >= HUGE_PAGE {
                assert_eq!(addr % HUGE_PAGE as u64, 0, "{bytes} bytes");
            }
            // SAFETY: `addr` is a fresh allocation of `bytes` bytes.
            let s = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, bytes) };
            s.fill(0xAB);
            assert!(s.iter().all(|&b| b == 0xAB));
            // SAFETY: allocated above with the same size; not used afterwards.
            unsafe { raw.deallocate(addr, bytes) }.unwrap();
        }
        assert!(raw.allocate(0).is_err());
        assert_eq!(raw.allocate(usize::MAX), Err(RawAllocError::OutOfMemory));
    }

    #[test]
    fn pinned_without_driver_is_host_memory() {
        let raw = PinnedHostAllocator::with_driver(None);
        assert!(!raw.is_page_locked());
        let addr = raw.allocate(1000).unwrap();
        assert_eq!(addr % HOST_ALIGNMENT as u64, 0);
        assert_eq!(raw.record_event(StreamHandle(7)), Ok(None));
        // SAFETY: allocated above with the same size.
        unsafe { raw.deallocate(addr, 1000) }.unwrap();
    }
}
