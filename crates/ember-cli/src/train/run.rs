//! What trains: the model (wrapped in `DistributedDataParallel` on several ranks), Adam,
//! the `GradScaler`, and one epoch of the loop (Note [Mixed-precision training]).

use std::sync::Arc;
use std::time::Instant;

use ember_amp::GradScaler;
use ember_autograd::Tensor;
use ember_device::Device;
use ember_nn::loss::{CrossEntropyLoss, Loss};
use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Error, Module};
use ember_parallel::{DdpOptions, DistributedDataParallel};

use super::checkpoint::{self, Checkpoint};
use super::data::Data;
use super::distributed::Distributed;
use super::profile::RunProfiler;
use super::setup::{invalid, resume_path, show};
use super::text::Vocab;
use super::{AmpDtype, DEFAULT_LR, EpochStats, ModelSpec, Progress, TrainConfig, build_model};

/// The model and the state that steps it.
pub(super) struct Run {
    pub(super) model: Arc<dyn Module>,
    ddp: Option<DistributedDataParallel<Arc<dyn Module>>>,
    pub(super) opt: Adam,
    pub(super) scaler: GradScaler,
    loss_fn: CrossEntropyLoss,
    device: Device,
    amp: Option<AmpDtype>,
    /// The model and its sizes.
    pub(super) spec: ModelSpec,
    /// Ranks training together (1 alone).
    pub(super) world: usize,
    /// The first epoch this run trains (0, or the checkpoint's when resuming).
    pub(super) start_epoch: usize,
}

/// Samples seen and when the run started, for the throughput.
pub(super) struct Clock {
    pub(super) started: Instant,
    pub(super) seen: usize,
}

impl Run {
    /// The model of `cfg` on `device` (wrapped for the ranks of `dist`), Adam at `--lr`
    /// and a scaler enabled for f16 only (f32 and bf16 get a disabled one, a pass-through).
    pub(super) fn build(
        cfg: &TrainConfig,
        spec: ModelSpec,
        device: Device,
        dist: Option<&Distributed>,
    ) -> Result<Run, Error> {
        let model = build_model(&spec, device)?;
        let ddp = match dist {
            Some(d) => Some(DistributedDataParallel::new(
                model.clone(),
                &d.group,
                DdpOptions::default(),
            )?),
            None => None,
        };
        let opt = Adam::new(
            model.parameters(),
            AdamOptions {
                lr: cfg.lr.unwrap_or(DEFAULT_LR),
                ..Default::default()
            },
        )?;
        let scaler = GradScaler::new(device)?.enabled(cfg.amp == Some(AmpDtype::F16));
        Ok(Run {
            model,
            ddp,
            opt,
            scaler,
            loss_fn: CrossEntropyLoss::new(),
            device,
            amp: cfg.amp,
            spec,
            world: dist.map_or(1, |d| d.group.world_size()),
            start_epoch: 0,
        })
    }

    /// The module a step runs: the DDP wrapper on several ranks, else the model.
    fn net(&self) -> &dyn Module {
        match &self.ddp {
            Some(ddp) => ddp,
            None => self.model.as_ref(),
        }
    }

    /// Drops the DDP wrapper (and its hooks on the group) before the group is destroyed.
    pub(super) fn leave_group(&mut self) {
        self.ddp = None;
    }

    /// The learning rate of the first parameter group.
    pub(super) fn lr(&self) -> f64 {
        self.opt.param_groups().first().map_or(f64::NAN, |g| g.lr)
    }

    /// Loads `c` into the model, optimizer and scaler; an `--lr` overrides the
    /// checkpoint's, said through `progress` and in `notes`. Returns the epoch to start at.
    pub(super) fn resume(
        &mut self,
        c: &Checkpoint,
        cfg: &TrainConfig,
        progress: &mut dyn Progress,
        notes: &mut Vec<String>,
    ) -> Result<usize, Error> {
        c.apply(self.model.as_ref(), &mut self.opt, &mut self.scaler)?;
        if let Some(lr) = cfg.lr {
            let old = self.lr();
            for g in self.opt.param_groups_mut() {
                g.lr = lr;
            }
            let note = format!(
                "--lr {} overrides the learning rate {} of the checkpoint {}",
                show(lr),
                show(old),
                resume_path(cfg)
            );
            progress.note(&note);
            notes.push(note);
        }
        self.start_epoch = c.epoch;
        Ok(c.epoch)
    }

    /// One optimizer step on a batch: its loss, and whether the scaler skipped the step.
    fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<(f64, bool), Error> {
        self.opt.zero_grad(true)?;
        let loss = {
            let _autocast = autocast_region(self.amp, self.device)?;
            let (out, y) = flat_for_loss(self.net().forward(x)?, y)?;
            self.loss_fn.forward(&out, &y)?
        };
        self.scaler.scale(&loss)?.backward()?;
        let stepped = self.scaler.step(&mut self.opt)?;
        self.scaler.update()?;
        Ok((loss.item::<f32>()? as f64, !stepped))
    }

    /// Epoch `epoch` (0-based) over `data`: its mean loss and the steps the scaler skipped.
    /// A loss that is not finite stops the run with an error naming the batch.
    pub(super) fn train_epoch(
        &mut self,
        epoch: usize,
        (cfg, data): (&TrainConfig, &Data),
        clock: &mut Clock,
        progress: &mut dyn Progress,
        profiler: Option<&mut RunProfiler>,
    ) -> Result<(f64, usize), Error> {
        self.model.train(true);
        let batches_in_epoch = data.batches_per_epoch();
        progress.epoch_start(epoch + 1, cfg.epochs, batches_in_epoch);
        let (mut total, mut batches, mut skipped) = (0.0, 0usize, 0usize);
        let mut profiler = profiler;
        for batch in data.epoch(epoch)? {
            let batch = batch?;
            let (x, y) = (
                batch[0].to_non_blocking(self.device)?,
                batch[1].to_non_blocking(self.device)?,
            );
            let (l, was_skipped) = self.step(&x, &y)?;
            skipped += usize::from(was_skipped);
            if !l.is_finite() {
                return Err(self.diverged(l, (epoch, batches), batches_in_epoch, cfg));
            }
            total += l;
            batches += 1;
            clock.seen += x.dims()[0] * self.world;
            let rate = clock.seen as f64 / clock.started.elapsed().as_secs_f64().max(1e-9);
            progress.batch(l, rate);
            if let Some(p) = profiler.as_deref_mut() {
                p.profiler.step()?;
            }
        }
        Ok((total / batches.max(1) as f64, skipped))
    }

    /// The error of a loss `l` that is not finite at `(epoch, batch)` (0-based), naming the
    /// checkpoint that holds the last good state when this run wrote one.
    fn diverged(
        &self,
        l: f64,
        (epoch, batch): (usize, usize),
        of: usize,
        cfg: &TrainConfig,
    ) -> Error {
        let saved = match &cfg.save {
            Some(p) if epoch > self.start_epoch => {
                format!("; {} holds the state after epoch {epoch}", p.display())
            }
            _ => String::new(),
        };
        invalid(format!(
            "the training loss became {l} at epoch {}, batch {} of {of}; stopping (the learning rate {} may be too high){saved}",
            epoch + 1,
            batch + 1,
            show(self.lr())
        ))
    }

    /// The validation's accuracy and mean loss (over rows, or the GPT's positions), without
    /// recording history, under the run's autocast.
    pub(super) fn validate(&self, data: &Data) -> Result<(f64, f64), Error> {
        let _autocast = autocast_region(self.amp, self.device)?;
        evaluate(self.model.as_ref(), &data.val)
    }

    /// Writes the checkpoint of `cfg.save` after `epochs` epochs (rank 0 alone: every rank
    /// holds the same weights).
    pub(super) fn save(
        &self,
        cfg: &TrainConfig,
        (seed, rank): (u64, usize),
        epochs: usize,
        vocab: Option<&Vocab>,
    ) -> Result<(), Error> {
        let Some(path) = cfg.save.as_ref().filter(|_| rank == 0) else {
            return Ok(());
        };
        checkpoint::save_checkpoint(
            path,
            (&self.spec, vocab),
            (seed, cfg.val_fraction),
            epochs,
            (self.model.as_ref(), &self.opt, cfg.amp, &self.scaler),
        )
    }

    /// The run's last statistics of one epoch.
    pub(super) fn stats(
        &self,
        epoch: usize,
        train_loss: f64,
        data: &Data,
    ) -> Result<EpochStats, Error> {
        let (val_accuracy, val_loss) = self.validate(data)?;
        Ok(EpochStats {
            epoch: epoch + 1,
            train_loss,
            val_accuracy,
            val_loss,
            val_perplexity: self.spec.gpt().map(|_| val_loss.exp()),
        })
    }
}

/// The autocast region of `--amp` on `device` (none for f32).
fn autocast_region(
    amp: Option<AmpDtype>,
    device: Device,
) -> Result<Option<ember_amp::AutocastGuard>, Error> {
    amp.map(|a| ember_amp::autocast(device, a.dtype()))
        .transpose()
}

/// The model's output and the targets as the loss takes them: a sequence model's logits
/// `[B, T, V]` and targets `[B, T]` become `[B·T, V]` and `[B·T]` (every position is a
/// sample); a classifier's pass through.
fn flat_for_loss(out: Tensor, y: &Tensor) -> Result<(Tensor, Tensor), Error> {
    if y.rank() < 2 {
        return Ok((out, y.clone()));
    }
    let n = y.numel();
    let v = out.numel() / n.max(1);
    Ok((out.reshape([n, v])?, y.reshape([n])?))
}

/// Over the batches `(x, y)`: the share of rows (positions) whose arg-max class is the
/// target and the mean cross-entropy, without recording history.
fn evaluate(model: &dyn Module, batches: &[(Tensor, Tensor)]) -> Result<(f64, f64), Error> {
    let _g = ember_autograd::no_grad();
    model.eval();
    let (mut correct, mut loss, mut n) = (0.0, 0.0, 0usize);
    for (x, y) in batches {
        let (out, y) = flat_for_loss(model.forward(x)?, y)?;
        let rows = y.numel();
        if rows == 0 {
            continue;
        }
        correct += out
            .argmax(1)?
            .eq(&y)?
            .to_dtype(ember_tensor::DType::F64)?
            .sum_all()?
            .item::<f64>()?;
        let l =
            ember_nn::functional::cross_entropy(&out.to_dtype(ember_tensor::DType::F32)?, &y, ())?;
        loss += l.item::<f32>()? as f64 * rows as f64;
        n += rows;
    }
    model.train(true);
    if n == 0 {
        return Ok((f64::NAN, f64::NAN));
    }
    Ok((correct / n as f64, loss / n as f64))
}
