// The shared header of Ember's kernels: dtype helpers, strided index math, reductions, and the
// macros that stamp a templated kernel into extern "C" entry points. See kernels/README.md.
//
// Under nvcc it includes CUDA's fp16/bf16 headers; anywhere else it includes the emulation
// header (kernels/emu/cuda_emu.h), so every .cu file here also compiles with g++ for the
// CPU emulator.
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
// Under nvcc there is nothing to register: the driver finds entry points in the fatbin.
#define EMBER_REGISTER_KERNEL(NAME)
#define EMBER_DYNAMIC_SHARED(T, NAME)                                                              \
    extern __shared__ __align__(16) unsigned char ember_dynamic_shared_[];                         \
    T* NAME = reinterpret_cast<T*>(ember_dynamic_shared_)
#else
#include "emu/cuda_emu.h"
#endif

namespace ember {

using f16 = __half;
using bf16 = __nv_bfloat16;
using i64 = long long;
using i32 = int;
using u8 = unsigned char;
using u64 = unsigned long long;
using u32 = unsigned int;

// ---- dtypes: 16-bit floats are stored as such and computed in f32 ---------------------------
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// The type an element is computed in: f32 for f16/bf16 (loaded, widened, computed, rounded
// once on the way out), the element type itself otherwise.
template <typename T>
struct Widen {
    using type = T;
    __device__ __forceinline__ static T in(T x) { return x; }
    __device__ __forceinline__ static T out(T x) { return x; }
};
template <>
struct Widen<f16> {
    using type = float;
    __device__ __forceinline__ static float in(f16 x) { return to_f32(x); }
    __device__ __forceinline__ static f16 out(float x) { return from_f32<f16>(x); }
};
template <>
struct Widen<bf16> {
    using type = float;
    __device__ __forceinline__ static float in(bf16 x) { return to_f32(x); }
    __device__ __forceinline__ static bf16 out(float x) { return from_f32<bf16>(x); }
};

// ---- device pointers read from device memory ------------------------------------------------
// A multi-tensor kernel takes a table of device addresses (u64) in device memory. On a GPU an
// address is the pointer; under the emulator it is a tagged address translated here, as
// pointer parameters are at launch (kernels/README.md, "Pointer tables").
template <typename T>
__device__ __forceinline__ T* device_ptr(u64 address) {
#if defined(__CUDACC__)
    return reinterpret_cast<T*>(address);
#else
    return static_cast<T*>(::ember_emu::translate_device_address(address));
#endif
}

// `true` unless x is an infinity or a NaN (the exponent bits are not all ones): a bit test, so
// no compiler flag can fold it away.
__device__ __forceinline__ bool finite_bits(float x) { return (__float_as_int(x) & 0x7f800000) != 0x7f800000; }
__device__ __forceinline__ bool finite_bits(double x) {
    return (__double_as_longlong(x) & 0x7ff0000000000000ll) != 0x7ff0000000000000ll;
}

// f64 to T as the CPU backend converts f64 scalars (the `half` crate's from_f64), bit for bit;
// see Note [f64 to 16-bit rounding] in kernels/README.md. f16: through f32 (two roundings, as
// the crate does on every x86-64 with F16C); bf16: nearest-even on the double's high 32 bits
// only (the crate ignores the low word).
__device__ __forceinline__ double high_word_only(double x) {
    return __longlong_as_double(__double_as_longlong(x) & static_cast<long long>(0xffffffff00000000ull));
}
template <typename T>
__device__ __forceinline__ T from_f64(double x);
template <>
__device__ __forceinline__ float from_f64<float>(double x) { return static_cast<float>(x); }
template <>
__device__ __forceinline__ f16 from_f64<f16>(double x) { return __float2half_rn(static_cast<float>(x)); }
template <>
__device__ __forceinline__ bf16 from_f64<bf16>(double x) { return __double2bfloat16(high_word_only(x)); }

// ---- indexing -------------------------------------------------------------------------------
constexpr int MAX_DIMS = 8;

// One operand's view of a strided tensor, passed to kernels by value. `sizes` is the shape
// the kernel iterates (the output's shape, after broadcasting), `strides` the operand's
// strides in elements for that shape (0 on broadcast dimensions). `contiguous` is nonzero when
// element i of the iteration is element i of the operand (the host decides). Mirrored by
// ember_kernels::StridedLayout; keep the two in step.
struct StridedLayout {
    int rank;
    int contiguous;
    i64 sizes[MAX_DIMS];
    i64 strides[MAX_DIMS];
};
static_assert(sizeof(StridedLayout) == 8 + 16 * MAX_DIMS, "StridedLayout must match ember_kernels::StridedLayout");

// Offset (in elements) of the `linear`-th element of the iteration, row-major. Unrolled over
// MAX_DIMS so that the parameter arrays are only ever indexed by constants (no local memory).
__device__ __forceinline__ i64 strided_offset(i64 linear, const StridedLayout& l) {
    i64 offset = 0;
#pragma unroll
    for (int d = MAX_DIMS - 1; d >= 0; --d) {
        if (d < l.rank) {
            const i64 size = l.sizes[d];
            const i64 index = linear % size;
            linear /= size;
            offset += index * l.strides[d];
        }
    }
    return offset;
}

__device__ __forceinline__ i64 global_thread_id() {
    return static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ i64 grid_stride() { return static_cast<i64>(gridDim.x) * blockDim.x; }

// ---- reductions (every lane of the warp, every thread of the block must call them) ----------
constexpr unsigned FULL_MASK = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}
__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fminf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Combines `v` over the block with `op` (warp_sum, warp_max, ...); every thread gets the
// result. `scratch` is shared memory for 32 floats. blockDim.x must be a multiple of 32 and the
// block one-dimensional. Ends with a barrier, so `scratch` may be reused right after.
template <float (*WarpOp)(float)>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int warps = blockDim.x / 32;
    v = WarpOp(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : identity;
    v = WarpOp(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<warp_sum>(v, scratch, 0.0f); }
__device__ __forceinline__ float block_max(float v, float* scratch) {
    return block_reduce<warp_max>(v, scratch, -INFINITY);
}

// Generic forms for accumulators other than one float: `Op` provides `using A` (a plain
// struct or scalar), `static A identity()`, `static A combine(A, A)` (commutative: every lane
// must end with the same value) and `static A shfl_xor(A, int lane_mask)`. Same rules as
// block_reduce: every lane of the warp, every thread of the block, blockDim.x a multiple of
// 32; `scratch` is shared memory for 32 values of A; ends with a barrier.
template <typename Op>
__device__ __forceinline__ typename Op::A warp_combine(typename Op::A v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = Op::combine(v, Op::shfl_xor(v, offset));
    return v;
}
template <typename Op>
__device__ __forceinline__ typename Op::A block_combine(typename Op::A v, typename Op::A* scratch) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int warps = blockDim.x / 32;
    v = warp_combine<Op>(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : Op::identity();
    v = warp_combine<Op>(v);
    __syncthreads();
    return v;
}

// ---- 16-byte vectors for the contiguous fast paths -------------------------------------------
// 16 bytes of T, loaded and stored as one uint4 (one 128-bit memory instruction).
template <typename T>
union Pack16 {
    static constexpr int N = 16 / sizeof(T);
    uint4 raw;
    T v[N];
};

template <typename T>
__device__ __forceinline__ bool aligned16(const T* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace ember
