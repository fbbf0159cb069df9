//! A rendezvous store served by a child process (this test binary started again in a role),
//! for the tests that kill the store's owner.
#![allow(clippy::unwrap_used, dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ember_parallel::store::TcpStore;

/// Set in the owner's environment.
pub const OWNER_ROLE: &str = "EMBER_STORE_TEST_OWNER";

/// In the owner (the role is set): serves a store on a free port, prints `port N` and waits
/// to be killed; `true`. `false` elsewhere.
pub fn serve_if_owner() -> bool {
    if std::env::var_os(OWNER_ROLE).is_none() {
        return false;
    }
    let s = TcpStore::new("127.0.0.1", 0, true, Duration::from_secs(30)).unwrap();
    println!("port {}", s.addr().port());
    std::thread::sleep(Duration::from_secs(60));
    true
}

/// Starts this binary's test `test` as the owner; the child and its store's port. The
/// caller kills the child and waits for it.
#[allow(clippy::zombie_processes)]
pub fn spawn_owner(test: &str) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
        .env(OWNER_ROLE, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the owner printed no port"
        );
        if let Some(p) = line.trim().strip_prefix("port ") {
            return (child, p.parse().unwrap());
        }
    }
}
