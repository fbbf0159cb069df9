//! `TransformerEncoderLayer`, `TransformerDecoderLayer`, `TransformerEncoder`,
//! `TransformerDecoder`, `Transformer` (`torch.nn`'s, the last in `model.rs`), and
//! `generate_square_subsequent_mask`.

mod model;

use ember_tensor::{DType, Options, Tensor as Raw};

pub use model::{Transformer, TransformerConfig, TransformerMasks};

use super::{
    Dropout, LayerNorm, Linear, MhaForward, MultiheadAttention, MultiheadAttentionConfig,
    float_options,
};
use crate::module::prefix_error;
use crate::{Module, ModuleHooks, NnError, Replicate, Result, Tensor, TrainingFlag};

/// `Transformer.generate_square_subsequent_mask(sz, device, dtype)`: the `[sz, sz]` float
/// causal mask, `-inf` above the diagonal and 0 on and below it (`opts`: the dtype, f32 by
/// default, and the device).
///
/// ```
/// use ember_nn::layers::generate_square_subsequent_mask;
/// let m = generate_square_subsequent_mask(3, ())?;
/// let inf = f32::NEG_INFINITY;
/// assert_eq!(m.to_vec::<f32>()?, vec![0., inf, inf, 0., 0., inf, 0., 0., 0.]);
/// # Ok::<(), ember_nn::Error>(())
/// ```
pub fn generate_square_subsequent_mask(sz: usize, opts: impl Into<Options>) -> Result<Tensor> {
    let (dtype, device) = float_options("generate_square_subsequent_mask", opts)?;
    Raw::full([sz, sz], f64::NEG_INFINITY, (device, dtype))?.triu(1)
}

/// PyTorch's `_detect_is_causal_mask`: whether `mask` is the `[sz, sz]` causal mask of its
/// dtype (float: [`generate_square_subsequent_mask`]'s `-inf` above the diagonal and 0
/// elsewhere; bool: `true` above the diagonal). [`TransformerEncoder`] and
/// [`TransformerDecoder`] then pass `is_causal` to their layers, so that attention runs its
/// causal kernel (which skips the masked tiles) instead of reading the mask; the result is
/// the same either way. Another shape or dtype is `false`.
///
/// ```
/// use ember_nn::layers::{generate_square_subsequent_mask, is_causal_mask};
/// let m = generate_square_subsequent_mask(4, ())?;
/// assert!(is_causal_mask(&m, 4)?);
/// assert!(!is_causal_mask(&m, 3)?);
/// assert!(!is_causal_mask(&m.transpose(0, 1)?, 4)?);
/// # Ok::<(), ember_nn::Error>(())
/// ```
pub fn is_causal_mask(mask: &Tensor, sz: usize) -> Result<bool> {
    if mask.dims() != [sz, sz] {
        return Ok(false);
    }
    let (dtype, device) = (mask.dtype(), mask.device());
    let causal = if dtype == DType::Bool {
        Raw::ones([sz, sz], (device, dtype))?.triu(1)?
    } else if dtype.is_float() {
        generate_square_subsequent_mask(sz, (device, dtype))?
    } else {
        return Ok(false);
    };
    mask.equal(&causal)
}

/// The `is_causal` a stack passes to its layers: the hint when given, else whether `mask`
/// is the causal mask of `x`'s sequence length ([`is_causal_mask`]).
fn causal_hint(mask: &Option<Tensor>, given: bool, x: &Tensor, batch_first: bool) -> Result<bool> {
    match mask {
        Some(m) if !given => is_causal_mask(m, seq_len(x, batch_first)),
        _ => Ok(given),
    }
}

/// The sequence length of a transformer input (PyTorch's `_get_seq_len`): dim 0 of an
/// unbatched `[S, E]` input, else dim 1 with `batch_first` and dim 0 without.
fn seq_len(src: &Tensor, batch_first: bool) -> usize {
    let d = src.dims();
    match (d.len(), batch_first) {
        (3, true) => d[1],
        _ => d.first().copied().unwrap_or(0),
    }
}

/// The activation of a transformer layer's feed-forward block (PyTorch's `activation=`
/// `"relu"` or `"gelu"`, the exact GELU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// `F.relu` (the default).
    #[default]
    Relu,
    /// `F.gelu`, exact.
    Gelu,
}

impl Activation {
    fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(()),
        }
    }
}

/// The options of [`TransformerEncoderLayer`] and [`TransformerDecoderLayer`] beyond
/// `d_model` and `nhead`, with PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerLayerConfig {
    /// The feed-forward block's hidden width (`2048`).
    pub dim_feedforward: usize,
    /// Dropout probability, in attention and after each block (`0.1`).
    pub dropout: f64,
    /// The feed-forward activation (`Relu`).
    pub activation: Activation,
    /// The layer norms' `eps` (`1e-5`).
    pub layer_norm_eps: f64,
    /// Inputs are `[batch, seq, feature]` (`false`: `[seq, batch, feature]`).
    pub batch_first: bool,
    /// Layer norm before each block rather than after the residual sum (`false`).
    pub norm_first: bool,
    /// Whether the linear layers and layer norms have biases (`true`).
    pub bias: bool,
}

impl Default for TransformerLayerConfig {
    fn default() -> Self {
        TransformerLayerConfig {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
        }
    }
}

impl TransformerLayerConfig {
    fn attention(&self) -> MultiheadAttentionConfig {
        MultiheadAttentionConfig {
            dropout: self.dropout,
            bias: self.bias,
            batch_first: self.batch_first,
            ..Default::default()
        }
    }
}

/// The masks of [`TransformerEncoderLayer::forward_masked`] and
/// [`TransformerEncoder::forward_masked`]: PyTorch's `src_mask`, `src_key_padding_mask`,
/// `is_causal` (bool masks: `true` is masked out, as in [`MultiheadAttention`]).
#[derive(Clone, Debug, Default)]
pub struct EncoderMasks {
    /// `[S, S]` or `[N·nhead, S, S]`.
    pub src_mask: Option<Tensor>,
    /// `[N, S]`.
    pub src_key_padding_mask: Option<Tensor>,
    /// A hint that `src_mask` is the causal mask.
    pub is_causal: bool,
}

/// The masks of [`TransformerDecoderLayer::forward_with`] and
/// [`TransformerDecoder::forward_with`], PyTorch's keyword arguments.
#[derive(Clone, Debug, Default)]
pub struct DecoderMasks {
    /// `[T, T]` or `[N·nhead, T, T]`, for the self-attention.
    pub tgt_mask: Option<Tensor>,
    /// `[T, S]` or `[N·nhead, T, S]`, for the attention over the memory.
    pub memory_mask: Option<Tensor>,
    /// `[N, T]`.
    pub tgt_key_padding_mask: Option<Tensor>,
    /// `[N, S]`.
    pub memory_key_padding_mask: Option<Tensor>,
    /// A hint that `tgt_mask` is the causal mask.
    pub tgt_is_causal: bool,
    /// A hint that `memory_mask` is the causal mask.
    pub memory_is_causal: bool,
}

fn check_dropout(op: &'static str, p: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        return Err(NnError::invalid(
            op,
            format!("dropout probability has to be between 0 and 1, but got {p}"),
        )
        .into());
    }
    Ok(())
}

/// `attn(x, mem, mem, attn_mask, key_padding_mask, need_weights=False, is_causal)[0]`.
fn attend(
    attn: &MultiheadAttention,
    x: &Tensor,
    mem: &Tensor,
    attn_mask: &Option<Tensor>,
    key_padding_mask: &Option<Tensor>,
    is_causal: bool,
) -> Result<Tensor> {
    let o = MhaForward {
        key_padding_mask: key_padding_mask.clone(),
        need_weights: false,
        attn_mask: attn_mask.clone(),
        average_attn_weights: true,
        is_causal,
    };
    Ok(attn.forward_qkv(x, mem, mem, &o)?.0)
}

/// Self-attention and a feed-forward block, each with a residual connection and a layer
/// norm (`torch.nn.TransformerEncoderLayer`): `norm_first` false,
/// `x = norm1(x + sa(x)); x = norm2(x + ff(x))`; true,
/// `x = x + sa(norm1(x)); x = x + ff(norm2(x))`, where `ff(x) =
/// linear2(dropout(activation(linear1(x))))`.
///
/// Submodules under PyTorch's names (`self_attn`, `linear1`, `dropout`, `linear2`, `norm1`,
/// `norm2`, `dropout1`, `dropout2`), so a PyTorch `state_dict` loads.
///
/// ```
/// use ember_nn::layers::{TransformerEncoderLayer, TransformerLayerConfig};
/// use ember_nn::{Module, Tensor};
/// let cfg = TransformerLayerConfig { dim_feedforward: 16, batch_first: true, ..Default::default() };
/// let layer = TransformerEncoderLayer::with_config(8, 2, cfg, ())?;
/// assert_eq!(layer.call(&Tensor::randn([2, 5, 8], ())?)?.dims(), [2, 5, 8]);
/// assert!(layer.state_dict()?.contains_key("self_attn.in_proj_weight"));
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
pub struct TransformerEncoderLayer {
    /// The self-attention.
    pub self_attn: MultiheadAttention,
    /// `d_model -> dim_feedforward`.
    pub linear1: Linear,
    /// Dropout inside the feed-forward block.
    pub dropout: Dropout,
    /// `dim_feedforward -> d_model`.
    pub linear2: Linear,
    /// The norm of the attention block.
    pub norm1: LayerNorm,
    /// The norm of the feed-forward block.
    pub norm2: LayerNorm,
    /// Dropout after the attention.
    pub dropout1: Dropout,
    /// Dropout after the feed-forward block.
    pub dropout2: Dropout,
    #[module(skip)]
    config: TransformerLayerConfig,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl TransformerEncoderLayer {
    /// `TransformerEncoderLayer(d_model, nhead)`, PyTorch's defaults.
    pub fn new(d_model: usize, nhead: usize, opts: impl Into<Options>) -> Result<Self> {
        Self::with_config(d_model, nhead, TransformerLayerConfig::default(), opts)
    }

    /// `TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
    /// layer_norm_eps, batch_first, norm_first, bias)`.
    pub fn with_config(
        d_model: usize,
        nhead: usize,
        config: TransformerLayerConfig,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let o: Options = opts.into();
        check_dropout("TransformerEncoderLayer", config.dropout)?;
        let c = &config;
        let norm = || LayerNorm::with_bias(&[d_model], c.layer_norm_eps, true, c.bias, o);
        Ok(TransformerEncoderLayer {
            self_attn: MultiheadAttention::with_config(d_model, nhead, c.attention(), o)?,
            linear1: Linear::with_bias(d_model, c.dim_feedforward, c.bias, o)?,
            dropout: Dropout::new(c.dropout)?,
            linear2: Linear::with_bias(c.dim_feedforward, d_model, c.bias, o)?,
            norm1: norm()?,
            norm2: norm()?,
            dropout1: Dropout::new(c.dropout)?,
            dropout2: Dropout::new(c.dropout)?,
            config,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }

    /// The options the layer was built with.
    pub fn config(&self) -> TransformerLayerConfig {
        self.config
    }

    /// PyTorch's `forward(src, src_mask, src_key_padding_mask, is_causal)`.
    pub fn forward_masked(&self, src: &Tensor, masks: &EncoderMasks) -> Result<Tensor> {
        let sa = |x: &Tensor| -> Result<Tensor> {
            let y = attend(
                &self.self_attn,
                x,
                x,
                &masks.src_mask,
                &masks.src_key_padding_mask,
                masks.is_causal,
            )
            .map_err(|e| prefix_error("self_attn", e))?;
            self.dropout1.call(&y)
        };
        let ff = |x: &Tensor| -> Result<Tensor> {
            let h = self.config.activation.apply(&self.linear1.call(x)?)?;
            self.dropout2
                .call(&self.linear2.call(&self.dropout.call(&h)?)?)
        };
        let x = src;
        if self.config.norm_first {
            let x = x.add(&sa(&self.norm1.call(x)?)?)?;
            x.add(&ff(&self.norm2.call(&x)?)?)
        } else {
            let x = self.norm1.call(&x.add(&sa(x)?)?)?;
            self.norm2.call(&x.add(&ff(&x)?)?)
        }
    }
}

impl Module for TransformerEncoderLayer {
    /// `layer(src)`: without masks.
    fn forward(&self, src: &Tensor) -> Result<Tensor> {
        self.forward_masked(src, &EncoderMasks::default())
    }
}

/// Self-attention, attention over the encoder's output (`memory`) and a feed-forward
/// block, each with a residual connection and a layer norm
/// (`torch.nn.TransformerDecoderLayer`); `norm_first` as in [`TransformerEncoderLayer`].
///
/// Submodules under PyTorch's names (`self_attn`, `multihead_attn`, `linear1`, `dropout`,
/// `linear2`, `norm1`, `norm2`, `norm3`, `dropout1`, `dropout2`, `dropout3`). It takes two
/// inputs, so it runs through [`forward_with`](Self::forward_with); [`Module::forward`]
/// is an error.
///
/// ```
/// use ember_nn::layers::{DecoderMasks, TransformerDecoderLayer, TransformerLayerConfig};
/// use ember_nn::Tensor;
/// let cfg = TransformerLayerConfig { dim_feedforward: 16, ..Default::default() };
/// let layer = TransformerDecoderLayer::with_config(8, 2, cfg, ())?;
/// let (tgt, memory) = (Tensor::randn([4, 2, 8], ())?, Tensor::randn([6, 2, 8], ())?);
/// let y = layer.forward_with(&tgt, &memory, &DecoderMasks::default())?;
/// assert_eq!(y.dims(), [4, 2, 8]);
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
pub struct TransformerDecoderLayer {
    /// The self-attention over the target.
    pub self_attn: MultiheadAttention,
    /// The attention from the target to the memory.
    pub multihead_attn: MultiheadAttention,
    /// `d_model -> dim_feedforward`.
    pub linear1: Linear,
    /// Dropout inside the feed-forward block.
    pub dropout: Dropout,
    /// `dim_feedforward -> d_model`.
    pub linear2: Linear,
    /// The norm of the self-attention block.
    pub norm1: LayerNorm,
    /// The norm of the memory-attention block.
    pub norm2: LayerNorm,
    /// The norm of the feed-forward block.
    pub norm3: LayerNorm,
    /// Dropout after the self-attention.
    pub dropout1: Dropout,
    /// Dropout after the memory attention.
    pub dropout2: Dropout,
    /// Dropout after the feed-forward block.
    pub dropout3: Dropout,
    #[module(skip)]
    config: TransformerLayerConfig,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl TransformerDecoderLayer {
    /// `TransformerDecoderLayer(d_model, nhead)`, PyTorch's defaults.
    pub fn new(d_model: usize, nhead: usize, opts: impl Into<Options>) -> Result<Self> {
        Self::with_config(d_model, nhead, TransformerLayerConfig::default(), opts)
    }

    /// `TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
    /// layer_norm_eps, batch_first, norm_first, bias)`.
    pub fn with_config(
        d_model: usize,
        nhead: usize,
        config: TransformerLayerConfig,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let o: Options = opts.into();
        check_dropout("TransformerDecoderLayer", config.dropout)?;
        let c = &config;
        let norm = || LayerNorm::with_bias(&[d_model], c.layer_norm_eps, true, c.bias, o);
        Ok(TransformerDecoderLayer {
            self_attn: MultiheadAttention::with_config(d_model, nhead, c.attention(), o)?,
            multihead_attn: MultiheadAttention::with_config(d_model, nhead, c.attention(), o)?,
            linear1: Linear::with_bias(d_model, c.dim_feedforward, c.bias, o)?,
            dropout: Dropout::new(c.dropout)?,
            linear2: Linear::with_bias(c.dim_feedforward, d_model, c.bias, o)?,
            norm1: norm()?,
            norm2: norm()?,
            norm3: norm()?,
            dropout1: Dropout::new(c.dropout)?,
            dropout2: Dropout::new(c.dropout)?,
            dropout3: Dropout::new(c.dropout)?,
            config,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }

    /// The options the layer was built with.
    pub fn config(&self) -> TransformerLayerConfig {
        self.config
    }

    /// PyTorch's `forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
    /// memory_key_padding_mask, tgt_is_causal, memory_is_causal)`.
    pub fn forward_with(&self, tgt: &Tensor, memory: &Tensor, m: &DecoderMasks) -> Result<Tensor> {
        let sa = |x: &Tensor| -> Result<Tensor> {
            let y = attend(
                &self.self_attn,
                x,
                x,
                &m.tgt_mask,
                &m.tgt_key_padding_mask,
                m.tgt_is_causal,
            )
            .map_err(|e| prefix_error("self_attn", e))?;
            self.dropout1.call(&y)
        };
        let mha = |x: &Tensor| -> Result<Tensor> {
            let y = attend(
                &self.multihead_attn,
                x,
                memory,
                &m.memory_mask,
                &m.memory_key_padding_mask,
                m.memory_is_causal,
            )
            .map_err(|e| prefix_error("multihead_attn", e))?;
            self.dropout2.call(&y)
        };
        let ff = |x: &Tensor| -> Result<Tensor> {
            let h = self.config.activation.apply(&self.linear1.call(x)?)?;
            self.dropout3
                .call(&self.linear2.call(&self.dropout.call(&h)?)?)
        };
        let x = tgt;
        if self.config.norm_first {
            let x = x.add(&sa(&self.norm1.call(x)?)?)?;
            let x = x.add(&mha(&self.norm2.call(&x)?)?)?;
            x.add(&ff(&self.norm3.call(&x)?)?)
        } else {
            let x = self.norm1.call(&x.add(&sa(x)?)?)?;
            let x = self.norm2.call(&x.add(&mha(&x)?)?)?;
            self.norm3.call(&x.add(&ff(&x)?)?)
        }
    }
}

fn needs_memory(name: &'static str) -> crate::Error {
    NnError::invalid(
        name,
        "takes a target and a memory: call forward_with(tgt, memory, &DecoderMasks)",
    )
    .into()
}

impl Module for TransformerDecoderLayer {
    /// An error: the layer needs a memory too ([`forward_with`](Self::forward_with)).
    fn forward(&self, _tgt: &Tensor) -> Result<Tensor> {
        Err(needs_memory("TransformerDecoderLayer"))
    }
}

/// `num_layers` copies of an encoder layer, run in turn, then an optional norm
/// (`torch.nn.TransformerEncoder(encoder_layer, num_layers, norm)`). The layers are deep
/// copies of `encoder_layer` ([`Replicate`], PyTorch's `_get_clones`): the same initial
/// values, separate parameters, named `layers.0.…`, `layers.1.…`; the norm is `norm.…`.
///
/// ```
/// use ember_nn::layers::{TransformerEncoder, TransformerEncoderLayer, TransformerLayerConfig};
/// use ember_nn::{Module, Tensor};
/// let cfg = TransformerLayerConfig { dim_feedforward: 16, ..Default::default() };
/// let layer = TransformerEncoderLayer::with_config(8, 2, cfg, ())?;
/// let enc = TransformerEncoder::new(&layer, 2, None)?;
/// assert_eq!(enc.call(&Tensor::randn([5, 2, 8], ())?)?.dims(), [5, 2, 8]);
/// assert!(enc.state_dict()?.contains_key("layers.1.linear2.bias"));
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
pub struct TransformerEncoder {
    /// The layers (PyTorch's `ModuleList` `layers`).
    pub layers: Vec<TransformerEncoderLayer>,
    /// The final norm, if any.
    pub norm: Option<LayerNorm>,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl TransformerEncoder {
    /// `TransformerEncoder(encoder_layer, num_layers, norm)`.
    pub fn new(
        encoder_layer: &TransformerEncoderLayer,
        num_layers: usize,
        norm: Option<LayerNorm>,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|_| encoder_layer.replicate())
            .collect::<Result<Vec<_>>>()?;
        Ok(TransformerEncoder {
            layers,
            norm,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }

    /// PyTorch's `forward(src, mask, src_key_padding_mask, is_causal)`.
    /// A `src_mask` that is the causal mask sets `is_causal` ([`is_causal_mask`]).
    pub fn forward_masked(&self, src: &Tensor, masks: &EncoderMasks) -> Result<Tensor> {
        let batch_first = self.layers.first().is_some_and(|l| l.config.batch_first);
        let mut masks = masks.clone();
        masks.is_causal = causal_hint(&masks.src_mask, masks.is_causal, src, batch_first)?;
        let mut x = src.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer
                .forward_masked(&x, &masks)
                .map_err(|e| prefix_error(&format!("layers.{i}"), e))?;
        }
        match &self.norm {
            Some(n) => n.call(&x),
            None => Ok(x),
        }
    }
}

impl Module for TransformerEncoder {
    /// `encoder(src)`: without masks.
    fn forward(&self, src: &Tensor) -> Result<Tensor> {
        self.forward_masked(src, &EncoderMasks::default())
    }
}

/// `num_layers` copies of a decoder layer, run in turn over one memory, then an optional
/// norm (`torch.nn.TransformerDecoder(decoder_layer, num_layers, norm)`); the layers are
/// deep copies, as in [`TransformerEncoder`].
#[derive(Debug, Module)]
pub struct TransformerDecoder {
    /// The layers (PyTorch's `ModuleList` `layers`).
    pub layers: Vec<TransformerDecoderLayer>,
    /// The final norm, if any.
    pub norm: Option<LayerNorm>,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl TransformerDecoder {
    /// `TransformerDecoder(decoder_layer, num_layers, norm)`.
    pub fn new(
        decoder_layer: &TransformerDecoderLayer,
        num_layers: usize,
        norm: Option<LayerNorm>,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|_| decoder_layer.replicate())
            .collect::<Result<Vec<_>>>()?;
        Ok(TransformerDecoder {
            layers,
            norm,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }

    /// PyTorch's `forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
    /// memory_key_padding_mask, tgt_is_causal, memory_is_causal)`. A `tgt_mask` that is the
    /// causal mask sets `tgt_is_causal` ([`is_causal_mask`]).
    pub fn forward_with(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
    ) -> Result<Tensor> {
        let batch_first = self.layers.first().is_some_and(|l| l.config.batch_first);
        let mut masks = masks.clone();
        masks.tgt_is_causal = causal_hint(&masks.tgt_mask, masks.tgt_is_causal, tgt, batch_first)?;
        let mut x = tgt.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer
                .forward_with(&x, memory, &masks)
                .map_err(|e| prefix_error(&format!("layers.{i}"), e))?;
        }
        match &self.norm {
            Some(n) => n.call(&x),
            None => Ok(x),
        }
    }
}

impl Module for TransformerDecoder {
    /// An error: the decoder needs a memory too ([`forward_with`](Self::forward_with)).
    fn forward(&self, _tgt: &Tensor) -> Result<Tensor> {
        Err(needs_memory("TransformerDecoder"))
    }
}
