// Reductions over the middle dimension of a contiguous [outer, size, inner] tensor.
//
//   reduce_{sum,prod}_{dtype}(i64 outer, i64 size, i64 inner, const T* in, O* out)
//       O = T for floats, i64 for i64 i32 u8 bool (wrapping)
//   reduce_{max,min}_{dtype}(i64 outer, i64 size, i64 inner, const T* in, T* out)
//   reduce_{argmax,argmin}_{dtype}(i64 outer, i64 size, i64 inner, const T* in, i64* out)
//       every dtype f32 f64 f16 bf16 i64 i32 u8 bool
//
// `out` is contiguous [outer, inner]. The host brings any reduction to this form (permute the
// reduced dims next to each other and make the tensor contiguous; a full reduction is
// [1, n, 1]). Accumulation: f32/f16/bf16 in f32, f64 in f64, integers and bool in i64.
// Max/min and arg forms follow the CPU's fold: NaN wins and propagates, and among equal values
// (or several NaNs) the first index wins, so ties give the CPU's answer and ±0 come out as the
// CPU's. An empty reduction (size 0) gives 0 for sum, 1 for prod, and for max/min/arg writes
// the identity / index 0 (the host refuses those first).
//
// Two shapes of work, chosen per launch (uniform across the grid):
// - inner == 1: one block per output (grid-stride over outputs), threads stride over the row,
//   then a warp-shuffle block reduction; blockDim.x must be a multiple of 32 (at most 1024).
// - inner > 1: one thread per output, walking its column sequentially; neighbouring threads
//   read neighbouring addresses, so the loads coalesce. Any 1-D grid.
// A full reduction of a large tensor runs on one block (one SM), and [small outer·inner, long
// size, inner > 1] on few threads; splitting `size` across blocks with a second pass is not
// done yet. Until then the host can split with these kernels for sum/max/min of f32, f64 and
// integers: view [outer, size, inner] as [outer·c, size/c, inner] (c dividing size), reduce,
// then reduce the [outer, c, inner] partials (integers: with reduce_sum_i64). Not for f16/bf16
// sums (the partials would round to 16 bits; cast to f32 first), prod of floats (same), or
// the arg forms (the partial indices are local).
#include "ember.cuh"

namespace ember {

// What sums and products accumulate in.
template <typename T>
struct SumAcc {
    using type = i64;  // integers and bool
};
template <>
struct SumAcc<float> {
    using type = float;
};
template <>
struct SumAcc<f16> {
    using type = float;
};
template <>
struct SumAcc<bf16> {
    using type = float;
};
template <>
struct SumAcc<double> {
    using type = double;
};

__device__ __forceinline__ float acc_in(float x) { return x; }
__device__ __forceinline__ float acc_in(f16 x) { return to_f32(x); }
__device__ __forceinline__ float acc_in(bf16 x) { return to_f32(x); }
__device__ __forceinline__ double acc_in(double x) { return x; }
__device__ __forceinline__ i64 acc_in(i64 x) { return x; }
__device__ __forceinline__ i64 acc_in(i32 x) { return x; }
__device__ __forceinline__ i64 acc_in(u8 x) { return x; }
__device__ __forceinline__ i64 acc_in(bool x) { return x ? 1 : 0; }

// Accumulator back to the output type.
template <typename O>
__device__ __forceinline__ O acc_out(float a) {
    return from_f32<O>(a);
}
template <typename O>
__device__ __forceinline__ O acc_out(double a) {
    return a;
}
template <typename O>
__device__ __forceinline__ O acc_out(i64 a) {
    return a;
}

__device__ __forceinline__ float wrap_add(float a, float b) { return a + b; }
__device__ __forceinline__ double wrap_add(double a, double b) { return a + b; }
__device__ __forceinline__ i64 wrap_add(i64 a, i64 b) {
    return static_cast<i64>(static_cast<u64>(a) + static_cast<u64>(b));
}
__device__ __forceinline__ float wrap_mul(float a, float b) { return a * b; }
__device__ __forceinline__ double wrap_mul(double a, double b) { return a * b; }
__device__ __forceinline__ i64 wrap_mul(i64 a, i64 b) {
    return static_cast<i64>(static_cast<u64>(a) * static_cast<u64>(b));
}

template <typename T>
struct SumOp {
    using A = typename SumAcc<T>::type;
    __device__ __forceinline__ static A identity() { return 0; }
    __device__ __forceinline__ static A step(A acc, T x, i64) { return wrap_add(acc, acc_in(x)); }
    __device__ __forceinline__ static A combine(A a, A b) { return wrap_add(a, b); }
    __device__ __forceinline__ static A shfl_xor(A a, int m) { return __shfl_xor_sync(FULL_MASK, a, m); }
    template <typename O>
    __device__ __forceinline__ static O finish(A a) {
        return acc_out<O>(a);
    }
};
template <typename T>
struct ProdOp {
    using A = typename SumAcc<T>::type;
    __device__ __forceinline__ static A identity() { return 1; }
    __device__ __forceinline__ static A step(A acc, T x, i64) { return wrap_mul(acc, acc_in(x)); }
    __device__ __forceinline__ static A combine(A a, A b) { return wrap_mul(a, b); }
    __device__ __forceinline__ static A shfl_xor(A a, int m) { return __shfl_xor_sync(FULL_MASK, a, m); }
    template <typename O>
    __device__ __forceinline__ static O finish(A a) {
        return acc_out<O>(a);
    }
};

// A value with the index it came from; index -1 is "no element yet".
template <typename V>
struct ValueIndex {
    V value;
    i64 index;
};

// Max (MAX = true) or min with the first index of the winner; NaN beats everything, the first
// NaN beats later ones. Symmetric, so the shuffle butterfly leaves every lane the same answer.
template <typename T, bool MAX, bool ARG>
struct ExtremeOp {
    using V = decltype(acc_in(T{}));
    using A = ValueIndex<V>;
    __device__ __forceinline__ static A identity() { return A{V{}, -1}; }
    __device__ __forceinline__ static A combine(A a, A b) {
        if (a.index < 0) return b;
        if (b.index < 0) return a;
        const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
        if (a_nan || b_nan) {
            if (a_nan && b_nan) return a.index < b.index ? a : b;
            return a_nan ? a : b;
        }
        if (a.value == b.value) return a.index < b.index ? a : b;
        const bool b_better = MAX ? b.value > a.value : b.value < a.value;
        return b_better ? b : a;
    }
    __device__ __forceinline__ static A step(A acc, T x, i64 i) { return combine(acc, A{acc_in(x), i}); }
    __device__ __forceinline__ static A shfl_xor(A a, int m) {
        return A{__shfl_xor_sync(FULL_MASK, a.value, m), __shfl_xor_sync(FULL_MASK, a.index, m)};
    }
    template <typename O>
    __device__ __forceinline__ static O finish(A a);
};
template <typename T, bool MAX, bool ARG>
template <typename O>
__device__ __forceinline__ O ExtremeOp<T, MAX, ARG>::finish(A a) {
    if constexpr (ARG) {
        return a.index < 0 ? 0 : a.index;
    } else {
        return Widen<T>::out(static_cast<typename Widen<T>::type>(a.value));
    }
}

template <typename T>
using MaxOp = ExtremeOp<T, true, false>;
template <typename T>
using MinOp = ExtremeOp<T, false, false>;
template <typename T>
using ArgMaxOp = ExtremeOp<T, true, true>;
template <typename T>
using ArgMinOp = ExtremeOp<T, false, true>;

template <typename T, typename Op, typename O>
__device__ void reduce(i64 outer, i64 size, i64 inner, const T* in, O* out) {
    using A = typename Op::A;
    if (inner == 1) {
        __shared__ A scratch[32];
        for (i64 row = blockIdx.x; row < outer; row += gridDim.x) {
            const T* x = in + row * size;
            A acc = Op::identity();
            for (i64 r = threadIdx.x; r < size; r += blockDim.x) acc = Op::step(acc, x[r], r);
            acc = block_combine<Op>(acc, scratch);
            if (threadIdx.x == 0) out[row] = Op::template finish<O>(acc);
        }
    } else {
        const i64 n = outer * inner;
        for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
            const i64 b = o / inner, j = o - b * inner;
            const T* x = in + b * size * inner + j;
            A acc = Op::identity();
            for (i64 r = 0; r < size; r++) acc = Op::step(acc, x[r * inner], r);
            out[o] = Op::template finish<O>(acc);
        }
    }
}

}  // namespace ember

#define EMBER_REDUCE(NAME, OP, SUFFIX, T, O)                                                       \
    extern "C" __global__ void reduce_##NAME##_##SUFFIX(ember::i64 outer, ember::i64 size, ember::i64 inner, \
                                                        const T* in, O* out) {                     \
        ember::reduce<T, OP, O>(outer, size, inner, in, out);                                      \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(reduce_##NAME##_##SUFFIX)

// Sum/prod output: T for floats, i64 for the rest.
#define EMBER_REDUCE_DTYPE(SUFFIX, T, SUM_OUT)                                                     \
    EMBER_REDUCE(sum, ember::SumOp<T>, SUFFIX, T, SUM_OUT)                                         \
    EMBER_REDUCE(prod, ember::ProdOp<T>, SUFFIX, T, SUM_OUT)                                       \
    EMBER_REDUCE(max, ember::MaxOp<T>, SUFFIX, T, T)                            \
    EMBER_REDUCE(min, ember::MinOp<T>, SUFFIX, T, T)                           \
    EMBER_REDUCE(argmax, ember::ArgMaxOp<T>, SUFFIX, T, ember::i64)                 \
    EMBER_REDUCE(argmin, ember::ArgMinOp<T>, SUFFIX, T, ember::i64)

EMBER_REDUCE_DTYPE(f32, float, float)
EMBER_REDUCE_DTYPE(f64, double, double)
EMBER_REDUCE_DTYPE(f16, ember::f16, ember::f16)
EMBER_REDUCE_DTYPE(bf16, ember::bf16, ember::bf16)
EMBER_REDUCE_DTYPE(i64, ember::i64, ember::i64)
EMBER_REDUCE_DTYPE(i32, ember::i32, ember::i64)
EMBER_REDUCE_DTYPE(u8, ember::u8, ember::i64)
EMBER_REDUCE_DTYPE(bool, bool, ember::i64)
