//! The exact-size cache in front of best-fit: freed blocks wait here, unmerged, for the next
//! request of the same rounded size on the same stream. See Note \[Exact-size cache\].
//!
//! Note \[Exact-size cache\]:
//!
//! Best-fit over the pools' ordered sets costs several B-tree operations per allocate/free
//! pair (find, remove, insert the split remainder; on free remove the merged neighbour and
//! insert the merged block). Most programs free and reallocate the same sizes over and over
//! (every tensor op allocates its output and frees temporaries), so a freed block is first
//! offered to a LIFO list keyed by `(stream, pool, rounded request size)` and handed back as
//! is to the next request of that size: no search, no split, no merge. The block's size is
//! the one best-fit chose for that very request, so the policy's split decision for it is
//! unchanged (`should_split` is false).
//!
//! A cached block is *free*: inactive in the statistics, exactly like a pooled block, only
//! not merged with its free neighbours yet and not in a pool's ordered set. So that no
//! statistic depends on when merging happens, `inactive_split` and `inactive_split_bytes`
//! count *runs* of adjacent free blocks as if they were merged (a run that covers its whole
//! segment is not split); merging changes no statistic. The cache is *flushed* — its blocks
//! merged with their neighbours and inserted into the pools — so that fragmentation and
//! out-of-memory behaviour stay as without it:
//!
//! - for a request's pool and stream when the cache and best-fit both miss, before best-fit
//!   is tried again and before any segment is taken from the raw allocator;
//! - entirely before cached segments are released (`empty_cache`, the retry steps) and
//!   before a snapshot (which so shows merged blocks, as the statistics count them);
//! - for a block's stream and pool when an allocation or free walked more than 16 free
//!   blocks next to it, so that runs of unmerged blocks stay short;
//! - never partially otherwise: a block that does not fit in the cache (a full size class,
//!   too many large classes or streams) is merged and pooled at once instead.
//!
//! Two cached blocks are never merged with each other until they are flushed, and merging
//! skips cached neighbours, so a cached block stays exactly where its list says it is.

use ember_device::driver::StreamHandle;

use crate::policy::{MIN_BLOCK_SIZE, PoolKind, SMALL_SIZE};

/// Most blocks cached per size class; further frees of that size are merged and pooled.
pub(crate) const MAX_PER_CLASS: usize = 64;
/// Most large-pool size classes cached per stream.
pub(crate) const MAX_LARGE_CLASSES: usize = 16;
/// Most streams with a cache.
pub(crate) const MAX_STREAMS: usize = 8;
/// Small-pool size classes: every multiple of [`MIN_BLOCK_SIZE`] up to [`SMALL_SIZE`].
const SMALL_CLASSES: usize = SMALL_SIZE / MIN_BLOCK_SIZE;

/// The cached blocks of one stream.
#[derive(Debug)]
struct StreamCache {
    stream: StreamHandle,
    /// Indexed by `size / MIN_BLOCK_SIZE - 1`; allocated on first use.
    small: Vec<Vec<u32>>,
    /// Small classes that may be non-empty (each listed once), for a cheap flush.
    small_used: Vec<u16>,
    /// `(rounded size, blocks)`; at most [`MAX_LARGE_CLASSES`] entries.
    large: Vec<(usize, Vec<u32>)>,
    /// Blocks cached for this stream.
    len: usize,
}

/// Freed blocks by stream, pool and rounded request size (LIFO within a class).
#[derive(Debug, Default)]
pub(crate) struct FreeCache {
    streams: Vec<StreamCache>,
    /// Blocks cached over all streams.
    len: usize,
}

impl FreeCache {
    /// Blocks cached over all streams.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn stream_mut(&mut self, stream: StreamHandle) -> Option<&mut StreamCache> {
        self.streams.iter_mut().find(|s| s.stream == stream)
    }

    /// The most recently cached block of rounded request size `size` on `stream`.
    #[inline]
    pub(crate) fn pop(&mut self, stream: StreamHandle, size: usize) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let s = self.stream_mut(stream)?;
        let list = if size <= SMALL_SIZE {
            s.small.get_mut(size / MIN_BLOCK_SIZE - 1)?
        } else {
            &mut s.large.iter_mut().find(|(k, _)| *k == size)?.1
        };
        let i = list.pop()?;
        s.len -= 1;
        self.len -= 1;
        Some(i)
    }

    /// Cache block `i`, freed after serving a request of rounded size `size` on `stream`;
    /// `false` (nothing cached) when its class, the large classes or the streams are full.
    #[inline]
    pub(crate) fn push(&mut self, stream: StreamHandle, size: usize, i: u32) -> bool {
        let s = match self.streams.iter().position(|s| s.stream == stream) {
            Some(k) => &mut self.streams[k],
            None => {
                if self.streams.len() >= MAX_STREAMS {
                    return false;
                }
                self.streams.push(StreamCache {
                    stream,
                    small: Vec::new(),
                    small_used: Vec::new(),
                    large: Vec::new(),
                    len: 0,
                });
                let last = self.streams.len() - 1;
                &mut self.streams[last]
            }
        };
        let list = if size <= SMALL_SIZE {
            if s.small.is_empty() {
                s.small.resize_with(SMALL_CLASSES, Vec::new);
            }
            let class = size / MIN_BLOCK_SIZE - 1;
            let list = &mut s.small[class];
            if list.is_empty() && list.capacity() == 0 {
                // First use of this class since the last flush released it.
                s.small_used.push(class as u16);
            }
            list
        } else {
            match s.large.iter().position(|(k, _)| *k == size) {
                Some(k) => &mut s.large[k].1,
                None => match s.large.iter().position(|(_, l)| l.is_empty()) {
                    Some(k) => {
                        s.large[k].0 = size;
                        &mut s.large[k].1
                    }
                    None if s.large.len() < MAX_LARGE_CLASSES => {
                        s.large.push((size, Vec::new()));
                        let last = s.large.len() - 1;
                        &mut s.large[last].1
                    }
                    None => return false,
                },
            }
        };
        if list.len() >= MAX_PER_CLASS {
            return false;
        }
        list.push(i);
        s.len += 1;
        self.len += 1;
        true
    }

    /// Take every cached block of `pool` on `stream` out of the cache.
    pub(crate) fn drain_pool(&mut self, stream: StreamHandle, pool: PoolKind, out: &mut Vec<u32>) {
        let Some(s) = self.stream_mut(stream) else {
            return;
        };
        let before = out.len();
        match pool {
            PoolKind::Small => {
                for class in std::mem::take(&mut s.small_used) {
                    // Release the class's buffer too, so that `push` lists it again.
                    out.append(&mut std::mem::take(&mut s.small[class as usize]));
                }
            }
            PoolKind::Large => {
                for (_, list) in &mut s.large {
                    out.append(list);
                }
            }
        }
        let n = out.len() - before;
        s.len -= n;
        self.len -= n;
    }

    /// Take every cached block out of the cache.
    pub(crate) fn drain_all(&mut self, out: &mut Vec<u32>) {
        let streams: Vec<StreamHandle> = self.streams.iter().map(|s| s.stream).collect();
        for stream in streams {
            self.drain_pool(stream, PoolKind::Small, out);
            self.drain_pool(stream, PoolKind::Large, out);
        }
    }

    /// Every cached block with its stream and rounded request size (for the invariant check).
    pub(crate) fn entries(&self) -> Vec<(u32, StreamHandle, usize)> {
        let mut v = Vec::new();
        for s in &self.streams {
            for (class, list) in s.small.iter().enumerate() {
                let size = (class + 1) * MIN_BLOCK_SIZE;
                v.extend(list.iter().map(|&i| (i, s.stream, size)));
            }
            for (size, list) in &s.large {
                v.extend(list.iter().map(|&i| (i, s.stream, *size)));
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: StreamHandle = StreamHandle::DEFAULT;

    #[test]
    fn lifo_per_class_and_stream() {
        let mut c = FreeCache::default();
        assert!(c.push(S, 512, 1));
        assert!(c.push(S, 512, 2));
        assert!(c.push(S, 1024, 3));
        assert!(c.push(StreamHandle(7), 512, 4));
        assert!(c.push(S, 3 << 20, 5));
        assert_eq!(c.len(), 5);
        assert_eq!(c.pop(S, 512), Some(2));
        assert_eq!(c.pop(S, 512), Some(1));
        assert_eq!(c.pop(S, 512), None);
        assert_eq!(c.pop(S, 2 << 20), None);
        assert_eq!(c.pop(S, 3 << 20), Some(5));
        assert_eq!(c.pop(StreamHandle(7), 512), Some(4));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn bounded_classes_and_streams() {
        let mut c = FreeCache::default();
        for i in 0..MAX_PER_CLASS as u32 {
            assert!(c.push(S, 512, i));
        }
        assert!(!c.push(S, 512, 999), "a full class refuses");
        for k in 0..MAX_LARGE_CLASSES {
            assert!(c.push(S, (2 + k) << 20, 1000 + k as u32));
        }
        assert!(!c.push(S, 100 << 20, 2000), "too many large classes");
        // An emptied large class is reused for another size.
        assert_eq!(c.pop(S, 2 << 20), Some(1000));
        assert!(c.push(S, 100 << 20, 2000));
        for s in 1..MAX_STREAMS as u64 {
            assert!(c.push(StreamHandle(s), 512, 3000));
        }
        assert!(!c.push(StreamHandle(99), 512, 4000), "too many streams");
    }

    #[test]
    fn drains_by_pool_and_entirely() {
        let mut c = FreeCache::default();
        c.push(S, 512, 1);
        c.push(S, 4096, 2);
        c.push(S, 3 << 20, 3);
        c.push(StreamHandle(2), 512, 4);
        let mut out = Vec::new();
        c.drain_pool(S, PoolKind::Small, &mut out);
        out.sort();
        assert_eq!(out, vec![1, 2]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.pop(S, 512), None);
        // A drained class is usable (and drained) again.
        c.push(S, 512, 5);
        out.clear();
        c.drain_all(&mut out);
        out.sort();
        assert_eq!(out, vec![3, 4, 5]);
        assert_eq!(c.len(), 0);
        assert!(c.entries().is_empty());
    }
}
