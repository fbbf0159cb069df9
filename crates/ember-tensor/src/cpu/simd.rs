//! Runs a closure compiled for the widest vector instructions this CPU has.
//!
//! The crate is built for the x86-64 baseline (SSE2), which every x86-64 CPU runs. Loops
//! that are bound by arithmetic rather than memory (`exp`, `sigmoid`, softmax rows) run
//! about twice as fast with AVX2 as with SSE2 and faster again with AVX-512 (`exp` over 16M
//! f32 on one core). [`widest`] checks the CPU once
//! (`is_x86_feature_detected!` caches) and calls `f` through a `#[target_feature]`
//! trampoline; `f` is inlined into it and so compiled for those features. Results are
//! bit-identical on every path: Rust never contracts `a * b + c` into an FMA on its own,
//! and an explicit `mul_add` rounds once everywhere (an instruction here, libm's `fmaf` in
//! baseline code).
//!
//! Closures handed to rayon run on other threads as separate functions, so `widest` goes
//! inside the per-chunk work, not around the parallel loop.

/// Calls `f`, compiled for AVX-512 or AVX2 when the CPU has them.
#[inline(always)]
pub(crate) fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: `has_avx512` checked that this CPU supports every feature the
            // trampoline enables, which is the only requirement of calling it.
            return unsafe { avx512(f) };
        }
        if has_avx2() {
            // SAFETY: `has_avx2` checked that this CPU supports AVX2 and FMA.
            return unsafe { avx2(f) };
        }
    }
    f()
}

/// Whether [`widest`] compiles for AVX-512, whose 32 vector registers hold register blocks
/// that AVX2's 16 would spill (`cpu/attention`'s tile products size their blocks by it).
#[inline(always)]
pub(crate) fn has_32_vector_registers() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && has_avx2()
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Runs `f` compiled with AVX-512 (F, BW, DQ, VL), AVX2 and FMA enabled.
///
/// # Safety
/// The CPU must have those features (as `widest` checks before calling it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Runs `f` compiled with AVX2 and FMA enabled.
///
/// # Safety
/// The CPU must have AVX2 and FMA (as `widest` checks before calling it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::exp_f32;

    #[test]
    fn every_path_gives_the_same_bits() {
        let xs: Vec<f32> = (0..4099).map(|i| (i as f32 - 2000.0) * 0.05).collect();
        let plain: Vec<f32> = xs.iter().map(|&x| exp_f32(x)).collect();
        assert_eq!(
            widest(|| xs.iter().map(|&x| exp_f32(x)).collect::<Vec<_>>()),
            plain
        );
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                // SAFETY: AVX2 and FMA checked just above.
                let v = unsafe { avx2(|| xs.iter().map(|&x| exp_f32(x)).collect::<Vec<_>>()) };
                assert_eq!(v, plain);
            }
            if has_avx512() {
                // SAFETY: the AVX-512 subset checked just above.
                let v = unsafe { avx512(|| xs.iter().map(|&x| exp_f32(x)).collect::<Vec<_>>()) };
                assert_eq!(v, plain);
            }
        }
    }
}
