// Strided copies and clamp: the kernels that write through a view.
//
//   copy_{dtype}(i64 n, StridedLayout lin, StridedLayout lout, const T* in, T* out)
//       out[offset_out(i)] = in[offset_in(i)] for i < n
//   clamp_{dtype}(i64 n, StridedLayout lin, StridedLayout lout, const T* in, T* out,
//                 T lo, T hi, int has_lo, int has_hi)
//       out[offset_out(i)] = clamp(in[offset_in(i)]): NaN stays NaN, then max(x, lo) if
//       has_lo, then min(., hi) if has_hi (so lo > hi gives hi, as PyTorch)
//       every dtype f32 f64 f16 bf16 i64 i32 u8 bool
//
// Both layouts map the iteration (row-major over `sizes`, which the two share) onto their
// operand; the host adds each view's storage offset to the pointers. Unlike the other
// families the output may be strided, so these serve `copy_`, `fill_` of a view (the host
// fills a contiguous buffer and copies it) and in-place ops (compute into a contiguous
// buffer, copy back). `out` must not overlap itself (no zero strides on a dimension of size
// > 1: the host refuses to write into expanded views) and must not overlap `in` except
// element for element (in == out with the same layout, as an in-place clamp does). When both
// are contiguous the copy moves 16-byte vectors if the pointers are 16-byte aligned. f16 and
// bf16 compare in f32; lo and hi arrive already converted to T. Any 1-D grid works.
#include "ember.cuh"

namespace ember {

template <typename T>
__device__ void copy_strided(i64 n, const StridedLayout& lin, const StridedLayout& lout, const T* in, T* out) {
    const i64 start = global_thread_id(), stride = grid_stride();
    if (lin.contiguous && lout.contiguous) {
        i64 head = 0;
        if (aligned16(in) && aligned16(out)) {
            const i64 vecs = n / Pack16<T>::N;
            const uint4* in16 = reinterpret_cast<const uint4*>(in);
            uint4* out16 = reinterpret_cast<uint4*>(out);
            for (i64 i = start; i < vecs; i += stride) out16[i] = in16[i];
            head = vecs * Pack16<T>::N;
        }
        for (i64 i = head + start; i < n; i += stride) out[i] = in[i];
        return;
    }
    for (i64 i = start; i < n; i += stride) out[strided_offset(i, lout)] = in[strided_offset(i, lin)];
}

template <typename T>
__device__ __forceinline__ bool clamp_less(T a, T b) {
    return Widen<T>::in(a) < Widen<T>::in(b);
}

template <typename T>
__device__ void clamp_strided(i64 n, const StridedLayout& lin, const StridedLayout& lout, const T* in, T* out, T lo,
                              T hi, int has_lo, int has_hi) {
    for (i64 i = global_thread_id(); i < n; i += grid_stride()) {
        const T x = in[lin.contiguous ? i : strided_offset(i, lin)];
        T y = x;
        if (Widen<T>::in(x) == Widen<T>::in(x)) {  // NaN stays
            if (has_lo && clamp_less(y, lo)) y = lo;
            if (has_hi && clamp_less(hi, y)) y = hi;
        }
        out[lout.contiguous ? i : strided_offset(i, lout)] = y;
    }
}

}  // namespace ember

#define EMBER_COPY(SUFFIX, T)                                                                      \
    extern "C" __global__ void copy_##SUFFIX(ember::i64 n, ember::StridedLayout lin, ember::StridedLayout lout, \
                                             const T* in, T* out) {                                \
        ember::copy_strided<T>(n, lin, lout, in, out);                                             \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(copy_##SUFFIX)                                                           \
    extern "C" __global__ void clamp_##SUFFIX(ember::i64 n, ember::StridedLayout lin, ember::StridedLayout lout, \
                                              const T* in, T* out, T lo, T hi, int has_lo, int has_hi) { \
        ember::clamp_strided<T>(n, lin, lout, in, out, lo, hi, has_lo, has_hi);                    \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(clamp_##SUFFIX)

EMBER_COPY(f32, float)
EMBER_COPY(f64, double)
EMBER_COPY(f16, ember::f16)
EMBER_COPY(bf16, ember::bf16)
EMBER_COPY(i64, ember::i64)
EMBER_COPY(i32, ember::i32)
EMBER_COPY(u8, ember::u8)
EMBER_COPY(bool, bool)
