//! `ember train`: Ember's main job. Trains a small model on the 8×8 handwritten digits that
//! ship with the repository, end to end: data loading, the training loop with
//! `zero_grad`/`backward`/`step`, validation under `no_grad`, a progress bar, peak memory,
//! and checkpoints that resume exactly where they stopped.
//!
//! Note [Resumable training]: everything the next step depends on is in the checkpoint —
//! the model's `state_dict`, the optimizer's (moments and step counts), the epoch, and the
//! random generators' states — and the data order is a function of `(seed, epoch)`. So a run
//! stopped after epoch k and resumed gives the same numbers as one that never stopped. The
//! train/validation split is a function of `(seed, val_fraction)`, both in the checkpoint: a
//! resume takes them from there (a `--seed` that differs is an error, since a new split would
//! validate on samples the checkpoint was trained on). `--lr` with `--resume` overrides the
//! checkpoint's learning rate, said on stderr and in the summary's `notes`. A loss that
//! becomes NaN or infinite stops the run with an error (Note [Train checkpoint] says what a
//! checkpoint holds and how it is checked).
//!
//! Note [Mixed-precision training]: `--amp bf16|f16` runs each batch's forward and loss
//! under `autocast(device, dtype)` (validation too), with f32 master weights and Adam's
//! moments in f32, as PyTorch's recipe: f16 with a `GradScaler` (loss scaling; a step whose
//! gradients hold inf/NaN is skipped and the scale backs off), bf16 without one (its range is
//! f32's, so nothing underflows that f32 would keep). Without `--amp` the same loop runs with
//! a disabled scaler, which is a pass-through. The scaler's state (PyTorch's `state_dict`
//! keys) is in the checkpoint, so a resumed f16 run continues with the scale and growth
//! tracker it stopped with; a resume with another `--amp` than the checkpoint's is an error.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ember_amp::{GradScaler, GradScalerOptions};
use ember_autograd::Tensor;
use ember_device::{Device, cuda};
use ember_nn::data::{DataLoader, Dataset, TensorDataset, digits};
use ember_nn::layers::{Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, ReLU, Sequential};
use ember_nn::loss::{CrossEntropyLoss, Loss};
use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Error, Module, NnError};
use ember_parallel::{DdpOptions, DistributedDataParallel, DistributedSampler};
use serde::Serialize;

mod checkpoint;
mod distributed;

pub use checkpoint::{Checkpoint, FORMAT, read_checkpoint};
use distributed::Distributed;

/// The learning rate of a run that does not give `--lr` (and does not resume).
pub const DEFAULT_LR: f64 = 2e-3;

/// The seed of a run that does not give `--seed` (and does not resume).
pub const DEFAULT_SEED: u64 = 0;

/// Which model `ember train` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// 64 → 128 → ReLU → 10.
    Mlp,
    /// Two 3×3 convolutions with ReLU and 2×2 max pooling, then a linear layer.
    Cnn,
}

impl ModelKind {
    /// `mlp` or `cnn`, as the command line spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
        }
    }
}

/// The lower precision of `--amp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AmpDtype {
    /// bfloat16, without loss scaling.
    Bf16,
    /// float16, with a `GradScaler`.
    F16,
}

impl AmpDtype {
    /// `bf16` or `f16`, as the command line spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AmpDtype::Bf16 => "bf16",
            AmpDtype::F16 => "f16",
        }
    }

    /// The dtype autocast runs products in.
    pub fn dtype(self) -> ember_tensor::DType {
        match self {
            AmpDtype::Bf16 => ember_tensor::DType::Bf16,
            AmpDtype::F16 => ember_tensor::DType::F16,
        }
    }
}

/// What `--device` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// CUDA if available, else the CPU.
    Auto,
    /// This device.
    Exact(Device),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            other => other
                .parse::<Device>()
                .map(DeviceChoice::Exact)
                .map_err(|e| format!("expected auto, cpu, cuda or cuda:N, found {other:?} ({e})")),
        }
    }
}

/// The settings of one training run.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Where to train.
    pub device: DeviceChoice,
    /// Passes over the training set (in all, counting those a resumed checkpoint did).
    pub epochs: usize,
    /// Samples per optimizer step.
    pub batch_size: usize,
    /// Adam's learning rate: [`DEFAULT_LR`] when `None`; when resuming, `None` keeps the
    /// checkpoint's and `Some` overrides it (a note says so).
    pub lr: Option<f64>,
    /// The model.
    pub model: ModelKind,
    /// Seeds initialisation, the split and the data order: [`DEFAULT_SEED`] when `None`;
    /// when resuming, the checkpoint's, and `Some` other seed is an error.
    pub seed: Option<u64>,
    /// The share of the digits held out for validation (`Digits::split`).
    pub val_fraction: f64,
    /// Write a checkpoint here after every epoch (atomically).
    pub save: Option<PathBuf>,
    /// Start from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Worker threads preparing batches.
    pub num_workers: usize,
    /// Train under autocast in this dtype (Note [Mixed-precision training]); `None`: f32.
    pub amp: Option<AmpDtype>,
    /// Profile a few steps into this directory (Note [Profiling a run]).
    pub profile: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            device: DeviceChoice::Auto,
            epochs: 30,
            batch_size: 64,
            lr: None,
            model: ModelKind::Mlp,
            seed: None,
            val_fraction: 0.2,
            save: None,
            resume: None,
            num_workers: 0,
            amp: None,
            profile: None,
        }
    }
}

/// One epoch's numbers.
#[derive(Clone, Debug, Serialize)]
pub struct EpochStats {
    /// 1-based epoch.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f64,
    /// Share of validation samples classified correctly, 0–1.
    pub val_accuracy: f64,
}

/// What `ember train --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct TrainSummary {
    /// The device trained on (`cpu`, `cuda:0`).
    pub device: String,
    /// Why that device (for `--device auto`, whether CUDA was available and why not).
    pub device_reason: String,
    /// The model.
    pub model: ModelKind,
    /// Epochs done in all (including those before a resume).
    pub epochs: usize,
    /// Epochs this run did.
    pub epochs_run: usize,
    /// The last epoch's mean training loss.
    pub final_loss: f64,
    /// The last epoch's validation accuracy, 0–1.
    pub val_accuracy: f64,
    /// Training samples per second over this run's epochs.
    pub samples_per_sec: f64,
    /// The caching allocator's peak `memory_allocated` on the device during this run.
    pub peak_memory_bytes: u64,
    /// Wall time of this run's training and validation.
    pub seconds: f64,
    /// Samples in the training split.
    pub train_samples: usize,
    /// Samples in the validation split.
    pub val_samples: usize,
    /// Trainable parameters.
    pub parameters: usize,
    /// Per-epoch numbers of this run.
    pub history: Vec<EpochStats>,
    /// Where the checkpoint was written, if anywhere.
    pub checkpoint: Option<String>,
    /// The seed of the split and the data order (the checkpoint's, when resuming).
    pub seed: u64,
    /// The learning rate trained with (after any override).
    pub lr: f64,
    /// The autocast dtype (`bf16`, `f16`), or `None` for f32 training.
    pub amp: Option<AmpDtype>,
    /// The `GradScaler`'s scale at the end (f16 only).
    pub loss_scale: Option<f64>,
    /// Optimizer steps the `GradScaler` skipped in this run because a gradient was inf or
    /// NaN (0 without f16).
    pub skipped_steps: usize,
    /// What the run decided that the user should know (an `--lr` overriding the
    /// checkpoint's); the command line prints each on stderr.
    pub notes: Vec<String>,
    /// What `--profile` wrote, if given.
    pub profile: Option<ProfileSummary>,
    /// Processes that trained together (1 alone; N under `ember launch --nproc-per-node N`
    /// or `mpirun -n N`, Note [Distributed training]).
    pub world_size: usize,
}

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
struct RunProfiler {
    dir: PathBuf,
    device: Device,
    profiler: ember_profiler::Profiler,
    traces: Arc<Mutex<Vec<String>>>,
}

impl RunProfiler {
    fn start(dir: &Path, device: Device) -> Result<RunProfiler, Error> {
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
                .schedule(schedule(PROFILE_SKIP, 0, 1, PROFILE_ACTIVE, 1)?)
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

    fn finish(mut self) -> Result<ProfileSummary, Error> {
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
/// Picks the device for a choice, with the reason in words.
pub fn resolve_device(choice: DeviceChoice) -> Result<(Device, String), Error> {
    match choice {
        DeviceChoice::Auto => {
            if cuda::is_available() {
                let name = cuda::get_device_name(0).unwrap_or_else(|_| "unknown".into());
                Ok((
                    Device::Cuda(0),
                    format!("--device auto: CUDA is available ({name})"),
                ))
            } else {
                let why = cuda::unavailable_reason().unwrap_or_else(|| "unknown".into());
                Ok((
                    Device::Cpu,
                    format!("--device auto: CUDA is not available ({why}), using the CPU"),
                ))
            }
        }
        DeviceChoice::Exact(Device::Cpu) => Ok((Device::Cpu, "--device cpu".into())),
        DeviceChoice::Exact(Device::Cuda(i)) => {
            if !cuda::is_available() {
                let why = cuda::unavailable_reason().unwrap_or_else(|| "unknown".into());
                return Err(NnError::invalid(
                    "ember train",
                    format!("--device cuda:{i} was asked for, but CUDA is not available: {why}"),
                )
                .into());
            }
            let n = cuda::device_count();
            if i >= n {
                return Err(NnError::invalid(
                    "ember train",
                    format!("--device cuda:{i} was asked for, but there are {n} CUDA device(s)"),
                )
                .into());
            }
            let name = cuda::get_device_name(i).unwrap_or_else(|_| "unknown".into());
            Ok((Device::Cuda(i), format!("--device cuda:{i} ({name})")))
        }
    }
}

/// Builds the model on `device` (initialised from the seeded CPU generator, then moved, as
/// `model = Net().to(device)` does in PyTorch).
pub fn build_model(kind: ModelKind, device: Device) -> Result<Sequential, Error> {
    let m = match kind {
        ModelKind::Mlp => Sequential::new()
            .add(Linear::new(64, 128, ())?)
            .add(ReLU::new())
            .add(Linear::new(128, 10, ())?),
        ModelKind::Cnn => {
            let same = Conv2dConfig {
                padding: (1, 1).into(),
                ..Default::default()
            };
            Sequential::new()
                .add(Conv2d::with_config(1, 16, 3, same, ())?)
                .add(ReLU::new())
                .add(MaxPool2d::new(2))
                .add(Conv2d::with_config(16, 32, 3, same, ())?)
                .add(ReLU::new())
                .add(MaxPool2d::new(2))
                .add(Flatten::new())
                .add(Linear::new(32 * 2 * 2, 10, ())?)
        }
    };
    m.to(device)?;
    Ok(m)
}

/// What a run reports as it goes (the command line draws a progress bar from it).
pub trait Progress {
    /// A new epoch starts, with this many batches.
    fn epoch_start(&mut self, epoch: usize, epochs: usize, batches: usize);
    /// A batch finished, with its loss and the throughput so far.
    fn batch(&mut self, loss: f64, samples_per_sec: f64);
    /// The epoch finished.
    fn epoch_end(&mut self, stats: &EpochStats);
    /// Something the user should know before the run goes on (an override); also in
    /// [`TrainSummary::notes`].
    fn note(&mut self, _message: &str) {}
}

/// Reports nothing.
#[derive(Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn epoch_start(&mut self, _: usize, _: usize, _: usize) {}
    fn batch(&mut self, _: f64, _: f64) {}
    fn epoch_end(&mut self, _: &EpochStats) {}
}

/// Trains as `cfg` says and returns the summary.
pub fn train(cfg: &TrainConfig, progress: &mut dyn Progress) -> Result<TrainSummary, Error> {
    if cfg.batch_size == 0 || cfg.epochs == 0 {
        return Err(NnError::invalid(
            "ember train",
            format!(
                "expected --epochs and --batch-size of at least 1, found {} and {}",
                cfg.epochs, cfg.batch_size
            ),
        )
        .into());
    }
    if let Some(lr) = cfg.lr
        && !(lr > 0.0 && lr.is_finite())
    {
        return Err(NnError::invalid(
            "ember train",
            format!("expected a positive --lr, found {lr}"),
        )
        .into());
    }
    let (device, device_reason) = resolve_device(cfg.device)?;
    let (dist, device, device_reason) = Distributed::from_env(device, device_reason)?;
    let world = dist.as_ref().map_or(1, |d| d.group.world_size());
    if !cfg.batch_size.is_multiple_of(world) {
        return Err(NnError::invalid(
            "ember train",
            format!(
                "--batch-size {} is the global batch and must divide evenly over the {world} ranks",
                cfg.batch_size
            ),
        )
        .into());
    }
    let (ckpt, fresh) = checkpoint::resume_from(cfg.resume.as_deref(), cfg.save.as_deref())?;
    let mut notes: Vec<String> = fresh.into_iter().collect();
    notes.iter().for_each(|n| progress.note(n));
    let seed = match (&ckpt, cfg.seed) {
        (Some(c), Some(s)) if s != c.seed => {
            return Err(NnError::invalid(
                "ember train",
                format!(
                    "--seed {s} conflicts with the seed {} of the checkpoint {}: the train/validation split and the data order come from the checkpoint's seed (a new split would validate on samples it was trained on); leave --seed out, or give --seed {}",
                    c.seed,
                    resume_path(cfg),
                    c.seed
                ),
            )
            .into());
        }
        (Some(c), _) => c.seed,
        (None, s) => s.unwrap_or(DEFAULT_SEED),
    };
    if let Some(c) = &ckpt {
        if c.model != cfg.model {
            return Err(NnError::invalid(
                "ember train",
                format!(
                    "{} holds a {} model, but --model {} was asked for",
                    resume_path(cfg),
                    c.model.as_str(),
                    cfg.model.as_str()
                ),
            )
            .into());
        }
        if c.val_fraction != cfg.val_fraction {
            return Err(NnError::invalid(
                "ember train",
                format!(
                    "{} was trained with a validation share of {}, but {} was asked for",
                    resume_path(cfg),
                    c.val_fraction,
                    cfg.val_fraction
                ),
            )
            .into());
        }
        if c.amp != cfg.amp {
            let name = |a: Option<AmpDtype>| a.map_or("f32 (no --amp)", AmpDtype::as_str);
            return Err(NnError::invalid(
                "ember train",
                format!(
                    "{} was trained in {}, but {} was asked for; resume with the checkpoint's precision",
                    resume_path(cfg),
                    name(c.amp),
                    name(cfg.amp)
                ),
            )
            .into());
        }
        if c.epoch >= cfg.epochs {
            return Err(NnError::invalid(
                "ember train",
                format!(
                    "{} already holds {} epoch(s); ask for more with --epochs (found {})",
                    resume_path(cfg),
                    c.epoch,
                    cfg.epochs
                ),
            )
            .into());
        }
    }
    ember_tensor::random::manual_seed(seed);

    // Data: the shipped digits, pixels scaled to [0, 1], a seeded split.
    let (train_part, val_part) = digits::load()?.split(cfg.val_fraction, seed)?;
    let shape = |x: Tensor| -> Result<Tensor, Error> {
        let x = x.div(16.0)?;
        Ok(match cfg.model {
            ModelKind::Mlp => x,
            ModelKind::Cnn => x.reshape([x.dims()[0], 1, 8, 8])?,
        })
    };
    let (train_samples, val_samples) = (train_part.len(), val_part.len());
    let train_set: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![
        shape(train_part.images)?,
        train_part.labels,
    ])?);
    let (val_x, val_y) = (
        shape(val_part.images)?.to(device)?,
        val_part.labels.to(device)?,
    );
    // Alone: the loader shuffles. Distributed: each rank takes its shard of every epoch's
    // order (the ranks' orders differ from the single-process order) with a per-rank batch.
    let sampler = match &dist {
        Some(d) => Some(Arc::new(
            DistributedSampler::with_replicas(train_set.as_ref(), world, d.rank)?.seed(seed),
        )),
        None => None,
    };
    let loader = DataLoader::new(train_set)
        .batch_size(cfg.batch_size / world)
        .seed(seed)
        .num_workers(cfg.num_workers)
        .pin_memory(device.is_cuda());
    let loader = match &sampler {
        Some(s) => loader.sampler(s.clone()),
        None => loader.shuffle(true),
    };

    let model = Arc::new(build_model(cfg.model, device)?);
    let ddp = match &dist {
        Some(d) => Some(DistributedDataParallel::new(
            model.clone(),
            &d.group,
            DdpOptions::default(),
        )?),
        None => None,
    };
    let net: &dyn Module = match &ddp {
        Some(ddp) => ddp,
        None => model.as_ref(),
    };
    let mut opt = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: cfg.lr.unwrap_or(DEFAULT_LR),
            ..Default::default()
        },
    )?;
    // f16 scales the loss; f32 and bf16 get a disabled scaler, a pass-through.
    let mut scaler = GradScaler::with_options(
        device,
        GradScalerOptions {
            enabled: cfg.amp == Some(AmpDtype::F16),
            ..Default::default()
        },
    )?;
    let mut start_epoch = 0;
    if let Some(c) = &ckpt {
        c.apply(model.as_ref(), &mut opt, &mut scaler)?;
        start_epoch = c.epoch;
        if let Some(lr) = cfg.lr {
            let old = opt.param_groups().first().map_or(f64::NAN, |g| g.lr);
            for g in opt.param_groups_mut() {
                g.lr = lr;
            }
            let note = format!(
                "--lr {lr} overrides the learning rate {old} of the checkpoint {}",
                resume_path(cfg)
            );
            progress.note(&note);
            notes.push(note);
        }
    }
    let lr = opt.param_groups().first().map_or(f64::NAN, |g| g.lr);

    let loss_fn = CrossEntropyLoss::new();
    let mut profiler = match &cfg.profile {
        Some(dir) => Some(RunProfiler::start(dir, device)?),
        None => None,
    };
    ember_memory::reset_peak_memory_stats(device)?;
    let started = Instant::now();
    let mut seen = 0usize;
    let mut skipped_steps = 0usize;
    let mut history = Vec::new();
    for epoch in start_epoch..cfg.epochs {
        model.train(true);
        progress.epoch_start(epoch + 1, cfg.epochs, loader.len());
        if let Some(s) = &sampler {
            s.set_epoch(epoch as u64);
        }
        let (mut total, mut batches) = (0.0, 0usize);
        for batch in loader.epoch(epoch as u64)? {
            let batch = batch?;
            let (bx, by) = (
                batch[0].to_non_blocking(device)?,
                batch[1].to_non_blocking(device)?,
            );
            opt.zero_grad(true)?;
            let loss = {
                let _autocast = autocast_region(cfg.amp, device)?;
                loss_fn.forward(&net.forward(&bx)?, &by)?
            };
            scaler.scale(&loss)?.backward()?;
            if !scaler.step(&mut opt)? {
                skipped_steps += 1;
            }
            scaler.update()?;
            let l = loss.item::<f32>()? as f64;
            if !l.is_finite() {
                return Err(NnError::invalid(
                    "ember train",
                    format!(
                        "the training loss became {l} at epoch {}, batch {} of {}; stopping (the learning rate {lr} may be too high){}",
                        epoch + 1,
                        batches + 1,
                        loader.len(),
                        match &cfg.save {
                            Some(p) if epoch > start_epoch => format!(
                                "; {} holds the state after epoch {epoch}",
                                p.display()
                            ),
                            _ => String::new(),
                        }
                    ),
                )
                .into());
            }
            total += l;
            batches += 1;
            seen += bx.dims()[0] * world;
            progress.batch(l, seen as f64 / started.elapsed().as_secs_f64().max(1e-9));
            if let Some(p) = &mut profiler {
                p.profiler.step()?;
            }
        }
        let stats = EpochStats {
            epoch: epoch + 1,
            train_loss: total / batches.max(1) as f64,
            val_accuracy: {
                let _autocast = autocast_region(cfg.amp, device)?;
                accuracy(&model, &val_x, &val_y)?
            },
        };
        progress.epoch_end(&stats);
        history.push(stats);
        // Every rank holds the same weights; rank 0 writes the checkpoint.
        if let Some(path) = cfg
            .save
            .as_ref()
            .filter(|_| dist.as_ref().is_none_or(|d| d.rank == 0))
        {
            checkpoint::save_checkpoint(
                path,
                cfg.model,
                (seed, cfg.val_fraction),
                epoch + 1,
                (model.as_ref(), &opt, cfg.amp, &scaler),
            )?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(d) = dist {
        // The ranks leave together: MPI must be finalized before the process exits.
        drop(ddp);
        drop(d);
        ember_parallel::destroy_process_group()?;
    }
    let profile = profiler.map(RunProfiler::finish).transpose()?;
    let last = history.last().cloned().unwrap_or(EpochStats {
        epoch: start_epoch,
        train_loss: f64::NAN,
        val_accuracy: f64::NAN,
    });
    Ok(TrainSummary {
        device: device.to_string(),
        device_reason,
        model: cfg.model,
        epochs: cfg.epochs,
        epochs_run: history.len(),
        final_loss: last.train_loss,
        val_accuracy: last.val_accuracy,
        samples_per_sec: seen as f64 / seconds.max(1e-9),
        peak_memory_bytes: ember_memory::max_memory_allocated(device)?,
        seconds,
        train_samples,
        val_samples,
        parameters: model.num_parameters(),
        history,
        checkpoint: cfg.save.as_ref().map(|p| p.display().to_string()),
        seed,
        lr,
        amp: cfg.amp,
        loss_scale: if scaler.is_enabled() {
            Some(scaler.get_scale()?)
        } else {
            None
        },
        skipped_steps,
        notes,
        profile,
        world_size: world,
    })
}

/// The autocast region of `--amp` on `device` (none for f32).
fn autocast_region(
    amp: Option<AmpDtype>,
    device: Device,
) -> Result<Option<ember_amp::AutocastGuard>, Error> {
    amp.map(|a| ember_amp::autocast(device, a.dtype()))
        .transpose()
}

/// Share of `x`'s rows whose arg-max class is `y`, without recording history.
fn accuracy(model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<f64, Error> {
    if y.numel() == 0 {
        return Ok(f64::NAN);
    }
    let _g = ember_autograd::no_grad();
    model.eval();
    let pred = model.forward(x)?.argmax(1)?;
    let correct = pred
        .eq(y)?
        .to_dtype(ember_tensor::DType::F64)?
        .sum_all()?
        .item::<f64>()?;
    model.train(true);
    Ok(correct / y.numel() as f64)
}

/// The `--resume` path, for messages.
fn resume_path(cfg: &TrainConfig) -> String {
    cfg.resume
        .as_deref()
        .map_or_else(String::new, |p| p.display().to_string())
}
