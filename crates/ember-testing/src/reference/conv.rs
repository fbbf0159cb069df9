//! 2-D convolution (PyTorch's `conv2d`, a cross-correlation) as its seven direct loops.

/// The geometry of a 2-D convolution over an `[N, C, H, W]` input and an
/// `[out_channels, C / groups, kH, kW]` weight. Padding may be asymmetric (`padding="same"`
/// with an even total puts the extra row and column after): `pad` is the padding before
/// (top, left) and `pad_total` the padding of both sides together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2d {
    /// The input's `(N, C, H, W)`.
    pub nchw: (usize, usize, usize, usize),
    /// Output channels.
    pub out_channels: usize,
    /// `(kH, kW)`.
    pub kernel: (usize, usize),
    /// `(sH, sW)`.
    pub stride: (usize, usize),
    /// Padding before: (top, left).
    pub pad: (usize, usize),
    /// Padding in total: (top + bottom, left + right).
    pub pad_total: (usize, usize),
    /// `(dH, dW)`.
    pub dilation: (usize, usize),
    /// Groups: `C` and `out_channels` are divisible by it.
    pub groups: usize,
}

impl Conv2d {
    /// A geometry with the same padding on both sides.
    #[allow(clippy::too_many_arguments)]
    pub fn symmetric(
        nchw: (usize, usize, usize, usize),
        out_channels: usize,
        kernel: (usize, usize),
        stride: (usize, usize),
        pad: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> Conv2d {
        Conv2d {
            nchw,
            out_channels,
            kernel,
            stride,
            pad,
            pad_total: (2 * pad.0, 2 * pad.1),
            dilation,
            groups,
        }
    }

    /// The output's `(OH, OW)`, or `None` where the dilated kernel is larger than the
    /// padded input.
    pub fn out(&self) -> Option<(usize, usize)> {
        let (_, _, h, w) = self.nchw;
        let eh = self.dilation.0 * (self.kernel.0 - 1) + 1;
        let ew = self.dilation.1 * (self.kernel.1 - 1) + 1;
        let (hp, wp) = (h + self.pad_total.0, w + self.pad_total.1);
        if hp < eh || wp < ew {
            return None;
        }
        Some(((hp - eh) / self.stride.0 + 1, (wp - ew) / self.stride.1 + 1))
    }
}

/// The convolution of row-major `x` (`[N, C, H, W]`) with `weight`
/// (`[out_channels, C / groups, kH, kW]`) and an optional `bias` (`[out_channels]`), in f64:
/// returns the `[N, out_channels, OH, OW]` values and, for each, the magnitude
/// `|bias| + Σ |x · w|` of its terms (an accumulation's error bound scales with it).
/// Padded positions contribute nothing.
///
/// # Panics
///
/// If the geometry has no output ([`Conv2d::out`] is `None`) or a slice is too short.
pub fn conv2d(p: &Conv2d, x: &[f64], weight: &[f64], bias: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
    let (n, c, h, w) = p.nchw;
    let Some((oh, ow)) = p.out() else {
        panic!("conv2d reference: {p:?} has no output");
    };
    let (kh, kw) = p.kernel;
    let (cg, og) = (c / p.groups, p.out_channels / p.groups);
    let mut out = Vec::with_capacity(n * p.out_channels * oh * ow);
    let mut mag = Vec::with_capacity(out.capacity());
    for s in 0..n {
        for o in 0..p.out_channels {
            let g = o / og;
            for y in 0..oh {
                for xo in 0..ow {
                    let b = bias.map_or(0.0, |b| b[o]);
                    let (mut acc, mut m) = (b, b.abs());
                    for ci in 0..cg {
                        let ch = g * cg + ci;
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy =
                                    (y * p.stride.0 + i * p.dilation.0) as isize - p.pad.0 as isize;
                                let ix = (xo * p.stride.1 + j * p.dilation.1) as isize
                                    - p.pad.1 as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xv = x[((s * c + ch) * h + iy as usize) * w + ix as usize];
                                let v = xv * weight[((o * cg + ci) * kh + i) * kw + j];
                                acc += v;
                                m += v.abs();
                            }
                        }
                    }
                    out.push(acc);
                    mag.push(m);
                }
            }
        }
    }
    (out, mag)
}
