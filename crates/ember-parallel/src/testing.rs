//! Tests as N MPI ranks under `cargo test`: the test re-executes its own binary under
//! `mpirun -n N`, filtered to itself, and each rank runs the test's body.
//!
//! ```no_run
//! use ember_parallel::group::{self, Backend, InitMethod, ReduceOp};
//! use ember_parallel::testing;
//!
//! #[test]
//! fn sums_on_two_ranks() {
//!     testing::ranks(2, "sums_on_two_ranks", || {
//!         let pg = group::init_process_group(Backend::Mpi, InitMethod::Mpi)?;
//!         let t = ember_autograd::Tensor::ones([3], ())?;
//!         pg.all_reduce(&t, ReduceOp::Sum)?;
//!         assert_eq!(t.to_vec::<f32>()?, vec![2.0; 3]);
//!         group::destroy_process_group()
//!     });
//! }
//! ```
//!
//! The name is the test's path as `cargo test -- --exact` takes it (`module::name` inside a
//! module). The parent waits at most [`RunRanks::timeout`] (then ends the job) and fails
//! the test with every rank's output unless every rank printed its pass marker and
//! `mpirun` exited with 0. Ranks run with `--oversubscribe --bind-to none` (CI machines have
//! fewer cores than ranks), `--allow-run-as-root` when run as root, and `--tag-output`, whose
//! `[1,R]<stdout>:` prefixes attribute each line to its rank.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set (to `1`) in the environment of the ranks a test starts.
pub const CHILD_ENV: &str = "EMBER_TEST_RANK_CHILD";
/// The line a rank prints when its body returned `Ok`.
pub const PASS_MARKER: &str = "ember-testing: rank passed";
/// The line a rank prints (followed by the error) when its body failed.
pub const FAIL_MARKER: &str = "ember-testing: rank failed:";

/// `true` inside a rank started by [`run_ranks`].
pub fn is_rank_process() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// What to start: `n` ranks of the test `test_name`, with extra environment, bounded by
/// `timeout`.
#[derive(Clone, Debug)]
pub struct RunRanks {
    /// Number of ranks.
    pub n: usize,
    /// The test's path as `--exact` takes it.
    pub test_name: String,
    /// Extra variables for every rank.
    pub env: Vec<(String, String)>,
    /// How long the whole job may take before it is ended (default 120 s).
    pub timeout: Duration,
}

impl RunRanks {
    /// `n` ranks of `test_name`, no extra environment, a 120 s bound.
    pub fn new(n: usize, test_name: &str) -> RunRanks {
        RunRanks {
            n,
            test_name: test_name.to_string(),
            env: Vec::new(),
            timeout: Duration::from_secs(120),
        }
    }

    /// Adds an environment variable for every rank.
    pub fn env(mut self, key: &str, value: &str) -> RunRanks {
        self.env.push((key.to_string(), value.to_string()));
        self
    }
}

/// One rank's part of a [`RanksOutcome`].
#[derive(Clone, Debug, Default)]
pub struct RankOutcome {
    /// The rank.
    pub rank: usize,
    /// `Some(true)` if it printed [`PASS_MARKER`], `Some(false)` for [`FAIL_MARKER`], `None`
    /// if neither (it died or was ended first).
    pub passed: Option<bool>,
    /// Its output lines (stdout and stderr), without the tags.
    pub output: String,
}

/// What a job of ranks did.
#[derive(Clone, Debug, Default)]
pub struct RanksOutcome {
    /// `mpirun`'s exit code (`None` when it was ended by a signal or by the timeout).
    pub code: Option<i32>,
    /// `true` when the job was ended because it outlived [`RunRanks::timeout`].
    pub timed_out: bool,
    /// Each rank's outcome, by rank.
    pub ranks: Vec<RankOutcome>,
    /// Everything `mpirun` printed, tagged lines included.
    pub output: String,
}

impl RanksOutcome {
    /// `true` when `mpirun` exited with 0 and every rank passed.
    pub fn all_passed(&self) -> bool {
        self.code == Some(0) && self.ranks.iter().all(|r| r.passed == Some(true))
    }
}

/// The `mpirun` command line for `n` ranks of `program` (without the program): the flags
/// this crate uses wherever it starts ranks.
pub fn mpirun_command(n: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.arg("-n").arg(n.to_string());
    cmd.args(["--oversubscribe", "--bind-to", "none"]);
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--allow-run-as-root");
    }
    cmd
}

/// Starts the ranks of `test_name` (parent side) and collects their outcome; `Err` when
/// `mpirun` cannot be started.
pub fn run_ranks(n: usize, test_name: &str) -> Result<RanksOutcome, String> {
    run_ranks_with(&RunRanks::new(n, test_name))
}

/// [`run_ranks`] with every option.
pub fn run_ranks_with(opts: &RunRanks) -> Result<RanksOutcome, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the test binary: {e}"))?;
    let mut cmd = mpirun_command(opts.n);
    cmd.arg("--tag-output");
    cmd.args(["-x", CHILD_ENV]);
    for (k, _) in &opts.env {
        cmd.args(["-x", k]);
    }
    cmd.arg(&exe).args([
        "--exact",
        &opts.test_name,
        "--nocapture",
        "--test-threads=1",
    ]);
    // The ranks take their world from MPI; variables of an enclosing launcher would
    // contradict it.
    for k in crate::launch::TORCHRUN_VARS {
        cmd.env_remove(k);
    }
    cmd.env(CHILD_ENV, "1");
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start mpirun (install openmpi-bin): {e}"))?;
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut r| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            s.push_str(&String::from_utf8_lossy(&buf));
            s
        })
    })
    .collect();
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() > opts.timeout => {
                timed_out = true;
                crate::launch::terminate_all([&mut child], Duration::from_secs(3));
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break None,
        }
    };
    let output: String = readers
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("");
    let code = if timed_out {
        None
    } else {
        status.and_then(|s| s.code())
    };
    Ok(RanksOutcome {
        code,
        timed_out,
        ranks: split_ranks(&output, opts.n),
        output,
    })
}

/// Splits `--tag-output` lines (`[JOB,RANK]<stdout>:text`) by rank, each rank's lines whole
/// again (see Note [Tagged output comes in chunks]).
fn split_ranks(output: &str, n: usize) -> Vec<RankOutcome> {
    let mut ranks: Vec<RankOutcome> = (0..n)
        .map(|rank| RankOutcome {
            rank,
            ..RankOutcome::default()
        })
        .collect();
    for (rank, text) in crate::tagged::rank_lines(output) {
        let Some(r) = rank.and_then(|rank| ranks.get_mut(rank)) else {
            continue;
        };
        if text.contains(PASS_MARKER) {
            r.passed.get_or_insert(true);
        } else if text.contains(FAIL_MARKER) {
            r.passed = Some(false);
        }
        r.output.push_str(&text);
        r.output.push('\n');
    }
    ranks
}

/// In a test: runs `body` when this process is one of the ranks (printing the pass or fail
/// marker), otherwise starts `n` ranks of `test_name` and panics with every rank's output
/// unless all passed.
pub fn ranks<E: std::fmt::Display>(
    n: usize,
    test_name: &str,
    body: impl FnOnce() -> Result<(), E>,
) {
    if let Some(out) = in_ranks(&RunRanks::new(n, test_name), body) {
        assert!(out.all_passed(), "{}", report(test_name, &out));
    }
}

/// The two roles of a test that checks the outcome itself (a rank that is meant to fail or
/// die): in a rank, runs `body` and returns `None`; in the parent, starts the ranks and
/// returns their outcome (panicking only if `mpirun` cannot start).
pub fn in_ranks<E: std::fmt::Display>(
    opts: &RunRanks,
    body: impl FnOnce() -> Result<(), E>,
) -> Option<RanksOutcome> {
    if is_rank_process() {
        rank_body(body);
        return None;
    }
    Some(run_ranks_with(opts).unwrap_or_else(|e| panic!("{e}")))
}

/// Runs a rank's body and prints its marker; panics (failing the rank) on an error.
pub fn rank_body<E: std::fmt::Display>(body: impl FnOnce() -> Result<(), E>) {
    match body() {
        Ok(()) => println!("\n{PASS_MARKER}"),
        Err(e) => {
            println!("\n{FAIL_MARKER} {e}");
            panic!("rank failed: {e}");
        }
    }
}

/// A readable account of a job: the exit, then each rank's output.
pub fn report(test_name: &str, out: &RanksOutcome) -> String {
    let mut s = format!(
        "{test_name} on {} ranks: mpirun {}\n",
        out.ranks.len(),
        match (out.timed_out, out.code) {
            (true, _) => "was ended after the timeout".to_string(),
            (false, Some(c)) => format!("exited with {c}"),
            (false, None) => "was ended by a signal".to_string(),
        }
    );
    for r in &out.ranks {
        s.push_str(&format!(
            "--- rank {} ({}):\n{}",
            r.rank,
            match r.passed {
                Some(true) => "passed",
                Some(false) => "failed",
                None => "no verdict",
            },
            r.output
        ));
    }
    let untagged: Vec<String> = crate::tagged::rank_lines(&out.output)
        .into_iter()
        .filter_map(|(rank, text)| rank.is_none().then_some(text))
        .collect();
    if !untagged.is_empty() {
        s.push_str("--- mpirun:\n");
        s.push_str(&untagged.join("\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_lines_are_split_by_rank() {
        let out = format!(
            "[1,0]<stdout>:hello\n[1,1]<stderr>:oops\n[1,1]<stdout>:{FAIL_MARKER} bad\n[1,0]<stdout>:{PASS_MARKER}\nmpirun noise\n"
        );
        let r = split_ranks(&out, 2);
        assert_eq!(r[0].passed, Some(true));
        assert_eq!(r[1].passed, Some(false));
        assert!(r[0].output.starts_with("hello\n"));
        assert!(r[1].output.contains("oops"));
        // An unfinished line of rank 1 continued by rank 0's marker.
        let glued = format!("[1,1]<stdout>:test x ... [1,0]<stdout>:{PASS_MARKER}\n");
        let r = split_ranks(&glued, 2);
        assert_eq!((r[0].passed, r[1].passed), (Some(true), None));
    }
}
