//! Deterministic test data without an RNG crate.

/// A small deterministic generator (xorshift64*): the same seed gives the same numbers on
/// every machine. A seed of 0 stays 0; use any other.
#[derive(Clone, Debug)]
pub struct Lcg(pub u64);

impl Lcg {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[-scale, scale)`, with 24 random bits.
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// `n` values uniform in `[-1, 1)` from `seed` (xorshift, 53 random bits each; any seed).
///
/// ```
/// let v = ember_testing::rand_vec(4, 7);
/// assert_eq!(v, ember_testing::rand_vec(4, 7));
/// assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
/// ```
pub fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}
