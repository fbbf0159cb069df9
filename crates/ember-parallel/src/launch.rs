//! `ember launch`: starts N ranks of a program as torchrun does, each with `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`, prefixes
//! their output lines with `[rankR]:`, and when a rank fails ends the others and exits with
//! the failing rank's code after a summary of who failed and how.
//!
//! Note [Launch through mpirun]: processes that call `MPI_Init` on their own become MPI
//! singletons, and Open MPI (4.1) cannot join singletons into one world; only ranks started
//! by `mpirun` share `MPI_COMM_WORLD`. So when `mpirun` is on the `PATH`, `launch` starts the
//! ranks as `mpirun -n N sh -c SHIM PROGRAM ARGS...`: the shim (a few lines of `sh`) turns
//! Open MPI's `OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}` into torchrun's variables,
//! runs the program as its child (a child of an `mpirun` rank joins the world, being in
//! its environment) and records its exit status in a report file; `mpirun --tag-output`
//! attributes each output line to its rank, which `launch` rewrites as `[rankR]:`. `mpirun`
//! ends the other ranks (each rank is a process group, signalled as one) when one fails.
//! Without `mpirun` the launcher starts the N processes itself (the `nccl` backend and
//! programs without collectives need nothing else). `init_process_group(Backend::Mpi,
//! InitMethod::Env)` checks that the variables match MPI's world.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ember_autograd::{ErrorKind, Result};

use crate::error::dist_error;

/// The variables torchrun sets for each rank, which `launch` sets too.
pub const TORCHRUN_VARS: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// How ranks are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spawner {
    /// Under `mpirun` (Note [Launch through mpirun]); the default when `mpirun` is found.
    Mpirun,
    /// As children of the launcher.
    Direct,
}

/// The settings of [`launch`] (`ember launch`'s flags).
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Ranks on this node.
    pub nproc_per_node: usize,
    /// `MASTER_ADDR` (default `127.0.0.1`).
    pub master_addr: String,
    /// `MASTER_PORT` (default 29500, torchrun's).
    pub master_port: u16,
    /// The program and its arguments.
    pub program: Vec<OsString>,
    /// How to start the ranks; `None` picks [`Spawner::Mpirun`] when `mpirun` is found.
    pub spawner: Option<Spawner>,
    /// Extra environment variables for every rank.
    pub env: Vec<(OsString, OsString)>,
}

impl LaunchOptions {
    /// `nproc_per_node` ranks of `program` with the default address and port.
    pub fn new(nproc_per_node: usize, program: Vec<OsString>) -> LaunchOptions {
        LaunchOptions {
            nproc_per_node,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            program,
            spawner: None,
            env: Vec::new(),
        }
    }
}

/// How one rank ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankExit {
    /// It exited with this code.
    Code(i32),
    /// It was ended by this signal.
    Signal(i32),
}

impl RankExit {
    /// The exit code a shell would report (128 + the signal for a signal).
    pub fn code(self) -> i32 {
        match self {
            RankExit::Code(c) => c,
            RankExit::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for RankExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankExit::Code(c) => write!(f, "exit code {c}"),
            RankExit::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// What a launch ended with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// The code `ember launch` exits with: 0, or the first failing rank's.
    pub code: i32,
    /// The first rank that failed and how, if any.
    pub failed: Option<(usize, RankExit)>,
}

impl LaunchOutcome {
    /// The one-line summary printed on failure (`None` when every rank succeeded).
    pub fn summary(&self, nproc: usize) -> Option<String> {
        self.failed.map(|(rank, exit)| {
            let others = match nproc.saturating_sub(1) {
                0 => String::new(),
                1 => "; the other rank was ended".to_string(),
                n => format!("; the other {n} ranks were ended"),
            };
            format!("ember launch: rank {rank} (local_rank {rank}) failed with {exit}{others}")
        })
    }
}

/// `true` if `mpirun` is on the `PATH`.
pub fn mpirun_available() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("mpirun").is_file()))
}

fn launch_error(msg: impl Into<String>) -> ember_autograd::Error {
    dist_error(ErrorKind::InvalidArgument, None, "ember launch", msg)
}

/// Runs the ranks to the end; output goes to this process's stdout and stderr, prefixed.
/// Prints the summary on failure; the caller exits with [`LaunchOutcome::code`].
pub fn launch(opts: &LaunchOptions) -> Result<LaunchOutcome> {
    if opts.nproc_per_node == 0 {
        return Err(launch_error("--nproc-per-node must be at least 1"));
    }
    if opts.program.is_empty() {
        return Err(launch_error(
            "no program to launch: ember launch --nproc-per-node N -- PROGRAM ARGS...",
        ));
    }
    let spawner = opts.spawner.unwrap_or(if mpirun_available() {
        Spawner::Mpirun
    } else {
        Spawner::Direct
    });
    let out = match spawner {
        Spawner::Mpirun => launch_mpirun(opts)?,
        Spawner::Direct => launch_direct(opts)?,
    };
    if let Some(s) = out.summary(opts.nproc_per_node) {
        eprintln!("{s}");
    }
    Ok(out)
}

/// One line of a rank's output, for the printer.
enum Line {
    Out(String),
    Err(String),
}

/// Forwards `r`'s lines to `tx`, each through `map`, which gives the lines to print for it
/// (`None`: the output ended).
fn pump<R: std::io::Read + Send + 'static>(
    r: R,
    tx: mpsc::Sender<Line>,
    is_err: bool,
    mut map: impl FnMut(Option<&str>) -> Vec<String> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let (lines, ended) = match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => (map(None), true),
                Ok(_) => {
                    let s = String::from_utf8_lossy(&buf);
                    (map(Some(s.trim_end_matches(['\n', '\r']))), false)
                }
            };
            for line in lines {
                let l = if is_err {
                    Line::Err(line)
                } else {
                    Line::Out(line)
                };
                if tx.send(l).is_err() {
                    return;
                }
            }
            if ended {
                return;
            }
        }
    })
}

/// Prints lines as they come, until every sender is gone.
fn printer(rx: mpsc::Receiver<Line>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for l in rx {
            match l {
                Line::Out(s) => {
                    let mut o = std::io::stdout().lock();
                    let _ = writeln!(o, "{s}");
                    let _ = o.flush();
                }
                Line::Err(s) => {
                    let _ = writeln!(std::io::stderr().lock(), "{s}");
                }
            }
        }
    })
}

/// A `pump` map that prints `[1,R]<stdout>:text` as `[rankR]:text`, each rank's lines whole
/// (see Note [Tagged output comes in chunks]); other lines (mpirun's own) unchanged.
fn retagger() -> impl FnMut(Option<&str>) -> Vec<String> {
    let mut lines = crate::tagged::TaggedLines::default();
    move |line| {
        let out = match line {
            Some(l) => lines.push(l),
            None => lines.finish(),
        };
        out.into_iter()
            .map(|(rank, text)| match rank {
                Some(r) => format!("[rank{r}]:{text}"),
                None => text,
            })
            .collect()
    }
}

const SHIM: &str = r#"export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"
"$0" "$@"
rc=$?
echo "$rc $(date +%s%N)" > "$EMBER_LAUNCH_REPORTS/rank$RANK"
exit $rc"#;

fn report_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "ember-launch-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn launch_mpirun(opts: &LaunchOptions) -> Result<LaunchOutcome> {
    let reports = report_dir()?;
    let mut cmd = crate::testing::mpirun_command(opts.nproc_per_node);
    cmd.arg("--tag-output");
    cmd.env("MASTER_ADDR", &opts.master_addr)
        .env("MASTER_PORT", opts.master_port.to_string())
        .env("EMBER_LAUNCH_REPORTS", &reports)
        .envs(opts.env.iter().map(|(k, v)| (k, v)));
    cmd.args(["sh", "-c", SHIM]).args(&opts.program);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| launch_error(format!("cannot start mpirun: {e}")))?;
    let (tx, rx) = mpsc::channel();
    let mut pumps = Vec::new();
    if let Some(o) = child.stdout.take() {
        pumps.push(pump(o, tx.clone(), false, retagger()));
    }
    if let Some(e) = child.stderr.take() {
        pumps.push(pump(e, tx.clone(), true, retagger()));
    }
    drop(tx);
    let print = printer(rx);
    let status = child.wait()?;
    for p in pumps {
        let _ = p.join();
    }
    let _ = print.join();
    // The first rank that failed by itself: the earliest non-zero report.
    let mut failed: Vec<(u128, usize, i32)> = Vec::new();
    for rank in 0..opts.nproc_per_node {
        let Ok(s) = std::fs::read_to_string(reports.join(format!("rank{rank}"))) else {
            continue;
        };
        let mut it = s.split_whitespace();
        let rc: i32 = it.next().and_then(|x| x.parse().ok()).unwrap_or(1);
        let t: u128 = it.next().and_then(|x| x.parse().ok()).unwrap_or(u128::MAX);
        if rc != 0 {
            failed.push((t, rank, rc));
        }
    }
    let _ = std::fs::remove_dir_all(&reports);
    failed.sort();
    let first = failed.first().map(|&(_, rank, rc)| {
        let exit = if rc > 128 {
            RankExit::Signal(rc - 128)
        } else {
            RankExit::Code(rc)
        };
        (rank, exit)
    });
    let code = match (first, status.code()) {
        (Some((_, exit)), _) => exit.code(),
        (None, Some(c)) => c,
        (None, None) => 1,
    };
    Ok(LaunchOutcome {
        code,
        failed: first,
    })
}

fn exit_of(s: std::process::ExitStatus) -> RankExit {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => RankExit::Code(c),
        (None, Some(sig)) => RankExit::Signal(sig),
        (None, None) => RankExit::Code(1),
    }
}

/// Ends `child`: SIGTERM, then SIGKILL after `grace`.
pub(crate) fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill has no memory preconditions; `pid` is our own child, not yet reaped.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
}

fn launch_direct(opts: &LaunchOptions) -> Result<LaunchOutcome> {
    let n = opts.nproc_per_node;
    let (tx, rx) = mpsc::channel();
    let mut children: BTreeMap<usize, Child> = BTreeMap::new();
    let mut pumps = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(&opts.program[0]);
        cmd.args(&opts.program[1..]);
        let vars = [
            rank.to_string(),
            n.to_string(),
            rank.to_string(),
            n.to_string(),
            opts.master_addr.clone(),
            opts.master_port.to_string(),
        ];
        cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
        for (k, v) in TORCHRUN_VARS.iter().zip(vars) {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and only calls prctl,
        // which is async-signal-safe: the rank dies with the launcher.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for c in children.values_mut() {
                    terminate(c, Duration::from_secs(1));
                }
                return Err(launch_error(format!(
                    "cannot start {:?}: {e}",
                    opts.program[0]
                )));
            }
        };
        let prefix = format!("[rank{rank}]:");
        if let Some(o) = child.stdout.take() {
            let p = prefix.clone();
            pumps.push(pump(o, tx.clone(), false, move |l| {
                l.map(|l| format!("{p}{l}")).into_iter().collect()
            }));
        }
        if let Some(e) = child.stderr.take() {
            pumps.push(pump(e, tx.clone(), true, move |l| {
                l.map(|l| format!("{prefix}{l}")).into_iter().collect()
            }));
        }
        children.insert(rank, child);
    }
    drop(tx);
    let print = printer(rx);
    let mut failed: Option<(usize, RankExit)> = None;
    while !children.is_empty() {
        let mut done = Vec::new();
        for (&rank, c) in children.iter_mut() {
            if let Ok(Some(s)) = c.try_wait() {
                done.push(rank);
                if !s.success() && failed.is_none() {
                    failed = Some((rank, exit_of(s)));
                }
            }
        }
        for r in done {
            children.remove(&r);
        }
        if failed.is_some() {
            for c in children.values_mut() {
                terminate(c, Duration::from_secs(3));
            }
            for c in children.values_mut() {
                let _ = c.wait();
            }
            children.clear();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in pumps {
        let _ = p.join();
    }
    let _ = print.join();
    Ok(LaunchOutcome {
        code: failed.map_or(0, |(_, e)| e.code()),
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpirun_tags_become_rank_prefixes() {
        let mut retag = retagger();
        assert_eq!(retag(Some("[1,0]<stdout>:hello")), ["[rank0]:hello"]);
        assert_eq!(retag(Some("[1,12]<stderr>:x: y")), ["[rank12]:x: y"]);
        assert_eq!(retag(Some("plain")), ["plain"]);
        // A chunk left unfinished waits for its rest (Note [Tagged output comes in chunks]).
        assert!(
            retag(Some("[1,0]<stdout>:{\"a\": 0.9[1,1]<stdout>:x"))
                .contains(&"[rank1]:x".to_string())
        );
        assert_eq!(retag(Some("[1,0]<stdout>:5}")), ["[rank0]:{\"a\": 0.95}"]);
        assert_eq!(retag(Some("[1,1]<stdout>:tail")), ["[rank1]:tail"]);
        assert_eq!(retag(None), Vec::<String>::new());
    }

    #[test]
    fn summary_names_rank_and_exit() {
        let o = LaunchOutcome {
            code: 137,
            failed: Some((1, RankExit::Signal(9))),
        };
        assert_eq!(
            o.summary(3).unwrap(),
            "ember launch: rank 1 (local_rank 1) failed with signal 9; the other 2 ranks were ended"
        );
        assert_eq!(RankExit::Signal(9).code(), 137);
    }
}
