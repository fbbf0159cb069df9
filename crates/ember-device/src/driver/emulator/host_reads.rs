//! Note [Async host reads]: on a GPU, `cuMemcpyHtoDAsync` from pinned memory reads the host
//! bytes when the stream reaches the copy, not when it is enqueued, so the host must not
//! write them again before it knows the copy ran (an event that completed after it, or a
//! stream or device synchronisation). The emulator copies at once (Note [Emulated
//! streams]), so a program that reuses such a buffer too early works here and fails on a
//! GPU, as a multi-tensor optimizer's pinned tables did on an H200 (Note [Host blocks wait
//! for every stream] in `ember-memory`). To catch that here, each asynchronous host-to-device
//! copy of up to [`MAX_TRACKED_BYTES`] keeps a copy of the bytes it read until the host has
//! observed its completion; a later asynchronous copy whose source overlaps a pending one
//! with different bytes there is the hazard, and fails with an error naming it. Observation
//! is read generously (any synchronisation clears every pending read, an event's completion
//! every read enqueued before its record, on any stream), so a correct program never trips
//! it; the check can miss hazards, never invent them.

use std::collections::VecDeque;

/// Larger copies (data batches) are not tracked: tables and small operands are.
const MAX_TRACKED_BYTES: usize = 64 << 10;
/// Pending reads kept at most (the oldest are forgotten first).
const MAX_PENDING: usize = 256;

/// One asynchronous copy's source, as it was when enqueued.
#[derive(Debug)]
struct HostRead {
    addr: usize,
    bytes: Vec<u8>,
    seq: u64,
}

/// The asynchronous host reads whose completion the host has not observed.
#[derive(Debug, Default)]
pub(super) struct HostReads {
    seq: u64,
    pending: VecDeque<HostRead>,
}

impl HostReads {
    /// The sequence number an event recorded now carries: its completion observes every
    /// read up to it.
    pub(super) fn now(&self) -> u64 {
        self.seq
    }

    /// Before an asynchronous copy reads `src`: `Err` (what was overwritten) if a pending
    /// read overlapping it saw different bytes.
    pub(super) fn check(&self, src: &[u8]) -> Result<(), String> {
        let (lo, hi) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
        for r in &self.pending {
            let (a, b) = (r.addr.max(lo), (r.addr + r.bytes.len()).min(hi));
            if a >= b {
                continue;
            }
            if r.bytes[a - r.addr..b - r.addr] != src[a - lo..b - lo] {
                return Err(format!(
                    "host bytes {a:#x}..{b:#x}, which an earlier cuMemcpyHtoDAsync reads, were \
                     overwritten before the host observed that copy's completion (no event \
                     recorded after it completed, no stream or device synchronisation): on a \
                     GPU the earlier copy would read the new bytes (Note [Async host reads])"
                ));
            }
        }
        Ok(())
    }

    /// Remember that an asynchronous copy read `src` (if small enough to track).
    pub(super) fn push(&mut self, src: &[u8]) {
        self.seq += 1;
        if src.len() > MAX_TRACKED_BYTES {
            return;
        }
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back(HostRead {
            addr: src.as_ptr() as usize,
            bytes: src.to_vec(),
            seq: self.seq,
        });
    }

    /// A synchronisation: every read enqueued so far is known to be done.
    pub(super) fn observe_all(&mut self) {
        self.pending.clear();
    }

    /// An event recorded at `seq` completed: the reads enqueued before it are done.
    pub(super) fn observe_until(&mut self, seq: u64) {
        self.pending.retain(|r| r.seq > seq);
    }
}
