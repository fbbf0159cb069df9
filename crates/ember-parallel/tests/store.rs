//! The rendezvous store on 127.0.0.1, with threads as ranks; every wait is bounded by a
//! short store timeout.

use std::time::Duration;

use ember_autograd::ErrorKind;
use ember_parallel::store::TcpStore;

mod owner;

const T: Duration = Duration::from_secs(10);

fn server() -> TcpStore {
    TcpStore::new("127.0.0.1", 0, true, T).expect("serve on a free port")
}

#[test]
fn set_then_get_across_clients() {
    let s = server();
    let port = s.addr().port();
    assert!(s.is_server());
    s.set("id", b"\x00\x01nccl").unwrap();
    let c = TcpStore::new("127.0.0.1", port, false, T).unwrap();
    assert!(!c.is_server());
    assert_eq!(c.get("id").unwrap(), b"\x00\x01nccl");
    c.set("id", b"other").unwrap();
    assert_eq!(s.get("id").unwrap(), b"other");
}

#[test]
fn get_waits_for_a_later_set() {
    let s = server();
    let port = s.addr().port();
    let waiter = std::thread::spawn(move || {
        let c = TcpStore::new("127.0.0.1", port, false, T).unwrap();
        c.get("late").unwrap()
    });
    std::thread::sleep(Duration::from_millis(100));
    s.set("late", b"here").unwrap();
    assert_eq!(waiter.join().unwrap(), b"here");
}

#[test]
fn get_of_a_key_never_set_times_out_naming_it() {
    let s = server();
    let c = TcpStore::new(
        "127.0.0.1",
        s.addr().port(),
        false,
        Duration::from_millis(300),
    )
    .unwrap();
    let e = c.get("missing").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Distributed);
    assert!(
        e.to_string()
            .contains("TCPStore.get: key \"missing\" was not set within"),
        "{e}"
    );
}

#[test]
fn add_counts_across_threads() {
    let s = server();
    let port = s.addr().port();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let c = TcpStore::new("127.0.0.1", port, false, T).unwrap();
                for _ in 0..25 {
                    c.add("n", 2).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.add("n", 0).unwrap(), 200);
    assert_eq!(s.add("fresh", -3).unwrap(), -3);
}

#[test]
fn an_unreachable_master_is_an_error_naming_the_address() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = TcpStore::new("127.0.0.1", port, false, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Distributed);
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "cannot reach the rendezvous store at 127.0.0.1:{port}"
        )),
        "{msg}"
    );
    let e =
        TcpStore::new("no-such-host.invalid", 1, false, Duration::from_millis(300)).unwrap_err();
    assert!(e.to_string().contains("cannot resolve MASTER_ADDR"), "{e}");
}

#[test]
fn check_says_whether_keys_are_set_without_waiting() {
    let s = server();
    let c = TcpStore::new("127.0.0.1", s.addr().port(), false, T).unwrap();
    assert!(!c.check(&["a"]).unwrap());
    s.set("a", b"1").unwrap();
    assert!(c.check(&["a"]).unwrap());
    assert!(!c.check(&["a", "b"]).unwrap());
    assert_eq!(c.wait_for("b", Duration::from_millis(50)).unwrap(), None);
}

#[test]
fn a_prefix_keeps_the_keys_of_two_attempts_apart() {
    let s = server();
    let port = s.addr().port();
    let a0 = TcpStore::new("127.0.0.1", port, false, T)
        .unwrap()
        .with_prefix("/worker/attempt_0/");
    let a1 = TcpStore::new("127.0.0.1", port, false, T)
        .unwrap()
        .with_prefix("/worker/attempt_1/");
    a0.set("nccl/unique_id", b"first").unwrap();
    assert!(!a1.check(&["nccl/unique_id"]).unwrap());
    a1.set("nccl/unique_id", b"second").unwrap();
    assert_eq!(a0.get("nccl/unique_id").unwrap(), b"first");
    assert_eq!(
        s.get("/worker/attempt_1/nccl/unique_id").unwrap(),
        b"second"
    );
    assert_eq!(a1.prefix(), "/worker/attempt_1/");
}

/// Rank 0's server listens on every interface (Note [Store binding]): a client reaching the
/// host through another address than the one rank 0 was given still meets it. Any
/// 127.x.y.z reaches the loopback interface on Linux, but a socket bound to 127.0.0.1 alone
/// does not answer on 127.0.0.2.
#[test]
fn the_server_listens_on_every_interface_unless_bound_to_one() {
    let s = server();
    let listen = s.listen_addr().unwrap();
    assert!(listen.ip().is_unspecified(), "{listen}");
    let c = TcpStore::new("127.0.0.2", listen.port(), false, T).unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap(), b"v");

    let one = TcpStore::serve("127.0.0.1:0".parse().unwrap(), T).unwrap();
    let port = one.listen_addr().unwrap().port();
    assert_eq!(one.listen_addr().unwrap().ip().to_string(), "127.0.0.1");
    assert!(TcpStore::new("127.0.0.1", port, false, T).is_ok());
    let e = TcpStore::new("127.0.0.2", port, false, Duration::from_millis(300)).unwrap_err();
    assert!(
        e.to_string().contains("cannot reach the rendezvous store"),
        "{e}"
    );
}

#[test]
fn a_port_in_use_is_an_error_naming_it() {
    let s = server();
    let port = s.listen_addr().unwrap().port();
    let e = TcpStore::new("127.0.0.1", port, true, T).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("failed to listen") && msg.contains(&port.to_string()),
        "{msg}"
    );
}

/// The store's owner (here a child process) dying while a client waits: the client's wait
/// fails at once saying so, long before the store's timeout.
#[test]
fn a_client_waiting_when_the_owner_dies_fails_at_once() {
    if owner::serve_if_owner() {
        return;
    }
    let (mut child, port) =
        owner::spawn_owner("a_client_waiting_when_the_owner_dies_fails_at_once");
    let timeout = Duration::from_secs(60);
    let c = TcpStore::new("127.0.0.1", port, false, timeout).unwrap();
    let started = std::time::Instant::now();
    let waiting = std::thread::spawn(move || c.get("never"));
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    let e = waiting.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("closed the connection"), "{e}");
    // The error came from the closed connection, not from the store's timeout.
    assert!(started.elapsed() < timeout / 2, "{:?}", started.elapsed());
}
