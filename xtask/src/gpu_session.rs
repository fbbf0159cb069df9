//! `ember-gpu/bin/xtask gpu-session [--out DIR] [--budget SECONDS] [--filter CASES] [--host NAME]
//! [STEP...]`: Ember's GPU checks, run from an unpacked `cargo xtask gpu-bundle` on a machine
//! with a GPU and no Rust toolchain. Steps (default all, in this order):
//!
//! - `info`: `ember info --json`; without a real CUDA GPU, or with one but a bundle without
//!   its kernels, the session says so and stops;
//! - `tests`: every suite of the bundle under `EMBER_GPU_TEST=1` (the real driver instead of
//!   the emulator) and `EMBER_CUDNN_API=graph` (convolutions on cuDNN's graph API, no
//!   fallback), with `EMBER_DATA_DIR` pointing at the bundle's `data/`; the `cudnn` suite a
//!   second time under `EMBER_CUDNN_API=legacy`. Every test's outcome is recorded (Note
//!   [Suite results are generated] in `suites.rs`): passed, failed and skipped (with the
//!   reason) are counted apart, the summary lists each skipped and failed test, and
//!   `DIR/results/<date>-<host>-cuda-suites.json` (`kind: "suites"`) holds the record that
//!   `bench-report` renders;
//! - `train`: `ember train --device cuda` for the MLP and the CNN;
//! - `nccl`: a process group of world size 1 on the `nccl` backend running every collective
//!   (the `nccl_group` suite's `world_size_one_runs_every_collective`), then `ember launch
//!   --nproc-per-node 1 -- ember train --device cuda --json`, whose summary must say
//!   `world_size` 1 and a process group over nccl;
//! - `bench`: `ember-bench --device cuda`, then `bench/torch_side_by_side.py --device cuda
//!   --save` against the machine's own PyTorch (`python3`); with `--filter CASES` only those
//!   cases, side by side (the script's `--filter`: comma-separated name parts). It writes
//!   `bench/results/<date>-<host>-cuda.json` in the bundle (copied to `DIR/results/`);
//! - `sanitize`: compute-sanitizer's memcheck over the op, gradient, layer and scaler suites
//!   and one epoch of training, synccheck and racecheck over the op suite (skipped, and said
//!   so, where `compute-sanitizer` is not on `PATH`);
//! - `ncu`: Nsight Compute's device time and DRAM bytes of every kernel of a few ResNet-18
//!   training steps (`ember-bench --quick --filter train_resnet18_b32`), as CSV in
//!   `ncu-resnet18.log`, to find where a step's device time goes; with `--ncu CASES`, of
//!   each part's cases instead (else with `--filter`'s, when given) (`ncu-<part>.log`);
//!   skipped where `ncu` is not on `PATH`.
//!
//! Each step has its own time limit, and no step starts after `--budget` seconds (default
//! 540, so a session fits a 10-minute call). Logs go to `DIR` (default `session/` in the
//! bundle), packed into `DIR/logs.tar.gz` at the end beside `DIR/summary.txt`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::gpu_bundle::BUNDLE_DIR;
use crate::{results, suites};

const STEPS: [&str; 7] = ["info", "tests", "train", "nccl", "bench", "sanitize", "ncu"];

#[derive(Debug)]
struct Options {
    out: Option<PathBuf>,
    budget: Duration,
    steps: Vec<String>,
    /// `--filter`: the side-by-side cases (comma-separated name parts); all when empty.
    filter: String,
    /// `--host`: the machine's name in saved results (default: the GPU's name, as a slug).
    host: Option<String>,
    /// `--ncu`: the cases `ncu` profiles (comma-separated name parts); `--filter`'s, or the
    /// ResNet-18 step, when empty.
    ncu: String,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        out: None,
        budget: Duration::from_secs(540),
        steps: Vec::new(),
        filter: String::new(),
        host: None,
        ncu: String::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => o.out = Some(PathBuf::from(it.next().ok_or("--out needs a directory")?)),
            "--budget" => {
                let v = it.next().ok_or("--budget needs seconds")?;
                o.budget = Duration::from_secs(
                    v.parse()
                        .map_err(|_| format!("--budget: expected seconds, found {v:?}"))?,
                );
            }
            "--filter" => {
                o.filter = it
                    .next()
                    .ok_or("--filter needs case names (comma-separated parts)")?
                    .clone();
            }
            "--host" => o.host = Some(it.next().ok_or("--host needs a name")?.clone()),
            "--ncu" => {
                o.ncu = it
                    .next()
                    .ok_or("--ncu needs case names (comma-separated parts)")?
                    .clone();
            }
            s if STEPS.contains(&s) => o.steps.push(s.to_string()),
            other => {
                return Err(format!(
                    "`gpu-session` takes --out DIR, --budget SECONDS, --filter CASES, --host NAME \
                     --ncu CASES and steps {STEPS:?}; found {other:?}"
                ));
            }
        }
    }
    if o.steps.is_empty() {
        o.steps = STEPS.iter().map(|s| s.to_string()).collect();
    }
    Ok(o)
}

/// The unpacked bundle this program runs from: the parent of its `bin/`, holding
/// `bundle.json`.
fn bundle_root() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this program: {e}"))?;
    exe.parent()
        .and_then(Path::parent)
        .filter(|d| d.join("bundle.json").is_file())
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            format!(
                "{} is not inside an unpacked bundle (no bundle.json beside its bin/): build one \
                 with `cargo xtask gpu-bundle`, unpack it on the GPU machine and run \
                 `{BUNDLE_DIR}/bin/xtask gpu-session` there",
                exe.display()
            )
        })
}

/// One session: where things are, what is left of the budget, what happened.
struct Session {
    bundle: PathBuf,
    out: PathBuf,
    start: Instant,
    budget: Duration,
    summary: Vec<String>,
}

impl Session {
    fn left(&self) -> Duration {
        self.budget.saturating_sub(self.start.elapsed())
    }

    /// A command of the bundle's, run from the bundle's root with the emulator switched off.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.bundle)
            .env_remove("EMBER_CUDA_EMULATOR")
            .env_remove("EMBER_CUDA_EMULATOR_MEMORY")
            .env("EMBER_DATA_DIR", self.bundle.join("data"));
        cmd
    }

    /// Runs `cmd` with its output in `OUT/name.log`, killed (with its children) after
    /// `limit` or when the budget runs out; records a summary line. Returns the exit code
    /// (124 on a timeout), or `None` when it did not run.
    fn step(&mut self, name: &str, limit_s: u64, cmd: &mut Command) -> Option<i32> {
        self.step_to(name, limit_s, cmd, None)
    }

    /// [`Session::step`], with the command's standard output in `stdout` instead of the log
    /// (which then holds its standard error).
    fn step_to(
        &mut self,
        name: &str,
        limit_s: u64,
        cmd: &mut Command,
        stdout: Option<&Path>,
    ) -> Option<i32> {
        let left = self.left();
        if left < Duration::from_secs(10) {
            self.summary
                .push(format!("{name}: not run (time budget spent)"));
            return None;
        }
        let limit = Duration::from_secs(limit_s).min(left);
        let log_path = self.out.join(format!("{name}.log"));
        let log = match std::fs::File::create(&log_path) {
            Ok(f) => f,
            Err(e) => {
                self.summary
                    .push(format!("{name}: cannot create its log: {e}"));
                return None;
            }
        };
        let err = log.try_clone().ok();
        let out = match stdout.map(std::fs::File::create) {
            None => Stdio::from(log),
            Some(Ok(f)) => Stdio::from(f),
            Some(Err(e)) => {
                self.summary
                    .push(format!("{name}: cannot create its output file: {e}"));
                return None;
            }
        };
        eprintln!("==> {name} (limit {}s)", limit.as_secs());
        let t0 = Instant::now();
        let child = {
            use std::os::unix::process::CommandExt;
            cmd.stdin(Stdio::null())
                .stdout(out)
                .stderr(err.map_or_else(Stdio::null, Stdio::from))
                .process_group(0)
                .spawn()
        };
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                self.summary.push(format!("{name}: could not start: {e}"));
                return None;
            }
        };
        let rc = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status.code().unwrap_or(128),
                Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(100)),
                _ => {
                    // The whole process group: compute-sanitizer's target too.
                    let _ = Command::new("kill")
                        .args(["-s", "KILL", "--", &format!("-{}", child.id())])
                        .status();
                    let _ = child.kill();
                    let _ = child.wait();
                    break 124;
                }
            }
        };
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find(|l| {
                l.starts_with("test result:")
                    || l.contains("ERROR SUMMARY")
                    || l.contains("error")
                    || l.contains("failed")
            })
            .unwrap_or("");
        self.summary.push(format!(
            "{name}: rc={rc} in {:.0}s {last}",
            t0.elapsed().as_secs_f64()
        ));
        for l in text
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            eprintln!("    {l}");
        }
        Some(rc)
    }
}

/// Rank 0's JSON summary in the log of `ember launch --nproc-per-node 1 -- ember train
/// --json` (its lines prefixed `[rank0]:`): `Ok` with the accuracy and the reason when it
/// trained on one rank over the `nccl` backend, else what is wrong.
fn check_launch_summary(log: &str) -> Result<String, String> {
    let text: String = log
        .lines()
        .filter_map(|l| l.strip_prefix("[rank0]:"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let json = match (text.find('{'), text.rfind('}')) {
        (Some(a), Some(b)) if a < b => &text[a..=b],
        _ => return Err("no JSON summary from rank 0".into()),
    };
    let v: Value = serde_json::from_str(json).map_err(|e| format!("rank 0's summary: {e}"))?;
    let reason = v["device_reason"].as_str().unwrap_or("");
    if v["world_size"] != 1 || !reason.contains("over nccl") {
        return Err(format!(
            "expected world_size 1 over nccl, found world_size {} ({reason})",
            v["world_size"]
        ));
    }
    Ok(format!(
        "world_size 1, val_accuracy {}, {reason}",
        v["val_accuracy"]
    ))
}

/// The Python snippet that prints every `lib` folder of the environment's `nvidia-*` wheels
/// (cuBLAS, cuDNN, NCCL, ...; `nvidia/<name>/lib` or, for CUDA 13's, `nvidia/cu13/lib`).
const NVIDIA_WHEEL_LIBS: &str = "import nvidia, os
for root in nvidia.__path__:
    for d, subs, files in os.walk(root):
        if d[len(root):].count(os.sep) > 3:
            subs[:] = []
        elif os.path.basename(d) == 'lib' and any('.so' in f for f in files):
            print(d)";

/// The libraries Ember loads at run time (cuBLAS, cuDNN, CUPTI): the CUDA toolkit's, and
/// those in the Python environment's `nvidia-*` wheels (where PyTorch's come from).
fn cuda_library_path() -> Option<String> {
    let mut dirs: Vec<String> = Vec::new();
    // The toolkit's libraries, and CUPTI's, which the toolkit keeps apart.
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/extras/CUPTI/lib64",
    ] {
        if Path::new(d).is_dir() {
            dirs.push(d.into());
        }
    }
    let wheels = Command::new("python3")
        .args(["-c", NVIDIA_WHEEL_LIBS])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    dirs.extend(
        wheels
            .lines()
            .map(str::trim)
            .filter(|d| !d.is_empty() && Path::new(d).is_dir())
            .map(String::from),
    );
    if dirs.is_empty() {
        return None;
    }
    if let Ok(old) = std::env::var("LD_LIBRARY_PATH")
        && !old.is_empty()
    {
        dirs.push(old);
    }
    Some(dirs.join(":"))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// The suites of the bundle, each under `EMBER_GPU_TEST=1` with every test's outcome recorded
/// (Note [Suite results are generated]): `cudnn` once per cuDNN API, the others on the graph
/// API (a shape it cannot plan fails instead of running on the legacy API unseen). Adds each
/// run's counts and its skipped and failed tests to the summary; returns the records.
fn run_suites(s: &mut Session, suites: &[String], library_path: Option<&str>) -> Vec<Value> {
    let mut records = Vec::new();
    for t in suites {
        let apis: &[&str] = if t == "cudnn" {
            &["legacy", "graph"]
        } else {
            &["graph"]
        };
        for api in apis {
            let exe = s.bundle.join("tests").join(t);
            let mut cmd = s.command(&exe.to_string_lossy());
            if let Some(p) = library_path {
                cmd.env("LD_LIBRARY_PATH", p);
            }
            // libtest takes `-Z unstable-options` from a stable build where RUSTC_BOOTSTRAP
            // is set when it runs (Note [Suite results are generated]).
            cmd.env("EMBER_GPU_TEST", "1")
                .env("EMBER_CUDNN_API", api)
                .env("RUSTC_BOOTSTRAP", "1")
                .args(suites::JSON_ARGS);
            let (name, variant) = if apis.len() > 1 {
                (
                    format!("test-{t}-{api}"),
                    Some(format!("EMBER_CUDNN_API={api}")),
                )
            } else {
                (format!("test-{t}"), None)
            };
            let json = s.out.join(format!("{name}.jsonl"));
            let t0 = Instant::now();
            let rc = s.step_to(&name, 240, &mut cmd, Some(&json));
            let Some(rc) = rc else { continue };
            let exit = if rc == 124 {
                "killed at its time limit".to_string()
            } else {
                format!("exit code {rc}")
            };
            let stream = std::fs::read_to_string(&json).unwrap_or_default();
            let tests = suites::parse_libtest_json(&stream, &exit);
            if tests.is_empty() {
                s.summary.push(format!(
                    "{name}: rc=1 no per-test outcomes (does the binary take {:?} with \
                     RUSTC_BOOTSTRAP=1?); see {name}.log",
                    suites::JSON_ARGS.join(" ")
                ));
            }
            let command = format!(
                "EMBER_GPU_TEST=1 EMBER_CUDNN_API={api} RUSTC_BOOTSTRAP=1 tests/{t} {}",
                suites::JSON_ARGS.join(" ")
            );
            let record = suites::suite_record(
                t,
                variant.as_deref(),
                &command,
                Some(rc),
                t0.elapsed().as_secs_f64(),
                &tests,
            );
            s.summary.extend(suites::summary_lines(&record));
            records.push(record);
        }
    }
    records
}

/// The `kind: "suites"` results file of this session's `tests` step.
fn suites_file(manifest: &Value, host: &str, args: &[String], records: Vec<Value>) -> Value {
    serde_json::json!({
        "schema": results::SCHEMA,
        "kind": "suites",
        "generator": suites::GENERATOR,
        "date": results::today(),
        "time": results::now_time(),
        "host": host,
        "device": "cuda",
        "command": format!("{BUNDLE_DIR}/bin/xtask gpu-session {}", args.join(" ")),
        "machine": results::machine(Some(&format!(
            "the bundle of cargo xtask gpu-bundle ({}, built {})",
            manifest["arch"].as_str().unwrap_or("?"),
            manifest["built"].as_str().unwrap_or("?")
        ))),
        "ember": manifest["ember"].clone(),
        "records": records,
    })
}

/// Writes `doc` to `dir/<date>-<host>-<suffix>.json` (a free name) and returns the path.
fn save_in(dir: &Path, doc: &Value, suffix: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let field = |k: &str| doc[k].as_str().unwrap_or("unknown").to_string();
    let path = results::file_name(dir, &field("date"), &field("host"), suffix);
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    std::fs::write(&path, format!("{text}\n")).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let bundle = bundle_root()?;
    let out = o.out.clone().unwrap_or_else(|| bundle.join("session"));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let out = out
        .canonicalize()
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let mut s = Session {
        bundle: bundle.clone(),
        out: out.clone(),
        start: Instant::now(),
        budget: o.budget,
        summary: Vec::new(),
    };
    let manifest: Value = std::fs::read_to_string(bundle.join("bundle.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let suites: Vec<String> = manifest["suites"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    let library_path = cuda_library_path();
    if let Some(p) = &library_path {
        eprintln!("LD_LIBRARY_PATH={p}");
        let _ = std::fs::write(out.join("library-path.txt"), format!("{p}\n"));
    }
    let bin = |name: &str| bundle.join("bin").join(name).to_string_lossy().into_owned();
    let test = |name: &str| {
        bundle
            .join("tests")
            .join(name)
            .to_string_lossy()
            .into_owned()
    };
    let with_libs = |mut cmd: Command| {
        if let Some(p) = &library_path {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        cmd
    };

    let smi = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu",
            "--format=csv",
        ])
        .output();
    let smi_text = match smi {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("nvidia-smi: {e}\n"),
    };
    eprint!("{smi_text}");
    let _ = std::fs::write(out.join("nvidia-smi.txt"), &smi_text);
    // The machine's name in saved results: `--host`, else the GPU's name.
    let host = o.host.clone().unwrap_or_else(|| {
        smi_text
            .lines()
            .nth(1)
            .and_then(|l| l.split(',').next())
            .map_or_else(results::hostname, results::slug)
    });

    for step in &o.steps {
        match step.as_str() {
            "info" => {
                let mut cmd = with_libs(s.command(&bin("ember")));
                cmd.args(["info", "--json"]);
                s.step("info", 60, &mut cmd);
                // The JSON object, whatever the program also printed on stderr.
                let info = std::fs::read_to_string(out.join("info.log")).unwrap_or_default();
                let json = match (info.find('{'), info.rfind('}')) {
                    (Some(a), Some(b)) if a < b => &info[a..=b],
                    _ => "",
                };
                let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
                if v["cuda_available"] != true {
                    let why = v["cuda_unavailable_reason"]
                        .as_str()
                        .unwrap_or("ember info failed");
                    s.summary.push(format!(
                        "NO CUDA GPU FOUND ({why}): nothing ran on a GPU; the emulated suite is `cargo xtask test`"
                    ));
                    break;
                }
                if let Some(why) = v["cuda_kernels_missing"].as_str() {
                    s.summary.push(format!(
                        "info: rc=1 a GPU is here but this bundle cannot run on it: {why}"
                    ));
                    break;
                }
            }
            "tests" => {
                let records = run_suites(&mut s, &suites, library_path.as_deref());
                let doc = suites_file(&manifest, host.as_str(), args, records);
                match save_in(&out.join("results"), &doc, "cuda-suites") {
                    Ok(p) => eprintln!("==> suite outcomes in {}", p.display()),
                    Err(e) => s
                        .summary
                        .push(format!("tests: rc=1 cannot save the outcomes: {e}")),
                }
            }
            "train" => {
                let mut mlp = with_libs(s.command(&bin("ember")));
                mlp.args(["train", "--device", "cuda", "--json"]);
                s.step("train-mlp", 120, &mut mlp);
                let mut cnn = with_libs(s.command(&bin("ember")));
                cnn.args(["train", "--device", "cuda", "--model", "cnn", "--json"]);
                s.step("train-cnn", 180, &mut cnn);
            }
            "nccl" => {
                let mut group = with_libs(s.command(&test("nccl_group")));
                group
                    .env("EMBER_GPU_TEST", "1")
                    .args(["world_size_one", "--nocapture"]);
                s.step("nccl-group", 120, &mut group);
                let mut launch = with_libs(s.command(&bin("ember")));
                launch
                    .args(["launch", "--nproc-per-node", "1", "--"])
                    .args([bin("ember").as_str(), "train", "--device", "cuda", "--json"]);
                if s.step("nccl-launch-train", 180, &mut launch) == Some(0) {
                    let log = std::fs::read_to_string(out.join("nccl-launch-train.log"))
                        .unwrap_or_default();
                    s.summary.push(match check_launch_summary(&log) {
                        Ok(line) => format!("nccl-launch-train summary: {line}"),
                        Err(e) => format!("nccl-launch-train summary: rc=1 {e}"),
                    });
                }
            }
            "bench" => {
                // Every case alone first (with their H100 bounds), unless only some are wanted:
                // the side-by-side run has Ember's side of those.
                if o.filter.is_empty() {
                    let mut ember = with_libs(s.command(&bin("ember-bench")));
                    ember.args(["--json", "--device", "cuda"]);
                    s.step("bench-ember", 180, &mut ember);
                }
                let threads = std::thread::available_parallelism().map_or(1, usize::from);
                let mut sbs = with_libs(s.command("python3"));
                sbs.args([
                    "bench/torch_side_by_side.py",
                    "--device",
                    "cuda",
                    "--python",
                    "python3",
                    "--ember-bin",
                    "bin/ember-bench",
                    "--filter",
                    &o.filter,
                    "--rounds",
                    "3",
                    "--save",
                    "--host",
                    &host,
                ])
                .args(["--threads", &threads.to_string()]);
                s.step("bench-side-by-side", 240, &mut sbs);
                let saved = bundle.join("bench").join("results");
                if saved.is_dir() {
                    let dest = out.join("results");
                    let _ = std::fs::create_dir_all(&dest);
                    for e in std::fs::read_dir(&saved).into_iter().flatten().flatten() {
                        let _ = std::fs::copy(e.path(), dest.join(e.file_name()));
                    }
                }
            }
            "sanitize" => {
                if !on_path("compute-sanitizer") {
                    s.summary
                        .push("sanitize: not run (compute-sanitizer is not on PATH)".into());
                    continue;
                }
                let sanitizer = |s: &Session, tool: &str| {
                    let mut cmd = with_libs(s.command("compute-sanitizer"));
                    cmd.args(["--tool", tool, "--error-exitcode", "3"]);
                    cmd
                };
                for t in ["cuda_ops", "gradcheck", "nn", "scaler"] {
                    if suites.iter().any(|x| x == t) {
                        let mut cmd = sanitizer(&s, "memcheck");
                        cmd.env("EMBER_GPU_TEST", "1").arg(test(t));
                        s.step(&format!("memcheck-{t}"), 120, &mut cmd);
                    }
                }
                let mut train = sanitizer(&s, "memcheck");
                train
                    .arg(bin("ember"))
                    .args(["train", "--device", "cuda", "--epochs", "1", "--json"]);
                s.step("memcheck-train", 120, &mut train);
                let mut sync = sanitizer(&s, "synccheck");
                sync.env("EMBER_GPU_TEST", "1").arg(test("cuda_ops"));
                s.step("synccheck-cuda_ops", 150, &mut sync);
                // racecheck is slow over the whole op suite: the tests whose kernels share
                // memory between threads (reductions, softmax and the losses, random numbers),
                // with 8 cases per property (at proptest's default 256, each of these tests
                // ran past 200 s under racecheck on an H100).
                let mut race = sanitizer(&s, "racecheck");
                race.env("EMBER_GPU_TEST", "1")
                    .env("PROPTEST_CASES", "8")
                    .arg(test("cuda_ops"))
                    .args(["reductions", "losses", "same_seed", "--test-threads", "4"]);
                s.step("racecheck-cuda_ops", 200, &mut race);
            }
            "ncu" => {
                if !on_path("ncu") {
                    s.summary.push("ncu: not run (ncu is not on PATH)".into());
                    continue;
                }
                // The ResNet-18 step, or each `--ncu` (else `--filter`) part's cases.
                let parts = if o.ncu.is_empty() { &o.filter } else { &o.ncu };
                let cases: Vec<&str> = if parts.is_empty() {
                    vec!["train_resnet18_b32"]
                } else {
                    parts.split(',').filter(|c| !c.is_empty()).collect()
                };
                for case in cases {
                    let mut cmd = with_libs(s.command("ncu"));
                    cmd.args([
                        "--metrics",
                        "gpu__time_duration.sum,dram__bytes.sum",
                        "--csv",
                        "--print-units",
                        "base",
                        "--clock-control",
                        "none",
                    ])
                    .arg(bin("ember-bench"))
                    .args(["--json", "--quick", "--device", "cuda", "--filter", case]);
                    // The f32 step alone, not its autocast twins (`_f16`, `_bf16`).
                    if parts.is_empty() {
                        cmd.arg("--exact");
                    }
                    let name = case.trim_start_matches("train_").trim_end_matches("_b32");
                    s.step(&format!("ncu-{name}"), 150, &mut cmd);
                }
            }
            other => s.summary.push(format!("{other}: unknown step")),
        }
    }

    let summary = s.summary.join("\n");
    eprintln!(
        "\n==> summary ({:.0}s)\n{summary}",
        s.start.elapsed().as_secs_f64()
    );
    std::fs::write(out.join("summary.txt"), format!("{summary}\n"))
        .map_err(|e| format!("summary.txt: {e}"))?;
    // One archive of the logs (a lent machine returns only a few files).
    let logs: Vec<String> = std::fs::read_dir(&out)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log") || n.ends_with(".txt") || n.ends_with(".jsonl"))
        .collect();
    let packed = Command::new("tar")
        .current_dir(&out)
        .arg("-czf")
        .arg("logs.tar.gz")
        .args(&logs)
        .status()
        .is_ok_and(|st| st.success());
    if packed {
        for l in logs.iter().filter(|n| !n.ends_with(".txt")) {
            let _ = std::fs::remove_file(out.join(l));
        }
    }
    eprintln!("==> logs in {}", out.display());
    let failed = s
        .summary
        .iter()
        .any(|l| l.contains(": rc=") && !l.contains(": rc=0 "));
    if failed {
        Err("some steps failed (summary above)".into())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = parse(&["tests".into(), "--budget".into(), "60".into()]).unwrap();
        assert_eq!(o.steps, vec!["tests".to_string()]);
        assert_eq!(o.budget, Duration::from_secs(60));
        assert_eq!(o.filter, "");
        let o = parse(&[
            "bench".into(),
            "--filter".into(),
            "softmax_ce,conv2d".into(),
        ])
        .unwrap();
        assert_eq!(o.filter, "softmax_ce,conv2d");
        assert!(parse(&["--filter".into()]).is_err());
        assert_eq!(parse(&[]).unwrap().steps.len(), STEPS.len());
        assert!(parse(&["bogus".into()]).is_err());
        let o = parse(&[
            "--host".into(),
            "h100-lent".into(),
            "--ncu".into(),
            "softmax_ce".into(),
            "ncu".into(),
        ])
        .unwrap();
        assert_eq!(o.host.as_deref(), Some("h100-lent"));
        assert_eq!((o.ncu.as_str(), o.steps.len()), ("softmax_ce", 1));
        assert!(parse(&["--ncu".into()]).is_err());
        assert_eq!(
            parse(&["nccl".into()]).unwrap().steps,
            vec!["nccl".to_string()]
        );
    }

    #[test]
    fn the_launch_summary_must_say_nccl() {
        let good = "[rank0]: {\"world_size\": 1, \"val_accuracy\": 0.97,\n[rank0]:  \"device_reason\": \"--device cuda; process group over nccl (world size 1)\"}\n";
        assert!(check_launch_summary(good).unwrap().contains("over nccl"));
        let mpi = good.replace("over nccl", "over mpi");
        assert!(check_launch_summary(&mpi).unwrap_err().contains("over mpi"));
        assert!(check_launch_summary("[rank0]: boom").is_err());
    }
}
