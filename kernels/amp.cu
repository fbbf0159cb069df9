// Automatic mixed precision: the GradScaler's two kernels (PyTorch's
// `_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`).
//
//   amp_unscale_{f32,f64,f16,bf16}(i64 num_tensors, const u64* addrs, const i64* numels,
//                                  float* found_inf, const float* inv_scale)
//       For every tensor t < num_tensors (addrs[t]: the device address of its first element,
//       contiguous, numels[t] elements of the kernel's dtype): x = x * inv_scale, computed in
//       f32 (f64 for f64 tensors, PyTorch's opmath), and *found_inf = 1 when any x was an
//       infinity or a NaN before the multiplication. One launch covers every tensor of one
//       dtype on one device (the addresses are a pointer table in device memory, see
//       `device_ptr` in ember.cuh); any 1-D grid works (each tensor is covered by a
//       grid-stride loop of the whole grid). found_inf is only ever set to 1, never cleared,
//       so several launches (one per dtype) accumulate into one flag.
//   amp_update_scale_f32(float* scale, i32* growth_tracker, const float* found_inf,
//                        double growth_factor, double backoff_factor, i32 growth_interval)
//       One thread: the scale update of `torch._amp_update_scale_` (see the function).
#include "ember.cuh"

namespace ember {

template <typename T>
__device__ void amp_unscale(i64 num_tensors, const u64* addrs, const i64* numels, float* found_inf,
                            const float* inv_scale) {
    using W = typename Widen<T>::type;
    const W inv = static_cast<W>(*inv_scale);
    const i64 start = global_thread_id(), stride = grid_stride();
    bool found = false;
    for (i64 t = 0; t < num_tensors; t++) {
        T* x = device_ptr<T>(addrs[t]);
        const i64 n = numels[t];
        for (i64 i = start; i < n; i += stride) {
            const W v = Widen<T>::in(x[i]);
            found |= !finite_bits(v);
            x[i] = Widen<T>::out(v * inv);
        }
    }
    // Every writer stores the same value, so the race between threads is benign (PyTorch's
    // kernel does the same).
    if (found) *found_inf = 1.0f;
}

// PyTorch's amp_update_scale_cuda_kernel: on an inf/NaN, back off and reset the tracker;
// otherwise count the successful step and grow the scale every `growth_interval` of them,
// unless growing would overflow f32.
__device__ void amp_update_scale(float* scale, i32* growth_tracker, const float* found_inf, double growth_factor,
                                 double backoff_factor, i32 growth_interval) {
    if (global_thread_id() != 0) return;
    if (*found_inf != 0.0f) {
        *scale = static_cast<float>(static_cast<double>(*scale) * backoff_factor);
        *growth_tracker = 0;
    } else {
        const i32 successful = *growth_tracker + 1;
        if (successful == growth_interval) {
            const float grown = static_cast<float>(static_cast<double>(*scale) * growth_factor);
            if (finite_bits(grown)) *scale = grown;
            *growth_tracker = 0;
        } else {
            *growth_tracker = successful;
        }
    }
}

}  // namespace ember

#define EMBER_AMP_UNSCALE(SUFFIX, T)                                                               \
    extern "C" __global__ void amp_unscale_##SUFFIX(ember::i64 num_tensors, const ember::u64* addrs, \
                                                    const ember::i64* numels, float* found_inf,   \
                                                    const float* inv_scale) {                     \
        ember::amp_unscale<T>(num_tensors, addrs, numels, found_inf, inv_scale);                   \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(amp_unscale_##SUFFIX)

EMBER_AMP_UNSCALE(f32, float)
EMBER_AMP_UNSCALE(f64, double)
EMBER_AMP_UNSCALE(f16, ember::f16)
EMBER_AMP_UNSCALE(bf16, ember::bf16)

extern "C" __global__ void amp_update_scale_f32(float* scale, ember::i32* growth_tracker, const float* found_inf,
                                                double growth_factor, double backoff_factor,
                                                ember::i32 growth_interval) {
    ember::amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
}
EMBER_REGISTER_KERNEL(amp_update_scale_f32)
