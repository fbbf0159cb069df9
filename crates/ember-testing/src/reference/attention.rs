//! Scaled dot-product attention as PyTorch's math path defines it
//! (`_scaled_dot_product_attention_math`), forward and gradients, in f64 with the whole
//! `L×S` matrices: the reference of the fused kernels (CUDA and CPU).
//!
//! Per (b, h), with kv head `g = h / (H / G)` (grouped-query attention: PyTorch repeats each
//! kv head `H / G` times):
//! - `s_ij = scale·(q_i·k_j) + mask_ij`, the mask `-inf` where a bool mask is false or, under
//!   `causal`, where `j > i` (`tril(ones(L, S))`, top-left aligned);
//! - `P = softmax_j(s)`, except that a row whose scores are all `-inf` gives `P = 0`
//!   (`_safe_softmax`, so fully masked rows give 0 output and 0 gradients, not NaN);
//! - `out = (P ∘ Z)·v`, `Z` dropout's factors (`1/(1-p)` where kept, 0 where dropped; all 1
//!   without dropout);
//! - `lse_i = ln Σ_j exp(s_ij)`, the log-sum-exp the fused forward saves; `+inf` for a fully
//!   masked row, the kernels' convention (their backward then recomputes `P = exp(s - lse) =
//!   0` there).
//!
//! Gradients, from `dout`: `dPd = dout·vᵀ`, `dP = dPd ∘ Z`, `dS = P ∘ (dP - rowsum(P ∘ dP))`,
//! `dq = scale·dS·k`, `dk = scale·dSᵀ·q` and `dv = (P ∘ Z)ᵀ·dout`, the last two summed over
//! the query heads of each kv head.

/// The shape and options of one attention; every operand contiguous: q `[B, H, L, E]`, k
/// `[B, G, S, E]`, v `[B, G, S, Ev]`, out and dout `[B, H, L, Ev]`.
#[derive(Clone, Debug)]
pub struct Attention<'a> {
    /// B.
    pub batch: usize,
    /// H, the heads of q.
    pub heads: usize,
    /// G, the heads of k and v (dividing H).
    pub kv_heads: usize,
    /// L.
    pub len_q: usize,
    /// S.
    pub len_kv: usize,
    /// E, the head dim of q and k.
    pub dim_qk: usize,
    /// Ev, the head dim of v.
    pub dim_v: usize,
    /// The factor of `q·k`.
    pub scale: f64,
    /// PyTorch's `is_causal`.
    pub causal: bool,
    /// An attention mask, if any.
    pub mask: Option<AttnMask<'a>>,
    /// Dropout's factor per element of `[B, H, L, S]` (contiguous), if any.
    pub dropout: Option<&'a [f64]>,
}

/// An attention mask over `[B, H, L, S]`: element `(b, h, i, j)` at
/// `b·strides[0] + h·strides[1] + i·strides[2] + j·strides[3]` (0 where it broadcasts).
#[derive(Clone, Copy, Debug)]
pub enum AttnMask<'a> {
    /// `false` masks the score out.
    Bool(&'a [bool], [usize; 4]),
    /// Added to the score.
    Float(&'a [f64], [usize; 4]),
}

/// The forward's outputs.
#[derive(Clone, Debug)]
pub struct AttnOut {
    /// `[B, H, L, Ev]`.
    pub out: Vec<f64>,
    /// `[B, H, L]` (`+inf` for fully masked rows).
    pub lse: Vec<f64>,
}

/// The gradients.
#[derive(Clone, Debug)]
pub struct AttnGrads {
    /// `[B, H, L, E]`.
    pub dq: Vec<f64>,
    /// `[B, G, S, E]`.
    pub dk: Vec<f64>,
    /// `[B, G, S, Ev]`.
    pub dv: Vec<f64>,
}

impl Attention<'_> {
    /// The scores `s` of `(b, h)` (`L×S`, row-major) with the mask and causal applied.
    fn scores(&self, b: usize, h: usize, q: &[f64], k: &[f64]) -> Vec<f64> {
        let (l, s, e) = (self.len_q, self.len_kv, self.dim_qk);
        let g = h / (self.heads / self.kv_heads);
        let qb = &q[(b * self.heads + h) * l * e..][..l * e];
        let kb = &k[(b * self.kv_heads + g) * s * e..][..s * e];
        let mut out = vec![0.0; l * s];
        for i in 0..l {
            for j in 0..s {
                let dot: f64 = (0..e).map(|x| qb[i * e + x] * kb[j * e + x]).sum();
                let mut v = self.scale * dot;
                if self.causal && j > i {
                    v = f64::NEG_INFINITY;
                }
                let at = |st: [usize; 4]| b * st[0] + h * st[1] + i * st[2] + j * st[3];
                match self.mask {
                    Some(AttnMask::Bool(m, st)) if !m[at(st)] => v = f64::NEG_INFINITY,
                    Some(AttnMask::Float(m, st)) => v += m[at(st)],
                    _ => {}
                }
                out[i * s + j] = v;
            }
        }
        out
    }

    /// `P` of `(b, h)` from its scores (in place), and the rows' log-sum-exp.
    fn softmax(&self, s: &mut [f64]) -> Vec<f64> {
        let n = self.len_kv;
        let mut lse = vec![f64::INFINITY; self.len_q];
        for (i, row) in s.chunks_mut(n.max(1)).take(self.len_q).enumerate() {
            if n == 0 || row.iter().all(|&x| x == f64::NEG_INFINITY) {
                row.iter_mut().for_each(|x| *x = 0.0);
                continue;
            }
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|&x| (x - m).exp()).sum();
            row.iter_mut().for_each(|x| *x = (*x - m).exp() / sum);
            lse[i] = m + sum.ln();
        }
        lse
    }

    fn z(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        self.dropout.map_or(1.0, |d| {
            d[((b * self.heads + h) * self.len_q + i) * self.len_kv + j]
        })
    }
}

/// The forward: `out` and `lse`.
pub fn attention(a: &Attention<'_>, q: &[f64], k: &[f64], v: &[f64]) -> AttnOut {
    let (l, s, ev) = (a.len_q, a.len_kv, a.dim_v);
    let mut out = vec![0.0; a.batch * a.heads * l * ev];
    let mut lse = vec![0.0; a.batch * a.heads * l];
    for b in 0..a.batch {
        for h in 0..a.heads {
            let g = h / (a.heads / a.kv_heads);
            let vb = &v[(b * a.kv_heads + g) * s * ev..][..s * ev];
            let mut p = a.scores(b, h, q, k);
            let row_lse = a.softmax(&mut p);
            let bh = b * a.heads + h;
            lse[bh * l..][..l].copy_from_slice(&row_lse);
            for i in 0..l {
                for d in 0..ev {
                    out[(bh * l + i) * ev + d] = (0..s)
                        .map(|j| p[i * s + j] * a.z(b, h, i, j) * vb[j * ev + d])
                        .sum();
                }
            }
        }
    }
    AttnOut { out, lse }
}

/// The gradients of q, k and v for the output gradient `dout`.
pub fn attention_grad(
    a: &Attention<'_>,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
) -> AttnGrads {
    let (l, s, e, ev) = (a.len_q, a.len_kv, a.dim_qk, a.dim_v);
    let mut dq = vec![0.0; a.batch * a.heads * l * e];
    let mut dk = vec![0.0; a.batch * a.kv_heads * s * e];
    let mut dv = vec![0.0; a.batch * a.kv_heads * s * ev];
    for b in 0..a.batch {
        for h in 0..a.heads {
            let g = h / (a.heads / a.kv_heads);
            let (bh, bg) = (b * a.heads + h, b * a.kv_heads + g);
            let mut p = a.scores(b, h, q, k);
            a.softmax(&mut p);
            for i in 0..l {
                let go = &dout[(bh * l + i) * ev..][..ev];
                // dP_ij = Z_ij (dout_i · v_j); D_i = Σ_j P_ij dP_ij.
                let dp: Vec<f64> = (0..s)
                    .map(|j| {
                        let vj = &v[(bg * s + j) * ev..][..ev];
                        a.z(b, h, i, j) * go.iter().zip(vj).map(|(x, y)| x * y).sum::<f64>()
                    })
                    .collect();
                let di: f64 = (0..s).map(|j| p[i * s + j] * dp[j]).sum();
                for j in 0..s {
                    let pij = p[i * s + j];
                    let ds = pij * (dp[j] - di);
                    for x in 0..e {
                        dq[(bh * l + i) * e + x] += a.scale * ds * k[(bg * s + j) * e + x];
                        dk[(bg * s + j) * e + x] += a.scale * ds * q[(bh * l + i) * e + x];
                    }
                    let pz = pij * a.z(b, h, i, j);
                    for d in 0..ev {
                        dv[(bg * s + j) * ev + d] += pz * go[d];
                    }
                }
            }
        }
    }
    AttnGrads { dq, dk, dv }
}

/// Which mask a generated case has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskKind {
    /// No mask.
    None,
    /// A bool mask: about a fifth of the elements false, and every stored row 1 (when
    /// `L > 1`) all false.
    Bool,
    /// A float mask: values in `[-2, 2)`, about a sixth `-inf`, and row 1 all `-inf`.
    Float,
}

/// A generated attention case for the kernel tests: the shape, the options and a seed from
/// which [`AttnCase::data`] makes the inputs (the same on every machine).
#[derive(Clone, Debug)]
pub struct AttnCase {
    /// B.
    pub batch: usize,
    /// H.
    pub heads: usize,
    /// G.
    pub kv_heads: usize,
    /// L.
    pub len_q: usize,
    /// S.
    pub len_kv: usize,
    /// E.
    pub dim_qk: usize,
    /// Ev.
    pub dim_v: usize,
    /// `is_causal`.
    pub causal: bool,
    /// The mask.
    pub mask: MaskKind,
    /// Which of the mask's four dimensions (B, H, L, S) it broadcasts over (stride 0).
    pub mask_broadcast: [bool; 4],
    /// Drop probability (0: no dropout).
    pub dropout: f64,
    /// The factor of `q·k` (PyTorch's default `1/sqrt(E)` unless set).
    pub scale: f64,
    /// The seed of the inputs and of the dropout generator.
    pub seed: u64,
}

/// The inputs of an [`AttnCase`], in f64, every operand contiguous (see [`Attention`]).
#[derive(Clone, Debug)]
pub struct AttnData {
    /// `[B, H, L, E]`.
    pub q: Vec<f64>,
    /// `[B, G, S, E]`.
    pub k: Vec<f64>,
    /// `[B, G, S, Ev]`.
    pub v: Vec<f64>,
    /// `[B, H, L, Ev]`.
    pub dout: Vec<f64>,
    /// The bool mask's stored elements (empty without one).
    pub mask_bool: Vec<bool>,
    /// The float mask's stored elements (empty without one).
    pub mask_float: Vec<f64>,
    /// The mask's strides over `[B, H, L, S]` (0 where it broadcasts).
    pub mask_strides: [usize; 4],
    /// Dropout's factors over `[B, H, L, S]`: `1 / (1 - p)` where
    /// `Tensor::dropout_mask_with` (a CPU generator seeded with the case's seed, offset 0)
    /// keeps the element, else 0; empty without dropout.
    pub dropout: Vec<f64>,
}

impl AttnCase {
    /// A case without mask, causal or dropout, with PyTorch's default scale `1/sqrt(E)`
    /// (1 for E = 0).
    pub fn new(shape: [usize; 7]) -> AttnCase {
        let [batch, heads, kv_heads, len_q, len_kv, dim_qk, dim_v] = shape;
        AttnCase {
            batch,
            heads,
            kv_heads,
            len_q,
            len_kv,
            dim_qk,
            dim_v,
            causal: false,
            mask: MaskKind::None,
            mask_broadcast: [false; 4],
            dropout: 0.0,
            scale: if dim_qk == 0 {
                1.0
            } else {
                1.0 / (dim_qk as f64).sqrt()
            },
            seed: 1,
        }
    }

    /// The mask's strides over `[B, H, L, S]` for its stored shape (0 where it broadcasts).
    pub fn mask_strides(&self) -> [usize; 4] {
        let ms = self.mask_shape();
        [
            if ms[0] == 1 { 0 } else { ms[1] * ms[2] * ms[3] },
            if ms[1] == 1 { 0 } else { ms[2] * ms[3] },
            if ms[2] == 1 { 0 } else { ms[3] },
            if ms[3] == 1 { 0 } else { 1 },
        ]
    }

    /// The mask's stored shape: 1 on broadcast dimensions.
    pub fn mask_shape(&self) -> [usize; 4] {
        let full = [self.batch, self.heads, self.len_q, self.len_kv];
        std::array::from_fn(|d| if self.mask_broadcast[d] { 1 } else { full[d] })
    }

    /// The inputs: q and k uniform in `[-2, 2)`, v and dout in `[-1, 1)`, the mask and the
    /// dropout factors as [`MaskKind`] and [`AttnData::dropout`] say.
    pub fn data(&self) -> AttnData {
        let mut rng = crate::Lcg(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut vals = |n: usize, scale: f32| -> Vec<f64> {
            (0..n).map(|_| f64::from(rng.f32(scale))).collect()
        };
        let (b, h, g, l, s) = (
            self.batch,
            self.heads,
            self.kv_heads,
            self.len_q,
            self.len_kv,
        );
        let q = vals(b * h * l * self.dim_qk, 2.0);
        let k = vals(b * g * s * self.dim_qk, 2.0);
        let v = vals(b * g * s * self.dim_v, 1.0);
        let dout = vals(b * h * l * self.dim_v, 1.0);
        let ms = self.mask_shape();
        let n: usize = ms.iter().product();
        let mask_strides = self.mask_strides();
        // Row 1 of every stored (b, h) is fully masked (when it is a row of its own).
        let row = |x: usize| ms[2] > 1 && (x / ms[3]) % ms[2] == 1;
        let (mut mask_bool, mut mask_float) = (Vec::new(), Vec::new());
        match self.mask {
            MaskKind::None => {}
            MaskKind::Bool => {
                mask_bool = (0..n)
                    .map(|x| !row(x) && !rng.next_u64().is_multiple_of(5))
                    .collect();
            }
            MaskKind::Float => {
                mask_float = (0..n)
                    .map(|x| {
                        if row(x) || rng.next_u64().is_multiple_of(6) {
                            f64::NEG_INFINITY
                        } else {
                            f64::from(rng.f32(2.0))
                        }
                    })
                    .collect();
            }
        }
        let dropout = if self.dropout > 0.0 {
            let g =
                ember_tensor::random::Generator::with_seed(self.seed, ember_tensor::Device::Cpu);
            let keep = ember_tensor::Tensor::dropout_mask_with(
                [b, h, l, s],
                self.dropout,
                ember_tensor::DType::Bool,
                &g,
            )
            .and_then(|m| m.to_vec::<bool>())
            .expect("a dropout mask on the CPU");
            keep.iter()
                .map(|&k| if k { 1.0 / (1.0 - self.dropout) } else { 0.0 })
                .collect()
        } else {
            Vec::new()
        };
        AttnData {
            q,
            k,
            v,
            dout,
            mask_bool,
            mask_float,
            mask_strides,
            dropout,
        }
    }

    /// The reference's view of this case over `data`.
    pub fn attention<'a>(&self, data: &'a AttnData) -> Attention<'a> {
        let mask = match self.mask {
            MaskKind::None => None,
            MaskKind::Bool => Some(AttnMask::Bool(&data.mask_bool, data.mask_strides)),
            MaskKind::Float => Some(AttnMask::Float(&data.mask_float, data.mask_strides)),
        };
        Attention {
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.kv_heads,
            len_q: self.len_q,
            len_kv: self.len_kv,
            dim_qk: self.dim_qk,
            dim_v: self.dim_v,
            scale: self.scale,
            causal: self.causal,
            mask,
            dropout: (!data.dropout.is_empty()).then_some(&data.dropout[..]),
        }
    }
}

impl AttnData {
    /// The data with `round` applied to q, k, v, dout and the float mask (the values a
    /// 16-bit kernel sees), so that the reference computes on exactly the kernel's inputs.
    pub fn rounded(&self, round: impl Fn(f64) -> f64) -> AttnData {
        let r = |x: &[f64]| x.iter().map(|&v| round(v)).collect::<Vec<_>>();
        AttnData {
            q: r(&self.q),
            k: r(&self.k),
            v: r(&self.v),
            dout: r(&self.dout),
            mask_bool: self.mask_bool.clone(),
            mask_float: r(&self.mask_float),
            mask_strides: self.mask_strides,
            dropout: self.dropout.clone(),
        }
    }
}

/// Asserts that `got` is within `rtol` of `want` plus an absolute `atol` times the larger of
/// 1 and `want`'s largest finite magnitude: the attention tests' closeness, for results of
/// O(1) inputs that may be exactly 0 (a gradient through a one-hot row of weights).
#[track_caller]
pub fn assert_attn_close(what: &str, got: &[f64], want: &[f64], (rtol, atol): (f64, f64)) {
    let scale = want
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    crate::Close::new()
        .rtol_atol(rtol, atol * scale)
        .context(what)
        .assert(got, want);
}

/// A case of PyTorch's own numbers (`scaled_dot_product_attention` on its math backend in
/// f64): the case, its inputs and PyTorch's outputs.
#[derive(Clone, Debug)]
pub struct TorchCase {
    /// The case's name in the file.
    pub name: String,
    /// Shape and options (`seed` unused).
    pub case: AttnCase,
    /// The inputs.
    pub data: AttnData,
    /// PyTorch's output, `[B, H, L, Ev]`.
    pub out: Vec<f64>,
    /// PyTorch's gradient of q, `[B, H, L, E]`.
    pub dq: Vec<f64>,
    /// PyTorch's gradient of k, `[B, G, S, E]`.
    pub dk: Vec<f64>,
    /// PyTorch's gradient of v, `[B, G, S, Ev]`.
    pub dv: Vec<f64>,
}

/// The cases of `attention_reference.json` (written by `make_attention_reference.py` beside
/// it in `crates/ember-kernels/tests/reference/`); `None` for a malformed file.
pub fn torch_cases(json: &str) -> Option<Vec<TorchCase>> {
    use serde_json::Value;
    let num = |v: &Value| -> Option<f64> {
        match v {
            Value::String(s) if s == "-inf" => Some(f64::NEG_INFINITY),
            Value::String(s) if s == "inf" => Some(f64::INFINITY),
            v => v.as_f64(),
        }
    };
    let list = |c: &Value, key: &str| -> Option<Vec<f64>> {
        c.get(key)?.as_array()?.iter().map(num).collect()
    };
    let root: Value = serde_json::from_str(json).ok()?;
    let mut out = Vec::new();
    for c in root.get("cases")?.as_array()? {
        let shape: Vec<usize> = c
            .get("shape")?
            .as_array()?
            .iter()
            .map(|x| x.as_u64().map(|x| x as usize))
            .collect::<Option<_>>()?;
        let mut case = AttnCase::new(shape.try_into().ok()?);
        case.causal = c.get("causal")?.as_bool()?;
        case.scale = c.get("scale")?.as_f64()?;
        let mask = list(c, "mask").unwrap_or_default();
        case.mask = match c.get("mask_kind")?.as_str() {
            Some("bool") => MaskKind::Bool,
            Some("float") => MaskKind::Float,
            _ => MaskKind::None,
        };
        if case.mask != MaskKind::None {
            let ms: Vec<usize> = c
                .get("mask_shape")?
                .as_array()?
                .iter()
                .map(|x| x.as_u64().map(|x| x as usize))
                .collect::<Option<_>>()?;
            case.mask_broadcast = std::array::from_fn(|d| ms[d] == 1);
        }
        let data = AttnData {
            q: list(c, "q")?,
            k: list(c, "k")?,
            v: list(c, "v")?,
            dout: list(c, "dout")?,
            mask_bool: if case.mask == MaskKind::Bool {
                mask.iter().map(|&x| x != 0.0).collect()
            } else {
                Vec::new()
            },
            mask_float: if case.mask == MaskKind::Float {
                mask
            } else {
                Vec::new()
            },
            mask_strides: case.mask_strides(),
            dropout: Vec::new(),
        };
        out.push(TorchCase {
            name: c.get("name")?.as_str()?.to_string(),
            case,
            data,
            out: list(c, "out")?,
            dq: list(c, "dq")?,
            dk: list(c, "dk")?,
            dv: list(c, "dv")?,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain<'a>(l: usize, s: usize, e: usize) -> Attention<'a> {
        Attention {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            len_q: l,
            len_kv: s,
            dim_qk: e,
            dim_v: e,
            scale: 0.5,
            causal: false,
            mask: None,
            dropout: None,
        }
    }

    #[test]
    fn uniform_scores_average_the_values() {
        // q = 0: every score 0, P uniform, out the mean of v's rows, lse ln S.
        let a = plain(2, 4, 1);
        let v = [1.0, 2.0, 3.0, 6.0];
        let r = attention(&a, &[0.0; 2], &[1.0; 4], &v);
        assert_eq!(r.out, vec![3.0, 3.0]);
        assert!((r.lse[0] - 4f64.ln()).abs() < 1e-15);
    }

    #[test]
    fn causal_and_fully_masked_rows() {
        // Causal: row 0 sees key 0 only. A float mask of -inf on all of row 1: 0, lse +inf.
        let mut a = plain(2, 3, 1);
        a.causal = true;
        let mask = [
            0.0,
            0.0,
            0.0,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
        ];
        a.mask = Some(AttnMask::Float(&mask, [0, 0, 3, 1]));
        let r = attention(&a, &[1.0, 1.0], &[1.0, 2.0, 3.0], &[5.0, 7.0, 9.0]);
        assert_eq!(r.out, vec![5.0, 0.0]);
        assert_eq!(r.lse[1], f64::INFINITY);
        let g = attention_grad(
            &a,
            &[1.0, 1.0],
            &[1.0, 2.0, 3.0],
            &[5.0, 7.0, 9.0],
            &[1.0, 1.0],
        );
        // Row 0's P is one-hot: no gradient to q or k; v's gradient is dout on key 0.
        assert_eq!(
            (g.dq, g.dk, g.dv),
            (vec![0.0, 0.0], vec![0.0; 3], vec![1.0, 0.0, 0.0])
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        let mut a = plain(3, 4, 2);
        a.causal = true;
        let q: Vec<f64> = (0..6).map(|i| (i as f64 * 0.37).sin()).collect();
        let k: Vec<f64> = (0..8).map(|i| (i as f64 * 0.91).cos()).collect();
        let v: Vec<f64> = (0..8).map(|i| (i as f64 * 0.53).sin() + 0.2).collect();
        let dout: Vec<f64> = (0..6).map(|i| 1.0 - 0.3 * i as f64).collect();
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            attention(&a, q, k, v)
                .out
                .iter()
                .zip(&dout)
                .map(|(o, g)| o * g)
                .sum()
        };
        let g = attention_grad(&a, &q, &k, &v, &dout);
        let h = 1e-6;
        let check = |x: &[f64], grad: &[f64], which: usize| {
            for i in 0..x.len() {
                let (mut up, mut down) = (x.to_vec(), x.to_vec());
                up[i] += h;
                down[i] -= h;
                let f = |t: &[f64]| match which {
                    0 => loss(t, &k, &v),
                    1 => loss(&q, t, &v),
                    _ => loss(&q, &k, t),
                };
                let fd = (f(&up) - f(&down)) / (2.0 * h);
                assert!(
                    (fd - grad[i]).abs() < 1e-7,
                    "operand {which} element {i}: {fd} vs {}",
                    grad[i]
                );
            }
        };
        check(&q, &g.dq, 0);
        check(&k, &g.dk, 1);
        check(&v, &g.dv, 2);
    }
}
