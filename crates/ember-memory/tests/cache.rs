//! The exact-size cache in front of best-fit (Note [Exact-size cache] in `state/cache.rs`):
//! reuse without raw calls, flushing before retries and in `empty_cache`, statistics that
//! count free runs as if merged, random sequences that hit the cache, and threads.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{Model, Op};
use ember_memory::testing::FakeRawAllocator;
use ember_memory::{CachingAllocator, Device, StreamHandle};
use proptest::prelude::*;

const MIB: usize = 1 << 20;
const S1: StreamHandle = StreamHandle(1);

fn fake(capacity_mib: u64) -> (Arc<FakeRawAllocator>, Arc<CachingAllocator>) {
    let raw = Arc::new(FakeRawAllocator::new(Device::Cuda(0), capacity_mib << 20));
    let alloc = CachingAllocator::new(raw.clone());
    (raw, alloc)
}

/// `(inactive_split, inactive_split_bytes)` of the aggregate.
fn split(alloc: &CachingAllocator) -> (i64, i64) {
    let s = alloc.stats();
    (
        s.inactive_split.0[0].current,
        s.inactive_split_bytes.0[0].current,
    )
}

#[test]
fn same_size_reuses_the_last_freed_block() {
    let (raw, alloc) = fake(64);
    let a = alloc.allocate(1000).unwrap();
    let b = alloc.allocate(1000).unwrap();
    let (a_addr, b_addr) = (a.addr(), b.addr());
    drop(b);
    drop(a);
    // LIFO: the block freed last comes back first, then the other; no new segment.
    let c = alloc.allocate(1024).unwrap();
    let d = alloc.allocate(700).unwrap(); // rounds to 1024 too
    assert_eq!((c.addr(), d.addr()), (a_addr, b_addr));
    assert_eq!(raw.allocations(), 1);
    alloc.check_invariants().unwrap();
    drop((c, d));
    alloc.check_invariants().unwrap();
}

#[test]
fn cached_blocks_count_as_merged_free_runs() {
    let (_raw, alloc) = fake(64);
    let a = alloc.allocate(512).unwrap();
    let b = alloc.allocate(512).unwrap();
    let c = alloc.allocate(512).unwrap();
    let rest = (2 * MIB - 3 * 512) as i64;
    assert_eq!(split(&alloc), (1, rest));
    drop(b); // between two live blocks: a run of its own
    assert_eq!(split(&alloc), (2, rest + 512));
    drop(a); // joins b's run (unmerged in the cache, counted once)
    assert_eq!(split(&alloc), (2, rest + 1024));
    alloc.check_invariants().unwrap();
    drop(c); // the whole segment is free: nothing is inactive *split*
    assert_eq!(split(&alloc), (0, 0));
    alloc.check_invariants().unwrap();
    let s = alloc.stats();
    assert_eq!(s.allocated_bytes.0[0].current, 0);
    assert_eq!(s.allocated_bytes.0[0].peak, 3 * 512);
    assert_eq!(s.active.0[0].current, 0);
    // The snapshot merges the cached blocks first: one inactive block, stats unchanged.
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    assert_eq!(split(&alloc), (0, 0));
    alloc.check_invariants().unwrap();
}

#[test]
fn empty_cache_releases_cached_blocks() {
    let (raw, alloc) = fake(64);
    let a = alloc.allocate(1000).unwrap();
    let b = alloc.allocate_on(3 * MIB, S1).unwrap();
    let c = alloc.allocate(12 * MIB).unwrap();
    drop((a, b, c));
    assert_eq!(alloc.memory_reserved() as usize, (2 + 20 + 12) * MIB);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.memory_reserved(), 0);
    assert_eq!(raw.used(), 0);
    assert!(alloc.snapshot().segments.is_empty());
    alloc.check_invariants().unwrap();
}

#[test]
fn cached_blocks_are_flushed_before_a_new_segment() {
    let (raw, alloc) = fake(64);
    // A 12 MiB segment, freed into the cache under its 12 MiB class.
    drop(alloc.allocate(12 * MIB).unwrap());
    // 11 MiB misses the cache; best-fit finds the 12 MiB block once the cache is flushed:
    // no new segment.
    let b = alloc.allocate(11 * MIB).unwrap();
    assert_eq!(raw.allocations(), 1);
    drop(b);
    // Small blocks too: two 512-byte blocks cached in a full small segment; 1 KiB fits
    // only their merged run.
    let x = alloc.allocate(512).unwrap();
    let y = alloc.allocate(512).unwrap();
    let fill = (
        alloc.allocate(MIB).unwrap(),
        alloc.allocate(MIB - 1024).unwrap(),
    );
    let x_addr = x.addr();
    drop((x, y));
    let segments = raw.allocations();
    let v = alloc.allocate(1024).unwrap();
    assert_eq!(v.addr(), x_addr, "best fit in the merged run");
    assert_eq!(raw.allocations(), segments);
    alloc.check_invariants().unwrap();
    drop((v, fill));
}

#[test]
fn out_of_memory_retry_flushes_the_cache_first() {
    let (raw, alloc) = fake(64);
    // Two whole 20 MiB segments, freed into the cache.
    let a = alloc.allocate_on(20 * MIB, S1).unwrap();
    let b = alloc.allocate_on(20 * MIB, S1).unwrap();
    drop((a, b));
    // 30 MiB: no cached block of that size, best fit finds none, the raw allocator has
    // 24 MiB left: the cached segments must be released (so first merged into the pool).
    let c = alloc.allocate_on(30 * MIB, S1).unwrap();
    let s = alloc.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_device_free, 2);
    assert_eq!(s.num_ooms, 0);
    assert_eq!(raw.used() as usize, 30 * MIB);
    alloc.check_invariants().unwrap();
    drop(c);
    // Another stream: only the last step (release everything) makes room.
    let d = alloc.allocate(40 * MIB).unwrap();
    assert_eq!(alloc.stats().num_alloc_retries, 2);
    drop(d);
    // Out of memory for real: counted once, cache flushed, nothing leaked.
    let keep = alloc.allocate(40 * MIB).unwrap();
    let small = alloc.allocate(1000).unwrap();
    drop(small);
    assert!(alloc.allocate(40 * MIB).is_err());
    assert_eq!(alloc.stats().num_ooms, 1);
    alloc.check_invariants().unwrap();
    drop(keep);
    alloc.empty_cache().unwrap();
    assert_eq!(raw.used(), 0);
}

#[test]
fn long_runs_of_cached_blocks_are_flushed() {
    let (_raw, alloc) = fake(64);
    let blocks: Vec<_> = (0..100).map(|_| alloc.allocate(512).unwrap()).collect();
    let keep = alloc.allocate(512).unwrap(); // the run stays split from the remainder
    for b in blocks {
        drop(b);
        alloc.check_invariants().unwrap();
    }
    assert_eq!(
        split(&alloc).0,
        2,
        "one run of 100 blocks, and the remainder"
    );
    assert_eq!(split(&alloc).1 as usize, 2 * MIB - 512);
    drop(keep);
    assert_eq!(split(&alloc), (0, 0));
    alloc.check_invariants().unwrap();
}

/// Operations over a few sizes, so that the cache hits often.
fn cache_op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        Just(512usize),
        Just(1000),
        Just(4096),
        Just(MIB),
        Just(3 * MIB),
        Just(12 * MIB),
        Just(0),
    ];
    prop_oneof![
        6 => (size, 0usize..2).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        5 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => (any::<usize>(), 0usize..2).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeaks),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn repeated_sizes_keep_every_invariant(ops in proptest::collection::vec(cache_op(), 1..200)) {
        let (raw, alloc) = fake(64);
        let mut model = Model::new(alloc, vec![StreamHandle::DEFAULT, S1]);
        for op in &ops {
            model.apply(op)?;
        }
        model.finish()?;
        prop_assert_eq!(raw.used(), 0);
        prop_assert_eq!(raw.outstanding_events(), 0);
    }
}

#[test]
fn threads_reusing_sizes_keep_the_statistics_exact() {
    const THREADS: usize = 4;
    const OPS: usize = 20_000;
    let raw = Arc::new(FakeRawAllocator::new(Device::Cuda(0), 1 << 30));
    let alloc = CachingAllocator::new(raw.clone());
    let sizes = [512, 1000, 64 << 10, MIB, 4 * MIB, 16 * MIB];
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let alloc = &alloc;
            scope.spawn(move || {
                let mut live = Vec::new();
                for i in 0..OPS {
                    let k = (i * 7 + t * 3) % 11;
                    if k < 6 || live.is_empty() {
                        let stream = StreamHandle((i % 2) as u64);
                        live.push(alloc.allocate_on(sizes[k % sizes.len()], stream).unwrap());
                    }
                    if live.len() > 8 || k >= 6 {
                        live.swap_remove(i % live.len());
                    }
                }
            });
        }
        // A reader sees consistent, exact statistics while the others run.
        let alloc = &alloc;
        scope.spawn(move || {
            for _ in 0..200 {
                let s = alloc.stats();
                for (name, array) in s.arrays() {
                    for stat in array.0 {
                        assert_eq!(stat.current, stat.allocated - stat.freed, "{name}");
                        assert!(stat.peak >= stat.current, "{name}");
                    }
                }
                alloc.check_invariants().unwrap();
                std::thread::yield_now();
            }
        });
    });
    let s = alloc.stats();
    assert_eq!(s.allocation.0[0].current, 0);
    assert_eq!(s.allocated_bytes.0[0].current, 0);
    assert_eq!(s.inactive_split.0[0].current, 0);
    alloc.check_invariants().unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(raw.used(), 0);
}
