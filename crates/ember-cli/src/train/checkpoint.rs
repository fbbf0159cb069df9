//! The checkpoints of `ember train --save`: what they hold, and reading them back with every
//! check a resume needs (Note [Train checkpoint]).
//!
//! Note [Train checkpoint]: a checkpoint is one [`StateDict`] saved with `ember::save`
//! (one safetensors file, Note [Checkpoint file] in `ember-nn`): the model's `state_dict`
//! under `model.`, the optimizer's under `optimizer.`, the `GradScaler`'s under `scaler.`
//! (`scaler.scale`, `scaler._growth_tracker`, ...: its `state_dict` keys, present for f16
//! alone), and plain values — `format` ([`FORMAT`]), `epoch`, `arch` (`mlp`, `cnn`, `gpt`;
//! the GPT's hyper-parameters under `gpt.` — `gpt.n_layer`, `gpt.n_head`, `gpt.d_model`,
//! `gpt.block_size` — and its vocabulary as `gpt.vocab`, the code points of its characters
//! in decimal, separated by spaces, so that `ember generate` can decode), `seed`
//! (of the train/validation split and the data order), `val_fraction` (of the split), `amp`
//! (`bf16`, `f16`; absent for f32 training), the random generators' states (`rng.cpu.seed`,
//! `rng.cpu.offset`, `rng.cuda:0.seed`, ...) — in the file's metadata, with the CRC-32 of
//! the whole file, header and metadata included (`ember.checksum`, Note [Checkpoint
//! checksum] in `ember-tensor`): an edited dtype or seed is refused, not resumed.
//! [`read_checkpoint`] refuses a file without the checksum (every file of this format has
//! one), a file of an older format (v2's checksum covered the data alone), and a file whose
//! values are missing or of the wrong type; [`Checkpoint::restore`] loads the state into a
//! fresh model and optimizer, whose `load_state_dict` checks names, shapes and the
//! optimizer's hyperparameters and step counts as its constructor checks arguments. So a
//! corrupted file is an error value, never a resumed run on bad state.

use std::path::Path;

use ember_amp::GradScaler;
use ember_autograd::ErrorKind;
use ember_device::{Device, cuda};
use std::sync::Arc;

use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Error, Module, StateDict, Value};
use ember_tensor::random::{GeneratorState, default_generator};

use super::gpt::GptConfig;
use super::text::Vocab;
use super::{AmpDtype, ModelKind, ModelSpec, build_model};

/// The `format` metadata of the checkpoints this version writes and reads.
pub const FORMAT: &str = "ember-train-checkpoint-v3";

/// A checkpoint of `ember train --save`, read and checked, not yet applied.
#[derive(Debug)]
pub struct Checkpoint {
    /// Epochs done.
    pub epoch: usize,
    /// The model it holds.
    pub model: ModelKind,
    /// The CNN's width (its first convolution's output channels, read from the weights);
    /// [`super::DEFAULT_WIDTH`] for the other models.
    pub width: usize,
    /// The model with its sizes.
    pub spec: ModelSpec,
    /// The GPT's vocabulary (`None` for the digits' models).
    pub vocab: Option<Vocab>,
    /// The seed of the run that wrote it: of the split and the data order.
    pub seed: u64,
    /// The share of the digits held out for validation.
    pub val_fraction: f64,
    /// The autocast dtype it was trained in (`None`: f32).
    pub amp: Option<AmpDtype>,
    /// The CRC-32 its header records (verified).
    pub checksum: String,
    /// Everything it holds, as loaded: the tensors and the plain values.
    pub state: StateDict,
    model_state: StateDict,
    optimizer_state: StateDict,
    scaler_state: StateDict,
    rng: Vec<(Device, GeneratorState)>,
}

/// A [`ErrorKind::StateDict`] error about the checkpoint at `path`.
fn bad(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::StateDict, format!("{}: {msg}", path.display()))
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

/// Reads the checkpoint at `path` (the whole file checked against its checksum) and its
/// values; the tensors are checked by [`Checkpoint::restore`]. Errors begin with `ember
/// train --resume`.
pub fn read_checkpoint(path: &Path) -> Result<Checkpoint, Error> {
    read_checkpoint_for(path, "ember train --resume")
}

/// [`read_checkpoint`] for the command `who` (`ember generate --checkpoint`), which begins
/// its errors.
pub fn read_checkpoint_for(path: &Path, who: &str) -> Result<Checkpoint, Error> {
    read_checkpoint_inner(path).map_err(|e| Error::new(e.kind(), format!("{who} {e}")))
}

fn read_checkpoint_inner(path: &Path) -> Result<Checkpoint, Error> {
    let (tensors, meta) =
        ember_nn::io::load_with_metadata(path, Device::Cpu).map_err(|e| bad(path, e))?;
    let mut state = tensors;
    for (k, v) in &meta {
        state.set(k.clone(), Value::from_metadata(v));
    }
    match state.value("format") {
        Some(Value::Str(f)) if f == FORMAT => {}
        Some(Value::Str(f)) if f.starts_with("ember-train-checkpoint-v") => {
            return Err(bad(
                path,
                format!(
                    "a checkpoint of an older Ember (format {f}, whose checksum does not cover its header and metadata); this version reads {FORMAT}: start a new run"
                ),
            ));
        }
        Some(other) => {
            return Err(bad(
                path,
                format!(
                    "not an `ember train` checkpoint (expected format {FORMAT}, found {other})"
                ),
            ));
        }
        None => {
            return Err(bad(
                path,
                format!(
                    "not an `ember train` checkpoint: its metadata has no \"format\" (expected {FORMAT})"
                ),
            ));
        }
    }
    let Some(checksum) = meta.get(ember_tensor::io::CHECKSUM_KEY).cloned() else {
        return Err(bad(
            path,
            format!(
                "no checksum ({:?}) in its metadata; every checkpoint of format {FORMAT} has one",
                ember_tensor::io::CHECKSUM_KEY
            ),
        ));
    };
    let field = |key: &str| state.item::<Value>(key).map_err(|e| bad(path, e));
    let parse_err = |key: &str, v: &Value| bad(path, format!("bad {key} {v} in its metadata"));
    let epoch: usize = state.item("epoch").map_err(|e| bad(path, e))?;
    let model = match field("arch")? {
        Value::Str(s) if s == "mlp" => ModelKind::Mlp,
        Value::Str(s) if s == "cnn" => ModelKind::Cnn,
        Value::Str(s) if s == "gpt" => ModelKind::Gpt,
        other => return Err(parse_err("arch", &other)),
    };
    let seed: u64 = state.item("seed").map_err(|e| bad(path, e))?;
    let val_fraction = state
        .item::<f64>("val_fraction")
        .ok()
        .filter(|f| (0.0..=1.0).contains(f))
        .ok_or_else(|| bad(path, "bad or missing val_fraction in its metadata"))?;
    let amp = match state.value("amp") {
        None => None,
        Some(Value::Str(s)) if s == "bf16" => Some(AmpDtype::Bf16),
        Some(Value::Str(s)) if s == "f16" => Some(AmpDtype::F16),
        Some(other) => return Err(parse_err("amp", other)),
    };
    let scaler_state = state.sub("scaler");
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
    let rng = rng_states(path, &state)?;
    let (model_state, optimizer_state) = split_states(path, &state)?;
    // The CNN's width is its first convolution's output channels.
    let width = match model {
        ModelKind::Cnn => model_state
            .get("0.weight")
            .and_then(|w| w.dims().first().copied())
            .ok_or_else(|| bad(path, "a cnn checkpoint without the tensor model.0.weight"))?,
        _ => super::DEFAULT_WIDTH,
    };
    let (spec, vocab) = match model {
        ModelKind::Mlp => (ModelSpec::Mlp, None),
        ModelKind::Cnn => (ModelSpec::Cnn { width }, None),
        ModelKind::Gpt => {
            let (c, v) = gpt_values(path, &state)?;
            (ModelSpec::Gpt(c), Some(v))
        }
    };
    Ok(Checkpoint {
        epoch,
        model,
        width,
        spec,
        vocab,
        seed,
        val_fraction,
        amp,
        checksum,
        state,
        model_state,
        optimizer_state,
        scaler_state,
        rng,
    })
}

/// The GPT's hyper-parameters and vocabulary from the metadata (`gpt.*`).
fn gpt_values(path: &Path, state: &StateDict) -> Result<(GptConfig, Vocab), Error> {
    let size = |k: &str| -> Result<usize, Error> {
        state
            .item::<usize>(&format!("gpt.{k}"))
            .map_err(|e| bad(path, e))
    };
    let vocab = match state.value("gpt.vocab") {
        Some(Value::Str(s)) => Vocab::from_metadata(s),
        _ => None,
    }
    .ok_or_else(|| {
        bad(
            path,
            "a gpt checkpoint without a valid gpt.vocab in its metadata",
        )
    })?;
    let c = GptConfig {
        vocab_size: vocab.len(),
        block_size: size("block_size")?,
        n_layer: size("n_layer")?,
        n_head: size("n_head")?,
        d_model: size("d_model")?,
    };
    c.check()
        .map_err(|e| bad(path, format!("bad gpt sizes: {e}")))?;
    Ok((c, vocab))
}

/// The random generators' states (`rng.cpu.seed`, `rng.cpu.offset`, `rng.cuda:0.seed`,
/// ...), for the devices this process has.
fn rng_states(path: &Path, state: &StateDict) -> Result<Vec<(Device, GeneratorState)>, Error> {
    let mut rng = Vec::new();
    for device in rng_devices() {
        let key = format!("rng.{device}");
        if !state.contains_key(&format!("{key}.seed")) {
            continue;
        }
        let read = |part: &str| {
            state
                .item::<u64>(&format!("{key}.{part}"))
                .map_err(|e| bad(path, e))
        };
        rng.push((
            device,
            GeneratorState {
                seed: read("seed")?,
                offset: read("offset")?,
            },
        ));
    }
    Ok(rng)
}

/// The model's and the optimizer's state dicts, from the tensors under `model.` and
/// `optimizer.`; a tensor elsewhere is an error.
fn split_states(path: &Path, state: &StateDict) -> Result<(StateDict, StateDict), Error> {
    if let Some(k) = state
        .keys()
        .find(|k| !(k.starts_with("model.") || k.starts_with("optimizer.")))
    {
        return Err(bad(path, format!("unexpected tensor {k:?}")));
    }
    let tensors_of = |prefix: &str| -> StateDict {
        state
            .sub(prefix)
            .iter()
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect()
    };
    Ok((tensors_of("model"), tensors_of("optimizer")))
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
    pub fn restore(&self, device: Device) -> Result<(Arc<dyn Module>, Adam), Error> {
        let model = self.restore_model(device)?;
        let mut opt = Adam::new(model.parameters(), AdamOptions::default())?;
        opt.load_state_dict(&self.optimizer_state)?;
        Ok((model, opt))
    }

    /// The model it holds, built on `device` and loaded.
    pub fn restore_model(&self, device: Device) -> Result<Arc<dyn Module>, Error> {
        let model = build_model(&self.spec, device)?;
        model.load_state_dict(&self.model_state)?;
        Ok(model)
    }
}

/// Writes a checkpoint of the model, the optimizer and the scaler of an `amp` run after
/// `epoch` epochs (Note [Train checkpoint]).
pub(super) fn save_checkpoint(
    path: &Path,
    (spec, vocab): (&ModelSpec, Option<&Vocab>),
    split: (u64, f64),
    epoch: usize,
    (model, opt, amp, scaler): (&dyn Module, &dyn Optimizer, Option<AmpDtype>, &GradScaler),
) -> Result<(), Error> {
    let mut state = StateDict::new()
        .with("format", FORMAT)
        .with("epoch", epoch)
        .with("arch", spec.kind().as_str())
        .with("seed", split.0)
        .with("val_fraction", split.1)
        .with("model", model.state_dict()?)
        .with("optimizer", opt.state_dict()?)
        .with("scaler", scaler.state_dict()?);
    if let Some(a) = amp {
        state.put("amp", a.as_str());
    }
    if let (Some(c), Some(v)) = (spec.gpt(), vocab) {
        state.put("gpt.n_layer", c.n_layer);
        state.put("gpt.n_head", c.n_head);
        state.put("gpt.d_model", c.d_model);
        state.put("gpt.block_size", c.block_size);
        state.put("gpt.vocab", v.to_metadata());
    }
    for device in rng_devices() {
        let st = default_generator(device).get_state();
        state.put(format!("rng.{device}.seed"), st.seed);
        state.put(format!("rng.{device}.offset"), st.offset);
    }
    ember_nn::io::save(&state, path)
}

fn rng_devices() -> Vec<Device> {
    let mut v = vec![Device::Cpu];
    v.extend((0..cuda::device_count()).map(Device::Cuda));
    v
}
