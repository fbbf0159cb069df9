//! `ember train --profile DIR`: the profiler over a few steps (Note [Profiling a run]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ember_device::Device;
use ember_nn::Error;
use serde::Serialize;

/// What `ember train --profile DIR` recorded (Note [Profiling a run]).
#[derive(Clone, Debug, Serialize)]
pub struct ProfileSummary {
    /// The directory.
    pub dir: String,
    /// The steps recorded (0-based optimizer steps of this run).
    pub steps: Vec<u64>,
    /// The Chrome/TensorBoard trace files written (`*.pt.trace.json`).
    pub traces: Vec<String>,
    /// The memory timeline page.
    pub memory_timeline: Option<String>,
    /// The column the table is sorted by (`cuda_time_total` on CUDA, else
    /// `cpu_time_total`).
    pub sort_by: String,
    /// The top-10 table of `key_averages()`.
    pub table: String,
}

/// Note [Profiling a run]: `--profile DIR` runs `ember-profiler` over the first steps with
/// `schedule(skip_first = PROFILE_SKIP, wait = 0, warmup = 1, active = PROFILE_ACTIVE)`:
/// the first steps are left alone (allocator and caches warming up), one warm-up step runs
/// the hooks, and [`PROFILE_ACTIVE`] steps are recorded with `record_shapes` and
/// `profile_memory` (and the CUDA activity on a CUDA device). The cycle's trace goes to
/// `DIR/{host}_{pid}.{ns}.pt.trace.json` (TensorBoard's layout), the memory timeline to
/// `DIR/memory_timeline.html`, and the top-10 table sorted by device time (CPU time on the
/// CPU) into the summary. A run with fewer steps records what it has.
pub const PROFILE_SKIP: u64 = 3;
/// Steps `--profile` records.
pub const PROFILE_ACTIVE: u64 = 3;

/// The profiler of `--profile`, its trace files, and where they go.
pub(super) struct RunProfiler {
    dir: PathBuf,
    device: Device,
    pub(super) profiler: ember_profiler::Profiler,
    traces: Arc<Mutex<Vec<String>>>,
}

impl RunProfiler {
    pub(super) fn start(dir: &Path, device: Device) -> Result<RunProfiler, Error> {
        use ember_profiler::{ProfileOptions, ProfilerActivity, schedule};
        let traces: Arc<Mutex<Vec<String>>> = Default::default();
        let (seen, out) = (traces.clone(), dir.to_path_buf());
        let mut activities = vec![ProfilerActivity::Cpu];
        if device.is_cuda() {
            activities.push(ProfilerActivity::Cuda);
        }
        let profiler = ember_profiler::profile(
            ProfileOptions::new()
                .activities(activities)
                .record_shapes(true)
                .profile_memory(true)
                .schedule(
                    schedule()
                        .skip_first(PROFILE_SKIP)
                        .warmup(1)
                        .active(PROFILE_ACTIVE)
                        .repeat(1),
                )
                .on_trace_ready(move |p| {
                    let path = ember_profiler::write_tensorboard_trace(p, &out, None)?;
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(path.display().to_string());
                    Ok(())
                }),
        )?;
        Ok(RunProfiler {
            dir: dir.to_path_buf(),
            device,
            profiler,
            traces,
        })
    }

    pub(super) fn finish(mut self) -> Result<ProfileSummary, Error> {
        let steps = recorded_steps(self.profiler.step_num());
        self.profiler.stop()?;
        let profile = self.profiler.profile().ok();
        let memory_timeline = match profile {
            Some(_) => {
                let path = self.dir.join("memory_timeline.html");
                self.profiler.export_memory_timeline(&path)?;
                Some(path.display().to_string())
            }
            None => None,
        };
        let sort_by = if self.device.is_cuda() {
            "cuda_time_total"
        } else {
            "cpu_time_total"
        };
        let table = match profile {
            Some(_) => self.profiler.key_averages()?.table(sort_by, 10)?,
            None => String::new(),
        };
        let traces = self
            .traces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ok(ProfileSummary {
            dir: self.dir.display().to_string(),
            steps,
            traces,
            memory_timeline,
            sort_by: sort_by.into(),
            table,
        })
    }
}

/// The steps `--profile` records in a run of `taken` steps (0-based).
fn recorded_steps(taken: u64) -> Vec<u64> {
    (PROFILE_SKIP + 1..=PROFILE_SKIP + PROFILE_ACTIVE)
        .filter(|&i| i < taken)
        .collect()
}
