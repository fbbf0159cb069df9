// Indexing: index_select, gather, scatter_add (embedding is index_select on dim 0 of the
// weight), the CPU backend's crates/ember-tensor/src/cpu/index.rs on the GPU.
//
// T is every dtype f32 f64 f16 bf16 i64 i32 u8 bool (bool: one byte 0/1); I is the index
// dtype, i64 (`_i64`) or i32 (`_i32`), the two the CPU accepts. 48 kernels. Any 1-D grid
// and block (grid-stride loops, no shared memory, no barriers). Operands are strided
// (`StridedLayout`, rank 1..=8, sizes = the iteration shape, strides in elements, the
// `contiguous` flag is ignored); every pointer points at its operand's first element (the
// host adds the layout's offset). Outputs are contiguous.
//
//   index_select_{T}_{I}(i64 n, i64 inner, i64 count, i64 size, StridedLayout src_l,
//                        i64 src_dim_stride, const T* src, const I* idx, i64 idx_stride,
//                        T* out, i64* err)
//       out = src.index_select(dim, idx): src's shape with dims[dim] = count, contiguous.
//       n = numel(out); inner = product of out's dims after dim; count = numel(idx) (a 0-D
//       idx is one element); size = src.dims[dim]. src_l: rank = src's rank, sizes = out's
//       shape, strides = src's strides with strides[dim] = 0 (the kernel adds
//       idx * src_dim_stride, src_dim_stride = src's stride of dim). idx is 1-D: element p at
//       idx[p * idx_stride].
//       out[o] = src[offset(o, src_l) + idx[(o / inner) % count] * src_dim_stride]. Every
//       index is checked, also when out is empty (as the CPU does): launch whenever
//       count > 0, even with n = 0 (a grid of at least one block).
//
//   gather_{T}_{I}(i64 n, i64 size, StridedLayout src_l, i64 src_dim_stride, const T* src,
//                  StridedLayout idx_l, const I* idx, T* out, i64* err)
//       out = src.gather(dim, idx): idx's shape, contiguous. n = numel(idx); size =
//       src.dims[dim]. src_l: sizes = idx's shape, strides = src's strides with strides[dim]
//       = 0; idx_l: sizes = idx's shape, strides = idx's. Both must have the same rank and
//       sizes (the kernel reads the sizes of src_l).
//       out[o] = src[offset(o, src_l) + idx[offset(o, idx_l)] * src_dim_stride].
//
//   scatter_add_{T}_{I}(i64 n, i64 size, StridedLayout out_l, i64 out_dim_stride, T* out,
//                       StridedLayout idx_l, const I* idx, StridedLayout src_l,
//                       const T* src, i64* err)
//       In place on `out`: out[offset(o, out_l) + idx[offset(o, idx_l)] * out_dim_stride]
//       += src[offset(o, src_l)] for every o < n = numel(idx). Out-of-place scatter_add is
//       two launches: the host first writes a contiguous copy of self into out with
//       cast_{T}_{T}(numel(self), self's layout, self, out), then launches this. out_l:
//       sizes = idx's shape, strides = the contiguous strides of self's shape with
//       strides[dim] = 0 (out_dim_stride = the contiguous stride of dim); idx_l: idx's
//       strides; src_l: src's strides (src narrowed to idx's shape, as the CPU front does).
//       The three layouts must have the same rank and sizes (the kernel reads idx_l's).
//       size = self.dims[dim].
//       Adds: f32 f64 f16 bf16 with atomicAdd (f16/bf16: one correctly rounded 16-bit add
//       per element, as the CPU's f64 add rounded to 16 bits; on sm_75-89 bf16 is a CAS
//       loop inside cuda_bf16.hpp); i64 i32 wrapping atomicAdd; u8 wrapping add and bool OR
//       (the CPU's `from_i64(a + b)` is `a + b != 0`) as a compare-and-swap loop on the
//       aligned 32-bit word holding the byte, so for u8/bool the 4-byte-aligned words
//       covering out must lie in allocated memory (true of every driver and caching-allocator
//       block: 256/512-byte granular) and nothing else may write that memory during the
//       launch. Determinism: integers and bool are exact and deterministic. Floats are
//       exact and deterministic when no two elements land on the same output position; with
//       duplicate positions the order of the atomic adds varies, so results can differ from
//       the CPU's sequential order (and between runs) in the last bits. On a GPU, f32
//       atomicAdd may flush subnormal inputs and results to zero (the PTX ISA describes
//       atom.add.f32 so; not checked on hardware here); f16/bf16 use the .noftz forms and
//       f64 does not flush; the emulator never flushes.
//
// Out-of-range indices (the error slot). A kernel cannot fail, so every index is checked and
// a bad one (< 0 or >= size; i32 indices are widened first) is reported in `err`, two i64
// the host initialises to {INT64_MAX, 0} before the launch (one 16-byte copy) and reads back
// after it:
//   err[0] = the smallest position p (row-major over idx's shape; for index_select the
//            position in the 1-D idx) holding a bad index (atomicMin), INT64_MAX if none;
//   err[1] = the value of one bad index (atomicExch: any of them; the one at err[0] when
//            there is only one).
// The CPU names the first bad index in row-major order: read idx at position err[0] (or use
// err[1] when one bad index is all that matters). An element whose index is bad gets 0 in
// index_select/gather and adds nothing in scatter_add; the output must be discarded anyway.
#include "ember.cuh"

namespace ember {

template <typename I>
__device__ __forceinline__ i64 index_load(const I* p) {
    return static_cast<i64>(*p);
}

// Records a bad index (see the header comment's error-slot protocol).
__device__ __forceinline__ void index_report(i64* err, i64 pos, i64 value) {
    atomicMin(err, pos);
    atomicExch(reinterpret_cast<u64*>(err + 1), static_cast<u64>(value));
}

// Offsets of the `linear`-th element of the iteration in two operands that share `a`'s
// sizes: one div/mod chain for both, unrolled over MAX_DIMS (constant indices only).
__device__ __forceinline__ void index_offsets2(i64 linear, const StridedLayout& a, const StridedLayout& b,
                                               i64& oa, i64& ob) {
    oa = 0;
    ob = 0;
#pragma unroll
    for (int d = MAX_DIMS - 1; d >= 0; --d) {
        if (d < a.rank) {
            const i64 size = a.sizes[d];
            const i64 q = linear / size;
            const i64 index = linear - q * size;
            linear = q;
            oa += index * a.strides[d];
            ob += index * b.strides[d];
        }
    }
}

// The same for three operands sharing `a`'s sizes.
__device__ __forceinline__ void index_offsets3(i64 linear, const StridedLayout& a, const StridedLayout& b,
                                               const StridedLayout& c, i64& oa, i64& ob, i64& oc) {
    oa = 0;
    ob = 0;
    oc = 0;
#pragma unroll
    for (int d = MAX_DIMS - 1; d >= 0; --d) {
        if (d < a.rank) {
            const i64 size = a.sizes[d];
            const i64 q = linear / size;
            const i64 index = linear - q * size;
            linear = q;
            oa += index * a.strides[d];
            ob += index * b.strides[d];
            oc += index * c.strides[d];
        }
    }
}

template <typename T, typename I>
__device__ __forceinline__ void index_select(i64 n, i64 inner, i64 count, i64 size, const StridedLayout& src_l,
                                             i64 src_dim_stride, const T* __restrict__ src,
                                             const I* __restrict__ idx, i64 idx_stride, T* __restrict__ out,
                                             i64* err) {
    // Every index is checked once, even when out is empty (n = 0), as the CPU checks them.
    for (i64 p = global_thread_id(); p < count; p += grid_stride()) {
        const i64 v = index_load(idx + p * idx_stride);
        if (v < 0 || v >= size) index_report(err, p, v);
    }
    for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
        const i64 v = index_load(idx + ((o / inner) % count) * idx_stride);
        out[o] = (v < 0 || v >= size) ? T{} : src[strided_offset(o, src_l) + v * src_dim_stride];
    }
}

template <typename T, typename I>
__device__ __forceinline__ void gather(i64 n, i64 size, const StridedLayout& src_l, i64 src_dim_stride,
                                       const T* __restrict__ src, const StridedLayout& idx_l,
                                       const I* __restrict__ idx, T* __restrict__ out, i64* err) {
    for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
        i64 so, io;
        index_offsets2(o, src_l, idx_l, so, io);
        const i64 v = index_load(idx + io);
        if (v < 0 || v >= size) {
            index_report(err, o, v);
            out[o] = T{};
            continue;
        }
        out[o] = src[so + v * src_dim_stride];
    }
}

// ---- scatter_add's atomic adds ---------------------------------------------------------------
__device__ __forceinline__ void scatter_add_at(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void scatter_add_at(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void scatter_add_at(f16* p, f16 v) { atomicAdd(p, v); }
__device__ __forceinline__ void scatter_add_at(bf16* p, bf16 v) { atomicAdd(p, v); }
__device__ __forceinline__ void scatter_add_at(i64* p, i64 v) {
    atomicAdd(reinterpret_cast<u64*>(p), static_cast<u64>(v));  // wrapping
}
__device__ __forceinline__ void scatter_add_at(i32* p, i32 v) {
    atomicAdd(reinterpret_cast<unsigned int*>(p), static_cast<unsigned int>(v));  // wrapping
}

// A byte updated with a compare-and-swap loop on its aligned 32-bit word (there are no byte
// atomics): new byte = old + v (u8, wrapping) or old | v (bool).
template <bool OR>
__device__ __forceinline__ void scatter_byte(unsigned char* p, unsigned int v) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
    unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~static_cast<uintptr_t>(3));
    const unsigned int shift = static_cast<unsigned int>(addr & 3) * 8;
    unsigned int old = *word;
    while (true) {
        const unsigned int b = (old >> shift) & 0xffu;
        const unsigned int nb = OR ? (b | v) : ((b + v) & 0xffu);
        const unsigned int next = (old & ~(0xffu << shift)) | (nb << shift);
        const unsigned int prev = atomicCAS(word, old, next);
        if (prev == old) break;
        old = prev;
    }
}
__device__ __forceinline__ void scatter_add_at(u8* p, u8 v) {
    if (v != 0) scatter_byte<false>(p, v);
}
__device__ __forceinline__ void scatter_add_at(bool* p, bool v) {
    if (v) scatter_byte<true>(reinterpret_cast<unsigned char*>(p), 1u);
}

template <typename T, typename I>
__device__ __forceinline__ void scatter_add(i64 n, i64 size, const StridedLayout& out_l, i64 out_dim_stride,
                                            T* out, const StridedLayout& idx_l, const I* __restrict__ idx,
                                            const StridedLayout& src_l, const T* __restrict__ src, i64* err) {
    for (i64 o = global_thread_id(); o < n; o += grid_stride()) {
        i64 io, oo, so;
        index_offsets3(o, idx_l, out_l, src_l, io, oo, so);
        const i64 v = index_load(idx + io);
        if (v < 0 || v >= size) {
            index_report(err, o, v);
            continue;
        }
        scatter_add_at(out + oo + v * out_dim_stride, src[so]);
    }
}

}  // namespace ember

#define EMBER_INDEX(SUFFIX, T, ISUFFIX, I)                                                         \
    extern "C" __global__ void index_select_##SUFFIX##_##ISUFFIX(                                  \
        ember::i64 n, ember::i64 inner, ember::i64 count, ember::i64 size, ember::StridedLayout src_l, \
        ember::i64 src_dim_stride, const T* src, const I* idx, ember::i64 idx_stride, T* out,      \
        ember::i64* err) {                                                                         \
        ember::index_select<T, I>(n, inner, count, size, src_l, src_dim_stride, src, idx, idx_stride, out, err); \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(index_select_##SUFFIX##_##ISUFFIX)                                       \
    extern "C" __global__ void gather_##SUFFIX##_##ISUFFIX(ember::i64 n, ember::i64 size, ember::StridedLayout src_l, \
                                                           ember::i64 src_dim_stride, const T* src, \
                                                           ember::StridedLayout idx_l, const I* idx, T* out, \
                                                           ember::i64* err) {                      \
        ember::gather<T, I>(n, size, src_l, src_dim_stride, src, idx_l, idx, out, err);            \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(gather_##SUFFIX##_##ISUFFIX)                                             \
    extern "C" __global__ void scatter_add_##SUFFIX##_##ISUFFIX(                                   \
        ember::i64 n, ember::i64 size, ember::StridedLayout out_l, ember::i64 out_dim_stride, T* out, \
        ember::StridedLayout idx_l, const I* idx, ember::StridedLayout src_l, const T* src, ember::i64* err) { \
        ember::scatter_add<T, I>(n, size, out_l, out_dim_stride, out, idx_l, idx, src_l, src, err); \
    }                                                                                              \
    EMBER_REGISTER_KERNEL(scatter_add_##SUFFIX##_##ISUFFIX)

#define EMBER_INDEX_DTYPE(SUFFIX, T)                                                               \
    EMBER_INDEX(SUFFIX, T, i64, ember::i64)                                                        \
    EMBER_INDEX(SUFFIX, T, i32, ember::i32)

EMBER_INDEX_DTYPE(f32, float)
EMBER_INDEX_DTYPE(f64, double)
EMBER_INDEX_DTYPE(f16, ember::f16)
EMBER_INDEX_DTYPE(bf16, ember::bf16)
EMBER_INDEX_DTYPE(i64, ember::i64)
EMBER_INDEX_DTYPE(i32, ember::i32)
EMBER_INDEX_DTYPE(u8, ember::u8)
EMBER_INDEX_DTYPE(bool, bool)
