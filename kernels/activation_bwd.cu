// Activation backward kernels: one pass where the composed form takes several.
//
//   threshold_backward_{dtype}(i64 n, StridedLayout lg, StridedLayout lx, const T* grad,
//                              const T* x, T threshold, T* out)
//       out[i] = x[i] <= threshold ? 0 : grad[i]    (f32 f64 f16 bf16 i64 i32 u8)
//
// PyTorch's `threshold_backward` (aten/src/ATen/native/cuda/Activation*.cu: `x <= threshold ?
// value : other` with value 0): ReLU's backward is threshold_backward(grad, relu(x), 0). A NaN
// in x compares false, so its gradient passes through, as in PyTorch. f16/bf16 compare in f32
// (exact: the threshold is converted to T by the host, as PyTorch's `threshold.to<scalar_t>()`).
//
// `out` is contiguous with n elements; lg and lx map the iteration (out's shape, row-major)
// onto grad and x, broadcasting by zero strides (see ember.cuh). When both inputs are
// contiguous: 32-bit indices when n < 2^31, 16-byte vector loads and stores (Pack16) when the
// three pointers are 16-byte aligned, scalar accesses for the tail. Any 1-D grid works.
//
// Bound: reads grad and x, writes out: 12 bytes per f32 element (6 for f16/bf16), no
// arithmetic beyond one compare; the composed `where(x > 0, grad, 0)` moves 9 (cmp) + 13
// (where) = 22 bytes per f32 element in two launches.
#include "ember.cuh"

namespace ember {

template <typename T>
__device__ __forceinline__ T threshold_bwd_one(T g, T x, typename Widen<T>::type th) {
    return Widen<T>::in(x) <= th ? Widen<T>::out(0) : g;
}

// The contiguous path over indices of type Idx (u32 when n fits).
template <typename Idx, typename T>
__device__ __forceinline__ void threshold_bwd_contiguous(Idx n, const T* __restrict__ g, const T* __restrict__ x,
                                                         typename Widen<T>::type th, T* __restrict__ out) {
    const Idx start = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x;
    const Idx stride = static_cast<Idx>(gridDim.x) * blockDim.x;
    Idx head = 0;
    if (aligned16(g) && aligned16(x) && aligned16(out)) {
        constexpr int N = Pack16<T>::N;
        const Idx vecs = n / N;
        const uint4* g16 = reinterpret_cast<const uint4*>(g);
        const uint4* x16 = reinterpret_cast<const uint4*>(x);
        uint4* out16 = reinterpret_cast<uint4*>(out);
        for (Idx i = start; i < vecs; i += stride) {
            Pack16<T> a, b, z;
            a.raw = g16[i];
            b.raw = x16[i];
#pragma unroll
            for (int k = 0; k < N; k++) z.v[k] = threshold_bwd_one<T>(a.v[k], b.v[k], th);
            out16[i] = z.raw;
        }
        head = vecs * N;
    }
    for (Idx i = head + start; i < n; i += stride) out[i] = threshold_bwd_one<T>(g[i], x[i], th);
}

template <typename T>
__device__ void threshold_bwd(i64 n, const StridedLayout& lg, const StridedLayout& lx, const T* g, const T* x,
                              T threshold, T* out) {
    const typename Widen<T>::type th = Widen<T>::in(threshold);
    if (lg.contiguous && lx.contiguous) {
        if (n < (i64(1) << 31)) {
            threshold_bwd_contiguous<u32, T>(static_cast<u32>(n), g, x, th, out);
        } else {
            threshold_bwd_contiguous<i64, T>(n, g, x, th, out);
        }
        return;
    }
    const i64 start = global_thread_id(), stride = grid_stride();
    for (i64 i = start; i < n; i += stride) {
        out[i] = threshold_bwd_one<T>(g[strided_offset(i, lg)], x[strided_offset(i, lx)], th);
    }
}

}  // namespace ember

#define EMBER_THRESHOLD_BWD(SUFFIX, T)                                                             \
    extern "C" __global__ void threshold_backward_##SUFFIX(ember::i64 n, ember::StridedLayout lg,  \
                                                           ember::StridedLayout lx, const T* grad, \
                                                           const T* x, T threshold, T* out) {      \
        ember::threshold_bwd<T>(n, lg, lx, grad, x, threshold, out);                               \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(threshold_backward_##SUFFIX)

EMBER_THRESHOLD_BWD(f32, float)
EMBER_THRESHOLD_BWD(f64, double)
EMBER_THRESHOLD_BWD(f16, ember::f16)
EMBER_THRESHOLD_BWD(bf16, ember::bf16)
EMBER_THRESHOLD_BWD(i64, ember::i64)
EMBER_THRESHOLD_BWD(i32, ember::i32)
EMBER_THRESHOLD_BWD(u8, ember::u8)
