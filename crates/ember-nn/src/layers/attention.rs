//! `MultiheadAttention` (`torch.nn.MultiheadAttention`), after PyTorch's
//! `F.multi_head_attention_forward`: projections, per-head attention (the fused
//! `scaled_dot_product_attention` when no weights are asked for, explicit softmax weights
//! otherwise), the output projection.

use ember_tensor::{DType, Options, SdpaOptions, Tensor as Raw};

use super::{Linear, float_options};
use crate::functional as F;
use crate::init;
use crate::module::{check_device, parameter};
use crate::{Module, ModuleHooks, NnError, Result, Tensor, TrainingFlag};

const NAME: &str = "MultiheadAttention";

fn invalid(msg: impl Into<String>) -> crate::Error {
    NnError::invalid(NAME, msg).into()
}

/// A shape as PyTorch prints `torch.Size`: `torch.Size([2, 3])`.
fn torch_size(dims: &[usize]) -> String {
    let d: Vec<String> = dims.iter().map(usize::to_string).collect();
    format!("torch.Size([{}])", d.join(", "))
}

/// A shape as a Python tuple: `(2, 3)`.
fn py_tuple(dims: &[usize]) -> String {
    let d: Vec<String> = dims.iter().map(usize::to_string).collect();
    format!("({})", d.join(", "))
}

/// [`MultiheadAttention`]'s constructor options beyond `embed_dim` and `num_heads`, with
/// PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MultiheadAttentionConfig {
    /// Dropout probability on the attention weights in training (`0.0`).
    pub dropout: f64,
    /// Whether the input and output projections have biases (`true`).
    pub bias: bool,
    /// PyTorch's `add_bias_kv` (`false`); `true` is refused (not implemented).
    pub add_bias_kv: bool,
    /// PyTorch's `add_zero_attn` (`false`); `true` is refused (not implemented).
    pub add_zero_attn: bool,
    /// Features of the keys (`None`: `embed_dim`).
    pub kdim: Option<usize>,
    /// Features of the values (`None`: `embed_dim`).
    pub vdim: Option<usize>,
    /// Inputs and outputs are `[batch, seq, feature]` rather than `[seq, batch, feature]`
    /// (`false`).
    pub batch_first: bool,
}

impl Default for MultiheadAttentionConfig {
    fn default() -> Self {
        MultiheadAttentionConfig {
            dropout: 0.0,
            bias: true,
            add_bias_kv: false,
            add_zero_attn: false,
            kdim: None,
            vdim: None,
            batch_first: false,
        }
    }
}

/// The keyword arguments of [`MultiheadAttention::forward_qkv`], PyTorch's
/// `forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
/// average_attn_weights=True, is_causal=False)`, with its defaults.
///
/// Bool masks follow PyTorch's `MultiheadAttention` convention: `true` is masked out (the
/// opposite of [`SdpaOptions::attn_mask`], where `true` takes part). Float masks are added
/// to the scores.
#[derive(Clone, Debug)]
pub struct MhaForward {
    /// `[N, S]` (`[S]` for unbatched inputs): keys to ignore, per batch element.
    pub key_padding_mask: Option<Tensor>,
    /// Whether to return the attention weights (`true`); `false` runs the fused
    /// `scaled_dot_product_attention`.
    pub need_weights: bool,
    /// `[L, S]` or `[N·num_heads, L, S]`: positions each query may not attend to.
    pub attn_mask: Option<Tensor>,
    /// Whether the returned weights are averaged over the heads (`[N, L, S]`) rather than
    /// per head (`[N, num_heads, L, S]`) (`true`).
    pub average_attn_weights: bool,
    /// A hint that `attn_mask` is the causal mask (`false`); it needs `attn_mask`, as in
    /// PyTorch, and lets the fused path apply the causal mask itself.
    pub is_causal: bool,
}

impl Default for MhaForward {
    fn default() -> Self {
        MhaForward {
            key_padding_mask: None,
            need_weights: true,
            attn_mask: None,
            average_attn_weights: true,
            is_causal: false,
        }
    }
}

/// Attention over `num_heads` heads with learned projections (`torch.nn.MultiheadAttention`):
/// `out_proj(concat_h(softmax(q_h k_hᵀ / √head_dim + mask) v_h))`, `q_h`, `k_h`, `v_h` the
/// heads of the projected query, key and value.
///
/// Parameters under PyTorch's names, so a PyTorch `state_dict` loads: `in_proj_weight`
/// `[3·embed_dim, embed_dim]` when `kdim == vdim == embed_dim`, else `q_proj_weight`,
/// `k_proj_weight`, `v_proj_weight`; `in_proj_bias` `[3·embed_dim]`; `out_proj.weight`,
/// `out_proj.bias`. Initialised as PyTorch: Xavier-uniform input projections, zero biases.
///
/// [`forward_qkv`](Self::forward_qkv) is PyTorch's `forward(query, key, value, ...)`,
/// returning the output and, when `need_weights`, the weights. [`Module::forward`] (and
/// `call`) is self-attention without masks: `mha(x, x, x, need_weights=False)[0]`.
///
/// ```
/// use ember_nn::layers::{MhaForward, MultiheadAttention};
/// use ember_nn::Tensor;
/// let mha = MultiheadAttention::new(8, 2, ())?;
/// let x = Tensor::randn([5, 3, 8], ())?; // [L, N, E]
/// let (out, w) = mha.forward_qkv(&x, &x, &x, &MhaForward::default())?;
/// assert_eq!(out.dims(), [5, 3, 8]);
/// assert_eq!(w.map(|w| w.dims()), Some(vec![3, 5, 5]));
/// let e = MultiheadAttention::new(8, 3, ()).unwrap_err().to_string();
/// assert!(e.contains("embed_dim must be divisible by num_heads"), "{e}");
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
pub struct MultiheadAttention {
    /// `[3·embed_dim, embed_dim]`: the query, key and value projections stacked, when
    /// `kdim == vdim == embed_dim`.
    #[param]
    pub in_proj_weight: Option<Tensor>,
    /// `[embed_dim, embed_dim]`, when `kdim` or `vdim` differs from `embed_dim`.
    #[param]
    pub q_proj_weight: Option<Tensor>,
    /// `[embed_dim, kdim]`, when `kdim` or `vdim` differs from `embed_dim`.
    #[param]
    pub k_proj_weight: Option<Tensor>,
    /// `[embed_dim, vdim]`, when `kdim` or `vdim` differs from `embed_dim`.
    #[param]
    pub v_proj_weight: Option<Tensor>,
    /// `[3·embed_dim]`, when the layer has biases.
    #[param]
    pub in_proj_bias: Option<Tensor>,
    /// The output projection (PyTorch's `NonDynamicallyQuantizableLinear`).
    pub out_proj: Linear,
    embed_dim: usize,
    kdim: usize,
    vdim: usize,
    num_heads: usize,
    dropout: f64,
    batch_first: bool,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl MultiheadAttention {
    /// `MultiheadAttention(embed_dim, num_heads)`: PyTorch's defaults.
    pub fn new(embed_dim: usize, num_heads: usize, opts: impl Into<Options>) -> Result<Self> {
        Self::with_config(
            embed_dim,
            num_heads,
            MultiheadAttentionConfig::default(),
            opts,
        )
    }

    /// `MultiheadAttention(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn,
    /// kdim, vdim, batch_first)`.
    pub fn with_config(
        embed_dim: usize,
        num_heads: usize,
        config: MultiheadAttentionConfig,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options(NAME, opts)?;
        if embed_dim == 0 || num_heads == 0 {
            return Err(invalid(format!(
                "embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and num_heads={num_heads} instead"
            )));
        }
        if !embed_dim.is_multiple_of(num_heads) {
            return Err(invalid(format!(
                "embed_dim must be divisible by num_heads (embed_dim={embed_dim}, num_heads={num_heads})"
            )));
        }
        if !(0.0..=1.0).contains(&config.dropout) {
            return Err(invalid(format!(
                "dropout probability has to be between 0 and 1, but got {}",
                config.dropout
            )));
        }
        if config.add_bias_kv || config.add_zero_attn {
            return Err(invalid(
                "add_bias_kv=True and add_zero_attn=True are not implemented in Ember",
            ));
        }
        let kdim = config.kdim.unwrap_or(embed_dim);
        let vdim = config.vdim.unwrap_or(embed_dim);
        let o = (device, dtype);
        let xavier = |dims: [usize; 2]| -> Result<Tensor> {
            let w = parameter(Raw::empty(dims, o)?)?;
            init::xavier_uniform_(&w, 1.0)?;
            Ok(w)
        };
        let (in_proj_weight, q, k, v) = if kdim == embed_dim && vdim == embed_dim {
            (Some(xavier([3 * embed_dim, embed_dim])?), None, None, None)
        } else {
            (
                None,
                Some(xavier([embed_dim, embed_dim])?),
                Some(xavier([embed_dim, kdim])?),
                Some(xavier([embed_dim, vdim])?),
            )
        };
        let in_proj_bias = if config.bias {
            Some(parameter(Raw::zeros([3 * embed_dim], o)?)?)
        } else {
            None
        };
        let out_proj = Linear::with_bias(embed_dim, embed_dim, config.bias, o)?;
        if let Some(b) = &out_proj.bias {
            init::zeros_(b)?;
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            q_proj_weight: q,
            k_proj_weight: k,
            v_proj_weight: v,
            in_proj_bias,
            out_proj,
            embed_dim,
            kdim,
            vdim,
            num_heads,
            dropout: config.dropout,
            batch_first: config.batch_first,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Whether inputs are `[batch, seq, feature]`.
    pub fn batch_first(&self) -> bool {
        self.batch_first
    }

    /// PyTorch's `forward(query, key, value, key_padding_mask, need_weights, attn_mask,
    /// average_attn_weights, is_causal)` (the keyword arguments in [`MhaForward`]): `query`
    /// `[L, N, embed_dim]`, `key` `[S, N, kdim]`, `value` `[S, N, vdim]` (`[N, L, ...]` with
    /// `batch_first`; `[L, embed_dim]`, `[S, kdim]`, `[S, vdim]` unbatched). Returns the
    /// output, shaped as the query, and, when `need_weights`, the weights `[N, L, S]`
    /// (averaged over heads) or `[N, num_heads, L, S]` (`[L, S]` or `[num_heads, L, S]`
    /// unbatched).
    pub fn forward_qkv(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        opts: &MhaForward,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let h = self.num_heads;
        let batched = self.shape_check(query, key, value, opts)?;
        for w in [&self.in_proj_weight, &self.q_proj_weight]
            .into_iter()
            .flatten()
        {
            check_device(NAME, "in_proj_weight", w, query)?;
        }
        let (mut q_in, mut k_in, mut v_in) = (query.clone(), key.clone(), value.clone());
        let mut kpm = opts.key_padding_mask.clone();
        if !batched {
            q_in = q_in.unsqueeze(1)?;
            k_in = k_in.unsqueeze(1)?;
            v_in = v_in.unsqueeze(1)?;
            kpm = kpm.map(|m| m.unsqueeze(0)).transpose()?;
        } else if self.batch_first {
            q_in = q_in.transpose(0, 1)?;
            k_in = k_in.transpose(0, 1)?;
            v_in = v_in.transpose(0, 1)?;
        }
        let (l, n, e) = (q_in.dims()[0], q_in.dims()[1], q_in.dims()[2]);
        let s = k_in.dims()[0];
        let dtype = q_in.dtype();
        if e != self.embed_dim {
            return Err(invalid(format!(
                "was expecting embedding dimension of {}, but got {e}",
                self.embed_dim
            )));
        }
        if k_in.dims()[2] != self.kdim || v_in.dims()[2] != self.vdim {
            return Err(invalid(format!(
                "expected key with last dimension {} (kdim) and value with last dimension {} (vdim), found key {} and value {}",
                self.kdim,
                self.vdim,
                key.shape(),
                value.shape()
            )));
        }
        if self.in_proj_weight.is_some() {
            if k_in.dims() != v_in.dims() {
                return Err(invalid(format!(
                    "key shape {} does not match value shape {}",
                    torch_size(&k_in.dims()),
                    torch_size(&v_in.dims())
                )));
            }
        } else if k_in.dims()[..2] != v_in.dims()[..2] {
            return Err(invalid(format!(
                "key's sequence and batch dims {} do not match value's {}",
                torch_size(&k_in.dims()[..2]),
                torch_size(&v_in.dims()[..2])
            )));
        }
        if k_in.dims()[1] != n {
            return Err(invalid(format!(
                "expected key and value with batch size {n} (the query's), found key {}",
                key.shape()
            )));
        }
        let kpm = kpm
            .map(|m| canonical_mask(&m, "key_padding_mask", dtype))
            .transpose()?;
        let mut is_causal = opts.is_causal;
        if is_causal && opts.attn_mask.is_none() {
            return Err(invalid(
                "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method `generate_square_subsequent_mask` to create this mask.",
            ));
        }
        let mut attn_mask = if is_causal && kpm.is_none() && !opts.need_weights {
            None
        } else {
            if kpm.is_some() {
                is_causal = false;
            }
            opts.attn_mask
                .as_ref()
                .map(|m| canonical_mask(m, "attn_mask", dtype))
                .transpose()?
        };

        let (q, k, v) = self.in_projection(&q_in, &k_in, &v_in)?;

        if let Some(m) = attn_mask.take() {
            let md = m.dims();
            attn_mask = Some(match md.len() {
                2 => {
                    if md != [l, s] {
                        return Err(invalid(format!(
                            "The shape of the 2D attn_mask is {}, but should be {}.",
                            torch_size(&md),
                            py_tuple(&[l, s])
                        )));
                    }
                    m.unsqueeze(0)?
                }
                3 => {
                    if md != [n * h, l, s] {
                        return Err(invalid(format!(
                            "The shape of the 3D attn_mask is {}, but should be {}.",
                            torch_size(&md),
                            py_tuple(&[n * h, l, s])
                        )));
                    }
                    m
                }
                r => {
                    return Err(invalid(format!(
                        "attn_mask's dimension {r} is not supported"
                    )));
                }
            });
        }

        let hd = e / h;
        // [L, N, E] -> [N·H, L, hd].
        let q = q.reshape([l, n * h, hd])?.transpose(0, 1)?;
        let k = k.reshape([s, n * h, hd])?.transpose(0, 1)?;
        let v = v.reshape([s, n * h, hd])?.transpose(0, 1)?;

        if let Some(m) = &kpm {
            if m.dims() != [n, s] {
                return Err(invalid(format!(
                    "expecting key_padding_mask shape of {}, but got {}",
                    py_tuple(&[n, s]),
                    torch_size(&m.dims())
                )));
            }
            let m = m
                .reshape([n, 1, 1, s])?
                .expand([n, h, 1, s])?
                .reshape([n * h, 1, s])?;
            attn_mask = Some(match attn_mask {
                None => m,
                Some(a) => a.add(&m)?,
            });
        }
        let dropout_p = if self.training.get() {
            self.dropout
        } else {
            0.0
        };

        if opts.need_weights {
            let q_scaled = q.mul((1.0 / hd as f64).sqrt())?;
            let mut scores = q_scaled.bmm(&k.transpose(1, 2)?)?;
            if let Some(m) = &attn_mask {
                scores = scores.add(m)?;
            }
            let mut weights = scores.softmax(-1)?;
            if dropout_p > 0.0 {
                weights = weights.dropout(dropout_p, true)?;
            }
            let out = weights.bmm(&v)?; // [N·H, L, hd]
            let out = out.transpose(0, 1)?.reshape([l * n, e])?;
            let out = self.out_proj.forward(&out)?.reshape([l, n, e])?;
            let mut w = weights.reshape([n, h, l, s])?;
            if opts.average_attn_weights {
                w = w.mean(1)?;
            }
            let (out, w) = if batched {
                (out, w)
            } else {
                (out.squeeze_dim(1)?, w.squeeze_dim(0)?)
            };
            Ok((self.batch_out(out, batched)?, Some(w)))
        } else {
            let attn_mask = attn_mask
                .map(|m| -> Result<Tensor> {
                    let md = m.dims();
                    if md[0] == 1 {
                        m.unsqueeze(0)
                    } else {
                        m.reshape([n, h, md[1], s])
                    }
                })
                .transpose()?;
            let q = q.reshape([n, h, l, hd])?;
            let k = k.reshape([n, h, s, hd])?;
            let v = v.reshape([n, h, s, hd])?;
            let sdpa = SdpaOptions {
                attn_mask,
                dropout_p,
                is_causal,
                ..Default::default()
            };
            let out = F::scaled_dot_product_attention(&q, &k, &v, &sdpa)?; // [N, H, L, hd]
            let out = out.permute([2, 0, 1, 3])?.reshape([l * n, e])?;
            let out = self.out_proj.forward(&out)?.reshape([l, n, e])?;
            let out = if batched { out } else { out.squeeze_dim(1)? };
            Ok((self.batch_out(out, batched)?, None))
        }
    }

    fn batch_out(&self, out: Tensor, batched: bool) -> Result<Tensor> {
        if batched && self.batch_first {
            out.transpose(0, 1)
        } else {
            Ok(out)
        }
    }

    /// PyTorch's `_mha_shape_check`: whether the inputs are batched.
    fn shape_check(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        opts: &MhaForward,
    ) -> Result<bool> {
        let (kr, vr) = (key.rank(), value.rank());
        let kpm = opts.key_padding_mask.as_ref().map(Tensor::rank);
        let mask = opts.attn_mask.as_ref();
        match query.rank() {
            3 => {
                if kr != 3 || vr != 3 {
                    return Err(invalid(format!(
                        "For batched (3-D) `query`, expected `key` and `value` to be 3-D but found {kr}-D and {vr}-D tensors respectively"
                    )));
                }
                if let Some(r) = kpm.filter(|&r| r != 2) {
                    return Err(invalid(format!(
                        "For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D but found {r}-D tensor instead"
                    )));
                }
                if let Some(r) = mask.map(Tensor::rank).filter(|r| !(2..=3).contains(r)) {
                    return Err(invalid(format!(
                        "For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found {r}-D tensor instead"
                    )));
                }
                Ok(true)
            }
            2 => {
                if kr != 2 || vr != 2 {
                    return Err(invalid(format!(
                        "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found {kr}-D and {vr}-D tensors respectively"
                    )));
                }
                if let Some(r) = kpm.filter(|&r| r != 1) {
                    return Err(invalid(format!(
                        "For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D but found {r}-D tensor instead"
                    )));
                }
                if let Some(m) = mask {
                    let r = m.rank();
                    if !(2..=3).contains(&r) {
                        return Err(invalid(format!(
                            "For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found {r}-D tensor instead"
                        )));
                    }
                    let expected = [self.num_heads, query.dims()[0], key.dims()[0]];
                    if r == 3 && m.dims() != expected {
                        return Err(invalid(format!(
                            "Expected `attn_mask` shape to be {} but got {}",
                            py_tuple(&expected),
                            torch_size(&m.dims())
                        )));
                    }
                }
                Ok(false)
            }
            r => Err(invalid(format!(
                "query should be unbatched 2D or batched 3D tensor but received {r}-D query tensor"
            ))),
        }
    }

    /// The projected query, key and value, `[L, N, E]`, `[S, N, E]`, `[S, N, E]`.
    fn in_projection(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let e = self.embed_dim;
        let bias = |i: usize| -> Result<Option<Tensor>> {
            self.in_proj_bias
                .as_ref()
                .map(|b| b.narrow(0, i * e, e))
                .transpose()
        };
        let weight = |i: usize| -> Result<Tensor> {
            let separate = [
                &self.q_proj_weight,
                &self.k_proj_weight,
                &self.v_proj_weight,
            ];
            match (&self.in_proj_weight, separate[i]) {
                (Some(w), _) => w.narrow(0, i * e, e),
                (None, Some(w)) => Ok(w.clone()),
                (None, None) => Err(invalid("the layer has no input projection weights")),
            }
        };
        let project = |x: &Tensor, i: usize| -> Result<Tensor> {
            F::linear(x, &weight(i)?, bias(i)?.as_ref())
        };
        Ok((project(q, 0)?, project(k, 1)?, project(v, 2)?))
    }
}

/// PyTorch's `_canonical_mask`: a bool mask (`true` masked out) as a float mask of `dtype`,
/// `-inf` where masked and 0 elsewhere; a float mask as it is.
fn canonical_mask(mask: &Tensor, name: &str, dtype: DType) -> Result<Tensor> {
    match mask.dtype() {
        DType::Bool => {
            Raw::zeros(mask.dims(), (mask.device(), dtype))?.masked_fill(mask, f64::NEG_INFINITY)
        }
        d if d.is_float() => Ok(mask.clone()),
        d => Err(invalid(format!(
            "only bool and floating types of {name} are supported, found {d}"
        ))),
    }
}

impl Module for MultiheadAttention {
    /// Self-attention without masks, the output alone: `mha(x, x, x, need_weights=False)[0]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let opts = MhaForward {
            need_weights: false,
            ..Default::default()
        };
        Ok(self.forward_qkv(x, x, x, &opts)?.0)
    }
}
