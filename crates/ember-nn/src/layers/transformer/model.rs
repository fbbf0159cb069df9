//! `torch.nn.Transformer`: an encoder stack and a decoder stack, each with its final norm.

use ember_tensor::Options;

use super::{
    DecoderMasks, EncoderMasks, LayerNorm, TransformerDecoder, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer, TransformerLayerConfig,
};
use crate::{Module, ModuleHooks, NnError, Result, Tensor, TrainingFlag, init};

/// The options of [`Transformer`], with PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerConfig {
    /// The width of every layer (`512`).
    pub d_model: usize,
    /// Attention heads (`8`).
    pub nhead: usize,
    /// Encoder layers (`6`).
    pub num_encoder_layers: usize,
    /// Decoder layers (`6`).
    pub num_decoder_layers: usize,
    /// Every layer's options (`dim_feedforward`, `dropout`, `activation`, `layer_norm_eps`,
    /// `batch_first`, `norm_first`, `bias`).
    pub layer: TransformerLayerConfig,
}

impl Default for TransformerConfig {
    fn default() -> Self {
        TransformerConfig {
            d_model: 512,
            nhead: 8,
            num_encoder_layers: 6,
            num_decoder_layers: 6,
            layer: TransformerLayerConfig::default(),
        }
    }
}

/// The masks of [`Transformer::forward_with`], PyTorch's keyword arguments (bool masks:
/// `true` is masked out).
#[derive(Clone, Debug, Default)]
pub struct TransformerMasks {
    /// `[S, S]` or `[N·nhead, S, S]`, the encoder's self-attention.
    pub src_mask: Option<Tensor>,
    /// `[T, T]` or `[N·nhead, T, T]`, the decoder's self-attention.
    pub tgt_mask: Option<Tensor>,
    /// `[T, S]` or `[N·nhead, T, S]`, the decoder's attention over the memory.
    pub memory_mask: Option<Tensor>,
    /// `[N, S]`.
    pub src_key_padding_mask: Option<Tensor>,
    /// `[N, T]`.
    pub tgt_key_padding_mask: Option<Tensor>,
    /// `[N, S]`.
    pub memory_key_padding_mask: Option<Tensor>,
    /// A hint that `src_mask` is the causal mask (detected when not given).
    pub src_is_causal: bool,
    /// A hint that `tgt_mask` is the causal mask (detected when not given).
    pub tgt_is_causal: bool,
    /// A hint that `memory_mask` is the causal mask.
    pub memory_is_causal: bool,
}

/// `torch.nn.Transformer(d_model, nhead, num_encoder_layers, num_decoder_layers,
/// dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias)`: a
/// [`TransformerEncoder`] of `num_encoder_layers` layers with a final [`LayerNorm`]
/// (`encoder`), and a [`TransformerDecoder`] of `num_decoder_layers` layers with its own
/// (`decoder`). Every weight of two or more dimensions starts Xavier-uniform, as PyTorch's
/// `_reset_parameters` does. Parameter names are PyTorch's (`encoder.layers.0.self_attn.
/// in_proj_weight`, `decoder.norm.bias`, ...), so its `state_dict` loads.
///
/// ```
/// use ember_nn::layers::{Transformer, TransformerConfig, TransformerLayerConfig, TransformerMasks,
///     generate_square_subsequent_mask};
/// use ember_nn::Tensor;
/// let layer = TransformerLayerConfig { dim_feedforward: 32, batch_first: true, ..Default::default() };
/// let cfg = TransformerConfig { d_model: 16, nhead: 4, num_encoder_layers: 2, num_decoder_layers: 2, layer };
/// let model = Transformer::with_config(cfg, ())?;
/// let (src, tgt) = (Tensor::randn([2, 7, 16], ())?, Tensor::randn([2, 5, 16], ())?);
/// let masks = TransformerMasks { tgt_mask: Some(generate_square_subsequent_mask(5, ())?), ..Default::default() };
/// assert_eq!(model.forward_with(&src, &tgt, &masks)?.dims(), [2, 5, 16]);
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
pub struct Transformer {
    /// The encoder stack and its final norm.
    pub encoder: TransformerEncoder,
    /// The decoder stack and its final norm.
    pub decoder: TransformerDecoder,
    #[module(skip)]
    config: TransformerConfig,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

fn invalid(msg: String) -> crate::Error {
    NnError::invalid("Transformer", msg).into()
}

impl Transformer {
    /// `Transformer()`: PyTorch's defaults (512 wide, 8 heads, 6 + 6 layers).
    pub fn new(opts: impl Into<Options>) -> Result<Self> {
        Self::with_config(TransformerConfig::default(), opts)
    }

    /// A transformer of `config`, its weights Xavier-uniform.
    pub fn with_config(config: TransformerConfig, opts: impl Into<Options>) -> Result<Self> {
        let o: Options = opts.into();
        let (d, h, l) = (config.d_model, config.nhead, &config.layer);
        let norm = || LayerNorm::with_bias(&[d], l.layer_norm_eps, true, l.bias, o);
        let enc_layer = TransformerEncoderLayer::with_config(d, h, *l, o)?;
        let dec_layer = TransformerDecoderLayer::with_config(d, h, *l, o)?;
        let m = Transformer {
            encoder: TransformerEncoder::new(&enc_layer, config.num_encoder_layers, Some(norm()?))?,
            decoder: TransformerDecoder::new(&dec_layer, config.num_decoder_layers, Some(norm()?))?,
            config,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        };
        for p in m.parameters() {
            if p.rank() > 1 {
                init::xavier_uniform_(&p, 1.0)?;
            }
        }
        Ok(m)
    }

    /// The options the model was built with.
    pub fn config(&self) -> TransformerConfig {
        self.config
    }

    /// PyTorch's `forward(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask,
    /// tgt_key_padding_mask, memory_key_padding_mask, src_is_causal, tgt_is_causal,
    /// memory_is_causal)`: `decoder(tgt, encoder(src))`, `[N, T, E]` out with `batch_first`
    /// (`[T, N, E]` without, `[T, E]` unbatched).
    pub fn forward_with(&self, src: &Tensor, tgt: &Tensor, m: &TransformerMasks) -> Result<Tensor> {
        let (s, t) = (src.dims(), tgt.dims());
        let batch = if self.config.layer.batch_first { 0 } else { 1 };
        if s.len() == 3 && t.len() == 3 && s[batch] != t[batch] {
            return Err(invalid(format!(
                "the batch number of src and tgt must be equal, found src {} and tgt {}",
                src.shape(),
                tgt.shape()
            )));
        }
        let d = self.config.d_model;
        if s.last() != Some(&d) || t.last() != Some(&d) {
            return Err(invalid(format!(
                "the feature number of src and tgt must be equal to d_model {d}, found src {} and \
                 tgt {}",
                src.shape(),
                tgt.shape()
            )));
        }
        let memory = self.encoder.forward_masked(
            src,
            &EncoderMasks {
                src_mask: m.src_mask.clone(),
                src_key_padding_mask: m.src_key_padding_mask.clone(),
                is_causal: m.src_is_causal,
            },
        )?;
        self.decoder.forward_with(
            tgt,
            &memory,
            &DecoderMasks {
                tgt_mask: m.tgt_mask.clone(),
                memory_mask: m.memory_mask.clone(),
                tgt_key_padding_mask: m.tgt_key_padding_mask.clone(),
                memory_key_padding_mask: m.memory_key_padding_mask.clone(),
                tgt_is_causal: m.tgt_is_causal,
                memory_is_causal: m.memory_is_causal,
            },
        )
    }
}

impl Module for Transformer {
    /// An error: the transformer takes a source and a target
    /// ([`forward_with`](Self::forward_with)).
    fn forward(&self, _src: &Tensor) -> Result<Tensor> {
        Err(invalid(
            "takes a source and a target: call forward_with(src, tgt, &TransformerMasks)".into(),
        ))
    }
}
