//! The checks a run makes before it trains: its options, the world it runs in, and a
//! checkpoint it resumes from (Note [Resumable training]).

use ember_nn::{Error, NnError};

use super::{AmpDtype, Checkpoint, DEFAULT_SEED, TrainConfig};

/// An `ember train` error saying `msg`.
pub(super) fn invalid(msg: String) -> Error {
    NnError::invalid("ember train", msg).into()
}

/// `--epochs`, `--batch-size` and `--lr` as a run needs them.
pub(super) fn check_options(cfg: &TrainConfig) -> Result<(), Error> {
    if cfg.batch_size == 0 || cfg.epochs == 0 {
        return Err(invalid(format!(
            "expected --epochs and --batch-size of at least 1, found {} and {}",
            cfg.epochs, cfg.batch_size
        )));
    }
    if let Some(lr) = cfg.lr
        && !(lr > 0.0 && lr.is_finite())
    {
        return Err(invalid(format!("expected a positive --lr, found {lr}")));
    }
    Ok(())
}

/// `--batch-size` is the global batch: it must divide over the `world` ranks.
pub(super) fn check_world(cfg: &TrainConfig, world: usize) -> Result<(), Error> {
    if !cfg.batch_size.is_multiple_of(world) {
        return Err(invalid(format!(
            "--batch-size {} is the global batch and must divide evenly over the {world} ranks",
            cfg.batch_size
        )));
    }
    Ok(())
}

/// The run's seed: the checkpoint's when resuming (another `--seed` is an error), else
/// `--seed` or [`DEFAULT_SEED`].
pub(super) fn seed(cfg: &TrainConfig, ckpt: Option<&Checkpoint>) -> Result<u64, Error> {
    match (ckpt, cfg.seed) {
        (Some(c), Some(s)) if s != c.seed => Err(invalid(format!(
            "--seed {s} conflicts with the seed {} of the checkpoint {}: the train/validation split and the data order come from the checkpoint's seed (a new split would validate on samples it was trained on); leave --seed out, or give --seed {}",
            c.seed,
            resume_path(cfg),
            c.seed
        ))),
        (Some(c), _) => Ok(c.seed),
        (None, s) => Ok(s.unwrap_or(DEFAULT_SEED)),
    }
}

/// A checkpoint fits the run: the same model, split and precision, and epochs left to do.
pub(super) fn check_resume(cfg: &TrainConfig, c: &Checkpoint) -> Result<(), Error> {
    if c.model != cfg.model {
        return Err(invalid(format!(
            "{} holds a {} model, but --model {} was asked for",
            resume_path(cfg),
            c.model.as_str(),
            cfg.model.as_str()
        )));
    }
    if c.val_fraction != cfg.val_fraction {
        return Err(invalid(format!(
            "{} was trained with a validation share of {}, but {} was asked for",
            resume_path(cfg),
            c.val_fraction,
            cfg.val_fraction
        )));
    }
    if c.amp != cfg.amp {
        let name = |a: Option<AmpDtype>| a.map_or("f32 (no --amp)", AmpDtype::as_str);
        return Err(invalid(format!(
            "{} was trained in {}, but {} was asked for; resume with the checkpoint's precision",
            resume_path(cfg),
            name(c.amp),
            name(cfg.amp)
        )));
    }
    if c.epoch >= cfg.epochs {
        return Err(invalid(format!(
            "{} already holds {} epoch(s); ask for more with --epochs (found {})",
            resume_path(cfg),
            c.epoch,
            cfg.epochs
        )));
    }
    Ok(())
}

/// The `--resume` path, for messages.
pub(super) fn resume_path(cfg: &TrainConfig) -> String {
    cfg.resume
        .as_deref()
        .map_or_else(String::new, |p| p.display().to_string())
}
