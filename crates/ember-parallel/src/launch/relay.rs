//! One `mpirun` across the nodes of a launch, its remote shell relayed through the store.
//!
//! Note [mpirun across nodes]: the `mpi` backend needs every rank in one `MPI_COMM_WORLD`,
//! which only one `mpirun` gives (Note [Launch through mpirun]; joining two jobs needs
//! Open MPI's `ompi-server`, and `MPI_Comm_connect` between two `mpirun`s did not complete
//! on loopback with Open MPI 4.1). So with the mpirun spawner and several nodes, node 0's
//! launcher runs one `mpirun -H localhost:K,ember-node1:K,...` for the whole world, and
//! the launchers of the other nodes serve as its remote shell: `mpirun` starts its daemon
//! (`orted`) on node R by running the agent given as `plm_rsh_agent`, which would be `ssh`;
//! here it is a short shell script that leaves the daemon's command line in a spool
//! directory and waits. A thread of node 0's launcher hands each command to node R's
//! launcher through the store (`/agent/attempt_N/orted/R`); node R's launcher runs it and
//! puts its exit code back (`.../exit`), which the thread writes for the script to return.
//! The daemon then connects back to `mpirun` over TCP and starts node R's ranks, so every
//! rank's output comes through `mpirun` and is printed by node 0's launcher; the others
//! print their daemon's own lines. Tree spawning is off (a daemon would run the agent on
//! its own node). The ranks' variables travel with `-x`; the shim computes `RANK`,
//! `LOCAL_RANK` and `GROUP_RANK` from Open MPI's, slots being filled node by node. The
//! ranks' exit reports go to the directory node 0 names in the store
//! (`/agent/attempt_N/reports`, created on each node); when its daemon ends, a node's
//! launcher forwards its ranks' reports through the store, so node 0 names a rank that
//! failed on another node. When node 0's `mpirun` ends, the relay answers every agent still
//! waiting, so that nothing keeps `mpirun`'s output open. When
//! `--master-addr` is a loopback address every node is on this machine (they reach node 0
//! through it): Open MPI's shared-memory transport cannot tell the daemons' "nodes" apart
//! there, so the launcher limits it to TCP over loopback. Under Open MPI's own launcher
//! (`mpirun -H a:2,b:2 PROGRAM`) none of this is needed: see `docs/distributed.md`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use ember_autograd::Result;

use super::{LaunchOptions, launch_error};
use crate::store::TcpStore;

/// The name node `r` has in `mpirun`'s host list.
fn host_of(node: usize) -> String {
    format!("ember-node{node}")
}

/// The store key of node `node`'s daemon command in `attempt`.
pub(super) fn orted_key(attempt: u32, node: usize) -> String {
    format!("/agent/attempt_{attempt}/orted/{node}")
}

const AGENT: &str = r#"#!/bin/sh
# ember launch's remote shell for mpirun (Note [mpirun across nodes]): hands the command for
# host $1 to that node's launcher and returns its exit code.
host="$1"; shift
d="$EMBER_LAUNCH_SPOOL/$host.$$"
mkdir -p "$d" || exit 255
printf '%s\n' "$*" > "$d/cmd.tmp" && mv "$d/cmd.tmp" "$d/cmd" || exit 255
while [ ! -f "$d/exit" ]; do sleep 0.05; done
exit "$(cat "$d/exit")"
"#;

/// Node 0's side: the agent script and the thread relaying its commands.
pub(super) struct Relay {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Writes the agent and starts relaying the commands of `attempt` through the store
    /// on this machine's `port`.
    pub(super) fn start(port: u16, attempt: u32, timeout: Duration) -> Result<Relay> {
        let dir = std::env::temp_dir().join(format!(
            "ember-launch-relay-{}-{attempt}",
            std::process::id()
        ));
        let spool = dir.join("spool");
        std::fs::create_dir_all(&spool)?;
        let agent = dir.join("agent.sh");
        std::fs::write(&agent, AGENT)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))?;
        }
        let store = TcpStore::new("127.0.0.1", port, false, timeout)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ember-launch-relay".into())
            .spawn(move || relay(&store, &spool, attempt, &flag))
            .map_err(|e| launch_error(format!("cannot start the relay thread: {e}")))?;
        Ok(Relay {
            dir,
            stop,
            thread: Some(thread),
        })
    }

    /// `mpirun`'s arguments for the whole world of `opts`, with `vars` passed to every
    /// rank.
    pub(super) fn mpirun_args(&self, opts: &LaunchOptions, vars: &[OsString]) -> Vec<OsString> {
        let k = opts.nproc_per_node;
        let hosts: Vec<String> = std::iter::once(format!("localhost:{k}"))
            .chain((1..opts.nnodes).map(|r| format!("{}:{k}", host_of(r))))
            .collect();
        let mut args: Vec<OsString> = vec![
            "-H".into(),
            hosts.join(",").into(),
            "--mca".into(),
            "plm_rsh_agent".into(),
            self.dir.join("agent.sh").into_os_string(),
            "--mca".into(),
            "plm_rsh_no_tree_spawn".into(),
            "1".into(),
            "-x".into(),
            "EMBER_LAUNCH_SPOOL".into(),
        ];
        if loopback(&opts.master_addr) {
            for (k, v) in [
                ("btl", "self,tcp"),
                ("btl_tcp_if_include", "lo"),
                ("oob_tcp_if_include", "lo"),
            ] {
                args.extend(["--mca".into(), k.into(), v.into()]);
            }
        }
        for v in vars {
            args.extend(["-x".into(), v.clone()]);
        }
        args
    }

    /// The spool directory the agent writes to (`EMBER_LAUNCH_SPOOL`).
    pub(super) fn spool(&self) -> PathBuf {
        self.dir.join("spool")
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `true` for a loopback address (or `localhost`).
fn loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The relay thread: commands from the spool to the store, exit codes back.
fn relay(store: &TcpStore, spool: &Path, attempt: u32, stop: &AtomicBool) {
    // Spool entries handed on: entry → the node it is for.
    let mut open: HashMap<PathBuf, usize> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        if let Ok(entries) = std::fs::read_dir(spool) {
            for e in entries.flatten() {
                let path = e.path();
                if open.contains_key(&path) || path.join("exit").exists() {
                    continue;
                }
                let Ok(cmd) = std::fs::read_to_string(path.join("cmd")) else {
                    continue;
                };
                let name = e.file_name().to_string_lossy().into_owned();
                let node = name
                    .split('.')
                    .next()
                    .and_then(|h| h.strip_prefix("ember-node"))
                    .and_then(|n| n.parse::<usize>().ok());
                let Some(node) = node else {
                    // Not a host of this launch: the agent fails it.
                    let _ = write_exit(&path, 255);
                    continue;
                };
                if store
                    .set(&orted_key(attempt, node), cmd.trim_end().as_bytes())
                    .is_ok()
                {
                    open.insert(path, node);
                }
            }
        }
        open.retain(|path, node| {
            let key = format!("{}/exit", orted_key(attempt, *node));
            match store.check(&[&key]) {
                Ok(true) => {
                    let code = store
                        .get_within(&key, Duration::ZERO)
                        .ok()
                        .and_then(|v| String::from_utf8_lossy(&v).trim().parse::<i32>().ok())
                        .unwrap_or(1);
                    let _ = write_exit(path, code);
                    false
                }
                Ok(false) => true,
                // The store is gone: the agents fail, and mpirun with them.
                Err(_) => {
                    let _ = write_exit(path, 255);
                    false
                }
            }
        });
        std::thread::sleep(Duration::from_millis(50));
    }
    // Leave no agent waiting, handed on or not (mpirun may have ended before).
    if let Ok(entries) = std::fs::read_dir(spool) {
        for e in entries.flatten() {
            if !e.path().join("exit").exists() {
                let _ = write_exit(&e.path(), 255);
            }
        }
    }
}

fn write_exit(dir: &Path, code: i32) -> std::io::Result<()> {
    let tmp = dir.join("exit.tmp");
    std::fs::write(&tmp, format!("{code}\n"))?;
    std::fs::rename(tmp, dir.join("exit"))
}
