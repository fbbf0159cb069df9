//! `ember generate`: text sampled from a checkpoint of `ember train --model gpt`
//! (Note [Sampling]).
//!
//! Note [Sampling]: the prompt is encoded with the checkpoint's vocabulary (a character it
//! lacks is an error naming it); then, `max_new_tokens` times, the model reads the last
//! `block_size` tokens and the logits of the last position are copied to the host, divided by
//! the temperature, cut to the `top_k` largest (the others get probability 0), softmaxed,
//! and one token drawn with a SplitMix64 generator seeded by `--seed`, as nanoGPT's `sample`
//! does with `torch.multinomial`. Temperature 0 or `top_k` 1 takes the arg-max (greedy),
//! ties to the lowest id. The same checkpoint, prompt, options and seed give the same text.

use std::path::PathBuf;

use ember_device::Device;
use ember_nn::{Error, Module, NnError, Tensor};
use ember_tensor::DType;

use crate::train::text::Rng;
use crate::train::{ModelKind, read_checkpoint_for};

/// The settings of `ember generate`.
#[derive(Clone, Debug)]
pub struct GenerateConfig {
    /// A checkpoint written by `ember train --model gpt --save`.
    pub checkpoint: PathBuf,
    /// The text to continue.
    pub prompt: String,
    /// Characters to add.
    pub max_new_tokens: usize,
    /// Divides the logits; 0 is greedy.
    pub temperature: f64,
    /// Sample among the `k` most likely characters only; `None`: all.
    pub top_k: Option<usize>,
    /// Seeds the draws.
    pub seed: u64,
    /// Where the model runs.
    pub device: Device,
}

fn invalid(msg: String) -> Error {
    NnError::invalid("ember generate", msg).into()
}

/// The options' values and the checkpoint's path, checked before any work, each error
/// naming its option.
pub fn preflight(cfg: &GenerateConfig) -> Result<(), Error> {
    let p = &cfg.checkpoint;
    if !p.is_file() {
        let why = if p.exists() {
            "is not a file"
        } else {
            "no such file"
        };
        return Err(invalid(format!("--checkpoint {}: {why}", p.display())));
    }
    if !(cfg.temperature >= 0.0 && cfg.temperature.is_finite()) {
        return Err(invalid(format!(
            "expected a --temperature of at least 0, found {}",
            cfg.temperature
        )));
    }
    if cfg.top_k == Some(0) {
        return Err(invalid("expected a --top-k of at least 1, found 0".into()));
    }
    if cfg.prompt.is_empty() {
        return Err(invalid("--prompt must not be empty".into()));
    }
    Ok(())
}

/// The prompt followed by `max_new_tokens` sampled characters (Note [Sampling]).
pub fn generate(cfg: &GenerateConfig) -> Result<String, Error> {
    preflight(cfg)?;
    let ck = read_checkpoint_for(&cfg.checkpoint, "ember generate --checkpoint")?;
    let (Some(gpt), Some(vocab)) = (ck.spec.gpt(), ck.vocab.as_ref()) else {
        return Err(invalid(format!(
            "--checkpoint {} holds a {} model; generate needs one written by `ember train --model {} --save`",
            cfg.checkpoint.display(),
            ck.model.as_str(),
            ModelKind::Gpt.as_str()
        )));
    };
    let mut ids = vocab
        .encode(&cfg.prompt)
        .map_err(|e| invalid(format!("--prompt: {e}")))?;
    let model = ck.restore_model(cfg.device)?;
    model.eval();
    let _g = ember_autograd::no_grad();
    let mut rng = Rng::new(cfg.seed, &[]);
    let start = ids.len();
    for _ in 0..cfg.max_new_tokens {
        let ctx = &ids[ids.len().saturating_sub(gpt.block_size)..];
        let x = Tensor::from_slice(ctx, [1, ctx.len()], DType::I64)?.to(cfg.device)?;
        let logits = model
            .forward(&x)?
            .select(1, -1)?
            .to_dtype(DType::F32)?
            .to(Device::Cpu)?
            .to_vec::<f32>()?;
        ids.push(sample(&logits, cfg.temperature, cfg.top_k, &mut rng) as i64);
    }
    Ok(format!("{}{}", cfg.prompt, vocab.decode(&ids[start..])))
}

/// One id drawn from `logits` at `temperature` among the `top_k` largest (Note
/// [Sampling]).
pub fn sample(logits: &[f32], temperature: f64, top_k: Option<usize>, rng: &mut Rng) -> usize {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            )
            .0
    };
    if temperature == 0.0 || top_k == Some(1) || logits.is_empty() {
        return argmax();
    }
    let scaled: Vec<f64> = logits.iter().map(|&l| l as f64 / temperature).collect();
    let cut = match top_k.filter(|&k| k < scaled.len()) {
        Some(k) => {
            let mut sorted = scaled.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[k - 1]
        }
        None => f64::NEG_INFINITY,
    };
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled
        .iter()
        .map(|&s| if s >= cut { (s - max).exp() } else { 0.0 })
        .collect();
    let total: f64 = weights.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        return argmax();
    }
    let mut u = rng.unit() * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i;
        }
        u -= w;
    }
    weights.iter().rposition(|w| *w > 0.0).unwrap_or(0)
}
