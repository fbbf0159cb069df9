// fill and arange: out[i] = value, out[i] = start + i * step. Contiguous outputs only.
//
//   ember_fill_{f32,f64,f16,bf16,i64,i32,u8,bool}(T* out, i64 n, T value)
//   ember_arange_{f32,f16,bf16}(T* out, i64 n, double start, double step)
//   ember_arange_i64(i64* out, i64 n, i64 start, i64 step)
//
// Any 1-D grid works (grid-stride loops). Float arange computes start + i * step in f64 with
// no multiply-add contraction and rounds once to T, exactly as the CPU backend does; i64
// arange wraps on overflow like the CPU backend.
#include "ember.cuh"

namespace ember {

template <typename T>
__device__ void fill(T* out, i64 n, T value) {
    const i64 start = global_thread_id(), stride = grid_stride();
    i64 head = 0;
    if (aligned16(out)) {
        // 16-byte stores for the bulk, scalar stores for the tail.
        Pack16<T> pack;
#pragma unroll
        for (int k = 0; k < Pack16<T>::N; k++) pack.v[k] = value;
        const i64 vecs = n / Pack16<T>::N;
        uint4* out16 = reinterpret_cast<uint4*>(out);
        for (i64 i = start; i < vecs; i += stride) out16[i] = pack.raw;
        head = vecs * Pack16<T>::N;
    }
    for (i64 i = head + start; i < n; i += stride) out[i] = value;
}

template <typename T>
__device__ void arange_float(T* out, i64 n, double start, double step) {
    for (i64 i = global_thread_id(); i < n; i += grid_stride()) {
        out[i] = from_f64<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
    }
}

__device__ void arange_int(i64* out, i64 n, i64 start, i64 step) {
    using u64 = unsigned long long;
    for (i64 i = global_thread_id(); i < n; i += grid_stride()) {
        out[i] = static_cast<i64>(static_cast<u64>(start) + static_cast<u64>(i) * static_cast<u64>(step));
    }
}

}  // namespace ember

#define EMBER_FILL(SUFFIX, T)                                                                      \
    extern "C" __global__ void ember_fill_##SUFFIX(T* out, ember::i64 n, T value) {                \
        ember::fill<T>(out, n, value);                                                             \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(ember_fill_##SUFFIX)

#define EMBER_ARANGE_FLOAT(SUFFIX, T)                                                              \
    extern "C" __global__ void ember_arange_##SUFFIX(T* out, ember::i64 n, double start, double step) { \
        ember::arange_float<T>(out, n, start, step);                                               \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(ember_arange_##SUFFIX)

EMBER_FILL(f32, float)
EMBER_FILL(f16, ember::f16)
EMBER_FILL(bf16, ember::bf16)
EMBER_FILL(f64, double)
EMBER_FILL(i64, ember::i64)
EMBER_FILL(i32, ember::i32)
EMBER_FILL(u8, ember::u8)
EMBER_FILL(bool, bool)

EMBER_ARANGE_FLOAT(f32, float)
EMBER_ARANGE_FLOAT(f16, ember::f16)
EMBER_ARANGE_FLOAT(bf16, ember::bf16)

extern "C" __global__ void ember_arange_i64(ember::i64* out, ember::i64 n, ember::i64 start, ember::i64 step) {
    ember::arange_int(out, n, start, step);
}
EMBER_REGISTER_KERNEL(ember_arange_i64)
