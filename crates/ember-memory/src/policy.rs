//! The caching policy: size constants and the small pure functions the allocator is built
//! from. Modelled on PyTorch's `c10/cuda/CUDACachingAllocator.cpp`.
//!
//! The policy, as the allocator ([`crate::CachingAllocator`]) applies it:
//!
//! - Every request is rounded up to a multiple of [`MIN_BLOCK_SIZE`] (512 B) by
//!   [`round_size`]. A zero-byte request consumes nothing: it gets a non-null address that
//!   must never be dereferenced.
//! - Rounded sizes up to [`SMALL_SIZE`] (1 MiB) come from the *small* pool, larger ones from
//!   the *large* pool ([`pool_for`]). The pools never share memory.
//! - When no cached block fits, a new *segment* is taken from the raw allocator, sized by
//!   [`allocation_size`]: small requests share [`SMALL_BUFFER`] (2 MiB) segments; requests
//!   below [`MIN_LARGE_ALLOC`] (10 MiB) share [`LARGE_BUFFER`] (20 MiB) segments; larger ones
//!   get a segment of their own, rounded up to [`ROUND_LARGE`] (2 MiB).
//! - Free blocks are kept per pool in an ordered set keyed by `(stream, size, address)`; a
//!   request takes the *best fit*: the smallest free block of its stream that is large enough,
//!   lowest address first among equals.
//! - A block larger than the request is *split* when [`should_split`] says the remainder is
//!   worth keeping: more than [`MIN_BLOCK_SIZE`] in the small pool, more than [`SMALL_SIZE`]
//!   in the large pool (a smaller remainder stays with the block as slack). Oversize blocks
//!   (PyTorch's `max_split_size`) are not modelled: every large block may be split.
//! - On free, a block is merged with its free neighbours in the same segment and goes back to
//!   its pool — or, first, into an *exact-size cache*: a LIFO list per stream and rounded
//!   request size (at most 64 blocks a size) whose blocks are handed back, unsplit and
//!   unmerged, to the next request of that size before best-fit is tried. The cache is
//!   flushed (its blocks merged into the pools) when best-fit finds nothing, before any new
//!   segment or retry, in `empty_cache` and snapshots, and when a run of free blocks grows
//!   long; statistics count a run of free blocks as if merged, so the cache changes none of
//!   them. See Note \[Exact-size cache\] in `state/cache.rs`.
//! - Blocks belong to the stream they were allocated on: a block freed on stream `S` is only
//!   reused by allocations on `S`. [`crate::Allocation::record_stream`] notes other streams
//!   that used the block; freeing such a block records an event on each of them and keeps the
//!   block out of its pool until all those events have completed. Pending events are polled
//!   at the start of every allocation and waited for by `empty_cache`.
//! - When the raw allocator is out of memory (or the per-process memory fraction would be
//!   exceeded), the allocator frees cached segments (free, unsplit ones) of the request's
//!   pool and stream — one large enough if there is one, else the largest until enough is
//!   freed — and retries; then it frees *every* cached unsplit segment (after waiting for
//!   pending events) and retries once more. Each retry counts in `num_alloc_retries`. Only
//!   then is the request an out-of-memory error (counted in `num_ooms`).
//! - The memory fraction caps reserved memory at `fraction × total`, where the total comes
//!   from [`crate::RawAllocator::mem_info`]. Raw allocators that know no total (host memory)
//!   accept a fraction but are not limited by it.
//! - `empty_cache` waits for pending events and returns every cached unsplit segment to the
//!   raw allocator; segments with a live block stay.

/// Every block size is a multiple of this, in bytes (PyTorch's `kMinBlockSize`).
pub const MIN_BLOCK_SIZE: usize = 512;
/// Largest rounded request served from the small pool, in bytes: 1 MiB (`kSmallSize`).
pub const SMALL_SIZE: usize = 1 << 20;
/// Segment size of the small pool, in bytes: 2 MiB (`kSmallBuffer`).
pub const SMALL_BUFFER: usize = 2 << 20;
/// Requests from [`SMALL_SIZE`] up to (not including) this many bytes share
/// [`LARGE_BUFFER`] segments: 10 MiB (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// Shared segment size for mid-sized large requests, in bytes: 20 MiB (`kLargeBuffer`).
pub const LARGE_BUFFER: usize = 20 << 20;
/// Segments for requests of [`MIN_LARGE_ALLOC`] or more are rounded up to a multiple of
/// this, in bytes: 2 MiB (`kRoundLarge`).
pub const ROUND_LARGE: usize = 2 << 20;
/// Alignment of host (CPU and fallback pinned) segments, in bytes.
pub const HOST_ALIGNMENT: usize = 64;

/// Which block pool a request is served from.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Rounded sizes up to [`SMALL_SIZE`], packed in [`SMALL_BUFFER`] segments.
    Small,
    /// Everything larger.
    Large,
}

/// `bytes` rounded up to a multiple of [`MIN_BLOCK_SIZE`] (at least one block).
///
/// Saturates at the largest multiple of [`MIN_BLOCK_SIZE`] for absurd requests, which the
/// raw allocator then refuses.
pub fn round_size(bytes: usize) -> usize {
    if bytes < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        round_up(bytes, MIN_BLOCK_SIZE)
    }
}

/// The pool a request of `size` rounded bytes is served from.
pub fn pool_for(size: usize) -> PoolKind {
    if size <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// Bytes of the segment to take from the raw allocator for a request of `size` rounded bytes
/// that no cached block can serve.
pub fn allocation_size(size: usize) -> usize {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        round_up(size, ROUND_LARGE)
    }
}

/// Whether a free block of `block_size` bytes in `pool`, chosen for a request of `size`
/// rounded bytes, is split in two (the remainder going back to the pool as a free block).
pub fn should_split(pool: PoolKind, block_size: usize, size: usize) -> bool {
    let remaining = block_size.saturating_sub(size);
    match pool {
        PoolKind::Small => remaining >= MIN_BLOCK_SIZE,
        PoolKind::Large => remaining > SMALL_SIZE,
    }
}

/// `n` rounded up to a multiple of `to` (a power of two or not), saturating.
fn round_up(n: usize, to: usize) -> usize {
    match n.checked_add(to - 1) {
        Some(m) => m / to * to,
        None => usize::MAX / to * to,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn round_size_rounds_to_min_block() {
        assert_eq!(round_size(0), 512);
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(MIB), MIB);
        assert_eq!(round_size(MIB + 1), MIB + 512);
        assert_eq!(round_size(usize::MAX) % MIN_BLOCK_SIZE, 0);
    }

    #[test]
    fn pool_boundary_is_one_mib() {
        assert_eq!(pool_for(512), PoolKind::Small);
        assert_eq!(pool_for(MIB), PoolKind::Small);
        assert_eq!(pool_for(MIB + 512), PoolKind::Large);
    }

    #[test]
    fn allocation_sizes() {
        assert_eq!(allocation_size(512), 2 * MIB);
        assert_eq!(allocation_size(MIB), 2 * MIB);
        assert_eq!(allocation_size(MIB + 512), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(allocation_size(10 * MIB + 512), 12 * MIB);
        assert_eq!(allocation_size(64 * MIB), 64 * MIB);
    }

    #[test]
    fn split_thresholds() {
        // Small pool: any remainder of a whole block is kept.
        assert!(should_split(PoolKind::Small, 2 * MIB, 512));
        assert!(should_split(PoolKind::Small, 1024, 512));
        assert!(!should_split(PoolKind::Small, 512, 512));
        // Large pool: only remainders above 1 MiB are kept.
        assert!(should_split(PoolKind::Large, 20 * MIB, 2 * MIB));
        assert!(!should_split(PoolKind::Large, 3 * MIB, 2 * MIB));
        assert!(should_split(PoolKind::Large, 3 * MIB + 512, 2 * MIB));
        assert!(!should_split(PoolKind::Large, 2 * MIB, 2 * MIB));
    }
}
