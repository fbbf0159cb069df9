// Dtype conversions (and, for src == dst, strided copies into a contiguous output).
//
//   cast_{src}_{dst}(i64 n, StridedLayout l, const S* in, D* out)     every pair of
//       f32 f64 f16 bf16 i64 i32 u8 bool (64 kernels)
//
// out[i] = convert(in[offset(i)]); `out` is contiguous. The rules are the CPU backend's
// (cast_elem in crates/ember-tensor/src/cpu/mod.rs, Note [Float to int casts] in dtype.rs):
//
// - into bool: x != 0 (NaN is true);
// - float into i64/i32: truncation toward zero, saturating at the type's bounds, NaN -> 0
//   (Rust's `as`); into u8: the same into i64, then wrapping (so -1.0 -> 255);
// - integer/bool into integer: wrapping (a C cast);
// - into f32/f64: one rounding (nearest even); into f16/bf16: through f32 (the CPU's
//   `from_f32(v as f32)`, two roundings from f64 or i64), nearest even.
//
// Written out explicitly rather than left to C++ casts, whose float-to-int conversion is
// undefined out of range, so that nvcc and g++ give the same answers.
//
// The loops are ember.cuh's (Note [Elementwise loops]): contiguous inputs in groups of 16
// bytes of the wider of the two types (f32 -> f16 reads 16 and writes 8 bytes per group of
// 4), four groups per thread per pass, 32-bit indices, scalar accesses for the tail or when
// misaligned; strided inputs of rank <= 4 with a 32-bit split of the index.
//
// Bound (contiguous): size(src) + size(dst) bytes per element: f32 -> f16 6, f16 -> f32 6,
// f32 -> f64 12, cast_{d}_{d} 2·size(d); 30 µs (6 bytes) to 60 µs (12) for 2^24 elements.
#include "ember.cuh"

namespace ember {

// Every source widened to what the CPU converts from: f64 for floats, i64 for integers/bool.
__device__ __forceinline__ double cast_wide(float x) { return x; }
__device__ __forceinline__ double cast_wide(double x) { return x; }
__device__ __forceinline__ double cast_wide(f16 x) { return to_f32(x); }
__device__ __forceinline__ double cast_wide(bf16 x) { return to_f32(x); }
__device__ __forceinline__ i64 cast_wide(i64 x) { return x; }
__device__ __forceinline__ i64 cast_wide(i32 x) { return x; }
__device__ __forceinline__ i64 cast_wide(u8 x) { return x; }
__device__ __forceinline__ i64 cast_wide(bool x) { return x ? 1 : 0; }

// Rust's saturating `f64 as i64`: 2^63 is the first double above i64::MAX.
__device__ __forceinline__ i64 f64_to_i64_sat(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return 0x7fffffffffffffffll;
    if (x <= -9223372036854775808.0) return static_cast<i64>(0x8000000000000000ull);
    return static_cast<i64>(x);
}
__device__ __forceinline__ i32 f64_to_i32_sat(double x) {
    if (x != x) return 0;
    if (x >= 2147483647.0) return 2147483647;
    if (x <= -2147483648.0) return static_cast<i32>(0x80000000u);
    return static_cast<i32>(x);
}

template <typename D>
struct CastTo;
template <>
struct CastTo<float> {
    __device__ __forceinline__ static float from(double x) { return static_cast<float>(x); }
    __device__ __forceinline__ static float from(i64 x) { return static_cast<float>(x); }
};
template <>
struct CastTo<double> {
    __device__ __forceinline__ static double from(double x) { return x; }
    __device__ __forceinline__ static double from(i64 x) { return static_cast<double>(x); }
};
template <>
struct CastTo<f16> {
    __device__ __forceinline__ static f16 from(double x) { return from_f32<f16>(static_cast<float>(x)); }
    __device__ __forceinline__ static f16 from(i64 x) { return from_f32<f16>(static_cast<float>(x)); }
};
template <>
struct CastTo<bf16> {
    __device__ __forceinline__ static bf16 from(double x) { return from_f32<bf16>(static_cast<float>(x)); }
    __device__ __forceinline__ static bf16 from(i64 x) { return from_f32<bf16>(static_cast<float>(x)); }
};
template <>
struct CastTo<i64> {
    __device__ __forceinline__ static i64 from(double x) { return f64_to_i64_sat(x); }
    __device__ __forceinline__ static i64 from(i64 x) { return x; }
};
template <>
struct CastTo<i32> {
    __device__ __forceinline__ static i32 from(double x) { return f64_to_i32_sat(x); }
    __device__ __forceinline__ static i32 from(i64 x) { return static_cast<i32>(static_cast<unsigned>(x)); }
};
template <>
struct CastTo<u8> {
    __device__ __forceinline__ static u8 from(double x) { return static_cast<u8>(f64_to_i64_sat(x)); }
    __device__ __forceinline__ static u8 from(i64 x) { return static_cast<u8>(x); }
};
template <>
struct CastTo<bool> {
    __device__ __forceinline__ static bool from(double x) { return x != 0.0; }
    __device__ __forceinline__ static bool from(i64 x) { return x != 0; }
};

template <typename S, typename D>
__device__ __forceinline__ D cast_one(S x) {
    return CastTo<D>::from(cast_wide(x));
}
// Same type: a bit copy (NaN payloads kept), which makes cast_{d}_{d} the strided copy.
template <>
__device__ __forceinline__ float cast_one<float, float>(float x) { return x; }
template <>
__device__ __forceinline__ f16 cast_one<f16, f16>(f16 x) { return x; }
template <>
__device__ __forceinline__ bf16 cast_one<bf16, bf16>(bf16 x) { return x; }

template <typename S, typename D>
__device__ void cast(i64 n, const StridedLayout& l, const S* in, D* out) {
    const auto f = [](S x) { return cast_one<S, D>(x); };
    if (l.contiguous) {
        map_contiguous(n, f, out, in);
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

#define EMBER_CAST(SS, S, DS, D)                                                                   \
    extern "C" __global__ void cast_##SS##_##DS(ember::i64 n, ember::StridedLayout l, const S* in, D* out) { \
        ember::cast<S, D>(n, l, in, out);                                                          \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(cast_##SS##_##DS)

#define EMBER_CAST_FROM(SS, S)                                                                     \
    EMBER_CAST(SS, S, f32, float)                                                                  \
    EMBER_CAST(SS, S, f64, double)                                                                 \
    EMBER_CAST(SS, S, f16, ember::f16)                                                             \
    EMBER_CAST(SS, S, bf16, ember::bf16)                                                           \
    EMBER_CAST(SS, S, i64, ember::i64)                                                             \
    EMBER_CAST(SS, S, i32, ember::i32)                                                             \
    EMBER_CAST(SS, S, u8, ember::u8)                                                               \
    EMBER_CAST(SS, S, bool, bool)

EMBER_CAST_FROM(f32, float)
EMBER_CAST_FROM(f64, double)
EMBER_CAST_FROM(f16, ember::f16)
EMBER_CAST_FROM(bf16, ember::bf16)
EMBER_CAST_FROM(i64, ember::i64)
EMBER_CAST_FROM(i32, ember::i32)
EMBER_CAST_FROM(u8, ember::u8)
EMBER_CAST_FROM(bool, bool)
