//! Bad input and failures across MPI ranks: mismatched tensors, wrong arguments, init twice,
//! a world size that does not match `mpirun`'s, a rank that skips a collective (the other
//! times out), a rank that exits mid-step (the job ends). Each must end with an error that
//! names the rank, never a hang: every job is bounded by the harness's timeout and every
//! collective by a short group timeout.
#![cfg(feature = "mpi")]

use std::time::Duration;

use ember_autograd::{ErrorKind, Result, Tensor};
use ember_parallel::group::{self, Backend, InitMethod, ProcessGroup, ReduceOp};
use ember_parallel::testing::{self, RunRanks};
use ember_tensor::DType;

fn init() -> Result<ProcessGroup> {
    group::init_process_group(Backend::Mpi, InitMethod::Mpi)
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind, parts: &[&str]) {
    let e = r.expect_err("expected an error");
    assert_eq!(e.kind(), kind, "{e}");
    let s = e.to_string();
    for p in parts {
        assert!(s.contains(p), "{s:?} does not contain {p:?}");
    }
}

#[test]
fn mismatched_inputs_fail_on_every_rank_and_the_group_goes_on() {
    testing::ranks(
        2,
        "mismatched_inputs_fail_on_every_rank_and_the_group_goes_on",
        || -> Result<()> {
            let pg = init()?;
            let r = pg.rank();
            let me = format!("rank {r}: mpi:all_reduce");
            // Shapes differ.
            let t = Tensor::ones([3 + r], ())?;
            expect_err(
                pg.all_reduce(&t, ReduceOp::Sum),
                ErrorKind::Shape,
                &[
                    &me,
                    "inputs differ",
                    "rank 0: all_reduce(sum) of torch.float32 [3]",
                    "rank 1: all_reduce(sum) of torch.float32 [4]",
                ],
            );
            // Dtypes differ.
            let t = Tensor::ones([3], if r == 0 { DType::F32 } else { DType::F64 })?;
            expect_err(
                pg.all_reduce(&t, ReduceOp::Sum),
                ErrorKind::DType,
                &[&me, "torch.float64"],
            );
            // Different collectives at the same point.
            let t = Tensor::ones([3], ())?;
            let res = if r == 0 {
                pg.all_reduce(&t, ReduceOp::Max)
            } else {
                pg.broadcast(&t, 0)
            };
            expect_err(
                res,
                ErrorKind::Shape,
                &["broadcast(src 0)", "all_reduce(max)"],
            );
            // Local argument errors, before anything is sent.
            expect_err(
                pg.broadcast(&t, 2),
                ErrorKind::InvalidArgument,
                &[&format!("rank {r}: mpi:broadcast"), "src 2"],
            );
            expect_err(
                pg.all_gather(std::slice::from_ref(&t), &t),
                ErrorKind::InvalidArgument,
                &["expected 2 outputs (one per rank), but found 1"],
            );
            let wrong = [Tensor::ones([3], ())?, Tensor::ones([4], ())?];
            expect_err(
                pg.reduce_scatter(&t, &wrong, ReduceOp::Sum),
                ErrorKind::Shape,
                &["inputs[1]"],
            );
            let b = Tensor::ones([2], DType::Bool)?;
            expect_err(
                pg.all_reduce(&b, ReduceOp::Avg),
                ErrorKind::DType,
                &["Avg is not defined for bool"],
            );
            // Init twice.
            expect_err(init(), ErrorKind::Distributed, &["already initialized"]);
            // The group is still usable.
            assert!(!pg.is_broken());
            pg.all_reduce(&t, ReduceOp::Sum)?;
            assert_eq!(t.to_vec::<f32>()?, vec![2.0; 3]);
            group::destroy_process_group()
        },
    );
}

#[test]
fn world_size_that_mpirun_did_not_start_is_an_error() {
    let opts =
        RunRanks::new(2, "world_size_that_mpirun_did_not_start_is_an_error").env("WORLD_SIZE", "3");
    if let Some(out) = testing::in_ranks(&opts, || -> Result<()> {
        expect_err(
            group::init_process_group(Backend::Mpi, InitMethod::Env),
            ErrorKind::Distributed,
            &[
                "WORLD_SIZE is 3, but MPI started 2 processes",
                "ember launch --nproc-per-node 3",
            ],
        );
        assert!(!group::is_initialized());
        Ok(())
    }) {
        assert!(out.all_passed(), "{}", testing::report("world size", &out));
    }
}

#[test]
fn a_rank_that_skips_a_collective_makes_the_other_time_out() {
    let opts = RunRanks::new(2, "a_rank_that_skips_a_collective_makes_the_other_time_out");
    let out = testing::in_ranks(&opts, || -> Result<()> {
        let pg = init()?;
        pg.set_timeout(Duration::from_secs(2));
        if pg.rank() == 1 {
            // Skips the collective, and stays until rank 0 has given up (the job ends when
            // rank 0 exits, its broken group never finalized).
            std::thread::sleep(Duration::from_secs(30));
            // not a skip: rank 1's part is to do nothing.
            return Ok(());
        }
        let t = Tensor::ones([4], ())?;
        let work = pg.all_reduce_async(&t, ReduceOp::Sum)?;
        expect_err(
            work.wait(),
            ErrorKind::Distributed,
            &[
                "rank 0: mpi:all_reduce",
                "timed out after 2s",
                "now unusable",
            ],
        );
        assert!(pg.is_broken());
        expect_err(
            pg.barrier(),
            ErrorKind::Distributed,
            &["rank 0: mpi:barrier", "unusable"],
        );
        Ok(())
    });
    if let Some(out) = out {
        assert!(!out.timed_out, "{}", testing::report("skip", &out));
        assert_eq!(
            out.ranks[0].passed,
            Some(true),
            "{}",
            testing::report("skip", &out)
        );
    }
}

#[test]
fn a_rank_that_exits_mid_step_ends_the_job() {
    let opts = RunRanks::new(2, "a_rank_that_exits_mid_step_ends_the_job");
    let out = testing::in_ranks(&opts, || -> Result<()> {
        let pg = init()?;
        pg.set_timeout(Duration::from_secs(5));
        let t = Tensor::ones([4], ())?;
        pg.all_reduce(&t, ReduceOp::Sum)?;
        if pg.rank() == 1 {
            std::process::exit(3);
        }
        // Either mpirun ends this rank, or the collective fails within the timeout.
        expect_err(
            pg.all_reduce(&t, ReduceOp::Sum),
            ErrorKind::Distributed,
            &["rank 0: mpi:all_reduce"],
        );
        Ok(())
    });
    if let Some(out) = out {
        let report = testing::report("exit", &out);
        assert!(!out.timed_out, "{report}");
        assert_ne!(out.code, Some(0), "{report}");
        assert_ne!(out.ranks[0].passed, Some(false), "{report}");
    }
}
