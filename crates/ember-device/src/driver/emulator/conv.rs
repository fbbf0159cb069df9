//! The emulator's convolution: cuDNN's three directions as one direct loop nest on the CPU,
//! accumulating in f64 and rounding once into the written tensor (so it is a reference
//! rather than a fast kernel, as `gemm.rs` is for cuBLAS). Strided `x`/`y` are gathered into
//! dense f64 arrays first, so the written tensor may alias nothing it reads. Every tensor's
//! extent is bounds-checked through the address translation before any read or write.

use crate::driver::{ConvDesc, ConvDirection, ConvProblem, DevicePtr, GemmType};
use crate::error::{DeviceError, Result};

use super::gemm::{element_size, read, write};
use super::memory::MemoryState;

fn invalid(call: &'static str, detail: String) -> DeviceError {
    DeviceError::Driver {
        call,
        code: "CUDNN_STATUS_BAD_PARAM".into(),
        detail,
    }
}

/// Elements spanned by a tensor with these dims and strides (0 when empty).
fn extent(dims: [usize; 4], strides: [usize; 4]) -> Option<usize> {
    if dims.contains(&0) {
        return Some(0);
    }
    dims.iter().zip(strides).try_fold(1usize, |acc, (&d, s)| {
        acc.checked_add((d - 1).checked_mul(s)?)
    })
}

fn contiguous(dims: [usize; 4]) -> [usize; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

/// The flat positions of a tensor's elements in NCHW order, given its strides.
fn positions(dims: [usize; 4], strides: [usize; 4]) -> Vec<usize> {
    let mut v = Vec::with_capacity(dims.iter().product());
    for a in 0..dims[0] {
        for b in 0..dims[1] {
            for c in 0..dims[2] {
                for d in 0..dims[3] {
                    v.push(a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3]);
                }
            }
        }
    }
    v
}

/// A tensor's elements in NCHW order as f64.
fn gather(
    mem: &MemoryState,
    call: &'static str,
    dtype: GemmType,
    ptr: DevicePtr,
    dims: [usize; 4],
    strides: [usize; 4],
) -> Result<Vec<f64>> {
    let span = extent(dims, strides).ok_or_else(|| invalid(call, "tensor too large".into()))?;
    if span == 0 {
        return Ok(Vec::new());
    }
    let raw = read(dtype, mem.slice(call, ptr, span * element_size(dtype))?);
    Ok(positions(dims, strides)
        .into_iter()
        .map(|i| raw[i])
        .collect())
}

/// `out = alpha · acc + beta · out` at the tensor's strided positions.
#[allow(clippy::too_many_arguments)]
fn scatter(
    mem: &mut MemoryState,
    call: &'static str,
    dtype: GemmType,
    ptr: DevicePtr,
    dims: [usize; 4],
    strides: [usize; 4],
    acc: &[f64],
    (alpha, beta): (f64, f64),
) -> Result<()> {
    let span = extent(dims, strides).ok_or_else(|| invalid(call, "tensor too large".into()))?;
    if span == 0 {
        return Ok(());
    }
    let size = element_size(dtype);
    let out = mem.slice_mut(call, ptr, span * size)?;
    for (&at, &v) in positions(dims, strides).iter().zip(acc) {
        let cell = &mut out[at * size..(at + 1) * size];
        let value = if beta == 0.0 {
            alpha * v
        } else {
            alpha * v + beta * read(dtype, cell)[0]
        };
        write(dtype, value, cell);
    }
    Ok(())
}

/// Check the problem's geometry as cuDNN does: groups divide the channels, the filter has
/// `c / groups` channels, `y`'s size follows from the others, strides cover their dims.
pub(crate) fn validate(call: &'static str, p: &ConvProblem) -> Result<()> {
    let [n, c, h, w] = p.x_dims;
    let [k, cg, r, s] = p.w_dims;
    let [yn, yk, yp, yq] = p.y_dims;
    let positive = p.groups > 0
        && p.stride.0 > 0
        && p.stride.1 > 0
        && p.dilation.0 > 0
        && p.dilation.1 > 0
        && p.x_dims.iter().chain(&p.w_dims).all(|&d| d > 0);
    if !positive {
        return Err(invalid(
            call,
            format!("groups, stride, dilation and every dimension must be positive: {p:?}"),
        ));
    }
    if c % p.groups != 0 || k % p.groups != 0 || cg * p.groups != c {
        return Err(invalid(
            call,
            format!(
                "filter {:?} does not fit input {:?} with {} groups",
                p.w_dims, p.x_dims, p.groups
            ),
        ));
    }
    let out = |len: usize, pad: usize, k: usize, d: usize, st: usize| {
        let ext = d * (k - 1) + 1;
        (len + 2 * pad).checked_sub(ext).map(|v| v / st + 1)
    };
    let expected = (
        out(h, p.pad.0, r, p.dilation.0, p.stride.0),
        out(w, p.pad.1, s, p.dilation.1, p.stride.1),
    );
    if yn != n || yk != k || expected != (Some(yp), Some(yq)) {
        return Err(invalid(
            call,
            format!(
                "output {:?} does not match input {:?}, filter {:?}, pad {:?}, stride {:?}, dilation {:?} (expected spatial {expected:?})",
                p.y_dims, p.x_dims, p.w_dims, p.pad, p.stride, p.dilation
            ),
        ));
    }
    Ok(())
}

/// Run one convolution on emulated memory (any algorithm: they all compute the same here).
pub(crate) fn conv(mem: &mut MemoryState, call: &'static str, desc: &ConvDesc) -> Result<()> {
    let p = &desc.problem;
    let [n, c, h, w] = p.x_dims;
    let [k, cg, r, s] = p.w_dims;
    let [_, _, op, oq] = p.y_dims;
    let wstr = contiguous(p.w_dims);
    let b = desc.buffers;
    let dt = p.dtype;
    let (x, wt, y) = match p.direction {
        ConvDirection::Forward => (
            gather(mem, call, dt, b.x, p.x_dims, p.x_strides)?,
            gather(mem, call, dt, b.w, p.w_dims, wstr)?,
            Vec::new(),
        ),
        ConvDirection::BackwardData => (
            Vec::new(),
            gather(mem, call, dt, b.w, p.w_dims, wstr)?,
            gather(mem, call, dt, b.y, p.y_dims, p.y_strides)?,
        ),
        ConvDirection::BackwardFilter => (
            gather(mem, call, dt, b.x, p.x_dims, p.x_strides)?,
            Vec::new(),
            gather(mem, call, dt, b.y, p.y_dims, p.y_strides)?,
        ),
    };
    let [nx, nw, ny] = p.numels();
    let mut acc = vec![
        0.0f64;
        match p.direction {
            ConvDirection::Forward => ny,
            ConvDirection::BackwardData => nx,
            ConvDirection::BackwardFilter => nw,
        }
    ];
    let kg = k / p.groups;
    for ni in 0..n {
        for ki in 0..k {
            let g = ki / kg;
            for pi in 0..op {
                for qi in 0..oq {
                    let yi = ((ni * k + ki) * op + pi) * oq + qi;
                    for ci in 0..cg {
                        let xc = g * cg + ci;
                        for ri in 0..r {
                            let ih = (pi * p.stride.0 + ri * p.dilation.0).wrapping_sub(p.pad.0);
                            if ih >= h {
                                continue;
                            }
                            for si in 0..s {
                                let iw =
                                    (qi * p.stride.1 + si * p.dilation.1).wrapping_sub(p.pad.1);
                                if iw >= w {
                                    continue;
                                }
                                let xi = ((ni * c + xc) * h + ih) * w + iw;
                                let wi = ((ki * cg + ci) * r + ri) * s + si;
                                match p.direction {
                                    ConvDirection::Forward => acc[yi] += x[xi] * wt[wi],
                                    ConvDirection::BackwardData => acc[xi] += y[yi] * wt[wi],
                                    ConvDirection::BackwardFilter => acc[wi] += y[yi] * x[xi],
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let blend = (desc.alpha, desc.beta);
    match p.direction {
        ConvDirection::Forward => scatter(mem, call, dt, b.y, p.y_dims, p.y_strides, &acc, blend),
        ConvDirection::BackwardData => {
            scatter(mem, call, dt, b.x, p.x_dims, p.x_strides, &acc, blend)
        }
        ConvDirection::BackwardFilter => scatter(mem, call, dt, b.w, p.w_dims, wstr, &acc, blend),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_and_positions_follow_strides() {
        assert_eq!(extent([2, 3, 4, 5], contiguous([2, 3, 4, 5])), Some(120));
        assert_eq!(extent([2, 0, 4, 5], [1, 1, 1, 1]), Some(0));
        // A channels-last view: strides [h·w·c, 1, w·c, c].
        assert_eq!(extent([1, 2, 2, 2], [8, 1, 4, 2]), Some(8));
        assert_eq!(positions([1, 2, 1, 2], [4, 1, 4, 2]), vec![0, 2, 1, 3]);
    }
}
