//! CPU convolutions on oneDNN, where it loads. See Note [oneDNN at run time].

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use super::dnnl::{self, Api, Handle, Md, Pd, Prim};
use super::geometry::{Elem, Geo};
use super::scratch::raw_bytes;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::storage::CpuStorage;

// Note [oneDNN at run time]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's CPU convolutions are oneDNN's: blocked layouts (nChw16c, OIhw16i16o), direct
// JIT kernels per ISA (AVX2, AVX-512, AVX-512 BF16, AMX) and a backward data that never
// scatters. Ember loads the same library at run time, as it loads MKL (never linked):
// `libdnnl.so.3` from `EMBER_ONEDNN_PATH`, `target/onednn/lib` (`cargo xtask onednn`
// installs PyPI's `onednn-cpu-gomp` there) or the loader path. Each call does what PyTorch's
// eager NCHW call does: a primitive for the shape with layouts left to oneDNN
// (`format_tag_any`), reorders from and to the plain NCHW / OIHW tensors around it, and
// scratch memory (blocked copies, oneDNN's scratchpad) from the caching allocator (Note
// [Convolution scratch from the caching allocator]). Creating a primitive JIT-compiles it,
// so primitives and reorders are cached per direction, dtype and geometry for the process.
// f32 and bf16 go to oneDNN; f16 and f64, a shape oneDNN refuses, a machine without the
// library, `EMBER_CPU_CONV=rust` and `backends::mkldnn::set_enabled(false)` take the
// portable kernels (`im2col.rs`, `depthwise.rs`). oneDNN runs on its OpenMP team (GNU's,
// as PyTorch's wheels), told to use as many threads as Ember's own team has; the two never
// run at once, since a convolution waits for its primitive.

/// The library, loaded on first use, or why not.
fn api() -> std::result::Result<&'static Api, &'static str> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(dnnl::load).as_ref().map_err(String::as_str)
}

/// `EMBER_CPU_CONV`: `auto` (oneDNN where it loads), `rust`, or `onednn` (an error where it
/// does not load).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Auto,
    Rust,
    Onednn,
}

fn choice() -> std::result::Result<Choice, String> {
    static CHOICE: OnceLock<std::result::Result<Choice, String>> = OnceLock::new();
    CHOICE
        .get_or_init(|| match std::env::var("EMBER_CPU_CONV").as_deref() {
            Err(_) | Ok("") | Ok("auto") => Ok(Choice::Auto),
            Ok("rust") => Ok(Choice::Rust),
            Ok("onednn") => Ok(Choice::Onednn),
            Ok(other) => Err(format!(
                "EMBER_CPU_CONV: expected auto, rust or onednn, found {other:?}"
            )),
        })
        .clone()
}

/// What `ember info` and the benchmarks say about the CPU convolutions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OnednnInfo {
    /// The library's path and version where it loaded.
    pub(crate) loaded: Option<(String, (i32, i32, i32))>,
    /// Why it is not used, where it is not.
    pub(crate) reason: Option<String>,
}

/// Whether oneDNN is loaded and chosen, and why not.
pub(crate) fn onednn_info() -> OnednnInfo {
    let loaded = api()
        .ok()
        .map(|a| (a.path.display().to_string(), a.version));
    let reason = match (choice(), api()) {
        (Err(e), _) => Some(e),
        (Ok(Choice::Rust), _) => Some("EMBER_CPU_CONV=rust".into()),
        (Ok(_), Err(e)) => Some(e.to_string()),
        (Ok(_), Ok(_)) if !crate::backends::mkldnn::enabled() => {
            Some("backends::mkldnn::set_enabled(false)".into())
        }
        _ => None,
    };
    OnednnInfo { loaded, reason }
}

/// The library when convolutions of `dtype` should use it now: `Ok(None)` for the portable
/// kernels, an error when `EMBER_CPU_CONV=onednn` cannot be honoured.
fn use_onednn(dtype: DType) -> Result<Option<&'static Api>> {
    if !matches!(dtype, DType::F32 | DType::Bf16) || !crate::backends::mkldnn::enabled() {
        return Ok(None);
    }
    match choice().map_err(|e| TensorError::invalid("conv2d", e))? {
        Choice::Rust => Ok(None),
        Choice::Auto => Ok(api().ok()),
        Choice::Onednn => api()
            .map(Some)
            .map_err(|e| TensorError::invalid("conv2d", format!("EMBER_CPU_CONV=onednn: {e}"))),
    }
}

/// Whether convolutions of `dtype` go to oneDNN now (an error when `EMBER_CPU_CONV=onednn`
/// cannot be honoured).
pub(super) fn wanted(dtype: DType) -> Result<bool> {
    Ok(use_onednn(dtype)?.is_some())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Dir {
    Forward { bias: bool },
    BackwardData,
    BackwardWeights,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    dir: Dir,
    bf16: bool,
    x: [usize; 4],
    w: [usize; 4],
    g: usize,
    stride: (usize, usize),
    pad: (usize, usize),
    dilation: (usize, usize),
    out: (usize, usize),
}

/// A plain operand of a primitive: its plain descriptor, the one the primitive chose, and
/// the reorder between them where they differ.
struct Operand {
    plain: Md<'static>,
    /// The primitive's descriptor (owned by the primitive descriptor).
    chosen: Handle,
    reorder: Option<(Pd, Prim)>,
}

/// A cached primitive and its operands in execution-argument order.
struct Entry {
    _hint: Option<Pd>,
    pd: Pd,
    prim: Prim,
    /// (argument, operand, is_output).
    ops: Vec<(c_int, Operand, bool)>,
    bias: Option<Md<'static>>,
    scratch: usize,
    name: String,
}

// SAFETY: the descriptors' handles are immutable after creation and owned by `Entry`
// (`Md`, `Pd`, `Prim` destroy them when it goes); oneDNN allows concurrent executions of a
// primitive with user scratchpads.
unsafe impl Send for Entry {}
// SAFETY: as above.
unsafe impl Sync for Entry {}

type Cache = Mutex<HashMap<Key, Option<Arc<Entry>>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn dims(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&d| d as i64).collect()
}

fn arr(a: (usize, usize)) -> dnnl::Dims {
    let mut d = [0i64; 12];
    d[0] = a.0 as i64;
    d[1] = a.1 as i64;
    d
}

/// oneDNN's geometry arrays: strides, dilations (`d - 1`), left and right padding (the
/// right one is what makes the output size come out, possibly negative, as PyTorch's).
fn conv_arrays(geo: &Geo) -> [dnnl::Dims; 4] {
    let p = &geo.p;
    let right = |out: usize, s: usize, k: usize, d: usize, inp: usize, pl: usize| {
        (out as i64 - 1) * s as i64 + ((k as i64 - 1) * d as i64 + 1) - inp as i64 - pl as i64
    };
    let mut pr = [0i64; 12];
    pr[0] = right(geo.oh, p.stride.0, geo.kh, p.dilation.0, geo.h, p.pad.0);
    pr[1] = right(geo.ow, p.stride.1, geo.kw, p.dilation.1, geo.w, p.pad.1);
    [
        arr(p.stride),
        arr((p.dilation.0 - 1, p.dilation.1 - 1)),
        arr(p.pad),
        pr,
    ]
}

fn build(api: &'static Api, key: &Key, geo: &Geo) -> std::result::Result<Entry, String> {
    let dt = if key.bf16 {
        dnnl::DT_BF16
    } else {
        dnnl::DT_F32
    };
    let x = dims(&key.x);
    let y = dims(&[geo.n, geo.o, geo.oh, geo.ow]);
    let (w, wtag) = if geo.g > 1 {
        (
            dims(&[geo.g, geo.og, geo.cg, geo.kh, geo.kw]),
            dnnl::TAG_ABCDE,
        )
    } else {
        (dims(&key.w), dnnl::TAG_ABCD)
    };
    let any = |d: &[i64]| api.md(d, dt, dnnl::TAG_ANY);
    let (xa, wa, ya) = (any(&x)?, any(&w)?, any(&y)?);
    let [strides, dil, pl, pr] = conv_arrays(geo);
    let attr = api.attr()?;
    let bias_md = match key.dir {
        Dir::Forward { bias: true } => Some(api.md(&[geo.o as i64], dt, dnnl::TAG_A)?),
        _ => None,
    };
    let fwd = |prop: c_int, bias: Handle| -> std::result::Result<Pd, String> {
        let mut h = std::ptr::null_mut();
        // SAFETY: live descriptors and attributes, 12-long arrays, a valid out-pointer.
        let s = unsafe {
            (api.conv_fwd_pd)(
                &mut h,
                api.engine(),
                prop,
                dnnl::CONVOLUTION_DIRECT,
                xa.h,
                wa.h,
                bias,
                ya.h,
                strides.as_ptr(),
                dil.as_ptr(),
                pl.as_ptr(),
                pr.as_ptr(),
                attr.h,
            )
        };
        dnnl::check(s, "dnnl_convolution_forward_primitive_desc_create")?;
        Ok(api.pd(h))
    };
    let (hint, pd) = match key.dir {
        Dir::Forward { .. } => {
            // Training and inference run the same kernels for convolutions (no
            // workspace); PyTorch asks for the training one too.
            let b = bias_md.as_ref().map_or(std::ptr::null_mut(), |m| m.h);
            (None, fwd(dnnl::FORWARD_TRAINING, b)?)
        }
        Dir::BackwardData => {
            let hint = fwd(dnnl::FORWARD_TRAINING, std::ptr::null_mut())?;
            let mut h = std::ptr::null_mut();
            // SAFETY: as for the forward; `hint.h` is a live forward descriptor.
            let s = unsafe {
                (api.conv_bwd_data_pd)(
                    &mut h,
                    api.engine(),
                    dnnl::CONVOLUTION_DIRECT,
                    xa.h,
                    wa.h,
                    ya.h,
                    strides.as_ptr(),
                    dil.as_ptr(),
                    pl.as_ptr(),
                    pr.as_ptr(),
                    hint.h,
                    attr.h,
                )
            };
            dnnl::check(s, "dnnl_convolution_backward_data_primitive_desc_create")?;
            (Some(hint), api.pd(h))
        }
        Dir::BackwardWeights => {
            let hint = fwd(dnnl::FORWARD_TRAINING, std::ptr::null_mut())?;
            let mut h = std::ptr::null_mut();
            // SAFETY: as above; a null diff-bias descriptor means no bias gradient.
            let s = unsafe {
                (api.conv_bwd_weights_pd)(
                    &mut h,
                    api.engine(),
                    dnnl::CONVOLUTION_DIRECT,
                    xa.h,
                    wa.h,
                    std::ptr::null_mut(),
                    ya.h,
                    strides.as_ptr(),
                    dil.as_ptr(),
                    pl.as_ptr(),
                    pr.as_ptr(),
                    hint.h,
                    attr.h,
                )
            };
            dnnl::check(s, "dnnl_convolution_backward_weights_primitive_desc_create")?;
            (Some(hint), api.pd(h))
        }
    };
    let prim = api.primitive(&pd)?;
    // (argument, query, plain dims, plain tag, output?)
    let layout: [(c_int, c_int, &[i64], c_int, bool); 3] = match key.dir {
        Dir::Forward { .. } => [
            (dnnl::ARG_SRC, dnnl::Q_SRC_MD, &x, dnnl::TAG_ABCD, false),
            (dnnl::ARG_WEIGHTS, dnnl::Q_WEIGHTS_MD, &w, wtag, false),
            (dnnl::ARG_DST, dnnl::Q_DST_MD, &y, dnnl::TAG_ABCD, true),
        ],
        Dir::BackwardData => [
            (
                dnnl::ARG_DIFF_DST,
                dnnl::Q_DIFF_DST_MD,
                &y,
                dnnl::TAG_ABCD,
                false,
            ),
            (dnnl::ARG_WEIGHTS, dnnl::Q_WEIGHTS_MD, &w, wtag, false),
            (
                dnnl::ARG_DIFF_SRC,
                dnnl::Q_DIFF_SRC_MD,
                &x,
                dnnl::TAG_ABCD,
                true,
            ),
        ],
        Dir::BackwardWeights => [
            (dnnl::ARG_SRC, dnnl::Q_SRC_MD, &x, dnnl::TAG_ABCD, false),
            (
                dnnl::ARG_DIFF_DST,
                dnnl::Q_DIFF_DST_MD,
                &y,
                dnnl::TAG_ABCD,
                false,
            ),
            (
                dnnl::ARG_DIFF_WEIGHTS,
                dnnl::Q_DIFF_WEIGHTS_MD,
                &w,
                wtag,
                true,
            ),
        ],
    };
    let mut ops = Vec::new();
    for (arg, q, d, tag, out) in layout {
        let plain = api.md(d, dt, tag)?;
        let chosen = api.query_md(&pd, q);
        if chosen.is_null() {
            return Err(format!("no descriptor for argument {arg}"));
        }
        let reorder = if api.md_equal(plain.h, chosen) {
            None
        } else if out {
            Some(api.reorder(chosen, plain.h)?)
        } else {
            Some(api.reorder(plain.h, chosen)?)
        };
        ops.push((
            arg,
            Operand {
                plain,
                chosen,
                reorder,
            },
            out,
        ));
    }
    let scratch = api.md_size(api.query_md(&pd, dnnl::Q_SCRATCHPAD_MD));
    let name = api.impl_name(&pd);
    Ok(Entry {
        _hint: hint,
        pd,
        prim,
        ops,
        bias: bias_md,
        scratch,
        name,
    })
}

/// The cached primitive of `key`, built on first use; `None` where oneDNN refused it (the
/// refusal is cached too, and said once on stderr).
fn entry(api: &'static Api, key: Key, geo: &Geo) -> Option<Arc<Entry>> {
    if let Some(e) = cache().lock().ok()?.get(&key) {
        return e.clone();
    }
    let built = match build(api, &key, geo) {
        Ok(e) => Some(Arc::new(e)),
        Err(why) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "ember: oneDNN refused a convolution ({key:?}: {why}); it and any other it refuses run on Ember's own kernels"
                );
            });
            None
        }
    };
    cache().lock().ok()?.insert(key, built.clone());
    built
}

/// Bytes from the caching allocator, kept alive until the end of the call.
fn buffer(bytes: usize, keep: &mut Vec<ember_memory::Allocation>) -> Result<*mut c_void> {
    match raw_bytes(bytes)? {
        Some(a) => {
            let p = a.as_ptr().cast();
            keep.push(a);
            Ok(p)
        }
        None => Ok(std::ptr::null_mut()),
    }
}

/// Runs `e` over the plain operands `inputs` (in `e.ops` order, then the bias) into `out`
/// (the plain output, `len` elements of `T`).
fn run<T: Elem>(
    api: &Api,
    e: &Entry,
    inputs: [&[T]; 2],
    bias: Option<&[T]>,
    len: usize,
) -> Result<CpuStorage> {
    let fail = |m: String| TensorError::invalid("conv2d", format!("oneDNN: {m}"));
    let mut out = CpuStorage::zeroed(T::DTYPE, len)?;
    let dst = out.as_mut_slice::<T>()?;
    let mut keep = Vec::new();
    let mut args: Vec<(c_int, Handle, *mut c_void)> = Vec::new();
    let mut post = None;
    api.set_threads(rayon::current_num_threads());
    for (i, (arg, op, is_out)) in e.ops.iter().enumerate() {
        let plain: *mut c_void = if *is_out {
            dst.as_mut_ptr().cast()
        } else {
            inputs
                .get(i)
                .map_or(std::ptr::null(), |s| s.as_ptr())
                .cast_mut()
                .cast()
        };
        let want = api.md_size(op.plain.h);
        let have = if *is_out {
            dst.len()
        } else {
            inputs.get(i).map_or(0, |s| s.len())
        } * std::mem::size_of::<T>();
        if want > have {
            return Err(fail(format!(
                "argument {arg}: {want} bytes needed, {have} given"
            )));
        }
        match &op.reorder {
            None => args.push((*arg, op.plain.h, plain)),
            Some((rpd, rprim)) => {
                let blocked = buffer(api.md_size(op.chosen), &mut keep)?;
                if *is_out {
                    post = Some((rpd, rprim, blocked, op, plain));
                } else {
                    let rs = api.md_size(api.query_md(rpd, dnnl::Q_SCRATCHPAD_MD));
                    let rsp = buffer(rs, &mut keep)?;
                    let mut rargs = vec![
                        (dnnl::ARG_SRC, op.plain.h, plain),
                        (dnnl::ARG_DST, op.chosen, blocked),
                    ];
                    if rs > 0 {
                        rargs.push((
                            dnnl::ARG_SCRATCHPAD,
                            api.query_md(rpd, dnnl::Q_SCRATCHPAD_MD),
                            rsp,
                        ));
                    }
                    // SAFETY: `plain` holds the operand's plain bytes (checked above),
                    // `blocked` and `rsp` are fresh buffers of their descriptors' sizes.
                    unsafe { api.execute(rprim, &rargs) }.map_err(fail)?;
                }
                args.push((*arg, op.chosen, blocked));
            }
        }
    }
    if let (Some(md), Some(b)) = (&e.bias, bias) {
        if api.md_size(md.h) > std::mem::size_of_val(b) {
            return Err(fail("bias too short".into()));
        }
        args.push((dnnl::ARG_BIAS, md.h, b.as_ptr().cast_mut().cast()));
    }
    if e.scratch > 0 {
        let sp = buffer(e.scratch, &mut keep)?;
        args.push((
            dnnl::ARG_SCRATCHPAD,
            api.query_md(&e.pd, dnnl::Q_SCRATCHPAD_MD),
            sp,
        ));
    }
    // SAFETY: every pointer addresses at least its descriptor's size: plain operands were
    // checked above, blocked ones and the scratchpad are fresh buffers of their sizes; the
    // output (plain or blocked) overlaps no input.
    unsafe { api.execute(&e.prim, &args) }.map_err(fail)?;
    if let Some((rpd, rprim, blocked, op, plain)) = post {
        let rs = api.md_size(api.query_md(rpd, dnnl::Q_SCRATCHPAD_MD));
        let rsp = buffer(rs, &mut keep)?;
        let mut rargs = vec![
            (dnnl::ARG_SRC, op.chosen, blocked),
            (dnnl::ARG_DST, op.plain.h, plain),
        ];
        if rs > 0 {
            rargs.push((
                dnnl::ARG_SCRATCHPAD,
                api.query_md(rpd, dnnl::Q_SCRATCHPAD_MD),
                rsp,
            ));
        }
        // SAFETY: `blocked` holds the primitive's output, `plain` is the output storage
        // (its size checked above).
        unsafe { api.execute(rprim, &rargs) }.map_err(fail)?;
    }
    Ok(out)
}

fn key(dir: Dir, dtype: DType, geo: &Geo) -> Key {
    Key {
        dir,
        bf16: dtype == DType::Bf16,
        x: [geo.n, geo.c, geo.h, geo.w],
        w: [geo.o, geo.cg, geo.kh, geo.kw],
        g: geo.g,
        stride: geo.p.stride,
        pad: geo.p.pad,
        dilation: geo.p.dilation,
        out: (geo.oh, geo.ow),
    }
}

fn empty(geo: &Geo) -> bool {
    geo.n == 0 || geo.c == 0 || geo.o == 0 || geo.l() == 0 || geo.hw() == 0
}

/// The forward on oneDNN (`x`, `w` contiguous), or `None` for the portable kernels.
pub(super) fn forward<T: Elem>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    geo: &Geo,
) -> Result<Option<CpuStorage>> {
    let Some(api) = use_onednn(T::DTYPE)? else {
        return Ok(None);
    };
    if empty(geo) {
        return Ok(None);
    }
    let dir = Dir::Forward {
        bias: bias.is_some(),
    };
    let Some(e) = entry(api, key(dir, T::DTYPE, geo), geo) else {
        return Ok(None);
    };
    run(api, &e, [x, w], bias, geo.n * geo.o * geo.l()).map(Some)
}

/// The input gradient on oneDNN (`dy`, `w` contiguous), or `None`.
pub(super) fn backward_data<T: Elem>(dy: &[T], w: &[T], geo: &Geo) -> Result<Option<CpuStorage>> {
    let Some(api) = use_onednn(T::DTYPE)? else {
        return Ok(None);
    };
    if empty(geo) {
        return Ok(None);
    }
    let Some(e) = entry(api, key(Dir::BackwardData, T::DTYPE, geo), geo) else {
        return Ok(None);
    };
    run(api, &e, [dy, w], None, geo.n * geo.c * geo.hw()).map(Some)
}

/// The weight gradient on oneDNN (`x`, `dy` contiguous), or `None`.
pub(super) fn backward_filter<T: Elem>(x: &[T], dy: &[T], geo: &Geo) -> Result<Option<CpuStorage>> {
    let Some(api) = use_onednn(T::DTYPE)? else {
        return Ok(None);
    };
    if empty(geo) {
        return Ok(None);
    }
    let Some(e) = entry(api, key(Dir::BackwardWeights, T::DTYPE, geo), geo) else {
        return Ok(None);
    };
    run(api, &e, [x, dy], None, geo.o * geo.k()).map(Some)
}

/// Which implementation oneDNN chose for the forward of this geometry (for tests and
/// `ember info`), or `None` where it is not used.
#[allow(dead_code)]
pub(super) fn forward_impl(dtype: DType, geo: &Geo) -> Option<String> {
    let api = use_onednn(dtype).ok()??;
    let e = entry(api, key(Dir::Forward { bias: false }, dtype, geo), geo)?;
    Some(e.name.clone())
}
