// 2-D max and average pooling, element for element as the CPU backend
// (crates/ember-tensor/src/cpu/pool.rs, which follows PyTorch's CPU kernels).
//
//   max_pool2d_{T}(i64 n, i64 channels, i64 in_h, i64 in_w, i64 out_h, i64 out_w,
//                  const T* x, i64 x_sn, i64 x_sc, i64 x_sh, i64 x_sw,
//                  i64 kernel_h, i64 kernel_w, i64 stride_h, i64 stride_w,
//                  i64 pad_h, i64 pad_w, i64 dil_h, i64 dil_w, T* out, i64* indices)
//   avg_pool2d_{T}(i64 n, i64 channels, i64 in_h, i64 in_w, i64 out_h, i64 out_w,
//                  const T* x, i64 x_sn, i64 x_sc, i64 x_sh, i64 x_sw,
//                  i64 kernel_h, i64 kernel_w, i64 stride_h, i64 stride_w,
//                  i64 pad_h, i64 pad_w, i64 count_include_pad, i64 divisor_override, T* out)
//       T = f32 f64 f16 bf16 (the dtypes the CPU pools; 8 kernels). Any 1-D grid and block:
//       one thread per output element, grid-stride.
//
// x is [N, C, H, W], strided: element (s, c, h, w) at x[s*x_sn + c*x_sc + h*x_sh + w*x_sw]
// (the pointer at x's first element). out (and indices) are contiguous [N, C, out_h,
// out_w]; n = N * C * out_h * out_w, channels = C, in_h/in_w = H/W. The geometry is
// Pool2dParams' (kernel, stride, pad, dilation, out = the output size with ceil_mode
// already applied), trusted as the front checked it (kernel, stride, dilation >= 1, pad at
// most half the kernel).
//
// max_pool2d: the window starts at oy*stride_h - pad_h and ends (exclusive) at
// min(start + (kernel_h-1)*dil_h + 1, H); a negative start steps up by dil_h until >= 0 (the
// same along w). Scanning rows then columns, an element replaces the best when it is
// greater (strict, so the first of equal maxima wins and +0/-0 keep the first) or NaN (so the
// last NaN of the window wins, and a NaN is never replaced by a number). The best starts at
// -inf with index start_h*W + start_w (so an all -inf window gives -inf and its first
// position). out gets the winning element's value as stored (bits preserved, NaN payloads
// included), indices its flat position h*W + w within its input plane (PyTorch's).
// Comparisons in f32 for f16/bf16 (exact), in T otherwise.
//
// avg_pool2d: the window [start, start + kernel) is clipped to [-pad, H + pad) for the
// count_include_pad size, then to [0, H) for the sum (an empty clipped window gives 0). The
// sum is accumulated in f64 in the CPU's order (rows, then columns) for every T, divided in
// f64 by divisor_override if nonzero, else by the padded window size if count_include_pad is
// nonzero (AvgDivisor::IncludePad), else by the number of input elements summed
// (ExcludePad), and rounded once into T as the CPU's from_f64 (ember::from_f64, f16 through
// f32): bit-identical to the CPU.
#include "ember.cuh"

namespace ember {

__device__ __forceinline__ double pool_wide(float v) { return v; }
__device__ __forceinline__ double pool_wide(double v) { return v; }
__device__ __forceinline__ double pool_wide(f16 v) { return to_f32(v); }
__device__ __forceinline__ double pool_wide(bf16 v) { return to_f32(v); }

template <typename T>
__device__ __forceinline__ T pool_out(double v) {
    return from_f64<T>(v);
}
template <>
__device__ __forceinline__ double pool_out<double>(double v) {
    return v;
}

__device__ __forceinline__ i64 pool_min(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 pool_max(i64 a, i64 b) { return a > b ? a : b; }

// The first index >= start reachable from `start` in steps of `step` (start may be negative).
__device__ __forceinline__ i64 pool_first_nonneg(i64 start, i64 step) {
    return start >= 0 ? start : start + ((-start + step - 1) / step) * step;
}

template <typename T>
__device__ __forceinline__ void max_pool2d(i64 n, i64 channels, i64 in_h, i64 in_w, i64 out_h, i64 out_w,
                                           const T* __restrict__ x, i64 x_sn, i64 x_sc, i64 x_sh, i64 x_sw,
                                           i64 kernel_h, i64 kernel_w, i64 stride_h, i64 stride_w, i64 pad_h,
                                           i64 pad_w, i64 dil_h, i64 dil_w, T* __restrict__ out,
                                           i64* __restrict__ indices) {
    using W = typename Widen<T>::type;
    for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
        const i64 t = o / out_w, ox = o - t * out_w;
        const i64 plane = t / out_h, oy = t - plane * out_h;
        const i64 s = plane / channels, c = plane - s * channels;
        const T* base = x + s * x_sn + c * x_sc;
        i64 h0 = oy * stride_h - pad_h;
        const i64 h1 = pool_min(h0 + (kernel_h - 1) * dil_h + 1, in_h);
        h0 = pool_first_nonneg(h0, dil_h);
        i64 w0 = ox * stride_w - pad_w;
        const i64 w1 = pool_min(w0 + (kernel_w - 1) * dil_w + 1, in_w);
        w0 = pool_first_nonneg(w0, dil_w);
        T best_raw = Widen<T>::out(-static_cast<W>(INFINITY));
        W best = -static_cast<W>(INFINITY);
        i64 arg = h0 * in_w + w0;
        for (i64 iy = h0; iy < h1; iy += dil_h) {
            for (i64 ix = w0; ix < w1; ix += dil_w) {
                const T raw = base[iy * x_sh + ix * x_sw];
                const W v = Widen<T>::in(raw);
                if (v > best || v != v) {
                    best = v;
                    best_raw = raw;
                    arg = iy * in_w + ix;
                }
            }
        }
        out[o] = best_raw;
        indices[o] = arg;
    }
}

template <typename T>
__device__ __forceinline__ void avg_pool2d(i64 n, i64 channels, i64 in_h, i64 in_w, i64 out_h, i64 out_w,
                                           const T* __restrict__ x, i64 x_sn, i64 x_sc, i64 x_sh, i64 x_sw,
                                           i64 kernel_h, i64 kernel_w, i64 stride_h, i64 stride_w, i64 pad_h,
                                           i64 pad_w, i64 count_include_pad, i64 divisor_override,
                                           T* __restrict__ out) {
    for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
        const i64 t = o / out_w, ox = o - t * out_w;
        const i64 plane = t / out_h, oy = t - plane * out_h;
        const i64 s = plane / channels, c = plane - s * channels;
        const T* base = x + s * x_sn + c * x_sc;
        const i64 h0 = oy * stride_h - pad_h;
        const i64 h1 = pool_min(h0 + kernel_h, in_h + pad_h);
        const i64 w0 = ox * stride_w - pad_w;
        const i64 w1 = pool_min(w0 + kernel_w, in_w + pad_w);
        const i64 pool_size = (h1 - h0) * (w1 - w0);
        const i64 a0 = pool_max(h0, 0), a1 = pool_min(h1, in_h);
        const i64 b0 = pool_max(w0, 0), b1 = pool_min(w1, in_w);
        if (a0 >= a1 || b0 >= b1) {
            out[o] = pool_out<T>(0.0);
            continue;
        }
        double sum = 0.0;
        for (i64 iy = a0; iy < a1; iy++) {
            for (i64 ix = b0; ix < b1; ix++) sum = __dadd_rn(sum, pool_wide(base[iy * x_sh + ix * x_sw]));
        }
        const i64 div = divisor_override != 0 ? divisor_override
                        : count_include_pad != 0 ? pool_size
                                                 : (a1 - a0) * (b1 - b0);
        out[o] = pool_out<T>(sum / static_cast<double>(div));
    }
}

}  // namespace ember

#define EMBER_POOL(SUFFIX, T)                                                                      \
    extern "C" __global__ void max_pool2d_##SUFFIX(                                                \
        ember::i64 n, ember::i64 channels, ember::i64 in_h, ember::i64 in_w, ember::i64 out_h, ember::i64 out_w, \
        const T* x, ember::i64 x_sn, ember::i64 x_sc, ember::i64 x_sh, ember::i64 x_sw, ember::i64 kernel_h, \
        ember::i64 kernel_w, ember::i64 stride_h, ember::i64 stride_w, ember::i64 pad_h, ember::i64 pad_w, \
        ember::i64 dil_h, ember::i64 dil_w, T* out, ember::i64* indices) {                         \
        ember::max_pool2d<T>(n, channels, in_h, in_w, out_h, out_w, x, x_sn, x_sc, x_sh, x_sw, kernel_h, kernel_w, \
                             stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, out, indices);         \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(max_pool2d_##SUFFIX)                                                     \
    extern "C" __global__ void avg_pool2d_##SUFFIX(                                                \
        ember::i64 n, ember::i64 channels, ember::i64 in_h, ember::i64 in_w, ember::i64 out_h, ember::i64 out_w, \
        const T* x, ember::i64 x_sn, ember::i64 x_sc, ember::i64 x_sh, ember::i64 x_sw, ember::i64 kernel_h, \
        ember::i64 kernel_w, ember::i64 stride_h, ember::i64 stride_w, ember::i64 pad_h, ember::i64 pad_w, \
        ember::i64 count_include_pad, ember::i64 divisor_override, T* out) {                       \
        ember::avg_pool2d<T>(n, channels, in_h, in_w, out_h, out_w, x, x_sn, x_sc, x_sh, x_sw, kernel_h, kernel_w, \
                             stride_h, stride_w, pad_h, pad_w, count_include_pad, divisor_override, out); \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(avg_pool2d_##SUFFIX)

EMBER_POOL(f32, float)
EMBER_POOL(f64, double)
EMBER_POOL(f16, ember::f16)
EMBER_POOL(bf16, ember::bf16)
