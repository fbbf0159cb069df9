//! The caching allocator over emulated CUDA devices: an `Emulator` built directly with a
//! small total memory (OOM, retry, fraction limit, streams, random sequences), and the
//! global registry over the process's emulator (`EmulatorConfig::devices(2)`).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{Model, op};
use ember_device::driver::Driver;
use ember_device::driver::emulator::{Emulator, EmulatorConfig};
use ember_memory::{CachingAllocator, CudaRawAllocator, Device, MemoryError, StreamHandle};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// One emulated device with `mib` MiB of memory, and a caching allocator over it.
fn small_device(mib: u64) -> (Arc<Emulator>, Arc<CachingAllocator>) {
    let emu =
        Arc::new(Emulator::new(EmulatorConfig::devices(1).with_total_memory(mib << 20)).unwrap());
    let raw = CudaRawAllocator::new(emu.clone(), 0).unwrap();
    (emu, CachingAllocator::new(Arc::new(raw)))
}

#[test]
fn oom_on_a_small_device_reports_capacity_and_free() {
    let (emu, alloc) = small_device(64);
    let a = alloc.allocate(40 * MIB).unwrap();
    assert_eq!(alloc.device(), Device::Cuda(0));
    let err = alloc.allocate(40 * MIB).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of \
             64.00 MiB of which 24.00 MiB is free. Of the allocated memory 40.00 MiB is \
             allocated by Ember, and 0 bytes is reserved by Ember but unallocated."
        ),
        "{msg}"
    );
    assert_eq!(alloc.stats().num_ooms, 1);
    drop(a);
    alloc.empty_cache().unwrap();
    assert_eq!(emu.mem_get_info(0).unwrap(), (64 << 20, 64 << 20));
}

#[test]
fn retry_frees_cached_segments_on_a_small_device() {
    let (emu, alloc) = small_device(64);
    let a = alloc.allocate_on(40 * MIB, StreamHandle::DEFAULT).unwrap();
    drop(a); // cached
    let stream = emu.stream_create(0).unwrap();
    // Another stream cannot reuse the cached block; the device is too full for a new
    // segment until the cached one is freed.
    let b = alloc.allocate_on(40 * MIB, stream).unwrap();
    let s = alloc.stats();
    assert!(s.num_alloc_retries >= 1);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_ooms, 0);
    drop(b);
    alloc.empty_cache().unwrap();
    emu.stream_destroy(stream).unwrap();
}

#[test]
fn fraction_limit_on_an_emulated_device() {
    let (_emu, alloc) = small_device(64);
    alloc.set_memory_fraction(0.25).unwrap();
    let a = alloc.allocate(12 * MIB).unwrap();
    let err = alloc.allocate(12 * MIB).unwrap_err();
    assert!(err.is_out_of_memory());
    let msg = err.to_string();
    assert!(
        msg.contains("at most 16.00 MiB (set_per_process_memory_fraction(0.25))"),
        "{msg}"
    );
    assert!(msg.contains("raise the limit"), "{msg}");
    for bad in [-0.1, 1.5, f64::NAN] {
        assert!(matches!(
            alloc.set_memory_fraction(bad),
            Err(MemoryError::InvalidFraction { .. })
        ));
    }
    drop(a);
}

#[test]
fn record_stream_with_emulated_events() {
    let (emu, alloc) = small_device(64);
    let side = emu.stream_create(0).unwrap();
    let a = alloc.allocate(MIB).unwrap();
    a.record_stream(side);
    drop(a);
    // The emulator's streams are synchronous, so the event is complete; the next
    // allocation collects it and reuses the block.
    let b = alloc.allocate(MIB).unwrap();
    assert_eq!(alloc.stats().active.0[0].current, 1);
    drop(b);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.memory_reserved(), 0);
    emu.stream_destroy(side).unwrap();
}

/// Events recorded for frees come from a pool: after the first, a block used on another
/// stream (device memory) or on its own stream (pinned host memory) creates no event
/// (Note [Allocator event pool]), and dropping the allocators destroys every event made.
#[test]
fn freed_blocks_reuse_their_events() {
    use ember_device::driver::emulator::thread_event_calls;
    use ember_memory::PinnedHostAllocator;
    // A pinned block's event goes on the thread's current device, which asks the process's
    // driver: the one configuration every test installs.
    emulator();
    let calls = |k: &str| thread_event_calls().get(k).copied().unwrap_or(0);
    let (emu, alloc) = small_device(64);
    let driver: Arc<dyn Driver> = emu.clone();
    let pinned = CachingAllocator::new(Arc::new(PinnedHostAllocator::with_driver(Some(driver))));
    let side = emu.stream_create(0).unwrap();
    let created = calls("cuEventCreate");
    let destroyed = calls("cuEventDestroy");
    let mut per_round = Vec::new();
    for _ in 0..4 {
        let before = calls("cuEventCreate");
        let a = alloc.allocate(MIB).unwrap();
        a.record_stream(side);
        drop(a);
        let h = pinned.allocate(4096).unwrap();
        h.record_stream(StreamHandle::DEFAULT);
        drop(h);
        // The next allocations collect the (complete) events.
        drop(alloc.allocate(MIB).unwrap());
        drop(pinned.allocate(4096).unwrap());
        per_round.push(calls("cuEventCreate") - before);
    }
    assert_eq!(per_round, [2, 0, 0, 0], "events created per round");
    drop(alloc);
    drop(pinned);
    assert_eq!(
        calls("cuEventCreate") - created,
        calls("cuEventDestroy") - destroyed,
        "every event made is destroyed"
    );
    emu.stream_destroy(side).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_on_an_emulated_device(ops in proptest::collection::vec(op(), 1..80)) {
        let (emu, alloc) = small_device(96);
        let streams = vec![
            StreamHandle::DEFAULT,
            emu.stream_create(0).unwrap(),
            emu.stream_create(0).unwrap(),
        ];
        let mut model = Model::new(alloc, streams);
        for op in &ops {
            model.apply(op)?;
        }
        model.finish()?;
        prop_assert_eq!(emu.mem_get_info(0).unwrap(), (96 << 20, 96 << 20));
        prop_assert_eq!(emu.live_allocations(0).unwrap(), 0);
    }
}

/// The one emulator configuration every test in the workspace installs.
fn emulator() {
    ember_device::cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
}

#[test]
fn registry_serves_each_emulated_device() {
    emulator();
    let a0 = ember_memory::allocator(Device::Cuda(0)).unwrap();
    let a1 = ember_memory::allocator(Device::Cuda(1)).unwrap();
    assert!(Arc::ptr_eq(
        &a0,
        &ember_memory::allocator(Device::Cuda(0)).unwrap()
    ));
    assert!(!Arc::ptr_eq(&a0, &a1));
    assert_eq!(a1.device(), Device::Cuda(1));
    let x = a1.allocate(5 * MIB).unwrap();
    assert_eq!(x.device(), Device::Cuda(1));
    assert!(ember_memory::memory_allocated(Device::Cuda(1)).unwrap() >= 5 * MIB as u64);
    assert!(ember_memory::memory_reserved(Device::Cuda(1)).unwrap() >= 20 * MIB as u64);
    let summary = ember_memory::memory_summary(Device::Cuda(1)).unwrap();
    assert!(summary.contains("device cuda:1"));
    drop(x);
    ember_memory::empty_cache(Device::Cuda(1)).unwrap();
    assert_eq!(ember_memory::memory_reserved(Device::Cuda(1)).unwrap(), 0);
}

#[test]
fn registry_rejects_an_index_out_of_range() {
    emulator();
    let err = ember_memory::allocator(Device::Cuda(5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid CUDA device index 5: there are 2 CUDA devices"
    );
    assert!(ember_memory::memory_stats(Device::Cuda(2)).is_err());
}

#[test]
fn pinned_memory_under_the_emulator_is_plain_host_memory() {
    emulator();
    let raw = ember_memory::PinnedHostAllocator::new();
    assert!(!raw.is_page_locked());
    let pinned = ember_memory::pinned_allocator();
    let a = pinned.allocate(4096).unwrap();
    // SAFETY: host memory valid for `len()` bytes.
    unsafe { std::ptr::write_bytes(a.as_ptr(), 0xEE, a.len()) };
    let side = ember_device::cuda::driver()
        .unwrap()
        .stream_create(0)
        .unwrap();
    a.record_stream(side);
    drop(a);
    pinned.empty_cache().unwrap();
    assert_eq!(pinned.memory_reserved(), 0);
}
