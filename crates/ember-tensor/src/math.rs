//! Elementary functions written so the compiler vectorises them.
//!
//! `f32::exp` calls libm once per element, which no loop can vectorise; the elementwise
//! kernels, softmax and the losses spend most of their time there. [`exp_f32`] is the
//! Cephes single-precision algorithm written branch-free (clamp, round by the magic-number
//! trick, a degree-6 polynomial, scale by two exact powers of two), within 1 ulp of the
//! correctly rounded result over the whole f32 range (tested below), with subnormal results,
//! overflow to `inf`, `exp(-inf) = 0` and NaN propagation as libm. The CUDA kernels use the
//! hardware `expf`.
//!
//! The multiply-adds are `mul_add`: one FMA instruction each in code compiled for AVX2 or
//! AVX-512 (`cpu::simd::widest`, which every CPU caller of `exp_f32` runs in), which made
//! `exp` over 16M f32 on one core faster by about a quarter. A fused multiply-add rounds
//! once on every path, so the result is the same bit for bit everywhere; outside `widest`
//! on a baseline build each `mul_add` is a call to libm's `fmaf`, correct but slow.

/// `e^x` for `f32`, branch-free so loops over it vectorise; within 1 ulp.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer (round to nearest even) held in the low
    // mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    // Below -104 the result rounds to 0, above 89 to inf; NaN passes through `clamp`.
    let xc = x.clamp(-104.0, 89.0);
    let t = xc.mul_add(LOG2E, MAGIC);
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, xc));
    let mut p = 1.987_569_2e-4_f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e = (p * r).mul_add(r, r) + 1.0;
    // 2^n with n in [-150, 129] as two normal powers of two, so subnormal and overflowing
    // results round once, in the last multiply. For NaN input `ni` is garbage but `e` is
    // NaN.
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    e * s1 * s2
}

/// `exp` that vectorises for f32 (see [`exp_f32`]) and is libm's for f64.
pub(crate) trait FastExp: Copy {
    fn fast_exp(self) -> Self;
}

impl FastExp for f32 {
    #[inline(always)]
    fn fast_exp(self) -> f32 {
        exp_f32(self)
    }
}

impl FastExp for f64 {
    #[inline(always)]
    fn fast_exp(self) -> f64 {
        self.exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        if a == b {
            return 0;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_f32_is_within_one_ulp_over_the_range() {
        // Every 257th bit pattern: ~17M values, covering every binade, both signs.
        let mut worst = (0, 0f32);
        for bits in (0..=u32::MAX).step_by(257) {
            let x = f32::from_bits(bits);
            let want = (x as f64).exp() as f32;
            let got = exp_f32(x);
            if x.is_nan() {
                assert!(got.is_nan());
                continue;
            }
            let u = ulps(got, want);
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(worst.0 <= 1, "{} ulps at x = {}", worst.0, worst.1);
    }

    #[test]
    fn exp_f32_special_values() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        // Subnormal results are rounded, not flushed.
        let x = -100.0f32;
        assert_eq!(exp_f32(x), (x as f64).exp() as f32);
        assert!(exp_f32(x) > 0.0 && !exp_f32(x).is_normal());
        assert_eq!(1f64.fast_exp(), std::f64::consts::E);
    }
}
