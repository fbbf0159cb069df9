//! `conv2d`, `max_pool2d`, `avg_pool2d` with backward.
//!
//! Convolution backward is `ember-tensor`'s `conv2d_backward_input` and
//! `conv2d_backward_weight` (cuDNN on CUDA where it can run, else composed from primitives:
//! Note [Convolution backward] in `crates/ember-tensor/src/ops/conv_grad.rs`); the bias
//! gradient is `g` summed over batch and space. Pooling scatters the gradient
//! to the positions each output read: the argmax for max pooling, every window element
//! (divided by the forward's divisor) for average pooling. All of it is `ember-tensor` ops,
//! so it runs on every device.

use crate::{AvgPool2dOptions, Conv2dOptions, Device, MaxPool2dOptions, RawTensor as Raw};

use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, Saved, maybe_record};
use crate::autograd::mode::autocast_inputs;
use crate::ops::bw1;
use crate::tensor::Tensor;

fn i64_tensor(v: Vec<i64>, device: Device) -> Result<Raw> {
    let n = v.len();
    Ok(Raw::from_vec(v, [n], Device::Cpu)?.to_device(device)?)
}

impl Tensor {
    /// 2-D convolution (`torch.nn.functional.conv2d`): input `[N, C, H, W]` (or unbatched
    /// `[C, H, W]`), weight `[O, C/groups, kH, kW]`, optional bias `[O]`. Backward as in
    /// Note [Convolution backward].
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(
            &crate::op_table::conv2d,
            [self, weight].into_iter().chain(bias),
        )? {
            return c[0].conv2d(&c[1], c.get(2), opts);
        }
        let (x, wt) = (self.raw(), weight.raw());
        let b = bias.map(Tensor::raw);
        let y = x.conv2d(&wt, b.as_ref(), opts)?;
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let batched = x.rank() == 4;
        let opts = *opts;
        maybe_record("ConvolutionBackward0", y.clone(), &inputs, || {
            let need = (
                self.requires_grad(),
                weight.requires_grad(),
                bias.is_some_and(Tensor::requires_grad),
            );
            let has_bias = bias.is_some();
            let sx = Saved::of("ConvolutionBackward0", self)?;
            let sw = Saved::of("ConvolutionBackward0", weight)?;
            let f: BackwardFn = Box::new(move |g| {
                let x = sx.get()?;
                let wt = sw.get()?;
                let x4 = if batched { x.clone() } else { x.unsqueeze(0)? };
                let g4 = if batched { g.clone() } else { g.unsqueeze(0)? };
                let x_dims: [usize; 4] = [x4.dims()[0], x4.dims()[1], x4.dims()[2], x4.dims()[3]];
                let w_dims: [usize; 4] = [wt.dims()[0], wt.dims()[1], wt.dims()[2], wt.dims()[3]];
                let gx = if need.0 {
                    let gx = g4.conv2d_backward_input(x_dims, &wt, &opts)?;
                    Some(if batched { gx } else { gx.squeeze_dim(0)? })
                } else {
                    None
                };
                let gw = if need.1 {
                    Some(g4.conv2d_backward_weight(&x4, w_dims, &opts)?)
                } else {
                    None
                };
                let mut r = vec![gx, gw];
                if has_bias {
                    r.push(if need.2 {
                        Some(g4.sum([0usize, 2, 3])?)
                    } else {
                        None
                    });
                }
                Ok(r)
            });
            Ok(f)
        })
    }

    /// 2-D max pooling; the gradient goes to the position each output took.
    pub fn max_pool2d(&self, opts: &MaxPool2dOptions) -> Result<Tensor> {
        if !crate::autograd::graph::needs_grad(&[self]) {
            return Ok(Tensor::wrap(self.raw().max_pool2d(opts)?));
        }
        Ok(self.max_pool2d_with_indices(opts)?.0)
    }

    /// 2-D max pooling returning the flat `H·W` index of each maximum too.
    pub fn max_pool2d_with_indices(&self, opts: &MaxPool2dOptions) -> Result<(Tensor, Tensor)> {
        let (y, idx) = self.raw().max_pool2d_with_indices(opts)?;
        let i = idx.clone();
        let y = self.pool_record("MaxPool2DWithIndicesBackward0", y, move |g, shape| {
            let (p, hw) = planes(shape);
            let l = g.numel() / p.max(1);
            let z = Raw::zeros([p, hw], (g.device(), g.dtype()))?;
            let r = z.scatter_add(1, &i.reshape([p, l])?, &g.reshape([p, l])?)?;
            Ok(r.reshape(shape)?)
        })?;
        Ok((y, Tensor::wrap(idx)))
    }

    /// 2-D average pooling; each output's gradient is spread over its window, divided as
    /// the forward divided.
    pub fn avg_pool2d(&self, opts: &AvgPool2dOptions) -> Result<Tensor> {
        let x = self.raw();
        let y = x.avg_pool2d(opts)?;
        let o = *opts;
        self.pool_record("AvgPool2DBackward0", y, move |g, shape| {
            let (p, hw) = planes(shape);
            let r = shape.rank();
            let (h, w) = (shape.dims()[r - 2], shape.dims()[r - 1]);
            let gd = g.dims();
            let out = (gd[gd.len() - 2], gd[gd.len() - 1]);
            let (src, dst, coef) = avg_pairs(&o, (h, w), out);
            let dev = g.device();
            let e = src.len();
            let src = i64_tensor(src, dev)?;
            let dst = i64_tensor(dst, dev)?;
            let coef = Raw::from_vec(coef, [1, e], Device::Cpu)?
                .to_dtype(g.dtype())?
                .to_device(dev)?;
            let l = out.0 * out.1;
            let vals = g.reshape([p, l])?.index_select(1, &src)?.mul(&coef)?;
            let z = Raw::zeros([p, hw], (dev, g.dtype()))?;
            let full = dst.unsqueeze(0)?.expand([p, e])?;
            Ok(z.scatter_add(1, &full, &vals)?.reshape(shape)?)
        })
    }

    fn pool_record(
        &self,
        name: &'static str,
        y: Raw,
        f: impl Fn(&Raw, &crate::Shape) -> Result<Raw> + Send + 'static,
    ) -> Result<Tensor> {
        let shape = self.raw().shape().clone();
        maybe_record(name, y, &[self], || Ok(bw1(move |g| f(g, &shape))))
    }
}

/// `(planes, H·W)` of a `[..., H, W]` shape.
fn planes(shape: &crate::Shape) -> (usize, usize) {
    let d = shape.dims();
    let r = d.len();
    let hw = d[r - 2] * d[r - 1];
    (d[..r - 2].iter().product(), hw)
}

/// For average pooling: (output position, input position, 1/divisor) for every window
/// element inside the input, with PyTorch's window and divisor rules.
fn avg_pairs(
    o: &AvgPool2dOptions,
    (h, w): (usize, usize),
    out: (usize, usize),
) -> (Vec<i64>, Vec<i64>, Vec<f64>) {
    let (kh, kw) = (o.kernel.0 as i64, o.kernel.1 as i64);
    let s = o.stride.unwrap_or(o.kernel);
    let (sh, sw) = (s.0 as i64, s.1 as i64);
    let (ph, pw) = (o.padding.0 as i64, o.padding.1 as i64);
    let (hi, wi) = (h as i64, w as i64);
    let (mut src, mut dst, mut coef) = (Vec::new(), Vec::new(), Vec::new());
    for oh in 0..out.0 as i64 {
        for ow in 0..out.1 as i64 {
            let (mut h0, mut w0) = (oh * sh - ph, ow * sw - pw);
            let (mut h1, mut w1) = ((h0 + kh).min(hi + ph), (w0 + kw).min(wi + pw));
            let pool = (h1 - h0) * (w1 - w0);
            h0 = h0.max(0);
            w0 = w0.max(0);
            h1 = h1.min(hi);
            w1 = w1.min(wi);
            let div = match o.divisor_override {
                Some(d) => d,
                None if o.count_include_pad => pool,
                None => (h1 - h0) * (w1 - w0),
            };
            if div <= 0 {
                continue;
            }
            for r in h0..h1 {
                for q in w0..w1 {
                    src.push(oh * out.1 as i64 + ow);
                    dst.push(r * wi + q);
                    coef.push(1.0 / div as f64);
                }
            }
        }
    }
    (src, dst, coef)
}
