//! `ember launch`'s logic (`ember_parallel::launch`) on 2 ranks: the torchrun variables,
//! the `[rankR]:` prefixes, a failing rank ending the job with its code and a summary, by
//! both spawners; under mpirun, `init_process_group(Mpi, Env)` forms the world.
//!
//! Each test plays three roles, chosen by `ROLE`: the test itself starts this binary as the
//! launcher (to capture what the launcher prints), the launcher starts this binary's same
//! test as each rank.

use std::ffi::OsString;
use std::process::Command;

use ember_parallel::launch::{self, LaunchOptions, Spawner};

const ROLE: &str = "EMBER_LAUNCH_TEST_ROLE";
const MODE: &str = "EMBER_LAUNCH_TEST_MODE";

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

/// What a rank does for `mode`.
fn rank(mode: &str) {
    println!(
        "hello from {}/{} local {}/{} master {}:{}",
        var("RANK"),
        var("WORLD_SIZE"),
        var("LOCAL_RANK"),
        var("LOCAL_WORLD_SIZE"),
        var("MASTER_ADDR"),
        var("MASTER_PORT")
    );
    match mode {
        "fail" if var("RANK") == "1" => {
            eprintln!("rank 1 gives up");
            std::process::exit(7);
        }
        // The others would run on; launch must end them.
        "fail" => std::thread::sleep(std::time::Duration::from_secs(120)),
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

/// Runs the three roles of test `name`; returns the launcher's exit code and output.
fn run(name: &str, mode: &str, spawner: Spawner) -> Option<(i32, String, String)> {
    match std::env::var(ROLE).as_deref() {
        Ok("rank") => {
            rank(mode);
            None
        }
        Ok("launcher") => {
            let mut opts = LaunchOptions::new(2, self_test(name));
            opts.master_port = 29512;
            opts.spawner = Some(spawner);
            opts.env.push((ROLE.into(), "rank".into()));
            let out = launch::launch(&opts).expect("launch");
            std::process::exit(out.code);
        }
        _ => {
            let out = Command::new(std::env::current_exe().expect("the test binary"))
                .args(self_test(name).into_iter().skip(1))
                .env(ROLE, "launcher")
                .env(MODE, mode)
                .output()
                .expect("start the launcher");
            Some((
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ))
        }
    }
}

fn check_hello(code: i32, out: &str, err: &str) {
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..2 {
        let want = format!("[rank{r}]:hello from {r}/2 local {r}/2 master 127.0.0.1:29512");
        assert!(
            out.lines().any(|l| l == want),
            "no {want:?} in\n{out}\nstderr:\n{err}"
        );
    }
}

fn check_failure(code: i32, out: &str, err: &str) {
    assert_eq!(code, 7, "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("[rank1]:rank 1 gives up"), "{err}");
    assert!(
        err.contains(
            "ember launch: rank 1 (local_rank 1) failed with exit code 7; the other rank was ended"
        ),
        "{err}"
    );
}

#[test]
fn direct_two_ranks_get_torchrun_variables() {
    if let Some((code, out, err)) = run(
        "direct_two_ranks_get_torchrun_variables",
        "hello",
        Spawner::Direct,
    ) {
        check_hello(code, &out, &err);
    }
}

#[test]
fn direct_failing_rank_ends_the_others() {
    if let Some((code, out, err)) = run(
        "direct_failing_rank_ends_the_others",
        "fail",
        Spawner::Direct,
    ) {
        check_failure(code, &out, &err);
    }
}

#[cfg(feature = "mpi")]
#[test]
fn mpirun_two_ranks_form_one_mpi_world() {
    if let Some((code, out, err)) = run(
        "mpirun_two_ranks_form_one_mpi_world",
        "mpi",
        Spawner::Mpirun,
    ) {
        check_hello(code, &out, &err);
        for r in 0..2 {
            let want = format!("[rank{r}]:sum [2.0, 2.0] world 2");
            assert!(
                out.lines().any(|l| l == want),
                "no {want:?} in\n{out}\nstderr:\n{err}"
            );
        }
    }
}

#[cfg(feature = "mpi")]
#[test]
fn mpirun_failing_rank_ends_the_others() {
    if let Some((code, out, err)) = run(
        "mpirun_failing_rank_ends_the_others",
        "fail",
        Spawner::Mpirun,
    ) {
        check_failure(code, &out, &err);
    }
}
