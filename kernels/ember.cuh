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

// ---- elementwise loops: contiguous vectors and rank-4 strided indices -----------------------
// Note [Elementwise loops]: the unary, binary, comparison, where and cast kernels share these
// loops (kernels/README.md, "Elementwise loops").
//
// Contiguous operands: element i of every operand is element i of the iteration. A *group*
// is G consecutive elements, G = 16 / (the widest operand's size), so that the widest operand
// moves 16 bytes per group and the others 8, 4, 2 or 1 (one memory instruction each). Each
// thread takes ELEMENTWISE_UNROLL groups per pass, block-tiled (group k of a thread is
// `tile + k * blockDim.x + threadIdx.x`, so every load instruction of a warp reads one
// contiguous run) and issues all their loads before the first compute. The index math is
// 32-bit: the elements are walked in chunks of 2^31 (a multiple of every vector width, so
// alignment holds in every chunk), inside which every index and every grid step stays below
// 2^32; only a grid so large that one pass covers more than 2^31 elements (never launched by
// the host) takes the plain 64-bit loop. Operands not aligned to their vector width (a view
// at an odd offset) take the scalar loop, also 32-bit. Any 1-D grid is correct; the host
// sizes it to one pass over the groups, up to a few waves of the device's SMs
// (`ember_kernels::launch_config_elementwise`).
//
// Strided operands of rank <= 4 (all sharing the iteration shape, which the host
// guarantees and `strided4_fits` checks), n below 2^32 minus one grid step: the iteration
// index is split into digits with 32-bit divisions (rank - 1 of them, shared by every
// operand) instead of 64-bit ones per dimension per operand; other shapes use
// `strided_offset`. The offsets are the same integers either way, so results are identical.
constexpr int ELEMENTWISE_UNROLL = 4;
// Elements per chunk of the 32-bit loops.
constexpr u64 ELEMENTWISE_CHUNK = u64(1) << 31;

template <int BYTES>
struct VecOf;
template <>
struct VecOf<16> {
    using type = uint4;
};
template <>
struct VecOf<8> {
    using type = uint2;
};
template <>
struct VecOf<4> {
    using type = u32;
};
template <>
struct VecOf<2> {
    using type = unsigned short;
};
template <>
struct VecOf<1> {
    using type = unsigned char;
};

// G elements of T as one memory access of G * sizeof(T) bytes.
template <typename T, int G>
union PackN {
    using Raw = typename VecOf<G * static_cast<int>(sizeof(T))>::type;
    Raw raw;
    T v[G];
};

template <typename T, int G>
__device__ __forceinline__ PackN<T, G> load_group(const T* p, u32 g) {
    PackN<T, G> x;
    x.raw = reinterpret_cast<const typename PackN<T, G>::Raw*>(p)[g];
    return x;
}

template <typename T>
__device__ __forceinline__ bool aligned_to(const T* p, unsigned bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Elements per group for operands of these types: 16 bytes of the widest.
template <typename... Ts>
__host__ __device__ constexpr int group_of() {
    int widest = 1;
    ((widest = static_cast<int>(sizeof(Ts)) > widest ? static_cast<int>(sizeof(Ts)) : widest), ...);
    return 16 / widest;
}

// One group of every input, loaded, and the op applied to its j-th elements.
template <int G, typename... In>
struct Loaded;
template <int G, typename A>
struct Loaded<G, A> {
    PackN<A, G> a;
    __device__ __forceinline__ void load(u32 g, const A* pa) { a = load_group<A, G>(pa, g); }
    template <typename F>
    __device__ __forceinline__ auto at(const F& f, int j) const {
        return f(a.v[j]);
    }
};
template <int G, typename A, typename B>
struct Loaded<G, A, B> {
    PackN<A, G> a;
    PackN<B, G> b;
    __device__ __forceinline__ void load(u32 g, const A* pa, const B* pb) {
        a = load_group<A, G>(pa, g);
        b = load_group<B, G>(pb, g);
    }
    template <typename F>
    __device__ __forceinline__ auto at(const F& f, int j) const {
        return f(a.v[j], b.v[j]);
    }
};
template <int G, typename A, typename B, typename C>
struct Loaded<G, A, B, C> {
    PackN<A, G> a;
    PackN<B, G> b;
    PackN<C, G> c;
    __device__ __forceinline__ void load(u32 g, const A* pa, const B* pb, const C* pc) {
        a = load_group<A, G>(pa, g);
        b = load_group<B, G>(pb, g);
        c = load_group<C, G>(pc, g);
    }
    template <typename F>
    __device__ __forceinline__ auto at(const F& f, int j) const {
        return f(a.v[j], b.v[j], c.v[j]);
    }
};

// out[i] = f(in[i]...) for i < n (n <= 2^31, one grid pass <= 2^31 elements): groups, then
// the scalar tail; scalars throughout when `vec` is false.
template <int G, int U, typename O, typename F, typename... In>
__device__ __forceinline__ void map_chunk(u32 n, bool vec, const F& f, O* out, const In*... in) {
    u32 head = 0;
    if (vec) {
        const u32 groups = n / G, bd = blockDim.x, step = gridDim.x * bd * U;
        for (u32 g0 = blockIdx.x * bd * U + threadIdx.x; g0 < groups; g0 += step) {
            Loaded<G, In...> x[U];
#pragma unroll
            for (int k = 0; k < U; k++) {
                if (g0 + k * bd < groups) x[k].load(g0 + k * bd, in...);
            }
#pragma unroll
            for (int k = 0; k < U; k++) {
                const u32 g = g0 + k * bd;
                if (g < groups) {
                    PackN<O, G> z;
#pragma unroll
                    for (int j = 0; j < G; j++) z.v[j] = x[k].at(f, j);
                    reinterpret_cast<typename PackN<O, G>::Raw*>(out)[g] = z.raw;
                }
            }
        }
        head = groups * G;
    }
    const u32 stride = gridDim.x * blockDim.x;
    for (u32 i = head + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(in[i]...);
}

// out[i] = f(in[i]...) for i < n over contiguous operands (Note [Elementwise loops]); U groups
// per thread per pass (fewer for ops whose inlined copies would not fit in registers).
template <int U = ELEMENTWISE_UNROLL, typename O, typename F, typename... In>
__device__ __forceinline__ void map_contiguous(i64 n, const F& f, O* out, const In*... in) {
    constexpr int G = group_of<O, In...>();
    const u64 pass = static_cast<u64>(gridDim.x) * blockDim.x * U * G;
    if (pass > ELEMENTWISE_CHUNK) {
        for (i64 i = global_thread_id(); i < n; i += grid_stride()) out[i] = f(in[i]...);
        return;
    }
    const bool vec = aligned_to(out, G * sizeof(O)) && (aligned_to(in, G * sizeof(In)) && ...);
    for (u64 base = 0; base < static_cast<u64>(n); base += ELEMENTWISE_CHUNK) {
        const u64 left = static_cast<u64>(n) - base;
        const u32 len = static_cast<u32>(left < ELEMENTWISE_CHUNK ? left : ELEMENTWISE_CHUNK);
        map_chunk<G, U>(len, vec, f, out + base, (in + base)...);
    }
}

// Whether the rank-4 strided loop applies: rank <= 4, every layout over `l`'s iteration
// shape, and n plus one grid step below 2^32.
template <typename... L>
__device__ __forceinline__ bool strided4_fits(i64 n, const StridedLayout& l, const L&... others) {
    if (l.rank > 4) return false;
    if (static_cast<u64>(n) + static_cast<u64>(gridDim.x) * blockDim.x >= (u64(1) << 32)) return false;
    bool same = true;
#pragma unroll
    for (int d = 0; d < 4; d++) {
        if (d < l.rank) same = same && ((others.rank == l.rank && others.sizes[d] == l.sizes[d]) && ...);
    }
    return same && ((others.rank == l.rank) && ...);
}

// The digits of `linear` (< the product of l's sizes) in l's shape, rank <= 4: rank - 1
// 32-bit divisions (the outermost digit is what is left).
struct Digits4 {
    u32 d[4];
};
__device__ __forceinline__ Digits4 digits4(u32 linear, const StridedLayout& l) {
    Digits4 q;
#pragma unroll
    for (int d = 3; d >= 0; --d) {
        q.d[d] = 0;
        if (d < l.rank) {
            if (d == 0) {
                q.d[d] = linear;
            } else {
                const u32 size = static_cast<u32>(l.sizes[d]);
                const u32 next = linear / size;
                q.d[d] = linear - next * size;
                linear = next;
            }
        }
    }
    return q;
}
__device__ __forceinline__ i64 offset4(const Digits4& q, const StridedLayout& l) {
    i64 offset = 0;
#pragma unroll
    for (int d = 0; d < 4; d++) {
        if (d < l.rank) offset += static_cast<i64>(q.d[d]) * l.strides[d];
    }
    return offset;
}

}  // namespace ember
