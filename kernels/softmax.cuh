// The online max-sum of softmax rows, shared by softmax.cu and cross_entropy.cu (one header,
// included by both: nvcc compiles every .cu in one translation unit, g++ each alone).
//
// A row's running max m and s = Σ exp(x - m) are kept together (MaxSum) and combined across
// threads by rescaling to the larger max (MaxSumOp). `row_max_sum` is the block-wide form for
// one contiguous row (`inner = 1`) with 32-bit index arithmetic within the row and 16-byte
// vector loads (Pack16) when the row is 16-byte aligned; softmax, log_softmax and the fused
// cross-entropy all reduce a row through it with the same block size, so they see the same
// (m, s) bit for bit.
#pragma once

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

// A plain sum for block_combine (f32 or f64).
template <typename C>
struct RowSumOp {
    using A = C;
    __device__ __forceinline__ static A identity() { return 0; }
    __device__ __forceinline__ static A combine(A a, A b) { return a + b; }
    __device__ __forceinline__ static A shfl_xor(A a, int mask) { return __shfl_xor_sync(FULL_MASK, a, mask); }
};

// Calls f(r, x[r]) for the elements r of the contiguous row x[0, size) this thread owns:
// 16-byte packs p = threadIdx.x, threadIdx.x + blockDim.x, ... (elements p·N .. p·N + N - 1 in
// order), then the tail past the last whole pack, one element per thread, when x is 16-byte
// aligned; elements threadIdx.x, threadIdx.x + blockDim.x, ... otherwise. The order is a
// pure function of (x's alignment, size, blockDim.x). Idx is the index type: u32 for rows
// shorter than 2^31 (the common case: no 64-bit arithmetic inside a row), i64 otherwise.
template <typename Idx, typename T, typename F>
__device__ __forceinline__ void for_row(const T* __restrict__ x, Idx size, F f) {
    Idx head = 0;
    if (aligned16(x)) {
        constexpr Idx N = Pack16<T>::N;
        const Idx packs = size / N;
        const uint4* x16 = reinterpret_cast<const uint4*>(x);
        for (Idx p = threadIdx.x; p < packs; p += blockDim.x) {
            Pack16<T> v;
            v.raw = x16[p];
#pragma unroll
            for (Idx k = 0; k < N; k++) f(p * N + k, v.v[k]);
        }
        head = packs * N;
    }
    for (Idx r = head + threadIdx.x; r < size; r += blockDim.x) f(r, x[r]);
}

// (m, s) of the contiguous row x[0, size), combined over the block: every thread gets it.
// Every thread of the block calls it; blockDim.x a multiple of 32; scratch holds 32 values.
template <typename Idx, typename T>
__device__ __forceinline__ MaxSum<typename Widen<T>::type> row_max_sum(const T* __restrict__ x, Idx size,
                                                                      MaxSum<typename Widen<T>::type>* scratch) {
    using C = typename Widen<T>::type;
    using Op = MaxSumOp<C>;
    MaxSum<C> a = Op::identity();
    for_row<Idx>(x, size, [&](Idx, T v) { a = Op::step(a, Widen<T>::in(v)); });
    return block_combine<Op>(a, scratch);
}

}  // namespace ember
