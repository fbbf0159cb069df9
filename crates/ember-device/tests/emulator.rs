#![allow(clippy::unwrap_used)]
//! The emulator through the `Driver` trait, on private `Emulator` instances.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use ember_device::DeviceError;
use ember_device::driver::emulator::{
    ADDRESS_TAG, Emulator, EmulatorConfig, KernelLaunch, register_kernel,
};
use ember_device::driver::{
    ActivityKind, ConvBuffers, ConvDesc, ConvDirection, ConvProblem, ConvSearch, DevicePtr, Driver,
    DriverKind, GemmDesc, GemmType, LaunchConfig, StreamHandle,
};

const S0: StreamHandle = StreamHandle::DEFAULT;

fn emu(n: usize) -> Emulator {
    Emulator::new(EmulatorConfig::devices(n)).unwrap()
}

#[test]
fn malloc_copy_round_trip_and_memset() {
    let e = emu(1);
    let p = e.malloc(0, 1000).unwrap();
    assert_eq!(p.0 & 0xFFF0_0000_0000_0000, ADDRESS_TAG);
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    e.memcpy_htod(p, &data, S0).unwrap();
    let mut back = vec![0u8; 1000];
    e.memcpy_dtoh(&mut back, p, S0).unwrap();
    assert_eq!(back, data);

    e.memset_d8_async(p.offset(10), 0xAB, 20, S0).unwrap();
    e.memcpy_dtoh(&mut back, p, S0).unwrap();
    assert!(back[10..30].iter().all(|&b| b == 0xAB));
    assert_eq!(back[9], data[9]);
    assert_eq!(back[30], data[30]);

    // Interior pointers translate; the translation helpers see the same bytes.
    let seen = e.with_host_slice(p.offset(10), 3, |s| s.to_vec()).unwrap();
    assert_eq!(seen, [0xAB; 3]);
    e.with_host_slice_mut(p, 1, |s| s[0] = 42).unwrap();
    e.memcpy_dtoh(&mut back[..1], p, S0).unwrap();
    assert_eq!(back[0], 42);
    let host = e.with_translator(|t| t.translate(p, 1000).is_ok());
    assert!(host);

    e.free(0, p).unwrap();
    assert_eq!(e.live_allocations(0).unwrap(), 0);
    let err = e.memcpy_dtoh(&mut back, p, S0).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Driver {
                call: "cuMemcpyDtoH",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn async_copies_from_pinned_memory() {
    let e = emu(1);
    let pinned = e.malloc_host(256).unwrap();
    assert_eq!(pinned as usize % 64, 0);
    let d = e.malloc(0, 256).unwrap();
    let s = e.stream_create(0).unwrap();
    // SAFETY: `pinned` is valid for 256 bytes and only used here.
    unsafe {
        std::slice::from_raw_parts_mut(pinned, 256).fill(7);
        e.memcpy_htod_async(d, pinned, 256, s).unwrap();
        std::slice::from_raw_parts_mut(pinned, 256).fill(0);
        e.memcpy_dtoh_async(pinned, d, 256, s).unwrap();
    }
    e.stream_synchronize(s).unwrap();
    // SAFETY: as above; the stream is synchronised.
    let back = unsafe { std::slice::from_raw_parts(pinned, 256) };
    assert!(back.iter().all(|&b| b == 7));
    // SAFETY: allocated above with 256 bytes, no longer used.
    unsafe {
        assert!(e.free_host(pinned, 100).is_err());
        e.free_host(pinned, 256).unwrap();
        assert!(e.free_host(pinned, 256).is_err());
    }
}

/// A pinned buffer rewritten and copied again before the host knew the first asynchronous
/// copy ran is the hazard the emulator reports (Note [Async host reads]); an event that
/// completed after the copy, or a synchronisation, makes the reuse safe.
#[test]
fn reusing_a_host_buffer_before_its_copy_is_known_done_is_an_error() {
    let e = emu(1);
    let d = e.malloc(0, 256).unwrap();
    let s = e.stream_create(0).unwrap();
    let ev = e.event_create(0, false).unwrap();
    let mut host = vec![1u8; 256];
    // SAFETY: `host` is valid for 256 bytes throughout; the emulator copies at once.
    let copy = |e: &Emulator, h: &[u8]| unsafe { e.memcpy_htod_async(d, h.as_ptr(), 256, s) };
    copy(&e, &host).unwrap();
    // The same bytes again: nothing the first copy reads has changed.
    copy(&e, &host).unwrap();
    host[10] = 2;
    let err = copy(&e, &host).unwrap_err().to_string();
    assert!(err.contains("EMULATOR_HOST_SOURCE_OVERWRITTEN"), "{err}");
    assert!(err.contains("Async host reads"), "{err}");
    // An event recorded after the copies, seen complete: the buffer is free again.
    e.event_record(ev, s).unwrap();
    assert!(e.event_query(ev).unwrap());
    copy(&e, &host).unwrap();
    host[11] = 3;
    // An event recorded before the last copy says nothing about it.
    assert!(e.event_query(ev).unwrap());
    assert!(copy(&e, &host).is_err());
    // A stream synchronisation observes everything.
    e.stream_synchronize(s).unwrap();
    copy(&e, &host).unwrap();
    host[12] = 4;
    e.synchronize(0).unwrap();
    copy(&e, &host).unwrap();
    // A disjoint buffer is another matter.
    let other = vec![5u8; 256];
    copy(&e, &other).unwrap();
    e.event_destroy(ev).unwrap();
    e.stream_destroy(s).unwrap();
}

#[test]
fn dtod_across_two_devices() {
    let e = emu(2);
    let a = e.malloc(0, 64).unwrap();
    let b = e.malloc(1, 64).unwrap();
    assert_ne!(a.0 >> 44, b.0 >> 44);
    e.memcpy_htod(a, &[5u8; 64], S0).unwrap();
    let s1 = e.stream_create(1).unwrap();
    e.memcpy_dtod_async(b, a, 64, s1).unwrap();
    let mut out = [0u8; 64];
    e.memcpy_dtoh(&mut out, b, S0).unwrap();
    assert_eq!(out, [5u8; 64]);
    // Stream/device mismatch for single-device operations.
    let err = e.memset_d8_async(a, 0, 64, s1).unwrap_err().to_string();
    assert!(err.contains("cuda:0") && err.contains("cuda:1"), "{err}");
    // Freeing on the wrong device names the owner.
    let err = e.free(1, a).unwrap_err().to_string();
    assert!(err.contains("cuda:0"), "{err}");
}

#[test]
fn oom_at_total_memory_and_mem_get_info_balances() {
    let e = Emulator::new(EmulatorConfig::devices(1).with_total_memory(1 << 20)).unwrap();
    assert_eq!(e.mem_get_info(0).unwrap(), (1 << 20, 1 << 20));
    let a = e.malloc(0, 600 << 10).unwrap();
    assert_eq!(
        e.mem_get_info(0).unwrap(),
        ((1 << 20) - (600 << 10), 1 << 20)
    );
    let err = e.malloc(0, 500 << 10).unwrap_err();
    assert_eq!(
        err,
        DeviceError::OutOfMemory {
            device: 0,
            bytes: 500 << 10
        }
    );
    let b = e.malloc(0, 400 << 10).unwrap();
    assert_eq!(e.mem_get_info(0).unwrap().0, (1 << 20) - (1000 << 10));
    e.free(0, a).unwrap();
    e.free(0, b).unwrap();
    assert_eq!(e.mem_get_info(0).unwrap(), (1 << 20, 1 << 20));
    assert!(e.malloc(0, 0).is_err());
    assert!(matches!(
        e.malloc(3, 8),
        Err(DeviceError::InvalidIndex { index: 3, count: 1 })
    ));
}

#[test]
fn invalid_handles_are_errors() {
    let e = emu(2);
    let bogus = StreamHandle(999);
    let kind_of = |r: Result<(), DeviceError>| match r {
        Err(DeviceError::InvalidHandle { kind, .. }) => kind,
        other => panic!("expected InvalidHandle, got {other:?}"),
    };
    assert_eq!(kind_of(e.stream_synchronize(bogus)), "stream");
    let s = e.stream_create(0).unwrap();
    e.stream_destroy(s).unwrap();
    assert_eq!(kind_of(e.stream_destroy(s)), "stream");
    assert_eq!(kind_of(e.stream_query(s).map(|_| ())), "stream");
    let ev = e.event_create(0, true).unwrap();
    e.event_destroy(ev).unwrap();
    assert_eq!(kind_of(e.event_record(ev, S0)), "event");
    assert_eq!(kind_of(e.event_synchronize(ev)), "event");
    // The default stream is valid everywhere and cannot be destroyed.
    e.stream_synchronize(S0).unwrap();
    assert!(e.stream_query(S0).unwrap());
    assert_eq!(kind_of(e.stream_destroy(S0)), "stream");
    // An event recorded on another device's stream.
    let ev0 = e.event_create(0, false).unwrap();
    let s1 = e.stream_create(1).unwrap();
    assert!(e.event_record(ev0, s1).is_err());
    // Modules: unknown kernel names say where kernels come from.
    let m = e.module_load(0, b"").unwrap();
    let err = e
        .module_function(m, "no_such_kernel")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no_such_kernel") && err.contains("kernels/"),
        "{err}"
    );
}

#[test]
fn events_time_a_sleep() {
    let e = emu(1);
    let s = e.stream_create(0).unwrap();
    let (start, end) = (
        e.event_create(0, true).unwrap(),
        e.event_create(0, true).unwrap(),
    );
    let untimed = e.event_create(0, false).unwrap();
    let err = e.event_elapsed_ms(start, end).unwrap_err().to_string();
    assert!(
        err.contains("CUDA_ERROR_INVALID_HANDLE") && err.contains("not been recorded"),
        "{err}"
    );
    e.event_record(start, s).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    e.event_record(end, s).unwrap();
    e.event_record(untimed, s).unwrap();
    assert!(e.event_query(end).unwrap());
    e.event_synchronize(end).unwrap();
    let ms = e.event_elapsed_ms(start, end).unwrap();
    assert!(ms >= 20.0, "{ms}");
    let err = e.event_elapsed_ms(start, untimed).unwrap_err().to_string();
    assert!(err.contains("timing disabled"), "{err}");
    e.stream_wait_event(s, end).unwrap();
}

#[test]
fn properties_say_emulated() {
    let e = Emulator::new(EmulatorConfig::devices(2).with_compute_capability(8, 0)).unwrap();
    assert_eq!(e.kind(), DriverKind::Emulated);
    assert_eq!(e.device_count(), 2);
    let p = e.properties(1).unwrap();
    assert!(p.emulated && p.name.contains("Emulated") && p.name.contains("sm_80"));
    assert_eq!((p.major, p.minor, p.multi_processor_count), (8, 0, 132));
    assert_eq!(p.l2_cache_size, 50 << 20);
    assert!(e.properties(2).is_err());
}

/// `fill(u32* out, u32 n, u32 value)`: one thread per element.
///
/// # Safety
/// `launch` must point to a valid `KernelLaunch` whose three parameters are `u32*`, `u32`
/// and `u32`, as the emulator passes them for this test's launches.
unsafe extern "C" fn fill_u32(launch: *const KernelLaunch) -> c_int {
    // SAFETY: the emulator passes a valid launch; the test passes three parameters of the
    // types read here.
    unsafe {
        let l = &*launch;
        if l.num_params != 3 {
            return 1;
        }
        let params = std::slice::from_raw_parts(l.params, 3);
        let addr = *(params[0] as *const u64);
        let n = *(params[1] as *const u32);
        let value = *(params[2] as *const u32);
        let out = (l.translate)(l.translate_ctx, addr) as *mut u32;
        if out.is_null() {
            return 2;
        }
        let threads = l.grid[0] * l.block[0];
        for t in 0..threads.min(n) {
            out.add(t as usize).write_unaligned(value);
        }
        0
    }
}

/// The parameters of `fill_u32` over 64 u32s at `d`: `value` into each, by two blocks of 32.
struct FillArgs {
    addr: u64,
    n: u32,
    value: u32,
}

impl FillArgs {
    const CONFIG: LaunchConfig = LaunchConfig {
        grid: (2, 1, 1),
        block: (32, 1, 1),
        shared_mem_bytes: 0,
    };

    fn new(d: DevicePtr, value: u32) -> FillArgs {
        FillArgs {
            addr: d.0,
            n: 64,
            value,
        }
    }

    /// The `void**` array of a launch, pointing into `self`.
    fn params(&mut self) -> Vec<*mut c_void> {
        vec![
            (&mut self.addr as *mut u64).cast(),
            (&mut self.n as *mut u32).cast(),
            (&mut self.value as *mut u32).cast(),
        ]
    }
}

#[test]
fn registered_kernel_launches() {
    register_kernel("ember_test_fill_u32", fill_u32);
    let e = emu(1);
    let m = e.module_load(0, b"ignored").unwrap();
    let f = e.module_function(m, "ember_test_fill_u32").unwrap();
    let d = e.malloc(0, 64 * 4).unwrap();
    let mut fill = FillArgs::new(d, 0xDEAD_BEEF);
    let mut params = fill.params();
    let config = FillArgs::CONFIG;
    // SAFETY: params match fill_u32's parameters; `d` holds 64 u32s.
    unsafe { e.launch_kernel(f, config, S0, &mut params).unwrap() };
    let mut out = vec![0u8; 256];
    e.memcpy_dtoh(&mut out, d, S0).unwrap();
    assert!(
        out.chunks(4)
            .all(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) == 0xDEAD_BEEF)
    );
    // Bad geometry and a failing kernel are errors.
    let big = LaunchConfig {
        block: (1025, 1, 1),
        ..config
    };
    // SAFETY: as above (not launched: rejected).
    assert!(unsafe { e.launch_kernel(f, big, S0, &mut params) }.is_err());
    // SAFETY: params[0] points at `fill.addr`, a live u64.
    unsafe { params[0].cast::<u64>().write(0x1000) };
    // SAFETY: the kernel translates the bogus address to null and returns an error code.
    let err = unsafe { e.launch_kernel(f, config, S0, &mut params) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("CUDA_ERROR_LAUNCH_FAILED"), "{err}");
}

/// The emulated activity API (Note [CUPTI through the seam]): while enabled, each kernel,
/// copy and memset leaves a record with its bytes or geometry, stamped on the activity clock
/// around the work and tagged with the innermost id pushed on the enqueuing thread; nothing
/// is recorded while disabled, and a failed launch leaves no record.
#[test]
fn activity_records_tag_work_with_the_pushed_id() {
    register_kernel("ember_test_fill_u32", fill_u32);
    let e = emu(2);
    let m = e.module_load(1, b"ignored").unwrap();
    let f = e.module_function(m, "ember_test_fill_u32").unwrap();
    let s1 = e.stream_create(1).unwrap();
    let d = e.malloc(1, 64 * 4).unwrap();
    let mut fill = FillArgs::new(d, 7);
    let mut params = fill.params();
    let config = FillArgs::CONFIG;
    assert!(e.activity_version().unwrap() > 0);
    e.memset_d8_async(d, 0, 16, s1).unwrap(); // not recording yet
    e.activity_enable().unwrap();
    let t0 = e.activity_timestamp_ns().unwrap();
    e.activity_push_correlation(11).unwrap();
    e.memset_d8_async(d, 1, 16, s1).unwrap();
    e.activity_push_correlation(12).unwrap();
    // SAFETY: params match fill_u32's parameters; `d` holds 64 u32s of device 1.
    unsafe { e.launch_kernel(f, config, s1, &mut params).unwrap() };
    e.activity_pop_correlation().unwrap();
    let mut back = vec![0u8; 256];
    e.memcpy_dtoh(&mut back, d, s1).unwrap(); // tagged 11 again
    e.activity_pop_correlation().unwrap();
    e.memcpy_htod(d, &back[..8], s1).unwrap(); // untagged
    // A launch the emulator rejects leaves no record.
    let big = LaunchConfig {
        block: (2048, 1, 1),
        ..config
    };
    // SAFETY: as above (rejected before it runs).
    assert!(unsafe { e.launch_kernel(f, big, s1, &mut params) }.is_err());
    let t1 = e.activity_timestamp_ns().unwrap();
    e.activity_disable().unwrap();
    e.memset_d8_async(d, 2, 16, s1).unwrap(); // not recording any more
    let err = e.activity_pop_correlation().unwrap_err().to_string();
    assert!(err.contains("CUPTI_ERROR_QUEUE_EMPTY"), "{err}");

    let r = e.activity_flush().unwrap();
    let got: Vec<(ActivityKind, &str, usize, Option<u64>, u64)> = r
        .iter()
        .map(|r| (r.kind, r.name.as_str(), r.device, r.external, r.bytes))
        .collect();
    assert_eq!(
        got,
        [
            (ActivityKind::Memset, "", 1, Some(11), 16),
            (ActivityKind::Kernel, "ember_test_fill_u32", 1, Some(12), 0),
            (ActivityKind::MemcpyDtoH, "", 1, Some(11), 256),
            (ActivityKind::MemcpyHtoD, "", 1, None, 8),
        ]
    );
    assert_eq!((r[1].grid, r[1].block), ([2, 1, 1], [32, 1, 1]));
    for w in r.windows(2) {
        assert!(
            w[0].end_ns <= w[1].start_ns,
            "records in order, not overlapping"
        );
    }
    assert!(t0 <= r[0].start_ns && r[3].end_ns <= t1);
    assert!(r.iter().all(|r| r.start_ns <= r.end_ns));
    assert!(
        e.activity_flush().unwrap().is_empty(),
        "a flush takes the records"
    );
}

/// Reference: C = alpha * op(A) op(B) + beta * C on f64 column-major data.
#[allow(clippy::too_many_arguments)]
fn reference(d: &GemmDesc, a: &[f64], b: &[f64], c: &mut [f64]) {
    for bi in 0..d.batch {
        for j in 0..d.n {
            for i in 0..d.m {
                let mut s = 0.0;
                for p in 0..d.k {
                    let av = if d.trans_a {
                        a[bi * d.stride_a + p + i * d.lda]
                    } else {
                        a[bi * d.stride_a + i + p * d.lda]
                    };
                    let bv = if d.trans_b {
                        b[bi * d.stride_b + j + p * d.ldb]
                    } else {
                        b[bi * d.stride_b + p + j * d.ldb]
                    };
                    s += av * bv;
                }
                let ci = bi * d.stride_c + i + j * d.ldc;
                c[ci] = d.alpha * s + d.beta * c[ci];
            }
        }
    }
}

fn to_bytes(dtype: GemmType, v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match dtype {
            GemmType::F32 => (x as f32).to_le_bytes().to_vec(),
            GemmType::F64 => x.to_le_bytes().to_vec(),
            GemmType::F16 => half::f16::from_f64(x).to_le_bytes().to_vec(),
            GemmType::Bf16 => half::bf16::from_f64(x).to_le_bytes().to_vec(),
        })
        .collect()
}

fn from_bytes(dtype: GemmType, v: &[u8]) -> Vec<f64> {
    match dtype {
        GemmType::F32 => v
            .chunks(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        GemmType::F64 => v
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        GemmType::F16 => v
            .chunks(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        GemmType::Bf16 => v
            .chunks(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
    }
}

#[test]
fn gemm_matches_reference_for_every_layout_and_dtype() {
    let e = emu(1);
    // Small integers: exact in every dtype, so results compare exactly.
    let val = |i: usize| ((i * 37 + 11) % 7) as f64 - 3.0;
    for dtype in [GemmType::F32, GemmType::F64, GemmType::F16, GemmType::Bf16] {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let (m, n, k, batch) = (3, 4, 5, 2);
            let lda = if trans_a { k } else { m } + 1;
            let ldb = if trans_b { n } else { k } + 2;
            let ldc = m + 1;
            let (cols_a, cols_b) = (if trans_a { m } else { k }, if trans_b { k } else { n });
            let (stride_a, stride_b, stride_c) = (lda * cols_a + 3, ldb * cols_b, ldc * n + 1);
            let a: Vec<f64> = (0..stride_a * batch).map(val).collect();
            let b: Vec<f64> = (0..stride_b * batch).map(|i| val(i + 3)).collect();
            let mut c: Vec<f64> = (0..stride_c * batch).map(|i| val(i + 5)).collect();
            let es = match dtype {
                GemmType::F64 => 8,
                GemmType::F32 => 4,
                _ => 2,
            };
            let (pa, pb, pc) = (
                e.malloc(0, a.len() * es).unwrap(),
                e.malloc(0, b.len() * es).unwrap(),
                e.malloc(0, c.len() * es).unwrap(),
            );
            e.memcpy_htod(pa, &to_bytes(dtype, &a), S0).unwrap();
            e.memcpy_htod(pb, &to_bytes(dtype, &b), S0).unwrap();
            e.memcpy_htod(pc, &to_bytes(dtype, &c), S0).unwrap();
            let desc = GemmDesc {
                trans_a,
                trans_b,
                m,
                n,
                k,
                alpha: 2.0,
                beta: -1.0,
                a: pa,
                lda,
                stride_a,
                b: pb,
                ldb,
                stride_b,
                c: pc,
                ldc,
                stride_c,
                batch,
                dtype,
                allow_tf32: false,
            };
            e.gemm(0, S0, &desc).unwrap();
            reference(&desc, &a, &b, &mut c);
            let mut out = vec![0u8; c.len() * es];
            e.memcpy_dtoh(&mut out, pc, S0).unwrap();
            let got = from_bytes(dtype, &out);
            // f16/bf16 round large values; compare relative to magnitude.
            for (g, r) in got.iter().zip(&c) {
                let tol = if es == 2 { r.abs() / 64.0 } else { 0.0 };
                assert!(
                    (g - r).abs() <= tol,
                    "{dtype:?} {trans_a} {trans_b}: {g} vs {r}"
                );
            }
            // Past-the-end: a leading dimension that overruns A is an error, not UB.
            let bad = GemmDesc {
                lda: lda * 10,
                ..desc
            };
            assert!(e.gemm(0, S0, &bad).is_err());
            for p in [pa, pb, pc] {
                e.free(0, p).unwrap();
            }
        }
    }
}

/// The seam's convolution blends as cuDNN's: y = alpha·conv(x, w) + beta·y, and beta 0
/// ignores what y held (NaN included). The tensor layer runs every convolution with alpha 1,
/// beta 0 (Note [Convolutions on cuDNN]), so the blend is checked here, against a naive f64
/// forward convolution, on small integers that every dtype holds exactly.
#[test]
fn conv_blends_with_alpha_and_beta_as_cudnn() {
    let e = emu(1);
    let val = |i: usize| ((i * 37 + 11) % 7) as f64 - 3.0;
    let (x_dims, w_dims, y_dims) = ([1, 2, 4, 5], [3, 2, 3, 3], [1, 3, 4, 5]);
    let contiguous = |d: [usize; 4]| [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1];
    let x: Vec<f64> = (0..40).map(val).collect();
    let w: Vec<f64> = (0..54).map(|i| val(i + 2)).collect();
    let y0: Vec<f64> = (0..60).map(|i| val(i + 5)).collect();
    // The naive forward: pad 1, stride 1, dilation 1.
    let mut conv = vec![0.0; 60];
    for k in 0..3 {
        for (oh, ow) in (0..4).flat_map(|h| (0..5).map(move |w| (h, w))) {
            let mut acc = 0.0;
            for (c, r, t) in
                (0..2).flat_map(|c| (0..3).flat_map(move |r| (0..3).map(move |t| (c, r, t))))
            {
                let (ih, iw) = ((oh + r) as isize - 1, (ow + t) as isize - 1);
                if (0..4).contains(&ih) && (0..5).contains(&iw) {
                    acc += x[c * 20 + ih as usize * 5 + iw as usize]
                        * w[((k * 2 + c) * 3 + r) * 3 + t];
                }
            }
            conv[k * 20 + oh * 5 + ow] = acc;
        }
    }
    for dtype in [GemmType::F32, GemmType::F64, GemmType::F16, GemmType::Bf16] {
        let problem = ConvProblem {
            direction: ConvDirection::Forward,
            dtype,
            x_dims,
            x_strides: contiguous(x_dims),
            w_dims,
            y_dims,
            y_strides: contiguous(y_dims),
            pad: (1, 1),
            stride: (1, 1),
            dilation: (1, 1),
            groups: 1,
            allow_tf32: false,
            align: 16,
        };
        let es = match dtype {
            GemmType::F64 => 8,
            GemmType::F32 => 4,
            _ => 2,
        };
        let algo = e
            .conv_algorithms(0, S0, &problem, ConvSearch::Heuristic)
            .unwrap()[0];
        let (px, pw, py) = (
            e.malloc(0, 40 * es).unwrap(),
            e.malloc(0, 54 * es).unwrap(),
            e.malloc(0, 60 * es).unwrap(),
        );
        let ws = algo.workspace_bytes;
        let pws = if ws > 0 {
            e.malloc(0, ws).unwrap()
        } else {
            DevicePtr::NULL
        };
        e.memcpy_htod(px, &to_bytes(dtype, &x), S0).unwrap();
        e.memcpy_htod(pw, &to_bytes(dtype, &w), S0).unwrap();
        let run = |alpha: f64, beta: f64, before: &[f64]| {
            e.memcpy_htod(py, &to_bytes(dtype, before), S0).unwrap();
            let desc = ConvDesc {
                problem,
                algo: algo.algo,
                alpha,
                beta,
                buffers: ConvBuffers {
                    x: px,
                    w: pw,
                    y: py,
                    workspace: pws,
                    workspace_bytes: ws,
                },
            };
            e.conv(0, S0, &desc).unwrap();
            let mut out = vec![0u8; 60 * es];
            e.memcpy_dtoh(&mut out, py, S0).unwrap();
            from_bytes(dtype, &out)
        };
        let blended = run(2.0, -1.0, &y0);
        let plain = run(1.0, 0.0, &[f64::NAN; 60]);
        for i in 0..60 {
            // Integers up to 2^8 are exact in every dtype but bf16 (8 significant bits),
            // whose blended values reach 330: within its rounding there.
            let tol = |r: f64| {
                if dtype == GemmType::Bf16 {
                    r.abs() / 128.0
                } else {
                    0.0
                }
            };
            let want = 2.0 * conv[i] - y0[i];
            assert!(
                (blended[i] - want).abs() <= tol(want),
                "{dtype:?} [{i}]: {} vs {want}",
                blended[i]
            );
            assert!(
                (plain[i] - conv[i]).abs() <= tol(conv[i]),
                "{dtype:?} [{i}]: {} vs {}",
                plain[i],
                conv[i]
            );
        }
        for p in [px, pw, py] {
            e.free(0, p).unwrap();
        }
        if ws > 0 {
            e.free(0, pws).unwrap();
        }
    }
}

#[test]
fn gemm_beta_zero_ignores_nan_in_c() {
    let e = emu(1);
    let pa = e.malloc(0, 4).unwrap();
    let pc = e.malloc(0, 4).unwrap();
    e.memcpy_htod(pa, &3.0f32.to_le_bytes(), S0).unwrap();
    e.memcpy_htod(pc, &f32::NAN.to_le_bytes(), S0).unwrap();
    let desc = GemmDesc {
        trans_a: false,
        trans_b: false,
        m: 1,
        n: 1,
        k: 1,
        alpha: 1.0,
        beta: 0.0,
        a: pa,
        lda: 1,
        stride_a: 0,
        b: pa,
        ldb: 1,
        stride_b: 0,
        c: pc,
        ldc: 1,
        stride_c: 0,
        batch: 1,
        dtype: GemmType::F32,
        allow_tf32: true,
    };
    e.gemm(0, S0, &desc).unwrap();
    let mut out = [0u8; 4];
    e.memcpy_dtoh(&mut out, pc, S0).unwrap();
    assert_eq!(f32::from_le_bytes(out), 9.0);
    let other = DevicePtr(0x1234);
    assert!(e.gemm(0, S0, &GemmDesc { a: other, ..desc }).is_err());
}

proptest::proptest! {
    #[test]
    fn random_copies_are_bounds_checked(
        size in 1usize..4096,
        offset in 0u64..5000,
        len in 0usize..5000,
        value in proptest::prelude::any::<u8>(),
    ) {
        let e = emu(1);
        let p = e.malloc(0, size).unwrap();
        let in_bounds = offset as usize + len <= size;
        let dst = p.offset(offset);
        let data = vec![value; len];
        let mut buf = vec![0u8; len];
        let results = [
            e.memcpy_dtod_async(dst, p, len, S0).is_ok(),
            e.memcpy_htod(dst, &data, S0).is_ok(),
            e.memcpy_dtoh(&mut buf, dst, S0).is_ok(),
            e.memset_d8_async(dst, value, len, S0).is_ok(),
            e.with_host_slice(dst, len, |s| s.len()).is_ok(),
        ];
        for ok in results {
            proptest::prop_assert_eq!(ok, in_bounds, "size {} offset {} len {}", size, offset, len);
        }
        if in_bounds {
            e.memcpy_dtoh(&mut buf, dst, S0).unwrap();
            proptest::prop_assert!(buf.iter().all(|&b| b == value));
        }
    }
}

#[test]
fn tagged_pointers_are_non_canonical() {
    // Never dereferenced: only the bit pattern is checked (see Note [Tagged device addresses]).
    let e = emu(2);
    for device in 0..2 {
        let p = e.malloc(device, 8).unwrap().0;
        let top17 = p >> 47;
        assert!(
            top17 != 0 && top17 != (1 << 17) - 1,
            "{p:#x} is canonical on x86-64"
        );
        e.free(device, DevicePtr(p)).unwrap();
    }
}
