//! The allocator's state and the algorithm over it: blocks, pools, `malloc` as a cascade,
//! `free` with merging, stream events, releasing cached segments. Every function here runs
//! with the allocator's lock held (it takes `&mut State`); see Note \[Locking\] in
//! `allocator.rs`. The policy is written down in [`crate::policy`].

mod cache;
mod introspect;

use std::collections::BTreeMap;

use ember_device::Device;
use ember_device::driver::{EventHandle, StreamHandle};

use crate::error::{FractionLimit, MemoryError, RawAllocError};
use crate::policy::{PoolKind, allocation_size, pool_for, round_size, should_split};
use crate::raw::RawAllocator;
use crate::snapshot::{History, HistoryAction};
use crate::stats::{DeviceStats, SplitWeight, StatType};
use cache::FreeCache;

/// "No block": the end of a segment's block list.
pub(crate) const NIL: u32 = u32::MAX;

/// Free blocks next to a block being allocated or freed beyond which the cache of its stream
/// and pool is flushed, so that runs of unmerged free blocks stay short.
const MAX_RUN_WALK: usize = 16;

/// What a free run of `bytes` (0: no run) adds to `(inactive_split, inactive_split_bytes)`:
/// nothing when it spans its whole segment (`whole`), else one block of `bytes`.
#[inline]
fn run_weight(bytes: usize, whole: bool) -> SplitWeight {
    if bytes == 0 || whole {
        SplitWeight(0, 0)
    } else {
        SplitWeight(1, bytes as i64)
    }
}

/// A free-pool key: blocks are ordered by stream, then size, then address, so the first key
/// at or after `(stream, size, 0)` is the best fit on that stream.
type PoolKey = (u64, usize, u64);

/// A contiguous piece of a segment. Blocks of one segment form a doubly linked list in
/// address order (`prev`/`next`, slab indices).
#[derive(Debug)]
struct Block {
    addr: u64,
    size: usize,
    /// Bytes the caller asked for while allocated; 0 when free.
    requested: usize,
    stream: StreamHandle,
    pool: PoolKind,
    allocated: bool,
    prev: u32,
    next: u32,
    /// Outstanding stream events (plus one per wait for a full synchronisation).
    event_count: u32,
    /// Streams other than `stream` that used the block (`record_stream`).
    stream_uses: Vec<StreamHandle>,
    /// Whether this slab slot holds a block.
    live: bool,
    /// Whether the block is free and waits in the exact-size cache (not in a pool).
    cached: bool,
}

impl Block {
    fn key(&self) -> PoolKey {
        (self.stream.0, self.size, self.addr)
    }
    fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
    /// Whether the block is free and may be merged with a neighbour being freed.
    fn is_mergeable(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_empty() && !self.cached
    }
}

/// Everything behind the allocator's lock.
#[derive(Debug)]
pub(crate) struct State {
    device: Device,
    /// Slab of blocks; freed slots are reused through `free_slots` (no allocation in the
    /// steady state).
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    small: BTreeMap<PoolKey, u32>,
    large: BTreeMap<PoolKey, u32>,
    /// Freed blocks not merged yet, by exact size; see Note \[Exact-size cache\].
    cache: FreeCache,
    /// Scratch list for flushing the cache (kept to avoid reallocating).
    flush_buf: Vec<u32>,
    pub(crate) stats: DeviceStats,
    /// Events recorded for freed blocks used on other streams, with their block.
    pending: Vec<(EventHandle, u32)>,
    /// Freed blocks whose event could not be recorded; they wait for a full synchronisation.
    awaiting_sync: Vec<u32>,
    /// The fraction set with `set_memory_fraction`, and the cap it implies where the total
    /// is known.
    pub(crate) fraction: Option<f64>,
    pub(crate) limit: Option<FractionLimit>,
    pub(crate) history: History,
}

impl State {
    pub(crate) fn new(device: Device) -> Self {
        State {
            device,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            small: BTreeMap::new(),
            large: BTreeMap::new(),
            cache: FreeCache::default(),
            flush_buf: Vec::new(),
            stats: DeviceStats::default(),
            pending: Vec::new(),
            awaiting_sync: Vec::new(),
            fraction: None,
            limit: None,
            history: History::default(),
        }
    }

    // --- slab and pools ------------------------------------------------------------------

    fn new_block(&mut self, block: Block) -> u32 {
        match self.free_slots.pop() {
            Some(i) => {
                self.blocks[i as usize] = block;
                i
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn drop_block(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.live = false;
        b.prev = NIL;
        b.next = NIL;
        self.free_slots.push(i);
    }

    fn pool_mut(&mut self, pool: PoolKind) -> &mut BTreeMap<PoolKey, u32> {
        match pool {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn pool_insert(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        let (key, pool) = (b.key(), b.pool);
        self.pool_mut(pool).insert(key, i);
    }

    fn pool_remove(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        let (key, pool) = (b.key(), b.pool);
        self.pool_mut(pool).remove(&key);
    }

    /// `(allocated_bytes, reserved_bytes)` now, over both pools.
    pub(crate) fn totals(&self) -> (i64, i64) {
        (
            self.stats.allocated_bytes[StatType::Aggregate].current,
            self.stats.reserved_bytes[StatType::Aggregate].current,
        )
    }

    /// The block's address, size and stream (for the public layer).
    pub(crate) fn block_info(&self, i: u32) -> (u64, usize, StreamHandle) {
        let b = &self.blocks[i as usize];
        (b.addr, b.size, b.stream)
    }

    // --- malloc --------------------------------------------------------------------------

    /// Allocate `orig_size` (> 0) bytes on `stream`: exact-size cache → best fit → flush
    /// the cache and best fit again → new segment → free cached segments of this pool and
    /// retry → free all cached segments and retry → out of memory.
    #[inline]
    pub(crate) fn malloc(
        &mut self,
        raw: &dyn RawAllocator,
        orig_size: usize,
        stream: StreamHandle,
    ) -> Result<u32, MemoryError> {
        if !self.pending.is_empty() {
            self.process_events(raw);
        }
        let size = round_size(orig_size);
        if let Some(i) = self.cache.pop(stream, size) {
            self.blocks[i as usize].cached = false;
            return Ok(self.alloc_found_block(i, size, orig_size));
        }
        self.malloc_uncached(raw, orig_size, size, stream)
    }

    /// `malloc` when the exact-size cache has no block of the size.
    fn malloc_uncached(
        &mut self,
        raw: &dyn RawAllocator,
        orig_size: usize,
        size: usize,
        stream: StreamHandle,
    ) -> Result<u32, MemoryError> {
        let pool = pool_for(size);
        let block = match self.get_free_block(pool, stream, size) {
            Some(i) => i,
            None => {
                self.flush_cache(Some((stream, pool)));
                match self.get_free_block(pool, stream, size) {
                    Some(i) => i,
                    None => self.alloc_block_or_retry(raw, pool, stream, size)?,
                }
            }
        };
        Ok(self.alloc_found_block(block, size, orig_size))
    }

    /// Take the best-fitting free block of `pool` on `stream` out of the pool.
    fn get_free_block(&mut self, pool: PoolKind, stream: StreamHandle, size: usize) -> Option<u32> {
        let map = self.pool_mut(pool);
        let (&key, &i) = map.range((stream.0, size, 0)..).next()?;
        if key.0 != stream.0 {
            return None;
        }
        map.remove(&key);
        Some(i)
    }

    /// The slow path: a new segment, with the two release-and-retry steps.
    #[cold]
    fn alloc_block_or_retry(
        &mut self,
        raw: &dyn RawAllocator,
        pool: PoolKind,
        stream: StreamHandle,
        size: usize,
    ) -> Result<u32, MemoryError> {
        let alloc_size = allocation_size(size);
        if let Some(i) = self.alloc_block(raw, pool, stream, alloc_size, false)? {
            return Ok(i);
        }
        if self.release_available_cached_blocks(raw, pool, stream, alloc_size)?
            && let Some(i) = self.alloc_block(raw, pool, stream, alloc_size, true)?
        {
            return Ok(i);
        }
        self.release_cached_blocks(raw)?;
        if let Some(i) = self.alloc_block(raw, pool, stream, alloc_size, true)? {
            return Ok(i);
        }
        Err(self.out_of_memory(raw, alloc_size, stream))
    }

    /// Take a new segment of `alloc_size` bytes from the raw allocator, unless the memory
    /// fraction forbids it. `Ok(None)`: out of memory.
    fn alloc_block(
        &mut self,
        raw: &dyn RawAllocator,
        pool: PoolKind,
        stream: StreamHandle,
        alloc_size: usize,
        is_retry: bool,
    ) -> Result<Option<u32>, MemoryError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        let reserved = self.stats.reserved_bytes[StatType::Aggregate].current as u64;
        if let Some(limit) = self.limit
            && reserved.saturating_add(alloc_size as u64) > limit.bytes
        {
            return Ok(None);
        }
        let addr = match raw.allocate(alloc_size) {
            Ok(addr) => addr,
            Err(RawAllocError::OutOfMemory) => return Ok(None),
            Err(RawAllocError::Other(message)) => {
                return Err(MemoryError::Raw {
                    device: self.device,
                    op: "allocate",
                    bytes: alloc_size as u64,
                    message,
                });
            }
        };
        let i = self.new_block(Block {
            addr,
            size: alloc_size,
            requested: 0,
            stream,
            pool,
            allocated: false,
            prev: NIL,
            next: NIL,
            event_count: 0,
            stream_uses: Vec::new(),
            live: true,
            cached: false,
        });
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, alloc_size as i64);
        self.stats.num_device_alloc += 1;
        self.history
            .record(HistoryAction::SegmentAlloc, addr, alloc_size as u64, stream);
        Ok(Some(i))
    }

    /// Hand out block `i` (out of its pool) for a request of `size` rounded bytes, splitting
    /// off the remainder when the policy says so.
    fn alloc_found_block(&mut self, i: u32, size: usize, orig_size: usize) -> u32 {
        let (left, left_end, left_n) = self.free_extent(i, false);
        let (right, right_end, right_n) = self.free_extent(i, true);
        let b = &self.blocks[i as usize];
        let (pool, block_size) = (b.pool, b.size);
        let before = run_weight(left + block_size + right, left_end && right_end);
        let mut remainder = 0;
        if should_split(pool, block_size, size) {
            let (addr, stream, next) = (b.addr, b.stream, b.next);
            let remaining = block_size - size;
            let r = self.new_block(Block {
                addr: addr + size as u64,
                size: remaining,
                requested: 0,
                stream,
                pool,
                allocated: false,
                prev: i,
                next,
                event_count: 0,
                stream_uses: Vec::new(),
                live: true,
                cached: false,
            });
            if next != NIL {
                self.blocks[next as usize].prev = r;
            }
            let b = &mut self.blocks[i as usize];
            b.next = r;
            b.size = size;
            self.pool_insert(r);
            remainder = remaining;
        }
        // The free run around the block splits into the runs left and right of it.
        let after = run_weight(left, false).plus(run_weight(right + remainder, false));
        self.stats.add_inactive_split(pool, after.minus(before));
        let b = &mut self.blocks[i as usize];
        b.allocated = true;
        b.requested = orig_size;
        let (addr, size, stream) = (b.addr, b.size as i64, b.stream);
        let s = &mut self.stats;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, size);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, size);
        s.requested_bytes.increase(pool, orig_size as i64);
        self.history
            .record(HistoryAction::Alloc, addr, orig_size as u64, stream);
        if left_n + right_n > MAX_RUN_WALK {
            self.flush_cache(Some((stream, pool)));
        }
        i
    }

    /// Bytes of the free blocks next to block `i` going back (`forward` false) or forward,
    /// whether they reach that end of the segment (also when there are none and `i` is at
    /// the end), and how many blocks that is.
    #[inline]
    fn free_extent(&self, i: u32, forward: bool) -> (usize, bool, usize) {
        let b = &self.blocks[i as usize];
        let mut j = if forward { b.next } else { b.prev };
        let (mut bytes, mut n) = (0, 0);
        while j != NIL {
            let b = &self.blocks[j as usize];
            if b.allocated || b.event_count > 0 {
                return (bytes, false, n);
            }
            bytes += b.size;
            n += 1;
            j = if forward { b.next } else { b.prev };
        }
        (bytes, true, n)
    }

    /// Count and describe an out-of-memory failure.
    fn out_of_memory(
        &mut self,
        raw: &dyn RawAllocator,
        alloc_size: usize,
        stream: StreamHandle,
    ) -> MemoryError {
        self.stats.num_ooms += 1;
        self.history
            .record(HistoryAction::Oom, 0, alloc_size as u64, stream);
        let info = raw.mem_info();
        let allocated = self.stats.allocated_bytes[StatType::Aggregate]
            .current
            .max(0) as u64;
        let reserved = self.stats.reserved_bytes[StatType::Aggregate]
            .current
            .max(0) as u64;
        MemoryError::OutOfMemory {
            device: self.device,
            requested: alloc_size as u64,
            total: info.map(|(_, total)| total),
            free: info.map(|(free, _)| free),
            allocated,
            reserved_unallocated: reserved.saturating_sub(allocated),
            fraction_limit: self.limit,
        }
    }

    // --- free ----------------------------------------------------------------------------

    /// The caller dropped block `i`. It goes back to its pool now, or once the events of
    /// the streams recorded on it have completed.
    pub(crate) fn free(&mut self, raw: &dyn RawAllocator, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.allocated = false;
        let (pool, size, addr, requested, stream) =
            (b.pool, b.size as i64, b.addr, b.requested, b.stream);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        self.history
            .record(HistoryAction::FreeRequested, addr, requested as u64, stream);
        if self.blocks[i as usize].stream_uses.is_empty() {
            self.free_block(i);
        } else {
            self.insert_events(raw, i);
        }
    }

    /// Record an event on every stream that used block `i`; free it if none is outstanding.
    #[cold]
    fn insert_events(&mut self, raw: &dyn RawAllocator, i: u32) {
        let streams = std::mem::take(&mut self.blocks[i as usize].stream_uses);
        for stream in streams {
            match raw.record_event(stream) {
                Ok(Some(event)) => {
                    self.pending.push((event, i));
                    self.blocks[i as usize].event_count += 1;
                }
                Ok(None) => {}
                Err(_) => {
                    // No event, so no way to know when that stream is done with the block:
                    // it waits for a full synchronisation (empty_cache or the last retry).
                    self.awaiting_sync.push(i);
                    self.blocks[i as usize].event_count += 1;
                }
            }
        }
        if self.blocks[i as usize].event_count == 0 {
            self.free_block(i);
        }
    }

    /// Return a block with no outstanding events to the exact-size cache, or else to its
    /// pool, merging free neighbours.
    #[inline]
    fn free_block(&mut self, i: u32) {
        let (left, left_end, left_n) = self.free_extent(i, false);
        let (right, right_end, right_n) = self.free_extent(i, true);
        let b = &mut self.blocks[i as usize];
        let (pool, size, requested, addr, stream) = (b.pool, b.size, b.requested, b.addr, b.stream);
        b.requested = 0;
        self.history
            .record(HistoryAction::FreeCompleted, addr, requested as u64, stream);
        // The free runs left and right of the block and the block become one run.
        let before = run_weight(left, false).plus(run_weight(right, false));
        let after = run_weight(left + size + right, left_end && right_end);
        let s = &mut self.stats;
        s.add_inactive_split(pool, after.minus(before));
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, size as i64);
        s.requested_bytes.decrease(pool, requested as i64);
        let long_run = left_n + right_n > MAX_RUN_WALK;
        if !long_run && self.cache.push(stream, round_size(requested), i) {
            self.blocks[i as usize].cached = true;
        } else {
            self.merge_and_pool(i);
            if long_run {
                self.flush_cache(Some((stream, pool)));
            }
        }
    }

    /// Merge free block `i` (in no pool and not cached) with its mergeable neighbours and
    /// put it in its pool. The statistics do not change: they count free runs as if merged.
    fn merge_and_pool(&mut self, i: u32) {
        // While the cache is flushed, a run of free blocks may be longer than three.
        loop {
            let (prev, next) = (self.blocks[i as usize].prev, self.blocks[i as usize].next);
            if self.try_merge_blocks(i, prev) == 0 && self.try_merge_blocks(i, next) == 0 {
                break;
            }
        }
        self.pool_insert(i);
    }

    /// Merge cached blocks into the pools: those of one stream and pool, or all of them.
    /// See Note \[Exact-size cache\].
    #[cold]
    fn flush_cache(&mut self, which: Option<(StreamHandle, PoolKind)>) {
        if self.cache.len() == 0 {
            return;
        }
        let mut victims = std::mem::take(&mut self.flush_buf);
        match which {
            Some((stream, pool)) => self.cache.drain_pool(stream, pool, &mut victims),
            None => self.cache.drain_all(&mut victims),
        }
        for &i in &victims {
            self.blocks[i as usize].cached = false;
        }
        // A block merged into a neighbour flushed before it is gone (`live` is false; no
        // block is created meanwhile, so its slot is not reused).
        for &i in &victims {
            if self.blocks[i as usize].live {
                self.merge_and_pool(i);
            }
        }
        victims.clear();
        self.flush_buf = victims;
    }

    /// Merge free neighbour `src` into `dst`; the subsumed bytes, or 0 if `src` is not free.
    fn try_merge_blocks(&mut self, dst: u32, src: u32) -> usize {
        if src == NIL {
            return 0;
        }
        if !self.blocks[src as usize].is_mergeable() {
            return 0;
        }
        self.pool_remove(src);
        let s = &self.blocks[src as usize];
        let (s_addr, s_size, s_prev, s_next) = (s.addr, s.size, s.prev, s.next);
        let d = &mut self.blocks[dst as usize];
        if d.prev == src {
            d.addr = s_addr;
            d.prev = s_prev;
            if s_prev != NIL {
                self.blocks[s_prev as usize].next = dst;
            }
        } else {
            d.next = s_next;
            if s_next != NIL {
                self.blocks[s_next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s_size;
        self.drop_block(src);
        s_size
    }

    /// `record_stream`: block `i` was used on `stream`. For device memory the block's own
    /// stream needs no event; for host memory it does (Note [Host blocks wait for every
    /// stream]).
    pub(crate) fn record_stream(&mut self, i: u32, stream: StreamHandle) {
        // Note [Host blocks wait for every stream]: a device block is reused by work that
        // its allocating stream runs in order after its last use, so only other streams
        // need events. A host block (pinned memory staging an asynchronous copy) is reused
        // by the host, which no stream orders: the next table or batch written into it
        // would overwrite bytes a copy still queued on the allocating stream has yet to
        // read. So host blocks record an event on every stream that used them, their own
        // too, as PyTorch's CachingHostAllocator does. (Found on an H200: two multi-tensor
        // optimizer tables in one step, the second overwriting the first before its copy
        // ran; the emulator, which copied at once, could not show it.)
        let own_stream_ordered = !self.device.is_cpu();
        let b = &mut self.blocks[i as usize];
        if b.allocated
            && (stream != b.stream || !own_stream_ordered)
            && !b.stream_uses.contains(&stream)
        {
            b.stream_uses.push(stream);
        }
    }

    // --- stream events -------------------------------------------------------------------

    /// Poll pending events; blocks whose events have all completed go back to their pools.
    #[cold]
    fn process_events(&mut self, raw: &dyn RawAllocator) {
        let mut k = 0;
        while k < self.pending.len() {
            let (event, i) = self.pending[k];
            match raw.event_done(event) {
                Ok(false) => {
                    k += 1;
                    continue;
                }
                Ok(true) => {
                    self.pending.swap_remove(k);
                    self.complete_event(i);
                }
                Err(_) => {
                    // The event cannot tell us; fall back to a full synchronisation.
                    self.pending.swap_remove(k);
                    self.awaiting_sync.push(i);
                }
            }
            // Releasing a finished event can only leak the handle if it fails.
            let _ = raw.release_event(event);
        }
    }

    fn complete_event(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(i);
        }
    }

    /// Wait for every pending event (and a full synchronisation where one is awaited) and
    /// free the blocks. On error the unfinished waits stay pending.
    fn synchronize_and_free_events(&mut self, raw: &dyn RawAllocator) -> Result<(), MemoryError> {
        self.stats.num_sync_all_streams += 1;
        let mut first_err = None;
        for (event, i) in std::mem::take(&mut self.pending) {
            match raw.synchronize_event(event) {
                Ok(()) => {
                    let _ = raw.release_event(event);
                    self.complete_event(i);
                }
                Err(e) => {
                    self.pending.push((event, i));
                    first_err.get_or_insert(e);
                }
            }
        }
        if !self.awaiting_sync.is_empty() {
            match raw.synchronize() {
                Ok(()) => {
                    for i in std::mem::take(&mut self.awaiting_sync) {
                        self.complete_event(i);
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(self.raw_error("synchronize", 0, e)),
        }
    }

    fn raw_error(&self, op: &'static str, bytes: u64, e: RawAllocError) -> MemoryError {
        MemoryError::Raw {
            device: self.device,
            op,
            bytes,
            message: e.to_string(),
        }
    }

    // --- releasing cached segments --------------------------------------------------------

    /// Return a free, unsplit block (a whole cached segment) to the raw allocator.
    fn release_block(&mut self, raw: &dyn RawAllocator, i: u32) -> Result<(), MemoryError> {
        let b = &self.blocks[i as usize];
        let (addr, size, pool, stream) = (b.addr, b.size, b.pool, b.stream);
        // SAFETY: `addr`/`size` describe a whole segment from `raw.allocate(size)` (an unsplit
        // block spans its segment), it is free and out of every pool after this call, so
        // nothing refers to it any more.
        if let Err(e) = unsafe { raw.deallocate(addr, size) } {
            return Err(self.raw_error("deallocate", size as u64, e));
        }
        self.pool_remove(i);
        self.drop_block(i);
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size as i64);
        self.stats.num_device_free += 1;
        self.history
            .record(HistoryAction::SegmentFree, addr, size as u64, stream);
        Ok(())
    }

    /// Free cached segments of `pool` on `stream` to make room for `alloc_size` bytes: the
    /// smallest one that is large enough, else the largest ones until enough is freed.
    /// `false` when the cached segments together are too small (nothing is freed then).
    fn release_available_cached_blocks(
        &mut self,
        raw: &dyn RawAllocator,
        pool: PoolKind,
        stream: StreamHandle,
        alloc_size: usize,
    ) -> Result<bool, MemoryError> {
        let map = match pool {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        };
        let on_stream = map.range((stream.0, 0, 0)..=(stream.0, usize::MAX, u64::MAX));
        let unsplit = |&(_, &i): &(&PoolKey, &u32)| !self.blocks[i as usize].is_split();
        let fits = on_stream
            .clone()
            .filter(unsplit)
            .find(|(k, _)| k.1 >= alloc_size)
            .map(|(_, &i)| i);
        let victims: Vec<u32> = match fits {
            Some(i) => vec![i],
            None => {
                let mut total = 0;
                let mut chosen = Vec::new();
                for (k, &i) in on_stream.rev().filter(unsplit) {
                    if total >= alloc_size {
                        break;
                    }
                    total += k.1;
                    chosen.push(i);
                }
                if total < alloc_size {
                    return Ok(false);
                }
                chosen
            }
        };
        for i in victims {
            self.release_block(raw, i)?;
        }
        Ok(true)
    }

    /// Wait for pending events, then free every cached unsplit segment of both pools.
    pub(crate) fn release_cached_blocks(
        &mut self,
        raw: &dyn RawAllocator,
    ) -> Result<(), MemoryError> {
        self.synchronize_and_free_events(raw)?;
        self.flush_cache(None);
        let victims: Vec<u32> = self
            .small
            .values()
            .chain(self.large.values())
            .copied()
            .filter(|&i| !self.blocks[i as usize].is_split())
            .collect();
        for i in victims {
            self.release_block(raw, i)?;
        }
        Ok(())
    }
}
