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

use std::path::PathBuf;
use std::time::Instant;

use ember_device::Device;
use ember_nn::{Error, Module};
use serde::Serialize;

mod checkpoint;
mod data;
mod device;
mod distributed;
pub mod gpt;
mod model;
mod profile;
mod run;
mod setup;
pub mod text;

pub use checkpoint::{Checkpoint, FORMAT, read_checkpoint, read_checkpoint_for};
pub use device::{CudaState, choose_device, resolve_device};
pub use model::{ModelSpec, build_model};
pub use profile::{PROFILE_ACTIVE, PROFILE_SKIP, ProfileSummary};
pub use setup::{format_duration, show};

use data::{Corpus, Data};
use distributed::Distributed;
use profile::RunProfiler;
use run::{Clock, Run};

/// The learning rate of a run that does not give `--lr` (and does not resume).
pub const DEFAULT_LR: f64 = 2e-3;

/// The seed of a run that does not give `--seed` (and does not resume).
pub const DEFAULT_SEED: u64 = 0;

/// Channels of the CNN's first convolution without `--width`.
pub const DEFAULT_WIDTH: usize = 16;

/// The GPT's blocks without `--n-layer`.
pub const DEFAULT_N_LAYER: usize = 2;

/// The GPT's attention heads without `--n-head`.
pub const DEFAULT_N_HEAD: usize = 4;

/// The GPT's width without `--d-model`.
pub const DEFAULT_D_MODEL: usize = 64;

/// The GPT's context without `--block-size`.
pub const DEFAULT_BLOCK_SIZE: usize = 64;

/// The GPT's optimizer steps per epoch without `--steps-per-epoch`.
pub const DEFAULT_STEPS_PER_EPOCH: usize = 50;

/// Which model `ember train` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// 64 → 128 → ReLU → 10.
    Mlp,
    /// Two 3×3 convolutions (`--width` and twice as many channels) with ReLU and 2×2 max
    /// pooling, then a linear layer.
    Cnn,
    /// A character-level decoder-only transformer on the shipped text (Note [The GPT] in
    /// [`gpt`]).
    Gpt,
}

impl ModelKind {
    /// `mlp` or `cnn`, as the command line spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Gpt => "gpt",
        }
    }

    /// Epochs of a run that does not give `--epochs`.
    pub fn default_epochs(self) -> usize {
        match self {
            ModelKind::Gpt => 10,
            _ => 30,
        }
    }

    /// Samples (digits) or windows (text) per step of a run that does not give
    /// `--batch-size`.
    pub fn default_batch_size(self) -> usize {
        match self {
            ModelKind::Gpt => 32,
            _ => 64,
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
    /// Channels of the CNN's first convolution (the second has twice as many):
    /// [`DEFAULT_WIDTH`] when `None`; when resuming, the checkpoint's. The MLP ignores it.
    pub width: Option<usize>,
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
    /// The GPT's optimizer steps per epoch (each on `batch_size` random windows):
    /// [`DEFAULT_STEPS_PER_EPOCH`] when `None`.
    pub steps_per_epoch: Option<usize>,
    /// The GPT's sizes; `None`: the default, or the checkpoint's when resuming.
    pub gpt: GptOptions,
}

/// The sizes `--model gpt` takes: each `None` is the default (`DEFAULT_N_LAYER`, ...) or,
/// when resuming, the checkpoint's (another value is an error).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GptOptions {
    /// `--n-layer`: transformer blocks.
    pub n_layer: Option<usize>,
    /// `--n-head`: attention heads.
    pub n_head: Option<usize>,
    /// `--d-model`: width of the residual stream.
    pub d_model: Option<usize>,
    /// `--block-size`: characters of context.
    pub block_size: Option<usize>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            device: DeviceChoice::Auto,
            epochs: 30,
            batch_size: 64,
            lr: None,
            model: ModelKind::Mlp,
            width: None,
            seed: None,
            val_fraction: 0.2,
            save: None,
            resume: None,
            num_workers: 0,
            amp: None,
            profile: None,
            steps_per_epoch: None,
            gpt: GptOptions::default(),
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
    /// Share of validation samples classified correctly, 0–1 (for the GPT: of validation
    /// positions whose most likely next character is the right one).
    pub val_accuracy: f64,
    /// Mean cross-entropy over the validation samples (for the GPT: over every position of
    /// the validation windows, in nats per character).
    pub val_loss: f64,
    /// `exp(val_loss)`, for the GPT alone (null for the others).
    pub val_perplexity: Option<f64>,
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
    /// The cnn's width (channels of its first convolution); `None` for the MLP.
    pub width: Option<usize>,
    /// The GPT's hyper-parameters, for the GPT alone (null for the others).
    pub gpt: Option<gpt::GptConfig>,
    /// Epochs done in all (including those before a resume).
    pub epochs: usize,
    /// Epochs this run did.
    pub epochs_run: usize,
    /// The last epoch's mean training loss.
    pub final_loss: f64,
    /// The last epoch's validation accuracy, 0–1.
    pub val_accuracy: f64,
    /// The last epoch's validation loss.
    pub val_loss: f64,
    /// The last epoch's validation perplexity, for the GPT alone.
    pub val_perplexity: Option<f64>,
    /// Training samples per second over this run's epochs.
    pub samples_per_sec: f64,
    /// The caching allocator's peak `memory_allocated` on the device during this run.
    pub peak_memory_bytes: u64,
    /// Wall time of this run's training and validation.
    pub seconds: f64,
    /// Samples in the training split (for the GPT: characters).
    pub train_samples: usize,
    /// Samples in the validation split (for the GPT: characters).
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

/// The checks that need no device and no data, made before anything is printed or
/// trained: the options' values (`--epochs`, `--batch-size`, `--lr`), and the files
/// (`--resume` readable, `--save` writable), each error naming its option.
pub fn preflight(cfg: &TrainConfig) -> Result<(), Error> {
    setup::check_options(cfg)?;
    setup::check_paths(cfg)
}

/// Trains as `cfg` says and returns the summary: the checks ([`preflight`] first), the
/// setup, the epochs (each validated and checkpointed), and the report.
pub fn train(cfg: &TrainConfig, progress: &mut dyn Progress) -> Result<TrainSummary, Error> {
    preflight(cfg)?;
    let (device, device_reason) = resolve_device(cfg.device)?;
    let (dist, device, device_reason) = Distributed::from_env(device, device_reason)?;
    let (world, rank) = dist
        .as_ref()
        .map_or((1, 0), |d| (d.group.world_size(), d.rank));
    setup::check_world(cfg, world)?;
    let (ckpt, fresh) = checkpoint::resume_from(cfg.resume.as_deref(), cfg.save.as_deref())?;
    let mut notes: Vec<String> = fresh.into_iter().collect();
    notes.iter().for_each(|n| progress.note(n));
    let seed = setup::seed(cfg, ckpt.as_ref())?;
    if let Some(c) = &ckpt {
        setup::check_resume(cfg, c)?;
    }
    ember_tensor::random::manual_seed(seed);
    let corpus = match cfg.model {
        ModelKind::Gpt => Some(Corpus::load()?),
        _ => None,
    };
    let spec = setup::model_spec(cfg, ckpt.as_ref(), corpus.as_ref().map(|c| &c.vocab))?;
    let ranks = dist.as_ref().map(|d| (world, d.rank));
    let data = Data::load(cfg, (&spec, corpus.as_ref()), seed, device, ranks)?;
    let vocab = corpus.map(|c| c.vocab);
    let mut run = Run::build(cfg, spec, device, dist.as_ref())?;
    if let Some(c) = &ckpt {
        run.resume(c, cfg, progress, &mut notes)?;
    }
    let mut profiler = match &cfg.profile {
        Some(dir) => Some(RunProfiler::start(dir, device)?),
        None => None,
    };
    ember_memory::reset_peak_memory_stats(device)?;
    let mut clock = Clock {
        started: Instant::now(),
        seen: 0,
    };
    let (mut history, mut skipped_steps) = (Vec::new(), 0);
    for epoch in run.start_epoch..cfg.epochs {
        let (loss, skipped) =
            run.train_epoch(epoch, (cfg, &data), &mut clock, progress, profiler.as_mut())?;
        skipped_steps += skipped;
        let stats = run.stats(epoch, loss, &data)?;
        progress.epoch_end(&stats);
        history.push(stats);
        run.save(cfg, (seed, rank), epoch + 1, vocab.as_ref())?;
    }
    let seconds = clock.started.elapsed().as_secs_f64();
    if let Some(d) = dist {
        // The ranks leave together: MPI must be finalized before the process exits.
        run.leave_group();
        drop(d);
        ember_parallel::destroy_process_group()?;
    }
    let report = Report {
        device: (device, device_reason),
        seed,
        data: &data,
        history,
        skipped_steps,
        notes,
        seconds,
        samples: clock.seen,
    };
    report.summary(cfg, &run, profiler.map(RunProfiler::finish).transpose()?)
}

/// What a finished run hands to its summary.
struct Report<'a> {
    device: (Device, String),
    seed: u64,
    data: &'a Data,
    history: Vec<EpochStats>,
    skipped_steps: usize,
    notes: Vec<String>,
    seconds: f64,
    samples: usize,
}

impl Report<'_> {
    /// The summary `ember train --json` prints.
    fn summary(
        self,
        cfg: &TrainConfig,
        run: &Run,
        profile: Option<ProfileSummary>,
    ) -> Result<TrainSummary, Error> {
        let last = self.history.last().cloned().unwrap_or(EpochStats {
            epoch: run.start_epoch,
            train_loss: f64::NAN,
            val_accuracy: f64::NAN,
            val_loss: f64::NAN,
            val_perplexity: None,
        });
        let (device, device_reason) = self.device;
        Ok(TrainSummary {
            device: device.to_string(),
            device_reason,
            model: cfg.model,
            width: match run.spec {
                ModelSpec::Cnn { width } => Some(width),
                _ => None,
            },
            gpt: run.spec.gpt(),
            epochs: cfg.epochs,
            epochs_run: self.history.len(),
            final_loss: last.train_loss,
            val_accuracy: last.val_accuracy,
            val_loss: last.val_loss,
            val_perplexity: last.val_perplexity,
            samples_per_sec: self.samples as f64 / self.seconds.max(1e-9),
            peak_memory_bytes: ember_memory::max_memory_allocated(device)?,
            seconds: self.seconds,
            train_samples: self.data.train_samples,
            val_samples: self.data.val_samples,
            parameters: run.model.num_parameters(),
            history: self.history,
            checkpoint: cfg.save.as_ref().map(|p| p.display().to_string()),
            seed: self.seed,
            lr: run.lr(),
            amp: cfg.amp,
            loss_scale: if run.scaler.is_enabled() {
                Some(run.scaler.get_scale()?)
            } else {
                None
            },
            skipped_steps: self.skipped_steps,
            notes: self.notes,
            profile,
            world_size: run.world,
        })
    }
}
