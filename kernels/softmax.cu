// Fused softmax and log-softmax over the middle dimension of a contiguous [outer, size, inner]
// tensor (the softmax dim is `size`; the last dim is inner = 1).
//
//   softmax_{f32,f64,f16,bf16}(i64 outer, i64 size, i64 inner, const T* in, T* out)
//   log_softmax_{f32,f64,f16,bf16}(i64 outer, i64 size, i64 inner, const T* in, T* out)
//
// `out` has the input's shape, contiguous. One kernel per row: an online pass keeps the running
// max m and s = Σ exp(x - m) (rescaling s when m grows; kernels/softmax.cuh), then a second
// pass writes exp(x - m) * (1 / s), or (x - m) - ln s for log-softmax (the CPU's form, which
// does not round at max's magnitude). f16/bf16 compute in f32 (as the CPU, which softmaxes
// them in f32), f32 in f32, f64 in f64. Special values as crates/ember-tensor/src/cpu/softmax.rs:
// a NaN anywhere in a row makes the row NaN, +inf makes it NaN (inf - inf), a row of -inf is
// NaN.
//
// Work shapes, chosen per launch: inner == 1 (contiguous rows): one block per row (grid-stride
// over rows), shuffle block reduction of (m, s), blockDim.x a multiple of 32; within a row
// 32-bit index arithmetic (rows shorter than 2^31) and 16-byte vector loads and stores
// (`for_row` in softmax.cuh) where the row's start is 16-byte aligned in both `in` and `out`
// (always for f64, and for f32/f16/bf16 whenever size·sizeof(T) is a multiple of 16, as for
// C = 1000 in f32); longer rows take the same loop in 64 bits, unvectorised. inner > 1: one
// thread per (outer, inner) column, reading coalesced across threads. Any 1-D grid.
//
// Bound: bytes = 3·n·sizeof(T) (the row read twice, the second time mostly from L1/L2 for
// rows up to tens of KiB, and written once: 2·n·sizeof(T) when the second read hits cache);
// flops ≈ 8·n (max, exp, add, rescale; exp or a subtraction on the way out).
#include "softmax.cuh"

namespace ember {

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

// One contiguous row shorter than 2^31: (m, s) through row_max_sum, then the output in the
// same element order, vectorised when both rows are 16-byte aligned.
template <typename T, bool LOG>
__device__ __forceinline__ void softmax_row32(const T* __restrict__ x, T* __restrict__ y, u32 size,
                                              MaxSum<typename Widen<T>::type>* scratch) {
    using C = typename Widen<T>::type;
    const MaxSum<C> a = row_max_sum<u32>(x, size, scratch);
    const C k = LOG ? sm_log(a.s) : static_cast<C>(1) / a.s;
    u32 head = 0;
    if (aligned16(x) && aligned16(y)) {
        constexpr u32 N = Pack16<T>::N;
        const u32 packs = size / N;
        const uint4* x16 = reinterpret_cast<const uint4*>(x);
        uint4* y16 = reinterpret_cast<uint4*>(y);
        for (u32 p = threadIdx.x; p < packs; p += blockDim.x) {
            Pack16<T> v, w;
            v.raw = x16[p];
#pragma unroll
            for (u32 j = 0; j < N; j++) w.v[j] = softmax_out<T, LOG>(Widen<T>::in(v.v[j]), a.m, k);
            y16[p] = w.raw;
        }
        head = packs * N;
    }
    for (u32 r = head + threadIdx.x; r < size; r += blockDim.x) y[r] = softmax_out<T, LOG>(Widen<T>::in(x[r]), a.m, k);
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
            if (size < (i64(1) << 31)) {
                softmax_row32<T, LOG>(x, y, static_cast<u32>(size), scratch);
                continue;
            }
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
