//! The checkpoints of `ember train --save`: what they hold, and reading them back with every
//! check a resume needs (Note [Train checkpoint]).
//!
//! Note [Train checkpoint]: a checkpoint is one safetensors file: the model's `state_dict`
//! under `model.`, the optimizer's under `optimizer.`, and metadata — `format`
//! ([`FORMAT`]), `epoch`, `model`, `seed` (of the train/validation split and the data
//! order), `val_fraction` (of the split), the random generators' states (`rng.cpu`,
//! `rng.cuda:0`, ...), `amp` (`bf16`, `f16`; absent for f32 training) with the
//! `GradScaler`'s state under `scaler.` (`scaler.scale`, `scaler._growth_tracker`, ...: its
//! `state_dict` keys, present for f16), and the CRC-32 of the data (`ember.crc32`, Note [Checkpoint checksum]
//! in `ember-tensor`). [`read_checkpoint`] refuses a file without the checksum (every
//! file of this format has one) and a file whose metadata does not parse;
//! [`Checkpoint::restore`] loads the state into a fresh model and optimizer, whose
//! `load_state_dict` checks names, shapes and the optimizer's hyperparameters and step
//! counts as its constructor checks arguments. So a corrupted file is an error value, never
//! a resumed run on bad state.

use std::collections::BTreeMap;
use std::path::Path;

use ember_amp::{GradScaler, ScalerState};
use ember_autograd::ErrorKind;
use ember_device::{Device, cuda};
use ember_nn::layers::Sequential;
use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Error, Module, StateDict};
use ember_tensor::Scalar;
use ember_tensor::random::{GeneratorState, default_generator};

use super::{AmpDtype, ModelKind, build_model};

/// The `format` metadata of the checkpoints this version writes and reads.
pub const FORMAT: &str = "ember-train-checkpoint-v2";

/// A checkpoint of `ember train --save`, read and checked, not yet applied.
#[derive(Debug)]
pub struct Checkpoint {
    /// Epochs done.
    pub epoch: usize,
    /// The model it holds.
    pub model: ModelKind,
    /// The CNN's width (its first convolution's output channels, read from the weights);
    /// [`super::DEFAULT_WIDTH`] for the MLP.
    pub width: usize,
    /// The seed of the run that wrote it: of the split and the data order.
    pub seed: u64,
    /// The share of the digits held out for validation.
    pub val_fraction: f64,
    /// The autocast dtype it was trained in (`None`: f32).
    pub amp: Option<AmpDtype>,
    /// The file's metadata, as written.
    pub metadata: BTreeMap<String, String>,
    model_state: StateDict,
    optimizer_state: StateDict,
    scaler_state: ScalerState,
    rng: Vec<(Device, GeneratorState)>,
}

/// A [`ErrorKind::StateDict`] error about the checkpoint at `path`.
fn bad(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::StateDict,
        format!("ember train --resume {}: {msg}", path.display()),
    )
}

/// The checkpoint of `--resume`, or `None` with a note when `--resume` names the `--save`
/// path and nothing is there yet: the first attempt of a job that `ember launch
/// --max-restarts` may start again with the same command line (Note [Restarts] in
/// ember-parallel's `launch`) starts from scratch, a restarted one continues.
pub(super) fn resume_from(
    resume: Option<&Path>,
    save: Option<&Path>,
) -> Result<(Option<Checkpoint>, Option<String>), Error> {
    match resume {
        Some(p) if save == Some(p) && !p.exists() => Ok((
            None,
            Some(format!(
                "no checkpoint at {} yet: starting from scratch (--resume names the --save path)",
                p.display()
            )),
        )),
        Some(p) => Ok((Some(read_checkpoint(p)?), None)),
        None => Ok((None, None)),
    }
}

/// Reads the checkpoint at `path` (the data checked against its checksum) and parses its
/// metadata; the tensors are checked by [`Checkpoint::restore`].
pub fn read_checkpoint(path: &Path) -> Result<Checkpoint, Error> {
    let (tensors, meta) = ember_nn::io::load_with_metadata(path, Device::Cpu)?;
    match meta.get("format").map(String::as_str) {
        Some(FORMAT) => {}
        Some("ember-train-checkpoint-v1") => {
            return Err(bad(
                path,
                "a checkpoint of an older Ember (format v1, without a checksum); start a new run",
            ));
        }
        other => {
            return Err(bad(
                path,
                format!(
                    "not an `ember train` checkpoint (expected format {FORMAT}, found {other:?})"
                ),
            ));
        }
    }
    if !meta.contains_key(ember_tensor::io::CHECKSUM_KEY) {
        return Err(bad(
            path,
            format!(
                "no checksum ({:?}) in its metadata; every checkpoint of format {FORMAT} has one",
                ember_tensor::io::CHECKSUM_KEY
            ),
        ));
    }
    let (epoch, model, seed, val_fraction, amp) = run_fields(path, &meta)?;
    let scaler_state = scaler_state(path, &meta, amp)?;
    let rng = rng_states(path, &meta)?;
    let (model_state, optimizer_state) = split_states(path, &tensors)?;
    // The CNN's width is its first convolution's output channels.
    let width = match model {
        ModelKind::Mlp => super::DEFAULT_WIDTH,
        ModelKind::Cnn => model_state
            .get("0.weight")
            .and_then(|w| w.dims().first().copied())
            .ok_or_else(|| bad(path, "a cnn checkpoint without the tensor model.0.weight"))?,
    };
    Ok(Checkpoint {
        epoch,
        model,
        width,
        seed,
        val_fraction,
        amp,
        metadata: meta,
        model_state,
        optimizer_state,
        scaler_state,
        rng,
    })
}

/// The metadata fields of the run: epoch, model, seed, validation share and precision.
fn run_fields(
    path: &Path,
    meta: &BTreeMap<String, String>,
) -> Result<(usize, ModelKind, u64, f64, Option<AmpDtype>), Error> {
    let field = |key: &str| -> Result<&String, Error> {
        meta.get(key)
            .ok_or_else(|| bad(path, format!("no {key} in its metadata")))
    };
    let parse_err = |key: &str, v: &str| bad(path, format!("bad {key} {v:?} in its metadata"));
    let e = field("epoch")?;
    let epoch: usize = e.parse().map_err(|_| parse_err("epoch", e))?;
    let model = match field("model")?.as_str() {
        "mlp" => ModelKind::Mlp,
        "cnn" => ModelKind::Cnn,
        other => return Err(parse_err("model", other)),
    };
    let s = field("seed")?;
    let seed: u64 = s.parse().map_err(|_| parse_err("seed", s))?;
    let v = field("val_fraction")?;
    let val_fraction: f64 = v
        .parse()
        .ok()
        .filter(|f: &f64| (0.0..=1.0).contains(f))
        .ok_or_else(|| parse_err("val_fraction", v))?;
    let amp = match meta.get("amp").map(String::as_str) {
        None => None,
        Some("bf16") => Some(AmpDtype::Bf16),
        Some("f16") => Some(AmpDtype::F16),
        Some(other) => return Err(parse_err("amp", other)),
    };
    Ok((epoch, model, seed, val_fraction, amp))
}

/// The `GradScaler`'s state under `scaler.` (present for f16 alone).
fn scaler_state(
    path: &Path,
    meta: &BTreeMap<String, String>,
    amp: Option<AmpDtype>,
) -> Result<ScalerState, Error> {
    let parse_err = |key: &str, v: &str| bad(path, format!("bad {key} {v:?} in its metadata"));
    let mut scaler_state = ScalerState::new();
    for (k, v) in meta {
        if let Some(key) = k.strip_prefix("scaler.") {
            // Integers stay integers (growth_interval, _growth_tracker); the scaler's
            // load_state_dict checks keys, types and ranges.
            let value = match v.parse::<i64>() {
                Ok(i) => Scalar::Int(i),
                Err(_) => Scalar::Float(v.parse().map_err(|_| parse_err(k, v))?),
            };
            scaler_state.insert(key.to_string(), value);
        }
    }
    if (amp == Some(AmpDtype::F16)) == scaler_state.is_empty() {
        return Err(bad(
            path,
            format!(
                "its metadata has amp {:?} and {} scaler.* keys: an f16 checkpoint holds the GradScaler's state, others none",
                amp.map(AmpDtype::as_str),
                scaler_state.len()
            ),
        ));
    }
    Ok(scaler_state)
}

/// The random generators' states (`rng.cpu`, `rng.cuda:0`, ...).
fn rng_states(
    path: &Path,
    meta: &BTreeMap<String, String>,
) -> Result<Vec<(Device, GeneratorState)>, Error> {
    let mut rng = Vec::new();
    for device in rng_devices() {
        let Some(s) = meta.get(&format!("rng.{device}")) else {
            continue;
        };
        let state = s
            .split_once(':')
            .and_then(|(a, b)| {
                Some(GeneratorState {
                    seed: a.parse().ok()?,
                    offset: b.parse().ok()?,
                })
            })
            .ok_or_else(|| bad(path, format!("bad generator state {s:?} for {device}")))?;
        rng.push((device, state));
    }
    Ok(rng)
}

/// The model's and the optimizer's state dicts, from the tensors under `model.` and
/// `optimizer.`.
fn split_states(path: &Path, tensors: &StateDict) -> Result<(StateDict, StateDict), Error> {
    let (mut model_state, mut optimizer_state) = (StateDict::new(), StateDict::new());
    for (k, v) in tensors {
        if let Some(rest) = k.strip_prefix("model.") {
            model_state.insert(rest.to_string(), v.clone());
        } else if let Some(rest) = k.strip_prefix("optimizer.") {
            optimizer_state.insert(rest.to_string(), v.clone());
        } else {
            return Err(bad(path, format!("unexpected tensor {k:?}")));
        }
    }
    Ok((model_state, optimizer_state))
}

impl Checkpoint {
    /// Loads the state into `model`, `opt` and `scaler` (each checked by its
    /// `load_state_dict`; a disabled scaler takes nothing) and restores the random
    /// generators.
    pub fn apply(
        &self,
        model: &dyn Module,
        opt: &mut dyn Optimizer,
        scaler: &mut GradScaler,
    ) -> Result<(), Error> {
        model.load_state_dict(&self.model_state)?;
        opt.load_state_dict(&self.optimizer_state)?;
        scaler.load_state_dict(&self.scaler_state)?;
        for (device, state) in &self.rng {
            default_generator(*device).set_state(state);
        }
        Ok(())
    }

    /// The model and optimizer it holds, built on `device` and loaded (without touching the
    /// random generators): what a resume would train on.
    pub fn restore(&self, device: Device) -> Result<(Sequential, Adam), Error> {
        let model = build_model(self.model, self.width, device)?;
        let mut opt = Adam::new(model.parameters(), AdamOptions::default())?;
        model.load_state_dict(&self.model_state)?;
        opt.load_state_dict(&self.optimizer_state)?;
        Ok((model, opt))
    }
}

/// Writes a checkpoint of the model, the optimizer and the scaler of an `amp` run after
/// `epoch` epochs (Note [Train checkpoint]).
pub(super) fn save_checkpoint(
    path: &Path,
    kind: ModelKind,
    split: (u64, f64),
    epoch: usize,
    (model, opt, amp, scaler): (&dyn Module, &dyn Optimizer, Option<AmpDtype>, &GradScaler),
) -> Result<(), Error> {
    let mut tensors = StateDict::new();
    for (k, v) in model.state_dict() {
        tensors.insert(format!("model.{k}"), v);
    }
    for (k, v) in opt.state_dict()? {
        tensors.insert(format!("optimizer.{k}"), v);
    }
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("epoch".to_string(), epoch.to_string());
    meta.insert("model".to_string(), kind.as_str().to_string());
    meta.insert("seed".to_string(), split.0.to_string());
    meta.insert("val_fraction".to_string(), split.1.to_string());
    if let Some(a) = amp {
        meta.insert("amp".to_string(), a.as_str().to_string());
    }
    for (k, v) in scaler.state_dict()? {
        let v = match v {
            Scalar::Int(i) => i.to_string(),
            // `{}` of an f64 reads back exactly.
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        };
        meta.insert(format!("scaler.{k}"), v);
    }
    for device in rng_devices() {
        let st = default_generator(device).get_state();
        meta.insert(
            format!("rng.{device}"),
            format!("{}:{}", st.seed, st.offset),
        );
    }
    ember_nn::io::save_with_metadata(&tensors, &meta, path)?;
    Ok(())
}

fn rng_devices() -> Vec<Device> {
    let mut v = vec![Device::Cpu];
    v.extend((0..cuda::device_count()).map(Device::Cuda));
    v
}
