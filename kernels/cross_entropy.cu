// Fused cross-entropy with class-index targets (crates/ember-tensor/src/ops/loss_fused.rs;
// CPU: crates/ember-tensor/src/cpu/cross_entropy.rs): the forward reads each row of logits
// once and writes one loss per row; the backward writes the gradient of the logits once.
//
//   cross_entropy_fwd_{T}_{I}(i64 rows, i64 classes, i64 len, const T* x, const I* target,
//                             i64 t_sn, i64 t_sl, const C* weight, i64 w_s, i64 ignore_index,
//                             f64 smoothing, C* loss, C* wout, C* lse, i64* err)
//   cross_entropy_bwd_{T}_{I}(i64 rows, i64 classes, i64 len, const T* x, const C* lse,
//                             const I* target, i64 t_sn, i64 t_sl, const C* weight, i64 w_s,
//                             i64 ignore_index, f64 smoothing, const C* wsum, const C* grad,
//                             i64 g_s, const C* total, T* dx)
//       T = f32, f64, f16, bf16 (the logits, read and written as such); C = the compute type
//       (f32 for f32/f16/bf16, f64 for f64); I = i64 or i32. 8 + 8 kernels.
//   cross_entropy_mean_{C}(i64 rows, const C* loss, const C* wout, C* out, C* total)
//       C = f32, f64. 2 kernels.
//
// x is the contiguous [N, C, L] logits (classes = C, len = L, rows = N·L: a "row" is the C
// scores of one (n, l), C elements apart by L). target is [N, L], element (n, l) at
// target[n*t_sn + l*t_sl]; weight is [C] with stride w_s, or null (every weight 1). Per row i
// = n·L + l with t = target(n, l), m the row's max, s = Σ exp(x - m) (softmax.cuh) and
// logp_c = (x_c - m) - ln s:
//   forward: lse[i] = m + ln s; t == ignore_index: loss = wout = 0; 0 <= t < C: wout[i] = w_t,
//     loss[i] = -(w_t·logp_t) (bit-identical to log_softmax then nll_loss, which reduce the row
//     in the same order), and with ε = smoothing > 0: (1-ε)·that + (ε/C)·Σ_c -w_c·logp_c (the
//     sum a second pass over the row, from cache); otherwise a bad target: the error slot
//     (kernels/loss.cu, Note [Index error slot]: err[0] = the smallest bad row, err[1] a bad
//     value) and loss = wout = 0.
//   backward (Note [Cross-entropy backward] in crates/ember-autograd/src/ops/loss.rs): with
//     v = [t valid], a_c = v·((1-ε)·w_t·[c = t] + (ε/C)·w_c), A = Σ_c a_c = v·((1-ε)·w_t +
//     (ε/C)·W) (W = *wsum, Σ_c w_c, or C without weight; wsum is read only when ε > 0 and
//     there is a weight) and scale = grad[i·g_s] (g_s = 0: a scalar upstream gradient),
//     divided by *total (Σ wout, the mean's divisor) unless total is null:
//     dx[n, c, l] = scale·(exp(x - lse)·A - a_c).
//
//   mean (the `mean` reduction of up to 2^16 rows, crates/ember-tensor/src/cuda/fused.rs):
//     out[0] = Σ_i loss[i] / Σ_i wout[i] and total[0] = Σ_i wout[i] (the backward's divisor),
//     one launch where the reduction of two tensors and a division took three.
//
// Work shapes: L == 1 (contiguous rows): one block per row (grid-stride over rows), blockDim.x
// a multiple of 32, the row walked by `for_row` (16-byte loads, 32-bit indices below 2^31
// classes; the same block size as log_softmax's, so the same (m, s)); L > 1: one thread per
// row, reading the C scores coalesced across threads. Any 1-D grid.
//
// Bound (per row, f32 logits, i64 targets): forward reads C·sizeof(T) + 8 (target) + 4
// (weight, cached) and writes 12 (loss, wout, lse): for [4096, 1000] f32 16.4 MB + 82 KB,
// 4.9 µs at 3.35 TB/s; ~6 flops per score (max, exp, add, rescale), ~4 more with smoothing.
// Backward reads C·sizeof(T) + 16 and writes C·sizeof(T): 32.8 MB, 9.8 µs for [4096, 1000]
// f32; ~5 flops per score (exp, multiply, subtract, scale). Mean: one block (any multiple of
// 32 threads), each thread summing a strided share of both arrays, combined over the block
// in a fixed order (deterministic); reads 2·rows·sizeof(C), 32 KB for 4096 f32 rows, bound
// by its launch.
#include "softmax.cuh"

namespace ember {

// The target of row i (n = i / len, l = i % len), as i64.
template <typename I>
__device__ __forceinline__ i64 ce_target(const I* target, i64 i, i64 len, i64 t_sn, i64 t_sl) {
    const i64 n = i / len, l = i - n * len;
    return static_cast<i64>(target[n * t_sn + l * t_sl]);
}

template <typename C>
__device__ __forceinline__ C ce_weight(const C* weight, i64 w_s, i64 c) {
    return weight != nullptr ? weight[c * w_s] : static_cast<C>(1);
}

// The loss of one row from its (m, s), the target and (with smoothing) Σ_c w_c·logp_c.
template <typename C>
__device__ __forceinline__ C ce_row_loss(C logp_t, C w_t, double smoothing, C smooth_sum, i64 classes) {
    const C nll = -(w_t * logp_t);
    if (smoothing == 0.0) return nll;
    const C eps = static_cast<C>(smoothing);
    return (static_cast<C>(1) - eps) * nll + (eps / static_cast<C>(classes)) * (-smooth_sum);
}

// Forward of one contiguous row (len == 1), by the whole block.
template <typename Idx, typename T, typename I>
__device__ __forceinline__ void ce_fwd_row(i64 i, Idx classes, const T* __restrict__ x, i64 t,
                                           const typename Widen<T>::type* weight, i64 w_s, i64 ignore_index,
                                           double smoothing, typename Widen<T>::type* loss,
                                           typename Widen<T>::type* wout, typename Widen<T>::type* lse, i64* err,
                                           MaxSum<typename Widen<T>::type>* scratch,
                                           typename Widen<T>::type* sum_scratch) {
    using C = typename Widen<T>::type;
    const T* row = x + i * static_cast<i64>(classes);
    const MaxSum<C> a = row_max_sum<Idx>(row, classes, scratch);
    const C ln_s = sm_log(a.s);
    const bool valid = t != ignore_index && t >= 0 && t < static_cast<i64>(classes);
    C smooth_sum = 0;
    if (smoothing != 0.0 && valid) {
        C acc = 0;
        for_row<Idx>(row, classes, [&](Idx c, T v) { acc += ce_weight(weight, w_s, c) * ((Widen<T>::in(v) - a.m) - ln_s); });
        smooth_sum = block_combine<RowSumOp<C>>(acc, sum_scratch);
    }
    if (threadIdx.x != 0) return;
    lse[i] = a.m + ln_s;
    C lv = 0, wv = 0;
    if (t != ignore_index) {
        if (!valid) {
            atomicMin(err, i);
            atomicExch(reinterpret_cast<u64*>(err + 1), static_cast<u64>(t));
        } else {
            wv = ce_weight(weight, w_s, t);
            lv = ce_row_loss((Widen<T>::in(row[t]) - a.m) - ln_s, wv, smoothing, smooth_sum, classes);
        }
    }
    loss[i] = lv;
    wout[i] = wv;
}

template <typename T, typename I>
__device__ void cross_entropy_fwd(i64 rows, i64 classes, i64 len, const T* __restrict__ x, const I* __restrict__ target,
                                  i64 t_sn, i64 t_sl, const typename Widen<T>::type* __restrict__ weight, i64 w_s,
                                  i64 ignore_index, double smoothing, typename Widen<T>::type* __restrict__ loss,
                                  typename Widen<T>::type* __restrict__ wout, typename Widen<T>::type* __restrict__ lse,
                                  i64* err) {
    using C = typename Widen<T>::type;
    using Op = MaxSumOp<C>;
    if (len == 1) {
        __shared__ MaxSum<C> scratch[32];
        __shared__ C sum_scratch[32];
        for (i64 i = blockIdx.x; i < rows; i += gridDim.x) {
            const i64 t = ce_target(target, i, 1, t_sn, t_sl);
            if (classes < (i64(1) << 31)) {
                ce_fwd_row<u32, T, I>(i, static_cast<u32>(classes), x, t, weight, w_s, ignore_index, smoothing, loss,
                                      wout, lse, err, scratch, sum_scratch);
            } else {
                ce_fwd_row<i64, T, I>(i, classes, x, t, weight, w_s, ignore_index, smoothing, loss, wout, lse, err,
                                      scratch, sum_scratch);
            }
        }
        return;
    }
    for (i64 i = global_thread_id(); i < rows; i += grid_stride()) {
        const i64 n = i / len, l = i - n * len;
        const T* col = x + n * classes * len + l;
        MaxSum<C> a = Op::identity();
        for (i64 c = 0; c < classes; c++) a = Op::step(a, Widen<T>::in(col[c * len]));
        const C ln_s = sm_log(a.s);
        lse[i] = a.m + ln_s;
        const i64 t = static_cast<i64>(target[n * t_sn + l * t_sl]);
        C lv = 0, wv = 0;
        if (t != ignore_index) {
            if (t < 0 || t >= classes) {
                atomicMin(err, i);
                atomicExch(reinterpret_cast<u64*>(err + 1), static_cast<u64>(t));
            } else {
                C smooth_sum = 0;
                if (smoothing != 0.0) {
                    for (i64 c = 0; c < classes; c++) {
                        smooth_sum += ce_weight(weight, w_s, c) * ((Widen<T>::in(col[c * len]) - a.m) - ln_s);
                    }
                }
                wv = ce_weight(weight, w_s, t);
                lv = ce_row_loss((Widen<T>::in(col[t * len]) - a.m) - ln_s, wv, smoothing, smooth_sum, classes);
            }
        }
        loss[i] = lv;
        wout[i] = wv;
    }
}

// The per-row factors of the backward: A (Σ_c a_c), (1-ε)·w_t for c = t, ε/C for the smoothing
// share of each w_c, and the upstream scale.
template <typename C>
struct CeRow {
    C big_a, hit, share, scale;
    i64 t;
};

template <typename C, typename I>
__device__ __forceinline__ CeRow<C> ce_bwd_row(i64 i, i64 classes, i64 len, const I* target, i64 t_sn, i64 t_sl,
                                              const C* weight, i64 w_s, i64 ignore_index, double smoothing,
                                              const C* wsum, const C* grad, i64 g_s, const C* total) {
    CeRow<C> r;
    r.t = ce_target(target, i, len, t_sn, t_sl);
    const bool valid = r.t != ignore_index && r.t >= 0 && r.t < classes;
    const C eps = static_cast<C>(smoothing);
    const C w_t = valid ? ce_weight(weight, w_s, r.t) : static_cast<C>(0);
    r.hit = (static_cast<C>(1) - eps) * w_t;
    r.share = valid ? eps / static_cast<C>(classes) : static_cast<C>(0);
    const C big_w = smoothing == 0.0 ? static_cast<C>(0) : (weight != nullptr ? *wsum : static_cast<C>(classes));
    r.big_a = valid ? r.hit + r.share * big_w : static_cast<C>(0);
    if (!valid) r.t = -1;
    r.scale = grad[i * g_s];
    if (total != nullptr) r.scale = r.scale / *total;
    return r;
}

template <typename T>
__device__ __forceinline__ T ce_grad(const CeRow<typename Widen<T>::type>& r, typename Widen<T>::type xv,
                                     typename Widen<T>::type lse, typename Widen<T>::type w_c, bool is_t) {
    using C = typename Widen<T>::type;
    const C a_c = (is_t ? r.hit : static_cast<C>(0)) + r.share * w_c;
    return Widen<T>::out(r.scale * (sm_exp(xv - lse) * r.big_a - a_c));
}

template <typename Idx, typename T>
__device__ __forceinline__ void ce_bwd_contiguous(const T* __restrict__ x, T* __restrict__ y, Idx classes,
                                                  const CeRow<typename Widen<T>::type>& r,
                                                  typename Widen<T>::type lse,
                                                  const typename Widen<T>::type* weight, i64 w_s) {
    Idx head = 0;
    if (aligned16(x) && aligned16(y)) {
        constexpr Idx N = Pack16<T>::N;
        const Idx packs = classes / N;
        const uint4* x16 = reinterpret_cast<const uint4*>(x);
        uint4* y16 = reinterpret_cast<uint4*>(y);
        for (Idx p = threadIdx.x; p < packs; p += blockDim.x) {
            Pack16<T> v, w;
            v.raw = x16[p];
#pragma unroll
            for (Idx j = 0; j < N; j++) {
                const Idx c = p * N + j;
                w.v[j] = ce_grad<T>(r, Widen<T>::in(v.v[j]), lse, ce_weight(weight, w_s, c), static_cast<i64>(c) == r.t);
            }
            y16[p] = w.raw;
        }
        head = packs * N;
    }
    for (Idx c = head + threadIdx.x; c < classes; c += blockDim.x) {
        y[c] = ce_grad<T>(r, Widen<T>::in(x[c]), lse, ce_weight(weight, w_s, c), static_cast<i64>(c) == r.t);
    }
}

template <typename T, typename I>
__device__ void cross_entropy_bwd(i64 rows, i64 classes, i64 len, const T* __restrict__ x,
                                  const typename Widen<T>::type* __restrict__ lse, const I* __restrict__ target,
                                  i64 t_sn, i64 t_sl, const typename Widen<T>::type* __restrict__ weight, i64 w_s,
                                  i64 ignore_index, double smoothing, const typename Widen<T>::type* wsum,
                                  const typename Widen<T>::type* grad, i64 g_s, const typename Widen<T>::type* total,
                                  T* __restrict__ dx) {
    using C = typename Widen<T>::type;
    if (len == 1) {
        for (i64 i = blockIdx.x; i < rows; i += gridDim.x) {
            const CeRow<C> r = ce_bwd_row<C, I>(i, classes, 1, target, t_sn, t_sl, weight, w_s, ignore_index, smoothing,
                                                wsum, grad, g_s, total);
            const i64 base = i * classes;
            if (classes < (i64(1) << 31)) {
                ce_bwd_contiguous<u32, T>(x + base, dx + base, static_cast<u32>(classes), r, lse[i], weight, w_s);
            } else {
                ce_bwd_contiguous<i64, T>(x + base, dx + base, classes, r, lse[i], weight, w_s);
            }
        }
        return;
    }
    for (i64 i = global_thread_id(); i < rows; i += grid_stride()) {
        const CeRow<C> r = ce_bwd_row<C, I>(i, classes, len, target, t_sn, t_sl, weight, w_s, ignore_index, smoothing,
                                            wsum, grad, g_s, total);
        const i64 n = i / len, l = i - n * len;
        const i64 base = n * classes * len + l;
        const C m = lse[i];
        for (i64 c = 0; c < classes; c++) {
            dx[base + c * len] = ce_grad<T>(r, Widen<T>::in(x[base + c * len]), m, ce_weight(weight, w_s, c), c == r.t);
        }
    }
}

template <typename C>
__device__ void cross_entropy_mean(i64 rows, const C* __restrict__ loss, const C* __restrict__ wout, C* out,
                                   C* total) {
    __shared__ C scratch_l[32];
    __shared__ C scratch_w[32];
    C l = 0, w = 0;
    for (i64 i = threadIdx.x; i < rows; i += blockDim.x) {
        l += loss[i];
        w += wout[i];
    }
    l = block_combine<RowSumOp<C>>(l, scratch_l);
    w = block_combine<RowSumOp<C>>(w, scratch_w);
    if (threadIdx.x == 0) {
        out[0] = l / w;
        total[0] = w;
    }
}

}  // namespace ember

#define EMBER_CE_MEAN(SUFFIX, C)                                                                   \
    extern "C" __global__ void cross_entropy_mean_##SUFFIX(ember::i64 rows, const C* loss, const C* wout, C* out, \
                                                          C* total) {                             \
        ember::cross_entropy_mean<C>(rows, loss, wout, out, total);                                \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(cross_entropy_mean_##SUFFIX)

EMBER_CE_MEAN(f32, float)
EMBER_CE_MEAN(f64, double)

#define EMBER_CE(SUFFIX, T, ISUFFIX, I)                                                            \
    extern "C" __global__ void cross_entropy_fwd_##SUFFIX##_##ISUFFIX(                             \
        ember::i64 rows, ember::i64 classes, ember::i64 len, const T* x, const I* target, ember::i64 t_sn, \
        ember::i64 t_sl, const ember::Widen<T>::type* weight, ember::i64 w_s, ember::i64 ignore_index, \
        double smoothing, ember::Widen<T>::type* loss, ember::Widen<T>::type* wout, ember::Widen<T>::type* lse, \
        ember::i64* err) {                                                                         \
        ember::cross_entropy_fwd<T, I>(rows, classes, len, x, target, t_sn, t_sl, weight, w_s, ignore_index, \
                                       smoothing, loss, wout, lse, err);                           \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(cross_entropy_fwd_##SUFFIX##_##ISUFFIX)                                  \
    extern "C" __global__ void cross_entropy_bwd_##SUFFIX##_##ISUFFIX(                             \
        ember::i64 rows, ember::i64 classes, ember::i64 len, const T* x, const ember::Widen<T>::type* lse, \
        const I* target, ember::i64 t_sn, ember::i64 t_sl, const ember::Widen<T>::type* weight, ember::i64 w_s, \
        ember::i64 ignore_index, double smoothing, const ember::Widen<T>::type* wsum,              \
        const ember::Widen<T>::type* grad, ember::i64 g_s, const ember::Widen<T>::type* total, T* dx) { \
        ember::cross_entropy_bwd<T, I>(rows, classes, len, x, lse, target, t_sn, t_sl, weight, w_s, ignore_index, \
                                       smoothing, wsum, grad, g_s, total, dx);                     \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(cross_entropy_bwd_##SUFFIX##_##ISUFFIX)

EMBER_CE(f32, float, i64, ember::i64)
EMBER_CE(f32, float, i32, ember::i32)
EMBER_CE(f64, double, i64, ember::i64)
EMBER_CE(f64, double, i32, ember::i32)
EMBER_CE(f16, ember::f16, i64, ember::i64)
EMBER_CE(f16, ember::f16, i32, ember::i32)
EMBER_CE(bf16, ember::bf16, i64, ember::i64)
EMBER_CE(bf16, ember::bf16, i32, ember::i32)
