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
    // The weight gradient is made in f32 whatever the inputs' dtype: each sub-batch's
    // (Note [oneDNN inside Ember's team]) is summed with the others before rounding.
    let wdt = if key.dir == Dir::BackwardWeights {
        dnnl::DT_F32
    } else {
        dt
    };
    let any = |d: &[i64], dt| api.md(d, dt, dnnl::TAG_ANY);
    let (xa, wa, ya) = (any(&x, dt)?, any(&w, wdt)?, any(&y, dt)?);
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
        let plain = api.md(
            d,
            if arg == dnnl::ARG_DIFF_WEIGHTS {
                wdt
            } else {
                dt
            },
            tag,
        )?;
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
    Ok(Entry {
        _hint: hint,
        pd,
        prim,
        ops,
        bias: bias_md,
        scratch,
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

/// Runs `e` over the plain operands `inputs` (in `e.ops` order, then the bias) into `dst`
/// (the plain output), on the calling thread with `omp` OpenMP threads.
fn run_one<T: Elem, O: crate::dtype::WithDType>(
    api: &Api,
    e: &Entry,
    inputs: [&[T]; 2],
    bias: Option<&[T]>,
    dst: &mut [O],
    omp: usize,
) -> Result<()> {
    let fail = |m: String| TensorError::invalid("conv2d", format!("oneDNN: {m}"));
    let mut keep = Vec::new();
    let mut args: Vec<(c_int, Handle, *mut c_void)> = Vec::new();
    let mut post = None;
    api.set_threads(omp);
    for (i, (arg, op, is_out)) in e.ops.iter().enumerate() {
        let (plain, have): (*mut c_void, usize) = if *is_out {
            (dst.as_mut_ptr().cast(), std::mem::size_of_val(dst))
        } else {
            let s = inputs.get(i).copied().unwrap_or(&[]);
            (s.as_ptr().cast_mut().cast(), std::mem::size_of_val(s))
        };
        let want = api.md_size(op.plain.h);
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
                    reorder(
                        api,
                        rpd,
                        rprim,
                        (op.plain.h, plain),
                        (op.chosen, blocked),
                        &mut keep,
                    )?;
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
        reorder(
            api,
            rpd,
            rprim,
            (op.chosen, blocked),
            (op.plain.h, plain),
            &mut keep,
        )?;
    }
    Ok(())
}

/// Runs a cached reorder from `src` to `dst` (descriptor, pointer), with its scratchpad.
fn reorder(
    api: &Api,
    rpd: &Pd,
    rprim: &Prim,
    src: (Handle, *mut c_void),
    dst: (Handle, *mut c_void),
    keep: &mut Vec<ember_memory::Allocation>,
) -> Result<()> {
    let smd = api.query_md(rpd, dnnl::Q_SCRATCHPAD_MD);
    let rs = api.md_size(smd);
    let mut rargs = vec![(dnnl::ARG_SRC, src.0, src.1), (dnnl::ARG_DST, dst.0, dst.1)];
    if rs > 0 {
        rargs.push((dnnl::ARG_SCRATCHPAD, smd, buffer(rs, keep)?));
    }
    // SAFETY: the callers pass buffers of at least their descriptors' sizes (plain operands
    // checked in `run_one`, blocked ones allocated at their size) and a fresh scratchpad.
    unsafe { api.execute(rprim, &rargs) }
        .map_err(|m| TensorError::invalid("conv2d", format!("oneDNN: {m}")))
}

// Note [oneDNN inside Ember's team]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// oneDNN threads with OpenMP: a second team of threads beside Ember's own
// (`ember_gemm::parallel`), whose idle workers spin after every region. On a 2-core host
// the two teams took the cores from each other: a convolution step ran 3-4× slower than
// with `OMP_WAIT_POLICY=passive` (conv_profile, batch 4). As MKL's GEMMs (Note
// [Independent blocks]), a convolution is therefore cut into one sub-batch per thread of
// Ember's team, each a complete oneDNN execution with one OpenMP thread (no OpenMP team is
// ever woken), its own blocked copies and scratchpad; samples are independent, so the
// forward and the input gradient are exact, and the weight gradient is the sum of the
// sub-batches' (made in f32, rounded once). A batch of one runs on one execution with as
// many OpenMP threads as Ember's team has. Primitives are cached per sub-batch size.

/// A pointer shared by the tasks that write disjoint parts of one output.
#[derive(Clone, Copy)]
struct SharedOut<O>(*mut O);
// SAFETY: only used by `by_parts`, whose tasks write disjoint ranges of a slice borrowed
// mutably for the whole loop.
unsafe impl<O: Send> Send for SharedOut<O> {}
// SAFETY: as above.
unsafe impl<O: Send> Sync for SharedOut<O> {}

impl<O> SharedOut<O> {
    fn get(&self) -> *mut O {
        self.0
    }
}

/// Cuts `n` samples into sub-batches (Note [oneDNN inside Ember's team]): `(n0, nc)`.
fn parts(n: usize) -> Vec<(usize, usize)> {
    let p = rayon::current_num_threads().clamp(1, n.max(1));
    (0..p)
        .map(|i| (i * n / p, (i + 1) * n / p - i * n / p))
        .collect()
}

/// The cached entries of the sub-batches of `geo` in direction `dir`, or `None` where
/// oneDNN refuses one.
fn entries(
    api: &'static Api,
    dir: Dir,
    dtype: DType,
    geo: &Geo,
    ps: &[(usize, usize)],
) -> Option<Vec<Arc<Entry>>> {
    ps.iter()
        .map(|&(_, nc)| {
            let g = Geo { n: nc, ..*geo };
            entry(api, key(dir, dtype, &g), &g)
        })
        .collect()
}

/// Runs `f(part, out)` for each sub-batch on Ember's team, `out` the part's `per·nc`
/// elements of `dst` (or, with `per == 0`, all of it for every part: callers then give each
/// part its own output). Returns the first error.
fn by_parts<O: Send>(
    ps: &[(usize, usize)],
    dst: &mut [O],
    per: usize,
    f: impl Fn(usize, &mut [O]) -> Result<()> + Sync,
) -> Result<()> {
    let len = dst.len();
    let base = SharedOut(dst.as_mut_ptr());
    let first: std::sync::Mutex<Option<(usize, TensorError)>> = std::sync::Mutex::new(None);
    ember_gemm::parallel::for_each_index(ps.len(), |i| {
        let (n0, nc) = ps[i];
        let (start, count) = (n0 * per, nc * per);
        if start + count > len {
            return;
        }
        // SAFETY: the parts' ranges `n0·per .. (n0 + nc)·per` are disjoint and inside
        // `dst` (checked above), which is borrowed mutably until the loop returns.
        let out = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), count) };
        if let Err(e) = f(i, out)
            && let Ok(mut slot) = first.lock()
            && slot.as_ref().is_none_or(|(j, _)| i < *j)
        {
            *slot = Some((i, e));
        }
    });
    match first.into_inner() {
        Ok(Some((_, e))) => Err(e),
        _ => Ok(()),
    }
}

/// OpenMP threads per execution: one when the batch is cut, else Ember's team's size.
fn omp_threads(ps: &[(usize, usize)]) -> usize {
    if ps.len() > 1 {
        1
    } else {
        rayon::current_num_threads()
    }
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
    let ps = parts(geo.n);
    let dir = Dir::Forward {
        bias: bias.is_some(),
    };
    let Some(es) = entries(api, dir, T::DTYPE, geo, &ps) else {
        return Ok(None);
    };
    let (xs, ys) = (geo.c * geo.hw(), geo.o * geo.l());
    let mut out = CpuStorage::zeroed(T::DTYPE, geo.n * ys)?;
    let omp = omp_threads(&ps);
    by_parts(&ps, out.as_mut_slice::<T>()?, ys, |i, dst| {
        let (n0, nc) = ps[i];
        let xi = x.get(n0 * xs..(n0 + nc) * xs).unwrap_or(&[]);
        run_one(api, &es[i], [xi, w], bias, dst, omp)
    })?;
    Ok(Some(out))
}

/// The input gradient on oneDNN (`dy`, `w` contiguous), or `None`.
pub(super) fn backward_data<T: Elem>(dy: &[T], w: &[T], geo: &Geo) -> Result<Option<CpuStorage>> {
    let Some(api) = use_onednn(T::DTYPE)? else {
        return Ok(None);
    };
    if empty(geo) {
        return Ok(None);
    }
    let ps = parts(geo.n);
    let Some(es) = entries(api, Dir::BackwardData, T::DTYPE, geo, &ps) else {
        return Ok(None);
    };
    let (xs, ys) = (geo.c * geo.hw(), geo.o * geo.l());
    let mut out = CpuStorage::zeroed(T::DTYPE, geo.n * xs)?;
    let omp = omp_threads(&ps);
    by_parts(&ps, out.as_mut_slice::<T>()?, xs, |i, dst| {
        let (n0, nc) = ps[i];
        let gi = dy.get(n0 * ys..(n0 + nc) * ys).unwrap_or(&[]);
        run_one(api, &es[i], [gi, w], None, dst, omp)
    })?;
    Ok(Some(out))
}

/// The weight gradient on oneDNN (`x`, `dy` contiguous), or `None`: each sub-batch's in
/// f32, summed, rounded once.
pub(super) fn backward_filter<T: Elem>(x: &[T], dy: &[T], geo: &Geo) -> Result<Option<CpuStorage>> {
    let Some(api) = use_onednn(T::DTYPE)? else {
        return Ok(None);
    };
    if empty(geo) || <T::Acc as crate::dtype::WithDType>::DTYPE != DType::F32 {
        return Ok(None);
    }
    let ps = parts(geo.n);
    let Some(es) = entries(api, Dir::BackwardWeights, T::DTYPE, geo, &ps) else {
        return Ok(None);
    };
    let (xs, ys, ws) = (geo.c * geo.hw(), geo.o * geo.l(), geo.o * geo.k());
    // One f32 gradient per sub-batch: part i owns `partial[i·ws ..]`.
    let mut partial = super::scratch::Scratch::<T::Acc>::zeroed(ps.len() * ws)?;
    let part_of: Vec<(usize, usize)> = (0..ps.len()).map(|i| (i, 1)).collect();
    let omp = omp_threads(&ps);
    by_parts(&part_of, partial.as_mut(), ws, |i, dst| {
        let (n0, nc) = ps[i];
        let xi = x.get(n0 * xs..(n0 + nc) * xs).unwrap_or(&[]);
        let gi = dy.get(n0 * ys..(n0 + nc) * ys).unwrap_or(&[]);
        run_one(api, &es[i], [xi, gi], None, dst, omp)
    })?;
    let sums = partial.as_slice();
    let np = ps.len();
    CpuStorage::from_chunks(ws, |r| {
        r.map(move |j| {
            let mut acc = sums[j];
            for p in 1..np {
                acc += sums[p * ws + j];
            }
            T::from_acc(acc)
        })
    })
    .map(Some)
}
