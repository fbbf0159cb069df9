// 2-D convolution as im2col + GEMM (crates/ember-tensor/src/cpu/conv.rs, Note [Conv2d as
// im2col + GEMM]): this file has the im2col; the product runs through the driver's GEMM
// (cuBLAS, or the emulator's CPU GEMM) and the bias through the existing strided copy.
//
//   im2col_{T}(i64 n, i64 channels, i64 in_h, i64 in_w, const T* x,
//              i64 x_sn, i64 x_sc, i64 x_sh, i64 x_sw,
//              i64 kernel_h, i64 kernel_w, i64 stride_h, i64 stride_w,
//              i64 pad_h, i64 pad_w, i64 dil_h, i64 dil_w, i64 out_h, i64 out_w, T* col)
//       T = f32 f64 f16 bf16 (4 kernels). Any 1-D grid and block: one thread per col
//       element, grid-stride.
//
// x is a chunk of `nc` samples of the [N, C, H, W] input, strided: element (s, c, h, w) at
// x[s*x_sn + c*x_sc + h*x_sh + w*x_sw], s < nc (the pointer at the chunk's first sample:
// the layout offset plus n0 * x_sn). col is contiguous [nc, C*kernel_h*kernel_w,
// out_h*out_w]: row (c, i, j) = (c*kernel_h + i)*kernel_w + j, column (oy, ox) = oy*out_w +
// ox holds x[s, c, oy*stride_h - pad_h + i*dil_h, ox*stride_w - pad_w + j*dil_w], 0 where
// that lies outside [0, H) x [0, W) (the zero padding). n = nc * C*kh*kw * out_h*out_w,
// channels = C. Groups do not change the col layout: group g's rows are the K =
// (C/groups)*kh*kw rows starting at g*K. The values are copied unchanged (f16/bf16 stay
// 16-bit: the GEMM computes in f32).
//
// The host's conv2d (x [N, C, H, W], weight [O, C/groups, kh, kw], bias [O] or none, out
// [N, O, out_h, out_w] contiguous, Og = O/groups, K = (C/groups)*kh*kw, L = out_h*out_w):
//   1. bias: out[s, o, l] = bias[o] with cast_{T}_{T}(N*O*L, StridedLayout{sizes [N, O, L],
//      strides [0, bias_stride, 0]}, bias, out) (the strided copy with a broadcast layout);
//      then beta = 1 below. Without bias: beta = 0 (cuBLAS then does not read out).
//   2. weight contiguous as [O, K] (cast_{T}_{T} into a scratch buffer if it is not).
//   3. per chunk of nc samples starting at n0 (col has nc*C*kh*kw*L elements; the CPU keeps
//      it under 16M elements): im2col_{T} into col, then per group g < groups one
//      Driver::gemm (column-major, cuBLAS's convention) computing, for each sample,
//      out[s, g*Og.., :] (+)= W[g*Og.., :] · col[s][g*K.., :]:
//        GemmDesc { trans_a: false, trans_b: false, m: L, n: Og, k: K, alpha: 1, beta,
//                   a: col + g*K*L, lda: L, stride_a: C*kh*kw*L,
//                   b: weight + g*Og*K, ldb: K, stride_b: 0,
//                   c: out + (n0*O + g*Og)*L, ldc: L, stride_c: O*L,
//                   batch: nc, dtype: T }
//      (offsets in elements; stride_b 0 reuses the weight for every sample). Skip the GEMMs
//      when K, L, Og or N is 0 (out is then the bias, or zeros: memset it when there is no
//      bias). f16/bf16 accumulate in f32 inside cuBLAS (CUBLAS_COMPUTE_32F) and round once
//      into out, as the CPU computes in f32 and rounds once; only the summation order
//      differs (and TF32 if allow_tf32 is set for f32).
#include "ember.cuh"

namespace ember {

template <typename T>
__device__ __forceinline__ void im2col(i64 n, i64 channels, i64 in_h, i64 in_w, const T* __restrict__ x, i64 x_sn,
                                       i64 x_sc, i64 x_sh, i64 x_sw, i64 kernel_h, i64 kernel_w, i64 stride_h,
                                       i64 stride_w, i64 pad_h, i64 pad_w, i64 dil_h, i64 dil_w, i64 out_h,
                                       i64 out_w, T* __restrict__ col) {
    for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
        i64 t = o / out_w;
        const i64 ox = o - t * out_w;
        i64 u = t / out_h;
        const i64 oy = t - u * out_h;
        t = u / kernel_w;
        const i64 j = u - t * kernel_w;
        u = t / kernel_h;
        const i64 i = t - u * kernel_h;
        const i64 s = u / channels, c = u - s * channels;
        const i64 iy = oy * stride_h - pad_h + i * dil_h;
        const i64 ix = ox * stride_w - pad_w + j * dil_w;
        T v{};
        if (iy >= 0 && iy < in_h && ix >= 0 && ix < in_w) v = x[s * x_sn + c * x_sc + iy * x_sh + ix * x_sw];
        col[o] = v;
    }
}

}  // namespace ember

#define EMBER_IM2COL(SUFFIX, T)                                                                    \
    extern "C" __global__ void im2col_##SUFFIX(                                                    \
        ember::i64 n, ember::i64 channels, ember::i64 in_h, ember::i64 in_w, const T* x, ember::i64 x_sn, \
        ember::i64 x_sc, ember::i64 x_sh, ember::i64 x_sw, ember::i64 kernel_h, ember::i64 kernel_w, \
        ember::i64 stride_h, ember::i64 stride_w, ember::i64 pad_h, ember::i64 pad_w, ember::i64 dil_h, \
        ember::i64 dil_w, ember::i64 out_h, ember::i64 out_w, T* col) {                            \
        ember::im2col<T>(n, channels, in_h, in_w, x, x_sn, x_sc, x_sh, x_sw, kernel_h, kernel_w, stride_h, \
                         stride_w, pad_h, pad_w, dil_h, dil_w, out_h, out_w, col);                 \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(im2col_##SUFFIX)

EMBER_IM2COL(f32, float)
EMBER_IM2COL(f64, double)
EMBER_IM2COL(f16, ember::f16)
EMBER_IM2COL(bf16, ember::bf16)
