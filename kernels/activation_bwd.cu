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
// onto grad and x, broadcasting by zero strides (see ember.cuh). The loops are ember.cuh's
// (Note [Elementwise loops]): contiguous inputs in groups of 16 bytes, four per thread per
// pass, 32-bit indices, scalars for the tail or when misaligned; strided inputs of rank <= 4
// with one 32-bit split of the index. Any 1-D grid works; the host launches
// `launch_config_elementwise`.
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

template <typename T>
__device__ void threshold_bwd(i64 n, const StridedLayout& lg, const StridedLayout& lx, const T* g, const T* x,
                              T threshold, T* out) {
    const typename Widen<T>::type th = Widen<T>::in(threshold);
    const auto f = [th](T gv, T xv) { return threshold_bwd_one<T>(gv, xv, th); };
    if (lg.contiguous && lx.contiguous) {
        map_contiguous(n, f, out, g, x);
    } else if (strided4_fits(n, lg, lx)) {
        const u32 stride = gridDim.x * blockDim.x;
        for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            const Digits4 q = digits4(i, lg);
            out[i] = f(g[offset4(q, lg)], x[offset4(q, lx)]);
        }
    } else {
        for (i64 i = global_thread_id(); i < n; i += grid_stride()) {
            out[i] = f(g[strided_offset(i, lg)], x[strided_offset(i, lx)]);
        }
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
