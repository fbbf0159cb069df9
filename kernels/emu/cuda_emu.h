// CUDA C on the CPU: the emulation header. See kernels/README.md, "The emulator".
//
// Included by kernels/ember.cuh when the compiler is not nvcc (g++ -x c++ -std=c++20). It
// defines just enough of CUDA's device-side language for Ember's kernels to compile and run
// unchanged on the CPU:
//
// - `__global__`, `__device__`, `__host__`, `__forceinline__`, `__launch_bounds__`,
//   `__restrict__`, `__align__` as nothing (or their C++ meaning);
// - `threadIdx`, `blockIdx`, `blockDim`, `gridDim` as thread_local variables, switched by the
//   scheduler as it runs each emulated thread; `warpSize`;
// - `__shared__` as `static` (blocks run one at a time and launches are serialised, so one
//   copy per kernel is one copy per running block) and EMBER_DYNAMIC_SHARED for dynamic
//   shared memory, poison-filled (0xFF bytes: NaN for floats, -1 for integers) before each
//   block so that reads of never-written shared memory show up in results;
// - a block's threads as fibers on the launching OS thread, scheduled round-robin; they
//   switch only at barriers: `__syncthreads`, `__syncwarp`, the shuffles and votes;
// - `__shfl_sync`/`_up_`/`_down_`/`_xor_`, `__ballot_sync`, `__any_sync`, `__all_sync`,
//   `__activemask` via per-lane exchange slots between two warp barriers (every live lane of
//   the warp must take part: partial masks are reported and abort);
// - atomics via std::atomic_ref; `__half` and `__nv_bfloat16` as 16-bit structs with
//   round-to-nearest-even conversions; the few math intrinsics kernels use.
//
// Threads that return early drop out of later barriers (as on sm_70+). A barrier that can
// never complete (every live thread waits, and no barrier has all its threads) is reported
// on stderr with each waiting thread's position, and the process aborts: a hang in CI is
// worse than a crash. Like the hardware's barrier, __syncthreads counts arrivals: threads
// waiting at two different __syncthreads calls release each other (undefined behaviour in
// CUDA, not detected here: g++ may duplicate a call site, so call sites cannot be compared).
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

// ---- the launch ABI shared with ember-device (crates/ember-device/src/driver/emulator/kernels.rs)
extern "C" {
struct EmberKernelLaunch {
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_mem_bytes;
    void** params;
    size_t num_params;
    const void* translate_ctx;
    void* (*translate)(const void* ctx, uint64_t address);
};
typedef int (*EmberEmulatedKernel)(const EmberKernelLaunch* launch);
}
static_assert(sizeof(EmberKernelLaunch) == 64 && offsetof(EmberKernelLaunch, params) == 32,
              "EmberKernelLaunch must match ember_device's #[repr(C)] KernelLaunch");

namespace ember_emu {

// ---- the runtime (kernels/emu/cuda_emu.cpp) ----------------------------------------------
void syncthreads();
void syncwarp(unsigned mask);
unsigned char* dynamic_shared();
uint64_t warp_exchange(unsigned mask, uint64_t value, int (*source)(int lane, int arg, int width), int arg,
                       int width);
// The ballot of `predicate` over the warp; `*voters` (if not null) gets the lanes that took
// part, read between the vote's two barriers.
unsigned warp_vote(unsigned mask, bool predicate, unsigned* voters);
// The warp's live lanes (those that have not returned). CUDA's __activemask is the lanes
// executing together at the call, which the fiber model cannot observe; in converged code the
// two agree.
unsigned active_mask();
[[noreturn]] void fatal(const char* what);
// The host address of a device address a kernel read from device memory (a pointer table, as
// the multi-tensor kernels of amp.cu take): translated like a pointer parameter; an address
// outside every live allocation is fatal. Null stays null.
void* translate_device_address(uint64_t address);

// Runs `body(ctx)` as every thread of every block of the launch; returns 0, or a nonzero status
// after printing why to stderr.
int run_grid(const char* name, const EmberKernelLaunch* launch, void (*body)(void*), void* ctx);
void register_kernel(const char* name, EmberEmulatedKernel kernel);

// ---- the launch trampoline ----------------------------------------------------------------
// Casts params[i] to the kernel's i-th parameter type. Pointer parameters hold tagged device
// addresses and are translated (null stays null; an address outside every live allocation is
// a launch failure).
template <typename T>
bool load_param(const EmberKernelLaunch* l, size_t i, T& out) {
    if constexpr (std::is_pointer_v<T>) {
        uint64_t address;
        std::memcpy(&address, l->params[i], sizeof address);
        if (address == 0) {
            out = nullptr;
            return true;
        }
        void* host = l->translate(l->translate_ctx, address);
        out = static_cast<T>(host);
        return host != nullptr;
    } else {
        static_assert(std::is_trivially_copyable_v<T>, "kernel parameters must be trivially copyable");
        std::memcpy(static_cast<void*>(&out), l->params[i], sizeof(T));
        return true;
    }
}

int bad_launch(const char* name, const char* what, size_t index);

template <auto Kernel>
struct Launcher;

template <typename... Args, void (*Kernel)(Args...)>
struct Launcher<Kernel> {
    using Tuple = std::tuple<std::remove_cv_t<std::remove_reference_t<Args>>...>;

    static void body(void* ctx) { std::apply(Kernel, *static_cast<Tuple*>(ctx)); }

    template <size_t... I>
    static int load(const EmberKernelLaunch* l, Tuple& args, const char* name, std::index_sequence<I...>) {
        size_t failed = 0;
        bool ok = ((load_param(l, I, std::get<I>(args)) || (failed = I, false)) && ...);
        return ok ? 0 : bad_launch(name, "pointer parameter is not inside a live device allocation", failed);
    }

    static int launch(const char* name, const EmberKernelLaunch* l) {
        if (l->num_params != sizeof...(Args)) {
            return bad_launch(name, "wrong number of parameters", l->num_params);
        }
        Tuple args{};
        if (int status = load(l, args, name, std::index_sequence_for<Args...>{})) {
            return status;
        }
        return run_grid(name, l, &Launcher::body, &args);
    }
};

}  // namespace ember_emu

// Registers `NAME` (an extern "C" __global__ function) with the emulator by a static
// constructor; ember_kernels::register_emulated() hands the list to ember-device.
#define EMBER_REGISTER_KERNEL(NAME)                                                                \
    static int ember_emu_launch_##NAME(const EmberKernelLaunch* l) {                               \
        return ::ember_emu::Launcher<&NAME>::launch(#NAME, l);                                     \
    }                                                                                              \
    [[maybe_unused]] static const bool ember_emu_registered_##NAME =                              \
        (::ember_emu::register_kernel(#NAME, &ember_emu_launch_##NAME), true);

// `T* NAME` pointing at the block's dynamic shared memory (the launch's shared_mem_bytes).
#define EMBER_DYNAMIC_SHARED(T, NAME) T* NAME = reinterpret_cast<T*>(::ember_emu::dynamic_shared())

// ---- barriers, shuffles, votes --------------------------------------------------------------
inline void __syncthreads() { ember_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ember_emu::syncwarp(mask); }
inline unsigned __activemask() { return ember_emu::active_mask(); }
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return ember_emu::warp_vote(mask, predicate != 0, nullptr);
}
inline int __any_sync(unsigned mask, int predicate) { return ember_emu::warp_vote(mask, predicate != 0, nullptr) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
    unsigned voters = 0;
    return ember_emu::warp_vote(mask, predicate != 0, &voters) == voters;
}

namespace ember_emu {
// Source lane of each shuffle, or -1 for "keep your own value". `width` splits the warp into
// segments as in CUDA; the rules are PTX's `shfl.sync` clamps: idx wraps within the segment,
// up and down stay inside it, xor may read an earlier segment but not a later one.
inline int source_idx(int lane, int src, int width) { return (lane / width) * width + (src % width); }
inline int source_up(int lane, int delta, int width) { return (lane % width) >= delta ? lane - delta : -1; }
inline int source_down(int lane, int delta, int width) { return (lane % width) + delta < width ? lane + delta : -1; }
inline int source_xor(int lane, int mask, int width) {
    int src = lane ^ mask;
    return src / width <= lane / width ? src : -1;
}

template <typename T>
T shuffle(unsigned mask, T value, int (*source)(int, int, int), int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a type wider than 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    uint64_t got = warp_exchange(mask, bits, source, arg, width);
    T out;
    std::memcpy(static_cast<void*>(&out), &got, sizeof(T));
    return out;
}
}  // namespace ember_emu

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
    return ember_emu::shuffle(mask, var, ember_emu::source_idx, src_lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return ember_emu::shuffle(mask, var, ember_emu::source_up, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return ember_emu::shuffle(mask, var, ember_emu::source_down, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
    return ember_emu::shuffle(mask, var, ember_emu::source_xor, lane_mask, width);
}

// ---- atomics ------------------------------------------------------------------------------
template <typename T>
T atomicAdd(T* address, T value) {
    return std::atomic_ref<T>(*address).fetch_add(value);
}
template <typename T>
T atomicSub(T* address, T value) {
    return std::atomic_ref<T>(*address).fetch_sub(value);
}
template <typename T>
T atomicExch(T* address, T value) {
    return std::atomic_ref<T>(*address).exchange(value);
}
template <typename T>
T atomicMax(T* address, T value) {
    std::atomic_ref<T> a(*address);
    T old = a.load();
    while (old < value && !a.compare_exchange_weak(old, value)) {
    }
    return old;
}
template <typename T>
T atomicMin(T* address, T value) {
    std::atomic_ref<T> a(*address);
    T old = a.load();
    while (value < old && !a.compare_exchange_weak(old, value)) {
    }
    return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
    std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);
    return compare;
}
// 16-bit float atomics (CUDA has them from sm_70/sm_80): a compare-and-swap loop on the bits,
// adding in f32 and rounding once.
template <typename H, float (*Widen)(H), H (*Narrow)(float)>
H atomic_add_16(H* address, H value) {
    std::atomic_ref<uint16_t> bits(address->x);
    uint16_t old = bits.load();
    while (true) {
        H sum = Narrow(Widen(H{old}) + Widen(value));
        if (bits.compare_exchange_weak(old, sum.x)) return H{old};
    }
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- 16-bit floats --------------------------------------------------------------------------
namespace ember_emu {
// Round a double to the nearest value with EXP exponent bits and MANT mantissa bits (ties to
// even), returned as the format's bits. NaN keeps its sign and top payload bits and is quieted
// (as the `half` crate and GCC's _Float16 do).
template <int EXP, int MANT>
uint16_t round_from_double(double d) {
    constexpr int bias = (1 << (EXP - 1)) - 1;
    constexpr uint32_t inf = ((1u << EXP) - 1) << MANT;
    uint64_t x;
    std::memcpy(&x, &d, 8);
    const uint16_t sign = static_cast<uint16_t>((x >> 63) << (EXP + MANT));
    const int exp = static_cast<int>((x >> 52) & 0x7ff);
    const uint64_t frac = x & ((uint64_t{1} << 52) - 1);
    if (exp == 0x7ff) {
        if (frac == 0) return static_cast<uint16_t>(sign | inf);
        return static_cast<uint16_t>(sign | inf | (1u << (MANT - 1)) | (frac >> (52 - MANT)));
    }
    if (exp == 0) return sign;  // double subnormals are far below every 16-bit format's range
    const int e = exp - 1023;
    const uint64_t m = frac | (uint64_t{1} << 52);
    auto round = [](uint64_t m, int shift) {
        if (shift >= 64) return uint64_t{0};
        uint64_t q = m >> shift;
        uint64_t rem = m & ((uint64_t{1} << shift) - 1);
        uint64_t half = uint64_t{1} << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return q;
    };
    if (e > bias) return static_cast<uint16_t>(sign | inf);
    if (e >= 1 - bias) {
        uint64_t q = round(m, 52 - MANT);  // in [2^MANT, 2^(MANT+1)]
        uint64_t bits = (static_cast<uint64_t>(e + bias) << MANT) + (q - (uint64_t{1} << MANT));
        if (bits >= inf) bits = inf;
        return static_cast<uint16_t>(sign | bits);
    }
    // Subnormal: units of 2^(1 - bias - MANT).
    const int shift = 52 - (e - (1 - bias - MANT));
    return static_cast<uint16_t>(sign | round(m, shift));
}

template <int EXP, int MANT>
float widen(uint16_t h) {
    constexpr int bias = (1 << (EXP - 1)) - 1;
    if constexpr (EXP == 8) {
        // bf16 is the high half of an f32 (subnormals included); NaN comes back quiet.
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        if ((h & 0x7fff) > 0x7f80) bits |= 0x00400000u;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    }
    const uint32_t sign = static_cast<uint32_t>(h >> (EXP + MANT)) << 31;
    const int exp = (h >> MANT) & ((1 << EXP) - 1);
    uint32_t frac = h & ((1u << MANT) - 1);
    uint32_t bits;
    if (exp == (1 << EXP) - 1) {
        // NaN comes back quiet (as the `half` crate widens); infinity stays infinity.
        bits = sign | 0x7f800000u | (frac != 0 ? 0x00400000u : 0) | (frac << (23 - MANT));
    } else if (exp == 0) {
        if (frac == 0) {
            bits = sign;
        } else {
            int e = 1 - bias;
            while (!(frac & (1u << MANT))) {
                frac <<= 1;
                e--;
            }
            frac &= (1u << MANT) - 1;
            bits = sign | (static_cast<uint32_t>(e + 127) << 23) | (frac << (23 - MANT));
        }
    } else {
        bits = sign | (static_cast<uint32_t>(exp - bias + 127) << 23) | (frac << (23 - MANT));
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
}  // namespace ember_emu

struct alignas(2) __half {
    uint16_t x;
};
struct alignas(2) __nv_bfloat16 {
    uint16_t x;
};

inline __half __double2half(double d) { return __half{ember_emu::round_from_double<5, 10>(d)}; }
inline __half __float2half(float f) { return __double2half(static_cast<double>(f)); }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return ember_emu::widen<5, 10>(h.x); }
inline __nv_bfloat16 __double2bfloat16(double d) {
    return __nv_bfloat16{ember_emu::round_from_double<8, 7>(d)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __double2bfloat16(static_cast<double>(f)); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return ember_emu::widen<8, 7>(h.x); }
inline __half atomicAdd(__half* address, __half value) {
    return atomic_add_16<__half, __half2float, __float2half_rn>(address, value);
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* address, __nv_bfloat16 value) {
    return atomic_add_16<__nv_bfloat16, __bfloat162float, __float2bfloat16_rn>(address, value);
}
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }

// ---- math intrinsics ------------------------------------------------------------------------
// The _rn forms exist so that kernels can forbid nvcc's multiply-add contraction where a
// result must match the CPU bit for bit; g++ in ISO C++ mode never contracts (and
// crates/ember-kernels/build.rs passes -ffp-contract=off besides). Division and square root
// are correctly rounded in both (IEEE-754 on x86-64's SSE2, nvcc's default -prec-div/-prec-sqrt).
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double x) { return std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float_as_int(float f) {
    int x;
    std::memcpy(&x, &f, 4);
    return x;
}
inline long long __double_as_longlong(double d) {
    long long x;
    std::memcpy(&x, &d, 8);
    return x;
}
inline double __longlong_as_double(long long x) {
    double d;
    std::memcpy(&d, &x, 8);
    return d;
}
template <typename T>
T __ldg(const T* p) {
    return *p;
}
