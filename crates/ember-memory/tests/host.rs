//! Host memory through the caching allocator: alignment, real writes, the `cpu` registry
//! entry, pinned memory, and a multi-threaded stress test.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ember_memory::{
    CachingAllocator, Device, HostAllocator, MemoryError, PinnedHostAllocator, StreamHandle,
};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// Fill `a` with `byte` through `as_ptr` and read it back.
fn write_and_check(a: &ember_memory::Allocation, byte: u8) {
    // SAFETY: host allocation, valid for `len()` bytes while `a` lives; nothing else uses it.
    let s = unsafe { std::slice::from_raw_parts_mut(a.as_ptr(), a.len()) };
    s.fill(byte);
    assert!(s.iter().all(|&b| b == byte));
}

#[test]
fn host_allocations_are_64_byte_aligned_and_writable() {
    let alloc = CachingAllocator::new(Arc::new(HostAllocator));
    let sizes = [
        1usize,
        63,
        64,
        65,
        511,
        512,
        513,
        4096,
        MIB - 1,
        MIB,
        MIB + 1,
        5 * MIB,
        11 * MIB,
    ];
    let live: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let a = alloc.allocate(n).unwrap();
            assert_eq!(a.addr() % 64, 0, "{n} bytes at {:#x}", a.addr());
            assert_eq!(a.device(), Device::Cpu);
            write_and_check(&a, i as u8);
            a
        })
        .collect();
    // Neighbours were not clobbered.
    for (i, a) in live.iter().enumerate() {
        // SAFETY: as above.
        let s = unsafe { std::slice::from_raw_parts(a.as_ptr(), a.len()) };
        assert!(s.iter().all(|&b| b == i as u8));
    }
    drop(live);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.memory_reserved(), 0);
}

#[test]
fn zero_bytes_on_the_host() {
    let a = ember_memory::allocator(Device::Cpu)
        .unwrap()
        .allocate(0)
        .unwrap();
    assert!(a.is_empty());
    assert!(!a.as_ptr().is_null());
    assert_eq!(a.as_ptr() as usize % 64, 0);
}

#[test]
fn cpu_registry_and_statistics_functions() {
    let cpu = ember_memory::allocator(Device::Cpu).unwrap();
    assert!(Arc::ptr_eq(
        &cpu,
        &ember_memory::allocator(Device::Cpu).unwrap()
    ));
    // Other tests share the cpu allocator: compare relative to a baseline while holding.
    let a = cpu.allocate(3 * MIB).unwrap();
    write_and_check(&a, 7);
    assert!(ember_memory::memory_allocated(Device::Cpu).unwrap() >= 3 * MIB as u64);
    assert!(ember_memory::max_memory_allocated(Device::Cpu).unwrap() >= 3 * MIB as u64);
    assert!(ember_memory::memory_reserved(Device::Cpu).unwrap() >= 20 * MIB as u64);
    assert!(ember_memory::max_memory_reserved(Device::Cpu).unwrap() >= 20 * MIB as u64);
    let stats = ember_memory::memory_stats(Device::Cpu).unwrap();
    assert!(stats.get("allocation.large_pool.current").unwrap() >= 1);
    let summary = ember_memory::memory_summary(Device::Cpu).unwrap();
    assert!(summary.contains("device cpu"), "{summary}");
    let snap = ember_memory::memory_snapshot(Device::Cpu).unwrap();
    assert!(
        snap.segments
            .iter()
            .any(|s| s.address <= a.addr() && a.addr() < s.address + s.total_size)
    );
    ember_memory::set_per_process_memory_fraction(0.5, Device::Cpu).unwrap();
    let err = ember_memory::set_per_process_memory_fraction(1.5, Device::Cpu).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid memory fraction 1.5: expected a value in 0..=1"
    );
    ember_memory::set_per_process_memory_fraction(1.0, Device::Cpu).unwrap();
    ember_memory::reset_peak_memory_stats(Device::Cpu).unwrap();
    ember_memory::record_memory_history(Device::Cpu, true).unwrap();
    drop(a);
    assert!(
        !ember_memory::memory_history(Device::Cpu)
            .unwrap()
            .is_empty()
    );
    ember_memory::record_memory_history(Device::Cpu, false).unwrap();
    ember_memory::empty_cache(Device::Cpu).unwrap();
}

#[test]
fn host_out_of_memory_is_an_error() {
    let alloc = CachingAllocator::new(Arc::new(HostAllocator));
    let err = alloc.allocate(usize::MAX / 2).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(
        err.to_string()
            .starts_with("cpu out of memory. Tried to allocate"),
        "{err}"
    );
    assert_eq!(alloc.stats().num_ooms, 1);
}

#[test]
fn cuda_without_a_driver_says_why() {
    if ember_device::cuda::is_available() {
        // The line of Note [Skipped tests] (this crate's tests cannot depend on
        // `ember-testing`, which depends on it).
        println!(
            "ember-skip: CUDA is available here (EMBER_CUDA_EMULATOR or a real GPU); this \
             checks the error of a machine without it"
        );
        return;
    }
    let err = ember_memory::allocator(Device::Cuda(0)).unwrap_err();
    assert!(matches!(err, MemoryError::Device(_)), "{err}");
    assert!(err.to_string().contains("CUDA is not available"), "{err}");
    assert!(ember_memory::memory_allocated(Device::Cuda(0)).is_err());
}

#[test]
fn pinned_memory_is_host_memory() {
    let pinned = ember_memory::pinned_allocator();
    assert_eq!(pinned.device(), Device::Cpu);
    let a = pinned.allocate(100_000).unwrap();
    assert_eq!(a.addr() % 64, 0);
    write_and_check(&a, 0x5A);
    drop(a);
    let plain = CachingAllocator::new(Arc::new(PinnedHostAllocator::with_driver(None)));
    let b = plain.allocate_on(4096, StreamHandle(3)).unwrap();
    b.record_stream(StreamHandle(4)); // host: the event is trivially complete
    drop(b);
    assert_eq!(plain.stats().active.0[0].current, 0);
    plain.empty_cache().unwrap();
}

#[test]
fn threads_hammering_one_allocator_keep_it_balanced() {
    const THREADS: usize = 4;
    const OPS: usize = 10_000;
    let alloc = CachingAllocator::new(Arc::new(HostAllocator));
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let alloc = &alloc;
            scope.spawn(move || {
                let mut rng = (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut live: Vec<(ember_memory::Allocation, u64)> = Vec::new();
                for i in 0..OPS {
                    let r = next();
                    if live.len() < 32 && (r % 3 != 0 || live.is_empty()) {
                        let size = match r % 16 {
                            0 => 1 + (r >> 8) as usize % (12 * MIB),
                            1..=3 => 1 + (r >> 8) as usize % (2 * MIB),
                            _ => 1 + (r >> 8) as usize % 8192,
                        };
                        let stream = StreamHandle((r >> 40) % 3);
                        let a = alloc.allocate_on(size, stream).unwrap();
                        let tag = ((t as u64) << 56) | i as u64;
                        // Tag both ends; a block handed out twice would be overwritten.
                        // SAFETY: host allocation of `size` ≥ 1 bytes, owned by this thread.
                        unsafe {
                            a.as_ptr().cast::<u8>().write(tag as u8);
                            a.as_ptr().add(size - 1).write((tag >> 8) as u8 ^ t as u8);
                        }
                        if r % 7 == 0 {
                            a.record_stream(StreamHandle((r >> 20) % 3));
                        }
                        live.push((a, tag));
                    } else {
                        let (a, tag) = live.swap_remove(r as usize % live.len());
                        // SAFETY: as above, still live.
                        let (first, last) =
                            unsafe { (a.as_ptr().read(), a.as_ptr().add(a.len() - 1).read()) };
                        if a.len() > 1 {
                            assert_eq!(first, tag as u8, "block shared between allocations");
                            assert_eq!(last, (tag >> 8) as u8 ^ t as u8, "block shared");
                        }
                    }
                }
            });
        }
    });
    let s = alloc.stats();
    for (name, array) in s.arrays() {
        for stat in array.0 {
            assert_eq!(stat.current, stat.allocated - stat.freed, "{name}");
            assert!(stat.peak >= stat.current, "{name}");
        }
    }
    assert_eq!(s.allocation.0[0].current, 0);
    assert_eq!(s.allocation.0[0].allocated, s.allocation.0[0].freed);
    assert!(s.allocation.0[0].allocated > (THREADS * OPS / 3) as i64);
    alloc.check_invariants().unwrap();
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(
        (s.reserved_bytes.0[0].current, s.segment.0[0].current),
        (0, 0)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Random host allocations are aligned and writable over their full length.
    #[test]
    fn random_host_sizes_are_aligned(sizes in proptest::collection::vec(1usize..3 * MIB, 1..24)) {
        let alloc = CachingAllocator::new(Arc::new(HostAllocator));
        let live: Vec<_> = sizes.iter().map(|&n| alloc.allocate(n).unwrap()).collect();
        for (i, a) in live.iter().enumerate() {
            prop_assert_eq!(a.addr() % 64, 0);
            write_and_check(a, i as u8);
        }
        for (i, a) in live.iter().enumerate() {
            // SAFETY: host allocation valid for `len()` bytes.
            let s = unsafe { std::slice::from_raw_parts(a.as_ptr(), a.len()) };
            prop_assert!(s.iter().all(|&b| b == i as u8));
        }
        drop(live);
        alloc.empty_cache().unwrap();
        prop_assert_eq!(alloc.memory_reserved(), 0);
    }
}

#[test]
fn allocations_and_allocators_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ember_memory::Allocation>();
    assert_send_sync::<CachingAllocator>();
    // An allocation may be dropped on another thread than the one that made it.
    let a = ember_memory::allocator(Device::Cpu)
        .unwrap()
        .allocate(100)
        .unwrap();
    std::thread::spawn(move || drop(a)).join().unwrap();
}
