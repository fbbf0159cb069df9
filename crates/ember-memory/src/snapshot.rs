//! What the allocator holds and what it did: [`MemorySnapshot`] (segments and their blocks,
//! `torch.cuda.memory_snapshot()`) and the recorded allocation history ([`HistoryEntry`],
//! `torch.cuda.memory._record_memory_history()`), both serde-serialisable.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use ember_device::Device;
use ember_device::driver::StreamHandle;
use serde::{Deserialize, Serialize};

use crate::error::MemoryError;
use crate::policy::PoolKind;

/// Default bound of the history ring when none is given.
pub const DEFAULT_HISTORY_ENTRIES: usize = 100_000;

/// The state of one block inside a segment (PyTorch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out and not yet freed.
    ActiveAllocated,
    /// Freed, but waiting for events on streams recorded with `record_stream`.
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSnapshot {
    /// First byte.
    pub address: u64,
    /// Bytes (a multiple of 512).
    pub size: u64,
    /// Bytes the caller asked for (0 for inactive blocks).
    pub requested_size: u64,
    /// Allocated, pending free, or inactive.
    pub state: BlockState,
}

/// One segment taken from the raw allocator, with its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSnapshot {
    /// First byte.
    pub address: u64,
    /// Bytes of the segment.
    pub total_size: u64,
    /// Bytes in allocated blocks.
    pub allocated_size: u64,
    /// Bytes in active blocks (allocated or pending free).
    pub active_size: u64,
    /// Bytes requested by callers of active blocks.
    pub requested_size: u64,
    /// The stream every block of the segment belongs to.
    pub stream: StreamHandle,
    /// `small` or `large`.
    pub segment_type: PoolKind,
    /// Blocks, in address order, covering the segment exactly.
    pub blocks: Vec<BlockSnapshot>,
}

/// Every segment of one allocator (`torch.cuda.memory_snapshot()`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySnapshot {
    /// The allocator's device.
    pub device: Device,
    /// Segments in address order.
    pub segments: Vec<SegmentSnapshot>,
}

impl MemorySnapshot {
    /// As pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, MemoryError> {
        serde_json::to_string_pretty(self).map_err(|e| MemoryError::Serialize {
            what: "snapshot",
            message: e.to_string(),
        })
    }
}

/// What a history entry records (PyTorch's trace actions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryAction {
    /// A block was handed out.
    Alloc,
    /// The caller freed a block (it may still wait for stream events).
    FreeRequested,
    /// The block went back to its pool.
    FreeCompleted,
    /// A segment was taken from the raw allocator.
    SegmentAlloc,
    /// A segment was returned to the raw allocator.
    SegmentFree,
    /// An allocation failed with out-of-memory (`size`: the segment that could not be had).
    Oom,
}

/// One recorded allocator event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Position in the allocator's sequence of recorded events, from 0.
    pub seq: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// What happened.
    pub action: HistoryAction,
    /// Address of the block or segment (0 for `oom`).
    pub address: u64,
    /// Bytes: requested size for alloc/free, segment size for segments and `oom`.
    pub size: u64,
    /// The stream of the block or request.
    pub stream: StreamHandle,
}

/// The bounded ring of recorded events; off by default.
#[derive(Debug, Default)]
pub(crate) struct History {
    enabled: bool,
    max_entries: usize,
    entries: VecDeque<HistoryEntry>,
    next_seq: u64,
}

impl History {
    /// Switch recording on (bounded to `max_entries`) or off (clearing what was recorded).
    pub(crate) fn configure(&mut self, enabled: bool, max_entries: usize) {
        self.enabled = enabled && max_entries > 0;
        self.max_entries = max_entries;
        if !self.enabled {
            self.entries = VecDeque::new();
        }
        while self.entries.len() > self.max_entries {
            self.entries.pop_front();
        }
    }

    /// Record an event if recording is on.
    #[inline]
    pub(crate) fn record(
        &mut self,
        action: HistoryAction,
        address: u64,
        size: u64,
        stream: StreamHandle,
    ) {
        if self.enabled {
            self.push(action, address, size, stream);
        }
    }

    #[cold]
    fn push(&mut self, action: HistoryAction, address: u64, size: u64, stream: StreamHandle) {
        if self.entries.len() >= self.max_entries {
            self.entries.pop_front();
        }
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.entries.push_back(HistoryEntry {
            seq: self.next_seq,
            time_us,
            action,
            address,
            size,
            stream,
        });
        self.next_seq += 1;
    }

    /// The recorded events, oldest first.
    pub(crate) fn entries(&self) -> Vec<HistoryEntry> {
        self.entries.iter().cloned().collect()
    }
}

/// A history as pretty-printed JSON (an array of entries).
pub fn history_to_json(entries: &[HistoryEntry]) -> Result<String, MemoryError> {
    serde_json::to_string_pretty(entries).map_err(|e| MemoryError::Serialize {
        what: "history",
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded_and_sequenced() {
        let mut h = History::default();
        h.record(HistoryAction::Alloc, 1, 2, StreamHandle::DEFAULT);
        assert!(h.entries().is_empty(), "off by default");
        h.configure(true, 3);
        for i in 0..5 {
            h.record(HistoryAction::Alloc, i, 512, StreamHandle::DEFAULT);
        }
        let e = h.entries();
        assert_eq!(e.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(e[0].address, 2);
        h.configure(true, 1);
        assert_eq!(h.entries().len(), 1);
        h.configure(false, 10);
        assert!(h.entries().is_empty());
    }

    #[test]
    fn history_json_names_actions() {
        let mut h = History::default();
        h.configure(true, 10);
        h.record(HistoryAction::SegmentAlloc, 4096, 2 << 20, StreamHandle(3));
        let json = history_to_json(&h.entries()).unwrap();
        assert!(json.contains("\"segment_alloc\""), "{json}");
        let back: Vec<HistoryEntry> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h.entries());
    }
}
