//! The launchers of a job meeting on the store (Note [Agent store]): node 0's serves it,
//! every node's joins each attempt's rendezvous, reports its ranks' first failure, and
//! watches for the others'.

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ember_autograd::Result;

use super::{LaunchOptions, RankExit, launch_error};
use crate::rendezvous::{Meeting, Members};
use crate::store::TcpStore;

const OP: &str = "ember launch";

fn report_key(attempt: u32, rank: usize) -> String {
    format!("/agent/attempt_{attempt}/report/{rank}")
}

/// A failure as the nodes share it: the rank, its node and local rank, and how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) rank: Option<usize>,
    pub(super) node: usize,
    pub(super) local_rank: Option<usize>,
    pub(super) exit: RankExit,
    /// The code the launchers exit with.
    pub(super) code: i32,
}

impl Failure {
    fn encode(&self) -> String {
        let opt = |v: Option<usize>| v.map_or("-".to_string(), |v| v.to_string());
        let (kind, n) = match self.exit {
            RankExit::Code(c) => ("code", c),
            RankExit::Signal(s) => ("signal", s),
        };
        format!(
            "{} {} {} {kind} {n} {}",
            opt(self.rank),
            self.node,
            opt(self.local_rank),
            self.code
        )
    }

    fn decode(s: &str) -> Option<Failure> {
        let f: Vec<&str> = s.split_whitespace().collect();
        let opt = |v: &str| v.parse::<usize>().ok();
        let n: i32 = f.get(4)?.parse().ok()?;
        Some(Failure {
            rank: opt(f.first()?),
            node: f.get(1)?.parse().ok()?,
            local_rank: opt(f.get(2)?),
            exit: match *f.get(3)? {
                "signal" => RankExit::Signal(n),
                _ => RankExit::Code(n),
            },
            code: f.get(5)?.parse().ok()?,
        })
    }
}

/// This node's launcher, a client of the job's store (and its server on node 0).
pub(super) struct Agent {
    store: TcpStore,
    node: usize,
    nnodes: usize,
    join_timeout: Duration,
}

impl Agent {
    /// Serves the store on node 0 (every interface, `--master-port`), or connects to it,
    /// retrying until the join timeout; checks that every node runs the same job.
    pub(super) fn start(opts: &LaunchOptions) -> Result<Agent> {
        let node = opts.node_rank;
        let store = TcpStore::new(
            &opts.master_addr,
            opts.master_port,
            node == 0,
            opts.join_timeout,
        )?;
        let agent = Agent {
            store,
            node,
            nnodes: opts.nnodes,
            join_timeout: opts.join_timeout,
        };
        const RUN_ID: &str = "/agent/run_id";
        if node == 0 {
            agent.store.set(RUN_ID, opts.run_id.as_bytes())?;
        } else {
            let theirs = agent.store.get_within(RUN_ID, opts.join_timeout)?;
            if theirs != opts.run_id.as_bytes() {
                return Err(launch_error(format!(
                    "node 0 runs job {:?} (--rdzv-id), this node {:?}: another job uses {}:{}",
                    String::from_utf8_lossy(&theirs),
                    opts.run_id,
                    opts.master_addr,
                    opts.master_port
                )));
            }
        }
        Ok(agent)
    }

    /// The port the store listens on (the one asked for, or the free one picked for 0).
    pub(super) fn port(&self) -> u16 {
        self.store.addr().port()
    }

    fn meeting(&self) -> Meeting<'_> {
        Meeting {
            store: &self.store,
            rank: self.node,
            world: self.nnodes,
            deadline: Instant::now() + self.join_timeout,
            timeout: self.join_timeout,
            op: OP,
            who: Members::Nodes,
        }
    }

    /// Waits until every node's launcher reached attempt `attempt` (its ranks are then
    /// started together); names the nodes that did not come within the join timeout.
    pub(super) fn rendezvous(&self, attempt: u32) -> Result<()> {
        self.meeting().barrier(
            &format!("/agent/attempt_{attempt}/joined"),
            "join the launch (run `ember launch` on every node)",
        )
    }

    /// Reports a failure of this node's ranks in `attempt`; the first report of an attempt
    /// is the one every node acts on and names.
    pub(super) fn report(&self, attempt: u32, failure: &Failure) -> Result<Failure> {
        let first = self
            .store
            .add(&format!("/agent/attempt_{attempt}/failures"), 1)?;
        let key = format!("/agent/attempt_{attempt}/failure");
        if first == 1 {
            self.store.set(&key, failure.encode().as_bytes())?;
            return Ok(*failure);
        }
        // Another node reported first; its record may still be on its way.
        let theirs = self.store.get_within(&key, Duration::from_secs(10))?;
        Ok(Failure::decode(&String::from_utf8_lossy(&theirs)).unwrap_or(*failure))
    }

    /// The failure reported by some node in `attempt`, if any.
    pub(super) fn failure(&self, attempt: u32) -> Result<Option<Failure>> {
        let key = format!("/agent/attempt_{attempt}/failure");
        if !self.store.check(&[&key])? {
            return Ok(None);
        }
        let v = self.store.get_within(&key, Duration::ZERO)?;
        Ok(Failure::decode(&String::from_utf8_lossy(&v)))
    }

    /// Marks this node's ranks of `attempt` as all succeeded.
    pub(super) fn succeeded(&self, attempt: u32) -> Result<()> {
        self.store
            .add(&format!("/agent/attempt_{attempt}/succeeded"), 1)
            .map(|_| ())
    }

    /// Whether every node's ranks of `attempt` succeeded.
    pub(super) fn all_succeeded(&self, attempt: u32) -> Result<bool> {
        let n = self
            .store
            .add(&format!("/agent/attempt_{attempt}/succeeded"), 0)?;
        Ok(usize::try_from(n).is_ok_and(|n| n >= self.nnodes))
    }

    /// The command of `mpirun`'s daemon for this node in `attempt` (Note [mpirun across
    /// nodes]), waiting at most the join timeout; `None` when a failure was reported
    /// first (node 0's `mpirun` failed before starting it).
    pub(super) fn orted_command(&self, attempt: u32) -> Result<Option<String>> {
        let key = super::relay::orted_key(attempt, self.node);
        let deadline = Instant::now() + self.join_timeout;
        while Instant::now() < deadline {
            if self.store.check(&[&key])? {
                let v = self.store.get_within(&key, Duration::ZERO)?;
                return Ok(Some(String::from_utf8_lossy(&v).into_owned()));
            }
            if self.failure(attempt)?.is_some() {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(launch_error(format!(
            "node 0's mpirun did not start its daemon on node {} within {:?}",
            self.node, self.join_timeout
        )))
    }

    /// Hands the exit code of this node's daemon back to node 0's agent script.
    pub(super) fn orted_exit(&self, attempt: u32, code: i32) -> Result<()> {
        let key = format!("{}/exit", super::relay::orted_key(attempt, self.node));
        self.store.set(&key, code.to_string().as_bytes())
    }

    /// Node 0 names the directory its `mpirun`'s ranks report to (Note [mpirun across
    /// nodes]): the ranks of other nodes write to the same path there.
    pub(super) fn set_reports_dir(&self, attempt: u32, dir: &Path) -> Result<()> {
        self.store.set(
            &format!("/agent/attempt_{attempt}/reports"),
            dir.as_os_str().as_bytes(),
        )
    }

    /// The directory node 0 named, created on this node if it is another machine.
    pub(super) fn reports_dir(&self, attempt: u32) -> Result<PathBuf> {
        let v = self.store.get_within(
            &format!("/agent/attempt_{attempt}/reports"),
            self.join_timeout,
        )?;
        let dir = PathBuf::from(std::ffi::OsString::from_vec(v));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Hands the reports found in `dir` (this node's ranks') to node 0 through the store.
    pub(super) fn forward_reports(&self, attempt: u32, dir: &Path, world: usize) -> Result<()> {
        for rank in 0..world {
            if let Ok(r) = std::fs::read(dir.join(super::workers::report_name(rank))) {
                self.store.set(&report_key(attempt, rank), &r)?;
            }
        }
        Ok(())
    }

    /// The report of `rank` forwarded by its node, if any yet.
    pub(super) fn rank_report(&self, attempt: u32, rank: usize) -> Option<String> {
        let key = report_key(attempt, rank);
        match self.store.check(&[&key]) {
            Ok(true) => self
                .store
                .get_within(&key, Duration::ZERO)
                .ok()
                .map(|v| String::from_utf8_lossy(&v).into_owned()),
            _ => None,
        }
    }

    /// Marks this node as done with the store; node 0 keeps serving it until every node is
    /// (at most the join timeout).
    pub(super) fn leave(&self) -> Result<()> {
        self.store.add("/agent/left", 1)?;
        if self.node != 0 {
            return Ok(());
        }
        let deadline = Instant::now() + self.join_timeout;
        while Instant::now() < deadline {
            let n = self.store.add("/agent/left", 0)?;
            if usize::try_from(n).is_ok_and(|n| n >= self.nnodes) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_round_trip() {
        for f in [
            Failure {
                rank: Some(3),
                node: 1,
                local_rank: Some(1),
                exit: RankExit::Signal(9),
                code: 137,
            },
            Failure {
                rank: None,
                node: 0,
                local_rank: None,
                exit: RankExit::Code(2),
                code: 2,
            },
        ] {
            assert_eq!(Failure::decode(&f.encode()), Some(f));
        }
        assert_eq!(Failure::decode("garbage"), None);
    }
}
