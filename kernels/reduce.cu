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
// A whole reduction splits over blocks (below). [small outer·inner, long size] with more than
// one output runs on few blocks or threads; the host splits those with these kernels for
// sum/max/min of f32, f64 and integers: view [outer, size, inner] as [outer·c, size/c, inner]
// (c dividing size), reduce, then reduce the [outer, c, inner] partials (integers: with
// reduce_sum_i64). Not for f16/bf16 sums (the partials would round to 16 bits), prod of floats
// (same), or the arg forms (the partial indices are local).
//
// Whole reductions ([1, size, 1]) of more than a block's worth split in two passes (Note
// [Split whole reductions] in crates/ember-tensor/src/cuda/reduce.rs):
//
//   reduce_part_{op}_{dtype}(i64 size, const T* in, A* partials)
//       block b folds its block-tiled share of in[0, size) into partials[b] (A: the op's
//       accumulator: f32, f64 or i64, or {value, i64 index} for max/min/arg; at most 16
//       bytes); 16-byte loads, four per thread per pass, 32-bit indices
//   reduce_combine_{op}_{dtype}(i64 parts, const A* partials, O* out)
//       one block folds the partials and writes out[0] (any grid: every block writes it)
//
// Bound: the input read once, 4 bytes per f32 element (2 for f16/bf16, 8 for f64/i64, 1 for
// u8/bool), 16 bytes per block of partials: 20 µs for 2^24 f32 elements at 3.35 TB/s.
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

// ---- whole-tensor reductions in two passes (Note [Split whole reductions]) -----------------
// Pass 1: block b folds its share of in[0, size) into partials[b] (the op's accumulator, value
// and index for the arg forms). The share is block-tiled as the elementwise loops are: groups
// of 16 bytes, ELEMENTWISE_UNROLL per thread per pass, all loads issued before the folds, a
// 32-bit index inside chunks of 2^31 elements; scalars when `in` is not 16-byte aligned.
template <typename T, typename Op>
__device__ __forceinline__ typename Op::A fold_chunk(typename Op::A acc, const T* x, u32 n, i64 base, bool vec) {
    constexpr int G = Pack16<T>::N, U = ELEMENTWISE_UNROLL;
    u32 head = 0;
    if (vec) {
        const u32 groups = n / G, bd = blockDim.x, step = gridDim.x * bd * U;
        for (u32 g0 = blockIdx.x * bd * U + threadIdx.x; g0 < groups; g0 += step) {
            PackN<T, G> v[U];
#pragma unroll
            for (int k = 0; k < U; k++) {
                if (g0 + k * bd < groups) v[k] = load_group<T, G>(x, g0 + k * bd);
            }
#pragma unroll
            for (int k = 0; k < U; k++) {
                const u32 g = g0 + k * bd;
                if (g < groups) {
#pragma unroll
                    for (int j = 0; j < G; j++) acc = Op::step(acc, v[k].v[j], base + static_cast<i64>(g) * G + j);
                }
            }
        }
        head = groups * G;
    }
    const u32 stride = gridDim.x * blockDim.x;
    for (u32 i = head + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        acc = Op::step(acc, x[i], base + static_cast<i64>(i));
    }
    return acc;
}

template <typename T, typename Op>
__device__ void reduce_part(i64 size, const T* in, typename Op::A* partials) {
    using A = typename Op::A;
    __shared__ A scratch[32];
    A acc = Op::identity();
    const u64 pass = static_cast<u64>(gridDim.x) * blockDim.x * ELEMENTWISE_UNROLL * Pack16<T>::N;
    if (pass > ELEMENTWISE_CHUNK) {
        for (i64 i = global_thread_id(); i < size; i += grid_stride()) acc = Op::step(acc, in[i], i);
    } else {
        const bool vec = aligned16(in);
        for (u64 base = 0; base < static_cast<u64>(size); base += ELEMENTWISE_CHUNK) {
            const u64 left = static_cast<u64>(size) - base;
            const u32 len = static_cast<u32>(left < ELEMENTWISE_CHUNK ? left : ELEMENTWISE_CHUNK);
            acc = fold_chunk<T, Op>(acc, in + base, len, static_cast<i64>(base), vec);
        }
    }
    acc = block_combine<Op>(acc, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2: one block folds the `parts` partials and writes the result. Any grid: every block
// writes the same value.
template <typename T, typename Op, typename O>
__device__ void reduce_combine(i64 parts, const typename Op::A* partials, O* out) {
    using A = typename Op::A;
    __shared__ A scratch[32];
    A acc = Op::identity();
    for (i64 p = threadIdx.x; p < parts; p += blockDim.x) acc = Op::combine(acc, partials[p]);
    acc = block_combine<Op>(acc, scratch);
    if (threadIdx.x == 0) out[0] = Op::template finish<O>(acc);
}

}  // namespace ember

#define EMBER_REDUCE(NAME, OP, SUFFIX, T, O)                                                       \
    extern "C" __global__ void reduce_##NAME##_##SUFFIX(ember::i64 outer, ember::i64 size, ember::i64 inner, \
                                                        const T* in, O* out) {                     \
        ember::reduce<T, OP, O>(outer, size, inner, in, out);                                      \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(reduce_##NAME##_##SUFFIX)                                                \
    extern "C" __global__ void reduce_part_##NAME##_##SUFFIX(ember::i64 size, const T* in, OP::A* partials) { \
        ember::reduce_part<T, OP>(size, in, partials);                                             \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(reduce_part_##NAME##_##SUFFIX)                                           \
    extern "C" __global__ void reduce_combine_##NAME##_##SUFFIX(ember::i64 parts, const OP::A* partials, O* out) { \
        ember::reduce_combine<T, OP, O>(parts, partials, out);                                     \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(reduce_combine_##NAME##_##SUFFIX)

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
