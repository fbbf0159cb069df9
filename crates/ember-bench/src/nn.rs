//! Training and inference through `ember-nn`, as a user writes them:
//!
//! - `train_mlp_1000_512_10_b64`, `train_mlp_2000_1000_100_b128`: one Adam training step
//!   (`zero_grad`, forward, cross-entropy, backward, `step`) of `Linear–ReLU–Linear` on a
//!   fixed batch, in samples per second (the record also carries `steps_per_s`). Target:
//!   at least 1.2× PyTorch's.
//! - `fwd_mlp_10000_5000_2000_10_b256`: a forward of `Linear(10000,5000)–ReLU–
//!   Linear(5000,2000)–ReLU–Linear(2000,10)` at batch 256 under `no_grad`, in ms; the record
//!   carries `peak_memory_bytes`, the allocator's peak during one forward above what was
//!   allocated before it (weights and input). Target: at most PyTorch's peak.
//!
//! - Under autocast (mixed precision, `ember-amp`), the same cases with the dtype appended
//!   to the name: `*_bf16` on the CPU (autocast bf16, Adam on the f32 master weights, no
//!   scaler, as PyTorch recommends) and on CUDA; `*_f16` on CUDA only, with a `GradScaler`
//!   (`scale(loss).backward()`, `step`, `update`). The forward's peak memory then includes
//!   the 16-bit copies of the weights made during the forward (under `no_grad` nothing is
//!   cached, Note [Autocast cache]). Target: at least PyTorch's rate, at most its peak.
//!
//! - `profiler_off_train_mlp_1000_512_10_b64`, `profiler_on_train_mlp_1000_512_10_b64`: the
//!   first training step with the profiler compiled in but inactive, and active (CPU, and
//!   CUDA on a GPU, with `record_shapes`) around the timed steps. Targets: off within 1% of
//!   `train_mlp_1000_512_10_b64`; on at most 10% slower on the CPU and 25% on a GPU (the side
//!   by side script runs PyTorch's profiler the same way, for comparison). On CUDA the `on`
//!   record's extras `steps_per_s_cpu_activity_only` and `steps_per_s_cuda_activity_only`
//!   time the step with one activity each, to say which side an overhead comes from.
//!
//! `bench/torch_side_by_side.py` runs the same programs in PyTorch. On the emulated
//! `cuda:0` the batches shrink to 4 rows (the records say `"emulated": true` and `batch`),
//! so the path runs everywhere and a real GPU measures the full size.

use ember_amp::{GradScaler, autocast};
use ember_device::{Device, cuda};
use ember_nn::layers::{Linear, ReLU, Sequential};
use ember_nn::loss::CrossEntropyLoss;
use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Loss, Module, Tensor};
use ember_profiler::{DeviceTiming, ProfileOptions, ProfilerActivity};
use ember_tensor::DType;

use crate::harness::{Options, Record, ns_per_iter};

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// `widths[0] -> widths[1] -> ...` with a ReLU between layers, on `device`.
pub(crate) fn mlp(widths: &[usize], device: Device) -> Result<Sequential, String> {
    let mut m = Sequential::new();
    for (i, w) in widths.windows(2).enumerate() {
        if i > 0 {
            m = m.add(ReLU::new());
        }
        m = m.add(Linear::new(w[0], w[1], ()).map_err(err)?);
    }
    m.to(device).map_err(err)?;
    Ok(m)
}

pub(crate) fn sync(device: Device) -> Result<(), String> {
    match device {
        Device::Cuda(i) => cuda::synchronize(Some(i)).map_err(err),
        Device::Cpu => Ok(()),
    }
}

/// A call slower than this (seconds) is timed as the side-by-side script times PyTorch's:
/// that sizing call is the first sample, and only as many more are timed as fit in
/// [`SLOW_BUDGET_S`] (a ResNet-18 step at batch 32 on 2 cores takes half a minute).
const SLOW_CALL_S: f64 = 1.0;
const SLOW_BUDGET_S: f64 = 8.0;

/// Times `f` as the other cases do: one call to size the rounds, then the median of five
/// (with `quick`, that one call's time: see `Options::quick`; a call slower than
/// [`SLOW_CALL_S`] gets fewer rounds, as PyTorch's side does).
pub(crate) fn time(
    device: Device,
    quick: bool,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    f()?;
    sync(device)?;
    let t = std::time::Instant::now();
    f()?;
    sync(device)?;
    let once = t.elapsed().as_secs_f64().max(1e-7);
    if quick {
        return Ok(once * 1e9);
    }
    if once > SLOW_CALL_S {
        let more = ((SLOW_BUDGET_S / once) as usize).min(5).saturating_sub(1);
        let mut samples = vec![once];
        for _ in 0..more {
            let t = std::time::Instant::now();
            f()?;
            sync(device)?;
            samples.push(t.elapsed().as_secs_f64());
        }
        samples.sort_by(f64::total_cmp);
        return Ok(samples[samples.len() / 2] * 1e9);
    }
    let iters = ((0.2 / once) as usize).clamp(1, 10_000);
    let mut failed = None;
    let ns = ns_per_iter(5, iters, || {
        if let Err(e) = f().and_then(|()| sync(device)) {
            failed.get_or_insert(e);
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(ns),
    }
}

pub(crate) fn record(name: &str, device: Device, value: f64, unit: &'static str) -> Record {
    Record {
        name: name.to_string(),
        device: device.to_string(),
        threads: rayon::current_num_threads(),
        value,
        unit,
        extra: serde_json::Map::new(),
    }
}

/// The model of `widths` and a random input batch for it, on `device`.
fn model_and_input(
    widths: &[usize],
    batch: usize,
    device: Device,
) -> Result<(Sequential, Tensor), String> {
    let model = mlp(widths, device)?;
    let x = Tensor::randn([batch, widths[0]], (device, DType::F32)).map_err(err)?;
    Ok((model, x))
}

/// The profiler around a timed case: off (compiled in, nobody listening), or on with
/// `record_shapes` and the device's activities (`profiler_on_*`), or on a CUDA device with
/// one of its two activities only (the split of `profiler_on_*`'s overhead in its extras).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profiling {
    Off,
    On,
    CpuOnly,
    CudaOnly,
    /// CUDA activity only, timed with events even where CUPTI is available.
    CudaEventsOnly,
}

#[allow(clippy::too_many_arguments)]
fn train_case(
    name: &str,
    widths: &[usize],
    batch: usize,
    device: Device,
    amp: Option<DType>,
    quick: bool,
    profiling: Profiling,
) -> Result<Record, String> {
    let (model, x) = model_and_input(widths, batch, device)?;
    let mut opt = Adam::new(model.parameters(), AdamOptions::default()).map_err(err)?;
    let classes = *widths.last().unwrap_or(&1) as i64;
    let y = Tensor::randint(0, classes, [batch], (device, DType::I64)).map_err(err)?;
    let loss_fn = CrossEntropyLoss::new();
    // f16 needs loss scaling (PyTorch's recipe); bf16 has f32's range and runs without:
    // its scaler is disabled, a pass-through.
    let mut scaler = GradScaler::new(device)
        .map_err(err)?
        .enabled(amp == Some(DType::F16));
    let profiler = match profiling {
        Profiling::Off => None,
        Profiling::On | Profiling::CpuOnly | Profiling::CudaOnly | Profiling::CudaEventsOnly => {
            let cuda_only = matches!(profiling, Profiling::CudaOnly | Profiling::CudaEventsOnly);
            let mut activities = Vec::new();
            if !cuda_only {
                activities.push(ProfilerActivity::Cpu);
            }
            if device.is_cuda() && profiling != Profiling::CpuOnly {
                activities.push(ProfilerActivity::Cuda);
            }
            let timing = if profiling == Profiling::CudaEventsOnly {
                DeviceTiming::Events
            } else {
                DeviceTiming::Auto
            };
            Some(
                ember_profiler::profile(
                    ProfileOptions::new()
                        .activities(activities)
                        .record_shapes(true)
                        .device_timing(timing),
                )
                .map_err(err)?,
            )
        }
    };
    let mut step = || {
        opt.zero_grad(true).map_err(err)?;
        let loss = {
            let _region = amp
                .map(|dt| autocast(device, dt))
                .transpose()
                .map_err(err)?;
            loss_fn
                .forward(&model.forward(&x).map_err(err)?, &y)
                .map_err(err)?
        };
        scaler.scale(&loss).map_err(err)?.backward().map_err(err)?;
        scaler.step(&mut opt).map_err(err)?;
        scaler.update().map_err(err)
    };
    let ns = time(device, quick, &mut step)?;
    let counts = emulated_counts(device, &mut step)?;
    let mut timing = None;
    if let Some(mut p) = profiler {
        p.stop().map_err(err)?;
        timing = p.profile().map_err(err)?.device_timing;
    }
    let steps = 1e9 / ns;
    let mut r = record(name, device, steps * batch as f64, "samples/s");
    r.extra.insert("steps_per_s".into(), steps.into());
    if let Some(t) = timing {
        r.extra.insert("device_timing".into(), t.name().into());
    }
    insert_counts(&mut r.extra, counts);
    Ok(r)
}

/// Nanoseconds per `Instant::now()` on this machine (the median of a few rounds).
fn clock_now_ns(quick: bool) -> f64 {
    let iters = if quick { 10_000 } else { 1_000_000 };
    ns_per_iter(5, iters, || {
        std::hint::black_box(std::time::Instant::now());
    })
}

/// Nanoseconds per read of the trace clock the profiler stamps ranges with (Note [Trace
/// clock] in `ember-device`).
fn stamp_now_ns(quick: bool) -> f64 {
    let iters = if quick { 10_000 } else { 1_000_000 };
    ns_per_iter(5, iters, || {
        std::hint::black_box(ember_device::trace::Stamp::now());
    })
}

fn forward_case(
    name: &str,
    widths: &[usize],
    batch: usize,
    device: Device,
    amp: Option<DType>,
    quick: bool,
) -> Result<Record, String> {
    let (model, x) = model_and_input(widths, batch, device)?;
    let _no_grad = ember_autograd::no_grad();
    // One region per forward, as `with torch.autocast(...)` around the call.
    let forward = || {
        let _region = amp
            .map(|dt| autocast(device, dt))
            .transpose()
            .map_err(err)?;
        model.forward(&x).map(drop).map_err(err)
    };
    // The peak of one forward (its output included), above the weights and the input.
    let mut forward = forward;
    forward()?;
    let peak = peak_of(device, &mut forward)?;
    let ns = time(device, quick, &mut forward)?;
    let counts = emulated_counts(device, &mut forward)?;
    let mut r = record(name, device, ns * 1e-6, "ms");
    r.extra.insert("peak_memory_bytes".into(), peak.into());
    insert_counts(&mut r.extra, counts);
    Ok(r)
}

/// The allocator's peak during one call of `f`, above what was allocated before it.
pub(crate) fn peak_of(
    device: Device,
    f: &mut impl FnMut() -> Result<(), String>,
) -> Result<u64, String> {
    sync(device)?;
    let before = ember_memory::memory_allocated(device).map_err(err)?;
    ember_memory::reset_peak_memory_stats(device).map_err(err)?;
    f()?;
    sync(device)?;
    let peak = ember_memory::max_memory_allocated(device).map_err(err)?;
    Ok(peak.saturating_sub(before) as u64)
}

/// On the emulator: the kernels one call of `f` launches, and how often it makes the host
/// wait for the device (a synchronising copy or synchronize, which on a GPU stops the host
/// from queueing work ahead; Note [Known index ranges] in `ember-tensor`'s `cuda/nn.rs`).
pub(crate) fn launches_and_waits(
    f: &mut impl FnMut() -> Result<(), String>,
) -> Result<(u64, u64), String> {
    use ember_device::driver::emulator::{thread_host_waits, thread_launch_counts};
    let launches = || thread_launch_counts().values().sum::<u64>();
    let waits = || thread_host_waits().values().sum::<u64>();
    let (l0, w0) = (launches(), waits());
    f()?;
    Ok((launches() - l0, waits() - w0))
}

/// [`launches_and_waits`] of one more call of `f` on the emulated `cuda:N`; `None` elsewhere.
pub(crate) fn emulated_counts(
    device: Device,
    f: &mut impl FnMut() -> Result<(), String>,
) -> Result<Option<(u64, u64)>, String> {
    if device.is_cuda() && ember_device::cuda::is_emulated() {
        launches_and_waits(f).map(Some)
    } else {
        Ok(None)
    }
}

/// Records `launches_per_call` and `host_waits_per_call` in a record's extras when counted.
pub(crate) fn insert_counts(
    extra: &mut serde_json::Map<String, serde_json::Value>,
    counts: Option<(u64, u64)>,
) {
    if let Some((launches, waits)) = counts {
        extra.insert("launches_per_call".into(), launches.into());
        extra.insert("host_waits_per_call".into(), waits.into());
    }
}

/// The extras of how a case ran: `quick`, and on the emulator `emulated` with the reduced
/// `batch`.
pub(crate) fn mark_run(r: &mut Record, quick: bool, emulated: bool, batch: usize) {
    if quick {
        r.extra.insert("quick".into(), true.into());
    }
    if emulated {
        r.extra.insert("emulated".into(), true.into());
        r.extra.insert("batch".into(), batch.into());
    }
}

/// The dtype as case names spell it (`bf16`, `f16`).
fn short(dt: DType) -> &'static str {
    match dt {
        DType::Bf16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    }
}

type Case = (&'static str, &'static [usize], usize, bool);

const CASES: [Case; 3] = [
    ("train_mlp_1000_512_10_b64", &[1000, 512, 10], 64, true),
    (
        "train_mlp_2000_1000_100_b128",
        &[2000, 1000, 100],
        128,
        true,
    ),
    (
        "fwd_mlp_10000_5000_2000_10_b256",
        &[10000, 5000, 2000, 10],
        256,
        false,
    ),
];

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    for device in opts.device_list() {
        let emulated = device.is_cuda() && cuda::is_emulated();
        // f32, then each autocast dtype of the device (the CPU's default is bf16; CUDA's
        // f16, with a scaler in training, and bf16).
        let amps: &[Option<DType>] = if device.is_cuda() {
            &[None, Some(DType::F16), Some(DType::Bf16)]
        } else {
            &[None, Some(DType::Bf16)]
        };
        for &amp in amps {
            for (base, widths, batch, train) in CASES {
                let name = match amp {
                    None => base.to_string(),
                    Some(dt) => format!("{base}_{}", short(dt)),
                };
                if !opts.wants(&name) {
                    continue;
                }
                let batch = if emulated { 4 } else { batch };
                let mut r = if train {
                    train_case(
                        &name,
                        widths,
                        batch,
                        device,
                        amp,
                        opts.quick,
                        Profiling::Off,
                    )
                } else {
                    forward_case(&name, widths, batch, device, amp, opts.quick)
                }
                .map_err(|e| format!("{name} on {device}: {e}"))?;
                if let Some(dt) = amp {
                    r.extra.insert("autocast".into(), short(dt).into());
                }
                mark_run(&mut r, opts.quick, emulated, batch);
                out.push(r);
            }
        }
        // The profiler's overhead on the first training step: the same step with the
        // profiler compiled in but inactive, and active with `record_shapes`.
        let (base, widths, batch, _) = CASES[0];
        for (prefix, profiling) in [
            ("profiler_off", Profiling::Off),
            ("profiler_on", Profiling::On),
        ] {
            let name = format!("{prefix}_{base}");
            if !opts.wants(&name) {
                continue;
            }
            let batch = if emulated { 4 } else { batch };
            let mut r = train_case(&name, widths, batch, device, None, opts.quick, profiling)
                .map_err(|e| format!("{name} on {device}: {e}"))?;
            if profiling == Profiling::On && device.is_cuda() {
                // Where the overhead goes: each activity alone, as extras of the record.
                // CUDA activity alone both ways: CUPTI where it loads, and events.
                for (key, alone) in [
                    ("steps_per_s_cpu_activity_only", Profiling::CpuOnly),
                    ("steps_per_s_cuda_activity_only", Profiling::CudaOnly),
                    (
                        "steps_per_s_cuda_activity_only_events",
                        Profiling::CudaEventsOnly,
                    ),
                ] {
                    let a = train_case(&name, widths, batch, device, None, opts.quick, alone)
                        .map_err(|e| format!("{name} ({key}) on {device}: {e}"))?;
                    if let Some(v) = a.extra.get("steps_per_s") {
                        r.extra.insert(key.into(), v.clone());
                    }
                    if alone == Profiling::CudaOnly
                        && let Some(t) = a.extra.get("device_timing")
                    {
                        r.extra.insert("device_timing_cuda_only".into(), t.clone());
                    }
                }
            }
            if profiling == Profiling::On {
                // What one host clock read costs here, and one read of the trace clock a
                // recorded range reads twice (on a host with a slow clock source the first
                // is most of a range's cost; the second is the time-stamp counter where the
                // CPU has an invariant one).
                r.extra
                    .insert("clock_now_ns".into(), clock_now_ns(opts.quick).into());
                r.extra
                    .insert("trace_stamp_ns".into(), stamp_now_ns(opts.quick).into());
                r.extra.insert(
                    "trace_clock".into(),
                    ember_device::trace::clock::source().into(),
                );
                r.extra.insert(
                    "trace_clock_reason".into(),
                    ember_device::trace::clock::reason().into(),
                );
            }
            mark_run(&mut r, opts.quick, emulated, batch);
            out.push(r);
        }
    }
    Ok(())
}
