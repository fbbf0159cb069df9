// Fused softmax and log-softmax over the middle dimension of a contiguous [outer, size, inner]
// tensor (the softmax dim is `size`; the last dim is inner = 1).
//
//   softmax_{f32,f64,f16,bf16}(i64 outer, i64 size, i64 inner, const T* in, T* out)
//   log_softmax_{f32,f64,f16,bf16}(i64 outer, i64 size, i64 inner, const T* in, T* out)
//
// `out` has the input's shape, contiguous. One kernel per row: an online pass keeps the running
// max m and s = Σ exp(x - m) (rescaling s when m grows), then a second pass writes
// exp(x - m) * (1 / s), or (x - m) - ln s for log-softmax (the CPU's form, which does not round
// at max's magnitude). f16/bf16 compute in f32 (as the CPU, which softmaxes them in f32), f32
// in f32, f64 in f64. Special values as crates/ember-tensor/src/cpu/softmax.rs: a NaN anywhere
// in a row makes the row NaN, +inf makes it NaN (inf - inf), a row of -inf is NaN.
//
// Work shapes, chosen per launch: inner == 1: one block per row (grid-stride over rows),
// shuffle block reduction of (m, s), blockDim.x a multiple of 32; inner > 1: one thread per
// (outer, inner) column, reading coalesced across threads. Any 1-D grid.
#include "ember.cuh"

namespace ember {

__device__ __forceinline__ float sm_exp(float x) { return expf(x); }
__device__ __forceinline__ double sm_exp(double x) { return exp(x); }
__device__ __forceinline__ float sm_log(float x) { return logf(x); }
__device__ __forceinline__ double sm_log(double x) { return log(x); }

template <typename C>
struct MaxSum {
    C m, s;
};

template <typename C>
struct MaxSumOp {
    using A = MaxSum<C>;
    __device__ __forceinline__ static A identity() { return A{-static_cast<C>(INFINITY), 0}; }
    // One element. A NaN never becomes the max but turns s into NaN; a -inf while the max is
    // still -inf adds nothing (the CPU's exp(-inf - m) is 0 once m is finite, and if m stays
    // -inf the whole row is NaN anyway).
    __device__ __forceinline__ static A step(A a, C x) {
        if (x > a.m) {
            a.s = a.s * sm_exp(a.m - x) + sm_exp(x - x);  // exp(x - x) is NaN for x = +inf, as on the CPU
            a.m = x;
        } else if (!(x == a.m && x == -static_cast<C>(INFINITY))) {
            a.s += sm_exp(x - a.m);
        }
        return a;
    }
    __device__ __forceinline__ static C scale(A a, C m) { return a.m == m ? a.s : a.s * sm_exp(a.m - m); }
    __device__ __forceinline__ static A combine(A a, A b) {
        const C m = b.m > a.m ? b.m : a.m;
        return A{m, scale(a, m) + scale(b, m)};
    }
    __device__ __forceinline__ static A shfl_xor(A a, int mask) {
        return A{__shfl_xor_sync(FULL_MASK, a.m, mask), __shfl_xor_sync(FULL_MASK, a.s, mask)};
    }
};

template <typename T, bool LOG>
__device__ __forceinline__ T softmax_out(typename Widen<T>::type x, typename Widen<T>::type m,
                                         typename Widen<T>::type k) {
    // k is 1 / s for softmax, ln s for log-softmax.
    if constexpr (LOG) {
        return Widen<T>::out((x - m) - k);
    } else {
        return Widen<T>::out(sm_exp(x - m) * k);
    }
}

template <typename T, bool LOG>
__device__ void softmax(i64 outer, i64 size, i64 inner, const T* in, T* out) {
    using C = typename Widen<T>::type;
    using Op = MaxSumOp<C>;
    if (inner == 1) {
        __shared__ MaxSum<C> scratch[32];
        for (i64 row = blockIdx.x; row < outer; row += gridDim.x) {
            const T* x = in + row * size;
            T* y = out + row * size;
            MaxSum<C> a = Op::identity();
            for (i64 r = threadIdx.x; r < size; r += blockDim.x) a = Op::step(a, Widen<T>::in(x[r]));
            a = block_combine<Op>(a, scratch);
            const C k = LOG ? sm_log(a.s) : static_cast<C>(1) / a.s;
            for (i64 r = threadIdx.x; r < size; r += blockDim.x) {
                y[r] = softmax_out<T, LOG>(Widen<T>::in(x[r]), a.m, k);
            }
        }
    } else {
        const i64 n = outer * inner;
        for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
            const i64 b = o / inner, j = o - b * inner;
            const T* x = in + b * size * inner + j;
            T* y = out + b * size * inner + j;
            MaxSum<C> a = Op::identity();
            for (i64 r = 0; r < size; r++) a = Op::step(a, Widen<T>::in(x[r * inner]));
            const C k = LOG ? sm_log(a.s) : static_cast<C>(1) / a.s;
            for (i64 r = 0; r < size; r++) y[r * inner] = softmax_out<T, LOG>(Widen<T>::in(x[r * inner]), a.m, k);
        }
    }
}

}  // namespace ember

#define EMBER_SOFTMAX(SUFFIX, T)                                                                   \
    extern "C" __global__ void softmax_##SUFFIX(ember::i64 outer, ember::i64 size, ember::i64 inner, const T* in, \
                                                T* out) {                                          \
        ember::softmax<T, false>(outer, size, inner, in, out);                                     \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(softmax_##SUFFIX)                                                        \
    extern "C" __global__ void log_softmax_##SUFFIX(ember::i64 outer, ember::i64 size, ember::i64 inner, \
                                                    const T* in, T* out) {                         \
        ember::softmax<T, true>(outer, size, inner, in, out);                                      \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(log_softmax_##SUFFIX)

EMBER_SOFTMAX(f32, float)
EMBER_SOFTMAX(f64, double)
EMBER_SOFTMAX(f16, ember::f16)
EMBER_SOFTMAX(bf16, ember::bf16)
