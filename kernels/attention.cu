// Fused scaled-dot-product attention (FlashAttention-2's algorithm on CUDA cores): the L×S
// scores live in registers and shared memory one 16×32 tile at a time, never in global memory.
// docs/attention.md has the algorithm, the conventions and how the op calls these kernels;
// crates/ember-tensor/src/cuda/attention.rs launches them, crates/ember-kernels/src/attention.rs
// mirrors AttnParams and computes the launch geometry.
//
//   attn_fwd_{T}(AttnParams p, const T* q, const T* k, const T* v, const T* mask,
//                const bool* bmask, T* o, float* lse)
//   attn_bwd_prep_{T}(AttnParams p, const T* o, const T* dout, float* delta)
//   attn_bwd_dkdv_{T}(AttnParams p, const T* q, const T* k, const T* v, const T* mask,
//                     const bool* bmask, const T* dout, const float* lse, const float* delta,
//                     T* dk, T* dv)
//   attn_bwd_dq_{T}(AttnParams p, const T* q, const T* k, const T* v, const T* mask,
//                   const bool* bmask, const T* dout, const float* lse, const float* delta,
//                   T* dq)
//       T = f32, f16, bf16 (12 kernels); everything is computed in f32 (16-bit inputs are
//       widened once, as they enter shared memory; outputs are rounded once).
//
// Shapes (B = batch, H = heads of q, G = kv_heads, H % G == 0, L = len_q, S = len_kv, E =
// dim_qk <= 256, Ev = dim_v <= 256): q[b, h, i, e] at q + b*q_sb + h*q_sh + i*q_sl + e, k and v
// [B, G, S, E|Ev] likewise (the last dimension of q, k, v and dout has stride 1), dout like q
// with the do_* strides and Ev. o, dq: contiguous [B, H, L, Ev|E]; dk, dv: contiguous
// [B, G, S, E|Ev]; lse, delta: contiguous [B, H, L] f32. Head h of q reads kv head
// h / (H / G) (grouped-query attention; G = H is plain multi-head attention).
//
// Scores: s = scale * (q_i . k_j) + mask(i, j), with mask(i, j) = -inf where
//   - causal and j > i (PyTorch's is_causal: top-left aligned, the mask tril(ones(L, S)),
//     also for L != S), or
//   - bmask is not null and bmask[b*m_sb + h*m_sh + i*m_sl + j*m_ss] is false, or
//   - it is the float mask's value there (mask not null; at most one of mask, bmask is set);
//     mask strides are in elements, 0 where the mask broadcasts.
// P = softmax_j(s) per row; a row whose scores are all -inf (fully masked, or S = 0) has
// P = 0, so o = 0 and every gradient through it is 0 (PyTorch's math path, _safe_softmax);
// its lse is +inf. NaN in the inputs propagates to its rows. With dropout (p.dropout != 0):
// o = (P ∘ Z) v, Z_ij = dropout_scale if kept else 0, kept iff (w >> 8) < keep_threshold for
// the word w of element n = ((b*H + h)*L + i)*S + j of the Philox stream (counter
// philox_base + n / 4, word n % 4; philox.cuh): exactly Tensor::dropout_mask over
// [B, H, L, S] from the same generator state (keep_threshold = ceil((1 - p) * 2^24),
// ember_kernels::attention::keep_threshold). The op reserves ceil(B*H*L*S / 4) counters.
//
// Forward: lse[b, h, i] = log Σ_j exp(s_ij) (natural log, of the scores before dropout).
// Backward (FlashAttention-2): delta_i = Σ_e dout_ie o_ie (attn_bwd_prep), then with
// P_ij = exp(s_ij - lse_i) recomputed from q, k and lse, dPd_ij = dout_i . v_j,
// dS_ij = P_ij (Z_ij dPd_ij - delta_i):
//   dv_j = Σ_i P_ij Z_ij dout_i, dk_j = scale Σ_i dS_ij q_i (attn_bwd_dkdv, summed over the
//   H / G query heads of kv head g), dq_i = scale Σ_j dS_ij k_j (attn_bwd_dq).
// dq is its own kernel (it recomputes s and dPd once more) instead of atomics into an f32
// buffer: no extra memory and deterministic results.
//
// Geometry (ember_kernels::attention::launch_config): 128 threads (4 warps) per block.
//   fwd, dq:  one block per 16 queries of one (b, h): B*H*ceil(L/16) blocks, the heaviest
//             (last, under causal) tiles first. Warp w owns queries 4w..4w+3 of the block;
//             per tile of 32 keys lane j computes the 4 scores of key j, and for the
//             products with v (or k) lane d owns output dims d, d+32, ... (8 accumulators
//             per query for E up to 256).
//   dkdv:     one block per 16 keys of one (b, g): B*G*ceil(S/16) blocks; the same with the
//             roles of queries and keys swapped (tiles of 32 queries, all H/G heads).
//   prep:     one warp per row of dout, grid-stride.
// Shared memory (f32): the block's 16 rows of q (fwd), q and dout (dq), k and v (dkdv), each
// rounded up to a multiple of 32 dims; two 32×32 chunk buffers (rows padded to 36 floats:
// 16-byte aligned, conflict-free float4 reads) through which the other operand's tile passes
// 32 dims at a time; 16×32 floats per weight tile. At most 45 KiB (dkdv, E = Ev = 256), 27 KiB
// for the forward: under the 48 KiB that needs no opt-in. The chunk loop is the reason head
// dims up to 256 fit: the tile of k or v is never whole in shared memory.
//
// Bound (forward, per (b, h), non-causal): 2·L·S·(E + Ev) flops; k and v are read
// ceil(L/16) times (mostly from L2), q once, o written once: with E = Ev = 64, L = S = 1024,
// B·H = 64 in bf16, 17 GFLOP. These are CUDA-core kernels (no tensor-core MMA yet), so they
// are compute-bound at the f32 FMA rate: ~60 TFLOP/s on an H100 SXM would give ~0.3 ms,
// several times slower than PyTorch's tensor-core flash kernel; see docs/attention.md.
#include "philox.cuh"

namespace ember {

// Mirrored by ember_kernels::attention::AttnParams: keep the two identical.
struct AttnParams {
    i64 batch, heads, kv_heads, len_q, len_kv, dim_qk, dim_v;
    i64 q_sb, q_sh, q_sl;
    i64 k_sb, k_sh, k_sl;
    i64 v_sb, v_sh, v_sl;
    i64 do_sb, do_sh, do_sl;
    i64 m_sb, m_sh, m_sl, m_ss;
    u64 philox_base;
    u32 philox_key0, philox_key1;
    u32 keep_threshold;
    i32 causal;
    i32 dropout;
    float scale;
    float dropout_scale;
    i32 reserved;
};
static_assert(sizeof(AttnParams) == 224, "AttnParams must match ember_kernels::attention::AttnParams");

constexpr int ATT_THREADS = 128;
// Blocks per SM the register budget must allow (65536 / (128 * 4) = 128 registers a thread):
// left to itself ptxas hoists the unrolled chunk loads into all 255 and spills in dkdv.
constexpr int ATT_MIN_BLOCKS = 4;
constexpr int ATT_R = 4;            // rows (queries, or keys in dkdv) per warp
constexpr int ATT_ROWS = 16;        // rows per block: 4 warps of ATT_R
constexpr int ATT_TILE = 32;        // columns per tile: one per lane
constexpr int ATT_CHUNK = 32;       // dims per chunk
constexpr int ATT_LD = 36;          // row stride of a chunk buffer, in floats
constexpr int ATT_MAX_CHUNKS = 8;   // dims up to 256
constexpr int ATT_PASS_CHUNKS = 4;  // output dims per pass (blockIdx.y): 128, in registers
constexpr int ATT_CHUNK_FLOATS = ATT_TILE * ATT_LD;
constexpr float ATT_LOG2E = 1.4426950408889634f;
constexpr float ATT_LN2 = 0.6931471805599453f;

__device__ __forceinline__ int att_chunks(i64 dim) { return static_cast<int>((dim + ATT_CHUNK - 1) / ATT_CHUNK); }

// A 32×32 f32 buffer in shared memory holding one chunk (32 dims) of a tile of 32 rows of an
// operand, and which chunk it holds (-1: none). Every thread keeps the same `held`.
struct AttChunk {
    float* buf;
    int held;
};

// Makes `c` hold dims [32·chunk, 32·chunk + 32) of rows [r0, r0 + 32) of the [nrows, ndim]
// operand at `base` (row stride ld, unit dim stride), zero outside it. By the whole block (it
// contains barriers; the skip when the chunk is already there is uniform).
template <typename T>
__device__ __forceinline__ void att_load_chunk(AttChunk& c, int chunk, const T* __restrict__ base, i64 ld, i64 r0,
                                               i64 nrows, i64 ndim) {
    if (c.held == chunk) return;
    __syncthreads();  // every reader of the previous contents is done
#pragma unroll 1
    for (int idx = threadIdx.x; idx < ATT_TILE * ATT_CHUNK; idx += ATT_THREADS) {
        const int r = idx / ATT_CHUNK, e = idx % ATT_CHUNK;
        const i64 row = r0 + r, d = static_cast<i64>(chunk) * ATT_CHUNK + e;
        c.buf[r * ATT_LD + e] = (row < nrows && d < ndim) ? to_f32(base[row * ld + d]) : 0.0f;
    }
    __syncthreads();
    c.held = chunk;
}

// rows[r][e] (r < 16, e < ld, ld a multiple of 32) = the operand's row r0 + r, dim e, zero
// outside [nrows, ndim]. By the whole block; ends with a barrier.
template <typename T>
__device__ __forceinline__ void att_load_rows(float* rows, int ld, const T* __restrict__ base, i64 row_stride, i64 r0,
                                              i64 nrows, i64 ndim) {
    for (int idx = threadIdx.x; idx < ATT_ROWS * ld; idx += ATT_THREADS) {
        const int r = idx / ld, e = idx % ld;
        const i64 row = r0 + r;
        rows[idx] = (row < nrows && e < ndim) ? to_f32(base[row * row_stride + e]) : 0.0f;
    }
    __syncthreads();
}

// s[r] += Σ_{e < 32} a[r·lda + e] · b[e]: the warp's 4 rows (broadcast reads) against this
// lane's row of a chunk buffer.
__device__ __forceinline__ void att_dot(float (&s)[ATT_R], const float* a, int lda, const float* b) {
#pragma unroll 1
    for (int e = 0; e < ATT_CHUNK; e += 4) {
        const float4 bv = *reinterpret_cast<const float4*>(b + e);
#pragma unroll
        for (int r = 0; r < ATT_R; ++r) {
            const float4 av = *reinterpret_cast<const float4*>(a + r * lda + e);
            s[r] = fmaf(av.x, bv.x, s[r]);
            s[r] = fmaf(av.y, bv.y, s[r]);
            s[r] = fmaf(av.z, bv.z, s[r]);
            s[r] = fmaf(av.w, bv.w, s[r]);
        }
    }
}

// add[r] = Σ_{c < 32} w[r·32 + c] · buf[c][lane]: the warp's 4 weight rows (broadcast) times
// column `lane` of a chunk buffer.
__device__ __forceinline__ void att_weigh(float (&add)[ATT_R], const float* w, const float* buf, int lane) {
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) add[r] = 0.0f;
#pragma unroll 1
    for (int c = 0; c < ATT_TILE; c += 4) {
        const float b0 = buf[(c + 0) * ATT_LD + lane], b1 = buf[(c + 1) * ATT_LD + lane];
        const float b2 = buf[(c + 2) * ATT_LD + lane], b3 = buf[(c + 3) * ATT_LD + lane];
#pragma unroll
        for (int r = 0; r < ATT_R; ++r) {
            const float4 wv = *reinterpret_cast<const float4*>(w + r * ATT_TILE + c);
            add[r] = fmaf(wv.x, b0, add[r]);
            add[r] = fmaf(wv.y, b1, add[r]);
            add[r] = fmaf(wv.z, b2, add[r]);
            add[r] = fmaf(wv.w, b3, add[r]);
        }
    }
}

// The score of query i and key j after causal masking and the mask, in log2 units (times
// log2 e); -inf where masked or outside [L, S] (so it contributes nothing).
template <typename T>
__device__ __forceinline__ float att_score2(float dot, const AttnParams& p, const T* mask, const bool* bmask, i64 mbase,
                                            i64 i, i64 j) {
    if (i >= p.len_q || j >= p.len_kv || (p.causal != 0 && j > i)) return -INFINITY;
    float s = dot * p.scale;
    if (bmask != nullptr) {
        if (!bmask[mbase + i * p.m_sl + j * p.m_ss]) return -INFINITY;
    } else if (mask != nullptr) {
        s += to_f32(mask[mbase + i * p.m_sl + j * p.m_ss]);
    }
    return s * ATT_LOG2E;
}

// Dropout's factor for (query head row bh = b*H + h, i, j): dropout_scale if kept, else 0;
// 1 without dropout. Element n = (bh*L + i)*S + j of the stream, as Tensor::dropout_mask
// over [B, H, L, S].
__device__ __forceinline__ float att_dropout(const AttnParams& p, i64 bh, i64 i, i64 j) {
    if (p.dropout == 0) return 1.0f;
    const u64 n = (static_cast<u64>(bh) * static_cast<u64>(p.len_q) + static_cast<u64>(i)) * static_cast<u64>(p.len_kv) +
                  static_cast<u64>(j);
    const PhiloxWords w = philox_block(p.philox_key0, p.philox_key1, p.philox_base, n >> 2);
    const unsigned sel = static_cast<unsigned>(n & 3);
    const u32 word = sel == 0 ? w.w0 : (sel == 1 ? w.w1 : (sel == 2 ? w.w2 : w.w3));
    return (word >> 8) < p.keep_threshold ? p.dropout_scale : 0.0f;
}

// Keys the 16 queries from m0 can see: all S, or under causal up to the last valid query.
__device__ __forceinline__ i64 att_key_end(const AttnParams& p, i64 m0) {
    if (p.causal == 0) return p.len_kv;
    const i64 last = (m0 + ATT_ROWS < p.len_q ? m0 + ATT_ROWS : p.len_q);
    return last < p.len_kv ? last : p.len_kv;
}

// The (b, h, tile) of this block of a B*H*tiles grid. Under causal masking the last query
// tiles (fwd, dq) and the first key tiles (dkdv) have the most work: `last_first` schedules
// the tiles of each (b, h) from the last, so the long blocks start first.
struct AttBlock {
    i64 b, h, bh, tile;
};
__device__ __forceinline__ AttBlock att_block(i64 heads, i64 tiles, bool last_first) {
    const i64 blk = blockIdx.x;
    const i64 bh = blk / tiles;
    const i64 t = blk - bh * tiles;
    const i64 tile = last_first ? tiles - 1 - t : t;
    const i64 b = bh / heads;
    return AttBlock{b, bh - b * heads, bh, tile};
}

template <typename T>
__device__ void attn_fwd(const AttnParams& p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const T* __restrict__ mask, const bool* __restrict__ bmask, T* __restrict__ o,
                         float* __restrict__ lse) {
    EMBER_DYNAMIC_SHARED(float, smem);
    const int nq = att_chunks(p.dim_qk), nv = att_chunks(p.dim_v);
    const int c0 = static_cast<int>(blockIdx.y) * ATT_PASS_CHUNKS;  // this pass's first output chunk
    const int ldq = nq * ATT_CHUNK;
    float* qs = smem;                        // [16][ldq]
    float* ws = qs + ATT_ROWS * ldq;         // [16][32]: P (times dropout) of the tile
    AttChunk kc{ws + ATT_ROWS * ATT_TILE, -1};
    AttChunk vc{kc.buf + ATT_CHUNK_FLOATS, -1};

    const AttBlock blk = att_block(p.heads, (p.len_q + ATT_ROWS - 1) / ATT_ROWS, true);
    const i64 g = blk.h / (p.heads / p.kv_heads);
    const i64 m0 = blk.tile * ATT_ROWS;
    const T* qb = q + blk.b * p.q_sb + blk.h * p.q_sh;
    const T* kb = k + blk.b * p.k_sb + g * p.k_sh;
    const T* vb = v + blk.b * p.v_sb + g * p.v_sh;
    const i64 mbase = blk.b * p.m_sb + blk.h * p.m_sh;
    att_load_rows(qs, ldq, qb, p.q_sl, m0, p.len_q, p.dim_qk);

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float* qw = qs + warp * ATT_R * ldq;
    float* ww = ws + warp * ATT_R * ATT_TILE;
    float m[ATT_R], l[ATT_R], acc[ATT_R][ATT_PASS_CHUNKS];
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int t = 0; t < ATT_PASS_CHUNKS; ++t) acc[r][t] = 0.0f;
    }
    const i64 n_end = att_key_end(p, m0);
    for (i64 n0 = 0; n0 < n_end; n0 += ATT_TILE) {
        kc.held = vc.held = -1;
        float s[ATT_R] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c = 0; c < nq; ++c) {
            att_load_chunk(kc, c, kb, p.k_sl, n0, p.len_kv, p.dim_qk);
            att_dot(s, qw + c * ATT_CHUNK, ldq, kc.buf + lane * ATT_LD);
        }
        const i64 j = n0 + lane;
        __syncwarp();  // the warp's reads of ww (previous tile) are done
#pragma unroll
        for (int r = 0; r < ATT_R; ++r) {
            const i64 i = m0 + warp * ATT_R + r;
            const float x = att_score2(s[r], p, mask, bmask, mbase, i, j);
            const float m_new = fmaxf(m[r], warp_max(x));
            // All -inf so far: subtract 0 instead (exp2(-inf - 0) = 0, never inf - inf).
            const float m_safe = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = exp2f(m[r] - m_safe);
            const float pr = exp2f(x - m_safe);
            l[r] = l[r] * alpha + pr;
#pragma unroll
            for (int t = 0; t < ATT_PASS_CHUNKS; ++t) acc[r][t] *= alpha;
            m[r] = m_new;
            ww[r * ATT_TILE + lane] = pr * att_dropout(p, blk.bh, i, j);
        }
        __syncwarp();
#pragma unroll
        for (int t = 0; t < ATT_PASS_CHUNKS; ++t) {
            if (c0 + t < nv) {
                att_load_chunk(vc, c0 + t, vb, p.v_sl, n0, p.len_kv, p.dim_v);
                float add[ATT_R];
                att_weigh(add, ww, vc.buf, lane);
#pragma unroll
                for (int r = 0; r < ATT_R; ++r) acc[r][t] += add[r];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
        const i64 i = m0 + warp * ATT_R + r;
        const float total = warp_sum(l[r]);
        if (i >= p.len_q) continue;
        // total == 0: every score was -inf (or S = 0): output 0, lse +inf (Note in the header).
        const float inv = total == 0.0f ? 0.0f : 1.0f / total;
        T* orow = o + (blk.bh * p.len_q + i) * p.dim_v;
#pragma unroll
        for (int t = 0; t < ATT_PASS_CHUNKS; ++t) {
            const i64 d = static_cast<i64>(c0 + t) * ATT_CHUNK + lane;
            if (d < p.dim_v) orow[d] = from_f32<T>(acc[r][t] * inv);
        }
        if (lane == 0 && blockIdx.y == 0) lse[blk.bh * p.len_q + i] = total == 0.0f ? INFINITY : (m[r] + log2f(total)) * ATT_LN2;
    }
}

template <typename T>
__device__ void attn_bwd_prep(const AttnParams& p, const T* __restrict__ o, const T* __restrict__ dout,
                              float* __restrict__ delta) {
    const int lane = threadIdx.x % 32;
    const i64 rows = p.batch * p.heads * p.len_q;
    const i64 warps = static_cast<i64>(blockDim.x / 32);
    for (i64 row = static_cast<i64>(blockIdx.x) * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {
        const i64 bh = row / p.len_q, i = row - bh * p.len_q;
        const i64 b = bh / p.heads, h = bh - b * p.heads;
        const T* orow = o + row * p.dim_v;
        const T* drow = dout + b * p.do_sb + h * p.do_sh + i * p.do_sl;
        float sum = 0.0f;
        for (i64 d = lane; d < p.dim_v; d += 32) sum = fmaf(to_f32(drow[d]), to_f32(orow[d]), sum);
        sum = warp_sum(sum);
        if (lane == 0) delta[row] = sum;
    }
}

template <typename T>
__device__ void attn_bwd_dkdv(const AttnParams& p, const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, const T* __restrict__ mask, const bool* __restrict__ bmask,
                              const T* __restrict__ dout, const float* __restrict__ lse,
                              const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv) {
    EMBER_DYNAMIC_SHARED(float, smem);
    const int nq = att_chunks(p.dim_qk), nv = att_chunks(p.dim_v);
    const int c0 = static_cast<int>(blockIdx.y) * ATT_PASS_CHUNKS;  // this pass's first output chunk
    const int ldq = nq * ATT_CHUNK, ldv = nv * ATT_CHUNK;
    float* ks = smem;                        // [16][ldq]
    float* vs = ks + ATT_ROWS * ldq;         // [16][ldv]
    float* w1 = vs + ATT_ROWS * ldv;         // [16][32]: P·Z, weights of dout for dv
    float* w2 = w1 + ATT_ROWS * ATT_TILE;    // [16][32]: dS, weights of q for dk
    AttChunk qc{w2 + ATT_ROWS * ATT_TILE, -1};
    AttChunk dc{qc.buf + ATT_CHUNK_FLOATS, -1};

    const AttBlock blk = att_block(p.kv_heads, (p.len_kv + ATT_ROWS - 1) / ATT_ROWS, false);
    const i64 g = blk.h, n0 = blk.tile * ATT_ROWS;
    att_load_rows(ks, ldq, k + blk.b * p.k_sb + g * p.k_sh, p.k_sl, n0, p.len_kv, p.dim_qk);
    att_load_rows(vs, ldv, v + blk.b * p.v_sb + g * p.v_sh, p.v_sl, n0, p.len_kv, p.dim_v);

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float* kw = ks + warp * ATT_R * ldq;
    const float* vw = vs + warp * ATT_R * ldv;
    float* w1w = w1 + warp * ATT_R * ATT_TILE;
    float* w2w = w2 + warp * ATT_R * ATT_TILE;
    float dka[ATT_R][ATT_PASS_CHUNKS], dva[ATT_R][ATT_PASS_CHUNKS];
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
#pragma unroll
        for (int t = 0; t < ATT_PASS_CHUNKS; ++t) dka[r][t] = dva[r][t] = 0.0f;
    }
    const i64 group = p.heads / p.kv_heads;
    // Under causal only queries i >= j see key j: start at the tile holding query n0.
    const i64 m_start = p.causal != 0 ? (n0 / ATT_TILE) * ATT_TILE : 0;
    for (i64 hh = 0; hh < group; ++hh) {
        const i64 h = g * group + hh, bh = blk.b * p.heads + h;
        const T* qb = q + blk.b * p.q_sb + h * p.q_sh;
        const T* db = dout + blk.b * p.do_sb + h * p.do_sh;
        const i64 mbase = blk.b * p.m_sb + h * p.m_sh;
        for (i64 m0 = m_start; m0 < p.len_q; m0 += ATT_TILE) {
            qc.held = dc.held = -1;
            const i64 i = m0 + lane;
            const float lse2 = i < p.len_q ? lse[bh * p.len_q + i] * ATT_LOG2E : INFINITY;
            const float dl = i < p.len_q ? delta[bh * p.len_q + i] : 0.0f;
            float s[ATT_R] = {0.0f, 0.0f, 0.0f, 0.0f}, dp[ATT_R] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int c = 0; c < nq; ++c) {
                att_load_chunk(qc, c, qb, p.q_sl, m0, p.len_q, p.dim_qk);
                att_dot(s, kw + c * ATT_CHUNK, ldq, qc.buf + lane * ATT_LD);
            }
            for (int c = 0; c < nv; ++c) {
                att_load_chunk(dc, c, db, p.do_sl, m0, p.len_q, p.dim_v);
                att_dot(dp, vw + c * ATT_CHUNK, ldv, dc.buf + lane * ATT_LD);
            }
            __syncwarp();
#pragma unroll
            for (int r = 0; r < ATT_R; ++r) {
                const i64 j = n0 + warp * ATT_R + r;
                const float pr = exp2f(att_score2(s[r], p, mask, bmask, mbase, i, j) - lse2);
                const float z = att_dropout(p, bh, i, j);
                w1w[r * ATT_TILE + lane] = pr * z;
                w2w[r * ATT_TILE + lane] = pr * (z * dp[r] - dl);
            }
            __syncwarp();
            // Chunks in reverse: the last chunk loaded above is reused.
#pragma unroll
            for (int t = ATT_PASS_CHUNKS - 1; t >= 0; --t) {
                if (c0 + t < nv) {
                    att_load_chunk(dc, c0 + t, db, p.do_sl, m0, p.len_q, p.dim_v);
                    float add[ATT_R];
                    att_weigh(add, w1w, dc.buf, lane);
#pragma unroll
                    for (int r = 0; r < ATT_R; ++r) dva[r][t] += add[r];
                }
            }
#pragma unroll
            for (int t = ATT_PASS_CHUNKS - 1; t >= 0; --t) {
                if (c0 + t < nq) {
                    att_load_chunk(qc, c0 + t, qb, p.q_sl, m0, p.len_q, p.dim_qk);
                    float add[ATT_R];
                    att_weigh(add, w2w, qc.buf, lane);
#pragma unroll
                    for (int r = 0; r < ATT_R; ++r) dka[r][t] += add[r];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
        const i64 j = n0 + warp * ATT_R + r;
        if (j >= p.len_kv) continue;
        T* dkrow = dk + (blk.bh * p.len_kv + j) * p.dim_qk;
        T* dvrow = dv + (blk.bh * p.len_kv + j) * p.dim_v;
#pragma unroll
        for (int t = 0; t < ATT_PASS_CHUNKS; ++t) {
            const i64 d = static_cast<i64>(c0 + t) * ATT_CHUNK + lane;
            if (d < p.dim_qk) dkrow[d] = from_f32<T>(dka[r][t] * p.scale);
            if (d < p.dim_v) dvrow[d] = from_f32<T>(dva[r][t]);
        }
    }
}

template <typename T>
__device__ void attn_bwd_dq(const AttnParams& p, const T* __restrict__ q, const T* __restrict__ k,
                            const T* __restrict__ v, const T* __restrict__ mask, const bool* __restrict__ bmask,
                            const T* __restrict__ dout, const float* __restrict__ lse,
                            const float* __restrict__ delta, T* __restrict__ dq) {
    EMBER_DYNAMIC_SHARED(float, smem);
    const int nq = att_chunks(p.dim_qk), nv = att_chunks(p.dim_v);
    const int c0 = static_cast<int>(blockIdx.y) * ATT_PASS_CHUNKS;  // this pass's first output chunk
    const int ldq = nq * ATT_CHUNK, ldv = nv * ATT_CHUNK;
    float* qs = smem;                        // [16][ldq]
    float* ds = qs + ATT_ROWS * ldq;         // [16][ldv]: dout
    float* ws = ds + ATT_ROWS * ldv;         // [16][32]: dS
    AttChunk kc{ws + ATT_ROWS * ATT_TILE, -1};
    AttChunk vc{kc.buf + ATT_CHUNK_FLOATS, -1};

    const AttBlock blk = att_block(p.heads, (p.len_q + ATT_ROWS - 1) / ATT_ROWS, true);
    const i64 g = blk.h / (p.heads / p.kv_heads);
    const i64 m0 = blk.tile * ATT_ROWS;
    const T* kb = k + blk.b * p.k_sb + g * p.k_sh;
    const T* vb = v + blk.b * p.v_sb + g * p.v_sh;
    const i64 mbase = blk.b * p.m_sb + blk.h * p.m_sh;
    att_load_rows(qs, ldq, q + blk.b * p.q_sb + blk.h * p.q_sh, p.q_sl, m0, p.len_q, p.dim_qk);
    att_load_rows(ds, ldv, dout + blk.b * p.do_sb + blk.h * p.do_sh, p.do_sl, m0, p.len_q, p.dim_v);

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float* qw = qs + warp * ATT_R * ldq;
    const float* dw = ds + warp * ATT_R * ldv;
    float* ww = ws + warp * ATT_R * ATT_TILE;
    float lse2[ATT_R], dl[ATT_R], acc[ATT_R][ATT_PASS_CHUNKS];
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
        const i64 i = m0 + warp * ATT_R + r;
        lse2[r] = i < p.len_q ? lse[blk.bh * p.len_q + i] * ATT_LOG2E : INFINITY;
        dl[r] = i < p.len_q ? delta[blk.bh * p.len_q + i] : 0.0f;
#pragma unroll
        for (int t = 0; t < ATT_PASS_CHUNKS; ++t) acc[r][t] = 0.0f;
    }
    const i64 n_end = att_key_end(p, m0);
    for (i64 n0 = 0; n0 < n_end; n0 += ATT_TILE) {
        kc.held = vc.held = -1;
        float s[ATT_R] = {0.0f, 0.0f, 0.0f, 0.0f}, dp[ATT_R] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c = 0; c < nq; ++c) {
            att_load_chunk(kc, c, kb, p.k_sl, n0, p.len_kv, p.dim_qk);
            att_dot(s, qw + c * ATT_CHUNK, ldq, kc.buf + lane * ATT_LD);
        }
        for (int c = 0; c < nv; ++c) {
            att_load_chunk(vc, c, vb, p.v_sl, n0, p.len_kv, p.dim_v);
            att_dot(dp, dw + c * ATT_CHUNK, ldv, vc.buf + lane * ATT_LD);
        }
        const i64 j = n0 + lane;
        __syncwarp();
#pragma unroll
        for (int r = 0; r < ATT_R; ++r) {
            const i64 i = m0 + warp * ATT_R + r;
            const float pr = exp2f(att_score2(s[r], p, mask, bmask, mbase, i, j) - lse2[r]);
            ww[r * ATT_TILE + lane] = pr * (att_dropout(p, blk.bh, i, j) * dp[r] - dl[r]);
        }
        __syncwarp();
#pragma unroll
        for (int t = ATT_PASS_CHUNKS - 1; t >= 0; --t) {
            if (c0 + t < nq) {
                att_load_chunk(kc, c0 + t, kb, p.k_sl, n0, p.len_kv, p.dim_qk);
                float add[ATT_R];
                att_weigh(add, ww, kc.buf, lane);
#pragma unroll
                for (int r = 0; r < ATT_R; ++r) acc[r][t] += add[r];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
        const i64 i = m0 + warp * ATT_R + r;
        if (i >= p.len_q) continue;
        T* row = dq + (blk.bh * p.len_q + i) * p.dim_qk;
#pragma unroll
        for (int t = 0; t < ATT_PASS_CHUNKS; ++t) {
            const i64 d = static_cast<i64>(c0 + t) * ATT_CHUNK + lane;
            if (d < p.dim_qk) row[d] = from_f32<T>(acc[r][t] * p.scale);
        }
    }
}

}  // namespace ember

#define EMBER_ATTENTION(SUFFIX, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(ember::ATT_THREADS, ember::ATT_MIN_BLOCKS)                               \
        attn_fwd_##SUFFIX(ember::AttnParams p, const T* q, const T* k, const T* v, const T* mask,  \
                          const bool* bmask, T* o, float* lse) {                                   \
        ember::attn_fwd<T>(p, q, k, v, mask, bmask, o, lse);                                       \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(attn_fwd_##SUFFIX)                                                       \
    extern "C" __global__ void attn_bwd_prep_##SUFFIX(ember::AttnParams p, const T* o, const T* dout, \
                                                      float* delta) {                              \
        ember::attn_bwd_prep<T>(p, o, dout, delta);                                                \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(attn_bwd_prep_##SUFFIX)                                                  \
    extern "C" __global__ void __launch_bounds__(ember::ATT_THREADS, ember::ATT_MIN_BLOCKS)                               \
        attn_bwd_dkdv_##SUFFIX(ember::AttnParams p, const T* q, const T* k, const T* v, const T* mask, \
                               const bool* bmask, const T* dout, const float* lse, const float* delta, \
                               T* dk, T* dv) {                                                     \
        ember::attn_bwd_dkdv<T>(p, q, k, v, mask, bmask, dout, lse, delta, dk, dv);                \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(attn_bwd_dkdv_##SUFFIX)                                                  \
    extern "C" __global__ void __launch_bounds__(ember::ATT_THREADS, ember::ATT_MIN_BLOCKS)                               \
        attn_bwd_dq_##SUFFIX(ember::AttnParams p, const T* q, const T* k, const T* v, const T* mask, \
                             const bool* bmask, const T* dout, const float* lse, const float* delta, \
                             T* dq) {                                                              \
        ember::attn_bwd_dq<T>(p, q, k, v, mask, bmask, dout, lse, delta, dq);                      \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(attn_bwd_dq_##SUFFIX)

EMBER_ATTENTION(f32, float)
EMBER_ATTENTION(f16, ember::f16)
EMBER_ATTENTION(bf16, ember::bf16)
