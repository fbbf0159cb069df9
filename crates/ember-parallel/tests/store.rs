//! The rendezvous store on 127.0.0.1, with threads as ranks; every wait is bounded by a
//! short store timeout.

use std::time::Duration;

use ember_autograd::ErrorKind;
use ember_parallel::store::TcpStore;

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
