//! oneDNN's C API (v3), loaded at run time: the two dozen entry points and constants the
//! CPU convolutions use, and RAII wrappers for its handles. Nothing here knows about
//! convolutions' geometry; `onednn.rs` builds the primitives.

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};

pub(super) type Handle = *mut c_void;
type Status = c_int;
pub(super) type Dims = [i64; 12];

pub(super) const SUCCESS: Status = 0;
pub(super) const TAG_ANY: c_int = 1;
pub(super) const TAG_A: c_int = 2;
pub(super) const TAG_ABCD: c_int = 5;
pub(super) const TAG_ABCDE: c_int = 6;
pub(super) const DT_BF16: c_int = 2;
pub(super) const DT_F32: c_int = 3;
pub(super) const FORWARD_TRAINING: c_int = 64;
pub(super) const CONVOLUTION_DIRECT: c_int = 1;
const SCRATCHPAD_USER: c_int = 1;
const ENGINE_CPU: c_int = 1;
const STREAM_DEFAULT: u32 = 1;
pub(super) const Q_SRC_MD: c_int = 129;
pub(super) const Q_DIFF_SRC_MD: c_int = 130;
pub(super) const Q_WEIGHTS_MD: c_int = 131;
pub(super) const Q_DIFF_WEIGHTS_MD: c_int = 132;
pub(super) const Q_DST_MD: c_int = 133;
pub(super) const Q_DIFF_DST_MD: c_int = 134;
pub(super) const Q_SCRATCHPAD_MD: c_int = 136;
pub(super) const ARG_SRC: c_int = 1;
pub(super) const ARG_DST: c_int = 17;
pub(super) const ARG_WEIGHTS: c_int = 33;
pub(super) const ARG_BIAS: c_int = 41;
pub(super) const ARG_SCRATCHPAD: c_int = 80;
pub(super) const ARG_DIFF_SRC: c_int = 129;
pub(super) const ARG_DIFF_DST: c_int = 145;
pub(super) const ARG_DIFF_WEIGHTS: c_int = 161;

#[repr(C)]
pub(super) struct ExecArg {
    pub arg: c_int,
    pub memory: Handle,
}

#[repr(C)]
struct Version {
    major: c_int,
    minor: c_int,
    patch: c_int,
    hash: *const c_char,
    cpu_runtime: u32,
    gpu_runtime: u32,
}

type MdCreateWithTag = unsafe extern "C" fn(*mut Handle, c_int, *const i64, c_int, c_int) -> Status;
type ConvFwdPd = unsafe extern "C" fn(
    *mut Handle,
    Handle,
    c_int,
    c_int,
    Handle,
    Handle,
    Handle,
    Handle,
    *const i64,
    *const i64,
    *const i64,
    *const i64,
    Handle,
) -> Status;
/// `dnnl_convolution_backward_data_primitive_desc_create` and `..._weights_...` without
/// bias: (pd, engine, alg, md, md, md, strides, dilates, pad_l, pad_r, hint, attr); the
/// weights one takes a bias desc after its second md, passed as null.
type ConvBwdDataPd = unsafe extern "C" fn(
    *mut Handle,
    Handle,
    c_int,
    Handle,
    Handle,
    Handle,
    *const i64,
    *const i64,
    *const i64,
    *const i64,
    Handle,
    Handle,
) -> Status;
type ConvBwdWeightsPd = unsafe extern "C" fn(
    *mut Handle,
    Handle,
    c_int,
    Handle,
    Handle,
    Handle,
    Handle,
    *const i64,
    *const i64,
    *const i64,
    *const i64,
    Handle,
    Handle,
) -> Status;

/// The library and its entry points.
#[derive(Debug)]
pub(super) struct Api {
    _lib: libloading::Library,
    pub path: PathBuf,
    pub version: (i32, i32, i32),
    engine: Handle,
    engine_create: unsafe extern "C" fn(*mut Handle, c_int, usize) -> Status,
    stream_create: unsafe extern "C" fn(*mut Handle, Handle, u32) -> Status,
    stream_wait: unsafe extern "C" fn(Handle) -> Status,
    stream_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_create_with_tag: MdCreateWithTag,
    md_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_equal: unsafe extern "C" fn(Handle, Handle) -> c_int,
    md_get_size: unsafe extern "C" fn(Handle) -> usize,
    memory_create: unsafe extern "C" fn(*mut Handle, Handle, Handle, *mut c_void) -> Status,
    memory_destroy: unsafe extern "C" fn(Handle) -> Status,
    pub conv_fwd_pd: ConvFwdPd,
    pub conv_bwd_data_pd: ConvBwdDataPd,
    pub conv_bwd_weights_pd: ConvBwdWeightsPd,
    pd_query_md: unsafe extern "C" fn(Handle, c_int, c_int) -> Handle,
    pd_destroy: unsafe extern "C" fn(Handle) -> Status,
    primitive_create: unsafe extern "C" fn(*mut Handle, Handle) -> Status,
    primitive_destroy: unsafe extern "C" fn(Handle) -> Status,
    primitive_execute: unsafe extern "C" fn(Handle, Handle, c_int, *const ExecArg) -> Status,
    reorder_pd: unsafe extern "C" fn(*mut Handle, Handle, Handle, Handle, Handle, Handle) -> Status,
    attr_create: unsafe extern "C" fn(*mut Handle) -> Status,
    attr_destroy: unsafe extern "C" fn(Handle) -> Status,
    attr_set_scratchpad_mode: unsafe extern "C" fn(Handle, c_int) -> Status,
    /// `omp_set_num_threads` of the OpenMP runtime the library runs on, where found.
    omp_set_num_threads: Option<unsafe extern "C" fn(c_int)>,
    _omp: Option<libloading::Library>,
}

// SAFETY: the library's functions may be called from any thread (oneDNN's API is
// thread-safe for distinct objects, and its engine is shared read-only); the engine
// handle is created once and never destroyed while the process runs.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

const LIB_NAMES: [&str; 2] = ["libdnnl.so.3", "libdnnl.so"];

/// Where to look, first hit wins: `EMBER_ONEDNN_PATH` (a file, or a folder holding the
/// library), `onednn/lib/` in the running program's folder or any folder above it (so
/// `target/onednn/lib`, where `cargo xtask onednn` installs it, serves every binary under
/// `target/`), then the system's loader path.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("EMBER_ONEDNN_PATH") {
        let p = PathBuf::from(p);
        if p.is_dir() {
            out.extend(LIB_NAMES.iter().map(|n| p.join(n)));
        } else {
            out.push(p);
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            let lib = dir.join("onednn").join("lib");
            out.extend(
                LIB_NAMES
                    .iter()
                    .map(|n| lib.join(n))
                    .filter(|p| p.is_file()),
            );
        }
    }
    out.extend(LIB_NAMES.iter().map(PathBuf::from));
    out
}

/// Loads the library, or says why it cannot.
pub(super) fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for path in candidates() {
        if path.components().count() > 1 && !path.is_file() {
            tried.push(format!("{} (absent)", path.display()));
            continue;
        }
        match open(&path) {
            Ok(a) => return Ok(a),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "libdnnl.so.3 not found (tried {}); install it with `cargo xtask onednn` or point EMBER_ONEDNN_PATH at it",
        tried.join("; ")
    ))
}

fn open(path: &Path) -> Result<Api, String> {
    // SAFETY: loading runs the library's initialisers; oneDNN's have no preconditions.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is oneDNN's v3 C API function of this name, whose C
            // signature the field's type spells out (include/oneapi/dnnl/dnnl.h).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{}: {e}", $name))?
        };
    }
    let version_fn: unsafe extern "C" fn() -> *const Version = sym!("dnnl_version");
    // SAFETY: `dnnl_version` returns a pointer to a static struct of the library.
    let v = unsafe { version_fn().as_ref() }.ok_or("dnnl_version returned null")?;
    let version = (v.major, v.minor, v.patch);
    if version.0 != 3 {
        return Err(format!(
            "oneDNN {}.{}.{}: Ember needs oneDNN 3",
            version.0, version.1, version.2
        ));
    }
    // The OpenMP runtime the library was linked with (GNU's for the PyPI build): loaded
    // already, so this only finds it.
    // SAFETY: as above; libgomp's initialisers have no preconditions.
    let omp = unsafe { libloading::Library::new("libgomp.so.1") }.ok();
    let omp_set_num_threads = omp.as_ref().and_then(|l| {
        // SAFETY: `omp_set_num_threads(int)` of the OpenMP API.
        unsafe { l.get::<unsafe extern "C" fn(c_int)>(b"omp_set_num_threads\0") }
            .ok()
            .map(|f| *f)
    });
    let mut api = Api {
        path: path.to_path_buf(),
        version,
        engine: std::ptr::null_mut(),
        engine_create: sym!("dnnl_engine_create"),
        stream_create: sym!("dnnl_stream_create"),
        stream_wait: sym!("dnnl_stream_wait"),
        stream_destroy: sym!("dnnl_stream_destroy"),
        md_create_with_tag: sym!("dnnl_memory_desc_create_with_tag"),
        md_destroy: sym!("dnnl_memory_desc_destroy"),
        md_equal: sym!("dnnl_memory_desc_equal"),
        md_get_size: sym!("dnnl_memory_desc_get_size"),
        memory_create: sym!("dnnl_memory_create"),
        memory_destroy: sym!("dnnl_memory_destroy"),
        conv_fwd_pd: sym!("dnnl_convolution_forward_primitive_desc_create"),
        conv_bwd_data_pd: sym!("dnnl_convolution_backward_data_primitive_desc_create"),
        conv_bwd_weights_pd: sym!("dnnl_convolution_backward_weights_primitive_desc_create"),
        pd_query_md: sym!("dnnl_primitive_desc_query_md"),
        pd_destroy: sym!("dnnl_primitive_desc_destroy"),
        primitive_create: sym!("dnnl_primitive_create"),
        primitive_destroy: sym!("dnnl_primitive_destroy"),
        primitive_execute: sym!("dnnl_primitive_execute"),
        reorder_pd: sym!("dnnl_reorder_primitive_desc_create"),
        attr_create: sym!("dnnl_primitive_attr_create"),
        attr_destroy: sym!("dnnl_primitive_attr_destroy"),
        attr_set_scratchpad_mode: sym!("dnnl_primitive_attr_set_scratchpad_mode"),
        omp_set_num_threads,
        _omp: omp,
        _lib: lib,
    };
    let mut engine = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; CPU engine 0 always exists.
    let s = unsafe { (api.engine_create)(&mut engine, ENGINE_CPU, 0) };
    check(s, "dnnl_engine_create")?;
    api.engine = engine;
    Ok(api)
}

pub(super) fn check(s: Status, what: &str) -> Result<(), String> {
    if s == SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed with status {s}"))
    }
}

/// A memory descriptor this side owns.
pub(super) struct Md<'a> {
    api: &'a Api,
    pub h: Handle,
}

impl Drop for Md<'_> {
    fn drop(&mut self) {
        // SAFETY: `h` was created by `dnnl_memory_desc_create_with_tag` and is destroyed once.
        unsafe { (self.api.md_destroy)(self.h) };
    }
}

/// A primitive descriptor, destroyed on drop.
#[derive(Debug)]
pub(super) struct Pd {
    pub h: Handle,
    destroy: unsafe extern "C" fn(Handle) -> Status,
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: created by one of the `*_primitive_desc_create`, destroyed once.
        unsafe { (self.destroy)(self.h) };
    }
}

/// A primitive, destroyed on drop.
#[derive(Debug)]
pub(super) struct Prim {
    pub h: Handle,
    destroy: unsafe extern "C" fn(Handle) -> Status,
}

impl Drop for Prim {
    fn drop(&mut self) {
        // SAFETY: created by `dnnl_primitive_create`, destroyed once.
        unsafe { (self.destroy)(self.h) };
    }
}

// SAFETY: primitive descriptors and primitives are immutable once created; oneDNN allows
// executing one primitive from several threads at once when each execution brings its own
// scratchpad (user scratchpad mode, which `Api::attr` sets).
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}
// SAFETY: as above.
unsafe impl Send for Prim {}
// SAFETY: as above.
unsafe impl Sync for Prim {}

/// Primitive attributes with a user-managed scratchpad, destroyed on drop.
pub(super) struct Attr<'a> {
    api: &'a Api,
    pub h: Handle,
}

impl Drop for Attr<'_> {
    fn drop(&mut self) {
        // SAFETY: created by `dnnl_primitive_attr_create`, destroyed once.
        unsafe { (self.api.attr_destroy)(self.h) };
    }
}

impl Api {
    pub fn engine(&self) -> Handle {
        self.engine
    }

    /// A plain (row-major) descriptor (`tag` one of the `TAG_*`, `TAG_ANY` to let a
    /// primitive choose).
    pub fn md(&self, dims: &[i64], dt: c_int, tag: c_int) -> Result<Md<'_>, String> {
        if dims.len() > 12 {
            return Err(format!(
                "{} dimensions, oneDNN takes at most 12",
                dims.len()
            ));
        }
        let mut h = std::ptr::null_mut();
        // SAFETY: `dims` holds `dims.len()` (≤ 12) values; `h` is a valid out-pointer.
        let s = unsafe {
            (self.md_create_with_tag)(&mut h, dims.len() as c_int, dims.as_ptr(), dt, tag)
        };
        check(s, "dnnl_memory_desc_create_with_tag")?;
        Ok(Md { api: self, h })
    }

    pub fn attr(&self) -> Result<Attr<'_>, String> {
        let mut h = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let s = unsafe { (self.attr_create)(&mut h) };
        check(s, "dnnl_primitive_attr_create")?;
        let a = Attr { api: self, h };
        // SAFETY: `a.h` is a live attribute object.
        let s = unsafe { (self.attr_set_scratchpad_mode)(a.h, SCRATCHPAD_USER) };
        check(s, "dnnl_primitive_attr_set_scratchpad_mode")?;
        Ok(a)
    }

    /// Wraps a created primitive descriptor.
    pub fn pd(&self, h: Handle) -> Pd {
        Pd {
            h,
            destroy: self.pd_destroy,
        }
    }

    /// The primitive of a descriptor.
    pub fn primitive(&self, pd: &Pd) -> Result<Prim, String> {
        let mut h = std::ptr::null_mut();
        // SAFETY: `pd.h` is a live primitive descriptor; `h` a valid out-pointer.
        let s = unsafe { (self.primitive_create)(&mut h, pd.h) };
        check(s, "dnnl_primitive_create")?;
        Ok(Prim {
            h,
            destroy: self.primitive_destroy,
        })
    }

    /// The memory descriptor a primitive descriptor chose for `what` (owned by `pd`).
    pub fn query_md(&self, pd: &Pd, what: c_int) -> Handle {
        // SAFETY: `pd.h` is live; the result is null or a descriptor owned by it.
        unsafe { (self.pd_query_md)(pd.h, what, 0) }
    }

    pub fn md_equal(&self, a: Handle, b: Handle) -> bool {
        // SAFETY: both are live descriptors (or null, which oneDNN compares as unequal).
        unsafe { (self.md_equal)(a, b) != 0 }
    }

    pub fn md_size(&self, md: Handle) -> usize {
        if md.is_null() {
            return 0;
        }
        // SAFETY: a live descriptor.
        unsafe { (self.md_get_size)(md) }
    }

    /// A reorder from `src` to `dst` (both descriptors live), with a user scratchpad.
    pub fn reorder(&self, src: Handle, dst: Handle) -> Result<(Pd, Prim), String> {
        let attr = self.attr()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: live descriptors on this library's engine; a valid out-pointer.
        let s = unsafe { (self.reorder_pd)(&mut h, src, self.engine, dst, self.engine, attr.h) };
        check(s, "dnnl_reorder_primitive_desc_create")?;
        let pd = self.pd(h);
        let prim = self.primitive(&pd)?;
        Ok((pd, prim))
    }

    /// Tells the OpenMP runtime to use `n` threads in the calling thread's next regions.
    pub fn set_threads(&self, n: usize) {
        if let Some(f) = self.omp_set_num_threads {
            // SAFETY: `omp_set_num_threads` takes any positive count.
            unsafe { f(n.max(1) as c_int) };
        }
    }

    /// Runs `prim` with `args` (memory objects made over the given pointers with their
    /// descriptors) and waits for it.
    ///
    /// # Safety
    /// Each pointer must address memory of at least its descriptor's size
    /// ([`Api::md_size`]), valid for reads (inputs) or writes (outputs) for the call, with
    /// outputs not overlapping anything else passed.
    pub unsafe fn execute(
        &self,
        prim: &Prim,
        args: &[(c_int, Handle, *mut c_void)],
    ) -> Result<(), String> {
        let mut mems: Vec<ExecArg> = Vec::with_capacity(args.len());
        let mut result = Ok(());
        for &(arg, md, ptr) in args {
            let mut m = std::ptr::null_mut();
            // SAFETY: `md` is live; `ptr` is valid for its size (the caller's promise).
            let s = unsafe { (self.memory_create)(&mut m, md, self.engine, ptr) };
            if let Err(e) = check(s, "dnnl_memory_create") {
                result = Err(e);
                break;
            }
            mems.push(ExecArg { arg, memory: m });
        }
        if result.is_ok() {
            let mut stream = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the engine is live.
            result = check(
                unsafe { (self.stream_create)(&mut stream, self.engine, STREAM_DEFAULT) },
                "dnnl_stream_create",
            );
            if result.is_ok() {
                // SAFETY: `prim` and `stream` are live, `mems` are memory objects over
                // valid buffers (see above).
                result = check(
                    unsafe {
                        (self.primitive_execute)(prim.h, stream, mems.len() as c_int, mems.as_ptr())
                    },
                    "dnnl_primitive_execute",
                )
                // SAFETY: a live stream.
                .and_then(|()| check(unsafe { (self.stream_wait)(stream) }, "dnnl_stream_wait"));
                // SAFETY: created above, destroyed once, after the work finished.
                unsafe { (self.stream_destroy)(stream) };
            }
        }
        for m in mems {
            // SAFETY: created above and destroyed once; the primitive has finished.
            unsafe { (self.memory_destroy)(m.memory) };
        }
        result
    }
}
