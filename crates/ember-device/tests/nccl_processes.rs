#![allow(clippy::unwrap_used)]
//! The emulator's NCCL with ranks in separate processes (Note [NCCL across processes]):
//! every collective against the naive host reference with a clique of three ranks, two on
//! threads of the process that made the id and one in a child process (this test binary
//! started again in a role); a rank whose process dies, the clique's own process dying, and
//! an abort in another process each end the waiting ranks with an error naming what
//! happened, never a hang.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};

use ember_device::driver::emulator::{Emulator, EmulatorConfig};
use ember_device::driver::{
    Collective, DevicePtr, Driver, NcclComm, NcclType, NcclUniqueId, ReduceOp, StreamHandle,
};

mod nccl_common;
use nccl_common::{DTYPES, OPS, assert_values, data, decode, encode, reference};

const ROLE: &str = "EMBER_NCCL_PROCESS_ROLE";
const ID: &str = "EMBER_NCCL_PROCESS_ID";
const N: usize = 6;

fn hex(id: &NcclUniqueId) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> NcclUniqueId {
    let mut id = [0u8; NcclUniqueId::BYTES];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    NcclUniqueId(id)
}

/// This test binary started again as `role` of test `test`, its id from `id`.
fn spawn(test: &str, role: &str, id: Option<&NcclUniqueId>) -> (Child, BufReader<ChildStdout>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(id) = id {
        cmd.env(ID, hex(id));
    }
    let mut child = cmd.spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// The next line of `out` that starts with `tag`, without it.
fn line_after(out: &mut BufReader<ChildStdout>, tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "no {tag:?} line");
        if let Some(rest) = line.trim_end().strip_prefix(tag) {
            return rest.to_string();
        }
    }
}

/// Blocks until the parent writes a line (or closes stdin).
fn wait_for_parent() {
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

struct Rank<'a> {
    emu: &'a Emulator,
    comm: NcclComm,
    rank: usize,
    nranks: usize,
    device: usize,
    stream: StreamHandle,
}

impl Rank<'_> {
    fn upload(&self, dtype: NcclType, values: &[f64]) -> DevicePtr {
        let bytes = encode(dtype, values);
        let p = self.emu.malloc(self.device, bytes.len().max(1)).unwrap();
        self.emu.memcpy_htod(p, &bytes, self.stream).unwrap();
        p
    }

    fn download(&self, p: DevicePtr, dtype: NcclType, n: usize) -> Vec<f64> {
        let mut b = vec![0u8; n * dtype.size()];
        self.emu.memcpy_dtoh(&mut b, p, self.stream).unwrap();
        decode(dtype, &b)
    }

    fn run(&self, op: &Collective) {
        self.emu
            .nccl_collective(self.comm, self.stream, op)
            .unwrap();
    }

    /// Every collective of the script, each checked against the naive reference.
    fn script(&self) {
        let (r, n) = (self.rank, self.nranks);
        let all: Vec<Vec<f64>> = (0..n).map(|q| data(q, N)).collect();
        for dtype in DTYPES {
            for op in OPS {
                let p = self.upload(dtype, &all[r]);
                self.run(&Collective::AllReduce {
                    send: p,
                    recv: p,
                    count: N,
                    dtype,
                    op,
                });
                let what = format!("rank {r}: all_reduce {op:?}");
                assert_values(
                    dtype,
                    &self.download(p, dtype, N),
                    &reference(dtype, op, &all),
                    &what,
                );
            }
            // The root is the rank of the other process.
            let p = self.upload(dtype, &all[r]);
            self.run(&Collective::Broadcast {
                send: p,
                recv: p,
                count: N,
                dtype,
                root: 1,
            });
            assert_values(dtype, &self.download(p, dtype, N), &all[1], "broadcast");
            let (send, recv) = (self.upload(dtype, &all[r]), self.upload(dtype, &[0.0; N]));
            self.run(&Collective::Reduce {
                send,
                recv,
                count: N,
                dtype,
                op: ReduceOp::Sum,
                root: 1,
            });
            if r == 1 {
                let want = reference(dtype, ReduceOp::Sum, &all);
                assert_values(dtype, &self.download(recv, dtype, N), &want, "reduce");
            }
            let (send, recv) = (
                self.upload(dtype, &all[r]),
                self.upload(dtype, &vec![0.0; N * n]),
            );
            self.run(&Collective::AllGather {
                send,
                recv,
                count: N,
                dtype,
            });
            let want: Vec<f64> = all.iter().flatten().copied().collect();
            assert_values(
                dtype,
                &self.download(recv, dtype, N * n),
                &want,
                "all_gather",
            );
            let big: Vec<Vec<f64>> = (0..n).map(|q| data(q + 1, N * n)).collect();
            let (send, recv) = (self.upload(dtype, &big[r]), self.upload(dtype, &[0.0; N]));
            self.run(&Collective::ReduceScatter {
                send,
                recv,
                count: N,
                dtype,
                op: ReduceOp::Max,
            });
            let want = reference(dtype, ReduceOp::Max, &big);
            assert_values(
                dtype,
                &self.download(recv, dtype, N),
                &want[r * N..(r + 1) * N],
                "reduce_scatter",
            );
        }
        // Two calls in one group: both are sent before either reply is awaited.
        let (a, b) = (
            self.upload(NcclType::F32, &all[r]),
            self.upload(NcclType::F64, &all[r]),
        );
        self.emu.nccl_group_start().unwrap();
        for (p, dtype) in [(a, NcclType::F32), (b, NcclType::F64)] {
            self.run(&Collective::AllReduce {
                send: p,
                recv: p,
                count: N,
                dtype,
                op: ReduceOp::Sum,
            });
        }
        self.emu.nccl_group_end().unwrap();
        for (p, dtype) in [(a, NcclType::F32), (b, NcclType::F64)] {
            let want = reference(dtype, ReduceOp::Sum, &all);
            assert_values(
                dtype,
                &self.download(p, dtype, N),
                &want,
                "grouped all_reduce",
            );
        }
        // Ranks that disagree fail alike, in both processes; the clique goes on.
        let p = self.upload(NcclType::F32, &vec![1.0; N + r]);
        let e = self
            .emu
            .nccl_collective(
                self.comm,
                self.stream,
                &Collective::AllReduce {
                    send: p,
                    recv: p,
                    count: N + r,
                    dtype: NcclType::F32,
                    op: ReduceOp::Sum,
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("ranks disagree"), "rank {r}: {e}");
        let p = self.upload(NcclType::F32, &all[r]);
        self.run(&Collective::AllReduce {
            send: p,
            recv: p,
            count: N,
            dtype: NcclType::F32,
            op: ReduceOp::Min,
        });
        let want = reference(NcclType::F32, ReduceOp::Min, &all);
        assert_values(
            NcclType::F32,
            &self.download(p, NcclType::F32, N),
            &want,
            "after",
        );
        self.emu.nccl_comm_destroy(self.comm).unwrap();
    }
}

fn join<'a>(
    emu: &'a Emulator,
    id: &NcclUniqueId,
    rank: usize,
    nranks: usize,
    device: usize,
) -> Rank<'a> {
    let comm = emu.nccl_comm_init_rank(device, nranks, id, rank).unwrap();
    let stream = emu.stream_create(device).unwrap();
    Rank {
        emu,
        comm,
        rank,
        nranks,
        device,
        stream,
    }
}

fn all_reduce_of_one(r: &Rank<'_>) -> Result<(), ember_device::DeviceError> {
    let p = r.upload(NcclType::F32, &[1.0]);
    r.emu.nccl_collective(
        r.comm,
        r.stream,
        &Collective::AllReduce {
            send: p,
            recv: p,
            count: 1,
            dtype: NcclType::F32,
            op: ReduceOp::Sum,
        },
    )
}

fn emulator() -> Emulator {
    Emulator::new(EmulatorConfig::devices(2)).unwrap()
}

#[test]
fn ranks_in_two_processes_run_every_collective() {
    const TEST: &str = "ranks_in_two_processes_run_every_collective";
    if std::env::var(ROLE).as_deref() == Ok("rank1") {
        let emu = emulator();
        // Its own cuda:0: devices of two processes are two GPUs.
        join(&emu, &unhex(&std::env::var(ID).unwrap()), 1, 3, 0).script();
        return;
    }
    let emu = emulator();
    let id = emu.nccl_unique_id().unwrap();
    let (mut child, _out) = spawn(TEST, "rank1", Some(&id));
    std::thread::scope(|s| {
        for (rank, device) in [(0, 0), (2, 1)] {
            let (emu, id) = (&emu, &id);
            s.spawn(move || join(emu, id, rank, 3, device).script());
        }
    });
    assert!(child.wait().unwrap().success(), "rank 1's process failed");
}

#[test]
fn a_rank_whose_process_dies_is_named_as_lost() {
    const TEST: &str = "a_rank_whose_process_dies_is_named_as_lost";
    if std::env::var(ROLE).as_deref() == Ok("die") {
        let emu = emulator();
        let _rank = join(&emu, &unhex(&std::env::var(ID).unwrap()), 1, 2, 0);
        println!("joined");
        wait_for_parent();
        // Dies without destroying its communicator.
        std::process::exit(3);
    }
    let emu = emulator();
    let id = emu.nccl_unique_id().unwrap();
    let (mut child, mut out) = spawn(TEST, "die", Some(&id));
    let r = join(&emu, &id, 0, 2, 0);
    line_after(&mut out, "joined");
    std::thread::scope(|s| {
        // Waits for rank 1, which dies meanwhile.
        let waiting = s.spawn(|| all_reduce_of_one(&r));
        let _ = writeln!(child.stdin.as_mut().unwrap(), "die");
        assert_eq!(child.wait().unwrap().code(), Some(3));
        let e = waiting.join().unwrap().unwrap_err();
        assert!(
            e.to_string().contains("rank 1 of this clique was lost"),
            "{e}"
        );
    });
    // Later calls fail at once the same way.
    let e = all_reduce_of_one(&r).unwrap_err();
    assert!(e.to_string().contains("was lost"), "{e}");
}

#[test]
fn an_abort_in_another_process_ends_the_clique() {
    const TEST: &str = "an_abort_in_another_process_ends_the_clique";
    if std::env::var(ROLE).as_deref() == Ok("abort") {
        let emu = emulator();
        let r = join(&emu, &unhex(&std::env::var(ID).unwrap()), 1, 2, 0);
        println!("joined");
        wait_for_parent();
        emu.nccl_comm_abort(r.comm).unwrap();
        let e = all_reduce_of_one(&r).unwrap_err();
        assert!(e.to_string().contains("was aborted"), "{e}");
        return;
    }
    let emu = emulator();
    let id = emu.nccl_unique_id().unwrap();
    let (mut child, mut out) = spawn(TEST, "abort", Some(&id));
    let r = join(&emu, &id, 0, 2, 0);
    line_after(&mut out, "joined");
    std::thread::scope(|s| {
        let waiting = s.spawn(|| all_reduce_of_one(&r));
        let _ = writeln!(child.stdin.as_mut().unwrap(), "abort");
        let e = waiting.join().unwrap().unwrap_err();
        assert!(
            e.to_string().contains("rank 1 of this clique was aborted"),
            "{e}"
        );
    });
    assert!(
        child.wait().unwrap().success(),
        "the aborting process failed"
    );
}

#[test]
fn the_process_running_the_clique_dying_fails_the_others() {
    const TEST: &str = "the_process_running_the_clique_dying_fails_the_others";
    if std::env::var(ROLE).as_deref() == Ok("host") {
        let emu = emulator();
        let id = emu.nccl_unique_id().unwrap();
        let _r = join(&emu, &id, 0, 2, 0);
        println!("id {}", hex(&id));
        wait_for_parent();
        std::process::exit(9);
    }
    let (mut child, mut out) = spawn(TEST, "host", None);
    let id = unhex(&line_after(&mut out, "id "));
    let emu = emulator();
    let r = join(&emu, &id, 1, 2, 1);
    std::thread::scope(|s| {
        // Waits for rank 0, whose process dies meanwhile.
        let waiting = s.spawn(|| all_reduce_of_one(&r));
        let _ = writeln!(child.stdin.as_mut().unwrap(), "die");
        assert_eq!(child.wait().unwrap().code(), Some(9));
        let e = waiting.join().unwrap().unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("which runs the clique") && msg.contains("closed"),
            "{msg}"
        );
    });
    // A rank that comes after the clique's process ended cannot join.
    let e = emu.nccl_comm_init_rank(0, 2, &id, 0).unwrap_err();
    assert!(
        e.to_string().contains("cannot join the clique of process"),
        "{e}"
    );
}
