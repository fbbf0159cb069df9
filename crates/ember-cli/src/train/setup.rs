//! The checks a run makes before it trains: its options, the world it runs in, and a
//! checkpoint it resumes from (Note [Resumable training]).

use std::path::{Path, PathBuf};

use ember_nn::{Error, NnError};

use super::gpt::GptConfig;
use super::text::Vocab;
use super::{
    AmpDtype, Checkpoint, DEFAULT_BLOCK_SIZE, DEFAULT_D_MODEL, DEFAULT_N_HEAD, DEFAULT_N_LAYER,
    DEFAULT_SEED, DEFAULT_WIDTH, ModelKind, ModelSpec, TrainConfig,
};

/// A float as a person reads it: `0.002`, `1e300` (not 301 digits), `NaN`, `inf`.
pub fn show(x: f64) -> String {
    let a = x.abs();
    if a != 0.0 && a.is_finite() && !(1e-4..1e16).contains(&a) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// An `ember train` error saying `msg`.
pub(super) fn invalid(msg: String) -> Error {
    NnError::invalid("ember train", msg).into()
}

/// `--epochs`, `--batch-size` and `--lr` as a run needs them, and the sizes of the model
/// asked for (the GPT's options with another model, or `--width` with the GPT, are errors).
pub(super) fn check_options(cfg: &TrainConfig) -> Result<(), Error> {
    check_model_options(cfg)?;
    if cfg.batch_size == 0 || cfg.epochs == 0 {
        return Err(invalid(format!(
            "expected --epochs and --batch-size of at least 1, found {} and {}",
            cfg.epochs, cfg.batch_size
        )));
    }
    if let Some(lr) = cfg.lr
        && !(lr > 0.0 && lr.is_finite())
    {
        return Err(invalid(format!(
            "expected a positive --lr, found {}",
            show(lr)
        )));
    }
    Ok(())
}

/// The options that size a model belong to it: `--n-layer`, `--n-head`, `--d-model`,
/// `--block-size` and `--steps-per-epoch` to the GPT, `--width` to the cnn.
fn check_model_options(cfg: &TrainConfig) -> Result<(), Error> {
    let g = &cfg.gpt;
    let gpt_given = [
        ("--n-layer", g.n_layer),
        ("--n-head", g.n_head),
        ("--d-model", g.d_model),
        ("--block-size", g.block_size),
    ];
    if cfg.model != ModelKind::Gpt {
        if let Some((name, _)) = gpt_given.iter().find(|(_, v)| v.is_some()) {
            return Err(invalid(format!(
                "{name} sizes the gpt; --model {} does not take it",
                cfg.model.as_str()
            )));
        }
        if cfg.steps_per_epoch.is_some() {
            return Err(invalid(format!(
                "--steps-per-epoch is the gpt's (an epoch of --model {} is one pass over the digits)",
                cfg.model.as_str()
            )));
        }
    }
    if cfg.model == ModelKind::Gpt {
        if cfg.width.is_some() {
            return Err(invalid(
                "--width is the cnn's; the gpt's width is --d-model".to_string(),
            ));
        }
        if cfg.steps_per_epoch == Some(0) {
            return Err(invalid(
                "expected --steps-per-epoch of at least 1, found 0".to_string(),
            ));
        }
    }
    Ok(())
}

/// A duration as a person reads it: `42 ms` under a second (never `0.0 s`), `3.2 s`,
/// `95 s`.
pub fn format_duration(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1e3)
    } else if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{seconds:.0} s")
    }
}

/// The files a run reads and writes, checked before it starts: `--resume` must be a
/// readable file (unless it names the `--save` path and nothing is there yet: the first
/// attempt of a restartable job, which `checkpoint::resume_from` starts from scratch), and
/// `--save` must go to an existing, writable directory (a file there is replaced). Each
/// error names its option.
pub(super) fn check_paths(cfg: &TrainConfig) -> Result<(), Error> {
    let first_attempt = |p: &PathBuf| cfg.save.as_ref() == Some(p) && !p.exists();
    if let Some(p) = cfg.resume.as_ref().filter(|p| !first_attempt(p)) {
        if let Err(e) = std::fs::File::open(p) {
            return Err(invalid(format!(
                "--resume {}: cannot read the checkpoint: {e}",
                p.display()
            )));
        }
        if p.is_dir() {
            return Err(invalid(format!(
                "--resume {}: is a directory, expected a checkpoint file written by --save",
                p.display()
            )));
        }
    }
    if let Some(p) = &cfg.save {
        check_writable("--save", p)?;
    }
    Ok(())
}

/// An error naming `option` unless a file can be written at `path`: its directory exists
/// and takes a new file (tried with a probe file, removed at once), and `path` is not a
/// directory.
fn check_writable(option: &str, path: &Path) -> Result<(), Error> {
    let shown = path.display();
    if path.is_dir() {
        return Err(invalid(format!(
            "{option} {shown}: is a directory, expected a file path"
        )));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(invalid(format!(
            "{option} {shown}: the directory {} does not exist; create it first",
            dir.display()
        )));
    }
    let probe = dir.join(format!(".ember-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(invalid(format!(
            "{option} {shown}: cannot write in {}: {e}",
            dir.display()
        ))),
    }
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

/// The model to build: the checkpoint's sizes when resuming (another `--width`,
/// `--n-layer`, ... is an error naming it), else the options or the defaults. `vocab` is the
/// shipped text's, for the GPT; a checkpoint of another vocabulary is an error.
pub(super) fn model_spec(
    cfg: &TrainConfig,
    ckpt: Option<&Checkpoint>,
    vocab: Option<&Vocab>,
) -> Result<ModelSpec, Error> {
    match cfg.model {
        ModelKind::Mlp => Ok(ModelSpec::Mlp),
        ModelKind::Cnn => Ok(ModelSpec::Cnn {
            width: width(cfg, ckpt)?,
        }),
        ModelKind::Gpt => {
            let Some(vocab) = vocab else {
                return Err(invalid("the gpt needs the text's vocabulary".to_string()));
            };
            gpt_config(cfg, ckpt, vocab).map(ModelSpec::Gpt)
        }
    }
}

/// The GPT's sizes (see [`model_spec`]).
fn gpt_config(
    cfg: &TrainConfig,
    ckpt: Option<&Checkpoint>,
    vocab: &Vocab,
) -> Result<GptConfig, Error> {
    let g = &cfg.gpt;
    let c = match ckpt.and_then(|c| c.spec.gpt()) {
        None => GptConfig {
            vocab_size: vocab.len(),
            block_size: g.block_size.unwrap_or(DEFAULT_BLOCK_SIZE),
            n_layer: g.n_layer.unwrap_or(DEFAULT_N_LAYER),
            n_head: g.n_head.unwrap_or(DEFAULT_N_HEAD),
            d_model: g.d_model.unwrap_or(DEFAULT_D_MODEL),
        },
        Some(c) => {
            let pairs = [
                ("--n-layer", g.n_layer, c.n_layer),
                ("--n-head", g.n_head, c.n_head),
                ("--d-model", g.d_model, c.d_model),
                ("--block-size", g.block_size, c.block_size),
            ];
            for (name, asked, held) in pairs {
                if let Some(a) = asked.filter(|a| *a != held) {
                    return Err(invalid(format!(
                        "{} holds a gpt with {name} {held}, but {name} {a} was asked for; leave it out to take the checkpoint's",
                        resume_path(cfg)
                    )));
                }
            }
            if ckpt.and_then(|k| k.vocab.as_ref()) != Some(vocab) {
                return Err(invalid(format!(
                    "{} was trained on a text of another vocabulary than the shipped one",
                    resume_path(cfg)
                )));
            }
            c
        }
    };
    c.check().map_err(invalid)?;
    Ok(c)
}

/// The cnn's width: the checkpoint's when resuming (another `--width` is an error), else
/// `--width` or [`DEFAULT_WIDTH`], at least 1.
fn width(cfg: &TrainConfig, ckpt: Option<&Checkpoint>) -> Result<usize, Error> {
    let w = match (ckpt, cfg.width) {
        (Some(c), Some(w)) if w != c.width => {
            return Err(invalid(format!(
                "{} holds a cnn of width {}, but --width {w} was asked for",
                resume_path(cfg),
                c.width
            )));
        }
        (Some(c), _) => c.width,
        (None, w) => w.unwrap_or(DEFAULT_WIDTH),
    };
    if w == 0 {
        return Err(invalid(
            "expected --width of at least 1, found 0".to_string(),
        ));
    }
    Ok(w)
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
