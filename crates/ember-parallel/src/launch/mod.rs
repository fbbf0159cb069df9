//! `ember launch`: starts the ranks of a program on each node as torchrun does, each with
//! torchrun's variables (`RANK = node_rank · nproc_per_node + LOCAL_RANK`, `WORLD_SIZE =
//! nnodes · nproc_per_node`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
//! `GROUP_WORLD_SIZE`, `ROLE_RANK`, `ROLE_WORLD_SIZE`, `ROLE_NAME`, `MASTER_ADDR`,
//! `MASTER_PORT`, `TORCHELASTIC_RESTART_COUNT`, `TORCHELASTIC_MAX_RESTARTS`,
//! `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_USE_AGENT_STORE`), prefixes their output lines with
//! `[rankR]:`, and when a rank fails ends the others (on every node) and exits with the
//! failing rank's code after a summary of who failed and how, or restarts them all
//! (`--max-restarts`).
//!
//! Note [Agent store]: as torchrun's static rendezvous, the launcher of node 0 serves the
//! job's [`TcpStore`](crate::store::TcpStore) on `--master-port` of every interface, and the
//! launchers of the other nodes connect to it at `--master-addr` (retrying until the join
//! timeout). The ranks are clients of the same store (`TORCHELASTIC_USE_AGENT_STORE=True`),
//! their keys under `/worker/attempt_N/` (N = `TORCHELASTIC_RESTART_COUNT`), so no rank
//! serves it and a restarted attempt never reads the keys of the one before; so a rank
//! (rank 0 included) may die without taking the store with it. The launchers' own keys are
//! under `/agent/`: node 0 publishes the job's `--rdzv-id` (another job on the port is an
//! error), and every attempt starts with a barrier of the nodes (Note [Rendezvous
//! barriers]), which names the nodes that never came within the join timeout.
//!
//! Note [Restarts]: each launcher watches its ranks, and polls the store for a failure
//! reported by another node. The first failure of an attempt (a rank exiting with non-zero
//! or killed by a signal) is recorded on the store; every launcher then ends its ranks
//! (SIGTERM, SIGKILL after a grace period). With restarts left (`--max-restarts M`, as
//! torchrun's elastic agent) every node starts all its ranks again as attempt N + 1, with
//! `TORCHELASTIC_RESTART_COUNT=N+1`; a program that saves checkpoints and resumes from them
//! (`ember train --save P --resume P`) then continues where it stopped. Otherwise every
//! launcher prints which rank failed, on which node and how, and exits with that rank's
//! code (128 + the signal for a signal). A launcher that loses the store (node 0's launcher
//! died) ends its ranks and fails saying so. When every node's ranks succeeded, node 0
//! waits for the others to leave before it stops serving the store.
//!
//! Note [Launch through mpirun]: processes that call `MPI_Init` on their own become MPI
//! singletons, and Open MPI (4.1) cannot join singletons into one world; only ranks started
//! by `mpirun` share `MPI_COMM_WORLD`. So when `mpirun` is on the `PATH`,
//! `launch` starts the ranks as `mpirun -n N sh -c SHIM PROGRAM ARGS...`: the shim (a few
//! lines of `sh`) turns Open MPI's `OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}` into
//! torchrun's variables, runs the program as its child (a child of an `mpirun` rank joins
//! the world, being in its environment) and records its exit status in a report file;
//! `mpirun --tag-output` attributes each output line to its rank, which `launch` rewrites
//! as `[rankR]:`. `mpirun` ends the other ranks (each rank is a process group, signalled as
//! one) when one fails. Across nodes, node 0's `mpirun` runs every node's ranks, the other
//! launchers serving as its remote shell (Note [mpirun across nodes] in `relay.rs`).
//! Without `mpirun` the launcher starts the processes itself (the `nccl` backend and
//! programs without collectives need nothing else). `init_process_group(Backend::Mpi,
//! InitMethod::Env)` checks that the variables match MPI's world.

mod agent;
mod output;
mod relay;
mod workers;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use ember_autograd::{ErrorKind, Result};

use crate::error::dist_error;
use crate::group::{AGENT_STORE_ENV, RESTART_COUNT_ENV};
use agent::{Agent, Failure};
pub(crate) use workers::terminate_all;
use workers::{Poll, Spec, Workers};

/// The variables torchrun sets for each rank, which `launch` sets too.
pub const TORCHRUN_VARS: [&str; 15] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    RESTART_COUNT_ENV,
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    AGENT_STORE_ENV,
];

/// torchrun's default join timeout of the rendezvous (`--rdzv-conf join_timeout=600`).
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(600);

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
    /// Nodes in the job, one `ember launch` each (default 1).
    pub nnodes: usize,
    /// This node's rank, `0..nnodes` (default 0); node 0 serves the store (Note [Agent
    /// store]).
    pub node_rank: usize,
    /// `MASTER_ADDR`: node 0's address (default `127.0.0.1`).
    pub master_addr: String,
    /// `MASTER_PORT`: the store's port on node 0 (default 29500, torchrun's; 0 picks a
    /// free one on a single node).
    pub master_port: u16,
    /// Times every rank is started again after a failure (Note [Restarts]; default 0).
    pub max_restarts: u32,
    /// The job's id (`--rdzv-id`, `TORCHELASTIC_RUN_ID`; default `none`, as torchrun's).
    pub run_id: String,
    /// How long the nodes wait for each other at a rendezvous (default 600 s).
    pub join_timeout: Duration,
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
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            max_restarts: 0,
            run_id: "none".into(),
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            program,
            spawner: None,
            env: Vec::new(),
        }
    }

    /// Sets `master_addr` and `master_port` from torchrun's `--rdzv-endpoint HOST:PORT`
    /// (`HOST` alone keeps the port; `[v6]:PORT` for an IPv6 address).
    pub fn set_rdzv_endpoint(&mut self, endpoint: &str) -> Result<()> {
        let bad = || {
            launch_error(format!(
                "--rdzv-endpoint {endpoint:?} is not HOST:PORT (a host name or address and a port number)"
            ))
        };
        let (host, port) = match endpoint.rsplit_once(':') {
            // A bare IPv6 address has colons of its own: a port needs `[v6]:PORT`.
            Some((h, p)) if !h.ends_with(':') && (!h.contains(':') || h.starts_with('[')) => {
                (h, Some(p.parse::<u16>().map_err(|_| bad())?))
            }
            _ => (endpoint, None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad());
        }
        self.master_addr = host.to_string();
        if let Some(p) = port {
            self.master_port = p;
        }
        Ok(())
    }

    /// Applies torchrun's `--rdzv-conf KEY=VALUE,...`: `join_timeout` (seconds) is the one
    /// key taken; another is an error naming it.
    pub fn set_rdzv_conf(&mut self, conf: &str) -> Result<()> {
        for kv in conf.split(',').filter(|kv| !kv.trim().is_empty()) {
            match kv.split_once('=') {
                Some(("join_timeout", v)) => {
                    let secs: f64 = v
                        .trim()
                        .parse()
                        .ok()
                        .filter(|s: &f64| *s > 0.0)
                        .ok_or_else(|| {
                            launch_error(format!(
                                "--rdzv-conf join_timeout={v:?} is not a positive number of seconds"
                            ))
                        })?;
                    self.join_timeout = Duration::from_secs_f64(secs);
                }
                _ => {
                    return Err(launch_error(format!(
                        "--rdzv-conf {kv:?}: expected join_timeout=SECONDS (the one key ember launch takes)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// `WORLD_SIZE`: ranks in all.
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
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
    /// The first rank that failed in the last attempt and how, if any.
    pub failed: Option<(usize, RankExit)>,
    /// The node of the failed rank and its local rank.
    pub failed_at: Option<(usize, usize)>,
    /// How many times the ranks were started again (Note [Restarts]).
    pub restarts: u32,
}

impl LaunchOutcome {
    /// The one-line summary printed on failure (`None` when every rank succeeded); `world`
    /// is the number of ranks in all, `nnodes` the number of nodes.
    pub fn summary(&self, world: usize, nnodes: usize) -> Option<String> {
        let (rank, exit) = self.failed?;
        let others = match world.saturating_sub(1) {
            0 => String::new(),
            1 => "; the other rank was ended".to_string(),
            n => format!("; the other {n} ranks were ended"),
        };
        let at = match self.failed_at {
            Some((node, local)) if nnodes > 1 => format!(" (node {node}, local_rank {local})"),
            Some((_, local)) => format!(" (local_rank {local})"),
            None => String::new(),
        };
        let restarts = match self.restarts {
            0 => String::new(),
            1 => " after 1 restart".to_string(),
            n => format!(" after {n} restarts"),
        };
        Some(format!(
            "ember launch: rank {rank}{at} failed with {exit}{others}{restarts}"
        ))
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

fn check(opts: &LaunchOptions) -> Result<()> {
    if opts.nproc_per_node == 0 {
        return Err(launch_error("--nproc-per-node must be at least 1"));
    }
    if opts.nnodes == 0 {
        return Err(launch_error("--nnodes must be at least 1"));
    }
    if opts.node_rank >= opts.nnodes {
        return Err(launch_error(format!(
            "--node-rank {} is not a node of --nnodes {} (expected 0..{})",
            opts.node_rank, opts.nnodes, opts.nnodes
        )));
    }
    if opts.nnodes > 1 && opts.master_port == 0 {
        return Err(launch_error(
            "--master-port 0 (a free port) works on one node only: the other nodes must know node 0's port",
        ));
    }
    if opts.program.is_empty() {
        return Err(launch_error(
            "no program to launch: ember launch --nproc-per-node N -- PROGRAM ARGS...",
        ));
    }
    Ok(())
}

/// The environment of every rank of this node in `attempt` (the per-rank variables aside).
fn common_env(opts: &LaunchOptions, port: u16, attempt: u32) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = opts.env.clone();
    let vars = [
        ("WORLD_SIZE", opts.world_size().to_string()),
        ("LOCAL_WORLD_SIZE", opts.nproc_per_node.to_string()),
        ("GROUP_RANK", opts.node_rank.to_string()),
        ("GROUP_WORLD_SIZE", opts.nnodes.to_string()),
        ("ROLE_WORLD_SIZE", opts.world_size().to_string()),
        ("ROLE_NAME", "default".to_string()),
        ("MASTER_ADDR", opts.master_addr.clone()),
        ("MASTER_PORT", port.to_string()),
        (RESTART_COUNT_ENV, attempt.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", opts.max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", opts.run_id.clone()),
        (AGENT_STORE_ENV, "True".to_string()),
    ];
    env.extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
    env
}

/// How one attempt ended on this node.
enum Attempt {
    Succeeded,
    Failed(Failure),
}

/// Runs the ranks of this node to the end, restarting them all after a failure while
/// restarts are left (Note [Restarts]); output goes to this process's stdout and stderr,
/// prefixed. Prints the summary on failure; the caller exits with
/// [`LaunchOutcome::code`].
pub fn launch(opts: &LaunchOptions) -> Result<LaunchOutcome> {
    check(opts)?;
    let spawner = opts.spawner.unwrap_or(if mpirun_available() {
        Spawner::Mpirun
    } else {
        Spawner::Direct
    });
    // Across nodes, one mpirun of node 0 runs every rank (Note [mpirun across nodes]).
    let relayed = spawner == Spawner::Mpirun && opts.nnodes > 1;
    let agent = Agent::start(opts)?;
    let port = agent.port();
    let mut attempt = 0u32;
    loop {
        agent.rendezvous(attempt)?;
        let mut spec = Spec {
            program: &opts.program,
            common: common_env(opts, port, attempt),
            nproc: opts.nproc_per_node,
            first_rank: opts.node_rank * opts.nproc_per_node,
            local_size: opts.nproc_per_node,
            mpirun_args: Vec::new(),
        };
        let mut relay = None;
        let role = match (spawner, relayed, opts.node_rank) {
            (Spawner::Direct, ..) => Role::Ranks(Workers::start_direct(&spec)?, Part::Own),
            (Spawner::Mpirun, false, _) => Role::Ranks(Workers::start_mpirun(&spec)?, Part::Own),
            (Spawner::Mpirun, true, 0) => {
                let r = relay::Relay::start(port, attempt, opts.join_timeout)?;
                let vars: Vec<OsString> = spec.common.iter().map(|(k, _)| k.clone()).collect();
                spec.mpirun_args = r.mpirun_args(opts, &vars);
                spec.common
                    .push(("EMBER_LAUNCH_SPOOL".into(), r.spool().into_os_string()));
                spec.nproc = opts.world_size();
                spec.first_rank = 0;
                relay = Some(r);
                let w = Workers::start_mpirun(&spec)?;
                if let Some(dir) = w.reports() {
                    agent.set_reports_dir(attempt, dir)?;
                }
                Role::Ranks(w, Part::Relayed)
            }
            (Spawner::Mpirun, true, _) => match agent.orted_command(attempt)? {
                Some(cmd) => {
                    let reports = agent.reports_dir(attempt)?;
                    Role::Ranks(Workers::start_orted(&cmd, &spec)?, Part::Orted(reports))
                }
                None => Role::Gone,
            },
        };
        let ended = match role {
            Role::Ranks(w, part) => {
                let (w, ended) = watch(opts, &agent, attempt, w, &part);
                // The relay answers the agents still waiting, so that mpirun's children
                // holding its output close it and the output threads end.
                drop(relay.take());
                w.stop();
                ended
            }
            Role::Gone => agent
                .failure(attempt)
                .and_then(|f| f.ok_or_else(|| launch_error("the attempt ended without a report")))
                .map(Attempt::Failed),
        };
        drop(relay);
        let failure = match ended? {
            Attempt::Succeeded => {
                agent.leave()?;
                return Ok(LaunchOutcome {
                    code: 0,
                    failed: None,
                    failed_at: None,
                    restarts: attempt,
                });
            }
            Attempt::Failed(f) => f,
        };
        if attempt < opts.max_restarts {
            attempt += 1;
            eprintln!(
                "ember launch: {}; restarting every rank (restart {attempt} of {})",
                describe(&failure, opts),
                opts.max_restarts
            );
            continue;
        }
        let out = LaunchOutcome {
            code: failure.code,
            failed: failure.rank.map(|r| (r, failure.exit)),
            failed_at: failure.local_rank.map(|l| (failure.node, l)),
            restarts: attempt,
        };
        match out.summary(opts.world_size(), opts.nnodes) {
            Some(s) => eprintln!("{s}"),
            None => eprintln!("ember launch: {}", describe(&failure, opts)),
        }
        let _ = agent.leave();
        return Ok(out);
    }
}

/// What this node's launcher runs in an attempt.
enum Role {
    /// Workers: ranks, or `mpirun`'s daemon.
    Ranks(Workers, Part),
    /// Nothing: the attempt failed before this node's part started.
    Gone,
}

/// What the workers of a node are (Note [mpirun across nodes]).
enum Part {
    /// This node's ranks.
    Own,
    /// Node 0's `mpirun` of every node's ranks; the other nodes forward their ranks'
    /// reports through the store.
    Relayed,
    /// `mpirun`'s daemon, whose ranks report to this directory.
    Orted(PathBuf),
}

/// "rank 3 (node 1, local_rank 1) failed with signal 9".
fn describe(f: &Failure, opts: &LaunchOptions) -> String {
    let who = match (f.rank, f.local_rank) {
        (Some(r), Some(l)) if opts.nnodes > 1 => {
            format!("rank {r} (node {}, local_rank {l})", f.node)
        }
        (Some(r), Some(l)) => format!("rank {r} (local_rank {l})"),
        _ if opts.nnodes > 1 => format!("a rank of node {}", f.node),
        _ => "a rank".to_string(),
    };
    format!("{who} failed with {}", f.exit)
}

/// Watches the ranks of `attempt` until they all succeed here and on every node, or one
/// fails here or elsewhere. With `Part::Orted` the workers are `mpirun`'s daemon, whose
/// exit is handed back to node 0 at once (its ranks' reports first), and whose failure
/// node 0 reports (it knows the rank).
fn watch(
    opts: &LaunchOptions,
    agent: &Agent,
    attempt: u32,
    mut workers: Workers,
    part: &Part,
) -> (Workers, Result<Attempt>) {
    let orted = matches!(part, Part::Orted(_));
    let mut last_check = std::time::Instant::now();
    let mut succeeded_here = false;
    let mut orted_failed: Option<(std::time::Instant, i32)> = None;
    loop {
        if !succeeded_here && orted_failed.is_none() {
            let polled = workers.poll();
            if let Part::Orted(reports) = part
                && polled != Poll::Running
            {
                let code = match polled {
                    Poll::Failed(_, c) => c,
                    _ => 0,
                };
                let handed = agent
                    .forward_reports(attempt, reports, opts.world_size())
                    .and_then(|()| agent.orted_exit(attempt, code));
                if let Err(e) = handed {
                    return (workers, Err(e));
                }
            }
            let polled = match (part, polled) {
                (Part::Relayed, Poll::Failed(None, code)) => {
                    match remote_failure(agent, attempt, opts) {
                        Some(w) => Poll::Failed(Some(w), w.2.code()),
                        None => Poll::Failed(None, code),
                    }
                }
                (_, p) => p,
            };
            match polled {
                Poll::Running => {}
                Poll::Succeeded => {
                    succeeded_here = true;
                    if let Err(e) = agent.succeeded(attempt) {
                        return (workers, Err(e));
                    }
                }
                Poll::Failed(_, code) if orted => {
                    orted_failed = Some((std::time::Instant::now(), code));
                }
                Poll::Failed(who, code) => {
                    let local = Failure {
                        rank: who.map(|w| w.0),
                        node: who.map_or(opts.node_rank, |w| w.0 / opts.nproc_per_node),
                        local_rank: who.map(|w| w.1),
                        exit: who.map_or(RankExit::Code(code), |w| w.2),
                        code,
                    };
                    return (workers, agent.report(attempt, &local).map(Attempt::Failed));
                }
            }
        }
        // A daemon that failed: node 0 reports which rank, else this node does.
        if let Some((at, code)) = orted_failed
            && at.elapsed() > Duration::from_secs(10)
        {
            let f = Failure {
                rank: None,
                node: opts.node_rank,
                local_rank: None,
                exit: RankExit::Code(code),
                code,
            };
            return (workers, agent.report(attempt, &f).map(Attempt::Failed));
        }
        // The store is asked every 100 ms; this node's ranks every 10 ms.
        if opts.nnodes > 1 && last_check.elapsed() >= Duration::from_millis(100) {
            last_check = std::time::Instant::now();
            match agent.failure(attempt) {
                Ok(Some(f)) => return (workers, Ok(Attempt::Failed(f))),
                Ok(None) => {}
                Err(e) => return (workers, Err(e)),
            }
        }
        if succeeded_here {
            match agent.all_succeeded(attempt) {
                Ok(true) => return (workers, Ok(Attempt::Succeeded)),
                Ok(false) => {}
                Err(e) => return (workers, Err(e)),
            }
            std::thread::sleep(Duration::from_millis(50));
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The first failed rank among the reports other nodes forward after node 0's `mpirun`
/// ended without a report of its own ranks (Note [mpirun across nodes]): they come when
/// those nodes see their daemons end, so they are awaited a few seconds.
fn remote_failure(
    agent: &Agent,
    attempt: u32,
    opts: &LaunchOptions,
) -> Option<(usize, usize, RankExit)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let first = workers::first_failed(
            |rank| agent.rank_report(attempt, rank),
            0..opts.world_size(),
        );
        if let Some((rank, exit)) = first {
            return Some((rank, rank % opts.nproc_per_node, exit));
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_rank_node_and_exit() {
        let mut o = LaunchOutcome {
            code: 137,
            failed: Some((1, RankExit::Signal(9))),
            failed_at: Some((0, 1)),
            restarts: 0,
        };
        assert_eq!(
            o.summary(3, 1).unwrap(),
            "ember launch: rank 1 (local_rank 1) failed with signal 9; the other 2 ranks were ended"
        );
        o.failed = Some((3, RankExit::Code(7)));
        o.failed_at = Some((1, 1));
        o.restarts = 1;
        assert_eq!(
            o.summary(4, 2).unwrap(),
            "ember launch: rank 3 (node 1, local_rank 1) failed with exit code 7; the other 3 ranks were ended after 1 restart"
        );
        assert_eq!(RankExit::Signal(9).code(), 137);
    }

    #[test]
    fn rdzv_endpoints_and_bad_options() {
        let mut o = LaunchOptions::new(2, vec!["prog".into()]);
        o.set_rdzv_endpoint("node0.example:29400").unwrap();
        assert_eq!(
            (o.master_addr.as_str(), o.master_port),
            ("node0.example", 29400)
        );
        o.set_rdzv_endpoint("10.0.0.5").unwrap();
        assert_eq!((o.master_addr.as_str(), o.master_port), ("10.0.0.5", 29400));
        o.set_rdzv_endpoint("[fd00::2]:1234").unwrap();
        assert_eq!((o.master_addr.as_str(), o.master_port), ("fd00::2", 1234));
        assert!(o.set_rdzv_endpoint("host:port").is_err());
        assert!(o.set_rdzv_endpoint(":29400").is_err());
        o.set_rdzv_conf("join_timeout=2.5").unwrap();
        assert_eq!(o.join_timeout, Duration::from_millis(2500));
        assert!(o.set_rdzv_conf("read_timeout=5").is_err());
        assert!(o.set_rdzv_conf("join_timeout=-1").is_err());
        o.nnodes = 2;
        o.node_rank = 2;
        let e = check(&o).unwrap_err();
        assert!(
            e.to_string()
                .contains("--node-rank 2 is not a node of --nnodes 2"),
            "{e}"
        );
        o.node_rank = 1;
        o.master_port = 0;
        assert!(
            check(&o)
                .unwrap_err()
                .to_string()
                .contains("--master-port 0")
        );
    }
}
