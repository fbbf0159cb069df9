//! Timeouts at every wait of an `nccl` group's forming (Note [Rendezvous barriers]): a rank
//! that never started, a rank that read the unique id and vanished, and the store's owner
//! dying each end the waiting rank with an error naming the rank (or the store), within the
//! group's timeout plus a few seconds; never a hang. Ranks are threads of this process on
//! emulated devices, the store's owner a child process.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_parallel::group::{Backend, InitMethod, InitOptions, ProcessGroup, rendezvous_until_id};
use ember_parallel::store::TcpStore;
use ember_tensor::Device;
use ember_testing::real_gpu_requested;

mod owner;

/// The group's timeout in these tests.
const TIMEOUT: Duration = Duration::from_secs(2);
/// What "within the timeout plus a few seconds" allows.
const SLACK: Duration = Duration::from_secs(5);

fn emulated(test: &str) -> bool {
    if real_gpu_requested() {
        eprintln!("skipped: {test}: ranks as threads of one process need the emulator's NCCL");
        return false;
    }
    if let Err(e) = cuda::use_emulator(EmulatorConfig::devices(2)) {
        assert!(
            cuda::is_emulated() && cuda::device_count() >= 2,
            "{test} needs 2 emulated devices: {e}"
        );
    }
    true
}

fn opts(rank: usize, store: Arc<TcpStore>) -> InitOptions {
    InitOptions::new(
        Backend::Nccl,
        InitMethod::Explicit {
            rank,
            world_size: 2,
        },
    )
    .with_store(store)
    .with_device(rank)
    .with_timeout(TIMEOUT)
}

fn server() -> Arc<TcpStore> {
    Arc::new(TcpStore::new("127.0.0.1", 0, true, Duration::from_secs(30)).unwrap())
}

fn client(port: u16) -> Arc<TcpStore> {
    Arc::new(TcpStore::new("127.0.0.1", port, false, Duration::from_secs(30)).unwrap())
}

#[test]
fn a_rank_never_started_is_named_within_the_timeout() {
    if !emulated("a_rank_never_started_is_named_within_the_timeout") {
        return;
    }
    let started = Instant::now();
    let e = ProcessGroup::new(opts(0, server())).unwrap_err();
    named_within(
        &e,
        started,
        "rank 0: init_process_group: timed out after 2s waiting for rank 1 to reach the rendezvous store (1/2 ranks did)",
    );
}

/// `e` says `what` and came within the timeout plus a few seconds of `started`.
fn named_within(e: &ember_autograd::Error, started: Instant, what: &str) {
    let msg = e.to_string();
    assert!(msg.contains(what), "{msg}");
    let took = started.elapsed();
    assert!(took < TIMEOUT + SLACK, "{took:?}");
}

#[test]
fn a_rank_that_read_the_id_and_vanished_is_named_within_the_timeout() {
    if !emulated("a_rank_that_read_the_id_and_vanished_is_named_within_the_timeout") {
        return;
    }
    let store = server();
    let port = store.addr().port();
    let started = Instant::now();
    let rank0 = std::thread::spawn(move || ProcessGroup::new(opts(0, store)));
    // Rank 1 meets rank 0, reads the id, and is gone before ncclCommInitRank.
    let id = rendezvous_until_id(&client(port), 1, 2, TIMEOUT).unwrap();
    assert_ne!(id.0, [0; 128]);
    let e = rank0.join().unwrap().unwrap_err();
    named_within(
        &e,
        started,
        "waiting for rank 1 to join the NCCL communicator (1/2 ranks did)",
    );
}

#[test]
fn two_ranks_meet_and_reduce_after_the_rendezvous() {
    if !emulated("two_ranks_meet_and_reduce_after_the_rendezvous") {
        return;
    }
    let store = server();
    let port = store.addr().port();
    let ranks: Vec<_> = [store, client(port)]
        .into_iter()
        .enumerate()
        .map(|(rank, s)| {
            std::thread::spawn(move || {
                let pg = ProcessGroup::new(opts(rank, s))?;
                let v = vec![rank as f32 + 1.0; 3];
                let t = ember_autograd::Tensor::from_vec(v, [3], Device::Cuda(rank))?;
                pg.all_reduce(&t, ember_parallel::ReduceOp::Sum)?;
                let v = t.to_vec::<f32>()?;
                pg.destroy()?;
                Ok::<_, ember_autograd::Error>(v)
            })
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().unwrap().unwrap(), vec![3.0; 3]);
    }
}

/// Rank 0 (a child process serving the store) dies while rank 1 waits for it at the
/// rendezvous: rank 1 fails saying the store's owner ended, not after its timeout.
#[test]
fn the_store_owner_dying_fails_the_waiting_rank() {
    const TEST: &str = "the_store_owner_dying_fails_the_waiting_rank";
    if owner::serve_if_owner() || !emulated(TEST) {
        return;
    }
    let (mut child, port) = owner::spawn_owner(TEST);
    let long = Duration::from_secs(60);
    let started = Instant::now();
    let rank1 =
        std::thread::spawn(move || ProcessGroup::new(opts(1, client(port)).with_timeout(long)));
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let e = rank1.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("closed the connection"), "{e}");
    assert!(started.elapsed() < long / 2, "{:?}", started.elapsed());
}
