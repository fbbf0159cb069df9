//! [`FakeRawAllocator`]: a raw allocator over a pretend address range, for tests of the
//! caching allocator (and of code above it) without real memory: a fixed capacity,
//! deterministic first-fit addresses, and stream events completed when the test says so.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use ember_device::Device;
use ember_device::driver::{EventHandle, StreamHandle};

use crate::error::RawAllocError;
use crate::raw::RawAllocator;

/// A raw allocator of `capacity` bytes of pretend memory (never dereference its addresses).
///
/// Addresses are handed out first-fit from a fixed base, so a sequence of calls always
/// yields the same addresses. Events start incomplete unless `auto_complete_events` is set;
/// [`FakeRawAllocator::complete_events`] completes them all.
#[derive(Debug)]
pub struct FakeRawAllocator {
    device: Device,
    capacity: u64,
    base: u64,
    total_known: bool,
    inner: Mutex<FakeInner>,
}

#[derive(Debug, Default)]
struct FakeInner {
    live: BTreeMap<u64, usize>,
    used: u64,
    events: HashMap<u64, bool>,
    next_event: u64,
    auto_complete_events: bool,
    fail_events: bool,
    allocations: u64,
}

impl FakeRawAllocator {
    /// `capacity` bytes presented as `device`, with a known total (`mem_info` reports it).
    pub fn new(device: Device, capacity: u64) -> Self {
        let base = match device {
            Device::Cpu => 0x1000_0000_0000,
            Device::Cuda(i) => 0x7f00_0000_0000 + ((i as u64) << 40),
        };
        FakeRawAllocator {
            device,
            capacity,
            base,
            total_known: true,
            inner: Mutex::new(FakeInner::default()),
        }
    }

    /// Report no total (`mem_info` is `None`), like host memory.
    pub fn without_total(mut self) -> Self {
        self.total_known = false;
        self
    }

    /// Complete every event as soon as it is recorded.
    pub fn auto_complete_events(self, yes: bool) -> Self {
        self.lock().auto_complete_events = yes;
        self
    }

    /// Make `record_event` fail (to exercise the synchronisation fallback).
    pub fn fail_events(&self, yes: bool) {
        self.lock().fail_events = yes;
    }

    fn lock(&self) -> MutexGuard<'_, FakeInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Complete every recorded event.
    pub fn complete_events(&self) {
        self.lock()
            .events
            .values_mut()
            .for_each(|done| *done = true);
    }

    /// Events recorded and not yet released.
    pub fn outstanding_events(&self) -> usize {
        self.lock().events.len()
    }

    /// Bytes currently allocated.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Segments currently allocated.
    pub fn live_segments(&self) -> usize {
        self.lock().live.len()
    }

    /// Successful `allocate` calls so far.
    pub fn allocations(&self) -> u64 {
        self.lock().allocations
    }
}

impl RawAllocator for FakeRawAllocator {
    fn device(&self) -> Device {
        self.device
    }

    fn allocate(&self, bytes: usize) -> Result<u64, RawAllocError> {
        if bytes == 0 {
            return Err(RawAllocError::Other("zero-byte raw allocation".into()));
        }
        let mut inner = self.lock();
        let bytes64 = bytes as u64;
        if inner.used + bytes64 > self.capacity {
            return Err(RawAllocError::OutOfMemory);
        }
        // First fit over the gaps between live ranges.
        let mut cursor = self.base;
        for (&addr, &size) in &inner.live {
            if addr - cursor >= bytes64 {
                break;
            }
            cursor = addr + size as u64;
        }
        if cursor + bytes64 > self.base + self.capacity {
            return Err(RawAllocError::OutOfMemory);
        }
        inner.live.insert(cursor, bytes);
        inner.used += bytes64;
        inner.allocations += 1;
        Ok(cursor)
    }

    unsafe fn deallocate(&self, addr: u64, bytes: usize) -> Result<(), RawAllocError> {
        let mut inner = self.lock();
        match inner.live.get(&addr) {
            Some(&size) if size == bytes => {
                inner.live.remove(&addr);
                inner.used -= bytes as u64;
                Ok(())
            }
            Some(&size) => Err(RawAllocError::Other(format!(
                "deallocate {addr:#x}: size {bytes} but allocated with {size}"
            ))),
            None => Err(RawAllocError::Other(format!(
                "deallocate {addr:#x}: not allocated"
            ))),
        }
    }

    fn mem_info(&self) -> Option<(u64, u64)> {
        self.total_known
            .then(|| (self.capacity - self.lock().used, self.capacity))
    }

    fn record_event(&self, stream: StreamHandle) -> Result<Option<EventHandle>, RawAllocError> {
        let _ = stream;
        let mut inner = self.lock();
        if inner.fail_events {
            return Err(RawAllocError::Other("event recording disabled".into()));
        }
        inner.next_event += 1;
        let id = inner.next_event;
        let done = inner.auto_complete_events;
        inner.events.insert(id, done);
        Ok(Some(EventHandle(id)))
    }

    fn event_done(&self, event: EventHandle) -> Result<bool, RawAllocError> {
        match self.lock().events.get(&event.0) {
            Some(&done) => Ok(done),
            None => Err(RawAllocError::Other(format!("unknown event {}", event.0))),
        }
    }

    fn synchronize_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        match self.lock().events.get_mut(&event.0) {
            Some(done) => {
                *done = true;
                Ok(())
            }
            None => Err(RawAllocError::Other(format!("unknown event {}", event.0))),
        }
    }

    fn release_event(&self, event: EventHandle) -> Result<(), RawAllocError> {
        self.lock().events.remove(&event.0);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), RawAllocError> {
        self.complete_events();
        Ok(())
    }
}
