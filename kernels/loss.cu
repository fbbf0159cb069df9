// The negative log-likelihood primitive of crates/ember-tensor/src/backend_nn.rs (`nll_loss`,
// CPU: crates/ember-tensor/src/cpu/loss.rs): per element of [N, L], the loss term and the
// class weight used, which the nll_loss / cross_entropy fronts reduce.
//
//   nll_loss_{T}_{I}(i64 n, i64 classes, i64 len, const T* x, i64 x_sn, i64 x_sc, i64 x_sl,
//                    const I* target, i64 t_sn, i64 t_sl, const T* weight, i64 w_s,
//                    i64 ignore_index, T* loss, T* wout, i64* err)
//       T = f32 or f64 (the front computes f16/bf16 inputs in f32, so the backend is never
//       sent them); I = the target dtype, i64 or i32. 4 kernels. Any 1-D grid and block.
//
// x is the [N, C, L] log-probabilities, strided: element (s, c, l) at x[s*x_sn + c*x_sc +
// l*x_sl] (the pointer at x's first element, layout offset added by the host). target is
// [N, L]: element (s, l) at target[s*t_sn + l*t_sl]. weight is [C] with stride w_s, or null
// for no class weight (every weight 1). n = N * L, classes = C, len = L. loss and wout are
// contiguous [N, L] (n elements) of T. For position p = s*L + l with t = target[p]:
//   t == ignore_index:  loss[p] = 0, wout[p] = 0;
//   0 <= t < C:         loss[p] = -(w[t] * x[s, t, l]), wout[p] = w[t]   (w[t] = 1 without
//                       weight; one multiply, no contraction, bit-identical to the CPU);
//   otherwise:          a bad target: reported in err, loss[p] = wout[p] = 0.
// (ignore_index is compared first, so an ignore_index outside [0, C) is never an error.)
//
// Error slot, as kernels/index.cu: err is two i64 the host sets to {INT64_MAX, 0} before the
// launch and reads after it. err[0] = the smallest position p (row-major over [N, L]) with a
// bad target (atomicMin), INT64_MAX if none: the one the CPU names; err[1] = the value of one
// bad target (atomicExch; the one at err[0] when there is only one). The CPU's message is
// "target {t} is out of bounds: expected a class index in [0, {C}) or ignore_index = {i}"
// with t = target at position err[0].
#include "ember.cuh"

namespace ember {

template <typename T, typename I>
__device__ __forceinline__ void nll_loss(i64 n, i64 classes, i64 len, const T* __restrict__ x, i64 x_sn, i64 x_sc,
                                         i64 x_sl, const I* __restrict__ target, i64 t_sn, i64 t_sl,
                                         const T* __restrict__ weight, i64 w_s, i64 ignore_index,
                                         T* __restrict__ loss, T* __restrict__ wout, i64* err) {
    for (i64 p = global_thread_id(); p < n; p += grid_stride()) {
        const i64 s = p / len, l = p - s * len;
        const i64 t = static_cast<i64>(target[s * t_sn + l * t_sl]);
        T lv = 0, wv = 0;
        if (t != ignore_index) {
            if (t < 0 || t >= classes) {
                atomicMin(err, p);
                atomicExch(reinterpret_cast<u64*>(err + 1), static_cast<u64>(t));
            } else {
                wv = weight != nullptr ? weight[t * w_s] : static_cast<T>(1);
                lv = -(wv * x[s * x_sn + t * x_sc + l * x_sl]);
            }
        }
        loss[p] = lv;
        wout[p] = wv;
    }
}

}  // namespace ember

#define EMBER_NLL(SUFFIX, T, ISUFFIX, I)                                                           \
    extern "C" __global__ void nll_loss_##SUFFIX##_##ISUFFIX(                                      \
        ember::i64 n, ember::i64 classes, ember::i64 len, const T* x, ember::i64 x_sn, ember::i64 x_sc, \
        ember::i64 x_sl, const I* target, ember::i64 t_sn, ember::i64 t_sl, const T* weight, ember::i64 w_s, \
        ember::i64 ignore_index, T* loss, T* wout, ember::i64* err) {                              \
        ember::nll_loss<T, I>(n, classes, len, x, x_sn, x_sc, x_sl, target, t_sn, t_sl, weight, w_s, \
                              ignore_index, loss, wout, err);                                      \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(nll_loss_##SUFFIX##_##ISUFFIX)

EMBER_NLL(f32, float, i64, ember::i64)
EMBER_NLL(f32, float, i32, ember::i32)
EMBER_NLL(f64, double, i64, ember::i64)
EMBER_NLL(f64, double, i32, ember::i32)
