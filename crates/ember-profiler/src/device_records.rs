//! Device times from the driver's activity records (CUPTI; Note [CUPTI through the seam] in
//! `ember-device`), the other way [`DeviceTimes`](crate::device_times::DeviceTimes) is.
//!
//! While a cycle records CUDA activity with the activity API, each launch leaves a
//! [`EnqueuedWork`] here (what the call site said, keyed by its correlation id) and nothing
//! else: the driver stamps the work. When the cycle ends, [`Tagged::finish`] waits for the
//! devices, stops the recording, flushes the driver's records and reads its clock beside the
//! host clock, and [`place`] joins each record to its launch by the external id it carries:
//!
//! - a record's own name wins (a cuBLAS call shows the kernels cuBLAS ran, as in PyTorch's
//!   traces); copies and memsets, which have none, take the launch's description;
//! - its device times are moved onto the host clock by the offset between the two clocks
//!   read together, so no per-launch anchor is needed;
//! - a record the driver could not time (a start or end of 0, CUPTI's
//!   `CUPTI_TIMESTAMP_UNKNOWN`, which it writes when it lacked the device memory to stamp a
//!   kernel) is left out, and a launch without any placed record counts as untimed, once; a
//!   record without a launch of this cycle (enqueued before it began, or outside `timed`) is
//!   dropped.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ember_device::driver::{ActivityRecord, Driver};
use ember_device::trace::device::EnqueuedWork;

use crate::device_times::Resolved;
use crate::event::RawDevice;

/// The launches of one cycle recorded through the activity API.
#[derive(Debug, Default)]
pub(crate) struct Tagged {
    launches: HashMap<u64, EnqueuedWork>,
}

impl FromIterator<EnqueuedWork> for Tagged {
    fn from_iter<I: IntoIterator<Item = EnqueuedWork>>(launches: I) -> Tagged {
        Tagged {
            launches: launches.into_iter().map(|l| (l.correlation, l)).collect(),
        }
    }
}

impl Tagged {
    /// End the cycle on `d`, whose recording the cycle enabled: wait for the devices that
    /// ran work, stop recording, take the records and place them.
    pub(crate) fn finish(&mut self, d: &dyn Driver) -> Resolved {
        let devices: HashSet<usize> = self.launches.values().map(|l| l.device).collect();
        let synced = devices.iter().all(|&dev| d.synchronize(dev).is_ok());
        let _ = d.activity_disable();
        let records = d.activity_flush().unwrap_or_default();
        let launches = std::mem::take(&mut self.launches);
        let clock = d
            .activity_timestamp_ns()
            .ok()
            .map(|ns| (ns, Instant::now()));
        match clock {
            Some(clock) if synced => place(records, launches, clock),
            _ => Resolved {
                device: Vec::new(),
                untimed: launches.len() as u64,
            },
        }
    }
}

/// Stop `d`'s recording and drop its records (a cycle dropped unfinished).
pub(crate) fn discard(d: &dyn Driver) {
    let _ = d.activity_disable();
    let _ = d.activity_flush();
}

/// Join `records` to `launches` and put them on the host clock, given the activity clock's
/// reading `clock.0` taken at host time `clock.1`.
pub(crate) fn place(
    records: Vec<ActivityRecord>,
    launches: HashMap<u64, EnqueuedWork>,
    clock: (u64, Instant),
) -> Resolved {
    let (now_ns, now) = clock;
    let host = |ns: u64| -> Option<Instant> {
        if ns <= now_ns {
            now.checked_sub(Duration::from_nanos(now_ns - ns))
        } else {
            now.checked_add(Duration::from_nanos(ns - now_ns))
        }
    };
    let mut seen: HashSet<u64> = HashSet::new();
    let mut out = Resolved::default();
    for r in records {
        let Some(l) = r.external.and_then(|id| launches.get(&id)) else {
            continue;
        };
        // 0 is CUPTI_TIMESTAMP_UNKNOWN, not a time: placed, it would sit decades before the
        // profile and be drawn at its start with no duration.
        let unknown = r.start_ns == 0 || r.end_ns == 0;
        let (false, Some(start), Some(end)) =
            (unknown, host(r.start_ns), host(r.end_ns.max(r.start_ns)))
        else {
            // Its launch counts as untimed below if no other record of it is placed.
            continue;
        };
        seen.insert(l.correlation);
        let mut d = RawDevice::of(l, start, end);
        d.kind = r.kind;
        if !r.name.is_empty() {
            d.name = r.name;
            d.grid = r.grid;
            d.block = r.block;
        }
        if r.bytes > 0 {
            d.bytes = r.bytes;
        }
        out.device.push(d);
    }
    out.untimed += launches.keys().filter(|c| !seen.contains(c)).count() as u64;
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::borrow::Cow;

    use ember_device::driver::{ActivityKind, StreamHandle};
    use ember_device::trace::device::Launch;

    use super::*;

    fn launch(correlation: u64, kind: ActivityKind, name: &'static str) -> EnqueuedWork {
        EnqueuedWork {
            launch: Launch {
                api: "cudaLaunchKernel",
                kind,
                name: Cow::Borrowed(name),
                bytes: 64,
                grid: [2, 1, 1],
                block: [32, 1, 1],
            },
            device: 1,
            stream: StreamHandle(9),
            correlation,
            enqueued: ember_device::trace::Stamp::now(),
            tid: 0,
        }
    }

    fn record(external: Option<u64>, name: &str, start_ns: u64, end_ns: u64) -> ActivityRecord {
        ActivityRecord {
            kind: if name.is_empty() {
                ActivityKind::MemcpyHtoD
            } else {
                ActivityKind::Kernel
            },
            name: name.into(),
            device: 0,
            start_ns,
            end_ns,
            external,
            bytes: 0,
            grid: [7, 1, 1],
            block: [128, 1, 1],
        }
    }

    #[test]
    fn records_join_their_launches_on_the_host_clock() {
        let launches: HashMap<u64, EnqueuedWork> = [
            launch(1, ActivityKind::Kernel, "gemm call"),
            launch(2, ActivityKind::MemcpyHtoD, "Memcpy HtoD (Host -> Device)"),
            launch(3, ActivityKind::Kernel, "never ran"),
        ]
        .into_iter()
        .map(|l| (l.correlation, l))
        .collect();
        let records = vec![
            // Two kernels of launch 1 (a library call), a copy of launch 2, a stray record.
            record(Some(1), "sm90_gemm_a", 1_000, 3_000),
            record(Some(1), "sm90_gemm_b", 3_500, 4_000),
            record(Some(2), "", 5_000, 9_000),
            record(None, "someone_else", 100, 200),
            record(Some(77), "earlier_cycle", 100, 200),
        ];
        let now = Instant::now();
        let r = place(records, launches, (10_000, now));
        assert_eq!(r.untimed, 1, "launch 3 has no record");
        let got: Vec<(&str, u64, u64, u64, [u32; 3])> = r
            .device
            .iter()
            .map(|d| {
                let back = |t: Instant| (now - t).as_nanos() as u64;
                (
                    d.name.as_str(),
                    d.correlation,
                    back(d.start),
                    back(d.end),
                    d.grid,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("sm90_gemm_a", 1, 9_000, 7_000, [7, 1, 1]),
                ("sm90_gemm_b", 1, 6_500, 6_000, [7, 1, 1]),
                ("Memcpy HtoD (Host -> Device)", 2, 5_000, 1_000, [2, 1, 1]),
            ]
        );
        assert!(r.device.iter().all(|d| d.device == 1 && d.stream == 9));
        assert_eq!(
            r.device[2].bytes, 64,
            "a copy keeps the launch's byte count"
        );
    }

    /// A record CUPTI could not time (start and end 0, `CUPTI_TIMESTAMP_UNKNOWN`; or an end
    /// of 0) is not drawn at the profile's start: its launch counts as untimed, once, unless
    /// another record of the same call was timed.
    #[test]
    fn records_without_device_times_count_as_untimed() {
        let launches: HashMap<u64, EnqueuedWork> = [
            launch(1, ActivityKind::Kernel, "lost"),
            launch(2, ActivityKind::Kernel, "gemm call"),
        ]
        .into_iter()
        .map(|l| (l.correlation, l))
        .collect();
        let records = vec![
            record(Some(1), "k_untimed", 0, 0),
            record(Some(2), "sm90_gemm_a", 0, 0),
            record(Some(2), "sm90_gemm_b", 1_000, 3_000),
            record(Some(2), "sm90_gemm_c", 4_000, 0),
        ];
        let r = place(records, launches, (10_000, Instant::now()));
        let names: Vec<&str> = r.device.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["sm90_gemm_b"]);
        assert_eq!(
            r.untimed, 1,
            "launch 1, whose only record has no device times"
        );
    }
}
