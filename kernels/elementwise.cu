// Strided binary elementwise ops, comparisons and where.
//
//   {op}_{dtype}(i64 n, StridedLayout la, StridedLayout lb, const T* a, const T* b, T* out)
//       out[i] = op(a[offset_a(i)], b[offset_b(i)])
//   cmp_{eq,ne,lt,le,gt,ge}_{dtype}(i64 n, StridedLayout la, StridedLayout lb, const T* a,
//                                   const T* b, bool* out)
//       out[i] = a op b as one byte 0/1 (every dtype; NaN compares unequal to everything)
//   where_{dtype}(i64 n, StridedLayout lc, StridedLayout la, StridedLayout lb, const bool* cond,
//                 const T* a, const T* b, T* out)
//       out[i] = cond ? a : b (every dtype)
//
// `out` is contiguous with n elements; each StridedLayout maps the iteration (out's shape,
// row-major) onto its operand, broadcasting by zero strides (see ember.cuh). When every input
// is contiguous the kernel takes the fast path: for the binary ops 16-byte vector loads and
// stores when all pointers are 16-byte aligned, scalar accesses otherwise. f16 and bf16 are
// computed in f32 and rounded once. Any 1-D grid works.
//
// Binary ops and dtypes, as crates/ember-tensor/src/op.rs (`KERNEL` names):
//
//   badd, bmul, bmaximum, bminimum   every dtype (bool: or, and, or, and)
//   bsub, bpow                       f32 f64 f16 bf16 i64 i32 u8
//   bdiv                             f32 f64 f16 bf16 (true division; the host promotes ints)
//   bland, blor, blxor               bool (the host casts operands to bool)
//
// Integers wrap. Integer pow is PyTorch's: wrapping; a negative exponent gives 0 unless the
// base is 1 or -1. Float maximum/minimum propagate NaN (the first operand's when both are).
#include "ember.cuh"

namespace ember {

template <typename I, typename U>
__device__ __forceinline__ I wrap(U x) {
    return static_cast<I>(x);
}

#define EMBER_BIN_INT(EXPR)                                                                        \
    __device__ __forceinline__ static i64 f(i64 a, i64 b) {                                        \
        using U = u64;                                                                             \
        return wrap<i64, U>(EXPR);                                                                 \
    }                                                                                              \
    __device__ __forceinline__ static i32 f(i32 a, i32 b) {                                        \
        using U = unsigned;                                                                        \
        return wrap<i32, U>(EXPR);                                                                 \
    }                                                                                              \
    __device__ __forceinline__ static u8 f(u8 a, u8 b) {                                           \
        using U = unsigned;                                                                        \
        return wrap<u8, U>(EXPR);                                                                  \
    }

#define EMBER_BIN_FLOAT(EXPR)                                                                      \
    __device__ __forceinline__ static float f(float a, float b) { return EXPR; }                   \
    __device__ __forceinline__ static double f(double a, double b) { return EXPR; }

struct BAdd {
    EMBER_BIN_FLOAT(a + b)
    EMBER_BIN_INT(static_cast<U>(a) + static_cast<U>(b))
    __device__ __forceinline__ static bool f(bool a, bool b) { return a | b; }
};
struct BSub {
    EMBER_BIN_FLOAT(a - b)
    EMBER_BIN_INT(static_cast<U>(a) - static_cast<U>(b))
};
struct BMul {
    EMBER_BIN_FLOAT(a* b)
    EMBER_BIN_INT(static_cast<U>(a) * static_cast<U>(b))
    __device__ __forceinline__ static bool f(bool a, bool b) { return a & b; }
};
struct BDiv {
    EMBER_BIN_FLOAT(a / b)
};

// PyTorch's integer pow (see int_pow in crates/ember-tensor/src/op.rs), in the unsigned type U
// of the same width so that overflow wraps.
template <typename I, typename U>
__device__ __forceinline__ I int_pow(I base, I exp) {
    if (exp < 0) {
        if (base == 1) return 1;
        if (base == static_cast<I>(-1)) return (exp & 1) ? static_cast<I>(-1) : 1;
        return 0;
    }
    U acc = 1, b = static_cast<U>(base);
    for (u64 e = static_cast<u64>(exp); e > 0; e >>= 1) {
        if (e & 1) acc *= b;
        b *= b;
    }
    return static_cast<I>(acc);
}
struct BPow {
    __device__ __forceinline__ static float f(float a, float b) { return powf(a, b); }
    __device__ __forceinline__ static double f(double a, double b) { return pow(a, b); }
    __device__ __forceinline__ static i64 f(i64 a, i64 b) { return int_pow<i64, u64>(a, b); }
    __device__ __forceinline__ static i32 f(i32 a, i32 b) { return int_pow<i32, unsigned>(a, b); }
    __device__ __forceinline__ static u8 f(u8 a, u8 b) { return int_pow<u8, unsigned>(a, b); }
};
struct BMaximum {
    // a if a is NaN, else b if b is NaN or larger, else a: NaN propagates, ties keep a.
    EMBER_BIN_FLOAT(a != a ? a : ((b != b || b > a) ? b : a))
    template <typename I>
    __device__ __forceinline__ static I f(I a, I b) {
        return b > a ? b : a;
    }
};
struct BMinimum {
    EMBER_BIN_FLOAT(a != a ? a : ((b != b || b < a) ? b : a))
    template <typename I>
    __device__ __forceinline__ static I f(I a, I b) {
        return b < a ? b : a;
    }
};
struct BLand {
    __device__ __forceinline__ static bool f(bool a, bool b) { return a & b; }
};
struct BLor {
    __device__ __forceinline__ static bool f(bool a, bool b) { return a | b; }
};
struct BLxor {
    __device__ __forceinline__ static bool f(bool a, bool b) { return a ^ b; }
};

template <typename T, typename Op>
__device__ __forceinline__ T binary_apply(T a, T b) {
    return Widen<T>::out(Op::f(Widen<T>::in(a), Widen<T>::in(b)));
}

template <typename T, typename Op>
__device__ void binary(i64 n, const StridedLayout& la, const StridedLayout& lb, const T* a, const T* b, T* out) {
    const i64 start = global_thread_id(), stride = grid_stride();
    if (la.contiguous && lb.contiguous) {
        i64 head = 0;
        if (aligned16(a) && aligned16(b) && aligned16(out)) {
            constexpr int N = Pack16<T>::N;
            const i64 vecs = n / N;
            const uint4* a16 = reinterpret_cast<const uint4*>(a);
            const uint4* b16 = reinterpret_cast<const uint4*>(b);
            uint4* out16 = reinterpret_cast<uint4*>(out);
            for (i64 i = start; i < vecs; i += stride) {
                Pack16<T> x, y, z;
                x.raw = a16[i];
                y.raw = b16[i];
#pragma unroll
                for (int k = 0; k < N; k++) z.v[k] = binary_apply<T, Op>(x.v[k], y.v[k]);
                out16[i] = z.raw;
            }
            head = vecs * N;
        }
        for (i64 i = head + start; i < n; i += stride) out[i] = binary_apply<T, Op>(a[i], b[i]);
    } else {
        for (i64 i = start; i < n; i += stride) {
            out[i] = binary_apply<T, Op>(a[strided_offset(i, la)], b[strided_offset(i, lb)]);
        }
    }
}

// ---- comparisons --------------------------------------------------------------------------
struct CmpEq {
    template <typename C>
    __device__ __forceinline__ static bool f(C a, C b) {
        return a == b;
    }
};
struct CmpNe {
    template <typename C>
    __device__ __forceinline__ static bool f(C a, C b) {
        return a != b;
    }
};
struct CmpLt {
    template <typename C>
    __device__ __forceinline__ static bool f(C a, C b) {
        return a < b;
    }
};
struct CmpLe {
    template <typename C>
    __device__ __forceinline__ static bool f(C a, C b) {
        return a <= b;
    }
};
struct CmpGt {
    template <typename C>
    __device__ __forceinline__ static bool f(C a, C b) {
        return a > b;
    }
};
struct CmpGe {
    template <typename C>
    __device__ __forceinline__ static bool f(C a, C b) {
        return a >= b;
    }
};

template <typename T, typename Op>
__device__ void compare(i64 n, const StridedLayout& la, const StridedLayout& lb, const T* a, const T* b, bool* out) {
    const i64 start = global_thread_id(), stride = grid_stride();
    if (la.contiguous && lb.contiguous) {
        for (i64 i = start; i < n; i += stride) out[i] = Op::f(Widen<T>::in(a[i]), Widen<T>::in(b[i]));
    } else {
        for (i64 i = start; i < n; i += stride) {
            out[i] = Op::f(Widen<T>::in(a[strided_offset(i, la)]), Widen<T>::in(b[strided_offset(i, lb)]));
        }
    }
}

// ---- where --------------------------------------------------------------------------------
template <typename T>
__device__ void where_select(i64 n, const StridedLayout& lc, const StridedLayout& la, const StridedLayout& lb,
                             const bool* cond, const T* a, const T* b, T* out) {
    const i64 start = global_thread_id(), stride = grid_stride();
    if (lc.contiguous && la.contiguous && lb.contiguous) {
        for (i64 i = start; i < n; i += stride) out[i] = cond[i] ? a[i] : b[i];
    } else {
        for (i64 i = start; i < n; i += stride) {
            out[i] = cond[strided_offset(i, lc)] ? a[strided_offset(i, la)] : b[strided_offset(i, lb)];
        }
    }
}

}  // namespace ember

#define EMBER_BINARY(KERNEL, OP, SUFFIX, T)                                                        \
    extern "C" __global__ void KERNEL##_##SUFFIX(ember::i64 n, ember::StridedLayout la, ember::StridedLayout lb, \
                                                 const T* a, const T* b, T* out) {                 \
        ember::binary<T, OP>(n, la, lb, a, b, out);                                                \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(KERNEL##_##SUFFIX)

#define EMBER_BINARY_FLOATS(KERNEL, OP)                                                            \
    EMBER_BINARY(KERNEL, OP, f32, float)                                                           \
    EMBER_BINARY(KERNEL, OP, f64, double)                                                          \
    EMBER_BINARY(KERNEL, OP, f16, ember::f16)                                                      \
    EMBER_BINARY(KERNEL, OP, bf16, ember::bf16)

#define EMBER_BINARY_NUMERIC(KERNEL, OP)                                                           \
    EMBER_BINARY_FLOATS(KERNEL, OP)                                                                \
    EMBER_BINARY(KERNEL, OP, i64, ember::i64)                                                      \
    EMBER_BINARY(KERNEL, OP, i32, ember::i32)                                                      \
    EMBER_BINARY(KERNEL, OP, u8, ember::u8)

#define EMBER_BINARY_ALL(KERNEL, OP)                                                               \
    EMBER_BINARY_NUMERIC(KERNEL, OP)                                                               \
    EMBER_BINARY(KERNEL, OP, bool, bool)

EMBER_BINARY_ALL(badd, ember::BAdd)
EMBER_BINARY_NUMERIC(bsub, ember::BSub)
EMBER_BINARY_ALL(bmul, ember::BMul)
EMBER_BINARY_FLOATS(bdiv, ember::BDiv)
EMBER_BINARY_NUMERIC(bpow, ember::BPow)
EMBER_BINARY_ALL(bmaximum, ember::BMaximum)
EMBER_BINARY_ALL(bminimum, ember::BMinimum)
EMBER_BINARY(bland, ember::BLand, bool, bool)
EMBER_BINARY(blor, ember::BLor, bool, bool)
EMBER_BINARY(blxor, ember::BLxor, bool, bool)

#define EMBER_CMP(NAME, OP, SUFFIX, T)                                                             \
    extern "C" __global__ void cmp_##NAME##_##SUFFIX(ember::i64 n, ember::StridedLayout la, ember::StridedLayout lb, \
                                                     const T* a, const T* b, bool* out) {          \
        ember::compare<T, OP>(n, la, lb, a, b, out);                                               \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(cmp_##NAME##_##SUFFIX)

#define EMBER_WHERE(SUFFIX, T)                                                                     \
    extern "C" __global__ void where_##SUFFIX(ember::i64 n, ember::StridedLayout lc, ember::StridedLayout la, \
                                              ember::StridedLayout lb, const bool* cond, const T* a, const T* b, \
                                              T* out) {                                            \
        ember::where_select<T>(n, lc, la, lb, cond, a, b, out);                                    \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(where_##SUFFIX)

#define EMBER_FOR_EACH_DTYPE(X, ...)                                                               \
    X(__VA_ARGS__, f32, float)                                                                     \
    X(__VA_ARGS__, f64, double)                                                                    \
    X(__VA_ARGS__, f16, ember::f16)                                                                \
    X(__VA_ARGS__, bf16, ember::bf16)                                                              \
    X(__VA_ARGS__, i64, ember::i64)                                                                \
    X(__VA_ARGS__, i32, ember::i32)                                                                \
    X(__VA_ARGS__, u8, ember::u8)                                                                  \
    X(__VA_ARGS__, bool, bool)

EMBER_FOR_EACH_DTYPE(EMBER_CMP, eq, ember::CmpEq)
EMBER_FOR_EACH_DTYPE(EMBER_CMP, ne, ember::CmpNe)
EMBER_FOR_EACH_DTYPE(EMBER_CMP, lt, ember::CmpLt)
EMBER_FOR_EACH_DTYPE(EMBER_CMP, le, ember::CmpLe)
EMBER_FOR_EACH_DTYPE(EMBER_CMP, gt, ember::CmpGt)
EMBER_FOR_EACH_DTYPE(EMBER_CMP, ge, ember::CmpGe)

#define EMBER_WHERE_ROW(UNUSED, SUFFIX, T) EMBER_WHERE(SUFFIX, T)
EMBER_FOR_EACH_DTYPE(EMBER_WHERE_ROW, _)
