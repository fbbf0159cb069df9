//! CPU fused scaled-dot-product attention: FlashAttention's tiling on the CPU. Blocks of
//! [`BQ`] queries meet blocks of [`BK`] keys; each tile of scores lives in a small buffer
//! and is folded into the rows' running max, sum and output by the online softmax, so
//! memory stays `O(L + S)` per task, never `L×S`. Forward tasks are (batch, head, query
//! block), run in parallel on the crate's team (`ember_gemm::parallel`); backward tasks are
//! (batch, kv head), each owning its rows of dk and dv (no reduction between tasks).
//!
//! The conventions (masks, causal, grouped-query attention, dropout's Philox stream, fully
//! masked rows) are those of `kernels/attention.cu`, which docs/attention.md describes; both
//! are checked against `ember_testing::reference::attention`. These functions take slices
//! and strides, not tensors; [`storage`] takes them from storages and layouts for the op
//! (`Tensor::scaled_dot_product_attention`).
//!
//! f32 and f64 compute in their own type; f16 and bf16 are widened to f32 as they are
//! copied into the tiles and rounded once on the way out. The tile products are plain loops
//! over 4 rows × 16 columns of accumulators (`madd`), compiled for the widest vector
//! instructions (`simd::widest`); exp is the vectorised `FastExp`.

mod backward;
pub(crate) mod storage;
#[cfg(test)]
mod tests;

pub(crate) use backward::attention_backward;

use ember_gemm::parallel::for_each_chunk_mut;

use crate::error::{Result, TensorError};
use crate::math::FastExp;
use crate::random::philox;

const OP: &str = "scaled_dot_product_attention";

/// Queries per block.
pub(crate) const BQ: usize = 64;
/// Keys per block.
pub(crate) const BK: usize = 64;
/// Columns of the tile products' accumulators (one AVX-512 f32 register).
const NC: usize = 16;

/// The shape of one attention: q `[batch, heads, len_q, dim_qk]`, k
/// `[batch, kv_heads, len_kv, dim_qk]`, v `[batch, kv_heads, len_kv, dim_v]`; q head `h`
/// reads kv head `h / (heads / kv_heads)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttnDims {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub len_q: usize,
    pub len_kv: usize,
    pub dim_qk: usize,
    pub dim_v: usize,
}

/// A `[batch, heads, len, dim]` operand in a slice: element `(b, h, i, e)` at
/// `b·strides[0] + h·strides[1] + i·strides[2] + e` (the last dim contiguous).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnView<'a, T> {
    pub data: &'a [T],
    pub strides: [usize; 3],
}

/// The attention mask over `[batch, heads, len_q, len_kv]`: element `(b, h, i, j)` at
/// `b·s[0] + h·s[1] + i·s[2] + j·s[3]` (0 where it broadcasts). A float mask has the
/// operands' dtype, as PyTorch requires.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AttnMask<'a, T> {
    None,
    /// `false` masks the score out.
    Bool(&'a [bool], [usize; 4]),
    /// Added to the score.
    Float(&'a [T], [usize; 4]),
}

/// Dropout on the attention weights: element `n = ((b·H + h)·L + i)·S + j` is kept when
/// `unit(w, 24) < 1 - p` for word `n % 4` of Philox counter `base + n / 4` under `key`
/// (exactly `Tensor::dropout_mask` over `[B, H, L, S]`), and scaled by `1 / (1 - p)`. The
/// op reserves [`dropout_counters`](ember_kernels::attention::dropout_counters) counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttnDropout {
    pub p: f64,
    pub key: [u32; 2],
    pub base: u64,
}

/// The options of one attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttnOptions {
    /// The factor of `q·k`.
    pub scale: f64,
    /// PyTorch's `is_causal` (top-left aligned: key `j` is seen by query `i` iff `j <= i`).
    pub causal: bool,
    pub dropout: Option<AttnDropout>,
}

/// The float types the kernel computes in.
pub(crate) trait AttnFloat:
    Copy
    + Send
    + Sync
    + PartialOrd
    + FastExp
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::fmt::Debug
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    const INF: Self;
    fn from_f64(x: f64) -> Self;
    fn fma(self, a: Self, b: Self) -> Self;
    fn ln(self) -> Self;
}

macro_rules! attn_float {
    ($t:ty) => {
        impl AttnFloat for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INF: Self = <$t>::NEG_INFINITY;
            const INF: Self = <$t>::INFINITY;
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn fma(self, a: Self, b: Self) -> Self {
                // self·a + b, one rounding (an FMA instruction inside `simd::widest`).
                self.mul_add(a, b)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
        }
    };
}
attn_float!(f32);
attn_float!(f64);

/// The element types: the operands' dtype and the type it computes in (`Acc`, also the
/// dtype of the saved log-sum-exp).
pub(crate) trait AttnElem: Copy + Send + Sync + 'static {
    type Acc: AttnFloat;
    fn widen(self) -> Self::Acc;
    fn narrow(x: Self::Acc) -> Self;
}

impl AttnElem for f32 {
    type Acc = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(x: f32) -> f32 {
        x
    }
}

impl AttnElem for f64 {
    type Acc = f64;
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(x: f64) -> f64 {
        x
    }
}

impl AttnElem for half::f16 {
    type Acc = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(x: f32) -> half::f16 {
        half::f16::from_f32(x)
    }
}

impl AttnElem for half::bf16 {
    type Acc = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(x: f32) -> half::bf16 {
        half::bf16::from_f32(x)
    }
}

fn invalid(msg: String) -> TensorError {
    TensorError::invalid(OP, msg)
}

impl AttnDims {
    /// Checks the shape the kernels need (the op's front checks the user's shapes with
    /// PyTorch's messages first; failing here is an internal error).
    fn check(&self) -> Result<()> {
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(invalid(format!(
                "{} query heads are not a multiple of {} key/value heads (internal error)",
                self.heads, self.kv_heads
            )));
        }
        Ok(())
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// Checks that every element of a `[n0, n1, n2, n3]` view with these strides lies in a slice
/// of `len` elements.
fn check_view(what: &str, len: usize, dims: [usize; 4], strides: [usize; 4]) -> Result<()> {
    if dims.contains(&0) {
        return Ok(());
    }
    let last = dims.iter().zip(strides).try_fold(0usize, |acc, (&n, s)| {
        acc.checked_add((n - 1).checked_mul(s)?)
    });
    match last {
        Some(last) if last < len => Ok(()),
        _ => Err(invalid(format!(
            "{what} of shape {dims:?} with strides {strides:?} reaches outside its {len} \
             elements (internal error)"
        ))),
    }
}

impl<T> AttnView<'_, T> {
    fn check(&self, what: &str, dims: [usize; 4]) -> Result<()> {
        let [sb, sh, sl] = self.strides;
        check_view(what, self.data.len(), dims, [sb, sh, sl, 1])
    }

    /// Row `i` of head `h` of batch `b` (`dim` elements).
    #[inline(always)]
    fn row(&self, b: usize, h: usize, i: usize, dim: usize) -> &[T] {
        let at = b * self.strides[0] + h * self.strides[1] + i * self.strides[2];
        &self.data[at..at + dim]
    }
}

impl<T> AttnMask<'_, T> {
    fn check(&self, dims: &AttnDims) -> Result<()> {
        let shape = [dims.batch, dims.heads, dims.len_q, dims.len_kv];
        match self {
            AttnMask::None => Ok(()),
            AttnMask::Bool(m, s) => check_view("the mask", m.len(), shape, *s),
            AttnMask::Float(m, s) => check_view("the mask", m.len(), shape, *s),
        }
    }
}

/// The exclusive end of the keys the queries `q0..q1` see.
#[inline]
fn key_end(dims: &AttnDims, opts: &AttnOptions, q1: usize) -> usize {
    if opts.causal {
        q1.min(dims.len_kv)
    } else {
        dims.len_kv
    }
}

/// `c[r·ldc + j] += Σ_x a[r·ar + x·ax] · b[x·ldb + j]` for `r < m`, `x < kk` and every `j` of
/// the `ceil(n / NC)` groups of `NC` columns (so `b`'s and `c`'s rows must hold that many
/// columns, zero past `n` in `b`): every tile product of the kernel, with `a` read row- or
/// column-wise through its two strides.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn madd<C: AttnFloat>(
    (m, n, kk): (usize, usize, usize),
    a: &[C],
    (ar, ax): (usize, usize),
    b: &[C],
    ldb: usize,
    c: &mut [C],
    ldc: usize,
) {
    let cols = n.div_ceil(NC) * NC;
    // 4 rows × 64 columns are 16 AVX-512 accumulators of 32 registers, but 32 AVX2 ones of
    // 16, which would spill to the stack in every step of `x`. Without AVX-512 the blocks
    // are 4 × 16 (8 accumulators).
    let wide = crate::cpu::simd::has_32_vector_registers();
    let mut r0 = 0;
    while r0 < m {
        let rows = if m - r0 >= 4 { 4 } else { 1 };
        let mut j0 = 0;
        while j0 < cols {
            // 4 groups at once where they are there (4 rows × 64 columns: 16 accumulators,
            // 8 loads per 16 FMAs), else one.
            let four = wide && cols - j0 >= 4 * NC;
            match (rows, four) {
                (4, true) => {
                    madd_block::<C, 4, { 4 * NC }>(r0, j0, kk, a, (ar, ax), b, ldb, c, ldc)
                }
                (4, false) => madd_block::<C, 4, NC>(r0, j0, kk, a, (ar, ax), b, ldb, c, ldc),
                (_, true) => {
                    madd_block::<C, 1, { 4 * NC }>(r0, j0, kk, a, (ar, ax), b, ldb, c, ldc)
                }
                (_, false) => madd_block::<C, 1, NC>(r0, j0, kk, a, (ar, ax), b, ldb, c, ldc),
            }
            j0 += if four { 4 * NC } else { NC };
        }
        r0 += rows;
    }
}

/// One `R × W` block of [`madd`]: the accumulators stay in registers over `x`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn madd_block<C: AttnFloat, const R: usize, const W: usize>(
    r0: usize,
    j0: usize,
    kk: usize,
    a: &[C],
    (ar, ax): (usize, usize),
    b: &[C],
    ldb: usize,
    c: &mut [C],
    ldc: usize,
) {
    let mut acc = [[C::ZERO; W]; R];
    for (r, row) in acc.iter_mut().enumerate() {
        row.copy_from_slice(&c[(r0 + r) * ldc + j0..][..W]);
    }
    for x in 0..kk {
        let bx = &b[x * ldb + j0..][..W];
        for (r, row) in acc.iter_mut().enumerate() {
            let av = a[(r0 + r) * ar + x * ax];
            for (o, &bv) in row.iter_mut().zip(bx) {
                *o = av.fma(bv, *o);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        c[(r0 + r) * ldc + j0..][..W].copy_from_slice(row);
    }
}

/// Lanes of the row reductions: a single running max or sum is a chain that does not
/// vectorise (seen with `perf annotate`: the scalar exp loop was the forward's hot spot).
const LANES: usize = 16;

/// The largest element of `x` (NaN skipped; `-inf` for an empty row), in [`LANES`] lanes.
#[inline(always)]
fn max_lanes<C: AttnFloat>(x: &[C]) -> C {
    let mut lanes = [C::NEG_INF; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    lanes
        .iter()
        .chain(rest)
        .fold(C::NEG_INF, |m, &v| if v > m { v } else { m })
}

/// `x = exp(x - m)` in place, and the sum of the results (in [`LANES`] lanes).
#[inline(always)]
fn exp_sum<C: AttnFloat>(x: &mut [C], m: C) -> C {
    for v in x.iter_mut() {
        *v = (*v - m).fast_exp();
    }
    let mut lanes = [C::ZERO; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = *l + v;
        }
    }
    lanes.iter().chain(rest).fold(C::ZERO, |a, &v| a + v)
}

/// Columns rounded up to whole [`NC`] groups.
#[inline]
fn padded(n: usize) -> usize {
    n.div_ceil(NC) * NC
}

/// Copies rows `r0..r0 + rows` of one head of `view` into `dst` (`rows × ld`, widened, zero
/// past `dim`), or transposed into `dst` (`dim × ld`, element `(e, r)` at `e·ld + r`).
#[allow(clippy::too_many_arguments)]
fn load_rows<T: AttnElem>(
    view: &AttnView<'_, T>,
    (b, h): (usize, usize),
    r0: usize,
    rows: usize,
    dim: usize,
    dst: &mut [T::Acc],
    ld: usize,
    transposed: bool,
) {
    dst.fill(T::Acc::ZERO);
    for r in 0..rows {
        let src = view.row(b, h, r0 + r, dim);
        if transposed {
            for (e, &x) in src.iter().enumerate() {
                dst[e * ld + r] = x.widen();
            }
        } else {
            for (o, &x) in dst[r * ld..][..dim].iter_mut().zip(src) {
                *o = x.widen();
            }
        }
    }
}

/// Scales the raw dot products of one score tile row and applies causal and the mask:
/// `s[j] = scale·s[j] + mask(i, j0 + j)`, `-inf` where masked, for the `n` keys from `j0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn mask_row<T: AttnElem>(
    s: &mut [T::Acc],
    scale: T::Acc,
    mask: &AttnMask<'_, T>,
    (b, h, i): (usize, usize, usize),
    j0: usize,
    causal: bool,
) {
    for x in s.iter_mut() {
        *x = *x * scale;
    }
    match mask {
        AttnMask::None => {}
        AttnMask::Bool(m, st) => {
            let base = b * st[0] + h * st[1] + i * st[2] + j0 * st[3];
            for (j, x) in s.iter_mut().enumerate() {
                if !m[base + j * st[3]] {
                    *x = T::Acc::NEG_INF;
                }
            }
        }
        AttnMask::Float(m, st) => {
            let base = b * st[0] + h * st[1] + i * st[2] + j0 * st[3];
            for (j, x) in s.iter_mut().enumerate() {
                *x = *x + m[base + j * st[3]].widen();
            }
        }
    }
    if causal && j0 + s.len() > i + 1 {
        let from = (i + 1).saturating_sub(j0);
        s[from..].fill(T::Acc::NEG_INF);
    }
}

/// Dropout's factors of `z.len()` consecutive elements from element `n0` of the stream:
/// `keep` where kept, 0 where dropped (see [`AttnDropout`]).
fn dropout_factors<C: AttnFloat>(d: &AttnDropout, n0: u64, z: &mut [C], keep: C) {
    let p_keep = 1.0 - d.p;
    let mut n = n0;
    let mut x = 0;
    while x < z.len() {
        let w = philox::block(d.key, d.base, n / 4);
        let mut word = (n % 4) as usize;
        while word < 4 && x < z.len() {
            z[x] = if philox::unit(w[word], 24) < p_keep {
                keep
            } else {
                C::ZERO
            };
            word += 1;
            x += 1;
            n += 1;
        }
    }
}

/// Element `n` of the dropout stream for `(bh, i, j0)`.
#[inline]
fn dropout_index(dims: &AttnDims, bh: usize, i: usize, j0: usize) -> u64 {
    ((bh as u64) * (dims.len_q as u64) + i as u64) * (dims.len_kv as u64) + j0 as u64
}

/// Splits `s` into consecutive pieces of the given lengths (which must sum to at most its
/// length).
fn split_pieces<X>(mut s: &mut [X], lens: impl IntoIterator<Item = usize>) -> Vec<&mut [X]> {
    let mut out = Vec::new();
    for n in lens {
        let at = n.min(s.len());
        let (head, tail) = std::mem::take(&mut s).split_at_mut(at);
        out.push(head);
        s = tail;
    }
    out
}

/// The forward: `out` (`[B, H, L, Ev]`, contiguous) and `lse` (`[B, H, L]`, the natural
/// log-sum-exp of each row's scores before dropout; `+inf` for a row with every score
/// `-inf`, whose output is 0 as in PyTorch's math path).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward<T: AttnElem>(
    dims: &AttnDims,
    q: AttnView<'_, T>,
    k: AttnView<'_, T>,
    v: AttnView<'_, T>,
    mask: AttnMask<'_, T>,
    opts: &AttnOptions,
    out: &mut [T],
    lse: &mut [T::Acc],
) -> Result<()> {
    dims.check()?;
    let d = *dims;
    let (l, ev) = (d.len_q, d.dim_v);
    q.check("q", [d.batch, d.heads, l, d.dim_qk])?;
    k.check("k", [d.batch, d.kv_heads, d.len_kv, d.dim_qk])?;
    v.check("v", [d.batch, d.kv_heads, d.len_kv, ev])?;
    mask.check(dims)?;
    let rows = d.batch * d.heads * l;
    if out.len() != rows * ev || lse.len() != rows {
        return Err(invalid(format!(
            "expected {} outputs and {rows} log-sum-exps, found {} and {} (internal error)",
            rows * ev,
            out.len(),
            lse.len()
        )));
    }
    // One task per (b, h, block of BQ queries), each owning its rows of out and lse.
    let blocks = l.div_ceil(BQ);
    let lens = |per: usize| {
        (0..d.batch * d.heads)
            .flat_map(move |_| (0..blocks).map(move |x| (l - x * BQ).min(BQ) * per))
    };
    let mut tasks: Vec<_> = split_pieces(out, lens(ev))
        .into_iter()
        .zip(split_pieces(lse, lens(1)))
        .enumerate()
        .collect();
    for_each_chunk_mut(&mut tasks, 1, |_, task| {
        for (t, (o, s)) in task.iter_mut() {
            let (bh, qb) = (*t / blocks, *t % blocks);
            crate::cpu::simd::widest(
                #[inline(always)]
                || forward_block(&d, (&q, &k, &v), &mask, opts, (bh, qb * BQ), o, s),
            );
        }
    });
    Ok(())
}

/// The scratch buffers of one forward block.
struct FwdScratch<C> {
    q: Vec<C>,
    kt: Vec<C>,
    v: Vec<C>,
    s: Vec<C>,
    acc: Vec<C>,
    z: Vec<C>,
}

/// Rows `q0..q0 + BQ` of head `bh`: the online softmax over blocks of keys.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_block<T: AttnElem>(
    d: &AttnDims,
    (q, k, v): (&AttnView<'_, T>, &AttnView<'_, T>, &AttnView<'_, T>),
    mask: &AttnMask<'_, T>,
    opts: &AttnOptions,
    (bh, q0): (usize, usize),
    out: &mut [T],
    lse: &mut [T::Acc],
) {
    type C<T> = <T as AttnElem>::Acc;
    let (b, h) = (bh / d.heads, bh % d.heads);
    let g = h / d.group();
    let rows = lse.len();
    let (e, ev) = (d.dim_qk, d.dim_v);
    let (evp, bkp) = (padded(ev), padded(BK));
    let mut w = FwdScratch::<C<T>> {
        q: vec![C::<T>::ZERO; rows * e],
        kt: vec![C::<T>::ZERO; e * bkp],
        v: vec![C::<T>::ZERO; BK * evp],
        s: vec![C::<T>::ZERO; rows * bkp],
        acc: vec![C::<T>::ZERO; rows * evp],
        z: vec![C::<T>::ZERO; BK],
    };
    load_rows(q, (b, h), q0, rows, e, &mut w.q, e, false);
    let scale = C::<T>::from_f64(opts.scale);
    let keep = opts.dropout.map(|dr| C::<T>::from_f64(1.0 / (1.0 - dr.p)));
    let mut m = vec![C::<T>::NEG_INF; rows];
    let mut sum = vec![C::<T>::ZERO; rows];
    let n_end = key_end(d, opts, q0 + rows);
    let mut k0 = 0;
    while k0 < n_end {
        let nk = (n_end - k0).min(BK);
        load_rows(k, (b, g), k0, nk, e, &mut w.kt, bkp, true);
        load_rows(v, (b, g), k0, nk, ev, &mut w.v, evp, false);
        w.s.fill(C::<T>::ZERO);
        // s = q · kᵀ: rows of q against the columns of kᵀ.
        madd((rows, nk, e), &w.q, (e, 1), &w.kt, bkp, &mut w.s, bkp);
        for r in 0..rows {
            let i = q0 + r;
            let s = &mut w.s[r * bkp..][..nk];
            mask_row(s, scale, mask, (b, h, i), k0, opts.causal);
            let tile_max = max_lanes(s);
            let m_new = if tile_max > m[r] { tile_max } else { m[r] };
            // Nothing seen yet: subtract 0 (exp(-inf) = 0, never inf - inf).
            let m_safe = if m_new == C::<T>::NEG_INF {
                C::<T>::ZERO
            } else {
                m_new
            };
            let alpha = (m[r] - m_safe).fast_exp();
            let tile_sum = exp_sum(s, m_safe);
            sum[r] = sum[r] * alpha + tile_sum;
            m[r] = m_new;
            for x in &mut w.acc[r * evp..][..evp] {
                *x = *x * alpha;
            }
            if let (Some(dr), Some(keep)) = (opts.dropout, keep) {
                let z = &mut w.z[..nk];
                dropout_factors(&dr, dropout_index(d, bh, i, k0), z, keep);
                for (x, &f) in s.iter_mut().zip(z.iter()) {
                    *x = *x * f;
                }
            }
        }
        // acc += P · v (P's padded columns are zero: v's rows past nk are zero too).
        madd((rows, ev, nk), &w.s, (bkp, 1), &w.v, evp, &mut w.acc, evp);
        k0 += BK;
    }
    for r in 0..rows {
        let total = sum[r];
        let inv = if total == C::<T>::ZERO {
            C::<T>::ZERO
        } else {
            C::<T>::ONE / total
        };
        for (o, &a) in out[r * ev..][..ev].iter_mut().zip(&w.acc[r * evp..]) {
            *o = T::narrow(a * inv);
        }
        lse[r] = if total == C::<T>::ZERO {
            C::<T>::INF
        } else {
            m[r] + total.ln()
        };
    }
}
