//! Chrome/Perfetto/TensorBoard traces: [`Profile::export_chrome_trace`] and
//! [`tensorboard_trace_handler`]. The schema is documented in the crate docs.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::error::{ProfilerError, Result};
use crate::event::{EventType, Profile, Track};

impl Profile {
    /// The trace as a Chrome Trace Event Format document (see the crate docs).
    pub fn chrome_trace(&self) -> Value {
        let pid = u64::from(std::process::id());
        let base_ns = self
            .started_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let us = |ns: u64| Value::from(ns as f64 / 1e3);
        let mut out: Vec<Value> = Vec::with_capacity(self.events.len() * 2 + 8);
        out.push(
            json!({"ph": "M", "name": "process_name", "ts": 0.0, "pid": pid, "tid": 0,
            "args": {"name": "ember"}}),
        );
        let mut threads: Vec<u64> = Vec::new();
        let mut streams: Vec<(usize, u64)> = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            let (epid, etid) = match e.track {
                Track::Thread(t) => {
                    if !threads.contains(&t) {
                        threads.push(t);
                    }
                    (pid, t)
                }
                Track::Stream { device, stream } => {
                    if !streams.contains(&(device, stream)) {
                        streams.push((device, stream));
                    }
                    (device as u64, stream)
                }
            };
            if e.kind == EventType::Memory {
                let Some(m) = &e.memory else { continue };
                out.push(json!({
                    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                    "pid": epid, "tid": etid, "ts": us(e.start_ns),
                    "args": {
                        "Total Reserved": m.total_reserved,
                        "Total Allocated": m.total_allocated,
                        "Bytes": m.bytes,
                        "Device Id": m.cuda.map_or(-1, |d| d as i64),
                        "Device Type": if m.cuda.is_some() { 1 } else { 0 },
                        "Addr": m.addr,
                        "Ev Idx": i,
                    }
                }));
                let device = m.cuda.map_or("cpu".to_string(), |d| format!("cuda:{d}"));
                out.push(json!({
                    "ph": "C", "name": format!("Memory ({device})"), "pid": pid, "tid": 0,
                    "ts": us(e.start_ns),
                    "args": {"Allocated": m.total_allocated, "Reserved": m.total_reserved}
                }));
                continue;
            }
            let mut args: Map<String, Value> = Map::new();
            args.insert("External id".into(), external_id(&self.events, i).into());
            if !e.kind.is_device() {
                args.insert("Record function id".into(), 0.into());
            }
            for (k, v) in &e.args {
                args.insert(k.clone(), v.clone());
            }
            args.insert("Ev Idx".into(), i.into());
            out.push(json!({
                "ph": "X", "cat": e.kind.chrome_category(), "name": e.name,
                "pid": epid, "tid": etid, "ts": us(e.start_ns), "dur": us(e.dur_ns),
                "args": Value::Object(args),
            }));
            // Flow arrows from the launch to the device work, as PyTorch's `ac2g`.
            if e.kind.is_device()
                && let Some(r) = e.parent
            {
                let launch = &self.events[r];
                if let Track::Thread(t) = launch.track {
                    out.push(json!({"ph": "s", "id": e.correlation, "pid": pid, "tid": t,
                        "ts": us(launch.start_ns), "cat": "ac2g", "name": "ac2g"}));
                    out.push(
                        json!({"ph": "f", "id": e.correlation, "pid": epid, "tid": etid,
                        "ts": us(e.start_ns), "cat": "ac2g", "name": "ac2g", "bp": "e"}),
                    );
                }
            }
        }
        for t in threads {
            out.push(
                json!({"ph": "M", "name": "thread_name", "ts": 0.0, "pid": pid, "tid": t,
                "args": {"name": format!("thread {t}")}}),
            );
        }
        for (device, stream) in streams {
            let d = device as u64;
            out.push(
                json!({"ph": "M", "name": "process_name", "ts": 0.0, "pid": d, "tid": 0,
                "args": {"name": format!("cuda:{device}")}}),
            );
            out.push(
                json!({"ph": "M", "name": "thread_name", "ts": 0.0, "pid": d,
                "tid": stream, "args": {"name": format!("stream {stream}")}}),
            );
        }
        let devices: Vec<Value> = self
            .devices
            .iter()
            .map(|(id, p)| {
                json!({
                    "id": id, "name": p.name, "totalGlobalMem": p.total_memory,
                    "computeMajor": p.major, "computeMinor": p.minor,
                    "maxThreadsPerBlock": p.max_threads_per_block,
                    "maxThreadsPerMultiprocessor": p.max_threads_per_multi_processor,
                    "regsPerMultiprocessor": p.regs_per_multiprocessor,
                    "warpSize": p.warp_size,
                    "sharedMemPerBlock": p.shared_memory_per_block,
                    "sharedMemPerBlockOptin": p.shared_memory_per_block_optin,
                    "numSms": p.multi_processor_count,
                    "emulated": self.emulated,
                })
            })
            .collect();
        json!({
            "schemaVersion": 1,
            "deviceProperties": devices,
            "trace_id": format!("{pid:x}{base_ns:x}"),
            "profile_memory": u8::from(self.profile_memory),
            "record_shapes": u8::from(self.record_shapes),
            "with_stack": u8::from(self.with_stack),
            "host_name": host_name(),
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base_ns,
            "traceEvents": out,
            "traceName": "",
        })
    }

    /// `export_chrome_trace(path)`: write [`Profile::chrome_trace`] to `path`, atomically
    /// (a temporary file beside it, then a rename).
    pub fn export_chrome_trace(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let mut doc = self.chrome_trace();
        doc["traceName"] = Value::String(path.display().to_string());
        write_atomically("export_chrome_trace", path, doc.to_string().as_bytes())
    }
}

/// The op an event belongs to, as PyTorch's `External id` (its own index for host ranges;
/// the launching op's for device work).
fn external_id(events: &[crate::event::Event], i: usize) -> usize {
    let e = &events[i];
    if e.kind.is_device() {
        e.parent
            .and_then(|r| events[r].parent)
            .or(e.parent)
            .unwrap_or(i)
    } else {
        i
    }
}

/// Write `bytes` to `path` through a temporary file in the same directory and a rename, so
/// a reader never sees half a file and an old file is never lost to a failed write.
pub(crate) fn write_atomically(op: &'static str, path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| ProfilerError::Io {
        op,
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io(std::io::Error::other("the path names no file")))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(())
}

fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `torch.profiler.tensorboard_trace_handler(dir, worker_name)`: an `on_trace_ready` that
/// writes each cycle's trace to `dir/{worker_name}.{time_ns}.pt.trace.json` (creating
/// `dir`), which TensorBoard's PyTorch profiler plugin, Perfetto and `chrome://tracing`
/// open. `worker_name` defaults to `{host name}_{process id}`, as PyTorch's.
pub fn tensorboard_trace_handler(
    dir: impl Into<PathBuf>,
    worker_name: Option<String>,
) -> impl FnMut(&Profile) -> Result<()> + Send + 'static {
    let dir = dir.into();
    move |profile: &Profile| {
        write_tensorboard_trace(profile, &dir, worker_name.as_deref()).map(drop)
    }
}

/// What [`tensorboard_trace_handler`] does with one trace: write it into `dir` (created if
/// missing) as `{worker_name}.{time_ns}.pt.trace.json`; returns the file's path.
pub fn write_tensorboard_trace(
    profile: &Profile,
    dir: &Path,
    worker_name: Option<&str>,
) -> Result<PathBuf> {
    fs::create_dir_all(dir).map_err(|source| ProfilerError::Io {
        op: "tensorboard_trace_handler",
        path: dir.to_path_buf(),
        source,
    })?;
    let worker = worker_name.map_or_else(
        || format!("{}_{}", host_name(), std::process::id()),
        str::to_string,
    );
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = dir.join(format!("{worker}.{ns}.pt.trace.json"));
    profile.export_chrome_trace(&path)?;
    Ok(path)
}
