//! conv2d on cuDNN: forward, input gradient and weight gradient through the driver seam's
//! convolution calls, with algorithm choice, caching and workspace. See Note [Convolutions
//! on cuDNN].
//!
//! Note [Convolutions on cuDNN]:
//!
//! A CUDA conv2d (and, from autograd, its two gradients) first asks whether cuDNN can take
//! it, and otherwise runs the im2col + GEMM path (`nn.rs`, `kernels/conv.cu`) for the
//! forward and the composite backward of `ops/conv_grad.rs`:
//!
//! 1. cuDNN is used when `backends::cudnn::enabled()` and the driver reports a usable
//!    library for the device (`Driver::cudnn_version`: the real driver loads `libcudnn` on
//!    first use and remembers why not; the emulator can pretend it is absent). Otherwise the
//!    im2col path runs silently, and `backends::cudnn::conv_path` (`ember info`) says why.
//! 2. The convolution becomes a `ConvProblem` (Note [cuDNN convolutions through the seam]).
//!    Strided inputs are passed with their strides; inputs with a broadcast (stride-0)
//!    dimension and non-contiguous weights are copied first. A problem cuDNN cannot express
//!    (asymmetric padding: `padding="same"` with an even kernel extent) or that it refuses
//!    (an error or no algorithm from `conv_algorithms`, e.g. a tensor over 2³¹ − 1
//!    elements, or no deterministic algorithm when `deterministic` is on) falls back to
//!    im2col: recorded in `backends::cudnn::fallbacks()`, and the first one printed on
//!    stderr, once per process. Empty tensors take the im2col path (nothing to compute).
//!    Except on a real GPU under `EMBER_CUDNN_API=graph`: there an error of the algorithm
//!    query (a problem cuDNN's graph API cannot plan) is conv2d's error, not a fallback, so
//!    that a GPU session's tests fail when the graph API does (Note [cuDNN's graph API]).
//! 3. Algorithms: with `benchmark` off, cuDNN's heuristics rank them; with it on, every
//!    algorithm is run and timed once on scratch outputs (`cudnnFind*Ex`, with as much
//!    workspace as the largest heuristic candidate wants, or none if that cannot be had)
//!    and ranked by time. With `deterministic` on, non-deterministic ones are dropped. The
//!    ranked list is cached per (device, problem, benchmark, deterministic) for the process,
//!    so a shape is searched once (PyTorch's `BenchmarkCache`); the problem includes
//!    `allow_tf32`, so flipping it searches again.
//! 4. Running: the first candidate whose workspace the device's caching allocator can
//!    provide runs; an out-of-memory on the workspace moves to the next candidate (as
//!    PyTorch's `try_all`), and when every candidate's workspace fails the last
//!    out-of-memory error is returned. The workspace is a block of the caching allocator on
//!    the current stream, freed (cached) as soon as the call is enqueued: stream order keeps
//!    it valid for the call.
//! 5. Bias: every call runs with alpha = 1 and beta = 0, and a forward's bias is added to
//!    its output afterwards, in place (one broadcast add), as PyTorch's cuDNN path does
//!    (`output.add_(reshape_bias(...))`). Blending into an output pre-filled with the bias
//!    (beta = 1) would move the same bytes, but on the graph API beta is part of the graph:
//!    a second graph to plan per shape, whose engines need not accept beta = 1 nor match
//!    the workspace and determinism of the plan chosen from the beta = 0 list.
//!
//! The emulator serves the same calls with a CPU convolution (Note [Emulated cuDNN
//! algorithms]), so every test of conv2d on the emulated device runs this file.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ember_device::driver::real::CudnnApi;
use ember_device::driver::{
    ConvAlgoPerf, ConvBuffers, ConvDesc, ConvDirection, ConvProblem, ConvSearch, DevicePtr,
    GemmType, byte_alignment,
};
use ember_memory::Allocation;

use super::ops::{binary_inplace, cast, gemm_type};
use super::{Ctx, CudaStorage};
use crate::backends::cudnn as settings;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::op;
use crate::params::Conv2dParams;

/// Most distinct fallback reasons kept for `backends::cudnn::fallbacks`.
const MAX_FALLBACKS: usize = 32;

static FALLBACKS: Mutex<Vec<String>> = Mutex::new(Vec::new());

type CacheKey = (usize, ConvProblem, bool, bool);

fn cache() -> &'static Mutex<HashMap<CacheKey, Vec<ConvAlgoPerf>>> {
    static CACHE: std::sync::OnceLock<Mutex<HashMap<CacheKey, Vec<ConvAlgoPerf>>>> =
        std::sync::OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// `backends::cudnn::conv_path`.
pub(crate) fn conv_path(device: usize) -> (&'static str, String) {
    if !settings::enabled() {
        return (
            "im2col",
            "cuDNN is disabled (backends::cudnn::set_enabled(false))".into(),
        );
    }
    let version = ember_device::cuda::driver().and_then(|d| d.cudnn_version(device));
    match version {
        Ok(v) => (
            "cudnn",
            format!("cuDNN {}.{}.{}", v / 10000, (v / 100) % 100, v % 100),
        ),
        Err(e) => ("im2col", e.to_string()),
    }
}

/// `backends::cudnn::fallbacks`.
pub(crate) fn cudnn_fallbacks() -> Vec<String> {
    FALLBACKS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Record that cuDNN could not run a convolution (Note [Convolutions on cuDNN], step 2).
fn fall_back(what: String) {
    let mut list = FALLBACKS.lock().unwrap_or_else(PoisonError::into_inner);
    if list.is_empty() {
        eprintln!(
            "ember: warning: {what}; conv2d uses the im2col path for it (said once; see backends::cudnn::fallbacks)"
        );
    }
    if list.len() < MAX_FALLBACKS && !list.contains(&what) {
        list.push(what);
    }
}

/// Whether a failed algorithm query is conv2d's error rather than a fallback to im2col
/// (Note [Convolutions on cuDNN], step 2): on a real GPU (`emulated` false) under
/// `EMBER_CUDNN_API=graph`. The emulator has no graph API and keeps its fallbacks.
fn query_errors_are_errors(emulated: bool, api: CudnnApi) -> bool {
    !emulated && api == CudnnApi::Graph
}

/// Whether cuDNN is on and usable for `ctx`'s device.
fn usable(ctx: &Ctx) -> bool {
    settings::enabled() && ctx.driver.cudnn_version(ctx.ordinal).is_ok()
}

fn dims4(l: &Layout) -> Option<[usize; 4]> {
    l.dims().try_into().ok()
}

fn packed(d: [usize; 4]) -> [usize; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

/// A tensor as cuDNN reads it: its address and strides, or a contiguous copy when a
/// dimension is broadcast (or `packed` is asked for, as for filters).
struct Operand {
    ptr: DevicePtr,
    strides: [usize; 4],
    _copy: Option<CudaStorage>,
}

fn operand(s: &CudaStorage, l: &Layout, need_packed: bool) -> Result<Operand> {
    let dims = dims4(l).ok_or_else(|| TensorError::invalid("conv2d", "expected a 4-D tensor"))?;
    let strides: [usize; 4] = l
        .strides()
        .try_into()
        .map_err(|_| TensorError::invalid("conv2d", "expected 4 strides"))?;
    let broadcast = dims.iter().zip(strides).any(|(&d, st)| d > 1 && st == 0);
    if (need_packed && !l.is_contiguous()) || broadcast {
        let copy = cast(s, l, s.dtype())?;
        return Ok(Operand {
            ptr: copy.ptr_at(0),
            strides: packed(dims),
            _copy: Some(copy),
        });
    }
    Ok(Operand {
        ptr: s.ptr_at(l.offset()),
        strides: if need_packed { packed(dims) } else { strides },
        _copy: None,
    })
}

/// The problem over buffers at `ptrs` (null for the one written, made fresh: aligned), or
/// why cuDNN cannot express it.
fn problem(
    direction: ConvDirection,
    dtype: GemmType,
    x: ([usize; 4], [usize; 4]),
    w: [usize; 4],
    y: ([usize; 4], [usize; 4]),
    p: &Conv2dParams,
    ptrs: (DevicePtr, DevicePtr, DevicePtr),
) -> std::result::Result<ConvProblem, String> {
    let symmetric = |len: usize, pad: usize, k: usize, d: usize, st: usize, out: usize| {
        (len + 2 * pad)
            .checked_sub(d * (k - 1) + 1)
            .is_some_and(|v| v / st + 1 == out)
    };
    let (h, wd) = (x.0[2], x.0[3]);
    if !symmetric(h, p.pad.0, w[2], p.dilation.0, p.stride.0, p.out.0)
        || !symmetric(wd, p.pad.1, w[3], p.dilation.1, p.stride.1, p.out.1)
    {
        return Err(format!(
            "cuDNN cannot express the asymmetric padding of conv2d input {:?}, weight {w:?} (padding=\"same\" with an even kernel extent)",
            x.0
        ));
    }
    Ok(ConvProblem {
        direction,
        dtype,
        x_dims: x.0,
        x_strides: x.1,
        w_dims: w,
        y_dims: y.0,
        y_strides: y.1,
        pad: p.pad,
        stride: p.stride,
        dilation: p.dilation,
        groups: p.groups,
        allow_tf32: settings::allow_tf32(),
        align: byte_alignment(&[ptrs.0, ptrs.1, ptrs.2]),
    })
}

/// The ranked algorithms for `prob`, from the cache or the driver (Note [Convolutions on
/// cuDNN], step 3); `None` when cuDNN refuses the problem (recorded as a fallback).
/// `bufs` are the buffers a benchmark search reads; it writes scratch copies.
fn candidates(
    ctx: &Arc<Ctx>,
    prob: &ConvProblem,
    bufs: (DevicePtr, DevicePtr, DevicePtr),
) -> Result<Option<Vec<ConvAlgoPerf>>> {
    let (bench, det) = (settings::benchmark(), settings::deterministic());
    let key = (ctx.ordinal, *prob, bench, det);
    if let Some(c) = cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Ok(Some(c.clone()));
    }
    let stream = ctx.stream();
    let describe = |why: String| {
        format!(
            "cuDNN cannot run conv2d {} for input {:?}, weight {:?}, output {:?} ({:?}): {why}",
            prob.direction.name(),
            prob.x_dims,
            prob.w_dims,
            prob.y_dims,
            prob.dtype
        )
    };
    let heuristic =
        match ctx
            .driver
            .conv_algorithms(ctx.ordinal, stream, prob, ConvSearch::Heuristic)
        {
            Ok(list) => list,
            Err(e)
                if query_errors_are_errors(
                    ember_device::cuda::is_emulated(),
                    CudnnApi::from_env(),
                ) =>
            {
                return Err(e.into());
            }
            Err(e) => {
                fall_back(describe(e.to_string()));
                return Ok(None);
            }
        };
    let mut list = if bench {
        match benchmark(ctx, prob, bufs, &heuristic)? {
            Ok(list) => list,
            Err(why) => {
                fall_back(describe(why));
                return Ok(None);
            }
        }
    } else {
        heuristic
    };
    if det {
        list.retain(|a| a.deterministic);
    }
    if list.is_empty() {
        fall_back(describe(if det {
            "no deterministic algorithm".into()
        } else {
            "no algorithm".into()
        }));
        return Ok(None);
    }
    cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, list.clone());
    Ok(Some(list))
}

/// A benchmark search on scratch outputs; the inner error is cuDNN's refusal.
fn benchmark(
    ctx: &Arc<Ctx>,
    prob: &ConvProblem,
    (x, w, y): (DevicePtr, DevicePtr, DevicePtr),
    heuristic: &[ConvAlgoPerf],
) -> Result<std::result::Result<Vec<ConvAlgoPerf>, String>> {
    let [nx, nw, ny] = prob.numels();
    let written = match prob.direction {
        ConvDirection::Forward => ny,
        ConvDirection::BackwardData => nx,
        ConvDirection::BackwardFilter => nw,
    };
    let dtype = match prob.dtype {
        GemmType::F32 => DType::F32,
        GemmType::F64 => DType::F64,
        GemmType::F16 => DType::F16,
        GemmType::Bf16 => DType::Bf16,
    };
    let scratch = CudaStorage::alloc(ctx, dtype, written)?;
    let s = scratch.ptr_at(0);
    let (x, w, y) = match prob.direction {
        ConvDirection::Forward => (x, w, s),
        ConvDirection::BackwardData => (s, w, y),
        ConvDirection::BackwardFilter => (x, s, y),
    };
    let most = heuristic
        .iter()
        .map(|a| a.workspace_bytes)
        .max()
        .unwrap_or(0);
    let ws = workspace(ctx, most).or_else(|e| {
        if e.is_out_of_memory() {
            Ok(None)
        } else {
            Err(e)
        }
    })?;
    let (workspace, workspace_bytes) = match &ws {
        Some(a) => (DevicePtr(a.addr()), most),
        None => (DevicePtr::NULL, 0),
    };
    let bufs = ConvBuffers {
        x,
        w,
        y,
        workspace,
        workspace_bytes,
    };
    Ok(ctx
        .driver
        .conv_algorithms(ctx.ordinal, ctx.stream(), prob, ConvSearch::Benchmark(bufs))
        .map_err(|e| e.to_string()))
}

/// `bytes` of workspace from the caching allocator (`None` for 0).
fn workspace(ctx: &Ctx, bytes: usize) -> Result<Option<Allocation>> {
    if bytes == 0 {
        return Ok(None);
    }
    Ok(Some(ctx.alloc.allocate_on(bytes, ctx.stream())?))
}

/// Run `prob` with the first candidate whose workspace can be allocated (step 4), with
/// alpha 1 and beta 0 (step 5).
fn run(
    ctx: &Arc<Ctx>,
    prob: &ConvProblem,
    list: &[ConvAlgoPerf],
    (x, w, y): (DevicePtr, DevicePtr, DevicePtr),
) -> Result<()> {
    let mut last_oom = None;
    for a in list {
        let ws = match workspace(ctx, a.workspace_bytes) {
            Ok(ws) => ws,
            Err(e) if e.is_out_of_memory() => {
                last_oom = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let desc = ConvDesc {
            problem: *prob,
            algo: a.algo,
            alpha: 1.0,
            beta: 0.0,
            buffers: ConvBuffers {
                x,
                w,
                y,
                workspace: ws.as_ref().map_or(DevicePtr::NULL, |a| DevicePtr(a.addr())),
                workspace_bytes: if ws.is_some() { a.workspace_bytes } else { 0 },
            },
        };
        ctx.conv(&desc)?;
        return Ok(());
    }
    Err(last_oom
        .unwrap_or_else(|| TensorError::invalid("conv2d", "cuDNN offered no algorithm to run")))
}

/// The problem and its ranked algorithms, or `None` (recorded as a fallback) when cuDNN
/// cannot express or refuses it.
fn plan(
    ctx: &Arc<Ctx>,
    built: std::result::Result<ConvProblem, String>,
    bufs: (DevicePtr, DevicePtr, DevicePtr),
) -> Result<Option<(ConvProblem, Vec<ConvAlgoPerf>)>> {
    let prob = match built {
        Ok(prob) => prob,
        Err(why) => {
            fall_back(why);
            return Ok(None);
        }
    };
    Ok(candidates(ctx, &prob, bufs)?.map(|list| (prob, list)))
}

/// Whether the convolution has work and cuDNN may take it.
fn eligible(ctx: &Ctx, x: [usize; 4], w: [usize; 4], p: &Conv2dParams) -> bool {
    let nonempty = x.iter().chain(&w).all(|&d| d > 0) && p.out.0 > 0 && p.out.1 > 0;
    nonempty && usable(ctx)
}

/// conv2d forward on cuDNN; `None` when the im2col path must run instead.
pub(crate) fn conv2d_forward(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    bias: Option<(&CudaStorage, &Layout)>,
    p: &Conv2dParams,
) -> Result<Option<CudaStorage>> {
    let ctx = x.ctx();
    let (Some(xd), Some(wd)) = (dims4(lx), dims4(lw)) else {
        return Ok(None);
    };
    if !eligible(ctx, xd, wd, p) {
        return Ok(None);
    }
    let yd = [xd[0], wd[0], p.out.0, p.out.1];
    let dtype = gemm_type("conv2d", x.dtype())?;
    let xo = operand(x, lx, false)?;
    let wo = operand(w, lw, true)?;
    let bufs = (xo.ptr, wo.ptr, DevicePtr::NULL);
    let built = problem(
        ConvDirection::Forward,
        dtype,
        (xd, xo.strides),
        wd,
        (yd, packed(yd)),
        p,
        bufs,
    );
    let Some((prob, list)) = plan(ctx, built, bufs)? else {
        return Ok(None);
    };
    let mut out = CudaStorage::alloc(ctx, x.dtype(), yd.iter().product())?;
    run(ctx, &prob, &list, (xo.ptr, wo.ptr, out.ptr_at(0)))?;
    if let Some((b, lb)) = bias {
        // Step 5: the bias is added after the convolution, broadcast over samples and
        // positions, into the output in place.
        let planes = [xd[0], wd[0], p.out.0 * p.out.1];
        let bcast = Layout::new(
            planes.to_vec().into(),
            vec![0, lb.strides()[0], 0],
            lb.offset(),
        );
        binary_inplace::<op::Add>(
            "conv2d",
            &mut out,
            &Layout::contiguous(planes.to_vec()),
            b,
            &bcast,
        )?;
    }
    Ok(Some(out))
}

/// The input gradient `[n, c, h, w]` of conv2d from the output gradient `dy` and the
/// weight, on cuDNN; `None` when the composite path must run instead.
pub(crate) fn conv2d_backward_data(
    dy: &CudaStorage,
    ly: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    x_dims: [usize; 4],
    p: &Conv2dParams,
) -> Result<Option<CudaStorage>> {
    let ctx = dy.ctx();
    let (Some(yd), Some(wd)) = (dims4(ly), dims4(lw)) else {
        return Ok(None);
    };
    if !eligible(ctx, x_dims, wd, p) {
        return Ok(None);
    }
    let dtype = gemm_type("conv2d_backward_input", dy.dtype())?;
    let yo = operand(dy, ly, false)?;
    let wo = operand(w, lw, true)?;
    let bufs = (DevicePtr::NULL, wo.ptr, yo.ptr);
    let built = problem(
        ConvDirection::BackwardData,
        dtype,
        (x_dims, packed(x_dims)),
        wd,
        (yd, yo.strides),
        p,
        bufs,
    );
    let Some((prob, list)) = plan(ctx, built, bufs)? else {
        return Ok(None);
    };
    let dx = CudaStorage::alloc(ctx, dy.dtype(), x_dims.iter().product())?;
    run(ctx, &prob, &list, (dx.ptr_at(0), wo.ptr, yo.ptr))?;
    Ok(Some(dx))
}

/// The weight gradient `[o, c / groups, kh, kw]` of conv2d from the output gradient `dy`
/// and the input, on cuDNN; `None` when the composite path must run instead.
pub(crate) fn conv2d_backward_filter(
    dy: &CudaStorage,
    ly: &Layout,
    x: &CudaStorage,
    lx: &Layout,
    w_dims: [usize; 4],
    p: &Conv2dParams,
) -> Result<Option<CudaStorage>> {
    let ctx = dy.ctx();
    let (Some(yd), Some(xd)) = (dims4(ly), dims4(lx)) else {
        return Ok(None);
    };
    if !eligible(ctx, xd, w_dims, p) {
        return Ok(None);
    }
    let dtype = gemm_type("conv2d_backward_weight", dy.dtype())?;
    let yo = operand(dy, ly, false)?;
    let xo = operand(x, lx, false)?;
    let bufs = (xo.ptr, DevicePtr::NULL, yo.ptr);
    let built = problem(
        ConvDirection::BackwardFilter,
        dtype,
        (xd, xo.strides),
        w_dims,
        (yd, yo.strides),
        p,
        bufs,
    );
    let Some((prob, list)) = plan(ctx, built, bufs)? else {
        return Ok(None);
    };
    let dw = CudaStorage::alloc(ctx, dy.dtype(), w_dims.iter().product())?;
    run(ctx, &prob, &list, (xo.ptr, dw.ptr_at(0), yo.ptr))?;
    Ok(Some(dw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_graph_setting_on_a_real_gpu_makes_a_refusal_an_error() {
        assert!(query_errors_are_errors(false, CudnnApi::Graph));
        assert!(!query_errors_are_errors(false, CudnnApi::Auto));
        assert!(!query_errors_are_errors(false, CudnnApi::Legacy));
        // The emulator keeps its fallbacks whatever the setting says.
        assert!(!query_errors_are_errors(true, CudnnApi::Graph));
    }
}
