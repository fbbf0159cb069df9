//! What trains: the model (wrapped in `DistributedDataParallel` on several ranks), Adam,
//! the `GradScaler`, and one epoch of the loop (Note [Mixed-precision training]).

use std::sync::Arc;
use std::time::Instant;

use ember_amp::GradScaler;
use ember_autograd::Tensor;
use ember_device::Device;
use ember_nn::layers::Sequential;
use ember_nn::loss::{CrossEntropyLoss, Loss};
use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Error, Module};
use ember_parallel::{DdpOptions, DistributedDataParallel};

use super::checkpoint::{self, Checkpoint};
use super::data::Data;
use super::distributed::Distributed;
use super::profile::RunProfiler;
use super::setup::{invalid, resume_path, show};
use super::{AmpDtype, DEFAULT_LR, EpochStats, Progress, TrainConfig, build_model};

/// The model and the state that steps it.
pub(super) struct Run {
    pub(super) model: Arc<Sequential>,
    ddp: Option<DistributedDataParallel<Arc<Sequential>>>,
    pub(super) opt: Adam,
    pub(super) scaler: GradScaler,
    loss_fn: CrossEntropyLoss,
    device: Device,
    amp: Option<AmpDtype>,
    /// The cnn's width (its first convolution's channels).
    pub(super) width: usize,
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
        width: usize,
        device: Device,
        dist: Option<&Distributed>,
    ) -> Result<Run, Error> {
        let model = Arc::new(build_model(cfg.model, width, device)?);
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
            width,
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
            self.loss_fn.forward(&self.net().forward(x)?, y)?
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
        let batches_in_epoch = data.loader.len();
        progress.epoch_start(epoch + 1, cfg.epochs, batches_in_epoch);
        if let Some(s) = &data.sampler {
            s.set_epoch(epoch as u64);
        }
        let (mut total, mut batches, mut skipped) = (0.0, 0usize, 0usize);
        let mut profiler = profiler;
        for batch in data.loader.epoch(epoch as u64)? {
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

    /// Share of the validation rows whose arg-max class is the label, without recording
    /// history, under the run's autocast.
    pub(super) fn validate(&self, data: &Data) -> Result<f64, Error> {
        let _autocast = autocast_region(self.amp, self.device)?;
        accuracy(self.model.as_ref(), &data.val_x, &data.val_y)
    }

    /// Writes the checkpoint of `cfg.save` after `epochs` epochs (rank 0 alone: every rank
    /// holds the same weights).
    pub(super) fn save(
        &self,
        cfg: &TrainConfig,
        (seed, rank): (u64, usize),
        epochs: usize,
    ) -> Result<(), Error> {
        let Some(path) = cfg.save.as_ref().filter(|_| rank == 0) else {
            return Ok(());
        };
        checkpoint::save_checkpoint(
            path,
            cfg.model,
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
        Ok(EpochStats {
            epoch: epoch + 1,
            train_loss,
            val_accuracy: self.validate(data)?,
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
