//! `ember launch`'s logic (`ember_parallel::launch`): torchrun's variables on one node and
//! across two nodes (two launchers on loopback), the `[rankR]:` prefixes, a failing rank
//! ending the job on every node with its code and a summary, by both spawners, restarts
//! (`--max-restarts`), a node that never comes, and node 0's launcher dying; under mpirun,
//! `init_process_group(Mpi, Env)` forms the world.
//!
//! Each test plays several roles, chosen by `ROLE`: the test itself starts this binary as
//! the launcher of each node (to capture what the launcher prints), and the launcher starts
//! this binary's same test as each rank.
#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ember_parallel::launch::{self, LaunchOptions, Spawner};

const ROLE: &str = "EMBER_LAUNCH_TEST_ROLE";
const MODE: &str = "EMBER_LAUNCH_TEST_MODE";
const NODE: &str = "EMBER_LAUNCH_TEST_NODE";
const NNODES: &str = "EMBER_LAUNCH_TEST_NNODES";
const PORT: &str = "EMBER_LAUNCH_TEST_PORT";
const SPAWNER: &str = "EMBER_LAUNCH_TEST_SPAWNER";
const RESTARTS: &str = "EMBER_LAUNCH_TEST_RESTARTS";

fn self_test(name: &str) -> Vec<OsString> {
    let exe = std::env::current_exe().expect("the test binary");
    vec![
        exe.into(),
        "--exact".into(),
        name.into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
        "-q".into(),
    ]
}

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| "unset".into())
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What a rank does for `mode`.
fn rank(mode: &str) {
    println!(
        "hello from {}/{} local {}/{} group {}/{} master {}:{} attempt {} agent store {}",
        var("RANK"),
        var("WORLD_SIZE"),
        var("LOCAL_RANK"),
        var("LOCAL_WORLD_SIZE"),
        var("GROUP_RANK"),
        var("GROUP_WORLD_SIZE"),
        var("MASTER_ADDR"),
        var("MASTER_PORT"),
        var("TORCHELASTIC_RESTART_COUNT"),
        var("TORCHELASTIC_USE_AGENT_STORE"),
    );
    let last = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|w| w.parse::<usize>().ok())
        .map(|w| (w - 1).to_string());
    match mode {
        // The last rank gives up; the others would run on, and launch must end them.
        "fail" if Some(var("RANK")) == last => {
            eprintln!("rank {} gives up", var("RANK"));
            std::process::exit(7);
        }
        // The last rank leaves a process behind holding its output open, and gives up.
        "orphan" if Some(var("RANK")) == last => {
            let _ = std::process::Command::new("sleep").arg("40").spawn();
            std::process::exit(7);
        }
        // Rank 0 gives up at once (before any other rank may have started).
        "fail_first" if var("RANK") == "0" => std::process::exit(7),
        "fail" | "fail_first" | "orphan" | "sleep" => std::thread::sleep(Duration::from_secs(120)),
        // Rank 1 fails in the first attempt only.
        "flaky" if var("RANK") == "1" && var("TORCHELASTIC_RESTART_COUNT") == "0" => {
            std::process::exit(5);
        }
        "flaky" if var("TORCHELASTIC_RESTART_COUNT") == "0" => {
            std::thread::sleep(Duration::from_secs(120));
        }
        #[cfg(feature = "mpi")]
        "mpi" => {
            use ember_parallel::group::{self, Backend, InitMethod, ReduceOp};
            let pg = group::init_process_group(Backend::Mpi, InitMethod::Env).expect("init");
            let t = ember_autograd::Tensor::ones([2], ()).expect("tensor");
            pg.all_reduce(&t, ReduceOp::Sum).expect("all_reduce");
            println!(
                "sum {:?} world {}",
                t.to_vec::<f32>().expect("read"),
                pg.world_size()
            );
            group::destroy_process_group().expect("destroy");
        }
        _ => {}
    }
}

/// The launcher role: launches 2 ranks of this test on its node and exits with the code.
fn launcher(name: &str) {
    let mut opts = LaunchOptions::new(2, self_test(name));
    opts.master_port = var(PORT).parse().unwrap();
    opts.node_rank = var(NODE).parse().unwrap_or(0);
    opts.nnodes = var(NNODES).parse().unwrap_or(1);
    opts.max_restarts = var(RESTARTS).parse().unwrap_or(0);
    opts.join_timeout = Duration::from_secs(3);
    opts.run_id = "launch-test".into();
    opts.spawner = Some(if var(SPAWNER) == "mpirun" {
        Spawner::Mpirun
    } else {
        Spawner::Direct
    });
    opts.env.push((ROLE.into(), "rank".into()));
    match launch::launch(&opts) {
        Ok(out) => std::process::exit(out.code),
        Err(e) => {
            eprintln!("launcher error: {e}");
            std::process::exit(101);
        }
    }
}

/// Starts this binary as the launcher of node `node` of `nnodes`.
fn start_launcher(
    name: &str,
    mode: &str,
    spawner: Spawner,
    node: usize,
    nnodes: usize,
    port: u16,
    restarts: u32,
) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(self_test(name).into_iter().skip(1))
        .env(ROLE, "launcher")
        .env(MODE, mode)
        .env(NODE, node.to_string())
        .env(NNODES, nnodes.to_string())
        .env(PORT, port.to_string())
        .env(RESTARTS, restarts.to_string())
        .env(
            SPAWNER,
            if spawner == Spawner::Mpirun {
                "mpirun"
            } else {
                "direct"
            },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the launcher")
}

/// A finished launcher: its code, stdout and stderr.
struct Ran {
    code: i32,
    out: String,
    err: String,
}

fn finish(child: Child) -> Ran {
    let o = child.wait_with_output().unwrap();
    Ran {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// [`finish`], but a launcher still running after `secs` seconds is killed (and reported
/// with code -1), so a hang fails the test instead of stalling it.
fn finish_within(mut child: Child, secs: u64) -> Ran {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if let Ok(Some(_)) = child.try_wait() {
            return finish(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let mut r = finish(child);
    r.err
        .push_str(&format!("\n(killed: still running after {secs} s)"));
    r
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "code {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.out, self.err
        )
    }
}

/// Plays the rank and launcher roles; `None` in those, the test's body otherwise.
fn role(name: &str) -> Option<()> {
    let mode = var(MODE);
    match std::env::var(ROLE).as_deref() {
        Ok("rank") => {
            rank(&mode);
            None
        }
        Ok("launcher") => {
            launcher(name);
            None
        }
        _ => Some(()),
    }
}

/// One launcher of one node, to its end.
fn run_one(name: &str, mode: &str, spawner: Spawner, restarts: u32) -> Ran {
    finish(start_launcher(
        name,
        mode,
        spawner,
        0,
        1,
        free_port(),
        restarts,
    ))
}

fn check_hello(r: &Ran, world: usize, port: Option<u16>) {
    assert_eq!(r.code, 0, "{r}");
    for rank in 0..world {
        let (node, local) = (rank / 2, rank % 2);
        let want = format!(
            "[rank{rank}]:hello from {rank}/{world} local {local}/2 group {node}/{} master 127.0.0.1:",
            world / 2
        );
        let line = r
            .out
            .lines()
            .find(|l| l.starts_with(&want))
            .unwrap_or_else(|| panic!("no {want:?} in {r}"));
        assert!(line.ends_with(" attempt 0 agent store True"), "{line}");
        if let Some(p) = port {
            assert!(line.contains(&format!(":{p} ")), "{line}");
        }
    }
}

fn check_failure(r: &Ran, summary: &str) {
    assert_eq!(r.code, 7, "{r}");
    assert!(r.err.contains(summary), "no {summary:?} in {r}");
}

#[test]
fn direct_two_ranks_get_torchrun_variables() {
    if role("direct_two_ranks_get_torchrun_variables").is_some() {
        let r = run_one(
            "direct_two_ranks_get_torchrun_variables",
            "hello",
            Spawner::Direct,
            0,
        );
        check_hello(&r, 2, None);
    }
}

#[test]
fn direct_failing_rank_ends_the_others() {
    if role("direct_failing_rank_ends_the_others").is_some() {
        let r = run_one(
            "direct_failing_rank_ends_the_others",
            "fail",
            Spawner::Direct,
            0,
        );
        assert!(r.err.contains("[rank1]:rank 1 gives up"), "{r}");
        check_failure(
            &r,
            "ember launch: rank 1 (local_rank 1) failed with exit code 7; the other rank was ended",
        );
    }
}

/// A failed rank's leftover child keeps its output pipe open: the launcher still ends
/// within seconds (it does not wait for the end of that output).
#[test]
fn a_leftover_child_holding_output_does_not_hold_the_launcher() {
    const TEST: &str = "a_leftover_child_holding_output_does_not_hold_the_launcher";
    if role(TEST).is_some() {
        let start = Instant::now();
        let r = finish_within(
            start_launcher(TEST, "orphan", Spawner::Direct, 0, 1, free_port(), 0),
            35,
        );
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}\n{r}",
            start.elapsed()
        );
        check_failure(
            &r,
            "ember launch: rank 1 (local_rank 1) failed with exit code 7; the other rank was ended",
        );
    }
}

#[test]
fn a_restart_starts_every_rank_again_with_the_count() {
    const TEST: &str = "a_restart_starts_every_rank_again_with_the_count";
    if role(TEST).is_some() {
        let r = run_one(TEST, "flaky", Spawner::Direct, 1);
        assert_eq!(r.code, 0, "{r}");
        assert!(
            r.err.contains("ember launch: rank 1 (local_rank 1) failed with exit code 5; restarting every rank (restart 1 of 1)"),
            "{r}"
        );
        for rank in 0..2 {
            let want = format!("[rank{rank}]:hello from {rank}/2");
            let attempts: Vec<&str> = r
                .out
                .lines()
                .filter(|l| l.starts_with(&want))
                .filter_map(|l| l.split(" attempt ").nth(1))
                .collect();
            assert_eq!(attempts.len(), 2, "{r}");
            assert!(attempts[1].starts_with("1 "), "{r}");
        }
        // Out of restarts: the second failure ends the job.
        let r = run_one(TEST, "flaky", Spawner::Direct, 0);
        assert_eq!(r.code, 5, "{r}");
    }
}

#[test]
fn two_nodes_get_global_ranks() {
    const TEST: &str = "two_nodes_get_global_ranks";
    if role(TEST).is_some() {
        let port = free_port();
        let n1 = start_launcher(TEST, "hello", Spawner::Direct, 1, 2, port, 0);
        let n0 = start_launcher(TEST, "hello", Spawner::Direct, 0, 2, port, 0);
        let (r0, r1) = (finish(n0), finish(n1));
        let both = Ran {
            code: r0.code.max(r1.code),
            out: format!("{}{}", r0.out, r1.out),
            err: format!("{}{}", r0.err, r1.err),
        };
        check_hello(&both, 4, Some(port));
        // Each launcher prints its own node's ranks.
        assert!(
            r0.out.contains("[rank1]:") && !r0.out.contains("[rank2]:"),
            "{r0}"
        );
        assert!(
            r1.out.contains("[rank3]:") && !r1.out.contains("[rank0]:"),
            "{r1}"
        );
    }
}

#[test]
fn a_failure_on_one_node_ends_every_node() {
    const TEST: &str = "a_failure_on_one_node_ends_every_node";
    if role(TEST).is_some() {
        let port = free_port();
        let started = Instant::now();
        let n0 = start_launcher(TEST, "fail", Spawner::Direct, 0, 2, port, 0);
        let n1 = start_launcher(TEST, "fail", Spawner::Direct, 1, 2, port, 0);
        let (r0, r1) = (finish(n0), finish(n1));
        let summary = "ember launch: rank 3 (node 1, local_rank 1) failed with exit code 7; the other 3 ranks were ended";
        check_failure(&r0, summary);
        check_failure(&r1, summary);
        // The others slept for 120 s: they were ended, not waited for.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_node_that_never_comes_is_named() {
    const TEST: &str = "a_node_that_never_comes_is_named";
    if role(TEST).is_some() {
        let r = finish(start_launcher(
            TEST,
            "hello",
            Spawner::Direct,
            0,
            2,
            free_port(),
            0,
        ));
        assert_eq!(r.code, 101, "{r}");
        assert!(
            r.err
                .contains("timed out after 3s waiting for node 1 to join the launch"),
            "{r}"
        );
        assert!(!r.out.contains("hello from"), "no rank may start: {r}");
    }
}

#[test]
fn node_zero_dying_ends_the_other_nodes() {
    const TEST: &str = "node_zero_dying_ends_the_other_nodes";
    if role(TEST).is_some() {
        let port = free_port();
        let mut n0 = start_launcher(TEST, "sleep", Spawner::Direct, 0, 2, port, 0);
        let n1 = start_launcher(TEST, "sleep", Spawner::Direct, 1, 2, port, 0);
        let started = Instant::now();
        // Both nodes' ranks are up once the rendezvous passed; then node 0's launcher dies
        // (its ranks with it: they die with their launcher).
        std::thread::sleep(Duration::from_secs(2));
        n0.kill().unwrap();
        let _ = n0.wait();
        let r1 = finish(n1);
        assert_ne!(r1.code, 0, "{r1}");
        assert!(r1.err.contains("closed the connection"), "{r1}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
    }
}

#[cfg(feature = "mpi")]
#[test]
fn mpirun_two_ranks_form_one_mpi_world() {
    const TEST: &str = "mpirun_two_ranks_form_one_mpi_world";
    if role(TEST).is_some() {
        let r = run_one(TEST, "mpi", Spawner::Mpirun, 0);
        check_hello(&r, 2, None);
        for rank in 0..2 {
            let want = format!("[rank{rank}]:sum [2.0, 2.0] world 2");
            assert!(r.out.lines().any(|l| l == want), "no {want:?} in {r}");
        }
    }
}

/// Two launchers with the mpirun spawner: node 0's mpirun runs all four ranks, node 1's
/// launcher its daemon (Note [mpirun across nodes]); the ranks form one MPI world.
#[cfg(feature = "mpi")]
#[test]
fn two_nodes_under_one_mpirun_form_one_mpi_world() {
    const TEST: &str = "two_nodes_under_one_mpirun_form_one_mpi_world";
    if role(TEST).is_some() {
        let port = free_port();
        let n0 = start_launcher(TEST, "mpi", Spawner::Mpirun, 0, 2, port, 0);
        let n1 = start_launcher(TEST, "mpi", Spawner::Mpirun, 1, 2, port, 0);
        let (r0, r1) = (finish(n0), finish(n1));
        assert_eq!(r1.code, 0, "{r1}");
        check_hello(&r0, 4, Some(port));
        for rank in 0..4 {
            let want = format!("[rank{rank}]:sum [4.0, 4.0] world 4");
            assert!(r0.out.lines().any(|l| l == want), "no {want:?} in {r0}");
        }
    }
}

/// The same two launchers when a rank fails: mpirun ends the job, and both launchers end
/// within seconds with that rank's code, leaving no daemon behind.
#[cfg(feature = "mpi")]
#[test]
fn two_nodes_under_one_mpirun_end_on_a_failed_rank() {
    const TEST: &str = "two_nodes_under_one_mpirun_end_on_a_failed_rank";
    if role(TEST).is_some() {
        for (mode, who) in [
            // The last rank, on node 1, after every rank started.
            ("fail", "rank 3 (node 1, local_rank 1)"),
            // Rank 0 at once, perhaps before node 1's daemon is up.
            ("fail_first", "rank 0 (node 0, local_rank 0)"),
        ] {
            let port = free_port();
            let start = Instant::now();
            let n0 = start_launcher(TEST, mode, Spawner::Mpirun, 0, 2, port, 0);
            let n1 = start_launcher(TEST, mode, Spawner::Mpirun, 1, 2, port, 0);
            let (r0, r1) = (finish_within(n0, 60), finish_within(n1, 60));
            // The other ranks sleep 120 s: only ending them makes the launchers return.
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{mode}: {:?}\n{r0}\n{r1}",
                start.elapsed()
            );
            let summary = format!(
                "ember launch: {who} failed with exit code 7; the other 3 ranks were ended"
            );
            check_failure(&r0, &summary);
            check_failure(&r1, &summary);
        }
    }
}

#[cfg(feature = "mpi")]
#[test]
fn mpirun_failing_rank_ends_the_others() {
    const TEST: &str = "mpirun_failing_rank_ends_the_others";
    if role(TEST).is_some() {
        let r = run_one(TEST, "fail", Spawner::Mpirun, 0);
        assert!(r.err.contains("[rank1]:rank 1 gives up"), "{r}");
        check_failure(
            &r,
            "ember launch: rank 1 (local_rank 1) failed with exit code 7; the other rank was ended",
        );
    }
}
