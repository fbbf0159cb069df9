//! The real driver's convolutions: cuDNN through cudarc's raw bindings, loaded at run time
//! (Note [cuDNN convolutions through the seam]). Heuristic choices and runs go through the
//! graph API (`cudnn_graph.rs`, Note [cuDNN's graph API]) unless `EMBER_CUDNN_API=legacy` or
//! the graph API cannot plan a problem; this file is the legacy API (`cudnnConvolution*`
//! with per-call descriptors, and the timed `cudnnFind*AlgorithmEx` of benchmark mode).
//!
//! One cuDNN handle per device, made on first use and kept (like the cuBLAS handle); the
//! outcome of loading (a handle, or why not) is cached, so an absent or broken library is
//! probed once. Loading checks that the library is present, that it is cuDNN 9 or newer
//! (the bindings are 9.2's), and that every entry point used here resolves, all before the
//! first call into it and under `catch_unwind` (cudarc panics on a missing symbol): after
//! that, calls cannot panic. Descriptors are made per call and destroyed on drop; calls are
//! serialised (a handle is bound to one stream at a time).
//!
//! Math type, as PyTorch sets it: f16/bf16 `CUDNN_TENSOR_OP_MATH`; f32 `CUDNN_DEFAULT_MATH`
//! (TF32 allowed) or `CUDNN_FMA_MATH` (no tensor cores) after `allow_tf32`; f64 default.
//! Compute type: f64 for f64, f32 otherwise. None of this can run on the development
//! machines (no GPU); only the absent-library path is exercised there.

use std::ffi::{c_int, c_void};

use cudarc::cudnn::sys as dnn;

use super::RealDriver;
use super::cudnn_graph::{
    CudnnApi, ENV_CUDNN_API, GRAPH_ALGO_BASE, GraphPlans, PlanCache, build_plans, execute,
    graph_spec, pick_plan,
};
use crate::driver::{
    ConvAlgoPerf, ConvBuffers, ConvDesc, ConvDirection, ConvProblem, ConvSearch, GemmType,
    StreamHandle,
};
use crate::error::{DeviceError, Result};

/// Oldest cuDNN accepted (`cudnnGetVersion`): 9.0.0.
pub const MIN_CUDNN_VERSION: usize = 90000;

/// Entry points used here, resolved at load so that no call can hit a missing symbol.
const SYMBOLS: &[&str] = &[
    "cudnnGetVersion",
    "cudnnCreate",
    "cudnnSetStream",
    "cudnnCreateTensorDescriptor",
    "cudnnSetTensor4dDescriptorEx",
    "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnSetFilter4dDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor",
    "cudnnSetConvolutionGroupCount",
    "cudnnSetConvolutionMathType",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnFindConvolutionBackwardFilterAlgorithmEx",
    "cudnnGetConvolutionForwardWorkspaceSize",
    "cudnnGetConvolutionBackwardDataWorkspaceSize",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
    "cudnnConvolutionForward",
    "cudnnConvolutionBackwardData",
    "cudnnConvolutionBackwardFilter",
];

/// The graph API's entry points (`cudnn_graph.rs`); without them only the legacy API runs.
const GRAPH_SYMBOLS: &[&str] = &[
    "cudnnBackendCreateDescriptor",
    "cudnnBackendDestroyDescriptor",
    "cudnnBackendSetAttribute",
    "cudnnBackendGetAttribute",
    "cudnnBackendFinalize",
    "cudnnBackendExecute",
];

/// Why the graph API cannot be used (`None`: it can), probed once with the library loaded.
fn graph_unusable() -> Option<String> {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        // Called after `load` succeeded, so the library is present.
        let outcome =
            super::quietly(|| missing_symbol(GRAPH_SYMBOLS).map(|n| format!("cuDNN lacks {n}")));
        outcome.unwrap_or_else(|| Some("cuDNN's graph API could not be probed".into()))
    })
    .clone()
}

/// The first of `names` the loaded library lacks. The library must be present.
fn missing_symbol(names: &[&'static str]) -> Option<&'static str> {
    // SAFETY: the callers checked that the library is present; `culib` loads it once.
    let lib = unsafe { dnn::culib() };
    names.iter().copied().find(|name| {
        // SAFETY: only looks the symbol up; it is not called through this pointer.
        unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err()
    })
}

/// Most algorithms any direction has (`CUDNN_CONVOLUTION_FWD_ALGO_COUNT`).
const MAX_ALGOS: usize = 8;

pub(super) fn check_dnn(call: &'static str, status: dnn::cudnnStatus_t) -> Result<()> {
    match status {
        dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(()),
        other => Err(DeviceError::driver(call, format!("{other:?}"))),
    }
}

/// Load cuDNN and make a handle for the current context, or say why not. Runs once per
/// device, under `catch_unwind` with the panic hook silenced.
pub(super) fn load() -> std::result::Result<u64, String> {
    // SAFETY: only tries to dlopen the library and closes it again.
    if !unsafe { dnn::is_culib_present() } {
        return Err("cuDNN not found (no libcudnn.so.9 on the library path)".into());
    }
    let outcome = super::quietly(|| -> std::result::Result<u64, String> {
        // The library is present (checked above).
        if let Some(name) = missing_symbol(SYMBOLS) {
            return Err(format!("cuDNN lacks {name} (too old or broken?)"));
        }
        // SAFETY: no preconditions; the symbol resolved above.
        let version = unsafe { dnn::cudnnGetVersion() };
        if version < MIN_CUDNN_VERSION {
            return Err(format!(
                "cuDNN {version} is too old: Ember needs cuDNN 9.0 or newer"
            ));
        }
        let mut handle: dnn::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the caller made the context current.
        check_dnn("cudnnCreate", unsafe { dnn::cudnnCreate(&mut handle) })
            .map_err(|e| e.to_string())?;
        Ok(handle as u64)
    });
    outcome.unwrap_or_else(|| Err("cuDNN could not be loaded (a library call panicked)".into()))
}

/// The descriptors of one problem, destroyed on drop.
struct Descriptors {
    x: dnn::cudnnTensorDescriptor_t,
    w: dnn::cudnnFilterDescriptor_t,
    y: dnn::cudnnTensorDescriptor_t,
    conv: dnn::cudnnConvolutionDescriptor_t,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Descriptors::new` (or is null, which the
        // destroy calls accept) and is destroyed once, here.
        unsafe {
            let _ = dnn::cudnnDestroyTensorDescriptor(self.x);
            let _ = dnn::cudnnDestroyFilterDescriptor(self.w);
            let _ = dnn::cudnnDestroyTensorDescriptor(self.y);
            let _ = dnn::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

fn int(call: &'static str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| DeviceError::Driver {
        call,
        code: "CUDNN_STATUS_NOT_SUPPORTED".into(),
        detail: format!("{v} does not fit cuDNN's 32-bit int"),
    })
}

impl Descriptors {
    fn new(call: &'static str, p: &ConvProblem) -> Result<Descriptors> {
        use dnn::cudnnDataType_t as T;
        let (data, compute) = match p.dtype {
            GemmType::F32 => (T::CUDNN_DATA_FLOAT, T::CUDNN_DATA_FLOAT),
            GemmType::F64 => (T::CUDNN_DATA_DOUBLE, T::CUDNN_DATA_DOUBLE),
            GemmType::F16 => (T::CUDNN_DATA_HALF, T::CUDNN_DATA_FLOAT),
            GemmType::Bf16 => (T::CUDNN_DATA_BFLOAT16, T::CUDNN_DATA_FLOAT),
        };
        let math = match p.dtype {
            GemmType::F16 | GemmType::Bf16 => dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            GemmType::F32 if !p.allow_tf32 => dnn::cudnnMathType_t::CUDNN_FMA_MATH,
            _ => dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        };
        let mut d = Descriptors {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
        };
        let i = |v| int(call, v);
        // SAFETY: out-pointers are fields of `d`, which destroys what was created if a later
        // call fails; the set calls take the descriptors just created and plain integers.
        unsafe {
            check_dnn(call, dnn::cudnnCreateTensorDescriptor(&mut d.x))?;
            check_dnn(call, dnn::cudnnCreateFilterDescriptor(&mut d.w))?;
            check_dnn(call, dnn::cudnnCreateTensorDescriptor(&mut d.y))?;
            check_dnn(call, dnn::cudnnCreateConvolutionDescriptor(&mut d.conv))?;
            for (desc, dims, strides) in
                [(d.x, p.x_dims, p.x_strides), (d.y, p.y_dims, p.y_strides)]
            {
                check_dnn(
                    call,
                    dnn::cudnnSetTensor4dDescriptorEx(
                        desc,
                        data,
                        i(dims[0])?,
                        i(dims[1])?,
                        i(dims[2])?,
                        i(dims[3])?,
                        i(strides[0])?,
                        i(strides[1])?,
                        i(strides[2])?,
                        i(strides[3])?,
                    ),
                )?;
            }
            let w = p.w_dims;
            check_dnn(
                call,
                dnn::cudnnSetFilter4dDescriptor(
                    d.w,
                    data,
                    dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    i(w[0])?,
                    i(w[1])?,
                    i(w[2])?,
                    i(w[3])?,
                ),
            )?;
            check_dnn(
                call,
                dnn::cudnnSetConvolution2dDescriptor(
                    d.conv,
                    i(p.pad.0)?,
                    i(p.pad.1)?,
                    i(p.stride.0)?,
                    i(p.stride.1)?,
                    i(p.dilation.0)?,
                    i(p.dilation.1)?,
                    dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    compute,
                ),
            )?;
            check_dnn(
                call,
                dnn::cudnnSetConvolutionGroupCount(d.conv, i(p.groups)?),
            )?;
            check_dnn(call, dnn::cudnnSetConvolutionMathType(d.conv, math))?;
        }
        Ok(d)
    }
}

fn fwd_algo(a: u32) -> Option<dnn::cudnnConvolutionFwdAlgo_t> {
    use dnn::cudnnConvolutionFwdAlgo_t as A;
    Some(match a {
        0 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        1 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        2 => A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        3 => A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        4 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        5 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        6 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        7 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

fn bwd_data_algo(a: u32) -> Option<dnn::cudnnConvolutionBwdDataAlgo_t> {
    use dnn::cudnnConvolutionBwdDataAlgo_t as A;
    Some(match a {
        0 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        1 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
        2 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
        3 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
        4 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
        5 => A::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

fn bwd_filter_algo(a: u32) -> Option<dnn::cudnnConvolutionBwdFilterAlgo_t> {
    use dnn::cudnnConvolutionBwdFilterAlgo_t as A;
    Some(match a {
        0 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        1 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        2 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
        3 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        4 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
        5 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        6 => A::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
        _ => return None,
    })
}

/// The successful entries of a perf array as the seam's values. `$perf` is an array of
/// `cudnnConvolution*AlgoPerf_t`, `$n` how many cuDNN filled.
macro_rules! perfs {
    ($perf:expr, $n:expr) => {
        $perf[..$n]
            .iter()
            .filter(|p| p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
            .map(|p| ConvAlgoPerf {
                algo: p.algo as u32,
                time_ms: p.time,
                workspace_bytes: p.memory,
                deterministic: p.determinism == dnn::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
            })
            .collect::<Vec<_>>()
    };
}

impl RealDriver {
    /// The device's cuDNN handle, loading the library on first use (Note [cuDNN
    /// convolutions through the seam]).
    fn cudnn(&self, device: usize) -> Result<dnn::cudnnHandle_t> {
        if let Some(outcome) = self.tables().cudnn.get(&device) {
            return outcome
                .clone()
                .map(|h| h as dnn::cudnnHandle_t)
                .map_err(|why| DeviceError::Unsupported {
                    what: why,
                    driver: "real",
                });
        }
        self.bind(device)?;
        let outcome = load();
        self.tables().cudnn.insert(device, outcome.clone());
        outcome
            .map(|h| h as dnn::cudnnHandle_t)
            .map_err(|why| DeviceError::Unsupported {
                what: why,
                driver: "real",
            })
    }

    /// The handle on `stream`, its context current.
    fn cudnn_on(
        &self,
        call: &'static str,
        device: usize,
        stream: StreamHandle,
    ) -> Result<dnn::cudnnHandle_t> {
        let handle = self.cudnn(device)?;
        let (_, s) = self.stream(call, stream, Some(device), None)?;
        // SAFETY: `handle` belongs to this device; the stream pointer is cast between the
        // driver's and cuDNN's identical CUstream_st declarations.
        check_dnn("cudnnSetStream", unsafe {
            dnn::cudnnSetStream(handle, s.cast())
        })?;
        Ok(handle)
    }

    pub(super) fn cudnn_version_impl(&self, device: usize) -> Result<usize> {
        self.cudnn(device)?;
        // SAFETY: the library is loaded and the symbol resolved (`load`).
        Ok(unsafe { dnn::cudnnGetVersion() })
    }

    /// Whether this problem's heuristic choice goes to the graph API; an error when
    /// `EMBER_CUDNN_API=graph` asks for it and it cannot be used.
    fn graph_wanted(&self) -> Result<bool> {
        match (CudnnApi::from_env(), graph_unusable()) {
            (CudnnApi::Legacy, _) => Ok(false),
            (_, None) => Ok(true),
            (CudnnApi::Auto, Some(_)) => Ok(false),
            (CudnnApi::Graph, Some(why)) => Err(DeviceError::Unsupported {
                what: format!("cuDNN's graph API ({ENV_CUDNN_API}=graph): {why}"),
                driver: "real",
            }),
        }
    }

    /// The plans of `p` with blend factors `(alpha, beta)`, made on first use.
    fn graph_plans(
        &self,
        plans: &mut PlanCache,
        h: dnn::cudnnHandle_t,
        device: usize,
        p: &ConvProblem,
        (alpha, beta): (f64, f64),
    ) -> Result<std::sync::Arc<GraphPlans>> {
        let key = (device, *p, alpha.to_bits(), beta.to_bits());
        plans.get_or_make(key, || build_plans(h, p, &graph_spec(p, alpha, beta)))
    }

    pub(super) fn conv_algorithms_impl(
        &self,
        device: usize,
        stream: StreamHandle,
        p: &ConvProblem,
        search: ConvSearch,
    ) -> Result<Vec<ConvAlgoPerf>> {
        const CALL: &str = "cudnnGet/FindConvolutionAlgorithm";
        let mut serial = self.cudnn_calls.lock().unwrap_or_else(|e| e.into_inner());
        if search == ConvSearch::Heuristic && self.graph_wanted()? {
            let h = self.cudnn_on(CALL, device, stream)?;
            match self.graph_plans(&mut serial, h, device, p, (1.0, 0.0)) {
                Ok(g) => {
                    return Ok(g
                        .plans
                        .iter()
                        .enumerate()
                        .map(|(i, plan)| ConvAlgoPerf {
                            algo: GRAPH_ALGO_BASE + i as u32,
                            time_ms: -1.0,
                            workspace_bytes: plan.workspace,
                            deterministic: plan.deterministic,
                        })
                        .collect());
                }
                Err(e) if CudnnApi::from_env() == CudnnApi::Graph => return Err(e),
                Err(e) => legacy_once(p, &e),
            }
        }
        let h = self.cudnn_on(CALL, device, stream)?;
        let d = Descriptors::new(CALL, p)?;
        let mut n: c_int = 0;
        let req = MAX_ALGOS as c_int;
        let (x, w, y, ws, ws_bytes) = match search {
            ConvSearch::Heuristic => (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            ),
            ConvSearch::Benchmark(ConvBuffers {
                x,
                w,
                y,
                workspace,
                workspace_bytes,
            }) => (
                x.0 as *mut c_void,
                w.0 as *mut c_void,
                y.0 as *mut c_void,
                workspace.0 as *mut c_void,
                workspace_bytes,
            ),
        };
        let bench = matches!(search, ConvSearch::Benchmark(_));
        // SAFETY: in all three arms, the perf arrays are zeroed, which is a valid value of
        // every field (each enum has a variant 0); cuDNN writes at most `req` entries and
        // `n` says how many. The descriptors are alive; in benchmark mode the buffers are
        // the caller's device memory for this problem (the seam's contract) and the
        // workspace holds `ws_bytes`.
        let mut out = unsafe {
            match p.direction {
                ConvDirection::Forward => {
                    let mut perf =
                        [std::mem::zeroed::<dnn::cudnnConvolutionFwdAlgoPerf_t>(); MAX_ALGOS];
                    check_dnn(
                        CALL,
                        if bench {
                            dnn::cudnnFindConvolutionForwardAlgorithmEx(
                                h,
                                d.x,
                                x,
                                d.w,
                                w,
                                d.conv,
                                d.y,
                                y,
                                req,
                                &mut n,
                                perf.as_mut_ptr(),
                                ws,
                                ws_bytes,
                            )
                        } else {
                            dnn::cudnnGetConvolutionForwardAlgorithm_v7(
                                h,
                                d.x,
                                d.w,
                                d.conv,
                                d.y,
                                req,
                                &mut n,
                                perf.as_mut_ptr(),
                            )
                        },
                    )?;
                    perfs!(perf, (n.max(0) as usize).min(MAX_ALGOS))
                }
                ConvDirection::BackwardData => {
                    let mut perf =
                        [std::mem::zeroed::<dnn::cudnnConvolutionBwdDataAlgoPerf_t>(); MAX_ALGOS];
                    check_dnn(
                        CALL,
                        if bench {
                            dnn::cudnnFindConvolutionBackwardDataAlgorithmEx(
                                h,
                                d.w,
                                w,
                                d.y,
                                y,
                                d.conv,
                                d.x,
                                x,
                                req,
                                &mut n,
                                perf.as_mut_ptr(),
                                ws,
                                ws_bytes,
                            )
                        } else {
                            dnn::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                h,
                                d.w,
                                d.y,
                                d.conv,
                                d.x,
                                req,
                                &mut n,
                                perf.as_mut_ptr(),
                            )
                        },
                    )?;
                    perfs!(perf, (n.max(0) as usize).min(MAX_ALGOS))
                }
                ConvDirection::BackwardFilter => {
                    let mut perf =
                        [std::mem::zeroed::<dnn::cudnnConvolutionBwdFilterAlgoPerf_t>(); MAX_ALGOS];
                    check_dnn(
                        CALL,
                        if bench {
                            dnn::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                                h,
                                d.x,
                                x,
                                d.y,
                                y,
                                d.conv,
                                d.w,
                                w,
                                req,
                                &mut n,
                                perf.as_mut_ptr(),
                                ws,
                                ws_bytes,
                            )
                        } else {
                            dnn::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                h,
                                d.x,
                                d.y,
                                d.conv,
                                d.w,
                                req,
                                &mut n,
                                perf.as_mut_ptr(),
                            )
                        },
                    )?;
                    perfs!(perf, (n.max(0) as usize).min(MAX_ALGOS))
                }
            }
        };
        if !bench {
            // The heuristics' memory field is an estimate; ask for the exact size.
            for a in &mut out {
                let mut size = 0usize;
                // SAFETY: descriptors alive, out-pointer a valid local; the algorithm came
                // from cuDNN for this direction, so the conversion succeeds.
                let status = unsafe {
                    match p.direction {
                        ConvDirection::Forward => fwd_algo(a.algo).map(|al| {
                            dnn::cudnnGetConvolutionForwardWorkspaceSize(
                                h, d.x, d.w, d.conv, d.y, al, &mut size,
                            )
                        }),
                        ConvDirection::BackwardData => bwd_data_algo(a.algo).map(|al| {
                            dnn::cudnnGetConvolutionBackwardDataWorkspaceSize(
                                h, d.w, d.y, d.conv, d.x, al, &mut size,
                            )
                        }),
                        ConvDirection::BackwardFilter => bwd_filter_algo(a.algo).map(|al| {
                            dnn::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                                h, d.x, d.y, d.conv, d.w, al, &mut size,
                            )
                        }),
                    }
                };
                if status == Some(dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS) {
                    a.workspace_bytes = size;
                }
            }
        }
        Ok(out)
    }

    pub(super) fn conv_impl(
        &self,
        device: usize,
        stream: StreamHandle,
        desc: &ConvDesc,
    ) -> Result<()> {
        let p = &desc.problem;
        let call = match p.direction {
            ConvDirection::Forward => "cudnnConvolutionForward",
            ConvDirection::BackwardData => "cudnnConvolutionBackwardData",
            ConvDirection::BackwardFilter => "cudnnConvolutionBackwardFilter",
        };
        let mut serial = self.cudnn_calls.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.cudnn_on(call, device, stream)?;
        if desc.algo >= GRAPH_ALGO_BASE {
            let b = desc.buffers;
            let index = (desc.algo - GRAPH_ALGO_BASE) as usize;
            // The caller chose from the plans of alpha 1, beta 0 (`conv_algorithms`, cached):
            // another graph's plans run only as deterministic as the one it chose.
            let listed = self.graph_plans(&mut serial, h, device, p, (1.0, 0.0))?;
            let deterministic = listed.plans.get(index).is_some_and(|pl| pl.deterministic);
            let g = if (desc.alpha, desc.beta) == (1.0, 0.0) {
                listed
            } else {
                self.graph_plans(&mut serial, h, device, p, (desc.alpha, desc.beta))?
            };
            let needs: Vec<(usize, bool)> = g
                .plans
                .iter()
                .map(|pl| (pl.workspace, pl.deterministic))
                .collect();
            let plan = pick_plan(&needs, index, b.workspace_bytes, deterministic)
                .and_then(|i| g.plans.get(i))
                .ok_or_else(|| DeviceError::Driver {
                    call: "cudnnBackendExecute",
                    code: "CUDNN_STATUS_BAD_PARAM".into(),
                    detail: format!(
                        "no {}plan of the graph API for algorithm {} fits a workspace of {} bytes",
                        if deterministic { "deterministic " } else { "" },
                        desc.algo,
                        b.workspace_bytes
                    ),
                })?;
            return execute(h, plan, (b.x.0, b.w.0, b.y.0), b.workspace.0);
        }
        let d = Descriptors::new(call, p)?;
        let (a64, b64) = (desc.alpha, desc.beta);
        let (a32, b32) = (desc.alpha as f32, desc.beta as f32);
        let (alpha, beta): (*const c_void, *const c_void) = if p.dtype == GemmType::F64 {
            ((&a64 as *const f64).cast(), (&b64 as *const f64).cast())
        } else {
            ((&a32 as *const f32).cast(), (&b32 as *const f32).cast())
        };
        let b = desc.buffers;
        let (x, w, y) = (
            b.x.0 as *mut c_void,
            b.w.0 as *mut c_void,
            b.y.0 as *mut c_void,
        );
        let ws = b.workspace.0 as *mut c_void;
        let bad_algo = || DeviceError::Driver {
            call,
            code: "CUDNN_STATUS_BAD_PARAM".into(),
            detail: format!(
                "{} is not a cuDNN {} algorithm",
                desc.algo,
                p.direction.name()
            ),
        };
        // SAFETY: alpha/beta point at locals of the compute type alive for the call; the
        // descriptors describe the buffers (the seam's contract: device memory of this
        // problem's shapes), and the workspace holds `workspace_bytes`.
        let status = unsafe {
            match p.direction {
                ConvDirection::Forward => dnn::cudnnConvolutionForward(
                    h,
                    alpha,
                    d.x,
                    x,
                    d.w,
                    w,
                    d.conv,
                    fwd_algo(desc.algo).ok_or_else(bad_algo)?,
                    ws,
                    b.workspace_bytes,
                    beta,
                    d.y,
                    y,
                ),
                ConvDirection::BackwardData => dnn::cudnnConvolutionBackwardData(
                    h,
                    alpha,
                    d.w,
                    w,
                    d.y,
                    y,
                    d.conv,
                    bwd_data_algo(desc.algo).ok_or_else(bad_algo)?,
                    ws,
                    b.workspace_bytes,
                    beta,
                    d.x,
                    x,
                ),
                ConvDirection::BackwardFilter => dnn::cudnnConvolutionBackwardFilter(
                    h,
                    alpha,
                    d.x,
                    x,
                    d.y,
                    y,
                    d.conv,
                    bwd_filter_algo(desc.algo).ok_or_else(bad_algo)?,
                    ws,
                    b.workspace_bytes,
                    beta,
                    d.w,
                    w,
                ),
            }
        };
        check_dnn(call, status)?;
        Ok(())
    }
}

/// Say once per process that a problem went to the legacy API, and why.
fn legacy_once(p: &ConvProblem, why: &DeviceError) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "ember: warning: cuDNN's graph API cannot plan conv2d {} for input {:?}, weight {:?} ({why}); it runs on the legacy API (said once)",
            p.direction.name(),
            p.x_dims,
            p.w_dims
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_numbers_round_trip() {
        for a in 0..8 {
            assert_eq!(fwd_algo(a).map(|x| x as u32), Some(a));
        }
        for a in 0..6 {
            assert_eq!(bwd_data_algo(a).map(|x| x as u32), Some(a));
        }
        for a in 0..7 {
            assert_eq!(bwd_filter_algo(a).map(|x| x as u32), Some(a));
        }
        assert!(
            fwd_algo(8).is_none() && bwd_data_algo(6).is_none() && bwd_filter_algo(7).is_none()
        );
    }

    #[test]
    fn loading_without_cudnn_is_a_reason_not_a_panic() {
        // SAFETY: only probes for the library.
        if unsafe { dnn::is_culib_present() } {
            eprintln!("skipped: cuDNN is installed here");
            return;
        }
        let why = load().unwrap_err();
        assert!(why.contains("cuDNN not found"), "{why}");
    }
}
