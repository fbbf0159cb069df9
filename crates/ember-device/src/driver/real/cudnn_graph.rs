//! The real driver's convolutions through cuDNN's graph (backend) API, as PyTorch runs them
//! (Note [cuDNN's graph API]); `cudnn.rs` keeps the legacy API as the fallback.
//!
//! Note [cuDNN's graph API]:
//!
//! PyTorch has run its convolutions through cuDNN's graph API (its "v8 API", through
//! cudnn-frontend) since 1.13, not the legacy `cudnnConvolutionForward` family: one
//! convolution is an operation graph of three tensors and one operation; cuDNN's heuristics
//! (`CUDNN_HEUR_MODE_INSTANT`, then the `FALLBACK` list) rank engine configurations for it;
//! each is finalized into an execution plan, which knows its workspace; a call builds a
//! variant pack (the three pointers by unique id, and the workspace) and executes a plan.
//! Plans are made once per problem and cached (PyTorch's `BenchmarkCache` of plans). The
//! engines the graph API offers include ones the legacy heuristics never pick (on Hopper,
//! f32 NCHW convolutions with TF32 that need no NCHW↔NHWC transforms), and a call costs a
//! variant pack instead of four descriptors.
//!
//! Here, as in PyTorch's `Conv_v8.cpp`:
//! - tensors are `x` (uid `'x'`), `w` (`'w'`) and `y` (`'y'`) with the problem's dims and
//!   element strides and its byte alignment (`ConvProblem::align`: a plan made for 16-byte
//!   aligned buffers may not run on less); groups are implied by `x`'s channels against
//!   `w`'s; compute type f64 for f64, f32 otherwise; cross-correlation, symmetric padding;
//! - engine configurations whose numerical notes say `DOWN_CONVERT_INPUTS` are dropped, and
//!   for f32 without `allow_tf32` those that say `TENSOR_CORE`; `NONDETERMINISTIC` marks an
//!   algorithm as such (the caller drops it under `deterministic`);
//! - alpha and beta are part of the graph, so plans are cached per (device, problem, alpha,
//!   beta): [`Driver::conv_algorithms`](crate::driver::Driver::conv_algorithms) makes the
//!   plans of alpha 1, beta 0 and numbers them `GRAPH_ALGO_BASE + i`; a run with other
//!   factors makes that graph's plans on first use and takes its `i`-th, or the first that
//!   fits the workspace given, deterministic if the `i`-th plan of alpha 1, beta 0 (the one
//!   the caller chose, perhaps for that) is ([`pick_plan`]): that graph's heuristics need
//!   not rank its engines as the other's (the tensor layer itself runs every convolution
//!   with alpha 1, beta 0 and adds a bias afterwards, Note [Convolutions on cuDNN], step 5;
//!   other factors are for the seam's other callers);
//! - at most [`MAX_PLANS`] plans are finalized per graph, in the heuristics' order (the
//!   caller runs the first whose workspace it can allocate; finalizing is the slow step),
//!   and past them the first deterministic one when none of those is ([`wants_plan`]):
//!   PyTorch drops `NONDETERMINISTIC` engines before it makes any plan, so under
//!   `deterministic` it runs whatever deterministic engine the heuristics list, however far
//!   down; the plans here are made once for both settings.
//!
//! What is unit-tested without a GPU is the graph as data ([`graph_spec`]: every attribute
//! each descriptor gets) and the note filter ([`keep_engine`]); the descriptor calls are a
//! loop over that data. `EMBER_CUDNN_API` chooses: `auto` (the graph API, falling back to
//! the legacy API for a problem it cannot plan, said once on stderr), `graph` (a failure is
//! the error: how a GPU session proves the path) or `legacy`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::cudnn::sys as dnn;

use super::cudnn::check_dnn as check;
use crate::driver::{ConvDirection, ConvProblem, GemmType};
use crate::error::{DeviceError, Result};

use dnn::cudnnBackendAttributeName_t as A;
use dnn::cudnnBackendAttributeType_t as T;
use dnn::cudnnBackendDescriptorType_t as D;

mod select;
pub use select::{pick_plan, wants_plan};

/// Algorithm numbers from this many on name plans of the graph API (cuDNN's legacy numbers
/// are below 8).
pub const GRAPH_ALGO_BASE: u32 = 1 << 16;

/// Most plans finalized per graph.
pub const MAX_PLANS: usize = 4;

/// Most numerical notes read per engine (cuDNN 9 defines 9).
const MAX_NOTES: usize = 32;

/// `EMBER_CUDNN_API`: `auto`, `graph` or `legacy`.
pub const ENV_CUDNN_API: &str = "EMBER_CUDNN_API";

/// Which cuDNN API runs convolutions (`EMBER_CUDNN_API`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudnnApi {
    /// The graph API, the legacy one for a problem the graph API cannot plan.
    Auto,
    /// The graph API only: a problem it cannot plan is an error.
    Graph,
    /// The legacy API only.
    Legacy,
}

impl CudnnApi {
    /// `"auto"`, `"graph"` or `"legacy"`, as `EMBER_CUDNN_API` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CudnnApi::Auto => "auto",
            CudnnApi::Graph => "graph",
            CudnnApi::Legacy => "legacy",
        }
    }

    /// Parse `EMBER_CUDNN_API`'s value (`None`: unset).
    pub fn parse(v: Option<&str>) -> std::result::Result<CudnnApi, String> {
        match v.map(str::trim) {
            None | Some("") | Some("auto") => Ok(CudnnApi::Auto),
            Some("graph") => Ok(CudnnApi::Graph),
            Some("legacy") => Ok(CudnnApi::Legacy),
            Some(other) => Err(format!(
                "{ENV_CUDNN_API}={other:?} is not one of auto, graph, legacy; using auto"
            )),
        }
    }

    /// The process's choice (read once; a bad value is said once and taken as `auto`).
    pub fn from_env() -> CudnnApi {
        static API: OnceLock<CudnnApi> = OnceLock::new();
        *API.get_or_init(|| {
            let v = std::env::var(ENV_CUDNN_API).ok();
            CudnnApi::parse(v.as_deref()).unwrap_or_else(|why| {
                eprintln!("ember: warning: {why}");
                CudnnApi::Auto
            })
        })
    }
}

/// Unique ids of the graph's tensors (PyTorch's `'x'`, `'w'`, `'y'`).
pub const UID_X: i64 = b'x' as i64;
/// The filter's unique id.
pub const UID_W: i64 = b'w' as i64;
/// The output's unique id.
pub const UID_Y: i64 = b'y' as i64;

/// One tensor of the graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorSpec {
    pub uid: i64,
    pub dims: [i64; 4],
    pub strides: [i64; 4],
    pub data: dnn::cudnnDataType_t,
    pub align: i64,
}

/// The operation's attribute names for its three tensors, alpha, beta and the convolution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpAttrs {
    pub kind: D,
    pub x: A,
    pub w: A,
    pub y: A,
    pub alpha: A,
    pub beta: A,
    pub conv: A,
}

/// One convolution's graph, as data: what [`build_plans`] gives each descriptor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphSpec {
    pub x: TensorSpec,
    pub w: TensorSpec,
    pub y: TensorSpec,
    pub compute: dnn::cudnnDataType_t,
    pub pre_pad: [i64; 2],
    pub post_pad: [i64; 2],
    pub stride: [i64; 2],
    pub dilation: [i64; 2],
    pub op: OpAttrs,
    /// Alpha and beta as the compute type takes them (`CUDNN_TYPE_DOUBLE` for f64).
    pub alpha: f64,
    pub beta: f64,
    pub double_scalars: bool,
}

fn i64s(v: [usize; 4]) -> [i64; 4] {
    v.map(|d| d as i64)
}

/// The operation of a direction.
pub fn op_attrs(direction: ConvDirection) -> OpAttrs {
    match direction {
        ConvDirection::Forward => OpAttrs {
            kind: D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            x: A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
            w: A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            y: A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
            alpha: A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            beta: A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            conv: A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
        },
        ConvDirection::BackwardData => OpAttrs {
            kind: D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            x: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
            w: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            y: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
            alpha: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            beta: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            conv: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
        },
        ConvDirection::BackwardFilter => OpAttrs {
            kind: D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            x: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
            w: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
            y: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
            alpha: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            beta: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            conv: A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
        },
    }
}

/// The graph of `p` with blend factors `alpha`, `beta` (see Note [cuDNN's graph API]).
pub fn graph_spec(p: &ConvProblem, alpha: f64, beta: f64) -> GraphSpec {
    use dnn::cudnnDataType_t as Dt;
    let (data, compute) = match p.dtype {
        GemmType::F32 => (Dt::CUDNN_DATA_FLOAT, Dt::CUDNN_DATA_FLOAT),
        GemmType::F64 => (Dt::CUDNN_DATA_DOUBLE, Dt::CUDNN_DATA_DOUBLE),
        GemmType::F16 => (Dt::CUDNN_DATA_HALF, Dt::CUDNN_DATA_FLOAT),
        GemmType::Bf16 => (Dt::CUDNN_DATA_BFLOAT16, Dt::CUDNN_DATA_FLOAT),
    };
    let w = p.w_dims;
    let tensor = |uid, dims, strides| TensorSpec {
        uid,
        dims: i64s(dims),
        strides: i64s(strides),
        data,
        align: p.align as i64,
    };
    let pad = [p.pad.0 as i64, p.pad.1 as i64];
    GraphSpec {
        x: tensor(UID_X, p.x_dims, p.x_strides),
        w: tensor(UID_W, w, [w[1] * w[2] * w[3], w[2] * w[3], w[3], 1]),
        y: tensor(UID_Y, p.y_dims, p.y_strides),
        compute,
        pre_pad: pad,
        post_pad: pad,
        stride: [p.stride.0 as i64, p.stride.1 as i64],
        dilation: [p.dilation.0 as i64, p.dilation.1 as i64],
        op: op_attrs(p.direction),
        alpha,
        beta,
        double_scalars: p.dtype == GemmType::F64,
    }
}

/// Whether an engine with `notes` (cuDNN's `cudnnBackendNumericalNote_t` values) may run
/// `p`, and if so whether it is deterministic (PyTorch's `filterEngineConfigs`).
pub fn keep_engine(notes: &[i32], p: &ConvProblem) -> Option<bool> {
    use dnn::cudnnBackendNumericalNote_t as N;
    let has = |n: N| notes.contains(&(n as i32));
    if has(N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) {
        return None;
    }
    if p.dtype == GemmType::F32 && !p.allow_tf32 && has(N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE) {
        return None;
    }
    Some(!has(N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC))
}

/// A backend descriptor, destroyed on drop.
#[derive(Debug)]
struct Desc(dnn::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: made by `cudnnBackendCreateDescriptor` in `Desc::new` and destroyed once,
        // here.
        let _ = unsafe { dnn::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    fn new(kind: D) -> Result<Desc> {
        let mut d: dnn::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local.
        check("cudnnBackendCreateDescriptor", unsafe {
            dnn::cudnnBackendCreateDescriptor(kind, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Set attribute `name` to the `values` of cuDNN type `ty`.
    ///
    /// # Safety
    /// `V` must be the C type cuDNN reads for `ty` (`i64` for `CUDNN_TYPE_INT64`, a
    /// descriptor pointer for `CUDNN_TYPE_BACKEND_DESCRIPTOR`, ...).
    unsafe fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<()> {
        // SAFETY: `self.0` is a live descriptor; `values` holds `values.len()` elements of
        // the type `ty` names (this function's contract), read during the call only.
        check("cudnnBackendSetAttribute", unsafe {
            dnn::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr().cast(),
            )
        })
    }

    fn set_i64(&self, name: A, values: &[i64]) -> Result<()> {
        // SAFETY: i64 is what CUDNN_TYPE_INT64 reads.
        unsafe { self.set(name, T::CUDNN_TYPE_INT64, values) }
    }

    fn set_descs(&self, name: A, values: &[&Desc]) -> Result<()> {
        let raw: Vec<dnn::cudnnBackendDescriptor_t> = values.iter().map(|d| d.0).collect();
        // SAFETY: descriptor pointers are what CUDNN_TYPE_BACKEND_DESCRIPTOR reads; each is
        // live (borrowed for the call).
        unsafe { self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }
    }

    fn set_handle(&self, name: A, handle: dnn::cudnnHandle_t) -> Result<()> {
        // SAFETY: a handle is what CUDNN_TYPE_HANDLE reads.
        unsafe { self.set(name, T::CUDNN_TYPE_HANDLE, &[handle]) }
    }

    fn finalize(&self) -> Result<()> {
        // SAFETY: a live descriptor with its attributes set.
        check("cudnnBackendFinalize", unsafe {
            dnn::cudnnBackendFinalize(self.0)
        })
    }

    /// Read up to `out.len()` descriptors of attribute `name` into `out` (made by the
    /// caller, of the kind cuDNN fills); how many it filled.
    fn get_descs(&self, name: A, out: &[Desc]) -> Result<usize> {
        let mut raw: Vec<dnn::cudnnBackendDescriptor_t> = out.iter().map(|d| d.0).collect();
        let mut n: i64 = 0;
        // SAFETY: `raw` holds `raw.len()` live descriptors of the kind the attribute holds,
        // which cuDNN fills in place; `n` is a valid local.
        check("cudnnBackendGetAttribute", unsafe {
            dnn::cudnnBackendGetAttribute(
                self.0,
                name,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raw.len() as i64,
                &mut n,
                raw.as_mut_ptr().cast(),
            )
        })?;
        Ok((n.max(0) as usize).min(out.len()))
    }

    /// How many descriptors attribute `name` holds.
    fn count_descs(&self, name: A) -> Result<usize> {
        let mut n: i64 = 0;
        // SAFETY: a request for 0 elements writes only the count into the valid local `n`.
        check("cudnnBackendGetAttribute", unsafe {
            dnn::cudnnBackendGetAttribute(
                self.0,
                name,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut n,
                std::ptr::null_mut(),
            )
        })?;
        Ok(n.max(0) as usize)
    }

    fn get_i64(&self, name: A) -> Result<i64> {
        let (mut n, mut v) = (0i64, 0i64);
        // SAFETY: one INT64 element into the valid local `v`.
        check("cudnnBackendGetAttribute", unsafe {
            dnn::cudnnBackendGetAttribute(
                self.0,
                name,
                T::CUDNN_TYPE_INT64,
                1,
                &mut n,
                (&mut v as *mut i64).cast(),
            )
        })?;
        Ok(v)
    }

    /// An engine's numerical notes, as integers (a value this binding does not know is
    /// kept as a number, never read as an enum).
    fn notes(&self) -> Result<Vec<i32>> {
        let mut notes = [0i32; MAX_NOTES];
        let mut n: i64 = 0;
        // SAFETY: up to MAX_NOTES C enums (4-byte ints) into `notes`; `n` a valid local.
        check("cudnnBackendGetAttribute", unsafe {
            dnn::cudnnBackendGetAttribute(
                self.0,
                A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                T::CUDNN_TYPE_NUMERICAL_NOTE,
                MAX_NOTES as i64,
                &mut n,
                notes.as_mut_ptr().cast(),
            )
        })?;
        Ok(notes[..(n.max(0) as usize).min(MAX_NOTES)].to_vec())
    }
}

/// One finalized execution plan.
#[derive(Debug)]
pub struct Plan {
    plan: Desc,
    /// Bytes of workspace it needs.
    pub workspace: usize,
    /// No `NONDETERMINISTIC` note.
    pub deterministic: bool,
}

/// The plans of one graph, best first, with every descriptor they were made from.
#[derive(Debug)]
pub struct GraphPlans {
    pub plans: Vec<Plan>,
    _graph: Vec<Desc>,
}

// SAFETY: the descriptors are host objects of cuDNN's, used only under the driver's cuDNN
// lock (`RealDriver::cudnn_calls`), one call at a time, from whichever thread holds it.
unsafe impl Send for GraphPlans {}
// SAFETY: as for `Send`: shared references are only used under that lock.
unsafe impl Sync for GraphPlans {}

fn tensor(t: &TensorSpec) -> Result<Desc> {
    let d = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    // SAFETY: a cudnnDataType_t is what CUDNN_TYPE_DATA_TYPE reads.
    unsafe {
        d.set(
            A::CUDNN_ATTR_TENSOR_DATA_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[t.data],
        )?
    };
    d.set_i64(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &t.dims)?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_STRIDES, &t.strides)?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[t.uid])?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[t.align])?;
    d.finalize()?;
    Ok(d)
}

/// Make the operation graph of `spec` on `handle` and finalize up to [`MAX_PLANS`] plans
/// from cuDNN's heuristics (instant mode, then the fallback list) that `p`'s settings allow,
/// and the first deterministic one after them if none of those is ([`wants_plan`]).
/// No plan at all is an error saying why.
pub fn build_plans(
    handle: dnn::cudnnHandle_t,
    p: &ConvProblem,
    spec: &GraphSpec,
) -> Result<GraphPlans> {
    let x = tensor(&spec.x)?;
    let w = tensor(&spec.w)?;
    let y = tensor(&spec.y)?;
    let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    // SAFETY: each value is the C type its attribute type names (a cudnnDataType_t, a
    // cudnnConvolutionMode_t).
    unsafe {
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[spec.compute],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
        )?;
    }
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &spec.dilation)?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &spec.stride)?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &spec.pre_pad)?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &spec.post_pad)?;
    conv.finalize()?;

    let op = Desc::new(spec.op.kind)?;
    op.set_descs(spec.op.x, &[&x])?;
    op.set_descs(spec.op.w, &[&w])?;
    op.set_descs(spec.op.y, &[&y])?;
    op.set_descs(spec.op.conv, &[&conv])?;
    // SAFETY: f64 is what CUDNN_TYPE_DOUBLE reads, f32 what CUDNN_TYPE_FLOAT reads.
    unsafe {
        if spec.double_scalars {
            op.set(spec.op.alpha, T::CUDNN_TYPE_DOUBLE, &[spec.alpha])?;
            op.set(spec.op.beta, T::CUDNN_TYPE_DOUBLE, &[spec.beta])?;
        } else {
            op.set(spec.op.alpha, T::CUDNN_TYPE_FLOAT, &[spec.alpha as f32])?;
            op.set(spec.op.beta, T::CUDNN_TYPE_FLOAT, &[spec.beta as f32])?;
        }
    }
    op.finalize()?;

    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
    graph.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op])?;
    graph.finalize()?;

    let mut keep = vec![x, w, y, conv, op];
    let mut plans = Vec::new();
    let mut refused = Vec::new();
    // No further plan wanted, whatever its engine.
    let enough =
        |plans: &[Plan]| !wants_plan(plans.len(), plans.iter().any(|pl| pl.deterministic), true);
    for mode in [
        dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_INSTANT,
        dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
    ] {
        if enough(&plans) {
            break;
        }
        let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        heur.set_descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?;
        // SAFETY: a cudnnBackendHeurMode_t is what CUDNN_TYPE_HEUR_MODE reads.
        unsafe {
            heur.set(
                A::CUDNN_ATTR_ENGINEHEUR_MODE,
                T::CUDNN_TYPE_HEUR_MODE,
                &[mode],
            )?
        };
        if let Err(e) = heur.finalize() {
            refused.push(format!("heuristics {mode:?}: {e}"));
            continue;
        }
        let count = heur.count_descs(A::CUDNN_ATTR_ENGINEHEUR_RESULTS)?;
        if count == 0 {
            keep.push(heur);
            continue;
        }
        let configs = (0..count)
            .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
            .collect::<Result<Vec<_>>>()?;
        let filled = heur.get_descs(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, &configs)?;
        for cfg in configs.into_iter().take(filled) {
            if enough(&plans) {
                break;
            }
            let engine = [Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?];
            if cfg.get_descs(A::CUDNN_ATTR_ENGINECFG_ENGINE, &engine)? != 1 {
                continue;
            }
            let [engine] = engine;
            let Some(deterministic) = keep_engine(&engine.notes()?, p) else {
                continue;
            };
            let made_deterministic = plans.iter().any(|pl: &Plan| pl.deterministic);
            if !wants_plan(plans.len(), made_deterministic, deterministic) {
                continue;
            }
            let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            plan.set_handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
            plan.set_descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&cfg])?;
            if let Err(e) = plan.finalize() {
                refused.push(e.to_string());
                continue;
            }
            let workspace = plan
                .get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?
                .max(0) as usize;
            plans.push(Plan {
                plan,
                workspace,
                deterministic,
            });
            keep.push(engine);
            keep.push(cfg);
        }
        keep.push(heur);
    }
    keep.push(graph);
    if plans.is_empty() {
        let why = if refused.is_empty() {
            "the heuristics offered no engine these settings allow".to_string()
        } else {
            format!("no engine could be planned ({})", refused.join("; "))
        };
        return Err(DeviceError::Driver {
            call: "cudnnBackendFinalize",
            code: "CUDNN_STATUS_NOT_SUPPORTED".into(),
            detail: why,
        });
    }
    Ok(GraphPlans {
        plans,
        _graph: keep,
    })
}

/// Enqueue `plan` on `handle`'s stream over the buffers `(x, w, y)` and the workspace.
pub fn execute(
    handle: dnn::cudnnHandle_t,
    plan: &Plan,
    (x, w, y): (u64, u64, u64),
    workspace: u64,
) -> Result<()> {
    let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    let ptrs: [*mut c_void; 3] = [x as *mut c_void, w as *mut c_void, y as *mut c_void];
    pack.set_i64(
        A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        &[UID_X, UID_W, UID_Y],
    )?;
    // SAFETY: device pointers are what CUDNN_TYPE_VOID_PTR reads; the pack only records
    // them (the caller vouches for the memory, the seam's contract).
    unsafe {
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &ptrs,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[workspace as *mut c_void],
        )?;
    }
    pack.finalize()?;
    // SAFETY: the plan was finalized on this handle; the pack names the plan's tensors by
    // their unique ids with the caller's buffers and a workspace of at least
    // `plan.workspace` bytes.
    check("cudnnBackendExecute", unsafe {
        dnn::cudnnBackendExecute(handle, plan.plan.0, pack.0)
    })
}

/// Cache key of a graph's plans: device, problem, and the bits of alpha and beta.
pub type PlanKey = (usize, ConvProblem, u64, u64);

/// The plans made so far, per graph; kept behind the driver's cuDNN lock.
#[derive(Debug, Default)]
pub struct PlanCache {
    graphs: HashMap<PlanKey, Arc<GraphPlans>>,
    /// Problems the graph API could not plan, and the error it gave, so each is tried once.
    refused: HashMap<PlanKey, DeviceError>,
}

impl PlanCache {
    /// The plans of `key`, made with `make` on first use; a refusal is kept and returned again.
    pub fn get_or_make(
        &mut self,
        key: PlanKey,
        make: impl FnOnce() -> Result<GraphPlans>,
    ) -> Result<Arc<GraphPlans>> {
        if let Some(g) = self.graphs.get(&key) {
            return Ok(g.clone());
        }
        if let Some(e) = self.refused.get(&key) {
            return Err(e.clone());
        }
        match make() {
            Ok(g) => {
                let g = Arc::new(g);
                self.graphs.insert(key, g.clone());
                Ok(g)
            }
            Err(e) => {
                self.refused.insert(key, e.clone());
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(direction: ConvDirection, dtype: GemmType) -> ConvProblem {
        ConvProblem {
            direction,
            dtype,
            x_dims: [2, 6, 9, 7],
            x_strides: [378, 63, 7, 1],
            w_dims: [4, 3, 3, 2],
            y_dims: [2, 4, 5, 4],
            y_strides: [80, 20, 4, 1],
            pad: (1, 0),
            stride: (2, 2),
            dilation: (1, 2),
            groups: 2,
            allow_tf32: true,
            align: 16,
        }
    }

    #[test]
    fn the_graph_carries_the_problem() {
        use dnn::cudnnDataType_t as Dt;
        let p = problem(ConvDirection::Forward, GemmType::F16);
        let g = graph_spec(&p, 1.0, 0.0);
        assert_eq!(g.x.uid, UID_X);
        assert_eq!((g.w.uid, g.y.uid), (UID_W, UID_Y));
        assert_eq!(g.x.dims, [2, 6, 9, 7]);
        assert_eq!(g.x.strides, [378, 63, 7, 1]);
        // The filter packed; groups implied by 6 input channels against 3 per group.
        assert_eq!(g.w.dims, [4, 3, 3, 2]);
        assert_eq!(g.w.strides, [18, 6, 2, 1]);
        assert_eq!(g.y.strides, [80, 20, 4, 1]);
        assert!([g.x, g.w, g.y].iter().all(|t| t.align == 16));
        assert!(
            [g.x, g.w, g.y]
                .iter()
                .all(|t| t.data == Dt::CUDNN_DATA_HALF)
        );
        assert_eq!(g.compute, Dt::CUDNN_DATA_FLOAT);
        assert_eq!((g.pre_pad, g.post_pad), ([1, 0], [1, 0]));
        assert_eq!((g.stride, g.dilation), ([2, 2], [1, 2]));
        assert_eq!((g.alpha, g.beta, g.double_scalars), (1.0, 0.0, false));
        let g64 = graph_spec(&problem(ConvDirection::Forward, GemmType::F64), 1.0, 1.0);
        assert_eq!(g64.compute, Dt::CUDNN_DATA_DOUBLE);
        assert!(g64.double_scalars && g64.beta == 1.0);
        let bf = graph_spec(&problem(ConvDirection::Forward, GemmType::Bf16), 1.0, 0.0);
        assert_eq!(bf.x.data, Dt::CUDNN_DATA_BFLOAT16);
    }

    #[test]
    fn each_direction_names_its_own_operands() {
        let f = op_attrs(ConvDirection::Forward);
        assert_eq!(
            (f.x, f.w, f.y),
            (
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y
            )
        );
        // Backward-data writes x (DX) from y (DY); backward-filter writes w (DW).
        let d = op_attrs(ConvDirection::BackwardData);
        assert_eq!(
            d.kind,
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
        );
        assert_eq!(
            (d.x, d.y, d.conv),
            (
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC
            )
        );
        let w = op_attrs(ConvDirection::BackwardFilter);
        assert_eq!(
            w.kind,
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR
        );
        assert_eq!(
            (w.x, w.w, w.alpha, w.beta),
            (
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA
            )
        );
    }

    #[test]
    fn engines_are_filtered_as_pytorch_filters_them() {
        use dnn::cudnnBackendNumericalNote_t as N;
        let tc = N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as i32;
        let down = N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS as i32;
        let nondet = N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC as i32;
        let mut f32_tf32 = problem(ConvDirection::Forward, GemmType::F32);
        assert_eq!(keep_engine(&[], &f32_tf32), Some(true));
        assert_eq!(keep_engine(&[tc], &f32_tf32), Some(true));
        assert_eq!(keep_engine(&[tc, nondet], &f32_tf32), Some(false));
        assert_eq!(keep_engine(&[down], &f32_tf32), None);
        f32_tf32.allow_tf32 = false;
        assert_eq!(keep_engine(&[tc], &f32_tf32), None);
        assert_eq!(keep_engine(&[nondet, 99], &f32_tf32), Some(false));
        // Half precision keeps its tensor cores whatever allow_tf32 says.
        let mut half = problem(ConvDirection::BackwardFilter, GemmType::F16);
        half.allow_tf32 = false;
        assert_eq!(keep_engine(&[tc], &half), Some(true));
    }

    #[test]
    fn the_api_setting_parses() {
        assert_eq!(CudnnApi::parse(None), Ok(CudnnApi::Auto));
        assert_eq!(CudnnApi::parse(Some(" graph ")), Ok(CudnnApi::Graph));
        assert_eq!(CudnnApi::parse(Some("legacy")), Ok(CudnnApi::Legacy));
        let e = CudnnApi::parse(Some("v8")).unwrap_err();
        assert!(e.contains("auto, graph, legacy"), "{e}");
    }

    #[test]
    fn a_refused_graph_is_remembered() {
        let mut cache = PlanCache::default();
        let key = (0, problem(ConvDirection::Forward, GemmType::F32), 0, 0);
        let mut tries = 0;
        for _ in 0..2 {
            let e = cache
                .get_or_make(key, || {
                    tries += 1;
                    Err(DeviceError::driver("cudnnBackendFinalize", "no"))
                })
                .unwrap_err();
            assert!(e.to_string().contains("cudnnBackendFinalize"), "{e}");
        }
        assert_eq!(tries, 1);
    }
}
