// Kernels that exercise the emulator itself (barriers, shared memory, warp operations, early
// return, deadlock detection). They are part of the fatbin too, except the ones that are
// deliberately broken, so that a GPU run can check the emulator's answers.
//
//   ember_test_block_sum_f32(const float* in, float* out, i64 n)
//       out[blockIdx.x] = sum of in over the block's grid-stride share; dynamic shared memory
//       of 32 floats; blockDim.x a multiple of 32.
//   ember_test_reverse_block_i32(const int* in, int* out)
//       each block reverses its blockDim.x elements through static shared memory.
//   ember_test_warp_ops_i32(int* out)
//       per thread t (8 ints): shfl idx(lane 3), up(1), down(2), xor(5), xor(9) width 8,
//       ballot(lane odd), any(lane == 7), all(lane < 32).
//   ember_test_early_exit_sum_i32(int* out, int keep)
//       threads >= keep return at once; the rest sum their ids through shared memory across
//       two __syncthreads; thread 0 writes the sum.
//   ember_test_shared_poison_u32(unsigned* out, int words)
//       copies the first `words` words of never-written dynamic shared memory to out.
//   ember_test_convert_f32(const float* in, f16* h, bf16* b, float* h_back, float* b_back, i64 n)
//       the 16-bit conversions: round in to f16 and bf16 (nearest even) and widen back.
//   ember_test_atomics(float* f, int* i, f16* h, bf16* b, unsigned* m)
//       every thread adds 1 to *f, *i, *h, *b and takes the max of its global id into *m.
//   ember_test_deadlock (emulator only): lane 0 waits at __syncthreads, lanes 1..31 at a shuffle.
//   ember_test_out_of_bounds(int* out, int n) (emulator only): writes out[n], for the
//       AddressSanitizer build's test.
#include "ember.cuh"

using ember::i64;

extern "C" __global__ void ember_test_block_sum_f32(const float* in, float* out, i64 n) {
    EMBER_DYNAMIC_SHARED(float, scratch);
    float v = 0.0f;
    for (i64 i = ember::global_thread_id(); i < n; i += ember::grid_stride()) v += in[i];
    v = ember::block_sum(v, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}
EMBER_REGISTER_KERNEL(ember_test_block_sum_f32)

extern "C" __global__ void ember_test_reverse_block_i32(const int* in, int* out) {
    __shared__ int tile[1024];
    const unsigned t = threadIdx.x, base = blockIdx.x * blockDim.x;
    tile[t] = in[base + t];
    __syncthreads();
    out[base + t] = tile[blockDim.x - 1 - t];
}
EMBER_REGISTER_KERNEL(ember_test_reverse_block_i32)

extern "C" __global__ void ember_test_warp_ops_i32(int* out) {
    const int t = threadIdx.x, lane = t % 32;
    int* o = out + 8 * t;
    o[0] = __shfl_sync(ember::FULL_MASK, t, 3);
    o[1] = __shfl_up_sync(ember::FULL_MASK, t, 1);
    o[2] = __shfl_down_sync(ember::FULL_MASK, t, 2);
    o[3] = __shfl_xor_sync(ember::FULL_MASK, t, 5);
    o[4] = __shfl_xor_sync(ember::FULL_MASK, t, 9, 8);
    o[5] = static_cast<int>(__ballot_sync(ember::FULL_MASK, lane % 2 == 1));
    o[6] = __any_sync(ember::FULL_MASK, lane == 7);
    o[7] = __all_sync(ember::FULL_MASK, lane < 32);
}
EMBER_REGISTER_KERNEL(ember_test_warp_ops_i32)

extern "C" __global__ void ember_test_early_exit_sum_i32(int* out, int keep) {
    __shared__ int ids[1024];
    const int t = threadIdx.x;
    if (t >= keep) return;
    ids[t] = t;
    __syncthreads();
    if (t == 0) {
        int s = 0;
        for (int i = 0; i < keep; i++) s += ids[i];
        ids[0] = s;
    }
    __syncthreads();
    if (t == 0) out[0] = ids[0];
}
EMBER_REGISTER_KERNEL(ember_test_early_exit_sum_i32)

extern "C" __global__ void ember_test_shared_poison_u32(unsigned* out, int words) {
    EMBER_DYNAMIC_SHARED(unsigned, shared);
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        for (int i = 0; i < words; i++) out[i] = shared[i];
    }
}
EMBER_REGISTER_KERNEL(ember_test_shared_poison_u32)

extern "C" __global__ void ember_test_convert_f32(const float* in, ember::f16* h, ember::bf16* b, float* h_back,
                                                  float* b_back, i64 n) {
    for (i64 i = ember::global_thread_id(); i < n; i += ember::grid_stride()) {
        h[i] = ember::from_f32<ember::f16>(in[i]);
        b[i] = ember::from_f32<ember::bf16>(in[i]);
        h_back[i] = ember::to_f32(h[i]);
        b_back[i] = ember::to_f32(b[i]);
    }
}
EMBER_REGISTER_KERNEL(ember_test_convert_f32)

extern "C" __global__ void ember_test_atomics(float* f, int* i, ember::f16* h, ember::bf16* b, unsigned* m) {
    const unsigned id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(f, 1.0f);
    atomicAdd(i, 1);
    atomicAdd(h, ember::from_f32<ember::f16>(1.0f));
    atomicAdd(b, ember::from_f32<ember::bf16>(1.0f));
    atomicMax(m, id);
}
EMBER_REGISTER_KERNEL(ember_test_atomics)

#if !defined(__CUDACC__)
extern "C" __global__ void ember_test_deadlock(int* out) {
    int v = threadIdx.x;
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        v = __shfl_xor_sync(ember::FULL_MASK, v, 1);
    }
    out[threadIdx.x] = v;
}
EMBER_REGISTER_KERNEL(ember_test_deadlock)

extern "C" __global__ void ember_test_out_of_bounds(int* out, int n) {
    if (threadIdx.x == 0) out[n] = 1;  // one past the end: AddressSanitizer must report it
}
EMBER_REGISTER_KERNEL(ember_test_out_of_bounds)

#endif
