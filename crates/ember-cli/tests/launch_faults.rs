//! `ember launch -- ember train` with a rank killed mid-training: the launcher ends the other
//! rank at once and exits with the killed rank's code, naming it; with `--max-restarts 1`
//! and `--save P --resume P` the job starts again from its last checkpoint and ends with
//! the weights of a run that was never interrupted (within f32 rounding on emulated GPUs,
//! bitwise on the CPU). On emulated GPUs the ranks, separate processes, meet over the
//! emulator's NCCL (not the mpi fallback).
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TAG: &str = "EMBER_FAULT_TEST_TAG";

fn ember() -> &'static str {
    env!("CARGO_BIN_EXE_ember")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The pid of the program of rank `rank` of the job tagged `tag`: the process whose
/// environment holds both (under mpirun, the shell shim before it does not hold `RANK`).
fn rank_pid(tag: &str, rank: usize) -> Option<i32> {
    let (want_tag, want_rank) = (format!("{TAG}={tag}"), format!("RANK={rank}"));
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let has = |s: &str| vars.contains(&s.as_bytes());
        if has(&want_tag) && has(&want_rank) {
            return Some(pid);
        }
    }
    None
}

/// A finished `ember launch`.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
    /// Time from the kill to the launcher's exit.
    after_kill: Option<Duration>,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "code {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `ember launch --nproc-per-node 2 [LAUNCH...] -- ember train TRAIN...` on `device`
/// (`cuda` runs on 2 emulated devices); with `kill`, rank 1 is killed with SIGKILL once
/// rank 0 reported its first epoch.
fn launch(device: &str, launch: &[&str], train: &[&str], kill: bool) -> Ran {
    let tag = format!("{}-{}", std::process::id(), free_port());
    let port = free_port().to_string();
    let mut cmd = Command::new(ember());
    cmd.args(["launch", "--nproc-per-node", "2", "--master-port", &port])
        .args(launch)
        .args(["--", ember(), "train", "--device", device])
        .args(train)
        .env(TAG, &tag)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if device == "cuda" {
        cmd.env("EMBER_CUDA_EMULATOR", "2");
    } else {
        cmd.env_remove("EMBER_CUDA_EMULATOR");
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    let (tx, rx) = mpsc::channel::<String>();
    let err = BufReader::new(child.stderr.take().unwrap());
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in err.lines().map_while(|l| l.ok()) {
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    let mut killed_at = None;
    if kill {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("rank 0 never reported its first epoch");
            if line.starts_with("[rank0]:epoch   1:") {
                break;
            }
        }
        let pid = rank_pid(&tag, 1).expect("rank 1's process is running");
        // SAFETY: kill has no memory preconditions; `pid` is rank 1 of the job started above.
        assert_eq!(unsafe { libc_kill(pid, 9) }, 0);
        killed_at = Some(Instant::now());
    }
    let status = child.wait().unwrap();
    let after_kill = killed_at.map(|t| t.elapsed());
    Ran {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        after_kill,
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// The largest difference between the tensors of two checkpoints (every model and
/// optimizer tensor).
fn max_diff(a: &Path, b: &Path) -> f64 {
    let (ta, tb) = (
        ember_nn::io::load(a, ember_tensor::Device::Cpu).unwrap(),
        ember_nn::io::load(b, ember_tensor::Device::Cpu).unwrap(),
    );
    assert_eq!(ta.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>());
    let mut worst = 0.0f64;
    for (k, x) in &ta {
        let as64 = |t: &ember_autograd::Tensor| {
            t.to_dtype(ember_tensor::DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
        };
        for (p, q) in as64(x).iter().zip(as64(&tb[k])) {
            let d = (p - q).abs();
            worst = worst.max(if d.is_nan() { f64::INFINITY } else { d });
        }
    }
    worst
}

#[test]
fn kill_9_of_a_rank_ends_the_job_with_its_code() {
    let r = launch("cuda", &[], &["--epochs", "40"], true);
    assert_eq!(r.code, 137, "{r}");
    assert!(
        r.stderr.contains(
            "ember launch: rank 1 (local_rank 1) failed with signal 9; the other rank was ended"
        ),
        "{r}"
    );
    // Rank 0 was ended long before its 40 epochs.
    assert!(!r.stderr.contains("[rank0]:epoch  40:"), "{r}");
    let after = r.after_kill.unwrap();
    assert!(
        after < Duration::from_secs(30),
        "the job ended {after:?} after the kill"
    );
}

fn restarted_job_ends_as_an_uninterrupted_one(device: &str, epochs: &str, tolerance: f64) {
    let dir = std::env::temp_dir().join(format!("ember-faults-{device}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (whole, restarted) = (
        dir.join("whole.safetensors"),
        dir.join("restarted.safetensors"),
    );
    let _ = std::fs::remove_file(&restarted);
    let w = launch(
        device,
        &[],
        &["--epochs", epochs, "--save", whole.to_str().unwrap()],
        false,
    );
    assert_eq!(w.code, 0, "{w}");
    let p = restarted.to_str().unwrap();
    let r = launch(
        device,
        &["--max-restarts", "1"],
        &["--epochs", epochs, "--save", p, "--resume", p],
        true,
    );
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stderr.contains(
            "rank 1 (local_rank 1) failed with signal 9; restarting every rank (restart 1 of 1)"
        ),
        "{r}"
    );
    // The first attempt started from scratch, the second from the checkpoint.
    assert!(r.stderr.contains("no checkpoint at"), "{r}");
    assert!(r.stdout.contains("[rank0]:done:"), "{r}");
    let d = max_diff(&whole, &restarted);
    assert!(
        d <= tolerance,
        "{device}: the restarted job's weights differ by {d}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restarted_job_ends_with_the_uninterrupted_weights_on_emulated_gpus() {
    restarted_job_ends_as_an_uninterrupted_one("cuda", "3", 1e-5);
}

#[cfg(feature = "mpi")]
#[test]
fn a_restarted_job_ends_with_the_uninterrupted_weights_bitwise_on_the_cpu() {
    restarted_job_ends_as_an_uninterrupted_one("cpu", "20", 0.0);
}
