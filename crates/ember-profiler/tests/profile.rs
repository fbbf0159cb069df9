//! The profiler end to end, on cpu and emulated cuda:0: what a training step records, the
//! table, the Chrome trace read back, schedules, the TensorBoard handler, and bad input.
//! One profiler per process at a time, and it sees every thread: the tests take a lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use common::{Model, activity_api_usable, both, serial, temp_dir, train_step};
use ember_autograd::{Result, Tensor};
use ember_nn::optim::{Adam, AdamOptions};
use ember_profiler::{
    DeviceTiming, Event, EventType, ProfileOptions, ProfilerAction, ProfilerActivity,
    ProfilerError, Track, profile, record_function, schedule, tensorboard_trace_handler,
};
use ember_tensor::{DType, Device};
use ember_testing::test_device;
use serde_json::Value;

fn named<'a>(events: &'a [Event], name: &str) -> Vec<&'a Event> {
    events.iter().filter(|e| e.name == name).collect()
}

fn ancestors(events: &[Event], mut i: Option<usize>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(p) = i {
        out.push(events[p].name.clone());
        i = events[p].parent;
    }
    out
}

fn records_a_training_step(dev: &Device) -> Result<()> {
    records_a_training_step_timed(dev, DeviceTiming::Auto)
}

/// The timing a profile of CUDA work reports when it asked for `asked`: CUPTI's activity
/// records wherever the driver can record them, events otherwise.
fn expected_timing(asked: DeviceTiming) -> DeviceTiming {
    match asked {
        DeviceTiming::Events => DeviceTiming::Events,
        _ if activity_api_usable() => DeviceTiming::Cupti,
        _ => DeviceTiming::Events,
    }
}

fn records_a_training_step_timed(dev: &Device, timing: DeviceTiming) -> Result<()> {
    let _serial = serial();
    let model = Model::new(dev)?;
    let mut opt = Adam::new(model.params(), AdamOptions::default())?;
    train_step(&model, &mut opt, dev)?; // warm-up, as the walk-throughs advise
    let mut prof = profile(
        ProfileOptions::new()
            .activities(both())
            .record_shapes(true)
            .profile_memory(true)
            .device_timing(timing),
    )
    .unwrap();
    train_step(&model, &mut opt, dev)?;
    prof.stop().unwrap();
    let p = prof.profile().unwrap();
    let ev = &p.events;
    let expected = dev.is_cuda().then(|| expected_timing(timing));
    assert_eq!(p.device_timing, expected);

    // User ranges, ops inside them, autograd nodes, the optimizer step.
    for name in ["data_loading", "forward", "backward", "optimizer"] {
        let r = named(ev, name);
        assert_eq!(r.len(), 1, "{name}");
        assert_eq!(r[0].kind, EventType::UserAnnotation);
    }
    let mms: Vec<&Event> = ev
        .iter()
        .filter(|e| e.kind == EventType::CpuOp && e.name.starts_with("aten::"))
        .collect();
    assert!(mms.len() > 10, "ops: {}", mms.len());
    let matmuls: Vec<&Event> = ev
        .iter()
        .filter(|e| e.input_shapes.as_deref() == Some("[[5, 8], [8, 16]]"))
        .collect();
    assert!(
        !matmuls.is_empty(),
        "no op saw the inputs [[5, 8], [8, 16]]"
    );
    for e in &matmuls {
        let i = ev.iter().position(|x| std::ptr::eq(x, *e)).unwrap();
        assert!(ancestors(ev, ev[i].parent).contains(&"forward".to_string()));
        assert_eq!(e.args["Input type"], serde_json::json!(["float", "float"]));
    }
    let evaluate: Vec<&Event> = ev
        .iter()
        .filter(|e| e.name.starts_with("autograd::engine::evaluate_function: "))
        .collect();
    assert!(!evaluate.is_empty());
    for (i, e) in ev.iter().enumerate() {
        if e.kind == EventType::Backward && !e.name.starts_with("autograd::") {
            assert!(
                e.name.ends_with("Backward0") || e.name.ends_with("Backward1"),
                "{}",
                e.name
            );
            let parent = &ev[e.parent.unwrap()];
            assert_eq!(
                parent.name,
                format!("autograd::engine::evaluate_function: {}", e.name)
            );
            assert!(ancestors(ev, Some(i)).contains(&"backward".to_string()));
        }
    }
    let step = named(ev, "Optimizer.step#Adam.step");
    assert_eq!(step.len(), 1);
    assert_eq!(ev[step[0].parent.unwrap()].name, "optimizer");

    // Every host range nests properly in its parent, on its thread.
    for e in ev.iter().filter(|e| matches!(e.track, Track::Thread(_))) {
        if let Some(p) = e.parent {
            let p = &ev[p];
            assert_eq!(p.track, e.track);
            assert!(
                p.start_ns <= e.start_ns && e.end_ns() <= p.end_ns(),
                "{}",
                e.name
            );
            assert_eq!(p.depth + 1, e.depth);
        }
    }

    // Memory: allocations and frees inside ops, on the device that made them.
    let mem: Vec<&Event> = ev.iter().filter(|e| e.kind == EventType::Memory).collect();
    assert!(!mem.is_empty());
    let on_device = mem
        .iter()
        .filter(|e| e.memory.as_ref().unwrap().cuda == dev.cuda_index())
        .count();
    assert!(on_device > 0, "no allocation on {dev}");

    // Device work: only with CUDA, each kernel linked to a launch inside an op.
    let kernels: Vec<(usize, &Event)> = ev
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind.is_device())
        .collect();
    if dev.is_cuda() {
        assert!(p.emulated || ember_testing::real_gpu_requested());
        assert!(kernels.len() >= 10, "{} kernels", kernels.len());
        for (_, k) in &kernels {
            let launch = &ev[k.parent.expect("every kernel has its launch")];
            assert_eq!(launch.kind, EventType::Runtime);
            assert_eq!(launch.correlation, k.correlation);
            let op = &ev[launch.parent.expect("every launch is inside an op")];
            if p.emulated {
                // The emulator runs the kernel inside the launch call; the device clock is
                // placed on the host's to within one event record (allowed: 20 us).
                const SLACK: u64 = 20_000;
                assert!(
                    op.start_ns <= k.start_ns + SLACK && k.end_ns() <= op.end_ns() + SLACK,
                    "{} at {}..{} ns, outside {} at {}..{} ns",
                    k.name,
                    k.start_ns,
                    k.end_ns(),
                    op.name,
                    op.start_ns,
                    op.end_ns()
                );
                assert!(k.args.contains_key("emulated"));
            }
        }
        assert!(p.devices.iter().any(|(i, _)| *i == 0));
        assert_eq!(p.untimed, 0);
    } else {
        assert!(kernels.is_empty());
    }

    // The table: self times add up to the footer; sorted by every key.
    let avg = prof.key_averages().unwrap();
    let sum: u64 = avg.rows.iter().map(|r| r.self_cpu_time_total).sum();
    assert_eq!(sum, avg.self_cpu_time_total);
    for r in &avg.rows {
        assert!(r.self_cpu_time_total <= r.cpu_time_total, "{}", r.key);
        assert!(r.self_device_time_total <= r.device_time_total, "{}", r.key);
    }
    let fwd = avg.get("forward").unwrap();
    assert_eq!(fwd.count, 1);
    if dev.is_cuda() {
        assert!(fwd.device_time_total > 0 || !p.emulated || fwd.self_device_time_total == 0);
        assert!(avg.self_device_time_total > 0);
        assert!(fwd.device_memory_usage != 0 || fwd.device_time_total > 0);
    } else {
        assert!(fwd.cpu_memory_usage > 0, "forward keeps activations alive");
    }
    let sort = if dev.is_cuda() {
        "cuda_time_total"
    } else {
        "cpu_time_total"
    };
    let table = avg.table(sort, 10).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines.len(),
        3 + 10 + 2 + usize::from(dev.is_cuda()),
        "{table}"
    );
    for col in [
        "Name",
        "Self CPU %",
        "CPU total",
        "CPU Mem",
        "Self CPU Mem",
        "# of Calls",
    ] {
        assert!(lines[1].contains(col), "{col}: {table}");
    }
    assert_eq!(lines[1].contains("Self CUDA"), dev.is_cuda(), "{table}");
    assert!(table.contains("Self CPU time total: "));
    for key in ember_profiler::table::sort_keys() {
        avg.table(key, 0).unwrap();
    }
    let by_shape = prof.key_averages_by_input_shape().unwrap();
    assert!(
        by_shape
            .rows
            .iter()
            .any(|r| r.input_shapes.as_deref() == Some("[[5, 8], [8, 16]]"))
    );
    assert!(
        by_shape
            .table("self_cpu_memory_usage", 5)
            .unwrap()
            .contains("Input Shapes")
    );

    // The Chrome trace, read back.
    let dir = temp_dir("trace");
    let path = dir.join("trace.json");
    prof.export_chrome_trace(&path).unwrap();
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    check_chrome_trace(&doc, p, dev);
    Ok(())
}
test_device!(profiler_records_a_training_step, records_a_training_step);

/// The same step timed with CUDA events where CUPTI would be used.
#[test]
fn profiler_records_a_training_step_cuda_with_events() {
    let dev = ember_testing::prepare(Device::Cuda(0)).unwrap();
    records_a_training_step_timed(&dev, DeviceTiming::Events).unwrap();
}

/// The user's code of `with_stack`'s test: one product, called on `line`.
#[inline(never)]
fn user_product(a: &Tensor, b: &Tensor) -> Result<(Tensor, u32)> {
    let line = line!() + 1;
    let c = a.matmul(b)?;
    Ok((c, line))
}

/// `with_stack`: each op's call stack starts at the user's call (this file's
/// `user_product`, at its line where the build has line tables), never inside Ember; an
/// annotation's at the `record_function` call; the Chrome trace carries it as `Call stack`;
/// `key_averages_by_stack(n)` tells call sites apart and the table shows them under
/// "Source Location". Without `with_stack`, nothing is captured.
fn records_call_sites(dev: &Device) -> Result<()> {
    let _serial = serial();
    if !ember_profiler::call_sites_resolvable() {
        // A stripped test binary (`cargo xtask gpu-bundle` strips its programs) has no
        // symbols to name call sites with.
        ember_testing::skip!("this binary has no symbols to resolve call sites");
    }
    let a = Tensor::randn([4, 3], (*dev, DType::F32))?;
    let b = Tensor::randn([3, 5], (*dev, DType::F32))?;
    let mut prof = profile(ProfileOptions::new().activities(both()).with_stack(true)).unwrap();
    let line = {
        let _r = record_function("user_block");
        let (_, line) = user_product(&a, &b)?;
        line
    };
    let _ = a.matmul(&b)?; // a second call site of the same op
    prof.stop().unwrap();
    let p = prof.profile().unwrap();
    let mm: Vec<&Event> = p
        .events
        .iter()
        .filter(|e| e.kind == EventType::CpuOp && e.name == "aten::matmul")
        .collect();
    assert_eq!(
        mm.len(),
        2,
        "{:?}",
        p.events.iter().map(|e| &e.name).collect::<Vec<_>>()
    );
    let first = &mm[0].stack;
    assert!(!first.is_empty(), "no stack for aten::matmul");
    assert!(first[0].contains("user_product"), "{first:?}");
    if first[0].contains(".rs:") {
        assert!(
            first[0].contains(&format!("profile.rs:{line}:")),
            "{first:?} (line {line})"
        );
    }
    assert!(
        first
            .iter()
            .all(|f| !f.contains("ember-tensor/src") && !f.contains("ember-autograd/src")),
        "{first:?}"
    );
    assert!(first.len() <= 8);
    assert!(
        mm[1].stack[0].contains("records_call_sites"),
        "{:?}",
        mm[1].stack
    );
    let block = named(&p.events, "user_block");
    assert!(
        block[0].stack[0].contains("records_call_sites"),
        "{:?}",
        block[0].stack
    );
    // The trace carries it; grouping by one frame splits the two call sites of aten::mm.
    let doc: Value = p.chrome_trace();
    assert_eq!(doc["with_stack"], 1);
    let traced = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "aten::matmul")
        .unwrap();
    assert_eq!(traced["args"]["Call stack"], first.join(";"));
    let averages = prof.key_averages_by_stack(1).unwrap();
    let rows: Vec<_> = averages
        .rows
        .iter()
        .filter(|r| r.key == "aten::matmul")
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r.count == 1 && r.stack.len() == 1));
    let table = averages.table("cpu_time_total", 0).unwrap();
    assert!(table.contains("Source Location"), "{table}");
    assert!(table.contains("user_product"), "{table}");
    assert_eq!(
        prof.key_averages()
            .unwrap()
            .get("aten::matmul")
            .unwrap()
            .count,
        2
    );

    // Off: no stacks.
    let mut prof = profile(ProfileOptions::new().activities(both())).unwrap();
    let _ = user_product(&a, &b)?;
    prof.stop().unwrap();
    let p = prof.profile().unwrap();
    assert!(p.events.iter().all(|e| e.stack.is_empty()));
    Ok(())
}
test_device!(profiler_records_call_sites, records_call_sites);

/// Every event's fields, the nesting per thread, the flows, the memory points.
fn check_chrome_trace(doc: &Value, p: &ember_profiler::Profile, dev: &Device) {
    assert_eq!(doc["schemaVersion"], 1);
    assert_eq!(doc["record_shapes"], 1);
    assert_eq!(doc["profile_memory"], 1);
    assert_eq!(doc["displayTimeUnit"], "ms");
    assert!(doc["baseTimeNanoseconds"].as_u64().unwrap() > 0);
    let events = doc["traceEvents"].as_array().unwrap();
    let mut by_track: std::collections::HashMap<(u64, u64), Vec<(f64, f64)>> =
        std::collections::HashMap::new();
    let (mut x, mut flows_s, mut flows_f, mut memory, mut counters) = (0, 0, 0, 0, 0);
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        match ph {
            "X" => {
                x += 1;
                for k in ["cat", "name", "pid", "tid", "ts", "dur", "args"] {
                    assert!(e.get(k).is_some(), "{k} missing in {e}");
                }
                let cat = e["cat"].as_str().unwrap();
                assert!(
                    [
                        "cpu_op",
                        "user_annotation",
                        "cuda_runtime",
                        "kernel",
                        "gpu_memcpy",
                        "gpu_memset"
                    ]
                    .contains(&cat),
                    "{cat}"
                );
                assert!(e["dur"].as_f64().unwrap() >= 0.0);
                assert!(e["args"]["External id"].is_u64());
                let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
                let ts = e["ts"].as_f64().unwrap();
                by_track
                    .entry(key)
                    .or_default()
                    .push((ts, ts + e["dur"].as_f64().unwrap()));
            }
            "s" => flows_s += 1,
            "f" => {
                flows_f += 1;
                assert_eq!(e["bp"], "e");
            }
            "i" => {
                memory += 1;
                assert_eq!(e["name"], "[memory]");
                for k in [
                    "Total Reserved",
                    "Total Allocated",
                    "Bytes",
                    "Device Id",
                    "Device Type",
                    "Addr",
                ] {
                    assert!(e["args"].get(k).is_some(), "{k} missing in {e}");
                }
            }
            "C" => {
                counters += 1;
                assert!(e["args"]["Allocated"].is_i64() && e["args"]["Reserved"].is_i64());
            }
            "M" => assert!(e["args"]["name"].is_string()),
            other => panic!("unexpected ph {other}"),
        }
    }
    let ranges = p
        .events
        .iter()
        .filter(|e| e.kind != EventType::Memory)
        .count();
    assert_eq!(x, ranges);
    assert_eq!(memory, p.events.len() - ranges);
    assert_eq!(counters, memory);
    assert_eq!(flows_s, flows_f);
    assert_eq!(
        flows_f,
        p.events.iter().filter(|e| e.kind.is_device()).count()
    );
    assert_eq!(flows_f > 0, dev.is_cuda());
    // Host ranges on one thread nest (each pair is disjoint or one holds the other); the
    // trace's microseconds keep three decimals, so allow a nanosecond of rounding.
    for ((pid, _), spans) in &by_track {
        if *pid != u64::from(std::process::id()) {
            continue;
        }
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                let disjoint = a.1 <= b.0 + 1e-3 || b.1 <= a.0 + 1e-3;
                let nested = (a.0 <= b.0 + 1e-3 && b.1 <= a.1 + 1e-3)
                    || (b.0 <= a.0 + 1e-3 && a.1 <= b.1 + 1e-3);
                assert!(disjoint || nested, "{a:?} and {b:?} overlap");
            }
        }
    }
    if dev.is_cuda() {
        let props = doc["deviceProperties"].as_array().unwrap();
        assert_eq!(props[0]["id"], 0);
        for k in [
            "name",
            "totalGlobalMem",
            "computeMajor",
            "numSms",
            "warpSize",
        ] {
            assert!(props[0].get(k).is_some(), "{k}");
        }
    }
}

/// The keys of our trace against a trace PyTorch wrote on the CPU
/// (`tests/data/pytorch_cpu_trace.py` makes it).
#[test]
fn chrome_trace_has_pytorchs_schema() {
    let _serial = serial();
    let theirs: Value = serde_json::from_str(include_str!("data/pytorch_cpu_trace.json")).unwrap();
    let dev = Device::Cpu;
    let model = Model::new(&dev).unwrap();
    let mut opt = Adam::new(model.params(), AdamOptions::default()).unwrap();
    let mut prof = profile(
        ProfileOptions::new()
            .activities([ProfilerActivity::Cpu])
            .record_shapes(true)
            .profile_memory(true),
    )
    .unwrap();
    train_step(&model, &mut opt, &dev).unwrap();
    prof.stop().unwrap();
    let ours = prof.profile().unwrap().chrome_trace();
    let keys = |v: &Value| -> HashSet<String> { v.as_object().unwrap().keys().cloned().collect() };
    let top_theirs = keys(&theirs);
    let top_ours = keys(&ours);
    assert!(
        top_theirs.is_subset(&top_ours),
        "missing: {:?}",
        top_theirs.difference(&top_ours)
    );
    // For each (ph, cat) both traces have, the same event keys, and every arg PyTorch
    // writes except those with no Ember counterpart (Python sequence numbers, strides,
    // concrete Python inputs, the allocator's "finished" flag).
    let no_counterpart = [
        "Sequence number",
        "Fwd thread id",
        "Concrete Inputs",
        "Input Strides",
        "finished",
    ];
    let kinds = |v: &Value| -> Vec<((String, String), Value)> {
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let k = (
                    e["ph"].as_str().unwrap_or("").to_string(),
                    e["cat"].as_str().unwrap_or("").to_string(),
                );
                (k, e.clone())
            })
            .collect()
    };
    let ours_by_kind = kinds(&ours);
    let mut compared: HashSet<(String, String)> = HashSet::new();
    for ((ph, cat), theirs_e) in kinds(&theirs) {
        if !["cpu_op", "user_annotation", "cpu_instant_event"].contains(&cat.as_str()) {
            continue;
        }
        // The same op in both traces (`aten::relu`, `Optimizer.step#Adam.step`, `[memory]`).
        let Some((_, ours_e)) = ours_by_kind
            .iter()
            .find(|((p, c), e)| *p == ph && *c == cat && e["name"] == theirs_e["name"])
        else {
            continue;
        };
        assert_eq!(
            keys(ours_e),
            keys(&theirs_e),
            "{ph}/{cat} {}",
            theirs_e["name"]
        );
        let (ta, oa) = (keys(&theirs_e["args"]), keys(&ours_e["args"]));
        for k in ta.difference(&oa) {
            assert!(
                no_counterpart.contains(&k.as_str()),
                "{ph}/{cat} {}: arg {k:?} missing",
                theirs_e["name"]
            );
        }
        compared.insert((cat, theirs_e["name"].as_str().unwrap_or("").to_string()));
    }
    let count = |cat: &str| compared.iter().filter(|(c, _)| c == cat).count();
    assert!(count("cpu_op") >= 3, "{compared:?}");
    assert!(count("user_annotation") >= 1, "{compared:?}");
    assert!(count("cpu_instant_event") >= 1, "{compared:?}");
}

#[test]
fn schedule_hands_each_cycle_to_the_handler_and_tensorboard_files_appear() {
    let _serial = serial();
    let dev = Device::Cpu;
    let model = Model::new(&dev).unwrap();
    let mut opt = Adam::new(model.params(), AdamOptions::default()).unwrap();
    let cycles: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen = cycles.clone();
    let dir = temp_dir("tb");
    let mut tb = tensorboard_trace_handler(dir.clone(), Some("worker0".into()));
    let mut prof = profile(
        ProfileOptions::new()
            .activities([ProfilerActivity::Cpu])
            .schedule(
                schedule()
                    .skip_first(1)
                    .wait(1)
                    .warmup(1)
                    .active(2)
                    .repeat(2),
            )
            .on_trace_ready(move |p| {
                let steps = p
                    .events
                    .iter()
                    .filter(|e| e.name.starts_with("ProfilerStep#"))
                    .map(|e| e.name.clone())
                    .collect();
                seen.lock().unwrap().push(steps);
                tb(p)
            }),
    )
    .unwrap();
    let mut actions = Vec::new();
    for _ in 0..12 {
        actions.push(prof.current_action());
        train_step(&model, &mut opt, &dev).unwrap();
        prof.step().unwrap();
    }
    prof.stop().unwrap();
    use ProfilerAction::{None as N, Record as R, RecordAndSave as S, Warmup as W};
    assert_eq!(actions, [N, N, W, R, S, N, W, R, S, N, N, N]);
    assert_eq!(
        *cycles.lock().unwrap(),
        [
            vec!["ProfilerStep#3".to_string(), "ProfilerStep#4".into()],
            vec!["ProfilerStep#7".to_string(), "ProfilerStep#8".into()],
        ]
    );
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        assert!(
            f.starts_with("worker0.") && f.ends_with(".pt.trace.json"),
            "{f}"
        );
        let doc: Value = serde_json::from_slice(&std::fs::read(dir.join(f)).unwrap()).unwrap();
        assert!(!doc["traceEvents"].as_array().unwrap().is_empty());
    }
    // key_averages after the loop: the last cycle.
    let avg = prof.key_averages().unwrap();
    assert_eq!(avg.get("ProfilerStep#8").map(|r| r.count), Some(1));
    assert!(avg.get("ProfilerStep#3").is_none());
}

#[test]
fn bad_input_gives_errors_not_panics() {
    let _serial = serial();
    let mut first = profile(ProfileOptions::new().activities([ProfilerActivity::Cpu])).unwrap();
    let second = profile(ProfileOptions::new()).unwrap_err();
    assert!(matches!(second, ProfilerError::AlreadyActive), "{second}");
    assert!(second.to_string().contains("already active"));
    assert!(matches!(
        first.key_averages().unwrap_err(),
        ProfilerError::StillRunning { .. }
    ));

    // A range open on another thread when the profile ends is closed there, and says so.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let _r = record_function("still_running");
        started_tx.send(()).unwrap();
        release_rx.recv().unwrap();
    });
    started_rx.recv().unwrap();
    first.stop().unwrap();
    release_tx.send(()).unwrap();
    worker.join().unwrap();
    let p = first.profile().unwrap();
    let open = named(&p.events, "still_running");
    assert_eq!(open.len(), 1);
    assert!(open[0].truncated);
    assert!(
        open[0].args["truncated"]
            .as_str()
            .unwrap()
            .contains("profile ended")
    );
    assert!(open[0].end_ns() <= p.duration.as_nanos() as u64 + 1);

    // step() after stop; a second stop is harmless.
    let e = first.step().unwrap_err();
    assert!(
        e.to_string().contains("step: the profiler has stopped"),
        "{e}"
    );
    first.stop().unwrap();

    // An unwritable path names the path.
    let e = first
        .export_chrome_trace("/nonexistent-dir/for/sure/trace.json")
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("/nonexistent-dir/for/sure/trace.json"),
        "{e}"
    );
    drop(first);

    // An empty profile: an empty table, an empty trace.
    let mut empty = profile(ProfileOptions::new().activities([ProfilerActivity::Cpu])).unwrap();
    empty.stop().unwrap();
    let table = empty
        .key_averages()
        .unwrap()
        .table("cpu_time_total", 10)
        .unwrap();
    assert_eq!(table.lines().count(), 5, "{table}");
    // A profiler whose schedule never recorded: empty too.
    let mut idle = profile(
        ProfileOptions::new()
            .activities([ProfilerActivity::Cpu])
            .schedule(schedule().skip_first(100).active(1).repeat(1)),
    )
    .unwrap();
    idle.step().unwrap();
    idle.stop().unwrap();
    assert!(idle.key_averages().unwrap().rows.is_empty());
    // Nothing listens once every profiler has stopped.
    assert!(!ember_device::trace::is_active());
}

/// Every thread's ranges land in the cycle they happened in (Note [Per-thread logs]): four
/// threads that trace through two consecutive profiles, with a range open across the first
/// profile's end, and the main thread between them.
#[test]
fn every_threads_ranges_land_in_their_own_cycle() {
    let _serial = serial();
    let barrier = Arc::new(std::sync::Barrier::new(5));
    let round = |tag: &'static str| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    for i in 0..300 {
                        let _r = record_function(format!("{tag}{w}.{}", i % 3));
                    }
                    barrier.wait();
                })
            })
            .collect();
        barrier.wait();
        let _main = record_function(format!("{tag}main"));
        barrier.wait();
        for w in workers {
            w.join().unwrap();
        }
    };
    let cpu = || ProfileOptions::new().activities([ProfilerActivity::Cpu]);

    let mut first = profile(cpu()).unwrap();
    round("a");
    // A thread whose range spans the end of the first profile and the whole second one.
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
    let spanning = std::thread::spawn(move || {
        let _r = record_function("spanning");
        opened_tx.send(()).unwrap();
        close_rx.recv().unwrap();
    });
    opened_rx.recv().unwrap();
    first.stop().unwrap();
    let mut second = profile(cpu()).unwrap();
    round("b");
    close_tx.send(()).unwrap();
    spanning.join().unwrap();
    second.stop().unwrap();

    for (prof, tag, other) in [(&first, "a", "b"), (&second, "b", "a")] {
        let p = prof.profile().unwrap();
        let avg = prof.key_averages().unwrap();
        for w in 0..4 {
            for k in 0..3 {
                let name = format!("{tag}{w}.{k}");
                assert_eq!(avg.get(&name).map(|r| r.count), Some(100), "{name}");
                assert!(avg.get(&format!("{other}{w}.{k}")).is_none());
            }
        }
        assert_eq!(avg.get(&format!("{tag}main")).map(|r| r.count), Some(1));
        let threads: HashSet<_> = p
            .events
            .iter()
            .filter(|e| e.name.starts_with(tag) && e.name.contains('.'))
            .map(|e| e.track)
            .collect();
        assert_eq!(threads.len(), 4, "{threads:?}");
    }
    // Open at the first profile's end: closed there, once.
    let spans = named(&first.profile().unwrap().events, "spanning");
    assert_eq!(spans.len(), 1);
    assert!(spans[0].truncated);
}
