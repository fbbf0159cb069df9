//! The emulator's CUPTI: activity records of the work it runs (Note [CUPTI through the seam]).
//!
//! The emulator runs a kernel, copy, memset, GEMM or convolution inside the call that
//! enqueues it (Note [Emulated streams]), so while recording is enabled each such call that
//! succeeds leaves one record whose start and end are the host clock around the work, on the
//! clock [`ActivityState::now_ns`] reads (nanoseconds since the emulator was made), tagged
//! with the id the calling thread pushed last. Library calls are named as the emulated
//! library's kernel would be (`emulated_gemm_…`, `emulated_conv_…`), so the profiler shows
//! the device's own name for every record, as CUPTI does. Disabling keeps the records until
//! the next flush; pushes and pops are checked (a pop without a push is CUPTI's
//! `CUPTI_ERROR_QUEUE_EMPTY`). `EMBER_CUDA_EMULATOR_CUPTI=0` makes the API absent for the
//! process, as on a machine without `libcupti`, so the profiler's fallback to events runs
//! end to end too.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::driver::ActivityRecord;
use crate::error::{DeviceError, Result};

/// The activity API version the emulator reports: `CUPTI_API_VERSION` of the CUPTI headers
/// the binding was generated from (130001 for CUDA 13.0; 26 was CUDA 12.8's).
pub const EMULATED_CUPTI_VERSION: u32 = cudarc::cupti::sys::CUPTI_API_VERSION;

/// The variable that makes the emulator's activity API absent for the process (`0`);
/// anything else, or unset, leaves it present.
pub const ENV_EMULATOR_CUPTI: &str = "EMBER_CUDA_EMULATOR_CUPTI";

/// The emulated API's version, or why it is absent (`EMBER_CUDA_EMULATOR_CUPTI=0`).
pub(super) fn version() -> Result<u32> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    let present = *PRESENT.get_or_init(|| !super::config::switched_off(ENV_EMULATOR_CUPTI));
    if present {
        Ok(EMULATED_CUPTI_VERSION)
    } else {
        Err(DeviceError::Unsupported {
            what: format!("CUPTI activity tracing (absent: {ENV_EMULATOR_CUPTI}=0)"),
            driver: "emulator",
        })
    }
}

thread_local! {
    /// The external ids this thread pushed, innermost last.
    static EXTERNAL: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Recording state of one emulator.
#[derive(Debug)]
pub(super) struct ActivityState {
    enabled: AtomicBool,
    records: Mutex<Vec<ActivityRecord>>,
    epoch: Instant,
}

impl Default for ActivityState {
    fn default() -> Self {
        ActivityState {
            enabled: AtomicBool::new(false),
            records: Mutex::new(Vec::new()),
            epoch: Instant::now(),
        }
    }
}

impl ActivityState {
    pub(super) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Nanoseconds since the emulator was made: the records' clock.
    pub(super) fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Run `work`; when recording and it succeeds, record what `describe` says (built only
    /// then) with the host times around it and this thread's innermost pushed id.
    pub(super) fn run<T>(
        &self,
        describe: impl FnOnce() -> ActivityRecord,
        work: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if !self.enabled.load(Ordering::Relaxed) {
            return work();
        }
        let start_ns = self.now_ns();
        let out = work()?;
        let end_ns = self.now_ns();
        let record = ActivityRecord {
            start_ns,
            end_ns,
            external: EXTERNAL.with(|s| s.borrow().last().copied()),
            ..describe()
        };
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
        Ok(out)
    }

    /// Take every record so far.
    pub(super) fn flush(&self) -> Vec<ActivityRecord> {
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Push `id` on this thread's stack.
pub(super) fn push(id: u64) {
    EXTERNAL.with(|s| s.borrow_mut().push(id));
}

/// Pop this thread's last id.
pub(super) fn pop() -> Result<()> {
    match EXTERNAL.with(|s| s.borrow_mut().pop()) {
        Some(_) => Ok(()),
        None => Err(DeviceError::Driver {
            call: "cuptiActivityPopExternalCorrelationId",
            code: "CUPTI_ERROR_QUEUE_EMPTY".into(),
            detail: "no external correlation id was pushed on this thread".into(),
        }),
    }
}
