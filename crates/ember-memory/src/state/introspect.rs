//! Reading the state: the snapshot of segments and blocks, and the invariant checker that
//! compares the block structure with the statistics.

use std::collections::HashSet;

use super::{NIL, State};
use crate::policy::{PoolKind, pool_for, should_split};
use crate::snapshot::{BlockSnapshot, BlockState, MemorySnapshot, SegmentSnapshot};
use crate::stats::StatType;

impl State {
    // --- introspection -------------------------------------------------------------------

    /// Every segment with its blocks, in address order, after merging the cached blocks
    /// into the pools (which changes no statistic; see Note \[Exact-size cache\]).
    pub(crate) fn snapshot(&mut self) -> MemorySnapshot {
        self.flush_cache(None);
        self.blocks_snapshot()
    }

    /// Every segment with its blocks as they are, cached blocks unmerged.
    fn blocks_snapshot(&self) -> MemorySnapshot {
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
        let cached = self.check_cache()?;
        let snap = self.blocks_snapshot();
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
            // Free runs count as one block each, as if merged (Note [Exact-size cache]).
            let (mut runs, mut run_bytes) = (0, 0);
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
                if b.state == BlockState::Inactive {
                    if k == 0 || seg.blocks[k - 1].state != BlockState::Inactive {
                        runs += 1;
                    }
                    run_bytes += b.size as i64;
                }
                // Free neighbours are merged unless one waits in the exact-size cache.
                if k > 0
                    && b.state == BlockState::Inactive
                    && seg.blocks[k - 1].state == BlockState::Inactive
                    && !cached.contains(&b.address)
                    && !cached.contains(&seg.blocks[k - 1].address)
                {
                    return Err(format!(
                        "segment {:#x}: unmerged free neighbours",
                        seg.address
                    ));
                }
            }
            if run_bytes != seg.total_size as i64 {
                inactive_split[p] += runs;
                inactive_split_bytes[p] += run_bytes;
            }
        }
        let pooled = self.small.len() + self.large.len() + cached.len();
        let inactive: usize = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::Inactive)
            .count();
        if pooled != inactive {
            return Err(format!(
                "{pooled} blocks in pools and cache but {inactive} inactive blocks"
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

    /// Every block in the exact-size cache is live, free, flagged as cached, in no pool, on
    /// its own stream, and serves its size class without a split (see Note \[Exact-size
    /// cache\]); every block flagged as cached is in the cache, once. The addresses of the
    /// cached blocks.
    fn check_cache(&self) -> Result<HashSet<u64>, String> {
        let entries = self.cache.entries();
        if entries.len() != self.cache.len() {
            return Err(format!(
                "cache counts {} blocks but lists {}",
                self.cache.len(),
                entries.len()
            ));
        }
        let mut addrs = HashSet::new();
        for (i, stream, size) in entries {
            let b = &self.blocks[i as usize];
            let pool = pool_for(size);
            let in_pool = match b.pool {
                PoolKind::Small => self.small.contains_key(&b.key()),
                PoolKind::Large => self.large.contains_key(&b.key()),
            };
            if !b.live || b.allocated || !b.cached || b.event_count > 0 || in_pool {
                return Err(format!(
                    "cached block {:#x} is not a free cached block",
                    b.addr
                ));
            }
            if b.stream != stream || b.pool != pool || b.size < size {
                return Err(format!("cached block {:#x} is in the wrong class", b.addr));
            }
            if should_split(pool, b.size, size) {
                return Err(format!("cached block {:#x} would be split", b.addr));
            }
            if !addrs.insert(b.addr) {
                return Err(format!("block {:#x} is cached twice", b.addr));
            }
        }
        let flagged = self.blocks.iter().filter(|b| b.live && b.cached).count();
        if flagged != addrs.len() {
            return Err(format!(
                "{flagged} blocks flagged as cached but {} in the cache",
                addrs.len()
            ));
        }
        Ok(addrs)
    }
}
