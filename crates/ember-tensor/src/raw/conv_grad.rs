//! The two gradients of `conv2d`, as `torch.nn.grad.conv2d_input` / `conv2d_weight`:
//! [`Tensor::conv2d_backward_input`] and [`Tensor::conv2d_backward_weight`]. Autograd's
//! `ConvolutionBackward0` calls them.
//!
//! Each asks the backend for a kernel first (the CPU's: Note [Convolutions as products
//! without a scatter], oneDNN where it loads; CUDA with cuDNN: Note [Convolutions on
//! cuDNN]); where there is none (CUDA without cuDNN or for a shape cuDNN refuses) it
//! composes the gradient from primitives.
//!
//! Note [Convolution backward]: the composite backward gathers the input patches with one `index_select` over the zero-padded input (the
//! `im2col` matrix, indices built on the host), takes the weight gradient as
//! `Σ_n g_n · colsᵀ_n` per group and the input gradient as `wᵀ · g` scattered back with
//! `scatter_add` over the same indices (`col2im`). All of it is tensor ops, so it runs on
//! every device.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::params::Conv2dParams;
use crate::raw::conv::{Conv2dOptions, geometry};
use crate::raw::{RawTensor, same_device};
use crate::shape::Shape;
use crate::storage::read_many;

/// Geometry of the composite backward: the padded buffer `[C, hb, wb]` patches come from.
#[derive(Clone, Copy)]
struct Padded {
    c: usize,
    kh: usize,
    kw: usize,
    hb: usize,
    wb: usize,
}

impl Padded {
    fn new(x: [usize; 4], w: [usize; 4], p: &Conv2dParams) -> Padded {
        let (eh, ew) = ((w[2] - 1) * p.dilation.0 + 1, (w[3] - 1) * p.dilation.1 + 1);
        Padded {
            c: x[1],
            kh: w[2],
            kw: w[3],
            hb: ((p.out.0.max(1) - 1) * p.stride.0 + eh).max(p.pad.0 + x[2]),
            wb: ((p.out.1.max(1) - 1) * p.stride.1 + ew).max(p.pad.1 + x[3]),
        }
    }

    /// Flat positions in the `[C, hb, wb]` padded buffer, ordered `[C, kh, kw, oh, ow]`.
    fn im2col_index(&self, p: &Conv2dParams) -> Vec<i64> {
        let mut v = Vec::with_capacity(self.c * self.kh * self.kw * p.out.0 * p.out.1);
        for c in 0..self.c {
            for i in 0..self.kh {
                for j in 0..self.kw {
                    for oh in 0..p.out.0 {
                        for ow in 0..p.out.1 {
                            let r = oh * p.stride.0 + i * p.dilation.0;
                            let q = ow * p.stride.1 + j * p.dilation.1;
                            v.push(((c * self.hb + r) * self.wb + q) as i64);
                        }
                    }
                }
            }
        }
        v
    }

    fn index(&self, p: &Conv2dParams, like: &RawTensor) -> Result<RawTensor> {
        let v = self.im2col_index(p);
        let n = v.len();
        RawTensor::from_vec(v, [n], crate::Device::Cpu)?.to_device(like.device())
    }
}

fn dims4(op: &'static str, what: &str, d: &[usize]) -> Result<[usize; 4]> {
    d.try_into().map_err(|_| TensorError::ShapeMismatch {
        op,
        msg: format!("expected a 4-D {what}, but got shape {d:?}"),
    })
}

/// The checks both gradients share: devices, dtypes, and `grad`'s shape against the
/// forward's output shape. Returns the geometry.
fn check(
    op: &'static str,
    grad: &RawTensor,
    other: &RawTensor,
    x: [usize; 4],
    w: [usize; 4],
    opts: &Conv2dOptions,
) -> Result<Conv2dParams> {
    same_device(&[grad, other])?;
    if grad.dtype() != other.dtype() {
        return Err(TensorError::invalid(
            op,
            format!(
                "grad_output dtype {} and {} should be the same",
                grad.dtype(),
                other.dtype()
            ),
        ));
    }
    if !matches!(
        grad.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::Bf16
    ) {
        return Err(TensorError::UnsupportedDType {
            op,
            dtype: grad.dtype(),
            hint: "convolution needs a floating dtype; convert with to_dtype(DType::F32)",
        });
    }
    let p = geometry(
        &Shape::from(x.to_vec()),
        &Shape::from(w.to_vec()),
        x,
        w,
        opts,
    )?;
    let expected = [x[0], w[0], p.out.0, p.out.1];
    if grad.dims() != expected {
        return Err(TensorError::ShapeMismatch {
            op,
            msg: format!(
                "expected grad_output of shape {expected:?} for input {x:?} and weight {w:?}, but got {}",
                grad.shape()
            ),
        });
    }
    Shape::from(x.to_vec()).checked_numel(op)?;
    Shape::from(w.to_vec()).checked_numel(op)?;
    Ok(p)
}

impl RawTensor {
    /// The gradient of `conv2d` with respect to its input (`torch.nn.grad.conv2d_input`):
    /// `self` is the output gradient `[N, O, H_out, W_out]`, `input_dims` the input's
    /// `[N, C, H, W]`, `weight` `[O, C/groups, kH, kW]`; options as the forward's.
    ///
    /// ```
    /// use ember_tensor::{Conv2dOptions, Tensor};
    /// let w = Tensor::ones([1, 1, 2, 2], ())?;
    /// let g = Tensor::ones([1, 1, 2, 2], ())?;
    /// let gx = ember_tensor::aten::conv2d_backward_input(&g, [1, 1, 3, 3], &w, &Conv2dOptions::new())?;
    /// assert_eq!(gx.to_vec::<f32>()?, vec![1., 2., 1., 2., 4., 2., 1., 2., 1.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn conv2d_backward_input(
        &self,
        input_dims: [usize; 4],
        weight: &RawTensor,
        opts: &Conv2dOptions,
    ) -> Result<RawTensor> {
        const OP: &str = "conv2d_backward_input";
        let w = dims4(OP, "weight", weight.dims())?;
        let p = check(OP, self, weight, input_dims, w, opts)?;
        let (ly, lw) = (self.layout().clone(), weight.layout().clone());
        let native = read_many(&[self.cell(), weight.cell()], |s| {
            s[0].conv2d_backward_data(&ly, s[1], &lw, input_dims, &p)
        })?;
        if let Some(s) = native {
            return Ok(RawTensor::from_storage(s, input_dims.to_vec()));
        }
        // wᵀ · g per group, then col2im.
        let [n, c, h, wd] = input_dims;
        let (groups, o) = (p.groups, w[0]);
        let (cg, og) = (c / groups, o / groups);
        let l = p.out.0 * p.out.1;
        let geo = Padded::new(input_dims, w, &p);
        let idx = geo.index(&p, self)?;
        let m = idx.numel();
        let g4 = self.reshape([n, groups, og, l])?;
        let wg = weight
            .reshape([groups, og, cg * w[2] * w[3]])?
            .transpose(1, 2)?;
        let cols = wg.matmul(&g4)?.reshape([n, m])?;
        let full = idx.unsqueeze(0)?.expand([n, m])?;
        let z = RawTensor::zeros([n, c * geo.hb * geo.wb], (self.device(), self.dtype()))?;
        let padded = z
            .scatter_add(1, &full, &cols)?
            .reshape([n, c, geo.hb, geo.wb])?;
        padded
            .narrow(2, p.pad.0, h)?
            .narrow(3, p.pad.1, wd)?
            .contiguous()
    }

    /// The gradient of `conv2d` with respect to its weight (`torch.nn.grad.conv2d_weight`):
    /// `self` is the output gradient `[N, O, H_out, W_out]`, `input` the forward's input
    /// `[N, C, H, W]`, `weight_dims` `[O, C/groups, kH, kW]`; options as the forward's.
    ///
    /// ```
    /// use ember_tensor::{Conv2dOptions, Tensor};
    /// let x = Tensor::arange(0f32, 9., ())?.reshape([1, 1, 3, 3])?;
    /// let g = Tensor::ones([1, 1, 2, 2], ())?;
    /// let gw = ember_tensor::aten::conv2d_backward_weight(&g, &x, [1, 1, 2, 2], &Conv2dOptions::new())?;
    /// assert_eq!(gw.to_vec::<f32>()?, vec![8., 12., 20., 24.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn conv2d_backward_weight(
        &self,
        input: &RawTensor,
        weight_dims: [usize; 4],
        opts: &Conv2dOptions,
    ) -> Result<RawTensor> {
        const OP: &str = "conv2d_backward_weight";
        let x = dims4(OP, "input", input.dims())?;
        let p = check(OP, self, input, x, weight_dims, opts)?;
        let (ly, lx) = (self.layout().clone(), input.layout().clone());
        let native = read_many(&[self.cell(), input.cell()], |s| {
            s[0].conv2d_backward_filter(&ly, s[1], &lx, weight_dims, &p)
        })?;
        if let Some(s) = native {
            return Ok(RawTensor::from_storage(s, weight_dims.to_vec()));
        }
        let [n, c, h, wd] = x;
        let [o, cg, kh, kw] = weight_dims;
        let groups = p.groups;
        let l = p.out.0 * p.out.1;
        let geo = Padded::new(x, weight_dims, &p);
        let idx = geo.index(&p, self)?;
        let xp = RawTensor::zeros([n, c, geo.hb, geo.wb], (input.device(), input.dtype()))?;
        xp.narrow(2, p.pad.0, h)?
            .narrow(3, p.pad.1, wd)?
            .copy_(input)?;
        let cols = xp
            .reshape([n, c * geo.hb * geo.wb])?
            .index_select(1, &idx)?
            .reshape([n, groups, cg * kh * kw, l])?;
        let g4 = self.reshape([n, groups, o / groups, l])?;
        let gw = g4.matmul(&cols.transpose(2, 3)?)?.sum(0)?;
        gw.reshape([o, cg, kh, kw])
    }
}
