// Fused batch normalisation over [N, C, S] (S = the product of the spatial dims, 1 for
// BatchNorm1d on [N, C]): crates/ember-tensor/src/ops/norm.rs; CPU:
// crates/ember-tensor/src/cpu/batch_norm.rs. Every tensor is contiguous; per-channel vectors
// are [C] in the compute type C (f32 for f32/f16/bf16, f64 for f64); T is the element type,
// read and written as such (16-bit computed in f32).
//
//   batch_norm_stats_{T}(i64 n, i64 c, i64 s, const T* x, C* mean, C* invstd, C* running_mean,
//                        C* running_var, f64 momentum, f64 eps, i64 splits, C* partial)
//       Training statistics: per channel, over its M = N·S elements, the mean and the biased
//       variance by Welford's update per thread, merged over the block (Chan et al.);
//       invstd = 1 / sqrt(var + eps). With running_mean/running_var non-null (both or
//       neither) also PyTorch's update: running_mean = (1 - momentum)·running_mean +
//       momentum·mean, running_var = (1 - momentum)·running_var + momentum·var·M / (M - 1).
//       Each channel's M elements are cut into `splits` consecutive parts, one block each
//       (grid-stride over the c·splits parts, part p of channel ch is work item ch·splits + p),
//       blockDim.x a multiple of 32. splits == 1: the block finishes the channel (partial
//       unused, may be null). splits > 1: the block writes its part's Welford state (count,
//       mean, M2) to partial[3·(ch·splits + p) ..], and
//   batch_norm_stats_combine_{C}(i64 c, i64 splits, const C* partial, C* mean, C* invstd,
//                                C* running_mean, C* running_var, f64 momentum, f64 eps)
//       merges the parts of each channel in order (Chan et al.) and finishes as above; one
//       thread per channel, any 1-D grid.
//   batch_norm_apply_{T}(i64 n, i64 c, i64 s, const T* x, const C* mean, const C* v, i64 is_var,
//                        f64 eps, const C* weight, const C* bias, T* y)
//       y = (x - mean[ch])·k[ch]·weight[ch] + bias[ch], k = v (an invstd) or, with is_var,
//       1 / sqrt(v + eps) (eval mode: the running variance); weight/bias null: 1 and 0.
//   batch_norm_bwd_reduce_{T}(i64 n, i64 c, i64 s, const T* dy, const T* x, const C* mean,
//                             const C* v, i64 is_var, f64 eps, C* sum_dy, C* sum_dy_xhat,
//                             i64 splits, C* partial)
//       Per channel Σ dy and Σ dy·x̂ with x̂ = (x - mean)·k: the bias and weight gradients.
//       Split as the stats: splits == 1 writes the sums; splits > 1 writes each part's two
//       sums to partial[2·(ch·splits + p) ..], and
//   batch_norm_bwd_combine_{C}(i64 c, i64 splits, const C* partial, C* sum_dy,
//                              C* sum_dy_xhat)
//       adds the parts of each channel in order; one thread per channel, any 1-D grid.
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
// 822 MB, 245 µs at 3.35 TB/s. The per-channel reductions split each channel over several
// blocks when C alone would leave SMs idle (the host picks `splits` from the SM count: Note
// [Split channel reductions] in crates/ember-tensor/src/cuda/fused.rs); the combine kernels
// then read 12 (stats) or 8 (backward) bytes of f32 per part, negligible beside the data.
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

// Calls f(offset) for every element of part [j0, j1) of channel ch owned by this thread: the
// channel's elements j = b·s + s_i (j < M = n·s) sit at b·c·s + ch·s + s_i; the thread takes
// j0 + threadIdx.x, j0 + threadIdx.x + blockDim.x, ... (per batch row when rows are long).
template <typename Idx, typename F>
__device__ __forceinline__ void for_channel(Idx c, Idx s, Idx ch, Idx j0, Idx j1, F f) {
    if (s >= blockDim.x) {
        for (Idx b = j0 / s; b * s < j1; b++) {
            const Idx row = b * s;
            const Idx lo = (j0 > row ? j0 : row) - row;
            const Idx hi = (j1 < row + s ? j1 : row + s) - row;
            const Idx base = (b * c + ch) * s;
            for (Idx j = lo + threadIdx.x; j < hi; j += blockDim.x) f(base + j);
        }
    } else {
        for (Idx j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
            const Idx b = j / s;
            f((b * c + ch) * s + (j - b * s));
        }
    }
}

// Note [Grouped channel walks]: when S is a multiple of G = 16 / sizeof(T) and the operands
// are 16-byte aligned, G consecutive elements j = q·G .. q·G + G - 1 of a channel never cross
// a batch row (rows are S long), so they sit at consecutive offsets, share one channel and
// load (or store) as one 16-byte access. The kernels then walk groups: a thread keeps 16
// bytes per operand in flight per iteration instead of one element's 2-8, and the
// elementwise kernels compute the channel once per group. The reductions' parts
// ([Split channel reductions]) start and end anywhere, so the fewer than G elements before
// a part's first whole group and after its last are taken one by one. Other shapes and
// unaligned views take the element loops; the sums then run in another order, equal to
// rounding.
template <typename T>
__device__ __forceinline__ constexpr int bn_group() {
    return 16 / static_cast<int>(sizeof(T));
}

template <typename T, typename Idx>
__device__ __forceinline__ bool bn_grouped(Idx s, const T* a, const T* b, const T* c) {
    return s % bn_group<T>() == 0 && aligned16(a) && (b == nullptr || aligned16(b)) &&
           (c == nullptr || aligned16(c));
}

// for_channel over whole groups of G (Note [Grouped channel walks]): fg(off) for each group of
// part [j0, j1) of channel ch (off the offset of its first element), f(off) for the elements
// before the first group and after the last, shared among this block's threads. S % G == 0.
template <int G, typename Idx, typename F, typename FG>
__device__ __forceinline__ void for_channel_groups(Idx c, Idx s, Idx ch, Idx j0, Idx j1, F f, FG fg) {
    const Idx q0 = (j0 + G - 1) / G, q1 = j1 / G;
    const Idx t = threadIdx.x;
    auto at = [&](Idx j) {
        const Idx b = j / s;
        return (b * c + ch) * s + (j - b * s);
    };
    if (q0 >= q1) {
        for (Idx j = j0 + t; j < j1; j += blockDim.x) f(at(j));
        return;
    }
    if (t < q0 * G - j0) f(at(j0 + t));
    if (t < j1 - q1 * G) f(at(q1 * G + t));
    for (Idx q = q0 + t; q < q1; q += blockDim.x) fg(at(q * G));
}

// Part p of `splits` of a channel of m elements: [m·p / splits, m·(p + 1) / splits), in i64
// (m·p may pass 2^32 where the element offsets do not).
__device__ __forceinline__ i64 part_start(i64 m, i64 p, i64 splits) { return m * p / splits; }

// Mean, invstd and the running statistics' update of channel ch from its Welford state.
template <typename C>
__device__ __forceinline__ void bn_stats_finish(i64 ch, Welford<C> a, C* mean, C* invstd, C* running_mean,
                                                C* running_var, double momentum, double eps) {
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

template <typename Idx, typename T>
__device__ void bn_stats(Idx n, Idx c, Idx s, const T* __restrict__ x, typename Widen<T>::type* mean,
                         typename Widen<T>::type* invstd, typename Widen<T>::type* running_mean,
                         typename Widen<T>::type* running_var, double momentum, double eps, i64 splits,
                         typename Widen<T>::type* partial) {
    using C = typename Widen<T>::type;
    using Op = WelfordOp<C>;
    __shared__ Welford<C> scratch[32];
    const i64 m = static_cast<i64>(n) * s;
    for (i64 w = blockIdx.x; w < static_cast<i64>(c) * splits; w += gridDim.x) {
        const i64 ch = w / splits, p = w - ch * splits;
        const Idx j0 = static_cast<Idx>(part_start(m, p, splits));
        const Idx j1 = static_cast<Idx>(part_start(m, p + 1, splits));
        Welford<C> a = Op::identity();
        auto one = [&](Idx off) { a = Op::step(a, Widen<T>::in(x[off])); };
        if (bn_grouped<T, Idx>(s, x, nullptr, nullptr)) {
            constexpr int G = bn_group<T>();
            for_channel_groups<G, Idx>(c, s, static_cast<Idx>(ch), j0, j1, one, [&](Idx off) {
                // The group's own mean and M2 (two passes over registers), merged by Chan's
                // formula: one division per group instead of one per element.
                const PackN<T, G> v = load_group<T, G>(x + off, 0);
                C sum = 0;
#pragma unroll
                for (int k = 0; k < G; k++) sum += Widen<T>::in(v.v[k]);
                const C mg = sum / static_cast<C>(G);
                C m2 = 0;
#pragma unroll
                for (int k = 0; k < G; k++) {
                    const C d = Widen<T>::in(v.v[k]) - mg;
                    m2 += d * d;
                }
                a = Op::combine(a, Welford<C>{static_cast<C>(G), mg, m2});
            });
        } else {
            for_channel<Idx>(c, s, static_cast<Idx>(ch), j0, j1, one);
        }
        a = block_combine<Op>(a, scratch);
        if (threadIdx.x == 0) {
            if (splits == 1) {
                bn_stats_finish<C>(ch, a, mean, invstd, running_mean, running_var, momentum, eps);
            } else {
                partial[3 * w] = a.n;
                partial[3 * w + 1] = a.mean;
                partial[3 * w + 2] = a.m2;
            }
        }
    }
}

template <typename C>
__device__ void bn_stats_combine(i64 c, i64 splits, const C* partial, C* mean, C* invstd, C* running_mean,
                                 C* running_var, double momentum, double eps) {
    for (i64 ch = global_thread_id(); ch < c; ch += grid_stride()) {
        Welford<C> a = WelfordOp<C>::identity();
        for (i64 p = 0; p < splits; p++) {
            const C* q = partial + 3 * (ch * splits + p);
            a = WelfordOp<C>::combine(a, Welford<C>{q[0], q[1], q[2]});
        }
        bn_stats_finish<C>(ch, a, mean, invstd, running_mean, running_var, momentum, eps);
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
    const Idx first = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x;
    const Idx step = static_cast<Idx>(gridDim.x) * blockDim.x;
    if (bn_grouped<T, Idx>(s, x, y, nullptr)) {
        constexpr int G = bn_group<T>();
        for (Idx q = first; q < total / G; q += step) {
            const Idx i = q * G, ch = (i / s) % c;
            const C m = mean[ch], k = bn_k(v, is_var, eps, ch);
            const PackN<T, G> in = load_group<T, G>(x + i, 0);
            PackN<T, G> out;
#pragma unroll
            for (int j = 0; j < G; j++) {
                C r = (Widen<T>::in(in.v[j]) - m) * k;
                if (weight != nullptr) r = r * weight[ch];
                if (bias != nullptr) r = r + bias[ch];
                out.v[j] = Widen<T>::out(r);
            }
            reinterpret_cast<typename PackN<T, G>::Raw*>(y + i)[0] = out.raw;
        }
        return;
    }
    for (Idx i = first; i < total; i += step) {
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
                              double eps, typename Widen<T>::type* sum_dy, typename Widen<T>::type* sum_dy_xhat,
                              i64 splits, typename Widen<T>::type* partial) {
    using C = typename Widen<T>::type;
    using Op = PairSumOp<C>;
    __shared__ PairSum<C> scratch[32];
    const i64 m_all = static_cast<i64>(n) * s;
    for (i64 w = blockIdx.x; w < static_cast<i64>(c) * splits; w += gridDim.x) {
        const i64 ch = w / splits, p = w - ch * splits;
        const Idx j0 = static_cast<Idx>(part_start(m_all, p, splits));
        const Idx j1 = static_cast<Idx>(part_start(m_all, p + 1, splits));
        const C m = mean[ch], k = bn_k(v, is_var, eps, ch);
        PairSum<C> a = Op::identity();
        auto one = [&](Idx off) {
            const C g = Widen<T>::in(dy[off]);
            a.a += g;
            a.b += g * ((Widen<T>::in(x[off]) - m) * k);
        };
        if (bn_grouped<T, Idx>(s, dy, x, nullptr)) {
            constexpr int G = bn_group<T>();
            for_channel_groups<G, Idx>(c, s, static_cast<Idx>(ch), j0, j1, one, [&](Idx off) {
                const PackN<T, G> gv = load_group<T, G>(dy + off, 0);
                const PackN<T, G> xv = load_group<T, G>(x + off, 0);
#pragma unroll
                for (int j = 0; j < G; j++) {
                    const C g = Widen<T>::in(gv.v[j]);
                    a.a += g;
                    a.b += g * ((Widen<T>::in(xv.v[j]) - m) * k);
                }
            });
        } else {
            for_channel<Idx>(c, s, static_cast<Idx>(ch), j0, j1, one);
        }
        a = block_combine<Op>(a, scratch);
        if (threadIdx.x == 0) {
            if (splits == 1) {
                sum_dy[ch] = a.a;
                sum_dy_xhat[ch] = a.b;
            } else {
                partial[2 * w] = a.a;
                partial[2 * w + 1] = a.b;
            }
        }
    }
}

template <typename C>
__device__ void bn_bwd_combine(i64 c, i64 splits, const C* partial, C* sum_dy, C* sum_dy_xhat) {
    for (i64 ch = global_thread_id(); ch < c; ch += grid_stride()) {
        C a = 0, b = 0;
        for (i64 p = 0; p < splits; p++) {
            a += partial[2 * (ch * splits + p)];
            b += partial[2 * (ch * splits + p) + 1];
        }
        sum_dy[ch] = a;
        sum_dy_xhat[ch] = b;
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
    const Idx first = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x;
    const Idx step = static_cast<Idx>(gridDim.x) * blockDim.x;
    if (bn_grouped<T, Idx>(s, dy, training ? x : nullptr, dx)) {
        constexpr int G = bn_group<T>();
        for (Idx q = first; q < total / G; q += step) {
            const Idx i = q * G, ch = (i / s) % c;
            const C k = bn_k(v, is_var, eps, ch);
            const C wk = weight != nullptr ? weight[ch] * k : k;
            const PackN<T, G> gv = load_group<T, G>(dy + i, 0);
            PackN<T, G> out;
            if (training) {
                const PackN<T, G> xv = load_group<T, G>(x + i, 0);
                const C m = mean[ch], sd = sum_dy[ch] * inv_m, sdx = sum_dy_xhat[ch] * inv_m;
#pragma unroll
                for (int j = 0; j < G; j++) {
                    const C xhat = (Widen<T>::in(xv.v[j]) - m) * k;
                    out.v[j] = Widen<T>::out(wk * (Widen<T>::in(gv.v[j]) - sd - xhat * sdx));
                }
            } else {
#pragma unroll
                for (int j = 0; j < G; j++) out.v[j] = Widen<T>::out(Widen<T>::in(gv.v[j]) * wk);
            }
            reinterpret_cast<typename PackN<T, G>::Raw*>(dx + i)[0] = out.raw;
        }
        return;
    }
    for (Idx i = first; i < total; i += step) {
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
                                                         double eps, ember::i64 splits,            \
                                                         ember::Widen<T>::type* partial) {         \
        if (ember::bn_fits32(n, c, s)) {                                                           \
            ember::bn_stats<ember::u32, T>(n, c, s, x, mean, invstd, running_mean, running_var, momentum, eps, \
                                           splits, partial);                                       \
        } else {                                                                                   \
            ember::bn_stats<ember::i64, T>(n, c, s, x, mean, invstd, running_mean, running_var, momentum, eps, \
                                           splits, partial);                                       \
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
        ember::Widen<T>::type* sum_dy_xhat, ember::i64 splits, ember::Widen<T>::type* partial) {  \
        if (ember::bn_fits32(n, c, s)) {                                                           \
            ember::bn_bwd_reduce<ember::u32, T>(n, c, s, dy, x, mean, v, is_var, eps, sum_dy, sum_dy_xhat, splits, \
                                                partial);                                          \
        } else {                                                                                   \
            ember::bn_bwd_reduce<ember::i64, T>(n, c, s, dy, x, mean, v, is_var, eps, sum_dy, sum_dy_xhat, splits, \
                                                partial);                                          \
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

// The combine kernels depend only on the compute type C: stamped for f32 (f32, f16, bf16
// inputs) and f64.
#define EMBER_BATCH_NORM_COMBINE(SUFFIX, C)                                                                         \
    extern "C" __global__ void batch_norm_stats_combine_##SUFFIX(ember::i64 c, ember::i64 splits, const C* partial, \
                                                                 C* mean, C* invstd, C* running_mean,               \
                                                                 C* running_var, double momentum, double eps) {     \
        ember::bn_stats_combine<C>(c, splits, partial, mean, invstd, running_mean, running_var, momentum, eps);     \
    }                                                                                                               \
    EMBER_REGISTER_KERNEL(batch_norm_stats_combine_##SUFFIX)                                                        \
    extern "C" __global__ void batch_norm_bwd_combine_##SUFFIX(ember::i64 c, ember::i64 splits, const C* partial,   \
                                                               C* sum_dy, C* sum_dy_xhat) {                         \
        ember::bn_bwd_combine<C>(c, splits, partial, sum_dy, sum_dy_xhat);                                          \
    }                                                                                                               \
    EMBER_REGISTER_KERNEL(batch_norm_bwd_combine_##SUFFIX)

EMBER_BATCH_NORM_COMBINE(f32, float)
EMBER_BATCH_NORM_COMBINE(f64, double)
