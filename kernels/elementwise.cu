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
// row-major) onto its operand, broadcasting by zero strides (see ember.cuh). The loops are
// ember.cuh's (Note [Elementwise loops]): when every operand is contiguous, groups of 16 bytes
// of the widest operand (a comparison's bool output and where's condition move G bytes per
// group of G elements), four groups per thread per pass with every load issued before the
// first compute, 32-bit indices, scalar accesses for the tail or when a pointer is
// misaligned; strided operands of rank <= 4 share one 32-bit split of the index. f16 and bf16
// are computed in f32 and rounded once. Any 1-D grid works; the host launches
// `launch_config_elementwise`.
//
// Bounds (contiguous, bytes read + written per element, f32 · f16/bf16 · f64/i64 · u8/bool):
//   binary   12 · 6 · 24 · 3   (60 µs for 2^24 f32 elements at 3.35 TB/s)
//   cmp       9 · 5 · 17 · 3   (45 µs)
//   where    13 · 7 · 25 · 4   (65 µs)
// A broadcast operand is read from cache after its first pass: the bound drops toward the
// other operands' bytes.
//
// Binary ops and dtypes, as crates/ember-tensor/src/op.rs (`KERNEL` names):
//
//   badd, bmul, bmaximum, bminimum   every dtype (bool: or, and, or, and)
//   bsub, bpow                       f32 f64 f16 bf16 i64 i32 u8
//   bdiv                             f32 f64 f16 bf16 (true division; the host promotes ints)
//   blogaddexp                       f32 f64 f16 bf16 (the host refuses other dtypes)
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
// PyTorch's logaddexp: max + log1p(exp(-|a - b|)), and a itself where both are the same
// infinity (logaddexp(-inf, -inf) = -inf, not NaN).
struct BLogAddExp {
    __device__ __forceinline__ static float f(float a, float b) {
        return (a == b && fabsf(a) == INFINITY) ? a : fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
    }
    __device__ __forceinline__ static double f(double a, double b) {
        return (a == b && fabs(a) == INFINITY) ? a : fmax(a, b) + log1p(exp(-fabs(a - b)));
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

// out[i] = f(a[.], b[.]) over two operands: contiguous, rank-4 strided or general strided.
template <typename T, typename O, typename F>
__device__ __forceinline__ void map2(i64 n, const StridedLayout& la, const StridedLayout& lb, const T* a, const T* b,
                                     O* out, const F& f) {
    if (la.contiguous && lb.contiguous) {
        map_contiguous(n, f, out, a, b);
    } else if (strided4_fits(n, la, lb)) {
        const u32 stride = gridDim.x * blockDim.x;
        for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            const Digits4 q = digits4(i, la);
            out[i] = f(a[offset4(q, la)], b[offset4(q, lb)]);
        }
    } else {
        for (i64 i = global_thread_id(); i < n; i += grid_stride()) {
            out[i] = f(a[strided_offset(i, la)], b[strided_offset(i, lb)]);
        }
    }
}

template <typename T, typename Op>
__device__ void binary(i64 n, const StridedLayout& la, const StridedLayout& lb, const T* a, const T* b, T* out) {
    map2(n, la, lb, a, b, out, [](T x, T y) { return binary_apply<T, Op>(x, y); });
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
    map2(n, la, lb, a, b, out, [](T x, T y) -> bool { return Op::f(Widen<T>::in(x), Widen<T>::in(y)); });
}

// ---- where --------------------------------------------------------------------------------
template <typename T>
__device__ void where_select(i64 n, const StridedLayout& lc, const StridedLayout& la, const StridedLayout& lb,
                             const bool* cond, const T* a, const T* b, T* out) {
    const auto f = [](bool c, T x, T y) { return c ? x : y; };
    if (lc.contiguous && la.contiguous && lb.contiguous) {
        map_contiguous(n, f, out, cond, a, b);
    } else if (strided4_fits(n, lc, la, lb)) {
        const u32 stride = gridDim.x * blockDim.x;
        for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            const Digits4 q = digits4(i, lc);
            out[i] = f(cond[offset4(q, lc)], a[offset4(q, la)], b[offset4(q, lb)]);
        }
    } else {
        for (i64 i = global_thread_id(); i < n; i += grid_stride()) {
            out[i] = f(cond[strided_offset(i, lc)], a[strided_offset(i, la)], b[strided_offset(i, lb)]);
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
EMBER_BINARY_FLOATS(blogaddexp, ember::BLogAddExp)
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
