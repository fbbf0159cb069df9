//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
//! a counter-based generator. Output block `c` of a stream is a pure function of
//! `(key, counter)`, so any element of a random tensor can be computed independently — on a
//! CPU thread or a GPU thread — and the same seed gives the same numbers on every device.
//!
//! Note [Random streams]:
//!
//! A generator's state is `(seed, offset)`. The Philox key is `[seed_lo32, seed_hi32]`. A
//! random op over `n` elements takes `counters(n)` consecutive counters starting at `offset`
//! (call the first one `base`) and advances `offset` past them, so consecutive ops never
//! share a counter. Counter `c` is the 128-bit block `[lo32(base + c), hi32(base + c), 0, 0]`
//! (64-bit wrapping add) and yields the four words `w = philox4x32_10(block, key)`.
//!
//! Element `i` of the op is a pure function of `(key, base, i)`, independent of how work is
//! split across threads or GPU blocks. Each sampler has `K` outputs per counter (4 or 2):
//! element `i` is output `i % K` of counter `i / K`, where a counter's outputs are:
//!
//! | sampler | K | outputs of counter `c` (words `w0..w3`) |
//! | --- | --- | --- |
//! | uniform f32 / f16 / bf16, bernoulli | 4 | `unit(w_j, bits)` for j = 0..3 |
//! | uniform f64 | 2 | `unit53(w0, w1)`, `unit53(w2, w3)` |
//! | normal f32 (and f16/bf16) | 4 | `bm(24-bit w0, w1)` gives outputs 0,1; `bm(w2, w3)` gives 2,3 |
//! | normal f64 | 2 | `bm(53-bit (w0,w1), (w2,w3))` gives outputs 0,1 |
//! | randint, range <= 2^32 | 4 | `low + w_j % range` |
//! | randint, range > 2^32 | 2 | `low + ((w0 << 32 | w1) % range)`, same with `w2, w3` |
//!
//! where `unit(w, b) = (w >> (32 - b)) * 2^-b` (b = 24 for f32, 11 for f16, 8 for bf16, so
//! the value is exact in the output type and never rounds up to 1), `unit53(a, b) =
//! ((a >> 5) << 26 | b >> 6) * 2^-53`. Box–Muller `bm` takes two integers `k1, k2` of `b`
//! bits: `u1 = 1 - k1 * 2^-b` in `(0, 1]`, `r = sqrt(-2 ln u1)`, `θ = 2π k2 2^-b`, outputs
//! `(r cos θ, r sin θ)`.
//!
//! Bit-for-bit agreement with the CUDA kernels: everything above is integer arithmetic plus
//! IEEE-754 f64 `+ - * /` and `sqrt`, all correctly rounded on both sides, evaluated in the
//! order written here. `ln`, `sin` and `cos` are not taken from the platform's libm (whose
//! results differ between glibc and CUDA) but computed by [`ln_unit`] and [`sincos_turns`]
//! from those basic operations, and results are rounded to f32/f16/bf16 only at the end
//! (round to nearest even). A CUDA port must not contract `a * b + c` into an FMA
//! (`-fmad=false`, or `__dmul_rn`/`__dadd_rn`). Uniforms over `[low, high)` compute
//! `low + u * (high - low)` in f64 and keep the result below `high`.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

#[inline(always)]
fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo(M0, c[0]);
    let (hi1, lo1) = mulhilo(M1, c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// The Philox4x32 bijection with 10 rounds: four random words from a counter and a key.
///
/// ```
/// use ember_tensor::random::philox::philox4x32_10;
/// // Random123's known-answer vector.
/// assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
/// ```
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for r in 0..10 {
        if r > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        c = round(c, k);
    }
    c
}

/// The Philox key of a seed: its low and high 32 bits.
pub fn key_of(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// The four words of counter `base + c` (Note [Random streams]).
#[inline(always)]
pub fn block(key: [u32; 2], base: u64, c: u64) -> [u32; 4] {
    let ctr = base.wrapping_add(c);
    philox4x32_10([ctr as u32, (ctr >> 32) as u32, 0, 0], key)
}

/// A `bits`-bit uniform in `[0, 1)` from the top bits of a word: `(w >> (32 - bits)) *
/// 2^-bits` (`1 <= bits <= 32`), exact in any float type with at least `bits` significant
/// bits.
#[inline(always)]
pub fn unit(w: u32, bits: u32) -> f64 {
    f64::from(w >> (32 - bits)) * pow2_neg(bits)
}

/// A 53-bit uniform in `[0, 1)` from two words: 27 bits from `a`, 26 from `b`.
#[inline(always)]
pub fn unit53(a: u32, b: u32) -> f64 {
    bits53(a, b) as f64 * pow2_neg(53)
}

#[inline(always)]
fn bits53(a: u32, b: u32) -> u64 {
    (u64::from(a >> 5) << 26) | u64::from(b >> 6)
}

#[inline(always)]
fn pow2_neg(bits: u32) -> f64 {
    // Exact: a power of two in f64's normal range.
    f64::from_bits((1023 - u64::from(bits)) << 52)
}

/// `ln(x)` for a normal, positive, finite `x` from IEEE basic operations only (see Note
/// [Random streams]): `x = m 2^e` with `m` in `[sqrt(1/2), sqrt(2))`, then
/// `ln m = 2 atanh(s)`, `s = (m - 1) / (m + 1)`, as an odd series in `s` to `s^25`
/// (|s| <= 0.172, so the truncation is below 1e-20 relative). Accurate to a few ulp.
pub fn ln_unit(x: f64) -> f64 {
    const LN2: f64 = std::f64::consts::LN_2;
    const SQRT2: f64 = std::f64::consts::SQRT_2;
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > SQRT2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    // Horner over 1/3, 1/5, ..., 1/25 (each the f64 nearest to the fraction).
    let mut p = 1.0 / 25.0;
    for k in (1..12).rev() {
        p = p * s2 + 1.0 / f64::from(2 * k + 1);
    }
    let t = 2.0 * s;
    (e as f64) * LN2 + (t + t * (s2 * p))
}

/// `(sin, cos)` of `2π k / 2^bits` for an integer `0 <= k < 2^bits` (`3 <= bits <= 53`),
/// from IEEE basic operations only (see Note [Random streams]): the quadrant
/// `q = round(4k / 2^bits)` is split off in integers, the rest `x` (|x| <= π/4) goes through
/// Taylor polynomials to degree 19 and 18.
pub fn sincos_turns(k: u64, bits: u32) -> (f64, f64) {
    let quarter = 1u64 << (bits - 2);
    let q = ((k >> (bits - 3)) + 1) >> 1; // round(k / quarter), 0..=4
    let r = k as i64 - (q * quarter) as i64; // in [-quarter/2, quarter/2]
    let x = (r as f64) * (std::f64::consts::TAU * pow2_neg(bits));
    let x2 = x * x;
    // sin x = x (1 - x^2/3! + x^4/5! - ...), cos x = 1 - x^2/2! + x^4/4! - ...
    let mut ps = 0.0;
    let mut pc = 0.0;
    for n in (1..10u32).rev() {
        // Coefficients of x^(2n) in sin(x)/x and cos(x): (-1)^n / (2n+1)! and (-1)^n / (2n)!.
        let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
        ps = ps * x2 + sign / factorial(2 * n + 1);
        pc = pc * x2 + sign / factorial(2 * n);
    }
    let s = x + x * (x2 * ps);
    let c = 1.0 + x2 * pc;
    match q & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// `n!` in f64 (exact for n <= 22).
fn factorial(n: u32) -> f64 {
    (2..=n).fold(1.0, |acc, i| acc * f64::from(i))
}

/// Box–Muller on two `bits`-bit integers: `u1 = 1 - k1 2^-bits` in `(0, 1]`,
/// `r = sqrt(-2 ln u1)`, `θ = 2π k2 2^-bits`; returns `(r cos θ, r sin θ)`.
#[inline]
pub fn box_muller(k1: u64, k2: u64, bits: u32) -> (f64, f64) {
    let u1 = 1.0 - (k1 as f64) * pow2_neg(bits);
    let r = (-2.0 * ln_unit(u1)).sqrt();
    let (s, c) = sincos_turns(k2, bits);
    (r * c, r * s)
}

/// One sampler: how many outputs a counter gives and what they are (Note [Random streams]).
pub trait Sampler: Sync {
    /// The output type.
    type Out: Copy + Send;
    /// Outputs per counter.
    const K: usize;
    /// The `K` outputs of one counter's words (only the first `K` entries are used).
    fn outputs(&self, w: [u32; 4]) -> [Self::Out; 4];
}

/// Counters an op over `n` elements with sampler `S` takes.
pub fn counters<S: Sampler>(n: usize) -> u64 {
    (n as u64).div_ceil(S::K as u64)
}

/// The samples of elements `range` (Note [Random streams]): element `i` is output `i % K` of
/// counter `base + i / K`. Any split of `0..n` into ranges gives the same values.
pub fn samples<S: Sampler>(
    s: &S,
    key: [u32; 2],
    base: u64,
    range: std::ops::Range<usize>,
) -> impl Iterator<Item = S::Out> + '_ {
    let first = range.start / S::K;
    let last = range.end.div_ceil(S::K);
    (first..last)
        .flat_map(move |c| {
            let o = s.outputs(block(key, base, c as u64));
            o.into_iter().take(S::K)
        })
        .skip(range.start % S::K)
        .take(range.len())
}

/// Fills `out` with elements `0..out.len()` of the stream, in parallel above 32Ki elements.
pub fn fill<S: Sampler>(out: &mut [S::Out], s: &S, key: [u32; 2], base: u64) {
    const CHUNK: usize = 1 << 14;
    let task = |(t, chunk): (usize, &mut [S::Out])| {
        let range = t * CHUNK..t * CHUNK + chunk.len();
        for (x, v) in chunk.iter_mut().zip(samples(s, key, base, range)) {
            *x = v;
        }
    };
    if out.len() >= 2 * CHUNK {
        ember_gemm::parallel::for_each_chunk_mut(out, CHUNK, |t, c| task((t, c)));
    } else {
        out.chunks_mut(CHUNK).enumerate().for_each(task);
    }
}

/// The largest f64 below `x` (for finite `x`).
fn prev_f64(x: f64) -> f64 {
    if x > 0.0 {
        f64::from_bits(x.to_bits() - 1)
    } else if x == 0.0 {
        -f64::from_bits(1)
    } else {
        f64::from_bits(x.to_bits() + 1)
    }
}

/// `low + u (high - low)` kept inside `[low, high)` (rounding can reach `high`).
#[inline(always)]
fn scale(u: f64, low: f64, high: f64) -> f64 {
    let v = low + u * (high - low);
    if v < high { v } else { low.max(prev_f64(high)) }
}

/// Uniform in `[low, high)` from `bits`-bit uniforms, one word per sample (f32: 24 bits,
/// f16: 11, bf16: 8), computed in f64; callers round to their type.
#[derive(Clone, Copy, Debug)]
pub struct Uniform32 {
    /// Significant bits of the unit uniform.
    pub bits: u32,
    /// Lower bound (inclusive).
    pub low: f64,
    /// Upper bound (exclusive).
    pub high: f64,
}

impl Sampler for Uniform32 {
    type Out = f64;
    const K: usize = 4;
    #[inline]
    fn outputs(&self, w: [u32; 4]) -> [f64; 4] {
        w.map(|w| scale(unit(w, self.bits), self.low, self.high))
    }
}

/// Uniform f64 in `[low, high)` from 53-bit uniforms, two words per sample.
#[derive(Clone, Copy, Debug)]
pub struct Uniform64 {
    /// Lower bound (inclusive).
    pub low: f64,
    /// Upper bound (exclusive).
    pub high: f64,
}

impl Sampler for Uniform64 {
    type Out = f64;
    const K: usize = 2;
    #[inline]
    fn outputs(&self, w: [u32; 4]) -> [f64; 4] {
        let a = scale(unit53(w[0], w[1]), self.low, self.high);
        let b = scale(unit53(w[2], w[3]), self.low, self.high);
        [a, b, 0.0, 0.0]
    }
}

/// Normal `mean + std z` for f32 (and f16/bf16) outputs: Box–Muller on 24-bit integers,
/// one word per sample, computed in f64; callers round to their type.
#[derive(Clone, Copy, Debug)]
pub struct Normal32 {
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub std: f64,
}

impl Sampler for Normal32 {
    type Out = f64;
    const K: usize = 4;
    #[inline]
    fn outputs(&self, w: [u32; 4]) -> [f64; 4] {
        let (z0, z1) = box_muller(u64::from(w[0] >> 8), u64::from(w[1] >> 8), 24);
        let (z2, z3) = box_muller(u64::from(w[2] >> 8), u64::from(w[3] >> 8), 24);
        [z0, z1, z2, z3].map(|z| self.mean + self.std * z)
    }
}

/// Normal f64: Box–Muller on 53-bit integers, two words per uniform, two samples per counter.
#[derive(Clone, Copy, Debug)]
pub struct Normal64 {
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub std: f64,
}

impl Sampler for Normal64 {
    type Out = f64;
    const K: usize = 2;
    #[inline]
    fn outputs(&self, w: [u32; 4]) -> [f64; 4] {
        let (z0, z1) = box_muller(bits53(w[0], w[1]), bits53(w[2], w[3]), 53);
        [
            self.mean + self.std * z0,
            self.mean + self.std * z1,
            0.0,
            0.0,
        ]
    }
}

/// Integers uniform in `[low, low + range)` (`range >= 1`) by modulo, like PyTorch's
/// `random_from_to`: one word per sample when the range fits in 32 bits, else two.
#[derive(Clone, Copy, Debug)]
pub struct RandInt {
    /// Lowest value.
    pub low: i64,
    /// Number of values (at least 1; `high - low` as an unsigned count).
    pub range: u64,
}

/// Integers over a range of at most 2^32 values, one word per sample.
#[derive(Clone, Copy, Debug)]
pub struct RandInt32(pub RandInt);
/// Integers over a range of more than 2^32 values, two words per sample.
#[derive(Clone, Copy, Debug)]
pub struct RandInt64(pub RandInt);

impl Sampler for RandInt32 {
    type Out = i64;
    const K: usize = 4;
    #[inline]
    fn outputs(&self, w: [u32; 4]) -> [i64; 4] {
        let RandInt { low, range } = self.0;
        w.map(|w| low.wrapping_add((u64::from(w) % range.max(1)) as i64))
    }
}

impl Sampler for RandInt64 {
    type Out = i64;
    const K: usize = 2;
    #[inline]
    fn outputs(&self, w: [u32; 4]) -> [i64; 4] {
        let RandInt { low, range } = self.0;
        let r = |a: u32, b: u32| {
            let v = (u64::from(a) << 32) | u64::from(b);
            low.wrapping_add((v % range.max(1)) as i64)
        };
        [r(w[0], w[1]), r(w[2], w[3]), 0, 0]
    }
}

/// Bernoulli(p): `unit(w, 24) < p`, one word per sample (so `p = 1` always gives true and
/// `p = 0` never does).
#[derive(Clone, Copy, Debug)]
pub struct Bernoulli {
    /// Probability of `true`.
    pub p: f64,
}

impl Sampler for Bernoulli {
    type Out = bool;
    const K: usize = 4;
    #[inline]
    fn outputs(&self, w: [u32; 4]) -> [bool; 4] {
        w.map(|w| unit(w, 24) < self.p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors of Random123's kat_vectors for philox4x32_10.
    #[test]
    fn known_answers() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn portable_ln_and_sincos_match_libm_closely() {
        for i in 0..20_000u64 {
            let x = 1.0 - (i * 838_861) as f64 * pow2_neg(24);
            if x <= 0.0 {
                continue;
            }
            let (a, b) = (ln_unit(x), x.ln());
            assert!(
                (a - b).abs() <= 4.0 * f64::EPSILON * b.abs().max(1e-300),
                "{x}"
            );
        }
        assert_eq!(ln_unit(1.0), 0.0);
        for k in (0..1u64 << 24).step_by(997) {
            let (s, c) = sincos_turns(k, 24);
            let t = std::f64::consts::TAU * k as f64 * pow2_neg(24);
            assert!(
                (s - t.sin()).abs() < 1e-15 && (c - t.cos()).abs() < 1e-15,
                "{k}"
            );
        }
        let (s, c) = sincos_turns((1 << 53) - 1, 53);
        assert!(s.abs() < 1e-15 && (c - 1.0).abs() < 1e-15);
    }

    #[test]
    fn element_i_is_a_pure_function_of_its_index() {
        // Any split of the work gives the same numbers: a long fill equals its pieces filled
        // from the right counters, and the parallel path equals the serial definition.
        let key = [7, 9];
        let u = Uniform32 {
            bits: 24,
            low: 0.0,
            high: 1.0,
        };
        let n = 3 * (1 << 14) + 5;
        let mut all = vec![0f64; n];
        fill(&mut all, &u, key, 100);
        for (i, x) in all.iter().enumerate().step_by(997) {
            let w = block(key, 100, (i / 4) as u64)[i % 4];
            assert_eq!(*x, unit(w, 24));
        }
        let piece: Vec<f64> = samples(&u, key, 100, 4001..n).collect();
        assert_eq!(&all[4001..], &piece[..]);
        let n64 = Normal64 {
            mean: 0.0,
            std: 1.0,
        };
        let whole: Vec<f64> = samples(&n64, key, 5, 0..11).collect();
        let parts: Vec<f64> = samples(&n64, key, 5, 0..3)
            .chain(samples(&n64, key, 5, 3..11))
            .collect();
        assert_eq!(whole, parts);
    }

    #[test]
    fn uniform_range_is_half_open() {
        let u = Uniform32 {
            bits: 24,
            low: -2.0,
            high: 3.0,
        };
        assert!(samples(&u, [1, 2], 0, 0..100_000).all(|v| (-2.0..3.0).contains(&v)));
        assert!(scale(1.0, 0.0, 1.0) < 1.0);
    }

    #[test]
    fn randint_covers_the_range() {
        let r = RandInt32(RandInt { low: -3, range: 7 });
        let x: Vec<i64> = samples(&r, [5, 6], 0, 0..10_000).collect();
        assert!(x.iter().all(|v| (-3..4).contains(v)));
        for v in -3..4 {
            assert!(x.iter().filter(|&&y| y == v).count() > 1200);
        }
        let big = RandInt64(RandInt {
            low: 0,
            range: 1 << 40,
        });
        assert!(samples(&big, [5, 6], 0, 0..1000).any(|v| v > 1 << 33));
        assert_eq!(counters::<RandInt64>(5), 3);
        assert_eq!(counters::<RandInt32>(5), 2);
    }
}
