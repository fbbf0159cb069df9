//! The fused attention kernels of `kernels/attention.cu`: their parameter block
//! ([`AttnParams`], the mirror of `ember::AttnParams`), their names ([`AttnKernel`]) and their
//! launch geometry ([`attn_launch_config`]); dropout's Philox conventions
//! ([`keep_threshold`], [`dropout_counters`]). `docs/attention.md` describes the algorithm.

use ember_device::driver::LaunchConfig;

use crate::KernelsError;

/// Threads per block of the tiled kernels (4 warps).
pub const ATTN_THREADS: u32 = 128;
/// Queries (fwd, dq) or keys (dkdv) per block.
pub const ATTN_ROWS: usize = 16;
/// The largest head dim (of q and k, or of v) the kernels take.
pub const ATTN_MAX_HEAD_DIM: usize = 256;
/// Output dims one block computes; larger head dims take `ceil(dim / 128)` passes
/// (`grid.y`), each recomputing the scores.
pub const ATTN_PASS_DIMS: usize = 128;
/// Dynamic shared memory that needs no opt-in on any GPU: the geometry stays below it.
const SHARED_LIMIT: usize = 48 * 1024;
/// Floats of one 32×32 chunk buffer (rows padded to 36).
const CHUNK_FLOATS: usize = 32 * 36;
/// Floats of one 16×32 weight tile.
const WEIGHT_FLOATS: usize = ATTN_ROWS * 32;

/// The scalar parameters of every attention kernel (`ember::AttnParams` in
/// `kernels/attention.cu`; the two must stay identical). Sizes and strides are in elements.
///
/// q is `[batch, heads, len_q, dim_qk]`, k `[batch, kv_heads, len_kv, dim_qk]`, v
/// `[batch, kv_heads, len_kv, dim_v]`, dout `[batch, heads, len_q, dim_v]`, each with the
/// strides given here for its first three dimensions and stride 1 for the last; the mask
/// `[batch, heads, len_q, len_kv]` with four strides (0 where it broadcasts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnParams {
    /// B.
    pub batch: i64,
    /// Heads of q (H).
    pub heads: i64,
    /// Heads of k and v (G, dividing H): q head `h` reads kv head `h / (H / G)`.
    pub kv_heads: i64,
    /// L.
    pub len_q: i64,
    /// S.
    pub len_kv: i64,
    /// E, the head dim of q and k (at most [`ATTN_MAX_HEAD_DIM`]).
    pub dim_qk: i64,
    /// Ev, the head dim of v (at most [`ATTN_MAX_HEAD_DIM`]).
    pub dim_v: i64,
    /// q's stride over the batch.
    pub q_sb: i64,
    /// q's stride over heads.
    pub q_sh: i64,
    /// q's stride over positions.
    pub q_sl: i64,
    /// k's stride over the batch.
    pub k_sb: i64,
    /// k's stride over heads.
    pub k_sh: i64,
    /// k's stride over positions.
    pub k_sl: i64,
    /// v's stride over the batch.
    pub v_sb: i64,
    /// v's stride over heads.
    pub v_sh: i64,
    /// v's stride over positions.
    pub v_sl: i64,
    /// The output gradient's stride over the batch (backward only).
    pub do_sb: i64,
    /// The output gradient's stride over heads.
    pub do_sh: i64,
    /// The output gradient's stride over positions.
    pub do_sl: i64,
    /// The mask's stride over the batch (every mask stride is 0 where it broadcasts).
    pub m_sb: i64,
    /// The mask's stride over heads.
    pub m_sh: i64,
    /// The mask's stride over queries.
    pub m_sl: i64,
    /// The mask's stride over keys.
    pub m_ss: i64,
    /// The first Philox counter the op reserved (`Generator::reserve`).
    pub philox_base: u64,
    /// The Philox key: the seed's low 32 bits.
    pub philox_key0: u32,
    /// The seed's high 32 bits.
    pub philox_key1: u32,
    /// Dropout keeps an element when its word's top 24 bits are below this
    /// ([`keep_threshold`]).
    pub keep_threshold: u32,
    /// Nonzero for PyTorch's `is_causal` (top-left aligned).
    pub causal: i32,
    /// Nonzero to apply dropout.
    pub dropout: i32,
    /// The factor of `q·k` (PyTorch's `scale`, `1/sqrt(E)` by default).
    pub scale: f32,
    /// The factor of kept elements, `1 / (1 - p)`.
    pub dropout_scale: f32,
    /// Zero.
    pub reserved: i32,
}

const _: () = assert!(std::mem::size_of::<AttnParams>() == 224);

/// One of the four attention kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKernel {
    /// `attn_fwd_{T}`: the output and the log-sum-exp per row.
    Forward,
    /// `attn_bwd_prep_{T}`: `delta = rowsum(dout ∘ out)`.
    BackwardPrep,
    /// `attn_bwd_dkdv_{T}`: the gradients of k and v.
    BackwardDkDv,
    /// `attn_bwd_dq_{T}`: the gradient of q.
    BackwardDq,
}

impl AttnKernel {
    /// The entry point for a dtype suffix (`f32`, `f16`, `bf16`).
    pub fn name(self, dtype: &str) -> String {
        let op = match self {
            AttnKernel::Forward => "attn_fwd",
            AttnKernel::BackwardPrep => "attn_bwd_prep",
            AttnKernel::BackwardDkDv => "attn_bwd_dkdv",
            AttnKernel::BackwardDq => "attn_bwd_dq",
        };
        format!("{op}_{dtype}")
    }
}

fn invalid(detail: String) -> KernelsError {
    KernelsError::InvalidLaunch {
        op: "scaled_dot_product_attention",
        detail,
    }
}

/// The launch of `kernel` for `p`, or `None` when it has nothing to do (no query rows for
/// the forward, prep and dq, no keys for dkdv). Errors name a geometry the kernels cannot run:
/// sizes below zero or below one head, heads not a multiple of kv heads, head dims above
/// [`ATTN_MAX_HEAD_DIM`], or a grid too large.
pub fn attn_launch_config(
    kernel: AttnKernel,
    p: &AttnParams,
) -> Result<Option<LaunchConfig>, KernelsError> {
    let sizes = [
        p.batch, p.heads, p.kv_heads, p.len_q, p.len_kv, p.dim_qk, p.dim_v,
    ];
    if sizes.iter().any(|&s| s < 0) || p.heads < 1 || p.kv_heads < 1 {
        return Err(invalid(format!(
            "expected non-negative sizes and at least one head, got {sizes:?}"
        )));
    }
    if p.heads % p.kv_heads != 0 {
        return Err(invalid(format!(
            "{} query heads are not a multiple of {} key/value heads",
            p.heads, p.kv_heads
        )));
    }
    let (e, ev) = (p.dim_qk as usize, p.dim_v as usize);
    if e > ATTN_MAX_HEAD_DIM || ev > ATTN_MAX_HEAD_DIM {
        return Err(invalid(format!(
            "head dims {e} and {ev}: the fused kernels take at most {ATTN_MAX_HEAD_DIM}"
        )));
    }
    let (b, h, g) = (p.batch as u64, p.heads as u64, p.kv_heads as u64);
    let (l, s) = (p.len_q as u64, p.len_kv as u64);
    let padded = |d: usize| d.div_ceil(32) * 32;
    let passes = |d: usize| d.div_ceil(ATTN_PASS_DIMS).max(1) as u32;
    let tiles = |n: u64| n.div_ceil(ATTN_ROWS as u64);
    let (blocks, y, floats) = match kernel {
        AttnKernel::Forward => (
            b * h * tiles(l),
            passes(ev),
            ATTN_ROWS * padded(e) + WEIGHT_FLOATS + 2 * CHUNK_FLOATS,
        ),
        AttnKernel::BackwardDq => (
            b * h * tiles(l),
            passes(e),
            ATTN_ROWS * (padded(e) + padded(ev)) + WEIGHT_FLOATS + 2 * CHUNK_FLOATS,
        ),
        AttnKernel::BackwardDkDv => (
            b * g * tiles(s),
            passes(e).max(passes(ev)),
            ATTN_ROWS * (padded(e) + padded(ev)) + 2 * WEIGHT_FLOATS + 2 * CHUNK_FLOATS,
        ),
        AttnKernel::BackwardPrep => {
            // One warp per row, grid-stride.
            let rows = b * h * l;
            let blocks = rows.div_ceil(u64::from(ATTN_THREADS / 32)).min(65_535);
            (blocks, 1, 0)
        }
    };
    if blocks == 0 {
        return Ok(None);
    }
    if blocks > i32::MAX as u64 {
        return Err(invalid(format!(
            "{blocks} blocks of {ATTN_ROWS} rows exceed the grid's {} (batch {b}, heads {h}, \
             lengths {l} and {s})",
            i32::MAX
        )));
    }
    let bytes = floats * 4;
    debug_assert!(
        bytes <= SHARED_LIMIT,
        "{kernel:?} takes {bytes} bytes of shared memory"
    );
    Ok(Some(LaunchConfig {
        grid: (blocks as u32, y, 1),
        block: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: bytes as u32,
    }))
}

/// The threshold of [`AttnParams::keep_threshold`] for drop probability `p` in `[0, 1)`:
/// `ceil((1 - p)·2^24)`, so that `(w >> 8) < threshold` holds exactly when the CPU's
/// Bernoulli sampler keeps the element (`unit(w, 24) < 1 - p`, philox.rs): for an integer
/// `k`, `k·2^-24 < t·2^-24` if and only if `k < ceil(t)`.
pub fn keep_threshold(p: f64) -> u32 {
    ((1.0 - p) * 16_777_216.0).ceil().clamp(0.0, 16_777_216.0) as u32
}

/// The Philox counters one attention op's dropout reserves: those of
/// `Tensor::dropout_mask` over `[batch, heads, len_q, len_kv]`, `ceil(n / 4)`, so that the
/// generator advances as the unfused path's does.
pub fn dropout_counters(batch: usize, heads: usize, len_q: usize, len_kv: usize) -> u64 {
    let n = (batch as u64) * (heads as u64) * (len_q as u64) * (len_kv as u64);
    n.div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(e: i64, ev: i64) -> AttnParams {
        AttnParams {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            len_q: 33,
            len_kv: 17,
            dim_qk: e,
            dim_v: ev,
            ..AttnParams::default()
        }
    }

    #[test]
    fn geometry_and_shared_memory() {
        let kernels = [
            AttnKernel::Forward,
            AttnKernel::BackwardPrep,
            AttnKernel::BackwardDkDv,
            AttnKernel::BackwardDq,
        ];
        for (e, ev) in [(1, 1), (64, 64), (128, 200), (256, 256)] {
            for k in kernels {
                let c = attn_launch_config(k, &params(e, ev)).unwrap().unwrap();
                assert!(
                    c.shared_mem_bytes as usize <= SHARED_LIMIT,
                    "{k:?} {e} {ev}"
                );
                assert_eq!(c.block, (ATTN_THREADS, 1, 1));
            }
        }
        let f = attn_launch_config(AttnKernel::Forward, &params(64, 200))
            .unwrap()
            .unwrap();
        assert_eq!(f.grid, (2 * 4 * 3, 2, 1));
        let kv = attn_launch_config(AttnKernel::BackwardDkDv, &params(200, 64))
            .unwrap()
            .unwrap();
        assert_eq!(kv.grid, (2 * 2 * 2, 2, 1));
        let mut empty = params(8, 8);
        empty.len_q = 0;
        assert_eq!(
            attn_launch_config(AttnKernel::Forward, &empty).unwrap(),
            None
        );
        assert!(
            attn_launch_config(AttnKernel::BackwardDkDv, &empty)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn bad_geometry_is_an_error() {
        let mut p = params(8, 8);
        p.kv_heads = 3;
        assert!(attn_launch_config(AttnKernel::Forward, &p).is_err());
        assert!(attn_launch_config(AttnKernel::Forward, &params(257, 8)).is_err());
        let mut p = params(8, 8);
        p.kv_heads = 0;
        assert!(attn_launch_config(AttnKernel::Forward, &p).is_err());
    }

    #[test]
    fn the_threshold_keeps_what_the_cpu_sampler_keeps() {
        // unit(w, 24) < 1 - p, the CPU's Bernoulli sampler, against the integer test.
        for p in [0.0, 0.1, 0.25, 0.5, 1.0 / 3.0, 0.999_999_9, 1e-9] {
            let t = keep_threshold(p);
            for k in [0u32, 1, t.saturating_sub(1), t, t + 1, (1 << 24) - 1] {
                let k = k.min((1 << 24) - 1);
                let cpu = f64::from(k) * (1.0 / 16_777_216.0) < 1.0 - p;
                assert_eq!(k < t, cpu, "p {p} k {k} threshold {t}");
            }
        }
        assert_eq!(keep_threshold(0.0), 1 << 24);
        assert_eq!(dropout_counters(2, 3, 5, 7), 53);
    }
}
