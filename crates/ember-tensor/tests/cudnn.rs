#![allow(clippy::unwrap_used)]
//! conv2d on CUDA through cuDNN (Note [Convolutions on cuDNN]): the three directions
//! against the f64 CPU reference for stride, padding, dilation and groups in f32, f64, f16
//! and bf16, strided and misaligned operands, the fallback to im2col when cuDNN is disabled,
//! absent or refuses a shape, benchmark mode, deterministic mode, workspace that cannot be
//! allocated, and the settings' defaults.
//!
//! Note [cuDNN tests on both drivers]: every test runs on `cuda:0`, the emulator's in CI and
//! the real GPU's under `EMBER_GPU_TEST=1`, where the real cuDNN computes what is compared
//! with the CPU; `cargo xtask gpu-session` runs this suite once per cuDNN API
//! (`EMBER_CUDNN_API=legacy`, then `graph`, under which a problem the graph API cannot plan
//! is an error instead of a fallback). Which path ran is checked on both: the emulator
//! records each cuDNN call and kernel launch (one run per direction, no im2col kernels);
//! the real driver records neither, so there the path in use must be cuDNN and no fallback
//! may name the test's input (the tests that expect cuDNN use shapes of their own for
//! that). What only the emulator can stage (cuDNN absent, a shape refused, a workspace too
//! large, its algorithm numbers) is checked on the emulator alone; the tests made only of
//! that skip on a GPU and say so (Note [Skipped tests]).
//!
//! The settings are process-wide (as PyTorch's) and the algorithm cache is keyed by shape,
//! so every test here holds `LOCK`, restores the settings it changes, and uses shapes of its
//! own where it changes what the emulated cuDNN claims.

mod common_nn;

use std::sync::{Mutex, MutexGuard, PoisonError};

use common_nn::*;
use ember_device::driver::ConvDirection::{self, BackwardData, BackwardFilter, Forward};
use ember_device::driver::emulator::{
    ConvCall, EmulatedCudnn, set_thread_cudnn, thread_conv_calls, thread_launch_counts,
};
use ember_tensor::aten;
use ember_tensor::backends::cudnn;
use ember_tensor::{Conv2dOptions, DType, Device, Padding, Tensor};
use ember_testing::{prepare, rand_vec, real_gpu_requested, skip, values};

static LOCK: Mutex<()> = Mutex::new(());

/// Why a test made only of what the emulator stages skips on a real GPU.
const EMULATOR_ONLY: &str = "stages cuDNN through the emulator's cuDNN (absent, refusing, \
                             workspace), which a real GPU's library cannot be made to do";

/// The lock and `cuda:0` (emulated, or the real GPU under `EMBER_GPU_TEST=1`; Note [cuDNN
/// tests on both drivers]), with this thread's emulated cuDNN back to its default.
fn setup() -> (MutexGuard<'static, ()>, Device) {
    let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let dev = prepare(Device::Cuda(0)).unwrap();
    if emulated() {
        set_thread_cudnn(None);
    }
    (guard, dev)
}

/// Whether `cuda:0` is the emulator's, whose records the path checks read.
fn emulated() -> bool {
    ember_device::cuda::is_emulated()
}

/// The recorded fallbacks to im2col that name input `x`.
fn fallbacks_naming(x: &[usize]) -> Vec<String> {
    let input = format!("input {x:?}");
    cudnn::fallbacks()
        .into_iter()
        .filter(|f| f.contains(&input))
        .collect()
}

/// Checks that cuDNN, not im2col, ran `dirs` for input `x` in `t` (Note [cuDNN tests on
/// both drivers]): on any driver from the path in use and the fallbacks, none of which may
/// name `x` (all a real GPU can tell); on the emulator also from its records, one run per
/// direction and no im2col, scatter or gather kernel.
fn assert_on_cudnn(t: &Trace, x: &[usize], dirs: &[ConvDirection], what: &str) {
    let (path, why) = cudnn::conv_path(0);
    assert_eq!(path, "cudnn", "{what}: {why}");
    let fell = fallbacks_naming(x);
    assert!(fell.is_empty(), "{what}: took im2col: {fell:?}");
    if emulated() {
        for &d in dirs {
            assert_eq!(t.runs(d).len(), 1, "{what}: {d:?} runs {:?}", t.calls);
        }
        for k in ["im2col", "scatter_add", "index_select"] {
            assert!(!t.launched(k), "{what}: {k} launched: {:?}", t.launches);
        }
    }
}

/// What one closure did on this thread: the emulated cuDNN calls and the kernels launched.
struct Trace {
    calls: Vec<ConvCall>,
    launches: std::collections::BTreeMap<String, u64>,
}

impl Trace {
    fn of<R>(f: impl FnOnce() -> R) -> (R, Trace) {
        let c0 = thread_conv_calls().len();
        let l0 = thread_launch_counts();
        let r = f();
        let calls = thread_conv_calls()[c0..].to_vec();
        let mut launches = thread_launch_counts();
        for (k, v) in &l0 {
            if let Some(n) = launches.get_mut(k) {
                *n -= v;
            }
        }
        launches.retain(|_, n| *n > 0);
        (r, Trace { calls, launches })
    }

    /// [`Trace::of`] with the emulated cuDNN claiming `cudnn` for this thread meanwhile.
    fn claiming<R>(cudnn: EmulatedCudnn, f: impl FnOnce() -> R) -> (R, Trace) {
        set_thread_cudnn(Some(cudnn));
        let r = Trace::of(f);
        set_thread_cudnn(None);
        r
    }

    fn runs(&self, d: ConvDirection) -> Vec<u32> {
        self.calls
            .iter()
            .filter_map(|c| match *c {
                ConvCall::Run(dir, algo, _) if dir == d => Some(algo),
                _ => None,
            })
            .collect()
    }

    fn searches(&self) -> usize {
        self.calls
            .iter()
            .filter(|c| matches!(c, ConvCall::Benchmark(_)))
            .count()
    }

    fn heuristics(&self) -> usize {
        self.calls
            .iter()
            .filter(|c| matches!(c, ConvCall::Heuristic(_)))
            .count()
    }

    fn launched(&self, prefix: &str) -> bool {
        self.launches.keys().any(|k| k.starts_with(prefix))
    }
}

fn tensor(shape: &[usize], seed: u64, dtype: DType, dev: Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(rand_vec(n, seed), shape.to_vec(), Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// Forward, input gradient and weight gradient of one convolution, the output gradient
/// drawn from `seed`.
fn three(x: &Tensor, w: &Tensor, b: &Tensor, o: &Conv2dOptions, seed: u64) -> [Vec<f64>; 3] {
    let y = x.conv2d(w, Some(b), o).unwrap();
    let g = tensor(&y.dims(), seed, y.dtype(), y.device());
    let gx = aten::conv2d_backward_input(&g, dims(x), w, o).unwrap();
    let gw = aten::conv2d_backward_weight(&g, x, dims(w), o).unwrap();
    [values(&y), values(&gx), values(&gw)]
}

/// conv2d of copies of `x` and `w` on the CPU (the reference).
fn cpu_conv(x: &Tensor, w: &Tensor, o: &Conv2dOptions) -> Tensor {
    let (x, w) = (x.to_device(CPU).unwrap(), w.to_device(CPU).unwrap());
    x.conv2d(&w, None, o).unwrap()
}

fn dims(t: &Tensor) -> [usize; 4] {
    t.dims().try_into().unwrap()
}

struct Case {
    x: [usize; 4],
    w: [usize; 4],
    opts: Conv2dOptions,
}

fn cases() -> Vec<Case> {
    let o = Conv2dOptions::new;
    vec![
        Case {
            x: [2, 3, 7, 6],
            w: [4, 3, 3, 3],
            opts: o(),
        },
        Case {
            x: [2, 4, 9, 8],
            w: [6, 2, 3, 2],
            opts: o().stride((2, 1)).padding((1, 2)).groups(2),
        },
        Case {
            x: [1, 6, 10, 9],
            w: [3, 2, 3, 3],
            opts: o().dilation((2, 3)).padding(2).groups(3),
        },
        Case {
            x: [3, 2, 8, 8],
            w: [2, 2, 1, 1],
            opts: o().stride(3),
        },
        Case {
            x: [1, 4, 6, 7],
            w: [4, 1, 3, 3],
            opts: o().padding(Padding::Same).groups(4),
        },
    ]
}

/// The CPU in f64 is the reference; each dtype within its tolerance, scaled by the number of
/// terms summed.
#[test]
fn all_three_directions_run_on_cudnn_and_match_the_cpu() {
    let (_g, dev) = setup();
    for (ci, case) in cases().iter().enumerate() {
        let seed = 10 * ci as u64;
        let want = {
            let x = tensor(&case.x, seed, DType::F64, CPU);
            let w = tensor(&case.w, seed + 1, DType::F64, CPU);
            let b = tensor(&[case.w[0]], seed + 2, DType::F64, CPU);
            three(&x, &w, &b, &case.opts, seed + 3)
        };
        for dtype in FLOAT_DTYPES {
            let x = tensor(&case.x, seed, dtype, dev);
            let w = tensor(&case.w, seed + 1, dtype, dev);
            let b = tensor(&[case.w[0]], seed + 2, dtype, dev);
            let (got, t) = Trace::of(|| three(&x, &w, &b, &case.opts, seed + 3));
            assert_on_cudnn(
                &t,
                &case.x,
                &[Forward, BackwardData, BackwardFilter],
                &format!("case {ci} {dtype}"),
            );
            let terms = (case.w[1] * case.w[2] * case.w[3]).max(case.x[0] * case.x[2] * case.x[3]);
            for (i, what) in ["forward", "input grad", "weight grad"].iter().enumerate() {
                within(
                    tol(dtype),
                    terms as f64,
                    &format!("case {ci} {dtype} {what}"),
                )
                .assert(&got[i], &want[i]);
            }
        }
    }
}

/// Strided inputs reach cuDNN as views; a broadcast gradient is copied first; both give the
/// contiguous answer.
#[test]
fn strided_and_broadcast_operands() {
    let (_g, dev) = setup();
    let x = tensor(&[2, 3, 5, 4], 90, DType::F32, dev);
    let w = tensor(&[2, 3, 2, 2], 91, DType::F32, dev);
    let xt = x
        .transpose(2, 3)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(2, 3)
        .unwrap();
    assert!(!xt.is_contiguous());
    let o = Conv2dOptions::new().padding(1);
    let (y, t) = Trace::of(|| xt.conv2d(&w, None, &o).unwrap());
    assert_on_cudnn(&t, &x.dims(), &[Forward], "strided");
    if emulated() {
        assert!(
            !t.launched("cast_"),
            "a strided input needs no copy: {:?}",
            t.launches
        );
    }
    within(1e-5, 12.0, "strided").assert(&values(&y), &values(&cpu_conv(&x, &w, &o)));
    let ones = Tensor::ones([1, 1, 1, 1], (dev, DType::F32))
        .unwrap()
        .expand(y.dims().to_vec())
        .unwrap();
    let (gx, t) = Trace::of(|| aten::conv2d_backward_input(&ones, dims(&x), &w, &o).unwrap());
    assert_on_cudnn(&t, &x.dims(), &[BackwardData], "broadcast grad");
    let dense = ones.contiguous().unwrap().to_device(CPU).unwrap();
    let wcpu = w.to_device(CPU).unwrap();
    within(1e-5, 12.0, "broadcast grad").assert(
        &values(&gx),
        &values(&aten::conv2d_backward_input(&dense, dims(&x), &wcpu, &o).unwrap()),
    );
}

/// Views that start inside their storage reach cuDNN with their own byte alignment (a plan
/// of cuDNN's graph API is made for it; the emulator checks every buffer has it), in every
/// direction, and in f16 down to 2 bytes.
#[test]
fn views_at_odd_offsets_state_their_alignment() {
    let (_g, dev) = setup();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-2)] {
        let big = tensor(&[2, 3, 5, 7], 92, dtype, dev);
        // One element in along the last dim: 4 (f32) or 2 (f16) bytes past the storage.
        let x = big.narrow(3, 1, 6).unwrap();
        let w = tensor(&[4, 3, 3, 2], 93, dtype, dev);
        let o = Conv2dOptions::new().padding(1);
        let (y, t) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
        assert_on_cudnn(&t, &x.dims(), &[Forward], "odd-offset forward");
        within(tol, 12.0, "odd-offset forward").assert(&values(&y), &values(&cpu_conv(&x, &w, &o)));
        let g = tensor(&y.dims(), 94, dtype, dev);
        let gview = Tensor::cat(&[&g, &g], 3)
            .unwrap()
            .narrow(3, 1, y.dims()[3])
            .unwrap();
        let (gw, t) = Trace::of(|| aten::conv2d_backward_weight(&gview, &x, dims(&w), &o).unwrap());
        assert_on_cudnn(
            &t,
            &x.dims(),
            &[BackwardFilter],
            "odd-offset weight gradient",
        );
        let gcpu = gview.to_device(CPU).unwrap();
        let xcpu = x.to_device(CPU).unwrap();
        within(tol * 10.0, 12.0, "odd-offset weight gradient").assert(
            &values(&gw),
            &values(&aten::conv2d_backward_weight(&gcpu, &xcpu, dims(&w), &o).unwrap()),
        );
        let (gx, t) = Trace::of(|| aten::conv2d_backward_input(&gview, dims(&x), &w, &o).unwrap());
        assert_on_cudnn(&t, &x.dims(), &[BackwardData], "odd-offset input gradient");
        let wcpu = w.to_device(CPU).unwrap();
        within(tol * 10.0, 12.0, "odd-offset input gradient").assert(
            &values(&gx),
            &values(&aten::conv2d_backward_input(&gcpu, dims(&x), &wcpu, &o).unwrap()),
        );
    }
}

#[test]
fn without_cudnn_the_im2col_path_runs() {
    if real_gpu_requested() {
        skip!("{EMULATOR_ONLY}");
    }
    let (_g, dev) = setup();
    let x = tensor(&[2, 4, 6, 6], 20, DType::F32, dev);
    let w = tensor(&[4, 2, 3, 3], 21, DType::F32, dev);
    let b = tensor(&[4], 22, DType::F32, dev);
    let o = Conv2dOptions::new().padding(1).groups(2);
    let (with, _) = Trace::of(|| three(&x, &w, &b, &o, 23));
    let absent = EmulatedCudnn {
        present: false,
        ..EmulatedCudnn::default()
    };
    let ((path, why, available, version), _) = Trace::claiming(absent, || {
        let (path, why) = cudnn::conv_path(0);
        (path, why, cudnn::is_available(), cudnn::version())
    });
    assert_eq!(path, "im2col");
    assert!(why.contains("pretends it is absent"), "{why}");
    assert!(!available && version.is_none());
    let (without, t) = Trace::claiming(absent, || three(&x, &w, &b, &o, 23));
    assert!(
        t.runs(Forward).is_empty() && t.calls.is_empty(),
        "{:?}",
        t.calls
    );
    assert!(
        t.launched("im2col_f32") && t.launched("scatter_add"),
        "{:?}",
        t.launches
    );
    for i in 0..3 {
        within(1e-5, 18.0, "without cuDNN").assert(&without[i], &with[i]);
    }
    assert_eq!(cudnn::conv_path(0).0, "cudnn");
    assert_eq!(cudnn::version(), Some(90100));
}

/// With `enabled` off every convolution takes im2col (the real GPU's too), and the results
/// stay the CPU's; back on, cuDNN runs again.
#[test]
fn disabled_cudnn_takes_the_im2col_path() {
    let (_g, dev) = setup();
    let x = tensor(&[1, 2, 5, 5], 30, DType::F32, dev);
    let w = tensor(&[3, 2, 3, 3], 31, DType::F32, dev);
    let o = Conv2dOptions::new();
    cudnn::set_enabled(false);
    let (y, t) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    let (path, why) = cudnn::conv_path(0);
    cudnn::set_enabled(true);
    if emulated() {
        assert!(t.calls.is_empty() && t.launched("im2col_f32"));
    }
    assert_eq!(path, "im2col");
    assert!(why.contains("disabled"), "{why}");
    let want = values(&cpu_conv(&x, &w, &o));
    within(1e-5, 18.0, "disabled").assert(&values(&y), &want);
    let (y2, t) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    assert_on_cudnn(&t, &x.dims(), &[Forward], "enabled again");
    within(1e-5, 18.0, "enabled again").assert(&values(&y2), &want);
}

/// A shape the emulated cuDNN is told to refuse takes im2col and is recorded.
#[test]
fn shapes_cudnn_refuses_fall_back_to_im2col_and_are_recorded() {
    if real_gpu_requested() {
        skip!("{EMULATOR_ONLY}");
    }
    let (_g, dev) = setup();
    // A "too large" tensor, as the emulator is told to judge it (a shape of its own, never
    // run on cuDNN before: the algorithm cache would remember it as accepted).
    let x = tensor(&[1, 3, 11, 13], 40, DType::F32, dev);
    let w = tensor(&[2, 3, 3, 3], 41, DType::F32, dev);
    let o = Conv2dOptions::new();
    let want = cpu_conv(&x, &w, &o);
    let small = EmulatedCudnn {
        max_tensor_elements: 100,
        ..EmulatedCudnn::default()
    };
    let (y, t) = Trace::claiming(small, || {
        (
            x.conv2d(&w, None, &o).unwrap(),
            x.conv2d(&w, None, &o).unwrap(),
        )
    });
    assert!(
        t.runs(Forward).is_empty() && t.launched("im2col_f32"),
        "{:?}",
        t.calls
    );
    within(1e-5, 27.0, "refused").assert(&values(&y.0), &values(&want));
    within(1e-5, 27.0, "refused").assert(&values(&y.1), &values(&want));
    // The record a real GPU's check reads (`assert_on_cudnn`) names the input.
    let fell = fallbacks_naming(&x.dims());
    assert!(
        fell.iter().any(|f| f.contains("NOT_SUPPORTED")),
        "{:?}",
        cudnn::fallbacks()
    );
}

/// Asymmetric padding (`same` with an even kernel) cannot be said to cuDNN, on any driver:
/// im2col runs it, and the fallback is recorded.
#[test]
fn asymmetric_padding_takes_the_im2col_path_and_is_recorded() {
    let (_g, dev) = setup();
    let x = tensor(&[1, 3, 10, 13], 43, DType::F32, dev);
    let w = tensor(&[2, 3, 2, 4], 42, DType::F32, dev);
    let same = Conv2dOptions::new().padding(Padding::Same);
    let (y, t) = Trace::of(|| x.conv2d(&w, None, &same).unwrap());
    if emulated() {
        assert!(t.runs(Forward).is_empty() && t.launched("im2col_f32"));
    }
    let cpu = cpu_conv(&x, &w, &same);
    within(1e-5, 24.0, "asymmetric").assert(&values(&y), &values(&cpu));
    assert!(
        fallbacks_naming(&x.dims())
            .iter()
            .any(|f| f.contains("asymmetric")),
        "{:?}",
        cudnn::fallbacks()
    );
}

/// Benchmark mode times the algorithms once per shape and keeps the fastest; its results
/// are the CPU's on any driver. On the emulator, which algorithms: heuristics rank
/// IMPLICIT_PRECOMP_GEMM (1) first, asked once per shape; the search times GEMM (2)
/// fastest (Note [Emulated cuDNN algorithms]); a new TF32 setting is a new problem.
#[test]
fn benchmark_mode_searches_once_per_shape_and_picks_the_fastest() {
    let (_g, dev) = setup();
    let x = tensor(&[2, 3, 12, 10], 50, DType::F32, dev);
    let w = tensor(&[5, 3, 3, 3], 51, DType::F32, dev);
    let o = Conv2dOptions::new().padding(1);
    let (_, t0) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    let (_, t1) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    cudnn::set_benchmark(true);
    let (y, t2) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    let (y2, t3) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    let tf32 = cudnn::allow_tf32();
    cudnn::set_allow_tf32(!tf32);
    let (_, t4) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    cudnn::set_allow_tf32(tf32);
    cudnn::set_benchmark(false);
    for (i, t) in [&t0, &t1, &t2, &t3, &t4].into_iter().enumerate() {
        assert_on_cudnn(t, &x.dims(), &[Forward], &format!("benchmark call {i}"));
    }
    if emulated() {
        assert_eq!(
            (t0.heuristics(), t0.searches(), t0.runs(Forward)),
            (1, 0, vec![1])
        );
        assert_eq!((t1.heuristics(), t1.runs(Forward)), (0, vec![1]));
        assert_eq!(
            (t2.searches(), t2.runs(Forward)),
            (1, vec![2]),
            "{:?}",
            t2.calls
        );
        assert_eq!(
            (t3.searches(), t3.heuristics(), t3.runs(Forward)),
            (0, 0, vec![2])
        );
        assert_eq!(t4.searches(), 1);
    }
    let cpu = values(&cpu_conv(&x, &w, &o));
    within(1e-5, 27.0, "benchmark").assert(&values(&y), &cpu);
    within(1e-5, 27.0, "benchmark, cached").assert(&values(&y2), &cpu);
}

/// Deterministic mode keeps to deterministic algorithms: two runs give the same bits, close
/// to the free choice's and to the CPU's. On the emulator, which algorithms: its first
/// (0) by default, its first deterministic one (1) in deterministic mode.
#[test]
fn deterministic_mode_keeps_to_deterministic_algorithms() {
    let (_g, dev) = setup();
    let x = tensor(&[2, 2, 7, 7], 60, DType::F32, dev);
    let w = tensor(&[3, 2, 3, 3], 61, DType::F32, dev);
    let o = Conv2dOptions::new();
    let g = tensor(&[2, 3, 5, 5], 62, DType::F32, dev);
    let grads = || {
        (
            aten::conv2d_backward_input(&g, dims(&x), &w, &o).unwrap(),
            aten::conv2d_backward_weight(&g, &x, dims(&w), &o).unwrap(),
        )
    };
    let (free, t) = Trace::of(grads);
    assert_on_cudnn(&t, &x.dims(), &[BackwardData, BackwardFilter], "free");
    if emulated() {
        assert_eq!(
            (t.runs(BackwardData), t.runs(BackwardFilter)),
            (vec![0], vec![0])
        );
    }
    cudnn::set_deterministic(true);
    let (det, t) = Trace::of(grads);
    let (det2, _) = Trace::of(grads);
    cudnn::set_deterministic(false);
    assert_on_cudnn(
        &t,
        &x.dims(),
        &[BackwardData, BackwardFilter],
        "deterministic",
    );
    if emulated() {
        assert_eq!(
            (t.runs(BackwardData), t.runs(BackwardFilter)),
            (vec![1], vec![1])
        );
    }
    assert_eq!(values(&det.0), values(&det2.0));
    assert_eq!(values(&det.1), values(&det2.1));
    within(1e-5, 50.0, "deterministic").assert(&values(&det.0), &values(&free.0));
    within(1e-5, 50.0, "deterministic").assert(&values(&det.1), &values(&free.1));
    let (gc, xc, wc) = (
        g.to_device(CPU).unwrap(),
        x.to_device(CPU).unwrap(),
        w.to_device(CPU).unwrap(),
    );
    within(1e-5, 50.0, "deterministic input grad").assert(
        &values(&det.0),
        &values(&aten::conv2d_backward_input(&gc, dims(&x), &wc, &o).unwrap()),
    );
    within(1e-5, 50.0, "deterministic weight grad").assert(
        &values(&det.1),
        &values(&aten::conv2d_backward_weight(&gc, &xc, dims(&w), &o).unwrap()),
    );
}

#[test]
fn workspace_that_cannot_be_had_moves_to_an_algorithm_that_fits_or_is_out_of_memory() {
    if real_gpu_requested() {
        skip!("{EMULATOR_ONLY}");
    }
    let (_g, dev) = setup();
    let x = tensor(&[1, 3, 9, 14], 70, DType::F32, dev);
    let w = tensor(&[2, 3, 3, 3], 71, DType::F32, dev);
    let o = Conv2dOptions::new();
    let want = cpu_conv(&x, &w, &o);
    // Far more than the emulated device's 16 GiB.
    let (y, t) = Trace::claiming(
        EmulatedCudnn {
            workspace_override: Some(1 << 45),
            ..EmulatedCudnn::default()
        },
        || x.conv2d(&w, None, &o),
    );
    assert_eq!(
        t.runs(Forward),
        vec![0],
        "IMPLICIT_GEMM needs no workspace: {:?}",
        t.calls
    );
    within(1e-5, 27.0, "fits").assert(&values(&y.unwrap()), &values(&want));

    let x = tensor(&[1, 3, 9, 15], 72, DType::F32, dev);
    let (r, t) = Trace::claiming(
        EmulatedCudnn {
            workspace_override: Some(1 << 45),
            every_algorithm_needs_workspace: true,
            ..EmulatedCudnn::default()
        },
        || x.conv2d(&w, None, &o),
    );
    let e = r.unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(t.runs(Forward).is_empty());
}

/// PyTorch's defaults, on any driver; except that on a real GPU the test harness turned
/// TF32 off before this test ran, so that f32 results meet f64 references (Note [Test
/// devices] in `ember-testing`).
#[test]
fn settings_have_pytorchs_defaults_and_can_be_set() {
    let (_g, _dev) = setup();
    assert!(cudnn::enabled());
    assert_eq!(
        cudnn::allow_tf32(),
        !real_gpu_requested(),
        "PyTorch allows TF32 for convolutions by default"
    );
    assert!(!cudnn::benchmark());
    assert!(!cudnn::deterministic());
    let tf32 = cudnn::allow_tf32();
    cudnn::set_allow_tf32(!tf32);
    assert_eq!(cudnn::allow_tf32(), !tf32);
    cudnn::set_allow_tf32(tf32);
    cudnn::set_deterministic(true);
    assert!(cudnn::deterministic());
    cudnn::set_deterministic(false);
    assert!(cudnn::is_available());
    assert_eq!(cudnn::conv_path(0).0, "cudnn");
}
