//! The GPT of `ember train --model gpt`: a small decoder-only transformer over characters,
//! written as nanoGPT writes it (Note [The GPT]).
//!
//! Note [The GPT]: a token embedding `wte` and a learned position embedding `wpe`, summed;
//! `n_layer` pre-norm blocks `h.0`, `h.1`, ... (`x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`,
//! the attention causal with `n_head` heads over one `c_attn` projection to q, k and v and a
//! `c_proj` back, the MLP `c_fc` to `4·d_model`, GELU, `c_proj` back); a final LayerNorm
//! `ln_f`; and the output head tied to the token embedding: `logits = x · wteᵀ`, so there is
//! no separate head weight (nanoGPT's `lm_head.weight` *is* `transformer.wte.weight`; here
//! the head is not a module at all, and `state_dict()` holds `wte.weight` once). Weights
//! start as nanoGPT's: `N(0, 0.02)` for the embeddings and linear weights, `N(0, 0.02 /
//! sqrt(2·n_layer))` for the projections back into the residual stream, biases at 0. No
//! dropout.

use ember_device::Device;
use ember_nn::functional::{self as F, SdpaOptions};
use ember_nn::layers::{Embedding, GELU, LayerNorm, Linear};
use ember_nn::{Error, Module, ModuleHooks, NnError, Tensor, TrainingFlag, init};
use ember_tensor::DType;

/// The hyper-parameters of a [`Gpt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The longest context (positions of `wpe`).
    pub block_size: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// Width of the residual stream.
    pub d_model: usize,
}

impl GptConfig {
    /// An error naming the option whose value cannot build a model.
    pub fn check(&self) -> Result<(), String> {
        let fields = [
            ("--block-size", self.block_size),
            ("--n-layer", self.n_layer),
            ("--n-head", self.n_head),
            ("--d-model", self.d_model),
        ];
        if let Some((name, v)) = fields.iter().find(|(_, v)| *v == 0) {
            return Err(format!("expected {name} of at least 1, found {v}"));
        }
        if !self.d_model.is_multiple_of(self.n_head) {
            return Err(format!(
                "--d-model {} must be a multiple of --n-head {}",
                self.d_model, self.n_head
            ));
        }
        if self.vocab_size == 0 {
            return Err("the vocabulary is empty".to_string());
        }
        Ok(())
    }
}

fn invalid(msg: String) -> Error {
    NnError::invalid("gpt", msg).into()
}

/// Causal self-attention: `c_attn` to q, k, v; `n_head` heads; `c_proj` back.
#[derive(Debug, Module)]
pub struct CausalSelfAttention {
    /// `d_model → 3·d_model`.
    pub c_attn: Linear,
    /// `d_model → d_model`.
    pub c_proj: Linear,
    n_head: usize,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        let d = x.dims();
        let (b, t, c) = (d[0], d[1], d[2]);
        let qkv = self.c_attn.call(x)?.split(c, 2)?;
        let heads = |z: &Tensor| -> Result<Tensor, Error> {
            z.reshape([b, t, self.n_head, c / self.n_head])?
                .transpose(1, 2)
        };
        let causal = SdpaOptions {
            is_causal: true,
            ..Default::default()
        };
        let y = F::scaled_dot_product_attention(
            &heads(&qkv[0])?,
            &heads(&qkv[1])?,
            &heads(&qkv[2])?,
            &causal,
        )?;
        self.c_proj.call(&y.transpose(1, 2)?.reshape([b, t, c])?)
    }
}

/// The block's MLP: `c_fc` to `4·d_model`, GELU, `c_proj` back.
#[derive(Debug, Module)]
pub struct Mlp {
    /// `d_model → 4·d_model`.
    pub c_fc: Linear,
    /// The exact GELU.
    pub gelu: GELU,
    /// `4·d_model → d_model`.
    pub c_proj: Linear,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        self.c_proj.call(&self.gelu.call(&self.c_fc.call(x)?)?)
    }
}

/// One pre-norm transformer block.
#[derive(Debug, Module)]
pub struct Block {
    /// Before the attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Before the MLP.
    pub ln_2: LayerNorm,
    /// The MLP.
    pub mlp: Mlp,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        let x = x.add(&self.attn.call(&self.ln_1.call(x)?)?)?;
        x.add(&self.mlp.call(&self.ln_2.call(&x)?)?)
    }
}

/// The GPT (Note [The GPT]): token ids `[B, T]` (i64, `T ≤ block_size`) in, logits
/// `[B, T, vocab_size]` out.
#[derive(Debug, Module)]
#[module(name = "GPT")]
pub struct Gpt {
    /// Token embedding, `[vocab_size, d_model]`; also the output head.
    pub wte: Embedding,
    /// Position embedding, `[block_size, d_model]`.
    pub wpe: Embedding,
    /// The blocks.
    pub h: Vec<Block>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
    #[module(skip)]
    config: GptConfig,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

/// A linear layer with nanoGPT's initialisation: weight `N(0, std)`, bias 0.
fn linear(i: usize, o: usize, std: f64) -> Result<Linear, Error> {
    let l = Linear::new(i, o, ())?;
    init::normal_(&l.weight, 0.0, std)?;
    if let Some(b) = &l.bias {
        init::zeros_(b)?;
    }
    Ok(l)
}

fn block(cfg: &GptConfig) -> Result<Block, Error> {
    let c = cfg.d_model;
    let proj_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
    Ok(Block {
        ln_1: LayerNorm::new(&[c], ())?,
        attn: CausalSelfAttention {
            c_attn: linear(c, 3 * c, 0.02)?,
            c_proj: linear(c, c, proj_std)?,
            n_head: cfg.n_head,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        },
        ln_2: LayerNorm::new(&[c], ())?,
        mlp: Mlp {
            c_fc: linear(c, 4 * c, 0.02)?,
            gelu: GELU::new(()),
            c_proj: linear(4 * c, c, proj_std)?,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        },
        training: TrainingFlag::default(),
        hooks: ModuleHooks::default(),
    })
}

impl Gpt {
    /// A GPT of `cfg` on `device`, initialised from the seeded CPU generator, then moved.
    pub fn new(cfg: GptConfig, device: Device) -> Result<Gpt, Error> {
        cfg.check().map_err(invalid)?;
        let wte = Embedding::new(cfg.vocab_size, cfg.d_model, ())?;
        let wpe = Embedding::new(cfg.block_size, cfg.d_model, ())?;
        init::normal_(&wte.weight, 0.0, 0.02)?;
        init::normal_(&wpe.weight, 0.0, 0.02)?;
        let h = (0..cfg.n_layer)
            .map(|_| block(&cfg))
            .collect::<Result<Vec<_>, Error>>()?;
        let m = Gpt {
            wte,
            wpe,
            h,
            ln_f: LayerNorm::new(&[cfg.d_model], ())?,
            config: cfg,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        };
        m.to(device)?;
        Ok(m)
    }

    /// Its hyper-parameters.
    pub fn config(&self) -> GptConfig {
        self.config
    }
}

impl Module for Gpt {
    fn forward(&self, idx: &Tensor) -> Result<Tensor, Error> {
        let d = idx.dims();
        if d.len() != 2 || d[1] == 0 || d[1] > self.config.block_size {
            return Err(invalid(format!(
                "expected token ids [batch, T] with 1 ≤ T ≤ block_size {}, found {}",
                self.config.block_size,
                idx.shape()
            )));
        }
        let pos = Tensor::arange(0i64, d[1] as i64, (idx.device(), DType::I64))?;
        let mut x = self.wte.call(idx)?.add(&self.wpe.call(&pos)?)?;
        for b in &self.h {
            x = b.call(&x)?;
        }
        // The head tied to the token embedding: logits = x · wteᵀ.
        F::linear(&self.ln_f.call(&x)?, &self.wte.weight, None)
    }
    fn extra_repr(&self) -> String {
        let c = &self.config;
        format!(
            "vocab_size={}, block_size={}, n_layer={}, n_head={}, d_model={}",
            c.vocab_size, c.block_size, c.n_layer, c.n_head, c.d_model
        )
    }
}
