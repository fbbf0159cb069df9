//! Reading the state: the snapshot of segments and blocks, and the invariant checker that
//! compares the block structure with the statistics.

use super::{NIL, State};
use crate::snapshot::{BlockSnapshot, BlockState, MemorySnapshot, SegmentSnapshot};
use crate::stats::StatType;

impl State {
    // --- introspection -------------------------------------------------------------------

    /// Every segment with its blocks, in address order.
    pub(crate) fn snapshot(&self) -> MemorySnapshot {
        let mut heads: Vec<u32> = (0..self.blocks.len() as u32)
            .filter(|&i| {
                let b = &self.blocks[i as usize];
                b.live && b.prev == NIL
            })
            .collect();
        heads.sort_by_key(|&i| self.blocks[i as usize].addr);
        let segments = heads
            .into_iter()
            .map(|head| {
                let h = &self.blocks[head as usize];
                let mut seg = SegmentSnapshot {
                    address: h.addr,
                    total_size: 0,
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    stream: h.stream,
                    segment_type: h.pool,
                    blocks: Vec::new(),
                };
                let mut i = head;
                while i != NIL {
                    let b = &self.blocks[i as usize];
                    let state = if b.allocated {
                        BlockState::ActiveAllocated
                    } else if b.event_count > 0 {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::Inactive
                    };
                    let size = b.size as u64;
                    seg.total_size += size;
                    if state == BlockState::ActiveAllocated {
                        seg.allocated_size += size;
                    }
                    if state != BlockState::Inactive {
                        seg.active_size += size;
                        seg.requested_size += b.requested as u64;
                    }
                    seg.blocks.push(BlockSnapshot {
                        address: b.addr,
                        size,
                        requested_size: b.requested as u64,
                        state,
                    });
                    i = b.next;
                }
                seg
            })
            .collect();
        MemorySnapshot {
            device: self.device,
            segments,
        }
    }

    /// Check the structural invariants against the statistics; a description of the first
    /// violation found. For tests.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let snap = self.snapshot();
        let mut reserved = [0i64; 2];
        let mut segments = [0i64; 2];
        let mut allocated = [0i64; 2];
        let mut active = [0i64; 2];
        let mut active_count = [0i64; 2];
        let mut allocation_count = [0i64; 2];
        let mut requested = [0i64; 2];
        let mut inactive_split = [0i64; 2];
        let mut inactive_split_bytes = [0i64; 2];
        for seg in &snap.segments {
            let p = seg.segment_type as usize;
            segments[p] += 1;
            reserved[p] += seg.total_size as i64;
            let mut end = seg.address;
            for (k, b) in seg.blocks.iter().enumerate() {
                if b.address != end {
                    return Err(format!(
                        "segment {:#x}: gap or overlap at {:#x}",
                        seg.address, b.address
                    ));
                }
                end += b.size;
                if b.state == BlockState::ActiveAllocated {
                    allocated[p] += b.size as i64;
                    allocation_count[p] += 1;
                }
                if b.state != BlockState::Inactive {
                    active[p] += b.size as i64;
                    active_count[p] += 1;
                    requested[p] += b.requested_size as i64;
                }
                if b.state == BlockState::Inactive && seg.blocks.len() > 1 {
                    inactive_split[p] += 1;
                    inactive_split_bytes[p] += b.size as i64;
                }
                if k > 0
                    && b.state == BlockState::Inactive
                    && seg.blocks[k - 1].state == BlockState::Inactive
                {
                    return Err(format!(
                        "segment {:#x}: unmerged free neighbours",
                        seg.address
                    ));
                }
            }
        }
        let pooled = self.small.len() + self.large.len();
        let inactive: usize = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::Inactive)
            .count();
        if pooled != inactive {
            return Err(format!(
                "{pooled} blocks in pools but {inactive} inactive blocks"
            ));
        }
        let s = &self.stats;
        let checks = [
            ("reserved_bytes", &s.reserved_bytes, reserved),
            ("segment", &s.segment, segments),
            ("allocated_bytes", &s.allocated_bytes, allocated),
            ("active_bytes", &s.active_bytes, active),
            ("active", &s.active, active_count),
            ("allocation", &s.allocation, allocation_count),
            ("requested_bytes", &s.requested_bytes, requested),
            ("inactive_split", &s.inactive_split, inactive_split),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                inactive_split_bytes,
            ),
        ];
        for (name, stat, expect) in checks {
            let got = [
                stat[StatType::SmallPool].current,
                stat[StatType::LargePool].current,
            ];
            if got != expect || stat[StatType::Aggregate].current != expect[0] + expect[1] {
                return Err(format!("{name}: stats say {got:?}, blocks say {expect:?}"));
            }
        }
        Ok(())
    }
}
