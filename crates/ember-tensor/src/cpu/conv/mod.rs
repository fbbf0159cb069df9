//! CPU 2-D convolutions: forward, backward data and backward weight, in f32, bf16, f16 and
//! f64. Where oneDNN is loaded (Note [oneDNN at run time] in `onednn.rs`), f32 and bf16
//! run on its kernels, as PyTorch's do; everywhere else, and for what oneDNN refuses, the
//! portable kernels here: products on `ember-gemm` with im2col / col2im as their operands
//! (`im2col.rs`, Note [Convolutions as products without a scatter]) and direct kernels for
//! one input channel per group (`depthwise.rs`). docs/convolutions.md says why.

mod depthwise;
mod dnnl;
mod geometry;
mod im2col;
mod onednn;
mod scratch;

pub(crate) use onednn::onednn_info;

use geometry::{Elem, Geo, Strided, corrupt};
use scratch::Scratch;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::Conv2dParams;
use crate::storage::CpuStorage;

fn check_layout(len: usize, l: &Layout, rank: usize) -> Result<()> {
    if l.rank() != rank || (l.numel() > 0 && l.max_extent() > len) {
        return Err(corrupt());
    }
    Ok(())
}

fn dims4(l: &Layout) -> Result<[usize; 4]> {
    l.dims().try_into().map_err(|_| corrupt())
}

/// The elements of `l` over `data` in row-major order: borrowed where the layout is
/// contiguous, else packed into scratch from the caching allocator.
enum Dense<'a, T> {
    Borrowed(&'a [T]),
    Packed(Scratch<T>),
}

impl<'a, T: Elem> Dense<'a, T> {
    fn of(data: &'a [T], l: &Layout) -> Result<Dense<'a, T>> {
        if let Some(s) = crate::cpu::contiguous_slice(data, l) {
            return Ok(Dense::Borrowed(s));
        }
        let n = l.numel();
        // SAFETY: the closure writes every element (the strided index yields `n` positions,
        // and any shortfall is filled with zero).
        let s = unsafe {
            Scratch::init_with(n, |out| {
                let mut it = l.strided_index();
                for d in out.iter_mut() {
                    let v = it
                        .next()
                        .and_then(|i| data.get(i).copied())
                        .unwrap_or(T::ZERO);
                    d.write(v);
                }
                Ok(())
            })
        }?;
        Ok(Dense::Packed(s))
    }

    fn get(&self) -> &[T] {
        match self {
            Dense::Borrowed(s) => s,
            Dense::Packed(s) => s.as_slice(),
        }
    }
}

/// One input channel per group, and more than one group: the direct kernels' case.
fn direct(geo: &Geo) -> bool {
    geo.cg == 1 && geo.g > 1
}

/// `[N, O, out_h, out_w]` = conv2d(x, w) + bias, contiguous, in `x`'s dtype.
pub(crate) fn conv2d(
    x: &CpuStorage,
    lx: &Layout,
    w: &CpuStorage,
    lw: &Layout,
    bias: Option<(&CpuStorage, &Layout)>,
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    match x.dtype() {
        DType::F32 => forward::<f32>(x, lx, w, lw, bias, p),
        DType::Bf16 => forward::<half::bf16>(x, lx, w, lw, bias, p),
        DType::F16 => forward::<half::f16>(x, lx, w, lw, bias, p),
        DType::F64 => forward::<f64>(x, lx, w, lw, bias, p),
        d => Err(TensorError::unsupported("conv2d", d)),
    }
}

fn forward<T: Elem>(
    x: &CpuStorage,
    lx: &Layout,
    w: &CpuStorage,
    lw: &Layout,
    bias: Option<(&CpuStorage, &Layout)>,
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    let (dx, dw) = (x.as_slice::<T>()?, w.as_slice::<T>()?);
    check_layout(dx.len(), lx, 4)?;
    check_layout(dw.len(), lw, 4)?;
    let geo = Geo::new(dims4(lx)?, dims4(lw)?, p);
    let b = match bias {
        Some((b, lb)) => {
            let db = b.as_slice::<T>()?;
            check_layout(db.len(), lb, 1)?;
            Some(Dense::of(db, lb)?)
        }
        None => None,
    };
    let b = b.as_ref().map(Dense::get);
    let wd = Dense::of(dw, lw)?;
    if onednn::wanted(T::DTYPE)? {
        let xd = Dense::of(dx, lx)?;
        if let Some(out) = onednn::forward(xd.get(), wd.get(), b, &geo)? {
            return Ok(out);
        }
    }
    if direct(&geo) {
        depthwise::forward(dx, Strided::of(lx), wd.get(), b, &geo)
    } else {
        im2col::forward(dx, Strided::of(lx), wd.get(), b, &geo)
    }
}

/// The input gradient `[N, C, H, W]` of conv2d from the output gradient and the weight.
pub(crate) fn conv2d_backward_data(
    dy: &CpuStorage,
    ly: &Layout,
    w: &CpuStorage,
    lw: &Layout,
    x_dims: [usize; 4],
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    match dy.dtype() {
        DType::F32 => backward_data::<f32>(dy, ly, w, lw, x_dims, p),
        DType::Bf16 => backward_data::<half::bf16>(dy, ly, w, lw, x_dims, p),
        DType::F16 => backward_data::<half::f16>(dy, ly, w, lw, x_dims, p),
        DType::F64 => backward_data::<f64>(dy, ly, w, lw, x_dims, p),
        d => Err(TensorError::unsupported("conv2d_backward_input", d)),
    }
}

fn backward_data<T: Elem>(
    dy: &CpuStorage,
    ly: &Layout,
    w: &CpuStorage,
    lw: &Layout,
    x_dims: [usize; 4],
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    let (g, dw) = (dy.as_slice::<T>()?, w.as_slice::<T>()?);
    check_layout(g.len(), ly, 4)?;
    check_layout(dw.len(), lw, 4)?;
    let geo = Geo::new(x_dims, dims4(lw)?, p);
    let gd = Dense::of(g, ly)?;
    let wd = Dense::of(dw, lw)?;
    if let Some(out) = onednn::backward_data(gd.get(), wd.get(), &geo)? {
        return Ok(out);
    }
    if direct(&geo) {
        depthwise::backward_data(gd.get(), wd.get(), &geo)
    } else {
        im2col::backward_data(gd.get(), wd.get(), &geo)
    }
}

/// The weight gradient `[O, C/groups, kH, kW]` of conv2d from the output gradient and the
/// input.
pub(crate) fn conv2d_backward_filter(
    dy: &CpuStorage,
    ly: &Layout,
    x: &CpuStorage,
    lx: &Layout,
    w_dims: [usize; 4],
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    match dy.dtype() {
        DType::F32 => backward_filter::<f32>(dy, ly, x, lx, w_dims, p),
        DType::Bf16 => backward_filter::<half::bf16>(dy, ly, x, lx, w_dims, p),
        DType::F16 => backward_filter::<half::f16>(dy, ly, x, lx, w_dims, p),
        DType::F64 => backward_filter::<f64>(dy, ly, x, lx, w_dims, p),
        d => Err(TensorError::unsupported("conv2d_backward_weight", d)),
    }
}

fn backward_filter<T: Elem>(
    dy: &CpuStorage,
    ly: &Layout,
    x: &CpuStorage,
    lx: &Layout,
    w_dims: [usize; 4],
    p: &Conv2dParams,
) -> Result<CpuStorage> {
    let (g, dx) = (dy.as_slice::<T>()?, x.as_slice::<T>()?);
    check_layout(g.len(), ly, 4)?;
    check_layout(dx.len(), lx, 4)?;
    let geo = Geo::new(dims4(lx)?, w_dims, p);
    let gd = Dense::of(g, ly)?;
    if onednn::wanted(T::DTYPE)? {
        let xd = Dense::of(dx, lx)?;
        if let Some(out) = onednn::backward_filter(xd.get(), gd.get(), &geo)? {
            return Ok(out);
        }
    }
    if direct(&geo) {
        depthwise::backward_filter(gd.get(), dx, Strided::of(lx), &geo)
    } else {
        im2col::backward_filter(gd.get(), dx, Strided::of(lx), &geo)
    }
}
