//! Sync collectives on the caller's thread (Note [Collectives on the caller's thread]):
//! taken when nothing is queued, never overtaking `_async` work issued before them, and
//! giving the same results as the communication thread; with the input check off the sync
//! all-reduce stays on the thread.
#![cfg(feature = "mpi")]

use ember_autograd::{Result, Tensor};
use ember_parallel::group::{self, Backend, InitMethod, ProcessGroup, ReduceOp};
use ember_parallel::testing;

fn init() -> Result<ProcessGroup> {
    group::init_process_group(Backend::Mpi, InitMethod::Mpi)
}

/// A tensor's values as f64, to compare with.
fn all(t: &Tensor) -> Result<Vec<f64>> {
    t.to_vec::<f64>()
}

fn full(n: usize, v: f64) -> Result<Tensor> {
    Tensor::full([n], v, ())
}

/// Issues, in one order on every rank: async all-reduces of large tensors (so the queue is
/// busy), sync collectives on the same tensors right behind them (order-sensitive: a
/// broadcast that overtook the all-reduce of its tensor would give another value, and a
/// call paired with another rank's different call fails the input check), an async
/// all-gather, a sync all-reduce after everything finished, and checks every value
/// against the sums and maxima worked out here.
fn mixed(pg: &ProcessGroup) -> Result<()> {
    let (r, n) = (pg.rank(), pg.world_size());
    let rf = r as f64;
    let ranks: Vec<f64> = (0..n).map(|q| q as f64).collect();
    let sum = |f: &dyn Fn(f64) -> f64| ranks.iter().map(|&q| f(q)).sum::<f64>();

    // Nothing queued: the sync all-reduce runs on this thread.
    let before = pg.caller_thread_runs();
    let a = full(7, rf + 1.0)?;
    pg.all_reduce(&a, ReduceOp::Sum)?;
    assert_eq!(all(&a)?, vec![sum(&|q| q + 1.0); 7]);
    assert_eq!(
        pg.caller_thread_runs(),
        before + 1,
        "a sync all-reduce with nothing queued ran on the communication thread"
    );

    // Async work queued, sync collectives on the same tensors behind it.
    let big: Vec<Tensor> = (0..4)
        .map(|k| full(200_000 + k, rf * 10.0 + k as f64))
        .collect::<Result<_>>()?;
    let works = big
        .iter()
        .map(|t| pg.all_reduce_async(t, ReduceOp::Sum))
        .collect::<Result<Vec<_>>>()?;
    // Rank 0's tensor after the all-reduce is the sum; before it, rank 0's own value.
    pg.broadcast(&big[3], 0)?;
    pg.all_reduce(&big[2], ReduceOp::Max)?;
    let input = full(3, rf * rf)?;
    let outputs: Vec<Tensor> = (0..n).map(|_| full(3, -1.0)).collect::<Result<_>>()?;
    let gather = pg.all_gather_async(&outputs, &input)?;
    pg.barrier()?;
    for w in &works {
        w.wait()?;
    }
    gather.wait()?;
    for (k, t) in big.iter().enumerate() {
        let want = sum(&|q| q * 10.0 + k as f64);
        assert_eq!(all(t)?, vec![want; 200_000 + k], "tensor {k}");
    }
    for (q, o) in outputs.iter().enumerate() {
        assert_eq!(all(o)?, vec![(q * q) as f64; 3], "all_gather output {q}");
    }

    // Everything finished: sync calls run here again, in between async ones.
    let w = pg.all_reduce_async(&a, ReduceOp::Sum)?;
    w.wait()?;
    let before = pg.caller_thread_runs();
    let b = full(5, -rf)?;
    pg.all_reduce(&b, ReduceOp::Min)?;
    assert_eq!(all(&b)?, vec![-((n - 1) as f64); 5]);
    assert_eq!(all(&a)?, vec![sum(&|q| q + 1.0) * n as f64; 7]);
    pg.barrier()?;
    assert_eq!(pg.caller_thread_runs(), before + 2);

    // Without the input check the blocking all-reduce keeps the thread (and its timeout);
    // other collectives still run here.
    pg.set_check_inputs(false);
    let before = pg.caller_thread_runs();
    let c = full(2, rf)?;
    pg.all_reduce(&c, ReduceOp::Sum)?;
    assert_eq!(all(&c)?, vec![sum(&|q| q); 2]);
    assert_eq!(pg.caller_thread_runs(), before);
    pg.broadcast(&c, n - 1)?;
    assert_eq!(pg.caller_thread_runs(), before + 1);
    pg.set_check_inputs(true);
    Ok(())
}

#[test]
fn sync_and_async_collectives_mix_in_issue_order_on_2_ranks() {
    testing::ranks(
        2,
        "sync_and_async_collectives_mix_in_issue_order_on_2_ranks",
        || -> Result<()> {
            let pg = init()?;
            for _ in 0..3 {
                mixed(&pg)?;
            }
            group::destroy_process_group()
        },
    );
}

#[test]
fn sync_and_async_collectives_mix_in_issue_order_on_3_ranks() {
    testing::ranks(
        3,
        "sync_and_async_collectives_mix_in_issue_order_on_3_ranks",
        || -> Result<()> {
            let pg = init()?;
            mixed(&pg)?;
            group::destroy_process_group()
        },
    );
}

/// Sync collectives issued from threads other than the one that formed the group run on
/// those threads (MPI granted `MPI_THREAD_SERIALIZED`), with the right results.
#[test]
fn sync_collectives_from_two_threads_take_turns() {
    testing::ranks(
        2,
        "sync_collectives_from_two_threads_take_turns",
        || -> Result<()> {
            let pg = init()?;
            let r = pg.rank() as f64;
            let before = pg.caller_thread_runs();
            // The threads run one after the other (joined), each mixing forms; the point
            // is that a thread other than the one that formed the group may run MPI.
            for k in 0..2 {
                let pg2 = pg.clone();
                let h = std::thread::spawn(move || -> Result<()> {
                    let t = full(4, r + k as f64)?;
                    pg2.all_reduce(&t, ReduceOp::Sum)?;
                    assert_eq!(all(&t)?, vec![1.0 + 2.0 * k as f64; 4]);
                    pg2.all_reduce_async(&t, ReduceOp::Max)?.wait()?;
                    pg2.barrier()
                });
                h.join().expect("the rank's thread panicked")?;
            }
            assert_eq!(pg.caller_thread_runs(), before + 4);
            group::destroy_process_group()
        },
    );
}
