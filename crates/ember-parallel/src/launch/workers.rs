//! One attempt's ranks on this node: started by the launcher itself or under `mpirun`
//! (Note [Launch through mpirun]), watched, and ended.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ember_autograd::Result;

use super::output::{Line, prefixer, printer, pump, retagger};
use super::{RankExit, launch_error};

/// How long ranks get between SIGTERM and SIGKILL when the launcher ends them.
const GRACE: Duration = Duration::from_secs(3);
/// How long the output of ended ranks may take to reach its end.
const DRAIN: Duration = Duration::from_secs(2);

/// What one attempt's ranks on this node run with.
pub(super) struct Spec<'a> {
    pub(super) program: &'a [OsString],
    /// The environment every rank of this node gets (torchrun's variables but the
    /// per-rank ones, and the user's extra variables).
    pub(super) common: Vec<(OsString, OsString)>,
    /// Ranks these workers are (this node's; every node's for the `mpirun` of node 0 across
    /// nodes, Note [mpirun across nodes]).
    pub(super) nproc: usize,
    /// The global rank of the first of them.
    pub(super) first_rank: usize,
    /// Ranks per node (`LOCAL_WORLD_SIZE`).
    pub(super) local_size: usize,
    /// More arguments for `mpirun` (the hosts and the agent across nodes).
    pub(super) mpirun_args: Vec<OsString>,
}

/// How the ranks of an attempt are doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Poll {
    /// Some are still running, none failed.
    Running,
    /// All exited with 0.
    Succeeded,
    /// One failed: its global and local rank and how, when known (`mpirun` may end without
    /// a rank's report), and the code to exit with.
    Failed(Option<(usize, usize, RankExit)>, i32),
}

enum Kind {
    Direct(BTreeMap<usize, Child>),
    Mpirun {
        child: Child,
        reports: PathBuf,
    },
    /// `mpirun`'s daemon on a node other than 0 (Note [mpirun across nodes]).
    Orted(Child),
}

/// The ranks of one attempt on this node, with the threads forwarding their output.
pub(super) struct Workers {
    kind: Kind,
    nproc: usize,
    first_rank: usize,
    local_size: usize,
    pumps: Vec<JoinHandle<()>>,
    printer: Option<JoinHandle<()>>,
}

fn exit_of(s: std::process::ExitStatus) -> RankExit {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => RankExit::Code(c),
        (None, Some(sig)) => RankExit::Signal(sig),
        (None, None) => RankExit::Code(1),
    }
}

/// Makes the child die (with `signal`) when the launcher dies.
fn die_with_launcher(cmd: &mut Command, signal: i32) {
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which
    // is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, signal);
            Ok(())
        });
    }
}

fn signal(child: &Child, sig: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill has no memory preconditions; `pid` is our own child, not yet reaped.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Ends `children`: SIGTERM to all, then SIGKILL to those still running after `grace`.
pub(crate) fn terminate_all<'a>(
    children: impl IntoIterator<Item = &'a mut Child>,
    grace: Duration,
) {
    let mut live: Vec<&mut Child> = children.into_iter().collect();
    live.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
    for c in &live {
        signal(c, libc::SIGTERM);
    }
    let start = Instant::now();
    while start.elapsed() < grace {
        live.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        if live.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in live {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Where the ranks under `mpirun` leave their exit reports (`rank<R>`: code and time).
pub(super) const REPORTS_ENV: &str = "EMBER_LAUNCH_REPORTS";

const SHIM: &str = r#"export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"
export ROLE_RANK="$RANK" ROLE_WORLD_SIZE="$WORLD_SIZE" GROUP_RANK=$(( RANK / LOCAL_WORLD_SIZE ))
"$0" "$@"
rc=$?
echo "$rc $(date +%s%N)" > "$EMBER_LAUNCH_REPORTS/rank$RANK"
exit $rc"#;

/// Threads forwarding `child`'s stdout and stderr to `tx`, each line through a map from
/// `map` (a retagger for `mpirun`, a prefixer otherwise).
fn pumps<M>(child: &mut Child, tx: &mpsc::Sender<Line>, map: impl Fn() -> M) -> Vec<JoinHandle<()>>
where
    M: FnMut(Option<&str>) -> Vec<String> + Send + 'static,
{
    let mut v = Vec::new();
    if let Some(o) = child.stdout.take() {
        v.push(pump(o, tx.clone(), false, map()));
    }
    if let Some(e) = child.stderr.take() {
        v.push(pump(e, tx.clone(), true, map()));
    }
    v
}

fn report_dir() -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "ember-launch-{}-{n}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl Workers {
    /// Starts the node's ranks as children of the launcher, each with its torchrun
    /// variables.
    pub(super) fn start_direct(spec: &Spec<'_>) -> Result<Workers> {
        let (tx, rx) = mpsc::channel::<Line>();
        let mut children = BTreeMap::new();
        let mut pumps = Vec::new();
        for local in 0..spec.nproc {
            let rank = spec.first_rank + local;
            let mut cmd = Command::new(&spec.program[0]);
            cmd.args(&spec.program[1..])
                .envs(spec.common.iter().map(|(k, v)| (k, v)))
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", local.to_string())
                .env("ROLE_RANK", rank.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // The rank dies with the launcher.
            die_with_launcher(&mut cmd, libc::SIGKILL);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    terminate_all(children.values_mut(), Duration::from_secs(1));
                    return Err(launch_error(format!(
                        "cannot start {:?}: {e}",
                        spec.program[0]
                    )));
                }
            };
            let prefix = format!("[rank{rank}]:");
            pumps.extend(self::pumps(&mut child, &tx, || prefixer(prefix.clone())));
            children.insert(local, child);
        }
        Ok(Workers {
            kind: Kind::Direct(children),
            nproc: spec.nproc,
            first_rank: spec.first_rank,
            local_size: spec.local_size,
            pumps,
            printer: Some(printer(rx)),
        })
    }

    /// Starts the node's ranks under `mpirun` (Note [Launch through mpirun]).
    pub(super) fn start_mpirun(spec: &Spec<'_>) -> Result<Workers> {
        let reports = report_dir()?;
        let mut cmd = crate::testing::mpirun_command(spec.nproc);
        // Ranks that mpirun's daemons start on other nodes get only the variables named
        // with -x; their reports go to the same path (Note [mpirun across nodes]).
        cmd.arg("--tag-output")
            .args(&spec.mpirun_args)
            .args(["-x", REPORTS_ENV]);
        cmd.envs(spec.common.iter().map(|(k, v)| (k, v)))
            .env(REPORTS_ENV, &reports);
        cmd.args(["sh", "-c", SHIM]).args(spec.program);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // mpirun ends its ranks on SIGTERM.
        die_with_launcher(&mut cmd, libc::SIGTERM);
        let mut child = cmd
            .spawn()
            .map_err(|e| launch_error(format!("cannot start mpirun: {e}")))?;
        let (tx, rx) = mpsc::channel();
        let pumps = pumps(&mut child, &tx, retagger);
        Ok(Workers {
            kind: Kind::Mpirun { child, reports },
            nproc: spec.nproc,
            first_rank: spec.first_rank,
            local_size: spec.local_size,
            pumps,
            printer: Some(printer(rx)),
        })
    }

    /// Runs `mpirun`'s daemon command on this node (Note [mpirun across nodes]); its own
    /// output is printed as it is.
    pub(super) fn start_orted(command: &str, spec: &Spec<'_>) -> Result<Workers> {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", command])
            .envs(spec.common.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_launcher(&mut cmd, libc::SIGTERM);
        let mut child = cmd
            .spawn()
            .map_err(|e| launch_error(format!("cannot start mpirun's daemon: {e}")))?;
        let (tx, rx) = mpsc::channel();
        let pumps = pumps(&mut child, &tx, || prefixer(String::new()));
        Ok(Workers {
            kind: Kind::Orted(child),
            nproc: spec.nproc,
            first_rank: spec.first_rank,
            local_size: spec.local_size,
            pumps,
            printer: Some(printer(rx)),
        })
    }

    /// The directory the ranks under `mpirun` report to.
    pub(super) fn reports(&self) -> Option<&std::path::Path> {
        match &self.kind {
            Kind::Mpirun { reports, .. } => Some(reports),
            _ => None,
        }
    }

    /// How the ranks are doing; a failed rank is reported as soon as it is seen.
    pub(super) fn poll(&mut self) -> Poll {
        match &mut self.kind {
            Kind::Direct(children) => {
                let mut done = Vec::new();
                for (&local, c) in children.iter_mut() {
                    if let Ok(Some(s)) = c.try_wait() {
                        if !s.success() {
                            let exit = exit_of(s);
                            let rank = self.first_rank + local;
                            return Poll::Failed(Some((rank, local, exit)), exit.code());
                        }

                        done.push(local);
                    }
                }
                for local in done {
                    children.remove(&local);
                }
                if children.is_empty() {
                    Poll::Succeeded
                } else {
                    Poll::Running
                }
            }
            Kind::Mpirun { child, reports } => {
                let status = match child.try_wait() {
                    Ok(Some(s)) => s,
                    Ok(None) => return Poll::Running,
                    Err(_) => return Poll::Failed(None, 1),
                };
                let first = first_failed(
                    |rank| std::fs::read_to_string(reports.join(report_name(rank))).ok(),
                    self.first_rank..self.first_rank + self.nproc,
                );
                match (first, status.code()) {
                    (Some((rank, exit)), _) => {
                        Poll::Failed(Some((rank, rank % self.local_size, exit)), exit.code())
                    }
                    (None, Some(0)) => Poll::Succeeded,
                    (None, Some(c)) => Poll::Failed(None, c),
                    (None, None) => Poll::Failed(None, exit_of(status).code()),
                }
            }
            Kind::Orted(child) => match child.try_wait() {
                Ok(None) => Poll::Running,
                Ok(Some(s)) if s.success() => Poll::Succeeded,
                Ok(Some(s)) => Poll::Failed(None, exit_of(s).code()),
                Err(_) => Poll::Failed(None, 1),
            },
        }
    }

    /// Ends every rank still running (SIGTERM, then SIGKILL after a grace period) and waits
    /// for the output to be printed.
    pub(super) fn stop(mut self) {
        match &mut self.kind {
            Kind::Direct(children) => terminate_all(children.values_mut(), GRACE),
            Kind::Mpirun { child, reports } => {
                terminate_all([child], GRACE);
                let _ = std::fs::remove_dir_all(&*reports);
            }
            Kind::Orted(child) => terminate_all([child], GRACE),
        }
        // The output is printed to its end, but a process the ranks left behind may hold
        // their pipes open: its output is not waited for past DRAIN (the threads are left
        // to print it while the launcher lives).
        let deadline = Instant::now() + DRAIN;
        for p in self.pumps.drain(..).chain(self.printer.take()) {
            while !p.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if p.is_finished() {
                let _ = p.join();
            }
        }
    }
}

/// The file a rank's report has in the reports directory.
pub(super) fn report_name(rank: usize) -> String {
    format!("rank{rank}")
}

/// The first rank of `ranks` (by the time of its report, as `report` reads it) that failed
/// by itself under `mpirun`.
pub(super) fn first_failed(
    report: impl Fn(usize) -> Option<String>,
    ranks: std::ops::Range<usize>,
) -> Option<(usize, RankExit)> {
    let mut failed: Vec<(u128, usize, i32)> = Vec::new();
    for rank in ranks {
        let Some(s) = report(rank) else {
            continue;
        };
        let mut it = s.split_whitespace();
        let rc: i32 = it.next().and_then(|x| x.parse().ok()).unwrap_or(1);
        let t: u128 = it.next().and_then(|x| x.parse().ok()).unwrap_or(u128::MAX);
        if rc != 0 {
            failed.push((t, rank, rc));
        }
    }
    failed.sort();
    failed.first().map(|&(_, rank, rc)| {
        let exit = if rc > 128 {
            RankExit::Signal(rc - 128)
        } else {
            RankExit::Code(rc)
        };
        (rank, exit)
    })
}
