#![allow(clippy::unwrap_used)]
//! The PyTorch walk-throughs (docs/walkthroughs.md), replayed: each example program in
//! `examples/` runs here on `cpu` and on the emulated `cuda:0` (with `cuda:1` as the second
//! GPU). They read the allocator's global statistics, so they run one at a time.
//!
//! The programs assert what the texts display or claim as they go (one line each, as the
//! texts' outputs are one line); these tests check what they return: the loss falls, the
//! mixed-precision dtypes and scales (an autocast region in the device's default dtype,
//! f16 on CUDA and bf16 on the CPU; the texts' `torch.cuda.amp.GradScaler()`, enabled on
//! CUDA only), clipping after `unscale_`, the profiler's tables and traces, the memory the
//! allocator reports. Times and throughputs are printed, never asserted.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ember::nn::{Conv2d, Module};
use ember::{DType, Device, Tensor};

// Formatted as examples (examples/rustfmt.toml), not as a test.
#[rustfmt::skip]
#[path = "../examples/d2l_working_on_gpus.rs"]
mod d2l_working_on_gpus;
#[rustfmt::skip]
#[path = "../examples/digits_cnn.rs"]
mod digits_cnn;
#[rustfmt::skip]
#[path = "../examples/gpu_computing_chapter.rs"]
mod gpu_computing_chapter;
#[rustfmt::skip]
#[path = "../examples/gpu_training_guide.rs"]
mod gpu_training_guide;
#[rustfmt::skip]
#[path = "../examples/lesson_gpu_acceleration.rs"]
mod lesson_gpu_acceleration;
#[rustfmt::skip]
#[path = "../examples/lesson_memory_and_data.rs"]
mod lesson_memory_and_data;
#[rustfmt::skip]
#[path = "../examples/using_torch_with_cuda.rs"]
mod using_torch_with_cuda;

static SERIAL: Mutex<()> = Mutex::new(());

/// `(device, second device)` pairs: the CPU alone, then two emulated GPUs (the real ones
/// when `EMBER_GPU_TEST` is set; with a single GPU, `cuda:0` plays both parts, as the texts'
/// code does when `torch.cuda.device_count()` is 1).
fn device_pairs() -> [(Device, Device); 2] {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        ember::cuda::use_emulator(ember::driver::emulator::EmulatorConfig::devices(2)).unwrap();
    }
    let second = if ember::cuda::device_count() >= 2 {
        Device::Cuda(1)
    } else {
        Device::Cuda(0)
    };
    [(Device::Cpu, Device::Cpu), (Device::Cuda(0), second)]
}

fn each(f: impl Fn(Device, Device) -> Result<(), ember::Error>) {
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (a, b) in device_pairs() {
        ember::manual_seed(0);
        if let Err(e) = f(a, b) {
            panic!("on {a} (second device {b}): {e}");
        }
    }
}

/// The dtype `torch.cuda.amp.autocast()` computes products in on `device`.
fn low(device: Device) -> DType {
    if device.is_cuda() {
        DType::F16
    } else {
        DType::Bf16
    }
}

/// The scale of the texts' `GradScaler()` after clean steps: 65536 on CUDA, 1 on the CPU
/// (disabled: bf16 needs no scaling).
fn scale(device: Device) -> f64 {
    if device.is_cuda() { 65536.0 } else { 1.0 }
}

/// Whether the values fall: the last below `ratio` times the first.
fn falls(losses: &[f64], ratio: f64) -> bool {
    losses.last().unwrap() < &(ratio * losses[0])
}

/// A fresh directory for one device's files.
fn scratch(test: &str, d: Device) -> PathBuf {
    let name = format!(
        "ember-walk-{test}-{}-{}",
        std::process::id(),
        d.to_string().replace(':', "")
    );
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The TensorBoard traces under `dir`.
fn traces(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
        .collect();
    files.sort();
    files
}

#[test]
fn d2l_working_on_gpus() {
    each(|a, b| {
        let losses = d2l_working_on_gpus::run(a, b)?;
        assert!(
            falls(&losses, 0.5),
            "{a}: the loop on the device trains: {losses:?}"
        );
        Ok(())
    });
}

#[test]
fn digits_cnn_one_epoch() {
    each(|d, _| {
        let (accuracy, reloaded) = digits_cnn::run(d, 1)?;
        assert!(accuracy > 0.5, "{d}: {accuracy}");
        assert_eq!(
            accuracy, reloaded,
            "{d}: the reloaded model answers as the trained one"
        );
        Ok(())
    });
}

#[test]
fn gpu_computing_chapter() {
    each(|a, b| {
        let (plain, checkpointed) = gpu_computing_chapter::run(a, b)?;
        // Two checkpointed blocks: about half of the activations alive at a time.
        assert!(
            checkpointed * 10 < plain * 8,
            "{a}: {checkpointed} vs {plain} bytes"
        );
        Ok(())
    });
}

#[test]
fn gpu_computing_chapter_amp() {
    each(|d, _| {
        let [(plain, model, output, loss), (ckpt, ckpt_model, ..)] =
            gpu_computing_chapter::run_amp(d, 3)?;
        assert_eq!((output.dtype(), loss.dtype()), (low(d), DType::F32), "{d}");
        for p in model.parameters() {
            assert_eq!(
                p.grad().unwrap().dtype(),
                DType::F32,
                "{d}: master gradients"
            );
        }
        assert!(
            falls(&plain, 0.9),
            "{d}: AMP training lowers the loss: {plain:?}"
        );
        assert_eq!(
            plain, ckpt,
            "{d}: checkpointing under autocast trains alike"
        );
        let weights = |m: &gpu_computing_chapter::LargeModel| -> Vec<Vec<f32>> {
            m.parameters()
                .iter()
                .map(|p| p.to_vec::<f32>().unwrap())
                .collect()
        };
        assert_eq!(weights(&model), weights(&ckpt_model), "{d}");
        Ok(())
    });
}

/// `torch_profiler.py`: the table sorted by GPU time, a Chrome trace with the device's
/// kernels on CUDA, two TensorBoard cycles.
#[test]
fn gpu_computing_chapter_profiler() {
    each(|d, _| {
        let dir = scratch("chapter-profiler", d);
        let (table, device_events) = gpu_computing_chapter::run_profiler(d, &dir)?;
        assert!(table.contains("aten::"), "{table}");
        assert_eq!(table.contains("Self CUDA"), d.is_cuda(), "{table}");
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("trace.json"))?).unwrap();
        assert_eq!(doc["record_shapes"], 1);
        assert_eq!(device_events > 0, d.is_cuda(), "{d}: {device_events}");
        assert_eq!(
            traces(&dir.join("log")).len(),
            2,
            "{d}: wait 1, warmup 1, active 3, twice"
        );
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    });
}

/// `memory_profiling.py`: the history records the loop's allocations and frees, the dump
/// holds the snapshot (whose blocks and segments add up to `memory_allocated` and
/// `memory_reserved`) and the events, and recording stops when switched off.
#[test]
fn gpu_computing_chapter_memory_history() {
    each(|d, _| {
        let dir = scratch("chapter-memory", d);
        let (dump, allocated, reserved) = gpu_computing_chapter::run_memory_history(d, &dir)?;
        let dump: serde_json::Value = serde_json::from_slice(&std::fs::read(dump)?).unwrap();
        let events = dump["device_traces"].as_array().unwrap();
        let count = |a: &str| events.iter().filter(|e| e["action"] == a).count();
        assert!(
            count("alloc") > 0 && count("free_requested") > 0,
            "{d}: {events:?}"
        );
        let segments = dump["segments"].as_array().unwrap();
        let sum = |k: &str| segments.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
        assert_eq!(
            (sum("allocated_size"), sum("total_size")),
            (allocated, reserved),
            "{d}"
        );
        let after = Tensor::zeros([1024], d)?;
        assert!(
            ember::memory::memory_history(d)?.is_empty(),
            "{d}: recording stopped"
        );
        drop(after);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    });
}

/// "Minimize CPU-GPU transfers" and "Common Pitfalls and Debugging": kept losses keep
/// their graphs (and memory), gradients add up without `zero_grad`, and
/// `verify_model_device` catches a model left on the CPU.
#[test]
fn gpu_computing_chapter_pitfalls() {
    each(|d, _| {
        let (kept, ratio, unmoved) = gpu_computing_chapter::run_pitfalls(d)?;
        assert!(
            kept >= 4 * 512,
            "{d}: 4 losses and their graphs: {kept} bytes"
        );
        assert_eq!(ratio, 2.0, "{d}: two backward passes, twice the gradient");
        match unmoved {
            Err(e) => assert!(
                e.to_string()
                    .contains("Parameter weight on cpu, expected cuda"),
                "{e}"
            ),
            Ok(()) => panic!("{d}: a model on the CPU passed as cuda"),
        }
        Ok(())
    });
}

#[test]
fn gpu_training_guide() {
    each(|d, _| {
        let [allocated, after_forward, after_clear] = gpu_training_guide::run(d)?;
        // The input, the output and the activations kept for backward.
        assert!(
            after_forward >= allocated + 4 * (256 * 1000 + 256 * 10),
            "{d}"
        );
        assert!(
            after_clear <= allocated,
            "{d}: dropping the output frees what it kept"
        );
        Ok(())
    });
}

#[test]
fn gpu_training_guide_amp() {
    each(|d, _| {
        let r = gpu_training_guide::run_amp(d, 4)?;
        assert_eq!(
            (r.output.dtype(), r.loss.dtype()),
            (low(d), DType::F32),
            "{d}"
        );
        let [scaled, unscaled, clipped, returned] = r.norms;
        // unscale_ divides the gradients by the scale; the clip returns the norm before it
        // and bounds the one after.
        assert!(
            (scaled / unscaled / scale(d) - 1.0).abs() < 1e-4,
            "{d}: {:?}",
            r.norms
        );
        assert!(
            (returned - unscaled).abs() <= 1e-5 * unscaled,
            "{d}: {:?}",
            r.norms
        );
        assert!(unscaled > r.max_norm, "{d}: the clip bites: {unscaled}");
        assert!(
            (r.max_norm * (1.0 - 1e-3)..=r.max_norm * (1.0 + 1e-4)).contains(&clipped),
            "{d}"
        );
        for p in r.model.parameters() {
            assert_eq!(p.grad().unwrap().dtype(), DType::F32, "{d}");
        }
        assert_eq!(r.scaler.get_scale()?, scale(d), "{d}: no overflow");
        let steps = if d.is_cuda() { 1 + 3 * 4 } else { 0 };
        assert_eq!(
            r.scaler.get_growth_tracker()?,
            steps,
            "{d}: clean steps since the start"
        );
        assert!(r.epoch_losses.iter().all(|l| l.is_finite()), "{d}");
        Ok(())
    });
}

/// "Profiling and optimization strategies": after the second `torch.cuda.synchronize()`
/// the device's stream has nothing left to run (a check that bites on a real GPU: the
/// emulator finishes each operation as it is issued).
#[test]
fn gpu_training_guide_timing() {
    each(|d, _| {
        let (idle, allocated) = gpu_training_guide::run_timing(d, 100)?;
        assert_eq!(idle, d.is_cuda().then_some(true), "{d}");
        assert!(
            allocated >= 4 * (200 * 100 + 100 + 100 * 10 + 10),
            "{d}: the model is allocated"
        );
        Ok(())
    });
}

#[test]
fn lesson_gpu_acceleration() {
    each(|a, b| {
        let (losses, accuracy) = lesson_gpu_acceleration::run(a, b)?;
        assert!(
            falls(&losses, 0.7),
            "{a}: training lowers the loss: {losses:?}"
        );
        assert!(
            accuracy > 0.5,
            "{a}: the model learned the task: {accuracy}"
        );
        Ok(())
    });
}

#[test]
fn lesson_gpu_acceleration_amp() {
    each(|d, _| {
        let r = lesson_gpu_acceleration::run_amp(d, 3, 3)?;
        assert!(
            falls(&r.losses, 0.8),
            "{d}: AMP training lowers the loss: {:?}",
            r.losses
        );
        assert_eq!(
            r.scaler.get_scale()?,
            scale(d),
            "{d}: no overflow in this model"
        );
        let tol = if d.is_cuda() { 1e-2 } else { 5e-2 };
        assert!(
            r.grad_rel_error < tol,
            "{d}: unscaled AMP gradients near f32's: {}",
            r.grad_rel_error
        );
        assert!(
            falls(&r.bf16_losses, 0.8),
            "{d}: the BF16 loop trains: {:?}",
            r.bf16_losses
        );
        let names: Vec<&str> = r.benchmark.iter().map(|b| b.0).collect();
        assert_eq!(names, ["FP32", "FP16", "BF16"], "{d}");
        assert_eq!(
            ember::tensor::matmul_precision(),
            ember::tensor::MatmulPrecision::Highest
        );
        Ok(())
    });
}

/// "Performance Profiling": tables sorted by device time and by device memory, a Chrome
/// trace, the schedule's two cycles as TensorBoard files, memory bottlenecks.
#[test]
fn lesson_gpu_acceleration_profiler() {
    each(|d, _| {
        let dir = scratch("lesson-profiler", d);
        let r = lesson_gpu_acceleration::run_profiler(d, &dir)?;
        assert!(r.table.contains("aten::"), "{}", r.table);
        assert_eq!(r.table.contains("Self CUDA"), d.is_cuda(), "{}", r.table);
        let trace: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("trace.json"))?).unwrap();
        assert!(!trace["traceEvents"].as_array().unwrap().is_empty());
        // activities=[CUDA]: device work only.
        assert_eq!(
            r.cuda_only_rows.is_empty(),
            !d.is_cuda(),
            "{d}: {:?}",
            r.cuda_only_rows
        );
        assert!(
            r.cuda_only_rows
                .iter()
                .all(|(_, cpu, dev)| *cpu == 0 && *dev > 0)
        );
        // skip 5, wait 1, warm up 2, record 3, twice.
        let want = [
            ["ProfilerStep#8", "ProfilerStep#9", "ProfilerStep#10"],
            ["ProfilerStep#14", "ProfilerStep#15", "ProfilerStep#16"],
        ];
        assert_eq!(r.recorded_steps, want, "{d}");
        assert_eq!(traces(&dir).len(), 2, "{d}");
        assert!(r.memory_table.lines().count() >= 5, "{}", r.memory_table);
        assert_eq!(
            r.memory_events.is_empty(),
            !d.is_cuda(),
            "{d}: {:?}",
            r.memory_events
        );
        assert!(r.memory_events.windows(2).all(|w| w[0].1 >= w[1].1));
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    });
}

/// The memory sections: memory per batch stops growing after the first step,
/// `zero_grad(set_to_none=True)` frees the gradients, and the memory fraction refuses what
/// exceeds it.
#[test]
fn lesson_memory() {
    each(|d, _| {
        let (tracked, freed, fraction_error) = lesson_memory_and_data::run_memory(d)?;
        assert_eq!(tracked.len(), 8, "{d}: 256 samples in batches of 32");
        assert!(
            tracked[0].1 > tracked[0].0,
            "{d}: the first step makes gradients and Adam's state"
        );
        assert!(
            tracked[1..].iter().all(|b| b.1 == tracked[1].1),
            "{d}: a leak? {tracked:?}"
        );
        assert!(
            freed >= 4 * (100 * 50 + 50 + 50 * 10 + 10),
            "{d}: the gradients' bytes: {freed}"
        );
        match fraction_error {
            Some(e) => assert!(e.contains("set_per_process_memory_fraction(0.8)"), "{e}"),
            None => assert!(
                !d.is_cuda(),
                "{d}: the allocation beyond the fraction passed"
            ),
        }
        Ok(())
    });
}

/// "Optimizing Data Loading": every configuration loads the same batches in the same order.
#[test]
fn lesson_data_loading() {
    each(|d, _| {
        let runs = lesson_memory_and_data::run_data_loading(d, 10)?;
        assert_eq!(runs.len(), 4, "{d}");
        assert!(
            runs.iter().all(|r| r.len() == 10 && *r == runs[0]),
            "{d}: workers keep the order"
        );
        Ok(())
    });
}

#[test]
fn using_torch_with_cuda() {
    each(|a, b| {
        let (x_cpu, model) = using_torch_with_cuda::run(a, b)?;
        assert_eq!(x_cpu.to_vec::<f32>()?, [1.0, 2.0], "{a}: there and back");
        assert_eq!(
            (x_cpu.device(), model.weight.device()),
            (Device::Cpu, b),
            "{a}"
        );
        // 17.9's settings, read back, then restored.
        assert!(ember::backends::cudnn::benchmark() && !ember::backends::cudnn::deterministic());
        ember::backends::cudnn::set_benchmark(false);
        Ok(())
    });
}

#[test]
fn using_torch_with_cuda_amp() {
    each(|d, _| {
        let inputs = Tensor::randn([256, 5], ())?;
        let labels = inputs.mm(&Tensor::randn([5, 3], ())?)?.argmax(1)?;
        let data = ember::data::TensorDataset::new(vec![inputs, labels])?;
        let loader = ember::data::DataLoader::new(data)
            .batch_size(32)
            .shuffle(true);
        let model = ember::nn::Linear::new(5, 3, d)?;
        let mut optimizer = ember::optim::SGD::new(model.parameters(), 0.5)?;
        let mut losses = vec![];
        for _ in 0..4 {
            losses.extend(using_torch_with_cuda::run_amp(
                &model,
                &loader,
                &mut optimizer,
            )?);
        }
        let epoch = |e: usize| losses[8 * e..8 * e + 8].iter().sum::<f64>();
        assert!(
            epoch(3) < epoch(0),
            "{d}: AMP training lowers the loss: {losses:?}"
        );
        for p in model.parameters() {
            assert_eq!(p.grad().unwrap().dtype(), DType::F32, "{d}");
        }
        Ok(())
    });
}

/// 17.9's claims: `cudnn.benchmark = True` keeps a convolution's results (to rounding), and
/// `deterministic = True` makes two runs bit-identical.
#[test]
fn using_torch_with_cuda_cudnn() {
    use ember::backends::cudnn;
    each(|d, _| {
        let conv = Conv2d::new(3, 8, 3, d)?;
        let x = Tensor::randn([4, 3, 16, 16], d)?;
        let step = || -> Result<(Vec<f32>, Vec<f32>), ember::Error> {
            conv.zero_grad(true)?;
            let y = conv.call(&x)?;
            y.square()?.sum_all()?.backward()?;
            Ok((
                y.to_vec::<f32>()?,
                conv.weight.grad().unwrap().to_vec::<f32>()?,
            ))
        };
        let default = step()?;
        cudnn::set_benchmark(true);
        let benchmarked = step()?;
        for (a, b) in [(&default.0, &benchmarked.0), (&default.1, &benchmarked.1)] {
            let top = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * top),
                "{d}"
            );
        }
        cudnn::set_deterministic(true);
        let (first, second) = (step()?, step()?);
        cudnn::set_benchmark(false);
        cudnn::set_deterministic(false);
        assert_eq!(first, second, "{d}: deterministic runs repeat exactly");
        if let (Device::Cuda(i), true) = (d, ember::cuda::is_emulated()) {
            assert_eq!(
                cudnn::conv_path(i).0,
                "cudnn",
                "{d}: the emulator serves cuDNN"
            );
        }
        Ok(())
    });
}
