//! The caching allocator over the fake raw allocator: the algorithm, statistics, OOM, retry,
//! fraction limit, record_stream, snapshot, history and summary.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{Model, op};
use ember_memory::testing::FakeRawAllocator;
use ember_memory::{
    BlockState, CachingAllocator, Device, HistoryAction, MemoryError, MemorySnapshot, PoolKind,
    RawAllocator, StreamHandle, ZERO_SIZE_ADDR,
};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn fake(capacity_mib: u64) -> (Arc<FakeRawAllocator>, Arc<CachingAllocator>) {
    let raw = Arc::new(FakeRawAllocator::new(Device::Cuda(0), capacity_mib << 20));
    let alloc = CachingAllocator::new(raw.clone());
    (raw, alloc)
}

const S1: StreamHandle = StreamHandle(1);
const S2: StreamHandle = StreamHandle(2);

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(ops in proptest::collection::vec(op(), 1..120)) {
        let (raw, alloc) = fake(160);
        let mut model = Model::new(alloc, vec![StreamHandle::DEFAULT, S1, S2]);
        for op in &ops {
            model.apply(op)?;
        }
        model.finish()?;
        prop_assert_eq!(raw.used(), 0);
        prop_assert_eq!(raw.live_segments(), 0);
        prop_assert_eq!(raw.outstanding_events(), 0);
    }

    #[test]
    fn random_sequences_with_completing_events(ops in proptest::collection::vec(op(), 1..120)) {
        let raw = Arc::new(
            FakeRawAllocator::new(Device::Cuda(1), 96 << 20).auto_complete_events(true),
        );
        let alloc = CachingAllocator::new(raw.clone());
        let mut model = Model::new(alloc, vec![StreamHandle::DEFAULT, S1, S2]);
        for op in &ops {
            model.apply(op)?;
        }
        model.finish()?;
        prop_assert_eq!(raw.used(), 0);
        prop_assert_eq!(raw.outstanding_events(), 0);
    }
}

#[test]
fn rounding_pools_and_segments() {
    let (raw, alloc) = fake(256);
    let a = alloc.allocate(1).unwrap();
    let b = alloc.allocate(700).unwrap();
    // Both from one 2 MiB small segment, 512 and 1024 bytes apart.
    assert_eq!(b.addr(), a.addr() + 512);
    let c = alloc.allocate(3 * MIB).unwrap(); // 1–10 MiB: a 20 MiB large segment
    // 18 MiB does not fit the 17 MiB left of the 20 MiB segment: its own 18 MiB segment.
    let d = alloc.allocate(18 * MIB - 1000).unwrap();
    let s = alloc.stats();
    assert_eq!(s.segment.0[0].current, 3);
    assert_eq!(s.reserved_bytes.0[0].current as usize, (2 + 20 + 18) * MIB);
    // The 18 MiB block keeps its 512-byte slack (large-pool remainders ≤ 1 MiB stay).
    assert_eq!(
        s.allocated_bytes.0[0].current as usize,
        512 + 1024 + 3 * MIB + 18 * MIB
    );
    assert_eq!(
        s.requested_bytes.0[0].current as usize,
        1 + 700 + 3 * MIB + 18 * MIB - 1000
    );
    let snap = alloc.snapshot();
    let types: Vec<_> = snap.segments.iter().map(|s| s.segment_type).collect();
    assert_eq!(
        types,
        vec![PoolKind::Small, PoolKind::Large, PoolKind::Large]
    );
    assert_eq!(raw.allocations(), 3);
    drop((a, b, c, d));
    // Freed blocks merge back: each segment is one inactive block again.
    let snap = alloc.snapshot();
    assert!(snap.segments.iter().all(|s| s.blocks.len() == 1));
    assert_eq!(alloc.stats().inactive_split.0[0].current, 0);
    alloc.empty_cache().unwrap();
    assert_eq!(raw.used(), 0);
}

#[test]
fn best_fit_reuses_cached_blocks_without_raw_calls() {
    let (raw, alloc) = fake(256);
    for _ in 0..100 {
        let a = alloc.allocate(5 * MIB).unwrap();
        let b = alloc.allocate(64 * MIB).unwrap();
        drop((a, b));
    }
    assert_eq!(
        raw.allocations(),
        2,
        "steady state must not call the raw allocator"
    );
    let s = alloc.stats();
    assert_eq!(s.allocation.0[0].allocated, 200);
    assert_eq!(s.allocation.0[0].freed, 200);
    assert_eq!(s.num_device_alloc, 2);
}

#[test]
fn large_remainders_of_one_mib_or_less_are_not_split() {
    let (_raw, alloc) = fake(256);
    let a = alloc.allocate(12 * MIB).unwrap();
    drop(a);
    // 12 MiB segment; 11.5 MiB leaves 0.5 MiB: not split (large pool keeps > 1 MiB only).
    let b = alloc.allocate(11 * MIB + MIB / 2).unwrap();
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 1);
    drop(b);
    // 10 MiB leaves 2 MiB: split.
    let c = alloc.allocate(10 * MIB).unwrap();
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 2);
    assert_eq!(
        alloc.stats().inactive_split_bytes.0[0].current as usize,
        2 * MIB
    );
    drop(c);
}

#[test]
fn zero_byte_allocations_consume_nothing() {
    let (raw, alloc) = fake(16);
    let z = alloc.allocate(0).unwrap();
    assert!(z.is_empty());
    assert_eq!(z.addr(), ZERO_SIZE_ADDR);
    assert_ne!(z.addr(), 0);
    z.record_stream(S1);
    assert_eq!(alloc.stats(), Default::default());
    assert_eq!(raw.allocations(), 0);
    drop(z);
    assert_eq!(alloc.stats(), Default::default());
}

#[test]
fn streams_do_not_share_freed_blocks() {
    let (raw, alloc) = fake(256);
    let a = alloc.allocate_on(4096, S1).unwrap();
    let addr = a.addr();
    drop(a);
    let b = alloc.allocate_on(4096, S2).unwrap();
    assert_ne!(b.addr(), addr, "a block freed on S1 must not go to S2");
    assert_eq!(raw.allocations(), 2);
    let c = alloc.allocate_on(4096, S1).unwrap();
    assert_eq!(c.addr(), addr, "S1 reuses its own block");
}

#[test]
fn record_stream_holds_the_block_until_the_event_completes() {
    let (raw, alloc) = fake(256);
    let a = alloc.allocate(MIB).unwrap();
    let addr = a.addr();
    a.record_stream(S1);
    a.record_stream(S1);
    a.record_stream(StreamHandle::DEFAULT); // its own stream: ignored
    drop(a);
    assert_eq!(raw.outstanding_events(), 1);
    let s = alloc.stats();
    assert_eq!(s.allocation.0[0].current, 0, "freed for the caller");
    assert_eq!(s.active.0[0].current, 1, "but still active");
    let snap = alloc.snapshot();
    assert_eq!(
        snap.segments[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    // Event outstanding: the block is not reused.
    let b = alloc.allocate(MIB).unwrap();
    assert_ne!(b.addr(), addr);
    drop(b);
    raw.complete_events();
    // The next allocation processes events and gets the block back.
    let c = alloc.allocate(MIB).unwrap();
    assert_eq!(c.addr(), addr);
    assert_eq!(raw.outstanding_events(), 0);
    drop(c);
    alloc.check_invariants().unwrap();
}

/// Host (pinned) memory is reused by the host, which no stream orders: a copy queued on the
/// block's own stream holds it too (Note [Host blocks wait for every stream]).
#[test]
fn a_host_block_waits_for_its_own_stream() {
    let raw = Arc::new(FakeRawAllocator::new(Device::Cpu, 64 << 20));
    let alloc = CachingAllocator::new(raw.clone());
    let a = alloc.allocate(4096).unwrap();
    let addr = a.addr();
    a.record_stream(StreamHandle::DEFAULT);
    a.record_stream(StreamHandle::DEFAULT);
    drop(a);
    assert_eq!(raw.outstanding_events(), 1, "one event on its own stream");
    let b = alloc.allocate(4096).unwrap();
    assert_ne!(
        b.addr(),
        addr,
        "not reused while the copy may still read it"
    );
    drop(b);
    raw.complete_events();
    let c = alloc.allocate(4096).unwrap();
    assert_eq!(c.addr(), addr, "reused once the event completed");
    drop(c);
    // Without a recorded use, a host block is reused at once.
    let d = alloc.allocate(4096).unwrap();
    let d_addr = d.addr();
    drop(d);
    assert_eq!(alloc.allocate(4096).unwrap().addr(), d_addr);
    alloc.check_invariants().unwrap();
}

#[test]
fn empty_cache_waits_for_pending_events() {
    let (raw, alloc) = fake(64);
    let a = alloc.allocate(3 * MIB).unwrap();
    a.record_stream(S2);
    drop(a);
    assert_eq!(alloc.memory_reserved() as usize, 20 * MIB);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.memory_reserved(), 0);
    assert_eq!(raw.outstanding_events(), 0);
    assert_eq!(alloc.stats().num_sync_all_streams, 1);
}

#[test]
fn failed_event_recording_falls_back_to_synchronisation() {
    let (raw, alloc) = fake(64);
    raw.fail_events(true);
    let a = alloc.allocate(4096).unwrap();
    a.record_stream(S1);
    drop(a);
    assert_eq!(alloc.stats().active.0[0].current, 1);
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(
        (s.active.0[0].current, s.reserved_bytes.0[0].current),
        (0, 0)
    );
}

#[test]
fn oom_frees_cached_segments_and_retries() {
    let (raw, alloc) = fake(64);
    // Two cached 20 MiB segments on S1 (each request fills its segment: not split).
    let a = alloc.allocate_on(20 * MIB, S1).unwrap();
    let b = alloc.allocate_on(20 * MIB, S1).unwrap();
    drop((a, b));
    // 30 MiB on S1: no cached block fits, the raw allocator has 24 MiB left; freeing the
    // largest cached segments of the pool (both) makes room.
    let c = alloc.allocate_on(30 * MIB, S1).unwrap();
    let s = alloc.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_device_free, 2);
    assert_eq!(s.num_ooms, 0);
    drop(c);
    // 40 MiB on S2: only S1's 30 MiB segment is cached; the last step frees everything.
    let d = alloc.allocate_on(40 * MIB, S2).unwrap();
    assert_eq!(alloc.stats().num_alloc_retries, 2);
    assert_eq!(raw.used() as usize, 40 * MIB);
    drop(d);
}

#[test]
fn out_of_memory_is_an_error_value_with_the_facts() {
    let (_raw, alloc) = fake(64);
    alloc.record_history(true, 100);
    let keep = alloc.allocate(40 * MIB).unwrap();
    let small = alloc.allocate(100).unwrap(); // a 2 MiB segment, mostly unallocated
    let err = alloc.allocate(30 * MIB).unwrap_err();
    match &err {
        MemoryError::OutOfMemory {
            device,
            requested,
            total,
            free,
            allocated,
            reserved_unallocated,
            fraction_limit,
        } => {
            assert_eq!(*device, Device::Cuda(0));
            assert_eq!(*requested as usize, 30 * MIB);
            assert_eq!(*total, Some(64 << 20));
            assert_eq!(*free, Some(22 << 20));
            assert_eq!(*allocated as usize, 40 * MIB + 512);
            assert_eq!(*reserved_unallocated as usize, 2 * MIB - 512);
            assert_eq!(*fraction_limit, None);
        }
        other => panic!("expected OOM, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of \
             64.00 MiB of which 22.00 MiB is free. Of the allocated memory 40.00 MiB is allocated \
             by Ember, and 2.00 MiB is reserved by Ember but unallocated."
        ),
        "{msg}"
    );
    assert!(msg.contains("empty_cache"), "{msg}");
    let s = alloc.stats();
    assert_eq!(s.num_ooms, 1);
    assert!(s.num_alloc_retries >= 1);
    assert!(
        alloc
            .history()
            .iter()
            .any(|e| e.action == HistoryAction::Oom)
    );
    // The allocator still works afterwards.
    drop(keep);
    assert!(alloc.allocate(30 * MIB).is_ok());
    drop(small);
}

#[test]
fn memory_fraction_limits_reserved_memory() {
    let (_raw, alloc) = fake(100);
    alloc.set_memory_fraction(0.5).unwrap();
    assert_eq!(alloc.memory_fraction(), Some(0.5));
    let a = alloc.allocate(40 * MIB).unwrap();
    let err = alloc.allocate(20 * MIB).unwrap_err();
    assert!(err.is_out_of_memory());
    let msg = err.to_string();
    assert!(
        msg.contains("at most 50.00 MiB (set_per_process_memory_fraction(0.5))"),
        "{msg}"
    );
    assert!(
        msg.contains("raise the limit set with `set_per_process_memory_fraction`"),
        "{msg}"
    );
    alloc.set_memory_fraction(1.0).unwrap();
    let b = alloc.allocate(20 * MIB).unwrap();
    drop((a, b));
    // Zero: nothing new may be reserved, but cached memory is released to retry.
    alloc.empty_cache().unwrap();
    alloc.set_memory_fraction(0.0).unwrap();
    assert!(alloc.allocate(512).unwrap_err().is_out_of_memory());
}

#[test]
fn fraction_applies_only_where_the_total_is_known() {
    let raw = Arc::new(FakeRawAllocator::new(Device::Cpu, 64 << 20).without_total());
    assert_eq!(raw.mem_info(), None);
    let alloc = CachingAllocator::new(raw);
    alloc.set_memory_fraction(0.01).unwrap();
    let a = alloc.allocate(20 * MIB).unwrap(); // not limited
    drop(a);
    let err = alloc.allocate(100 * MIB).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("cpu out of memory. Tried to allocate 100.00 MiB. Of the"),
        "{msg}"
    );
    assert!(!msg.contains("set_per_process_memory_fraction("), "{msg}");
}

#[test]
fn set_fraction_rejects_values_outside_zero_to_one() {
    let (_raw, alloc) = fake(16);
    for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
        let err = alloc.set_memory_fraction(bad).unwrap_err();
        assert!(matches!(err, MemoryError::InvalidFraction { .. }));
        assert!(err.to_string().contains(&bad.to_string()), "{err}");
    }
    assert_eq!(alloc.memory_fraction(), None);
    for good in [0.0, 0.5, 1.0] {
        alloc.set_memory_fraction(good).unwrap();
    }
}

#[test]
fn peaks_and_resets() {
    let (_raw, alloc) = fake(64);
    let a = alloc.allocate(4 * MIB).unwrap();
    let b = alloc.allocate(4 * MIB).unwrap();
    drop(a);
    let s = alloc.stats();
    assert_eq!(s.allocated_bytes.0[0].peak as usize, 8 * MIB);
    assert_eq!(s.allocated_bytes.0[0].current as usize, 4 * MIB);
    alloc.reset_peak_stats();
    assert_eq!(alloc.stats().allocated_bytes.0[0].peak as usize, 4 * MIB);
    alloc.reset_accumulated_stats();
    let s = alloc.stats();
    assert_eq!(
        (s.allocation.0[0].allocated, s.allocation.0[0].freed),
        (0, 0)
    );
    assert_eq!(s.allocation.0[0].current, 1);
    drop(b);
}

#[test]
fn snapshot_round_trips_through_json() {
    let (_raw, alloc) = fake(64);
    let a = alloc.allocate(1000).unwrap();
    let _b = alloc.allocate_on(3 * MIB, S1).unwrap();
    drop(a);
    let snap = alloc.snapshot();
    let json = snap.to_json().unwrap();
    let back: MemorySnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snap);
    assert!(json.contains("\"segment_type\": \"large\""), "{json}");
    assert!(json.contains("\"state\": \"active_allocated\""), "{json}");
    assert!(json.contains("\"state\": \"inactive\""), "{json}");
    let large = &snap.segments[1];
    assert_eq!(large.stream, S1);
    assert_eq!(large.total_size as usize, 20 * MIB);
    assert_eq!(large.blocks[0].requested_size as usize, 3 * MIB);
    assert_eq!(
        large.blocks.iter().map(|b| b.size).sum::<u64>(),
        large.total_size
    );
}

#[test]
fn history_records_every_action_and_is_bounded() {
    let (_raw, alloc) = fake(64);
    assert!(alloc.history().is_empty());
    alloc.record_history(true, 1000);
    let a = alloc.allocate(100).unwrap();
    drop(a);
    alloc.empty_cache().unwrap();
    let actions: Vec<_> = alloc.history().iter().map(|e| e.action).collect();
    use HistoryAction::*;
    assert_eq!(
        actions,
        vec![
            SegmentAlloc,
            Alloc,
            FreeRequested,
            FreeCompleted,
            SegmentFree
        ]
    );
    let h = alloc.history();
    assert_eq!(h[1].size, 100);
    assert_eq!(h[0].size as usize, 2 * MIB);
    assert!(
        h.windows(2)
            .all(|w| w[1].seq == w[0].seq + 1 && w[1].time_us >= w[0].time_us)
    );
    let json = alloc.history_json().unwrap();
    assert!(json.contains("\"free_requested\""));
    alloc.record_history(true, 3);
    for _ in 0..10 {
        drop(alloc.allocate(100).unwrap());
    }
    assert_eq!(alloc.history().len(), 3);
    alloc.record_history(false, 3);
    assert!(alloc.history().is_empty());
}

#[test]
fn summary_has_the_expected_rows() {
    let (_raw, alloc) = fake(64);
    let _a = alloc.allocate(20 * MIB).unwrap();
    let t = alloc.summary();
    for row in [
        "Ember memory summary, device cuda:0",
        "Out-of-memory errors: 0",
        "| Metric                |  Cur Usage | Peak Usage |  Tot Alloc |  Tot Freed |",
        "| Allocated memory      |  20.00 MiB |  20.00 MiB |  20.00 MiB |        0 B |",
        "|       from large pool |  20.00 MiB |",
        "|       from small pool |        0 B |",
        "| Active memory",
        "| Requested memory",
        "| Reserved memory",
        "| Non-releasable memory",
        "| Allocations           |          1 |          1 |          1 |          0 |",
        "| Active allocs",
        "| Reserved segments",
        "| Non-releasable allocs",
    ] {
        assert!(t.contains(row), "missing {row:?} in\n{t}");
    }
}

#[test]
fn memory_stats_has_pytorch_keys() {
    let (_raw, alloc) = fake(64);
    let _a = alloc.allocate(100).unwrap();
    let m = alloc.memory_stats();
    assert_eq!(m.get("allocation.small_pool.current"), Some(1));
    assert_eq!(m.get("allocated_bytes.all.current"), Some(512));
    assert_eq!(m.get("requested_bytes.all.current"), Some(100));
    assert_eq!(m.get("reserved_bytes.small_pool.peak"), Some(2 << 20));
    assert_eq!(m.get("num_ooms"), Some(0));
    assert_eq!(m.get("num_device_alloc"), Some(1));
    let json = serde_json::to_string(&m).unwrap();
    assert!(json.contains("\"segment.large_pool.freed\":0"), "{json}");
}
