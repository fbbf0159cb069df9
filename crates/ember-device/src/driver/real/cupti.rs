//! The real driver's device activity: CUPTI's activity API through cudarc's bindings, loaded
//! at run time (Note [CUPTI through the seam] in `driver/activity.rs`).
//!
//! CUPTI is process-global: one set of buffer callbacks, one record stream for every device.
//! Loading is probed once (presence, every entry point, `cuptiGetVersion`, registering the
//! callbacks) under `catch_unwind`, as cuDNN's (cudarc panics on a missing symbol); the
//! outcome is cached. CUPTI asks for buffers and hands them back full, or when flushed, on
//! its own threads or inside `cuptiActivityFlushAll`; [`buffer_completed`] parses each
//! buffer into [`Parsed`] records at once and frees it, and [`take`] joins the work records
//! with their external ids (`EXTERNAL_CORRELATION` records: CUPTI's correlation id of the
//! enqueuing call → the id Ember pushed).
//!
//! Record layouts: the kernel, memcpy and memset records grew new versions over CUPTI
//! releases by appending fields; the fields read here (kind, times, device, correlation id,
//! grid, block, name, bytes, copy kind) sit in the prefix every version since CUDA 11 shares,
//! and are read one by one (`read_unaligned` through `addr_of!`, the structs being packed),
//! never as a whole struct, so a newer library's longer record reads the same (a test checks
//! the offsets across the binding's record versions). The calls into CUPTI run only on a
//! GPU; on the development machines the absent-library path, the parsing of records laid
//! out in memory as CUPTI writes them and the join are tested.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::sync::{Mutex, OnceLock};

use cudarc::cupti::sys;

use crate::driver::{ActivityKind, ActivityRecord};
use crate::error::{DeviceError, Result};

/// Entry points used here, resolved at load so that no call can hit a missing symbol.
const SYMBOLS: &[&str] = &[
    "cuptiGetVersion",
    "cuptiGetTimestamp",
    "cuptiActivityRegisterCallbacks",
    "cuptiActivityEnable",
    "cuptiActivityDisable",
    "cuptiActivityFlushAll",
    "cuptiActivityGetNextRecord",
    "cuptiActivityPushExternalCorrelationId",
    "cuptiActivityPopExternalCorrelationId",
];

/// Bytes per activity buffer (Kineto's and CUPTI's samples' size) and their alignment.
const BUFFER_BYTES: usize = 8 << 20;
const BUFFER_ALIGN: usize = 8;

/// The kinds recorded while enabled, in the order they are enabled.
///
/// CUPTI writes an external correlation record only in front of an API record it creates
/// (`cupti_activity.h` on `cuptiActivityPushExternalCorrelationId`: "When a CUPTI activity
/// API record is created while within an external API region and
/// CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION is enabled, the activity API record will be
/// preceeded by a CUpti_ActivityExternalCorrelation record"), and a kernel, copy or memset
/// record carries the correlation id of the driver or runtime API call that launched it.
/// Ember's own launches, copies and memsets are driver calls; the libraries (cuBLAS, cuDNN,
/// NCCL) may launch through the CUDA runtime they link, and such a kernel carries the
/// runtime call's id (CUPTI's `activity_trace_async` sample prints `cudaLaunchKernel` and
/// its kernel under one id, no driver record between), so without runtime API records it
/// has no link and its call counts as untimed. Both API kinds are enabled, after the
/// external correlation, as in Kineto's default activity set and ONNX Runtime's CUPTI
/// profiler; their records are not read.
const KINDS: [sys::CUpti_ActivityKind; 6] = [
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_RUNTIME,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET,
];

const EXTERNAL_KIND: sys::CUpti_ExternalCorrelationKind =
    sys::CUpti_ExternalCorrelationKind::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

/// A parsed record: work with CUPTI's correlation id, or a link from one to Ember's id.
#[derive(Debug)]
enum Parsed {
    Work(ActivityRecord, u32),
    Link(u32, u64),
}

/// Records parsed from completed buffers, not yet taken.
static COMPLETED: Mutex<Vec<Parsed>> = Mutex::new(Vec::new());

/// The outcome of loading: CUPTI's API version, or why it cannot be used.
static LOADED: OnceLock<std::result::Result<u32, String>> = OnceLock::new();

fn check(
    call: &'static str,
    r: std::result::Result<(), cudarc::cupti::result::CuptiError>,
) -> Result<()> {
    r.map_err(|e| DeviceError::driver(call, format!("{:?}", e.0)))
}

/// CUPTI's API version, loading it on first use (or why not).
pub(super) fn version() -> Result<u32> {
    LOADED
        .get_or_init(load)
        .clone()
        .map_err(|why| DeviceError::Unsupported {
            what: why,
            driver: "real",
        })
}

fn load() -> std::result::Result<u32, String> {
    // SAFETY: only tries to dlopen the library and closes it again.
    if !unsafe { sys::is_culib_present() } {
        return Err("CUPTI not found (no libcupti.so on the library path)".into());
    }
    let outcome = super::quietly(|| -> std::result::Result<u32, String> {
        // SAFETY: the library is present (checked above); `culib` loads it once.
        let lib = unsafe { sys::culib() };
        for name in SYMBOLS {
            // SAFETY: only looks the symbol up; it is not called through this pointer.
            if unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err() {
                return Err(format!("CUPTI lacks {name} (too old or broken?)"));
            }
        }
        let mut v = 0u32;
        // SAFETY: the out-pointer is a valid local; the symbol resolved above.
        unsafe { sys::cuptiGetVersion(&mut v) }
            .result()
            .map_err(|e| format!("cuptiGetVersion failed: {:?}", e.0))?;
        cudarc::cupti::result::activity::register_callbacks(
            Some(buffer_requested),
            Some(buffer_completed),
        )
        .map_err(|e| format!("cuptiActivityRegisterCallbacks failed: {:?}", e.0))?;
        Ok(v)
    });
    outcome.unwrap_or_else(|| Err("CUPTI could not be loaded (a library call panicked)".into()))
}

/// Enable every kind of [`KINDS`], or none: `cuptiActivityEnable` refuses a kind on its own
/// (`CUPTI_ERROR_NOT_COMPATIBLE` "if the activity kind cannot be enabled",
/// `CUPTI_ERROR_INVALID_KIND` "if the activity kind is not supported"), and the profiler
/// then times with events and never disables what it did not see enabled, so the kinds
/// already enabled (the driver and runtime API records among them, a record per API call
/// for the rest of the process) are disabled again.
pub(super) fn enable() -> Result<()> {
    version()?;
    enable_all(&KINDS, enable_one, disable_one)
}

/// Disable every kind of [`KINDS`], each even after another failed; the first failure.
pub(super) fn disable() -> Result<()> {
    version()?;
    each(&KINDS, disable_one)
}

fn enable_one(kind: sys::CUpti_ActivityKind) -> Result<()> {
    check(
        "cuptiActivityEnable",
        cudarc::cupti::result::activity::enable(kind),
    )
}

fn disable_one(kind: sys::CUpti_ActivityKind) -> Result<()> {
    check(
        "cuptiActivityDisable",
        cudarc::cupti::result::activity::disable(kind),
    )
}

/// `enable` each of `kinds` in order; at the first failure, `disable` (best effort) the ones
/// already enabled, newest first, and return that failure.
fn enable_all<K: Copy, E>(
    kinds: &[K],
    mut enable: impl FnMut(K) -> std::result::Result<(), E>,
    mut disable: impl FnMut(K) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    for (i, &kind) in kinds.iter().enumerate() {
        if let Err(e) = enable(kind) {
            for &done in kinds[..i].iter().rev() {
                let _ = disable(done);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// `f` on every one of `kinds`, all of them whatever fails; the first failure.
fn each<K: Copy, E>(
    kinds: &[K],
    mut f: impl FnMut(K) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut first = Ok(());
    for &kind in kinds {
        let r = f(kind);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

pub(super) fn push(id: u64) -> Result<()> {
    version()?;
    check(
        "cuptiActivityPushExternalCorrelationId",
        cudarc::cupti::result::activity::push_external_correlation_id(EXTERNAL_KIND, id),
    )
}

pub(super) fn pop() -> Result<()> {
    version()?;
    let mut last = 0u64;
    // SAFETY: the out-pointer is a valid local.
    let r = unsafe {
        cudarc::cupti::result::activity::pop_external_correlation_id(EXTERNAL_KIND, &mut last)
    };
    check("cuptiActivityPopExternalCorrelationId", r)
}

pub(super) fn timestamp_ns() -> Result<u64> {
    version()?;
    let mut t = 0u64;
    // SAFETY: the out-pointer is a valid local.
    check("cuptiGetTimestamp", unsafe {
        cudarc::cupti::result::get_timestamp(&mut t)
    })?;
    Ok(t)
}

/// Flush CUPTI's buffers (which parses them) and take the records, joined.
pub(super) fn take() -> Result<Vec<ActivityRecord>> {
    version()?;
    let forced = sys::CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED as u32;
    check(
        "cuptiActivityFlushAll",
        cudarc::cupti::result::activity::flush_all(forced),
    )?;
    let parsed = std::mem::take(&mut *COMPLETED.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(join(parsed))
}

/// Work records with the external ids their links give.
fn join(parsed: Vec<Parsed>) -> Vec<ActivityRecord> {
    let links: HashMap<u32, u64> = parsed
        .iter()
        .filter_map(|p| match p {
            Parsed::Link(c, e) => Some((*c, *e)),
            Parsed::Work(..) => None,
        })
        .collect();
    parsed
        .into_iter()
        .filter_map(|p| match p {
            Parsed::Work(mut r, c) => {
                r.external = links.get(&c).copied();
                Some(r)
            }
            Parsed::Link(..) => None,
        })
        .collect()
}

fn buffer_layout() -> Option<Layout> {
    Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).ok()
}

/// CUPTI asks for an empty buffer.
///
/// # Safety
/// Called by CUPTI only, with valid out-pointers.
unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let Some(layout) = buffer_layout() else {
        return;
    };
    // SAFETY: a non-zero-sized layout; freed in `buffer_completed` with the same layout.
    let ptr = unsafe { std::alloc::alloc(layout) };
    // SAFETY: CUPTI passes valid out-pointers; a null buffer (allocation failure) makes it
    // drop records rather than write anywhere (Kineto notes that a CUPTI older than API
    // version 27, CUDA 12.9, could crash on a refused buffer; only a failed 8 MiB
    // allocation refuses one here).
    unsafe {
        *buffer = ptr;
        *size = if ptr.is_null() { 0 } else { BUFFER_BYTES };
        *max = 0;
    }
}

/// CUPTI hands a buffer back with `valid` bytes of records: parse them and free it.
///
/// # Safety
/// Called by CUPTI only, with a buffer from [`buffer_requested`] that it no longer uses.
unsafe extern "C" fn buffer_completed(
    _context: cudarc::driver::sys::CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    let mut out = Vec::new();
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    // SAFETY: `buffer` holds `valid` bytes of records written by CUPTI; `get_next_record`
    // walks them and stops with an error at the end.
    while unsafe { cudarc::cupti::result::activity::get_next_record(buffer, valid, &mut record) }
        .is_ok()
    {
        // SAFETY: CUPTI returned a record inside the buffer, of the layout its kind names.
        if let Some(p) = unsafe { parse(record) } {
            out.push(p);
        }
    }
    if let Some(layout) = buffer_layout() {
        // SAFETY: allocated by `buffer_requested` with this layout; CUPTI is done with it.
        unsafe { std::alloc::dealloc(buffer, layout) };
    }
    COMPLETED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(out);
}

/// Read field `$f` of the packed record `$p` (a raw pointer) without referencing it.
macro_rules! field {
    ($p:expr, $f:ident) => {
        std::ptr::addr_of!((*$p).$f).read_unaligned()
    };
}

/// One record, if it is a kind recorded here.
///
/// # Safety
/// `r` points at a complete record written by CUPTI.
unsafe fn parse(r: *const sys::CUpti_Activity) -> Option<Parsed> {
    use sys::CUpti_ActivityKind as K;
    // SAFETY: every record starts with its kind, a 32-bit value; read as an integer, since a
    // kind this binding does not know would not be a valid value of the Rust enum.
    let kind = unsafe { std::ptr::read_unaligned(r.cast::<u32>()) };
    let is = |k: K| kind == k as u32;
    if is(K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) || is(K::CUPTI_ACTIVITY_KIND_KERNEL) {
        // SAFETY: a kernel record; the fields read sit in the prefix every version shares
        // (module docs).
        return Some(unsafe { kernel(r.cast()) });
    }
    if is(K::CUPTI_ACTIVITY_KIND_MEMCPY) {
        let m = r.cast::<sys::CUpti_ActivityMemcpy6>();
        // SAFETY: a memcpy record; the fields read sit in the shared prefix.
        let (copy_kind, bytes, start, end, device, c) = unsafe {
            (
                field!(m, copyKind),
                field!(m, bytes),
                field!(m, start),
                field!(m, end),
                field!(m, deviceId),
                field!(m, correlationId),
            )
        };
        // CUpti_ActivityMemcpyKind: 1 HtoD, 2 DtoH, anything else between devices.
        let kind = match copy_kind {
            1 => ActivityKind::MemcpyHtoD,
            2 => ActivityKind::MemcpyDtoH,
            _ => ActivityKind::MemcpyDtoD,
        };
        let record = ActivityRecord::transfer(kind, device as usize, bytes);
        return Some(Parsed::Work(timed(record, start, end), c));
    }
    if is(K::CUPTI_ACTIVITY_KIND_MEMSET) {
        let m = r.cast::<sys::CUpti_ActivityMemset4>();
        // SAFETY: a memset record; the fields read sit in the shared prefix.
        let (bytes, start, end, device, c) = unsafe {
            (
                field!(m, bytes),
                field!(m, start),
                field!(m, end),
                field!(m, deviceId),
                field!(m, correlationId),
            )
        };
        let record = ActivityRecord::transfer(ActivityKind::Memset, device as usize, bytes);
        return Some(Parsed::Work(timed(record, start, end), c));
    }
    if is(K::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
        let e = r.cast::<sys::CUpti_ActivityExternalCorrelation>();
        // SAFETY: an external-correlation record (one layout in every version).
        let (c, id) = unsafe { (field!(e, correlationId), field!(e, externalId)) };
        return Some(Parsed::Link(c, id));
    }
    None
}

/// `r` with its device times.
fn timed(r: ActivityRecord, start_ns: u64, end_ns: u64) -> ActivityRecord {
    ActivityRecord {
        start_ns,
        end_ns,
        ..r
    }
}

/// A kernel record.
///
/// # Safety
/// `k` points at a complete kernel record (any version since CUDA 11: the fields read here
/// are in the prefix they share).
unsafe fn kernel(k: *const sys::CUpti_ActivityKernel10) -> Parsed {
    // SAFETY: the caller's contract; each field is read unaligned, never referenced.
    let (name_ptr, device, start, end, grid, block, c) = unsafe {
        (
            field!(k, name),
            field!(k, deviceId),
            field!(k, start),
            field!(k, end),
            [field!(k, gridX), field!(k, gridY), field!(k, gridZ)],
            [field!(k, blockX), field!(k, blockY), field!(k, blockZ)],
            field!(k, correlationId),
        )
    };
    let name = if name_ptr.is_null() {
        String::new()
    } else {
        // SAFETY: a kernel record's name is a NUL-terminated string CUPTI owns (shared by the
        // records of one kernel), valid at least while CUPTI hands the record's buffer back
        // (Kineto reads it later still); it is copied here, before the buffer is freed.
        unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned()
    };
    let dim = |v: i32| u32::try_from(v).unwrap_or(0);
    let record = ActivityRecord::kernel(name, device as usize, grid.map(dim), block.map(dim));
    Parsed::Work(timed(record, start, end), c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(name: &str, correlation: u32) -> Parsed {
        let record = ActivityRecord::kernel(name.into(), 0, [1; 3], [1; 3]);
        Parsed::Work(timed(record, 1, 2), correlation)
    }

    #[test]
    fn records_take_the_external_id_of_their_call() {
        // Two kernels of one cuBLAS call (correlation 7), one of another (8), one unlinked.
        let parsed = vec![
            work("a", 7),
            Parsed::Link(7, 100),
            work("b", 7),
            work("c", 8),
            Parsed::Link(8, 101),
            work("d", 9),
        ];
        let joined: Vec<(String, Option<u64>)> = join(parsed)
            .into_iter()
            .map(|r| (r.name, r.external))
            .collect();
        assert_eq!(
            joined,
            [
                ("a".to_string(), Some(100)),
                ("b".to_string(), Some(100)),
                ("c".to_string(), Some(101)),
                ("d".to_string(), None)
            ]
        );
    }

    /// A zeroed, 8-byte aligned buffer the size of a `T` record.
    fn zeroed_record<T>() -> Vec<u64> {
        vec![0u64; std::mem::size_of::<T>().div_ceil(8)]
    }

    /// Write field `$f` of the packed record at `$p` (a raw pointer into a buffer).
    macro_rules! set {
        ($p:expr, $f:ident, $v:expr) => {
            // SAFETY: `$p` points into a zeroed buffer the size of its record type.
            unsafe { std::ptr::addr_of_mut!((*$p).$f).write_unaligned($v) }
        };
    }

    fn set_kind(buf: &mut [u64], kind: u32) {
        // SAFETY: the buffer holds at least 8 bytes; a record starts with its 32-bit kind.
        unsafe { buf.as_mut_ptr().cast::<u32>().write(kind) };
    }

    fn parse_buf(buf: &[u64]) -> Option<Parsed> {
        // SAFETY: `buf` holds a whole record of the kind written at its start.
        unsafe { parse(buf.as_ptr().cast()) }
    }

    /// Records laid out as CUPTI writes them (zeroed, then the fields Ember reads set): each
    /// kind parses into its record, and a kind Ember does not read (the driver and runtime
    /// API records enabled for the links, or a kind this binding does not know) is skipped.
    #[test]
    fn records_parse_from_their_layouts() {
        use sys::CUpti_ActivityKind as K;
        let name = c"sm90_xmma_gemm";
        let mut k = zeroed_record::<sys::CUpti_ActivityKernel10>();
        set_kind(&mut k, K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32);
        let kp = k.as_mut_ptr().cast::<sys::CUpti_ActivityKernel10>();
        set!(kp, start, 1_000);
        set!(kp, end, 3_500);
        set!(kp, deviceId, 1);
        set!(kp, gridX, 80);
        set!(kp, gridY, 2);
        set!(kp, gridZ, 1);
        set!(kp, blockX, 256);
        set!(kp, blockY, 1);
        set!(kp, blockZ, 1);
        set!(kp, correlationId, 41);
        set!(kp, name, name.as_ptr());
        match parse_buf(&k) {
            Some(Parsed::Work(r, 41)) => {
                assert_eq!(r.kind, ActivityKind::Kernel);
                assert_eq!(r.name, "sm90_xmma_gemm");
                assert_eq!((r.device, r.start_ns, r.end_ns), (1, 1_000, 3_500));
                assert_eq!((r.grid, r.block), ([80, 2, 1], [256, 1, 1]));
            }
            other => panic!("kernel parsed as {other:?}"),
        }

        let mut m = zeroed_record::<sys::CUpti_ActivityMemcpy6>();
        set_kind(&mut m, K::CUPTI_ACTIVITY_KIND_MEMCPY as u32);
        let mp = m.as_mut_ptr().cast::<sys::CUpti_ActivityMemcpy6>();
        set!(mp, copyKind, 2);
        set!(mp, bytes, 4096);
        set!(mp, start, 10);
        set!(mp, end, 20);
        set!(mp, correlationId, 42);
        match parse_buf(&m) {
            Some(Parsed::Work(r, 42)) => {
                assert_eq!(
                    (r.kind, r.bytes, r.start_ns, r.end_ns),
                    (ActivityKind::MemcpyDtoH, 4096, 10, 20)
                );
                assert!(r.name.is_empty());
            }
            other => panic!("memcpy parsed as {other:?}"),
        }

        let mut z = zeroed_record::<sys::CUpti_ActivityMemset4>();
        set_kind(&mut z, K::CUPTI_ACTIVITY_KIND_MEMSET as u32);
        let zp = z.as_mut_ptr().cast::<sys::CUpti_ActivityMemset4>();
        set!(zp, bytes, 64);
        set!(zp, correlationId, 43);
        match parse_buf(&z) {
            Some(Parsed::Work(r, 43)) => assert_eq!((r.kind, r.bytes), (ActivityKind::Memset, 64)),
            other => panic!("memset parsed as {other:?}"),
        }

        let mut e = zeroed_record::<sys::CUpti_ActivityExternalCorrelation>();
        set_kind(&mut e, K::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION as u32);
        let ep = e
            .as_mut_ptr()
            .cast::<sys::CUpti_ActivityExternalCorrelation>();
        set!(ep, correlationId, 41);
        set!(ep, externalId, 9_000_000_001);
        assert!(matches!(
            parse_buf(&e),
            Some(Parsed::Link(41, 9_000_000_001))
        ));

        let mut other = zeroed_record::<sys::CUpti_ActivityKernel10>();
        set_kind(&mut other, K::CUPTI_ACTIVITY_KIND_DRIVER as u32);
        assert!(parse_buf(&other).is_none());
        set_kind(&mut other, K::CUPTI_ACTIVITY_KIND_RUNTIME as u32);
        assert!(parse_buf(&other).is_none());
        set_kind(&mut other, u32::MAX);
        assert!(parse_buf(&other).is_none());
    }

    /// `$new`'s offsets of `$f...` are `$old`'s: the field sits in the shared prefix.
    macro_rules! same_offsets {
        ($new:ty, $old:ty, [$($f:ident),*]) => {
            $(
                assert_eq!(
                    std::mem::offset_of!($new, $f),
                    std::mem::offset_of!($old, $f),
                    "{}.{} moved",
                    stringify!($old),
                    stringify!($f)
                );
            )*
        };
    }

    /// The module docs' claim, checked on the binding's structs: each field read here sits at
    /// one offset in every version of its record that a CUPTI since CUDA 11 may write (the
    /// kernel record `CUpti_ActivityKernel4` to `10`, CUPTI 13.0's documentation naming `9`
    /// as the one written; the copy `Memcpy` to `Memcpy6`; the memset `Memset` to
    /// `Memset4`), so the newest struct's offsets read any of them. The kind is a 32-bit
    /// value at offset 0.
    #[test]
    fn the_fields_read_sit_at_one_offset_in_every_record_version() {
        use sys::*;
        assert_eq!(std::mem::size_of::<CUpti_ActivityKind>(), 4);
        assert_eq!(std::mem::offset_of!(CUpti_Activity, kind), 0);
        macro_rules! kernel {
            ($($old:ty),*) => {$(
                same_offsets!(CUpti_ActivityKernel10, $old, [
                    kind, start, end, deviceId, gridX, gridY, gridZ, blockX, blockY, blockZ,
                    correlationId, name
                ]);
            )*};
        }
        kernel!(
            CUpti_ActivityKernel4,
            CUpti_ActivityKernel5,
            CUpti_ActivityKernel6,
            CUpti_ActivityKernel7,
            CUpti_ActivityKernel8,
            CUpti_ActivityKernel9
        );
        macro_rules! memcpy {
            ($($old:ty),*) => {$(
                same_offsets!(CUpti_ActivityMemcpy6, $old, [
                    kind, copyKind, bytes, start, end, deviceId, correlationId
                ]);
            )*};
        }
        memcpy!(
            CUpti_ActivityMemcpy,
            CUpti_ActivityMemcpy3,
            CUpti_ActivityMemcpy4,
            CUpti_ActivityMemcpy5
        );
        macro_rules! memset {
            ($($old:ty),*) => {$(
                same_offsets!(CUpti_ActivityMemset4, $old, [
                    kind, bytes, start, end, deviceId, correlationId
                ]);
            )*};
        }
        memset!(
            CUpti_ActivityMemset,
            CUpti_ActivityMemset2,
            CUpti_ActivityMemset3
        );
        // The offsets themselves, as `cupti_activity.h` lays the packed(8) records out.
        assert_eq!(
            (
                std::mem::offset_of!(CUpti_ActivityKernel10, start),
                std::mem::offset_of!(CUpti_ActivityKernel10, deviceId),
                std::mem::offset_of!(CUpti_ActivityKernel10, correlationId),
                std::mem::offset_of!(CUpti_ActivityKernel10, name),
            ),
            (16, 40, 92, 104)
        );
        assert_eq!(
            (
                std::mem::offset_of!(CUpti_ActivityExternalCorrelation, externalId),
                std::mem::offset_of!(CUpti_ActivityExternalCorrelation, correlationId),
            ),
            (8, 16)
        );
    }

    /// A kind CUPTI refuses leaves nothing enabled (the profiler falls back to events and
    /// disables nothing), and a disable goes through every kind even when one fails.
    #[test]
    fn a_refused_kind_disables_the_ones_enabled_before_it() {
        let calls = std::cell::RefCell::new(Vec::new());
        let enable = |k: u32| {
            calls.borrow_mut().push(("enable", k));
            if k == 3 { Err(k) } else { Ok(()) }
        };
        let disable = |k: u32| {
            calls.borrow_mut().push(("disable", k));
            if k == 1 { Err(k) } else { Ok(()) }
        };
        assert_eq!(enable_all(&[1, 2, 3, 4], enable, disable), Err(3));
        assert_eq!(
            calls.take(),
            [
                ("enable", 1),
                ("enable", 2),
                ("enable", 3),
                ("disable", 2),
                ("disable", 1)
            ]
        );
        assert_eq!(enable_all(&[1, 2], enable, disable), Ok(()));
        assert_eq!(calls.take(), [("enable", 1), ("enable", 2)]);
        assert_eq!(each(&[1, 2, 3], disable), Err(1));
        assert_eq!(
            calls.take(),
            [("disable", 1), ("disable", 2), ("disable", 3)]
        );
    }

    /// A kernel is linked through the API record of the call that launched it, a driver
    /// call (Ember's own launches) or a runtime call (a library's), so both API kinds are
    /// recorded, after the external correlation records that link them.
    #[test]
    fn both_api_kinds_are_recorded_after_the_external_correlation() {
        use sys::CUpti_ActivityKind as K;
        let at = |k: K| KINDS.iter().position(|&x| x == k);
        let external = at(K::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
        for api in [
            K::CUPTI_ACTIVITY_KIND_DRIVER,
            K::CUPTI_ACTIVITY_KIND_RUNTIME,
        ] {
            assert!(at(api).is_some(), "{api:?} not enabled");
            assert!(external < at(api), "{api:?} enabled before the links");
        }
    }

    #[test]
    fn without_cupti_the_reason_is_given_not_a_panic() {
        // SAFETY: only probes for the library.
        if unsafe { sys::is_culib_present() } {
            return;
        }
        match version() {
            Err(DeviceError::Unsupported { what, .. }) => {
                assert!(what.contains("CUPTI"), "{what}")
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
