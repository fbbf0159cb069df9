// Philox4x32-10, the counter-based generator of every random kernel (random.cu) and of the
// attention kernels' dropout (attention.cu): bit-identical to the CPU generator,
// crates/ember-tensor/src/random/philox.rs (Note [Random streams]). Counter c of an op whose
// first counter is `base` is the block [lo32(base + c), hi32(base + c), 0, 0] (64-bit
// wrapping add) under the key (key0, key1) = the seed's low and high 32 bits.
#pragma once

#include "ember.cuh"

namespace ember {

// ---- Philox4x32-10 --------------------------------------------------------------------------

struct PhiloxWords {
    u32 w0, w1, w2, w3;
};

// The four words of counter base + c: Philox4x32-10 of [lo32, hi32, 0, 0] under (key0, key1).
__device__ __forceinline__ PhiloxWords philox_block(u32 key0, u32 key1, u64 base, u64 c) {
    const u64 ctr = base + c;  // wrapping
    u32 c0 = static_cast<u32>(ctr), c1 = static_cast<u32>(ctr >> 32), c2 = 0, c3 = 0;
    u32 k0 = key0, k1 = key1;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const u64 p0 = static_cast<u64>(0xD2511F53u) * c0;
        const u64 p1 = static_cast<u64>(0xCD9E8D57u) * c2;
        const u32 hi0 = static_cast<u32>(p0 >> 32), lo0 = static_cast<u32>(p0);
        const u32 hi1 = static_cast<u32>(p1 >> 32), lo1 = static_cast<u32>(p1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return PhiloxWords{c0, c1, c2, c3};
}

}  // namespace ember
