// Fused batch normalisation over [N, C, S] (S = the product of the spatial dims, 1 for
// BatchNorm1d on [N, C]): crates/ember-tensor/src/ops/norm.rs; CPU:
// crates/ember-tensor/src/cpu/batch_norm.rs. Every tensor is contiguous; per-channel vectors
// are [C] in the compute type C (f32 for f32/f16/bf16, f64 for f64); T is the element type,
// read and written as such (16-bit computed in f32).
//
//   batch_norm_stats_{T}(i64 n, i64 c, i64 s, const T* x, C* mean, C* invstd, C* running_mean,
//                        C* running_var, f64 momentum, f64 eps)
//       Training statistics: per channel, over its M = N·S elements, the mean and the biased
//       variance by Welford's update per thread, merged over the block (Chan et al.);
//       invstd = 1 / sqrt(var + eps). With running_mean/running_var non-null (both or
//       neither) also PyTorch's update: running_mean = (1 - momentum)·running_mean +
//       momentum·mean, running_var = (1 - momentum)·running_var + momentum·var·M / (M - 1).
//       One block per channel (grid-stride over channels), blockDim.x a multiple of 32.
//   batch_norm_apply_{T}(i64 n, i64 c, i64 s, const T* x, const C* mean, const C* v, i64 is_var,
//                        f64 eps, const C* weight, const C* bias, T* y)
//       y = (x - mean[ch])·k[ch]·weight[ch] + bias[ch], k = v (an invstd) or, with is_var,
//       1 / sqrt(v + eps) (eval mode: the running variance); weight/bias null: 1 and 0.
//   batch_norm_bwd_reduce_{T}(i64 n, i64 c, i64 s, const T* dy, const T* x, const C* mean,
//                             const C* v, i64 is_var, f64 eps, C* sum_dy, C* sum_dy_xhat)
//       Per channel Σ dy and Σ dy·x̂ with x̂ = (x - mean)·k: the bias and weight gradients. One
//       block per channel, as the stats.
//   batch_norm_bwd_elem_{T}(i64 n, i64 c, i64 s, const T* dy, const T* x, const C* mean,
//                           const C* v, i64 is_var, f64 eps, const C* weight, const C* sum_dy,
//                           const C* sum_dy_xhat, i64 training, T* dx)
//       training (batch statistics): dx = w·k·(dy - Σdy / M - x̂·Σ(dy·x̂) / M);
//       otherwise (running statistics, constants): dx = dy·w·k; sum_dy/sum_dy_xhat unused then.
//
// The elementwise kernels (apply, bwd_elem) are grid-stride over the N·C·S elements with
// 32-bit index arithmetic when N·C·S < 2^31 (channel = (i / S) mod C), any 1-D grid.
//
// Bound (N·C·S = E elements of T, f32; f16/bf16 half the bytes): stats read E·4 bytes (~8
// flops per element: Welford's update); apply reads E·4 and writes E·4 (3 flops); the backward
// reduce reads dy and x, 8·E; bwd_elem reads dy and x and writes dx, 12·E (~6 flops). A
// training step's forward + backward moves 32·E bytes: for [32, 64, 112, 112] (E = 25.7M)
// 822 MB, 245 µs at 3.35 TB/s. The per-channel reductions use C blocks: below ~2 blocks per SM
// (C < 264 on an H100) they do not fill the GPU; a split of each channel over several blocks
// with a second pass would.
#include "ember.cuh"

namespace ember {

// Welford's state of one part of a channel.
template <typename C>
struct Welford {
    C n, mean, m2;
};

template <typename C>
struct WelfordOp {
    using A = Welford<C>;
    __device__ __forceinline__ static A identity() { return A{0, 0, 0}; }
    __device__ __forceinline__ static A step(A a, C x) {
        a.n += 1;
        const C d = x - a.mean;
        a.mean += d / a.n;
        a.m2 += d * (x - a.mean);
        return a;
    }
    __device__ __forceinline__ static A combine(A a, A b) {
        if (a.n == 0) return b;
        if (b.n == 0) return a;
        const C n = a.n + b.n;
        const C d = b.mean - a.mean;
        const C fb = b.n / n;
        return A{n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
    }
    __device__ __forceinline__ static A shfl_xor(A a, int mask) {
        return A{__shfl_xor_sync(FULL_MASK, a.n, mask), __shfl_xor_sync(FULL_MASK, a.mean, mask),
                 __shfl_xor_sync(FULL_MASK, a.m2, mask)};
    }
};

template <typename C>
struct PairSum {
    C a, b;
};

template <typename C>
struct PairSumOp {
    using A = PairSum<C>;
    __device__ __forceinline__ static A identity() { return A{0, 0}; }
    __device__ __forceinline__ static A combine(A x, A y) { return A{x.a + y.a, x.b + y.b}; }
    __device__ __forceinline__ static A shfl_xor(A x, int mask) {
        return A{__shfl_xor_sync(FULL_MASK, x.a, mask), __shfl_xor_sync(FULL_MASK, x.b, mask)};
    }
};

template <typename C>
__device__ __forceinline__ C bn_rsqrt(C v, double eps) {
    return static_cast<C>(1) / sqrt(v + static_cast<C>(eps));
}

// Calls f(offset) for every element of channel ch owned by this thread: j = threadIdx.x,
// threadIdx.x + blockDim.x, ... over the channel's M = n·s elements, at n_i·c·s + ch·s + s_i.
template <typename Idx, typename F>
__device__ __forceinline__ void for_channel(Idx n, Idx c, Idx s, Idx ch, F f) {
    if (s >= blockDim.x) {
        for (Idx b = 0; b < n; b++) {
            const Idx base = (b * c + ch) * s;
            for (Idx j = threadIdx.x; j < s; j += blockDim.x) f(base + j);
        }
    } else {
        const Idx m = n * s;
        for (Idx j = threadIdx.x; j < m; j += blockDim.x) {
            const Idx b = j / s;
            f((b * c + ch) * s + (j - b * s));
        }
    }
}

template <typename Idx, typename T>
__device__ void bn_stats(Idx n, Idx c, Idx s, const T* __restrict__ x, typename Widen<T>::type* mean,
                         typename Widen<T>::type* invstd, typename Widen<T>::type* running_mean,
                         typename Widen<T>::type* running_var, double momentum, double eps) {
    using C = typename Widen<T>::type;
    using Op = WelfordOp<C>;
    __shared__ Welford<C> scratch[32];
    for (Idx ch = blockIdx.x; ch < c; ch += gridDim.x) {
        Welford<C> a = Op::identity();
        for_channel<Idx>(n, c, s, ch, [&](Idx off) { a = Op::step(a, Widen<T>::in(x[off])); });
        a = block_combine<Op>(a, scratch);
        if (threadIdx.x == 0) {
            const C var = a.m2 / a.n;
            mean[ch] = a.mean;
            invstd[ch] = bn_rsqrt(var, eps);
            if (running_mean != nullptr) {
                const C mom = static_cast<C>(momentum);
                const C unbiased = var * (a.n / (a.n - 1));
                running_mean[ch] = (static_cast<C>(1) - mom) * running_mean[ch] + mom * a.mean;
                running_var[ch] = (static_cast<C>(1) - mom) * running_var[ch] + mom * unbiased;
            }
        }
    }
}

template <typename C>
__device__ __forceinline__ C bn_k(const C* v, i64 is_var, double eps, i64 ch) {
    return is_var ? bn_rsqrt(v[ch], eps) : v[ch];
}

template <typename Idx, typename T>
__device__ void bn_apply(Idx n, Idx c, Idx s, const T* __restrict__ x, const typename Widen<T>::type* mean,
                         const typename Widen<T>::type* v, i64 is_var, double eps,
                         const typename Widen<T>::type* weight, const typename Widen<T>::type* bias,
                         T* __restrict__ y) {
    using C = typename Widen<T>::type;
    const Idx total = n * c * s;
    for (Idx i = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<Idx>(gridDim.x) * blockDim.x) {
        const Idx ch = (i / s) % c;
        C r = (Widen<T>::in(x[i]) - mean[ch]) * bn_k(v, is_var, eps, ch);
        if (weight != nullptr) r = r * weight[ch];
        if (bias != nullptr) r = r + bias[ch];
        y[i] = Widen<T>::out(r);
    }
}

template <typename Idx, typename T>
__device__ void bn_bwd_reduce(Idx n, Idx c, Idx s, const T* __restrict__ dy, const T* __restrict__ x,
                              const typename Widen<T>::type* mean, const typename Widen<T>::type* v, i64 is_var,
                              double eps, typename Widen<T>::type* sum_dy, typename Widen<T>::type* sum_dy_xhat) {
    using C = typename Widen<T>::type;
    using Op = PairSumOp<C>;
    __shared__ PairSum<C> scratch[32];
    for (Idx ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const C m = mean[ch], k = bn_k(v, is_var, eps, ch);
        PairSum<C> a = Op::identity();
        for_channel<Idx>(n, c, s, ch, [&](Idx off) {
            const C g = Widen<T>::in(dy[off]);
            a.a += g;
            a.b += g * ((Widen<T>::in(x[off]) - m) * k);
        });
        a = block_combine<Op>(a, scratch);
        if (threadIdx.x == 0) {
            sum_dy[ch] = a.a;
            sum_dy_xhat[ch] = a.b;
        }
    }
}

template <typename Idx, typename T>
__device__ void bn_bwd_elem(Idx n, Idx c, Idx s, const T* __restrict__ dy, const T* __restrict__ x,
                            const typename Widen<T>::type* mean, const typename Widen<T>::type* v, i64 is_var,
                            double eps, const typename Widen<T>::type* weight, const typename Widen<T>::type* sum_dy,
                            const typename Widen<T>::type* sum_dy_xhat, i64 training, T* __restrict__ dx) {
    using C = typename Widen<T>::type;
    const Idx total = n * c * s;
    const C inv_m = static_cast<C>(1) / static_cast<C>(n * s);
    for (Idx i = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<Idx>(gridDim.x) * blockDim.x) {
        const Idx ch = (i / s) % c;
        const C k = bn_k(v, is_var, eps, ch);
        const C wk = weight != nullptr ? weight[ch] * k : k;
        const C g = Widen<T>::in(dy[i]);
        C r;
        if (training) {
            const C xhat = (Widen<T>::in(x[i]) - mean[ch]) * k;
            r = wk * (g - sum_dy[ch] * inv_m - xhat * (sum_dy_xhat[ch] * inv_m));
        } else {
            r = g * wk;
        }
        dx[i] = Widen<T>::out(r);
    }
}

// 32-bit index arithmetic when every offset fits.
__device__ __forceinline__ bool bn_fits32(i64 n, i64 c, i64 s) { return n * c * s < (i64(1) << 31); }

}  // namespace ember

#define EMBER_BATCH_NORM(SUFFIX, T)                                                                \
    extern "C" __global__ void batch_norm_stats_##SUFFIX(ember::i64 n, ember::i64 c, ember::i64 s, const T* x, \
                                                         ember::Widen<T>::type* mean, ember::Widen<T>::type* invstd, \
                                                         ember::Widen<T>::type* running_mean,      \
                                                         ember::Widen<T>::type* running_var, double momentum, \
                                                         double eps) {                             \
        if (ember::bn_fits32(n, c, s)) {                                                           \
            ember::bn_stats<ember::u32, T>(n, c, s, x, mean, invstd, running_mean, running_var, momentum, eps); \
        } else {                                                                                   \
            ember::bn_stats<ember::i64, T>(n, c, s, x, mean, invstd, running_mean, running_var, momentum, eps); \
        }                                                                                          \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(batch_norm_stats_##SUFFIX)                                               \
    extern "C" __global__ void batch_norm_apply_##SUFFIX(                                          \
        ember::i64 n, ember::i64 c, ember::i64 s, const T* x, const ember::Widen<T>::type* mean,  \
        const ember::Widen<T>::type* v, ember::i64 is_var, double eps, const ember::Widen<T>::type* weight, \
        const ember::Widen<T>::type* bias, T* y) {                                                 \
        if (ember::bn_fits32(n, c, s)) {                                                           \
            ember::bn_apply<ember::u32, T>(n, c, s, x, mean, v, is_var, eps, weight, bias, y);     \
        } else {                                                                                   \
            ember::bn_apply<ember::i64, T>(n, c, s, x, mean, v, is_var, eps, weight, bias, y);     \
        }                                                                                          \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(batch_norm_apply_##SUFFIX)                                               \
    extern "C" __global__ void batch_norm_bwd_reduce_##SUFFIX(                                     \
        ember::i64 n, ember::i64 c, ember::i64 s, const T* dy, const T* x, const ember::Widen<T>::type* mean, \
        const ember::Widen<T>::type* v, ember::i64 is_var, double eps, ember::Widen<T>::type* sum_dy, \
        ember::Widen<T>::type* sum_dy_xhat) {                                                      \
        if (ember::bn_fits32(n, c, s)) {                                                           \
            ember::bn_bwd_reduce<ember::u32, T>(n, c, s, dy, x, mean, v, is_var, eps, sum_dy, sum_dy_xhat); \
        } else {                                                                                   \
            ember::bn_bwd_reduce<ember::i64, T>(n, c, s, dy, x, mean, v, is_var, eps, sum_dy, sum_dy_xhat); \
        }                                                                                          \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(batch_norm_bwd_reduce_##SUFFIX)                                          \
    extern "C" __global__ void batch_norm_bwd_elem_##SUFFIX(                                       \
        ember::i64 n, ember::i64 c, ember::i64 s, const T* dy, const T* x, const ember::Widen<T>::type* mean, \
        const ember::Widen<T>::type* v, ember::i64 is_var, double eps, const ember::Widen<T>::type* weight, \
        const ember::Widen<T>::type* sum_dy, const ember::Widen<T>::type* sum_dy_xhat, ember::i64 training, \
        T* dx) {                                                                                   \
        if (ember::bn_fits32(n, c, s)) {                                                           \
            ember::bn_bwd_elem<ember::u32, T>(n, c, s, dy, x, mean, v, is_var, eps, weight, sum_dy, sum_dy_xhat, \
                                              training, dx);                                       \
        } else {                                                                                   \
            ember::bn_bwd_elem<ember::i64, T>(n, c, s, dy, x, mean, v, is_var, eps, weight, sum_dy, sum_dy_xhat, \
                                              training, dx);                                       \
        }                                                                                          \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(batch_norm_bwd_elem_##SUFFIX)

EMBER_BATCH_NORM(f32, float)
EMBER_BATCH_NORM(f64, double)
EMBER_BATCH_NORM(f16, ember::f16)
EMBER_BATCH_NORM(bf16, ember::bf16)
