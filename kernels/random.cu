// Random tensors from Philox4x32-10, bit-identical to the CPU generator
// (crates/ember-tensor/src/random/philox.rs, Note [Random streams]; the samplers and their
// output conversions are those of crates/ember-tensor/src/random/create.rs).
//
//   philox_uniform_{f32,f64,f16,bf16}(T* out, i64 n, u32 key0, u32 key1, u64 base,
//                                     double low, double high)
//       uniform in [low, high): rand is low = 0, high = 1. f32/f16/bf16 take K = 4 outputs
//       per counter (unit(w, b), b = 24, 11, 8 bits), f64 K = 2 (53 bits from two words).
//   philox_normal_{f32,f64,f16,bf16}(T* out, i64 n, u32 key0, u32 key1, u64 base,
//                                    double mean, double stddev)
//       mean + stddev * z, z from Box–Muller: f32/f16/bf16 K = 4 (24-bit integers), f64 K = 2
//       (53-bit integers). randn is mean = 0, stddev = 1.
//   philox_randint_{f32,f64,f16,bf16,i64,i32,u8,bool}(T* out, i64 n, u32 key0, u32 key1,
//                                                      u64 base, i64 low, u64 range)
//       low + (w mod range) (64-bit wrapping add), converted as the CPU's T::from_i64;
//       range = high - low as an unsigned count (>= 1; 0 is taken as 1). K = 4 when
//       range <= 2^32 (one word per sample), K = 2 otherwise (two words per sample).
//   philox_bernoulli_{f32,f64,f16,bf16,i64,i32,u8,bool}(T* out, i64 n, u32 key0, u32 key1,
//                                                       u64 base, double p)
//       1 if unit(w, 24) < p else 0, K = 4. bernoulli_mask is p; dropout_mask is p = 1 - drop.
//
// Types: u32 = unsigned int, u64 = unsigned long long, i64 = long long, double = f64 (push
// exactly these widths: key0/key1 as u32, base and range as u64, low as i64).
// Parameters: `out` is contiguous with n elements (n >= 0; n = 0 writes nothing). The key is
// the generator's seed, key0 = seed's low 32 bits, key1 = its high 32 bits
// (philox::key_of); `base` is the first counter the op reserved
// (Generator::reserve(counters) returns (key, base)). The host reserves
// counters = ceil(n / K) with the K given above (philox::counters::<Sampler>(n): Uniform32,
// Uniform64, Normal32, Normal64, RandInt32 when range <= 2^32 else RandInt64, Bernoulli), so
// that the next op starts past them. Element i is output i % K of counter base + i / K (64-bit
// wrapping add), a pure function of (key, base, i): the same seed and offset give the same
// bits as Tensor::rand/randn/randint/bernoulli_mask/dropout_mask on the CPU.
//
// Geometry: each thread computes whole counters in a grid-stride loop over the ceil(n / K)
// counters, so any 1-D grid and block works; one thread per counter
// (ember_kernels::launch_config_1d(ceil(n / K))) is the natural launch. Outputs of a full
// counter are stored as one K * sizeof(T)-byte vector (two 16-byte stores for 32 bytes) when
// `out` is aligned to min(K * sizeof(T), 16) bytes.
//
// Bit-for-bit agreement: only integer arithmetic and correctly rounded f64 + - * / sqrt, in
// the CPU's order, with no multiply-add contraction (every f64 operation is an explicit _rn
// intrinsic); ln and sin/cos are the CPU's own series (ln_unit, sincos_turns), never CUDA's
// libm; the f64 result is converted to T at the end exactly as create.rs does (f32: nearest
// even; f16: through f32, half's from_f64 on x86-64 with F16C; bf16: nearest even on the
// double's high word, half's bf16::from_f64 — both ember::from_f64; integer samples into
// T as WithDType::from_i64: floats through f32 for f16/bf16, integers wrapping, bool != 0).
#include "philox.cuh"

namespace ember {

// ---- unit uniforms --------------------------------------------------------------------------

// 2^-bits, exact (1 <= bits <= 1022).
__device__ __forceinline__ double philox_pow2_neg(int bits) {
    return __longlong_as_double(static_cast<long long>(1023 - bits) << 52);
}

// (w >> (32 - bits)) * 2^-bits: exact.
__device__ __forceinline__ double philox_unit(u32 w, int bits) {
    return __dmul_rn(static_cast<double>(w >> (32 - bits)), philox_pow2_neg(bits));
}

__device__ __forceinline__ u64 philox_bits53(u32 a, u32 b) {
    return (static_cast<u64>(a >> 5) << 26) | static_cast<u64>(b >> 6);
}

__device__ __forceinline__ double philox_unit53(u32 a, u32 b) {
    return __dmul_rn(static_cast<double>(philox_bits53(a, b)), philox_pow2_neg(53));
}

// The largest double below x (finite x), philox.rs' prev_f64.
__device__ __forceinline__ double philox_prev(double x) {
    const long long bits = __double_as_longlong(x);
    if (x > 0.0) return __longlong_as_double(bits - 1);
    if (x == 0.0) return -__longlong_as_double(1);
    return __longlong_as_double(bits + 1);
}

// Rust's f64::max: the other operand when one is NaN.
__device__ __forceinline__ double philox_max(double a, double b) {
    if (a != a) return b;
    if (b != b) return a;
    return a > b ? a : b;
}

// low + u (high - low), kept below high (philox.rs' scale).
__device__ __forceinline__ double philox_scale(double u, double low, double high) {
    const double v = __dadd_rn(low, __dmul_rn(u, __dsub_rn(high, low)));
    return v < high ? v : philox_max(low, philox_prev(high));
}

// ---- ln and sin/cos from basic operations (philox.rs' ln_unit, sincos_turns) ------------------

// ln x for a normal, positive, finite x: x = m 2^e, m in [sqrt(1/2), sqrt(2)),
// ln m = 2 atanh(s), s = (m - 1) / (m + 1), odd series to s^25. The coefficients are the f64
// nearest to 1/(2k+1), as philox.rs computes them.
__device__ __forceinline__ double philox_ln(double x) {
    const double LN2 = 0x1.62e42fefa39efp-1;    // std::f64::consts::LN_2
    const double SQRT2 = 0x1.6a09e667f3bcdp+0;  // std::f64::consts::SQRT_2
    const long long bits = __double_as_longlong(x);
    long long e = ((bits >> 52) & 0x7ff) - 1023;
    double m = __longlong_as_double((bits & 0x000fffffffffffffll) | 0x3ff0000000000000ll);
    if (m > SQRT2) {
        m = __dmul_rn(m, 0.5);
        e += 1;
    }
    const double s = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0));
    const double s2 = __dmul_rn(s, s);
    double p = 0x1.47ae147ae147bp-5;                       // 1/25
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.642c8590b2164p-5);  // 1/23
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.8618618618618p-5);  // 1/21
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.af286bca1af28p-5);  // 1/19
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.e1e1e1e1e1e1ep-5);  // 1/17
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.1111111111111p-4);  // 1/15
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.3b13b13b13b14p-4);  // 1/13
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.745d1745d1746p-4);  // 1/11
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.c71c71c71c71cp-4);  // 1/9
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.2492492492492p-3);  // 1/7
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.999999999999ap-3);  // 1/5
    p = __dadd_rn(__dmul_rn(p, s2), 0x1.5555555555555p-2);  // 1/3
    const double t = __dmul_rn(2.0, s);
    return __dadd_rn(__dmul_rn(static_cast<double>(e), LN2), __dadd_rn(t, __dmul_rn(t, __dmul_rn(s2, p))));
}

// (sin, cos) of 2π k / 2^bits, 0 <= k < 2^bits: the quadrant split off in integers, the rest
// (|x| <= π/4) through Taylor polynomials of degree 19 and 18. Coefficients: the f64 nearest
// to ±1/(2n+1)! and ±1/(2n)!, as philox.rs computes them.
__device__ __forceinline__ void philox_sincos_turns(u64 k, int bits, double* sin_out, double* cos_out) {
    const double TAU = 0x1.921fb54442d18p+2;  // std::f64::consts::TAU
    const u64 quarter = 1ull << (bits - 2);
    const u64 q = ((k >> (bits - 3)) + 1) >> 1;
    const i64 r = static_cast<i64>(k) - static_cast<i64>(q * quarter);
    const double x = __dmul_rn(static_cast<double>(r), __dmul_rn(TAU, philox_pow2_neg(bits)));
    const double x2 = __dmul_rn(x, x);
    double ps = 0.0, pc = 0.0;
#define EMBER_PHILOX_STEP(S, C)                                                                    \
    ps = __dadd_rn(__dmul_rn(ps, x2), S);                                                          \
    pc = __dadd_rn(__dmul_rn(pc, x2), C);
    EMBER_PHILOX_STEP(-0x1.2f49b46814157p-57, -0x1.6827863b97d97p-53)  // n = 9: -1/19!, -1/18!
    EMBER_PHILOX_STEP(0x1.952c77030ad4ap-49, 0x1.ae7f3e733b81fp-45)    // n = 8
    EMBER_PHILOX_STEP(-0x1.ae7f3e733b81fp-41, -0x1.93974a8c07c9dp-37)  // n = 7
    EMBER_PHILOX_STEP(0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29)    // n = 6
    EMBER_PHILOX_STEP(-0x1.ae64567f544e4p-26, -0x1.27e4fb7789f5cp-22)  // n = 5
    EMBER_PHILOX_STEP(0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16)    // n = 4
    EMBER_PHILOX_STEP(-0x1.a01a01a01a01ap-13, -0x1.6c16c16c16c17p-10)  // n = 3
    EMBER_PHILOX_STEP(0x1.1111111111111p-7, 0x1.5555555555555p-5)      // n = 2
    EMBER_PHILOX_STEP(-0x1.5555555555555p-3, -0x1.0000000000000p-1)    // n = 1: -1/3!, -1/2!
#undef EMBER_PHILOX_STEP
    const double s = __dadd_rn(x, __dmul_rn(x, __dmul_rn(x2, ps)));
    const double c = __dadd_rn(1.0, __dmul_rn(x2, pc));
    switch (q & 3) {
        case 0: *sin_out = s; *cos_out = c; break;
        case 1: *sin_out = c; *cos_out = -s; break;
        case 2: *sin_out = -s; *cos_out = -c; break;
        default: *sin_out = -c; *cos_out = s; break;
    }
}

// Box–Muller on two `bits`-bit integers: u1 = 1 - k1 2^-bits in (0, 1], r = sqrt(-2 ln u1),
// θ = 2π k2 2^-bits; (z0, z1) = (r cos θ, r sin θ).
__device__ __forceinline__ void philox_box_muller(u64 k1, u64 k2, int bits, double* z0, double* z1) {
    const double u1 = __dsub_rn(1.0, __dmul_rn(static_cast<double>(k1), philox_pow2_neg(bits)));
    const double r = __dsqrt_rn(__dmul_rn(-2.0, philox_ln(u1)));
    double s, c;
    philox_sincos_turns(k2, bits, &s, &c);
    *z0 = __dmul_rn(r, c);
    *z1 = __dmul_rn(r, s);
}

// ---- output conversions ---------------------------------------------------------------------

// The CPU's WithDType::from_i64: one rounding into f32/f64, through f32 into f16/bf16,
// wrapping into integers, != 0 into bool.
template <typename T>
__device__ __forceinline__ T philox_from_i64(i64 v) {
    return static_cast<T>(static_cast<u64>(v));  // i64, i32, u8: wrapping
}
template <>
__device__ __forceinline__ i64 philox_from_i64<i64>(i64 v) { return v; }
template <>
__device__ __forceinline__ float philox_from_i64<float>(i64 v) { return static_cast<float>(v); }
template <>
__device__ __forceinline__ double philox_from_i64<double>(i64 v) { return static_cast<double>(v); }
template <>
__device__ __forceinline__ f16 philox_from_i64<f16>(i64 v) { return from_f32<f16>(static_cast<float>(v)); }
template <>
__device__ __forceinline__ bf16 philox_from_i64<bf16>(i64 v) { return from_f32<bf16>(static_cast<float>(v)); }
template <>
__device__ __forceinline__ bool philox_from_i64<bool>(i64 v) { return v != 0; }

// create.rs' conversion of an f64 sample: `v as f32`, f64 itself, half's from_f64 for f16/bf16.
template <typename T>
__device__ __forceinline__ T philox_from_f64(double v) { return from_f64<T>(v); }
template <>
__device__ __forceinline__ double philox_from_f64<double>(double v) { return v; }

// ---- the samplers: K outputs of one counter's words ------------------------------------------

template <typename T, int BITS>
struct PhiloxUniform32 {
    static constexpr int K = 4;
    double low, high;
    __device__ __forceinline__ T one(u32 w) const { return philox_from_f64<T>(philox_scale(philox_unit(w, BITS), low, high)); }
    __device__ __forceinline__ void operator()(const PhiloxWords& w, T* v) const {
        v[0] = one(w.w0);
        v[1] = one(w.w1);
        v[2] = one(w.w2);
        v[3] = one(w.w3);
    }
};

struct PhiloxUniform64 {
    static constexpr int K = 2;
    double low, high;
    __device__ __forceinline__ void operator()(const PhiloxWords& w, double* v) const {
        v[0] = philox_scale(philox_unit53(w.w0, w.w1), low, high);
        v[1] = philox_scale(philox_unit53(w.w2, w.w3), low, high);
    }
};

template <typename T>
struct PhiloxNormal32 {
    static constexpr int K = 4;
    double mean, stddev;
    __device__ __forceinline__ T one(double z) const { return philox_from_f64<T>(__dadd_rn(mean, __dmul_rn(stddev, z))); }
    __device__ __forceinline__ void operator()(const PhiloxWords& w, T* v) const {
        double z0, z1, z2, z3;
        philox_box_muller(w.w0 >> 8, w.w1 >> 8, 24, &z0, &z1);
        philox_box_muller(w.w2 >> 8, w.w3 >> 8, 24, &z2, &z3);
        v[0] = one(z0);
        v[1] = one(z1);
        v[2] = one(z2);
        v[3] = one(z3);
    }
};

struct PhiloxNormal64 {
    static constexpr int K = 2;
    double mean, stddev;
    __device__ __forceinline__ void operator()(const PhiloxWords& w, double* v) const {
        double z0, z1;
        philox_box_muller(philox_bits53(w.w0, w.w1), philox_bits53(w.w2, w.w3), 53, &z0, &z1);
        v[0] = __dadd_rn(mean, __dmul_rn(stddev, z0));
        v[1] = __dadd_rn(mean, __dmul_rn(stddev, z1));
    }
};

template <typename T>
struct PhiloxRandInt32 {
    static constexpr int K = 4;
    i64 low;
    u64 range;
    __device__ __forceinline__ T one(u32 w) const {
        return philox_from_i64<T>(static_cast<i64>(static_cast<u64>(low) + static_cast<u64>(w) % range));
    }
    __device__ __forceinline__ void operator()(const PhiloxWords& w, T* v) const {
        v[0] = one(w.w0);
        v[1] = one(w.w1);
        v[2] = one(w.w2);
        v[3] = one(w.w3);
    }
};

template <typename T>
struct PhiloxRandInt64 {
    static constexpr int K = 2;
    i64 low;
    u64 range;
    __device__ __forceinline__ T one(u32 a, u32 b) const {
        const u64 x = (static_cast<u64>(a) << 32) | static_cast<u64>(b);
        return philox_from_i64<T>(static_cast<i64>(static_cast<u64>(low) + x % range));
    }
    __device__ __forceinline__ void operator()(const PhiloxWords& w, T* v) const {
        v[0] = one(w.w0, w.w1);
        v[1] = one(w.w2, w.w3);
    }
};

template <typename T>
struct PhiloxBernoulli {
    static constexpr int K = 4;
    double p;
    __device__ __forceinline__ T one(u32 w) const { return philox_from_i64<T>(philox_unit(w, 24) < p ? 1 : 0); }
    __device__ __forceinline__ void operator()(const PhiloxWords& w, T* v) const {
        v[0] = one(w.w0);
        v[1] = one(w.w1);
        v[2] = one(w.w2);
        v[3] = one(w.w3);
    }
};

// ---- the fill loop --------------------------------------------------------------------------

// BYTES bytes stored at once: one store instruction for a full counter's outputs (two for the
// 32 bytes of 4 x 8-byte integers), aligned to min(BYTES, 16).
template <int BYTES>
struct PhiloxVec;
template <>
struct PhiloxVec<2> { using type = unsigned short; };
template <>
struct PhiloxVec<4> { using type = unsigned int; };
template <>
struct PhiloxVec<8> { using type = uint2; };
template <>
struct PhiloxVec<16> { using type = uint4; };
struct PhiloxUint4x2 {
    uint4 lo, hi;
};
template <>
struct PhiloxVec<32> { using type = PhiloxUint4x2; };  // two 16-byte stores

// Counter c of the grid-stride loop writes elements c*K .. c*K+K-1 (those below n).
template <typename T, typename S>
__device__ void philox_fill(T* out, i64 n, u32 key0, u32 key1, u64 base, S sampler) {
    constexpr int K = S::K;
    constexpr int BYTES = K * static_cast<int>(sizeof(T));
    using V = typename PhiloxVec<BYTES>::type;
    union Pack {
        V raw;
        T v[K];
    };
    const i64 counters = n / K + (n % K != 0 ? 1 : 0);
    const i64 full = n / K;
    constexpr int ALIGN = BYTES < 16 ? BYTES : 16;
    const bool vector = (reinterpret_cast<uintptr_t>(out) % ALIGN) == 0;
    for (i64 c = global_thread_id(); c < counters; c += grid_stride()) {
        const PhiloxWords w = philox_block(key0, key1, base, static_cast<u64>(c));
        Pack pack;
        sampler(w, pack.v);
        if (vector && c < full) {
            reinterpret_cast<V*>(out)[c] = pack.raw;
        } else {
#pragma unroll
            for (int j = 0; j < K; ++j) {
                if (c * K + j < n) out[c * K + j] = pack.v[j];
            }
        }
    }
}

}  // namespace ember

#define EMBER_PHILOX_ARGS ember::i64 n, unsigned key0, unsigned key1, ember::u64 base

#define EMBER_PHILOX_UNIFORM32(SUFFIX, T, BITS)                                                    \
    extern "C" __global__ void philox_uniform_##SUFFIX(T* out, EMBER_PHILOX_ARGS, double low, double high) { \
        ember::philox_fill<T>(out, n, key0, key1, base, ember::PhiloxUniform32<T, BITS>{low, high}); \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(philox_uniform_##SUFFIX)

#define EMBER_PHILOX_NORMAL32(SUFFIX, T)                                                           \
    extern "C" __global__ void philox_normal_##SUFFIX(T* out, EMBER_PHILOX_ARGS, double mean, double stddev) { \
        ember::philox_fill<T>(out, n, key0, key1, base, ember::PhiloxNormal32<T>{mean, stddev});      \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(philox_normal_##SUFFIX)

// One kernel per dtype for both integer samplers; the choice depends only on `range`, so it is
// uniform across the grid.
#define EMBER_PHILOX_RANDINT(SUFFIX, T)                                                            \
    extern "C" __global__ void philox_randint_##SUFFIX(T* out, EMBER_PHILOX_ARGS, ember::i64 low,  \
                                                       ember::u64 range) {                          \
        const ember::u64 r = range == 0 ? 1 : range;                                               \
        if (r <= (1ull << 32)) {                                                                   \
            ember::philox_fill<T>(out, n, key0, key1, base, ember::PhiloxRandInt32<T>{low, r});    \
        } else {                                                                                   \
            ember::philox_fill<T>(out, n, key0, key1, base, ember::PhiloxRandInt64<T>{low, r});    \
        }                                                                                          \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(philox_randint_##SUFFIX)

#define EMBER_PHILOX_BERNOULLI(SUFFIX, T)                                                          \
    extern "C" __global__ void philox_bernoulli_##SUFFIX(T* out, EMBER_PHILOX_ARGS, double p) {    \
        ember::philox_fill<T>(out, n, key0, key1, base, ember::PhiloxBernoulli<T>{p});             \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(philox_bernoulli_##SUFFIX)

EMBER_PHILOX_UNIFORM32(f32, float, 24)
EMBER_PHILOX_UNIFORM32(f16, ember::f16, 11)
EMBER_PHILOX_UNIFORM32(bf16, ember::bf16, 8)

extern "C" __global__ void philox_uniform_f64(double* out, EMBER_PHILOX_ARGS, double low, double high) {
    ember::philox_fill<double>(out, n, key0, key1, base, ember::PhiloxUniform64{low, high});
}
EMBER_REGISTER_KERNEL(philox_uniform_f64)

EMBER_PHILOX_NORMAL32(f32, float)
EMBER_PHILOX_NORMAL32(f16, ember::f16)
EMBER_PHILOX_NORMAL32(bf16, ember::bf16)

extern "C" __global__ void philox_normal_f64(double* out, EMBER_PHILOX_ARGS, double mean, double stddev) {
    ember::philox_fill<double>(out, n, key0, key1, base, ember::PhiloxNormal64{mean, stddev});
}
EMBER_REGISTER_KERNEL(philox_normal_f64)

EMBER_PHILOX_RANDINT(f32, float)
EMBER_PHILOX_RANDINT(f64, double)
EMBER_PHILOX_RANDINT(f16, ember::f16)
EMBER_PHILOX_RANDINT(bf16, ember::bf16)
EMBER_PHILOX_RANDINT(i64, ember::i64)
EMBER_PHILOX_RANDINT(i32, ember::i32)
EMBER_PHILOX_RANDINT(u8, ember::u8)
EMBER_PHILOX_RANDINT(bool, bool)

EMBER_PHILOX_BERNOULLI(f32, float)
EMBER_PHILOX_BERNOULLI(f64, double)
EMBER_PHILOX_BERNOULLI(f16, ember::f16)
EMBER_PHILOX_BERNOULLI(bf16, ember::bf16)
EMBER_PHILOX_BERNOULLI(i64, ember::i64)
EMBER_PHILOX_BERNOULLI(i32, ember::i32)
EMBER_PHILOX_BERNOULLI(u8, ember::u8)
EMBER_PHILOX_BERNOULLI(bool, bool)
