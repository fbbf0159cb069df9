#![allow(clippy::unwrap_used)]
//! conv2d on CUDA through cuDNN (Note [Convolutions on cuDNN]), on the emulated `cuda:0`:
//! which path runs (the emulator's record of cuDNN calls and its kernel launch counts), the
//! three directions against the CPU for stride, padding, dilation and groups in f32, f64,
//! f16 and bf16, the fallback to im2col when cuDNN is absent, disabled or refuses a shape,
//! benchmark-mode caching, deterministic mode, workspace that cannot be allocated, and the
//! settings' defaults.
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
use ember_testing::{prepare, rand_vec, real_gpu_requested, values};

static LOCK: Mutex<()> = Mutex::new(());

/// The lock, the emulated `cuda:0`, and this thread's emulated cuDNN back to the default.
/// These tests read the emulator's records, so under `EMBER_GPU_TEST` (the real driver)
/// they say so and stop: `None`.
fn setup() -> Option<(MutexGuard<'static, ()>, Device)> {
    if real_gpu_requested() {
        eprintln!("skipped: the cuDNN path tests read the emulator's records");
        return None;
    }
    let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let dev = prepare(Device::Cuda(0)).unwrap();
    set_thread_cudnn(None);
    Some((guard, dev))
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
    let Some((_g, dev)) = setup() else { return };
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
            for d in [Forward, BackwardData, BackwardFilter] {
                assert_eq!(
                    t.runs(d).len(),
                    1,
                    "case {ci} {dtype}: {d:?} runs {:?}",
                    t.calls
                );
            }
            for k in ["im2col", "scatter_add", "index_select"] {
                assert!(
                    !t.launched(k),
                    "case {ci} {dtype}: {k} launched: {:?}",
                    t.launches
                );
            }
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
    let Some((_g, dev)) = setup() else { return };
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
    assert_eq!(t.runs(Forward).len(), 1);
    assert!(
        !t.launched("cast_"),
        "a strided input needs no copy: {:?}",
        t.launches
    );
    within(1e-5, 12.0, "strided").assert(&values(&y), &values(&x.conv2d(&w, None, &o).unwrap()));
    let ones = Tensor::ones([1, 1, 1, 1], (dev, DType::F32))
        .unwrap()
        .expand(y.dims().to_vec())
        .unwrap();
    let (gx, t) = Trace::of(|| aten::conv2d_backward_input(&ones, dims(&x), &w, &o).unwrap());
    assert_eq!(t.runs(BackwardData).len(), 1);
    let dense = ones.contiguous().unwrap();
    within(1e-5, 12.0, "broadcast grad").assert(
        &values(&gx),
        &values(&aten::conv2d_backward_input(&dense, dims(&x), &w, &o).unwrap()),
    );
}

/// Views that start inside their storage reach cuDNN with their own byte alignment (a plan
/// of cuDNN's graph API is made for it; the emulator checks every buffer has it), in every
/// direction, and in f16 down to 2 bytes.
#[test]
fn views_at_odd_offsets_state_their_alignment() {
    let Some((_g, dev)) = setup() else { return };
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-2)] {
        let big = tensor(&[2, 3, 5, 7], 92, dtype, dev);
        // One element in along the last dim: 4 (f32) or 2 (f16) bytes past the storage.
        let x = big.narrow(3, 1, 6).unwrap();
        let w = tensor(&[4, 3, 3, 2], 93, dtype, dev);
        let o = Conv2dOptions::new().padding(1);
        let (y, t) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
        assert_eq!(t.runs(Forward).len(), 1, "{:?}", t.calls);
        within(tol, 12.0, "odd-offset forward").assert(&values(&y), &values(&cpu_conv(&x, &w, &o)));
        let g = tensor(&y.dims(), 94, dtype, dev);
        let gview = Tensor::cat(&[&g, &g], 3)
            .unwrap()
            .narrow(3, 1, y.dims()[3])
            .unwrap();
        let (gw, t) = Trace::of(|| aten::conv2d_backward_weight(&gview, &x, dims(&w), &o).unwrap());
        assert_eq!(t.runs(BackwardFilter).len(), 1, "{:?}", t.calls);
        let gcpu = gview.to_device(CPU).unwrap();
        let xcpu = x.to_device(CPU).unwrap();
        within(tol * 10.0, 12.0, "odd-offset weight gradient").assert(
            &values(&gw),
            &values(&aten::conv2d_backward_weight(&gcpu, &xcpu, dims(&w), &o).unwrap()),
        );
        let (gx, t) = Trace::of(|| aten::conv2d_backward_input(&gview, dims(&x), &w, &o).unwrap());
        assert_eq!(t.runs(BackwardData).len(), 1, "{:?}", t.calls);
        let wcpu = w.to_device(CPU).unwrap();
        within(tol * 10.0, 12.0, "odd-offset input gradient").assert(
            &values(&gx),
            &values(&aten::conv2d_backward_input(&gcpu, dims(&x), &wcpu, &o).unwrap()),
        );
    }
}

#[test]
fn without_cudnn_the_im2col_path_runs() {
    let Some((_g, dev)) = setup() else { return };
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

#[test]
fn disabled_cudnn_takes_the_im2col_path() {
    let Some((_g, dev)) = setup() else { return };
    let x = tensor(&[1, 2, 5, 5], 30, DType::F32, dev);
    let w = tensor(&[3, 2, 3, 3], 31, DType::F32, dev);
    cudnn::set_enabled(false);
    let (y, t) = Trace::of(|| x.conv2d(&w, None, &Conv2dOptions::new()).unwrap());
    let (path, why) = cudnn::conv_path(0);
    cudnn::set_enabled(true);
    assert!(t.calls.is_empty() && t.launched("im2col_f32"));
    assert_eq!(path, "im2col");
    assert!(why.contains("disabled"), "{why}");
    let (y2, t) = Trace::of(|| x.conv2d(&w, None, &Conv2dOptions::new()).unwrap());
    assert_eq!(t.runs(Forward).len(), 1);
    within(1e-5, 18.0, "enabled again").assert(&values(&y2), &values(&y));
}

#[test]
fn shapes_cudnn_refuses_fall_back_to_im2col_and_are_recorded() {
    let Some((_g, dev)) = setup() else { return };
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
    let fallbacks = cudnn::fallbacks();
    assert!(
        fallbacks
            .iter()
            .any(|f| f.contains("[1, 3, 11, 13]") && f.contains("NOT_SUPPORTED")),
        "{fallbacks:?}"
    );
    // Asymmetric padding (`same` with an even kernel) cannot be said to cuDNN.
    let w2 = tensor(&[2, 3, 2, 4], 42, DType::F32, dev);
    let same = Conv2dOptions::new().padding(Padding::Same);
    let (y, t) = Trace::of(|| x.conv2d(&w2, None, &same).unwrap());
    assert!(t.runs(Forward).is_empty() && t.launched("im2col_f32"));
    let cpu = cpu_conv(&x, &w2, &same);
    within(1e-5, 24.0, "asymmetric").assert(&values(&y), &values(&cpu));
    assert!(cudnn::fallbacks().iter().any(|f| f.contains("asymmetric")));
}

#[test]
fn benchmark_mode_searches_once_per_shape_and_picks_the_fastest() {
    let Some((_g, dev)) = setup() else { return };
    let x = tensor(&[2, 3, 12, 10], 50, DType::F32, dev);
    let w = tensor(&[5, 3, 3, 3], 51, DType::F32, dev);
    let o = Conv2dOptions::new().padding(1);
    // Heuristics: the emulator ranks IMPLICIT_PRECOMP_GEMM (1) first; asked once per shape.
    let (_, t) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    assert_eq!(
        (t.heuristics(), t.searches(), t.runs(Forward)),
        (1, 0, vec![1])
    );
    let (_, t) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    assert_eq!((t.heuristics(), t.runs(Forward)), (0, vec![1]));
    cudnn::set_benchmark(true);
    let (y, t1) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    let (_, t2) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    // A new TF32 setting is a new problem: searched again.
    cudnn::set_allow_tf32(false);
    let (_, t3) = Trace::of(|| x.conv2d(&w, None, &o).unwrap());
    cudnn::set_allow_tf32(true);
    cudnn::set_benchmark(false);
    // The search times GEMM (2) fastest (Note [Emulated cuDNN algorithms]).
    assert_eq!(
        (t1.searches(), t1.runs(Forward)),
        (1, vec![2]),
        "{:?}",
        t1.calls
    );
    assert_eq!(
        (t2.searches(), t2.heuristics(), t2.runs(Forward)),
        (0, 0, vec![2])
    );
    assert_eq!(t3.searches(), 1);
    let cpu = cpu_conv(&x, &w, &o);
    within(1e-5, 27.0, "benchmark").assert(&values(&y), &values(&cpu));
}

#[test]
fn deterministic_mode_keeps_to_deterministic_algorithms() {
    let Some((_g, dev)) = setup() else { return };
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
    assert_eq!(
        (t.runs(BackwardData), t.runs(BackwardFilter)),
        (vec![0], vec![0])
    );
    cudnn::set_deterministic(true);
    let (det, t) = Trace::of(grads);
    let (det2, _) = Trace::of(grads);
    cudnn::set_deterministic(false);
    assert_eq!(
        (t.runs(BackwardData), t.runs(BackwardFilter)),
        (vec![1], vec![1])
    );
    assert_eq!(values(&det.0), values(&det2.0));
    assert_eq!(values(&det.1), values(&det2.1));
    within(1e-5, 50.0, "deterministic").assert(&values(&det.0), &values(&free.0));
    within(1e-5, 50.0, "deterministic").assert(&values(&det.1), &values(&free.1));
}

#[test]
fn workspace_that_cannot_be_had_moves_to_an_algorithm_that_fits_or_is_out_of_memory() {
    let Some((_g, dev)) = setup() else { return };
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

#[test]
fn settings_have_pytorchs_defaults_and_can_be_set() {
    let Some((_g, _dev)) = setup() else { return };
    assert!(cudnn::enabled());
    assert!(
        cudnn::allow_tf32(),
        "PyTorch allows TF32 for convolutions by default"
    );
    assert!(!cudnn::benchmark());
    assert!(!cudnn::deterministic());
    cudnn::set_allow_tf32(false);
    assert!(!cudnn::allow_tf32());
    cudnn::set_allow_tf32(true);
    cudnn::set_deterministic(true);
    assert!(cudnn::deterministic());
    cudnn::set_deterministic(false);
    assert!(cudnn::is_available());
    assert_eq!(cudnn::conv_path(0).0, "cudnn");
}
