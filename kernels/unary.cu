// Strided unary elementwise ops: out[i] = op(in[offset(i)]).
//
//   {op}_{dtype}(i64 n, StridedLayout l, const T* in, T* out)
//
// `out` is contiguous with n elements; `l` maps the iteration (out's shape, row-major) onto
// `in` (see StridedLayout in ember.cuh). The loops are ember.cuh's (Note [Elementwise loops]):
// a contiguous `in` takes groups of 16 bytes, four per thread per pass with every load issued
// before the first compute (one for sin and cos), 32-bit indices, scalar accesses for the tail
// or when a pointer is misaligned; a strided `in` of rank <= 4 splits the index with 32-bit
// divisions. f16 and bf16 are computed in f32 and rounded once. Any 1-D grid works; the host
// launches `launch_config_elementwise`.
//
// Bound (contiguous): one read and one write per element, 8 bytes for f32 (4 for f16/bf16, 16
// for f64/i64, 2 for u8/bool): 40 µs for 2^24 f32 elements at an H100's 3.35 TB/s.
//
// The ops and their dtypes are those of crates/ember-tensor/src/op.rs (`KERNEL` names):
//
//   uneg, uabs, urelu               f32 f64 f16 bf16 i64 i32 u8   (ints wrap: -INT_MIN = INT_MIN;
//                                                                  abs/relu of u8 is the identity)
//   usign                           the same and bool (identity); float sign(±0) = ±0, sign(NaN) = NaN
//   uexp ulog ulog1p usqrt ursqrt   f32 f64 f16 bf16 (integer inputs are cast to f32 by the host)
//   usin ucos utanh usigmoid ureciprocal
//   usilu usoftplus ugelu_tanh ugelu_erf uhardswish   f32 f64 f16 bf16
//
// Floats use CUDA's accurate math functions (not the fast intrinsics); results agree with the
// CPU backend within a few ulps (the CPU's f32 exp is its own polynomial, erf its own series).
#include "ember.cuh"

namespace ember {

// Wrapping integer negation and absolute value (Rust's wrapping_neg/wrapping_abs).
__device__ __forceinline__ i64 wrap_neg(i64 x) { return static_cast<i64>(0ull - static_cast<u64>(x)); }
__device__ __forceinline__ i32 wrap_neg(i32 x) { return static_cast<i32>(0u - static_cast<unsigned>(x)); }
__device__ __forceinline__ u8 wrap_neg(u8 x) { return static_cast<u8>(0u - x); }

#define EMBER_UNARY_FLOAT_OP(NAME, F32_EXPR, F64_EXPR)                                             \
    struct NAME {                                                                                  \
        __device__ __forceinline__ static float f(float x) { return F32_EXPR; }                    \
        __device__ __forceinline__ static double f(double x) { return F64_EXPR; }                  \
    };

struct UNeg {
    __device__ __forceinline__ static float f(float x) { return -x; }
    __device__ __forceinline__ static double f(double x) { return -x; }
    template <typename I>
    __device__ __forceinline__ static I f(I x) {
        return wrap_neg(x);
    }
};
struct UAbs {
    __device__ __forceinline__ static float f(float x) { return fabsf(x); }
    __device__ __forceinline__ static double f(double x) { return fabs(x); }
    __device__ __forceinline__ static i64 f(i64 x) { return x < 0 ? wrap_neg(x) : x; }
    __device__ __forceinline__ static i32 f(i32 x) { return x < 0 ? wrap_neg(x) : x; }
    __device__ __forceinline__ static u8 f(u8 x) { return x; }
};
struct USign {
    // 0 * x keeps the sign of zero and turns NaN into NaN, as the CPU's `0.0 * x`.
    __device__ __forceinline__ static float f(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f * x); }
    __device__ __forceinline__ static double f(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0 * x); }
    __device__ __forceinline__ static i64 f(i64 x) { return (x > 0) - (x < 0); }
    __device__ __forceinline__ static i32 f(i32 x) { return (x > 0) - (x < 0); }
    __device__ __forceinline__ static u8 f(u8 x) { return x > 0; }
    __device__ __forceinline__ static bool f(bool x) { return x; }
};
struct URelu {
    // x < 0 ? 0 : x: NaN and -0.0 pass through, as on the CPU.
    __device__ __forceinline__ static float f(float x) { return x < 0.0f ? 0.0f : x; }
    __device__ __forceinline__ static double f(double x) { return x < 0.0 ? 0.0 : x; }
    __device__ __forceinline__ static i64 f(i64 x) { return x < 0 ? 0 : x; }
    __device__ __forceinline__ static i32 f(i32 x) { return x < 0 ? 0 : x; }
    __device__ __forceinline__ static u8 f(u8 x) { return x; }
};

EMBER_UNARY_FLOAT_OP(UExp, expf(x), exp(x))
EMBER_UNARY_FLOAT_OP(ULog, logf(x), log(x))
EMBER_UNARY_FLOAT_OP(ULog1p, log1pf(x), log1p(x))
EMBER_UNARY_FLOAT_OP(USqrt, sqrtf(x), sqrt(x))
EMBER_UNARY_FLOAT_OP(URsqrt, 1.0f / sqrtf(x), 1.0 / sqrt(x))
// sin/cos of f32 (and f16/bf16) go through f64: rounding the f64 result to f32 is more
// accurate than sinf. Both CUDA versions reduce huge arguments (Payne-Hanek) through a local
// array, so every usin/ucos kernel has a 40-byte stack frame, touched only on that slow path
// (allowed, with this reason, in `cargo xtask kernels`). The cost is f64 throughput (1/64 of
// f32 on consumer GPUs, 1/2 on H100), for ops that are rare in networks.
EMBER_UNARY_FLOAT_OP(USin, static_cast<float>(sin(static_cast<double>(x))), sin(x))
EMBER_UNARY_FLOAT_OP(UCos, static_cast<float>(cos(static_cast<double>(x))), cos(x))
EMBER_UNARY_FLOAT_OP(UTanh, tanhf(x), tanh(x))
EMBER_UNARY_FLOAT_OP(USigmoid, 1.0f / (1.0f + expf(-x)), 1.0 / (1.0 + exp(-x)))
EMBER_UNARY_FLOAT_OP(UReciprocal, 1.0f / x, 1.0 / x)
EMBER_UNARY_FLOAT_OP(USilu, x / (1.0f + expf(-x)), x / (1.0 + exp(-x)))
// PyTorch's hardswish: x * relu6(x + 3) / 6.
EMBER_UNARY_FLOAT_OP(UHardswish, x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f,
                     x * fmin(fmax(x + 3.0, 0.0), 6.0) / 6.0)
// PyTorch's softplus with beta = 1, threshold = 20.
EMBER_UNARY_FLOAT_OP(USoftplus, x > 20.0f ? x : log1pf(expf(x)), x > 20.0 ? x : log1p(exp(x)))
// sqrt(2/pi) = 0.7978845608028654.
EMBER_UNARY_FLOAT_OP(UGeluTanh, 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))),
                     0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))))
EMBER_UNARY_FLOAT_OP(UGeluErf, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)),
                     0.5 * x * (1.0 + erf(x * 0.70710678118654752)))

template <typename T, typename Op>
__device__ __forceinline__ T unary_apply(T x) {
    return Widen<T>::out(Op::f(Widen<T>::in(x)));
}

// Groups per thread per pass of the contiguous loop: sin and cos inline a long f64 argument
// reduction, and four groups of them need a stack frame; one group (as before) does not.
template <typename Op>
struct UnaryUnroll {
    static constexpr int value = ELEMENTWISE_UNROLL;
};
template <>
struct UnaryUnroll<USin> {
    static constexpr int value = 1;
};
template <>
struct UnaryUnroll<UCos> {
    static constexpr int value = 1;
};

template <typename T, typename Op>
__device__ void unary(i64 n, const StridedLayout& l, const T* in, T* out) {
    const auto f = [](T x) { return unary_apply<T, Op>(x); };
    if (l.contiguous) {
        map_contiguous<UnaryUnroll<Op>::value>(n, f, out, in);
    } else if (strided4_fits(n, l)) {
        const u32 stride = gridDim.x * blockDim.x;
        for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            out[i] = f(in[offset4(digits4(i, l), l)]);
        }
    } else {
        for (i64 i = global_thread_id(); i < n; i += grid_stride()) out[i] = f(in[strided_offset(i, l)]);
    }
}

}  // namespace ember

#define EMBER_UNARY(KERNEL, OP, SUFFIX, T)                                                         \
    extern "C" __global__ void KERNEL##_##SUFFIX(ember::i64 n, ember::StridedLayout l, const T* in, T* out) { \
        ember::unary<T, OP>(n, l, in, out);                                                        \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(KERNEL##_##SUFFIX)

#define EMBER_UNARY_FLOATS(KERNEL, OP)                                                             \
    EMBER_UNARY(KERNEL, OP, f32, float)                                                            \
    EMBER_UNARY(KERNEL, OP, f64, double)                                                           \
    EMBER_UNARY(KERNEL, OP, f16, ember::f16)                                                       \
    EMBER_UNARY(KERNEL, OP, bf16, ember::bf16)

#define EMBER_UNARY_NUMERIC(KERNEL, OP)                                                            \
    EMBER_UNARY_FLOATS(KERNEL, OP)                                                                 \
    EMBER_UNARY(KERNEL, OP, i64, ember::i64)                                                       \
    EMBER_UNARY(KERNEL, OP, i32, ember::i32)                                                       \
    EMBER_UNARY(KERNEL, OP, u8, ember::u8)

EMBER_UNARY_NUMERIC(uneg, ember::UNeg)
EMBER_UNARY_NUMERIC(uabs, ember::UAbs)
EMBER_UNARY_NUMERIC(usign, ember::USign)
EMBER_UNARY(usign, ember::USign, bool, bool)
EMBER_UNARY_NUMERIC(urelu, ember::URelu)
EMBER_UNARY_FLOATS(uexp, ember::UExp)
EMBER_UNARY_FLOATS(ulog, ember::ULog)
EMBER_UNARY_FLOATS(ulog1p, ember::ULog1p)
EMBER_UNARY_FLOATS(usqrt, ember::USqrt)
EMBER_UNARY_FLOATS(ursqrt, ember::URsqrt)
EMBER_UNARY_FLOATS(usin, ember::USin)
EMBER_UNARY_FLOATS(ucos, ember::UCos)
EMBER_UNARY_FLOATS(utanh, ember::UTanh)
EMBER_UNARY_FLOATS(usigmoid, ember::USigmoid)
EMBER_UNARY_FLOATS(ureciprocal, ember::UReciprocal)
EMBER_UNARY_FLOATS(usilu, ember::USilu)
EMBER_UNARY_FLOATS(usoftplus, ember::USoftplus)
EMBER_UNARY_FLOATS(ugelu_tanh, ember::UGeluTanh)
EMBER_UNARY_FLOATS(ugelu_erf, ember::UGeluErf)
EMBER_UNARY_FLOATS(uhardswish, ember::UHardswish)
