//! 2-D max and average pooling as direct loops over the windows.

/// PyTorch's pooling output length (`pooling_output_shape`): `⌊(len + 2p - d(k-1) - 1 +
/// (ceil ? s-1 : 0)) / s⌋ + 1`, less one in ceil mode when the last window would start in
/// the right padding; `None` when that is below 1.
///
/// ```
/// use ember_testing::reference::pool_output_size;
/// assert_eq!(pool_output_size(5, 2, 2, 0, 1, false), Some(2));
/// assert_eq!(pool_output_size(5, 2, 2, 0, 1, true), Some(3));
/// assert_eq!(pool_output_size(1, 3, 1, 0, 1, false), None);
/// ```
pub fn pool_output_size(
    len: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Option<usize> {
    let (len, k, s, p, d) = (
        len as i64,
        kernel as i64,
        stride as i64,
        pad as i64,
        dilation as i64,
    );
    let num = len + 2 * p - d * (k - 1) - 1 + if ceil_mode { s - 1 } else { 0 };
    let mut o = num.div_euclid(s) + 1;
    if ceil_mode && (o - 1) * s >= len + p {
        o -= 1;
    }
    (o >= 1).then_some(o as usize)
}

/// The geometry of a 2-D pooling over `[N, C, H, W]` (an unbatched `[C, H, W]` is `N = 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2d {
    /// The input's `(N, C, H, W)`.
    pub nchw: (usize, usize, usize, usize),
    /// `(kH, kW)`.
    pub kernel: (usize, usize),
    /// `(sH, sW)`.
    pub stride: (usize, usize),
    /// `(pH, pW)`, on both sides.
    pub pad: (usize, usize),
    /// `(dH, dW)` (max pooling only; average pooling has none).
    pub dil: (usize, usize),
    /// PyTorch's `ceil_mode`.
    pub ceil: bool,
}

impl Pool2d {
    /// The output's `(OH, OW)` ([`pool_output_size`] per dimension), `None` if either is
    /// below 1.
    pub fn out(&self) -> Option<(usize, usize)> {
        let (_, _, h, w) = self.nchw;
        Some((
            pool_output_size(
                h,
                self.kernel.0,
                self.stride.0,
                self.pad.0,
                self.dil.0,
                self.ceil,
            )?,
            pool_output_size(
                w,
                self.kernel.1,
                self.stride.1,
                self.pad.1,
                self.dil.1,
                self.ceil,
            )?,
        ))
    }
}

/// Max pooling of row-major `x` (`[N, C, H, W]`): per output, the value and its flat index
/// `iy · W + ix` within its plane, by the CPU backend's loop
/// (`crates/ember-tensor/src/cpu/pool.rs`): the window's positions inside the input in row
/// order, starting from `-inf` at the first of them; a position replaces the best when it
/// is greater or NaN (so the last NaN wins, and ties and `±0` keep the first). A window of
/// `-inf` gives `-inf` at its first position.
///
/// # Panics
///
/// If the geometry has no output or `x` is too short.
pub fn max_pool2d(x: &[f64], g: &Pool2d) -> Vec<(f64, i64)> {
    let (n, c, h, w) = g.nchw;
    let Some((oh, ow)) = g.out() else {
        panic!("max_pool2d reference: {g:?} has no output");
    };
    let (kh, kw) = g.kernel;
    let (dh, dw) = g.dil;
    let mut res = Vec::with_capacity(n * c * oh * ow);
    for plane in 0..n * c {
        for y in 0..oh {
            for xo in 0..ow {
                let mut h0 = (y * g.stride.0) as isize - g.pad.0 as isize;
                let h1 = (h0 + ((kh - 1) * dh) as isize + 1).min(h as isize);
                while h0 < 0 {
                    h0 += dh as isize;
                }
                let mut w0 = (xo * g.stride.1) as isize - g.pad.1 as isize;
                let w1 = (w0 + ((kw - 1) * dw) as isize + 1).min(w as isize);
                while w0 < 0 {
                    w0 += dw as isize;
                }
                let mut best = f64::NEG_INFINITY;
                let mut arg = h0 as i64 * w as i64 + w0 as i64;
                let mut iy = h0;
                while iy < h1 {
                    let mut ix = w0;
                    while ix < w1 {
                        let v = x[(plane * h + iy as usize) * w + ix as usize];
                        if v > best || v.is_nan() {
                            best = v;
                            arg = iy as i64 * w as i64 + ix as i64;
                        }
                        ix += dw as isize;
                    }
                    iy += dh as isize;
                }
                res.push((best, arg));
            }
        }
    }
    res
}

/// Average pooling of row-major `x` (`[N, C, H, W]`; the dilation of `g` is ignored) with
/// PyTorch's divisors: `divisor_override` when given; else with `count_include_pad` the
/// window clipped to the padded input, without it the window clipped to the input. A window
/// with no input position gives 0. The sum is taken in f64 in row order.
///
/// # Panics
///
/// If the geometry has no output or `x` is too short.
pub fn avg_pool2d(
    x: &[f64],
    g: &Pool2d,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Vec<f64> {
    let (n, c, h, w) = g.nchw;
    let Some((oh, ow)) = g.out() else {
        panic!("avg_pool2d reference: {g:?} has no output");
    };
    let (ph, pw) = (g.pad.0 as isize, g.pad.1 as isize);
    let (hi, wi) = (h as isize, w as isize);
    let mut res = Vec::with_capacity(n * c * oh * ow);
    for plane in 0..n * c {
        for y in 0..oh {
            for xo in 0..ow {
                let h0 = (y * g.stride.0) as isize - ph;
                let h1 = (h0 + g.kernel.0 as isize).min(hi + ph);
                let w0 = (xo * g.stride.1) as isize - pw;
                let w1 = (w0 + g.kernel.1 as isize).min(wi + pw);
                let pool_size = (h1 - h0) * (w1 - w0);
                let (a0, a1) = (h0.max(0), h1.min(hi));
                let (b0, b1) = (w0.max(0), w1.min(wi));
                if a0 >= a1 || b0 >= b1 {
                    res.push(0.0);
                    continue;
                }
                let mut sum = 0.0;
                for iy in a0..a1 {
                    for ix in b0..b1 {
                        sum += x[(plane * h + iy as usize) * w + ix as usize];
                    }
                }
                let div = match divisor_override {
                    Some(d) => d as f64,
                    None if count_include_pad => pool_size as f64,
                    None => ((a1 - a0) * (b1 - b0)) as f64,
                };
                res.push(sum / div);
            }
        }
    }
    res
}
