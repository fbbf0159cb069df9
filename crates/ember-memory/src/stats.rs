//! Memory statistics: [`Stat`] per [`StatType`], [`DeviceStats`], PyTorch's flattened
//! [`MemoryStats`] keys, the [`format_size`] of every message, and the summary table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::{Index, IndexMut};

use ember_device::Device;
use serde::{Deserialize, Serialize};

use crate::policy::PoolKind;

/// One statistic: its current value, the peak since the last reset, and the totals added
/// and removed since the last reset. `current == allocated − freed` as long as
/// [`crate::CachingAllocator::reset_accumulated_stats`] has not been called since the
/// allocator was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Value now.
    pub current: i64,
    /// Highest `current` since creation or [`crate::CachingAllocator::reset_peak_stats`].
    pub peak: i64,
    /// Sum of all increases since creation or the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since creation or the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// Add `amount`, raising the peak if needed.
    #[inline]
    pub fn increase(&mut self, amount: i64) {
        self.current += amount;
        self.allocated += amount;
        self.peak = self.peak.max(self.current);
    }

    /// Subtract `amount`.
    #[inline]
    pub fn decrease(&mut self, amount: i64) {
        self.current -= amount;
        self.freed += amount;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which blocks a [`Stat`] covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StatType {
    /// Both pools (`"all"`).
    Aggregate,
    /// The small pool (`"small_pool"`).
    SmallPool,
    /// The large pool (`"large_pool"`).
    LargePool,
}

impl StatType {
    /// All three, in PyTorch's order.
    pub const ALL: [StatType; 3] = [
        StatType::Aggregate,
        StatType::SmallPool,
        StatType::LargePool,
    ];

    /// PyTorch's key fragment: `all`, `small_pool`, `large_pool`.
    pub fn name(self) -> &'static str {
        match self {
            StatType::Aggregate => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }

    /// The per-pool stat type of a pool.
    pub fn of_pool(pool: PoolKind) -> StatType {
        match pool {
            PoolKind::Small => StatType::SmallPool,
            PoolKind::Large => StatType::LargePool,
        }
    }
}

/// One [`Stat`] per [`StatType`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatArray(pub [Stat; 3]);

impl Index<StatType> for StatArray {
    type Output = Stat;
    fn index(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }
}

impl IndexMut<StatType> for StatArray {
    fn index_mut(&mut self, t: StatType) -> &mut Stat {
        &mut self.0[t as usize]
    }
}

impl StatArray {
    /// Increase the aggregate and `pool`'s stat.
    #[inline]
    pub fn increase(&mut self, pool: PoolKind, amount: i64) {
        self.0[0].increase(amount);
        self.0[StatType::of_pool(pool) as usize].increase(amount);
    }

    /// Decrease the aggregate and `pool`'s stat.
    #[inline]
    pub fn decrease(&mut self, pool: PoolKind, amount: i64) {
        self.0[0].decrease(amount);
        self.0[StatType::of_pool(pool) as usize].decrease(amount);
    }
}

/// A device allocator's statistics (PyTorch's `DeviceStats`). Each field is a COUNT (of
/// blocks, segments or events) or a SUM (of bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// COUNT of live allocations handed to callers (freed when the caller drops them, even if
    /// the block waits for stream events).
    pub allocation: StatArray,
    /// COUNT of segments taken from the raw allocator.
    pub segment: StatArray,
    /// COUNT of active blocks: allocated, or freed but waiting for stream events.
    pub active: StatArray,
    /// COUNT of inactive blocks inside split segments (free, but not releasable).
    pub inactive_split: StatArray,
    /// SUM of bytes of live allocations (rounded block sizes).
    pub allocated_bytes: StatArray,
    /// SUM of bytes of segments taken from the raw allocator.
    pub reserved_bytes: StatArray,
    /// SUM of bytes of active blocks.
    pub active_bytes: StatArray,
    /// SUM of bytes of inactive blocks inside split segments.
    pub inactive_split_bytes: StatArray,
    /// SUM of bytes requested by callers of active blocks (before rounding).
    pub requested_bytes: StatArray,
    /// COUNT of raw allocations retried after freeing cached segments.
    pub num_alloc_retries: i64,
    /// COUNT of allocations that failed with out-of-memory.
    pub num_ooms: i64,
    /// COUNT of waits for all pending stream events (in `empty_cache` and the last retry).
    pub num_sync_all_streams: i64,
    /// COUNT of segments taken from the raw allocator.
    pub num_device_alloc: i64,
    /// COUNT of segments returned to the raw allocator.
    pub num_device_free: i64,
}

impl DeviceStats {
    /// The nine stat arrays with PyTorch's names, in PyTorch's order.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// Set every peak to its current value.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.0.iter_mut().for_each(Stat::reset_peak);
        }
    }

    /// Zero every `allocated` and `freed` total and the event counters.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.0.iter_mut().for_each(Stat::reset_accumulated);
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// PyTorch's flattened `memory_stats()` dictionary.
    pub fn to_memory_stats(&self) -> MemoryStats {
        let mut map = BTreeMap::new();
        for (name, array) in self.arrays() {
            for t in StatType::ALL {
                let s = array[t];
                let prefix = format!("{name}.{}", t.name());
                map.insert(format!("{prefix}.current"), s.current);
                map.insert(format!("{prefix}.peak"), s.peak);
                map.insert(format!("{prefix}.allocated"), s.allocated);
                map.insert(format!("{prefix}.freed"), s.freed);
            }
        }
        map.insert("num_alloc_retries".into(), self.num_alloc_retries);
        map.insert("num_ooms".into(), self.num_ooms);
        map.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        map.insert("num_device_alloc".into(), self.num_device_alloc);
        map.insert("num_device_free".into(), self.num_device_free);
        MemoryStats(map)
    }
}

/// A change of `(inactive_split, inactive_split_bytes)`: a COUNT of blocks and a SUM of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitWeight(pub(crate) i64, pub(crate) i64);

impl SplitWeight {
    #[inline]
    pub(crate) fn plus(self, o: SplitWeight) -> SplitWeight {
        SplitWeight(self.0 + o.0, self.1 + o.1)
    }
    #[inline]
    pub(crate) fn minus(self, o: SplitWeight) -> SplitWeight {
        SplitWeight(self.0 - o.0, self.1 - o.1)
    }
}

impl DeviceStats {
    /// Apply a net change of the inactive split statistics of `pool`.
    #[inline]
    pub(crate) fn add_inactive_split(&mut self, pool: PoolKind, d: SplitWeight) {
        if d.0 > 0 {
            self.inactive_split.increase(pool, d.0);
        } else if d.0 < 0 {
            self.inactive_split.decrease(pool, -d.0);
        }
        if d.1 > 0 {
            self.inactive_split_bytes.increase(pool, d.1);
        } else if d.1 < 0 {
            self.inactive_split_bytes.decrease(pool, -d.1);
        }
    }
}

/// `torch.cuda.memory_stats()`: flat keys such as `"allocated_bytes.all.current"`,
/// `"allocation.small_pool.peak"` or `"num_ooms"`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemoryStats(pub BTreeMap<String, i64>);

impl MemoryStats {
    /// The value under `key`, if it exists.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.0.get(key).copied()
    }

    /// Iterate keys and values in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

/// A byte count as PyTorch's messages write it: `"512 bytes"`, `"1.50 KiB"`, `"20.00 MiB"`,
/// `"1.00 GiB"`.
pub fn format_size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    let b = bytes as f64;
    if bytes < KIB {
        format!("{bytes} bytes")
    } else if bytes < MIB {
        format!("{:.2} KiB", b / KIB as f64)
    } else if bytes < GIB {
        format!("{:.2} MiB", b / MIB as f64)
    } else {
        format!("{:.2} GiB", b / GIB as f64)
    }
}

/// `torch.cuda.memory_summary()`: a table of the statistics, one row per metric with Cur
/// Usage / Peak Usage / Tot Alloc / Tot Freed, each split by pool.
pub fn summary_table(device: Device, stats: &DeviceStats) -> String {
    const WIDTH: usize = 75;
    let rule = |c: char| format!("|{}|\n", c.to_string().repeat(WIDTH));
    let mut out = String::new();
    out.push_str(&rule('='));
    let title = format!("Ember memory summary, device {device}");
    let _ = writeln!(out, "|{title:^WIDTH$}|");
    out.push_str(&rule('-'));
    let left = format!("Out-of-memory errors: {}", stats.num_ooms);
    let right = format!("Raw alloc retries: {}", stats.num_alloc_retries);
    let _ = writeln!(out, "|{left:^37}|{right:^37}|");
    out.push_str(&rule('='));
    let _ = writeln!(
        out,
        "| {:<21} | {:>10} | {:>10} | {:>10} | {:>10} |",
        "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
    );
    let sections: [&[(&str, &StatArray, bool)]; 2] = [
        &[
            ("Allocated memory", &stats.allocated_bytes, true),
            ("Active memory", &stats.active_bytes, true),
            ("Requested memory", &stats.requested_bytes, true),
            ("Reserved memory", &stats.reserved_bytes, true),
            ("Non-releasable memory", &stats.inactive_split_bytes, true),
        ],
        &[
            ("Allocations", &stats.allocation, false),
            ("Active allocs", &stats.active, false),
            ("Reserved segments", &stats.segment, false),
            ("Non-releasable allocs", &stats.inactive_split, false),
        ],
    ];
    for section in sections {
        for (name, array, bytes) in section {
            out.push_str(&rule('-'));
            for (label, t) in [
                (*name, StatType::Aggregate),
                ("      from large pool", StatType::LargePool),
                ("      from small pool", StatType::SmallPool),
            ] {
                let s = array[t];
                let cell = |v: i64| {
                    if *bytes {
                        summary_size(v)
                    } else {
                        v.to_string()
                    }
                };
                let _ = writeln!(
                    out,
                    "| {label:<21} | {:>10} | {:>10} | {:>10} | {:>10} |",
                    cell(s.current),
                    cell(s.peak),
                    cell(s.allocated),
                    cell(s.freed)
                );
            }
        }
    }
    out.push_str(&rule('='));
    out
}

/// A table cell's size: like [`format_size`] but compact (`"0 B"`, `"512 B"`, `"20.00 MiB"`).
fn summary_size(v: i64) -> String {
    if v.unsigned_abs() < 1024 {
        format!("{v} B")
    } else {
        let s = format_size(v.unsigned_abs());
        if v < 0 { format!("-{s}") } else { s }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_units() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1023), "1023 bytes");
        assert_eq!(format_size(1024), "1.00 KiB");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size((1 << 30) - (1 << 20)), "1023.00 MiB");
        assert_eq!(format_size(1 << 30), "1.00 GiB");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
    }

    #[test]
    fn stat_balances_and_peaks() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!((s.current, s.peak, s.allocated, s.freed), (3, 15, 15, 12));
        s.reset_peak();
        assert_eq!(s.peak, 3);
        s.reset_accumulated();
        assert_eq!((s.allocated, s.freed), (0, 0));
    }

    #[test]
    fn flattened_keys() {
        let mut d = DeviceStats::default();
        d.allocated_bytes.increase(PoolKind::Small, 512);
        d.num_ooms = 2;
        let m = d.to_memory_stats();
        assert_eq!(m.get("allocated_bytes.all.current"), Some(512));
        assert_eq!(m.get("allocated_bytes.small_pool.peak"), Some(512));
        assert_eq!(m.get("allocated_bytes.large_pool.current"), Some(0));
        assert_eq!(m.get("num_ooms"), Some(2));
        // 9 stats × 3 types × 4 metrics + 5 counters.
        assert_eq!(m.0.len(), 9 * 3 * 4 + 5);
    }

    #[test]
    fn summary_rows() {
        let mut d = DeviceStats::default();
        d.allocated_bytes.increase(PoolKind::Large, 20 << 20);
        let t = summary_table(Device::Cuda(0), &d);
        for row in [
            "Allocated memory",
            "from large pool",
            "Reserved memory",
            "Non-releasable allocs",
            "Cur Usage",
            "Tot Freed",
            "20.00 MiB",
            "device cuda:0",
        ] {
            assert!(t.contains(row), "missing {row:?} in\n{t}");
        }
        assert!(t.lines().all(|l| l.chars().count() == 77), "{t}");
    }
}
