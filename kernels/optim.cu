// The optimizers' multi-tensor updates (PyTorch's `_fused_sgd_` / `_fused_adam_` /
// `_fused_adamw_`): one launch updates every parameter of one dtype on one device.
//
//   optim_sgd_{f32,f64,f16,bf16}(i64 num_tensors, i64 num_chunks, const i64* table,
//                                double lr, double momentum, double dampening,
//                                double weight_decay, i32 flags)
//       table (i64 entries, n = num_tensors): [0, n) param addresses, [n, 2n) grad
//       addresses, [2n, 3n) momentum-buffer addresses (0 when momentum == 0), [3n, 4n) element
//       counts, [4n, 5n) 1 where the buffer is new (its first step: buf = g), then num_chunks
//       chunk entries `(t << 32) | c`: tensor t's elements [c * OPTIM_CHUNK, (c + 1) *
//       OPTIM_CHUNK). flags: 1 maximize, 2 nesterov.
//   optim_adam_{f32,f64,f16,bf16}(i64 num_tensors, i64 num_chunks, const i64* table,
//                                 double lr, double beta1, double beta2, double eps,
//                                 double weight_decay, i32 flags)
//       table: [0, n) params, [n, 2n) grads, [2n, 3n) exp_avg, [3n, 4n) exp_avg_sq, [4n, 5n)
//       max_exp_avg_sq (0 without amsgrad), [5n, 6n) element counts, [6n, 7n) step sizes
//       `lr / (1 - beta1^step)` and [7n, 8n) `sqrt(1 - beta2^step)` as f64 bit patterns (the
//       bias corrections, computed on the host per tensor, as `_single_tensor_adam` does),
//       then the chunk entries. flags: 1 maximize, 2 amsgrad, 4 decoupled weight decay
//       (AdamW).
//
// Every tensor is contiguous, its state tensors of the param's dtype and numel. Block b
// takes chunks b, b + gridDim.x, ...; any 1-D grid is correct. The math is Ember's per-op
// path (`crates/ember-nn/src/optim/{sgd,adam}.rs`) operation for operation, each scalar cast
// once to the compute type (f32, f64 for f64 params; PyTorch's opmath), with `_rn`
// intrinsics so that nvcc contracts nothing: f32 params get the per-op path's bits. f16/bf16
// params are loaded into f32, updated there, and rounded once per stored value (PyTorch's
// fused kernels; the per-op path rounds after every op).
#include "ember.cuh"

namespace ember {

// Elements per chunk entry; the host's `OPTIM_CHUNK` in crates/ember-tensor/src/cuda/optim.rs.
constexpr i64 OPTIM_CHUNK = 32768;

__device__ __forceinline__ float optim_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double optim_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float optim_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double optim_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float optim_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double optim_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float optim_sqrt(float x) { return sqrt(x); }
__device__ __forceinline__ double optim_sqrt(double x) { return __dsqrt_rn(x); }

// Ember's `maximum`: NaN from either side wins, else the larger.
template <typename W>
__device__ __forceinline__ W optim_max(W a, W b) {
    if (a != a) return a;
    return (b != b || b > a) ? b : a;
}

// The element range [start, end) of tensor `t` that chunk entry `entry` names.
__device__ __forceinline__ void optim_chunk(i64 entry, const i64* numels, i64* t, i64* start, i64* end) {
    *t = entry >> 32;
    *start = (entry & 0xffffffffLL) * OPTIM_CHUNK;
    const i64 n = numels[*t];
    *end = *start + OPTIM_CHUNK < n ? *start + OPTIM_CHUNK : n;
}

template <typename T>
__device__ void optim_sgd(i64 n, i64 num_chunks, const i64* table, double lr, double momentum, double dampening,
                          double weight_decay, i32 flags) {
    using W = typename Widen<T>::type;
    const W neg_lr = static_cast<W>(-lr), mom = static_cast<W>(momentum);
    const W damp_c = static_cast<W>(1.0 - dampening), wd = static_cast<W>(weight_decay);
    const bool maximize = flags & 1, nesterov = flags & 2;
    const bool has_wd = weight_decay != 0.0, has_mom = momentum != 0.0;
    const i64* numels = table + 3 * n;
    const i64* chunks = table + 5 * n;
    for (i64 c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        i64 t, start, end;
        optim_chunk(chunks[c], numels, &t, &start, &end);
        T* p = device_ptr<T>(static_cast<u64>(table[t]));
        const T* gp = device_ptr<T>(static_cast<u64>(table[n + t]));
        T* bp = has_mom ? device_ptr<T>(static_cast<u64>(table[2 * n + t])) : nullptr;
        const bool first = table[4 * n + t] != 0;
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
            const W pv = Widen<T>::in(p[i]);
            W g = Widen<T>::in(gp[i]);
            if (maximize) g = -g;
            if (has_wd) g = optim_add(g, optim_mul(pv, wd));
            if (has_mom) {
                W b = first ? g : optim_add(optim_mul(Widen<T>::in(bp[i]), mom), optim_mul(g, damp_c));
                bp[i] = Widen<T>::out(b);
                g = nesterov ? optim_add(g, optim_mul(b, mom)) : b;
            }
            p[i] = Widen<T>::out(optim_add(pv, optim_mul(g, neg_lr)));
        }
    }
}

template <typename T>
__device__ void optim_adam(i64 n, i64 num_chunks, const i64* table, double lr, double beta1, double beta2,
                           double eps, double weight_decay, i32 flags) {
    using W = typename Widen<T>::type;
    const bool maximize = flags & 1, amsgrad = flags & 2, decoupled = flags & 4;
    const bool has_wd = weight_decay != 0.0;
    const W decay = static_cast<W>(1.0 - lr * weight_decay), wd = static_cast<W>(weight_decay);
    // lerp(m, g, w) with w = 1 - beta1 in W, as `Tensor::lerp_`: forwards for |w| < 0.5,
    // else backwards from g with (1 - w) computed in W.
    const W w = static_cast<W>(1.0 - beta1);
    const W one_minus_w = optim_sub(static_cast<W>(1.0), w);
    const bool forwards = static_cast<double>(w) < 0.5 && static_cast<double>(w) > -0.5;
    const W b2 = static_cast<W>(beta2), one_minus_b2 = static_cast<W>(1.0 - beta2);
    const W eps_w = static_cast<W>(eps);
    const i64* numels = table + 5 * n;
    const i64* chunks = table + 8 * n;
    for (i64 c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        i64 t, start, end;
        optim_chunk(chunks[c], numels, &t, &start, &end);
        T* p = device_ptr<T>(static_cast<u64>(table[t]));
        const T* gp = device_ptr<T>(static_cast<u64>(table[n + t]));
        T* mp = device_ptr<T>(static_cast<u64>(table[2 * n + t]));
        T* vp = device_ptr<T>(static_cast<u64>(table[3 * n + t]));
        T* xp = amsgrad ? device_ptr<T>(static_cast<u64>(table[4 * n + t])) : nullptr;
        const W neg_step_size = static_cast<W>(-__longlong_as_double(table[6 * n + t]));
        const W bc2_sqrt = static_cast<W>(__longlong_as_double(table[7 * n + t]));
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
            W pv = Widen<T>::in(p[i]);
            W g = Widen<T>::in(gp[i]);
            if (maximize) g = -g;
            if (has_wd) {
                if (decoupled) {
                    pv = optim_mul(pv, decay);
                } else {
                    g = optim_add(g, optim_mul(pv, wd));
                }
            }
            const W m0 = Widen<T>::in(mp[i]);
            const W m = forwards ? optim_add(m0, optim_mul(w, optim_sub(g, m0)))
                                 : optim_sub(g, optim_mul(optim_sub(g, m0), one_minus_w));
            const W v = optim_add(optim_mul(Widen<T>::in(vp[i]), b2), optim_mul(optim_mul(one_minus_b2, g), g));
            W second = v;
            if (amsgrad) {
                second = optim_max(Widen<T>::in(xp[i]), v);
                xp[i] = Widen<T>::out(second);
            }
            const W denom = optim_add(optim_sqrt(second) / bc2_sqrt, eps_w);
            mp[i] = Widen<T>::out(m);
            vp[i] = Widen<T>::out(v);
            p[i] = Widen<T>::out(optim_add(pv, optim_mul(neg_step_size, m) / denom));
        }
    }
}

}  // namespace ember

#define EMBER_OPTIM(SUFFIX, T)                                                                              \
    extern "C" __global__ void optim_sgd_##SUFFIX(ember::i64 n, ember::i64 num_chunks, const ember::i64* table, \
                                                  double lr, double momentum, double dampening,             \
                                                  double weight_decay, ember::i32 flags) {                  \
        ember::optim_sgd<T>(n, num_chunks, table, lr, momentum, dampening, weight_decay, flags);            \
    }                                                                                                       \
    EMBER_REGISTER_KERNEL(optim_sgd_##SUFFIX)                                                               \
    extern "C" __global__ void optim_adam_##SUFFIX(ember::i64 n, ember::i64 num_chunks, const ember::i64* table, \
                                                   double lr, double beta1, double beta2, double eps,       \
                                                   double weight_decay, ember::i32 flags) {                 \
        ember::optim_adam<T>(n, num_chunks, table, lr, beta1, beta2, eps, weight_decay, flags);             \
    }                                                                                                       \
    EMBER_REGISTER_KERNEL(optim_adam_##SUFFIX)

EMBER_OPTIM(f32, float)
EMBER_OPTIM(f64, double)
EMBER_OPTIM(f16, ember::f16)
EMBER_OPTIM(bf16, ember::bf16)
