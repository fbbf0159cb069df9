//! The emulator's NCCL across processes: the ranks of a clique in other processes.
//!
//! Note [NCCL across processes]:
//!
//! Emulated devices live in host memory of one process, so a clique whose ranks are
//! separate processes (`ember launch --nproc-per-node 2 -- ember train --device cuda`)
//! cannot read each other's buffers. The process that made the clique's unique id runs the
//! clique, as for ranks on its own threads, and the ranks of other processes take part
//! through it: `nccl_unique_id` first starts a listener on the abstract Unix socket
//! `ember-nccl-PID-INSTANCE`, named by the id's process and emulator instance (no file to
//! clean up: the name goes with the process). A rank whose id names another process
//! connects there in `nccl_comm_init_rank` and joins the clique as a remote member, on its
//! own device (devices of different processes are different GPUs, so two processes may both
//! use their `cuda:0`). Each collective it issues sends its call and its send buffer's bytes
//! (read at enqueue time, Note [Emulated streams]); the clique's process deposits the call
//! as for a local rank (the same numbering, the same check that every rank issued the same
//! collective) and runs it when complete, reading remote ranks' inputs from the bytes sent
//! and sending back what each remote rank receives, which it writes into its recv buffer
//! before the call returns. Groups work as within a process: the calls of a group are all
//! sent before any reply is awaited.
//!
//! Faults end the clique instead of hanging it: a remote rank whose connection closes
//! without `nccl_comm_destroy` (its process died) ends the clique for every rank with an
//! error naming it as lost; `nccl_comm_abort` on a remote rank ends it as an abort does
//! (and wakes this process's thread waiting for the reply); if the clique's own process
//! dies, the remote ranks' connections close and their calls fail saying so. A remote rank
//! waits for a reply at most [`COLLECTIVE_TIMEOUT`] plus a margin.
//!
//! The wire format (little-endian) is frames of `len: u64`, `kind: u8` and `len` bytes: a
//! join (`key`, `nranks`, `rank`, `device`: u64 each), a collective (its kind, count,
//! element type, operator and root, then the send bytes), a destroy, an abort; replies are
//! an ok (the received bytes) or an error (the NCCL code's length as u32, the code, the
//! detail). The emulator's devices are on one machine, so the socket is local: ranks on two
//! machines need real NCCL.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::nccl::COLLECTIVE_TIMEOUT;
use super::nccl_clique::{Ended, NcclShared, Ticket};
use super::nccl_run::invalid;
use crate::driver::{Collective, DevicePtr, NcclType, ReduceOp};
use crate::error::{DeviceError, Result};

const JOIN: u8 = 1;
const COLL: u8 = 2;
const DESTROY: u8 = 3;
const ABORT: u8 = 4;
const OK: u8 = 10;
const ERR: u8 = 11;

/// Longest frame accepted (a collective's buffer).
const MAX_FRAME: u64 = 1 << 36;

/// How long past [`COLLECTIVE_TIMEOUT`] a remote rank waits for its reply.
const REPLY_MARGIN: Duration = Duration::from_secs(30);

const TYPES: [NcclType; 8] = [
    NcclType::I8,
    NcclType::U8,
    NcclType::I32,
    NcclType::I64,
    NcclType::F16,
    NcclType::Bf16,
    NcclType::F32,
    NcclType::F64,
];
const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

fn socket_name(pid: u32, instance: u64) -> String {
    format!("ember-nccl-{pid}-{instance}")
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the emulator's NCCL across processes needs Linux's abstract sockets",
    ))
}

fn write_frame(w: &mut impl Write, kind: u8, parts: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut head = Vec::with_capacity(9);
    head.extend_from_slice(&(len as u64).to_le_bytes());
    head.push(kind);
    w.write_all(&head)?;
    for p in parts {
        w.write_all(p)?;
    }
    w.flush()
}

fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    let mut len = [0u8; 8];
    len.copy_from_slice(&head[..8]);
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes is more than the emulator's NCCL takes"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok((head[8], body))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at + 8)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(s);
    Some(u64::from_le_bytes(w))
}

/// The call's shape (kind, count, type, operator, root): the buffers are the sender's.
fn encode_op(op: &Collective) -> Vec<u8> {
    let kind: u8 = match op {
        Collective::AllReduce { .. } => 0,
        Collective::Broadcast { .. } => 1,
        Collective::Reduce { .. } => 2,
        Collective::AllGather { .. } => 3,
        Collective::ReduceScatter { .. } => 4,
    };
    let ty = TYPES.iter().position(|&t| t == op.dtype()).unwrap_or(0) as u8;
    let rop = op
        .op()
        .and_then(|o| OPS.iter().position(|&x| x == o))
        .map_or(u8::MAX, |p| p as u8);
    let mut b = vec![kind];
    b.extend_from_slice(&(op.count() as u64).to_le_bytes());
    b.push(ty);
    b.push(rop);
    b.extend_from_slice(&(op.root().map_or(u64::MAX, |r| r as u64)).to_le_bytes());
    b
}

const OP_BYTES: usize = 1 + 8 + 1 + 1 + 8;

fn decode_op(b: &[u8]) -> Option<Collective> {
    let (send, recv) = (DevicePtr(0), DevicePtr(0));
    let count = usize::try_from(u64_at(b, 1)?).ok()?;
    let dtype = *TYPES.get(usize::from(*b.get(9)?))?;
    let op = OPS.get(usize::from(*b.get(10)?)).copied();
    let root = usize::try_from(u64_at(b, 11)?).unwrap_or(usize::MAX);
    Some(match b.first()? {
        0 => Collective::AllReduce {
            send,
            recv,
            count,
            dtype,
            op: op?,
        },
        1 => Collective::Broadcast {
            send,
            recv,
            count,
            dtype,
            root,
        },
        2 => Collective::Reduce {
            send,
            recv,
            count,
            dtype,
            op: op?,
            root,
        },
        3 => Collective::AllGather {
            send,
            recv,
            count,
            dtype,
        },
        4 => Collective::ReduceScatter {
            send,
            recv,
            count,
            dtype,
            op: op?,
        },
        _ => return None,
    })
}

fn error_reply(e: &DeviceError) -> Vec<u8> {
    let (code, detail) = match e {
        DeviceError::Driver { code, detail, .. } => (code.clone(), detail.clone()),
        other => ("ncclInternalError".to_string(), other.to_string()),
    };
    let mut b = (code.len() as u32).to_le_bytes().to_vec();
    b.extend_from_slice(code.as_bytes());
    b.extend_from_slice(detail.as_bytes());
    b
}

fn decode_error(call: &'static str, b: &[u8]) -> DeviceError {
    let n = b
        .get(..4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize);
    let code = b.get(4..4 + n).unwrap_or_default();
    let detail = b.get(4 + n..).unwrap_or_default();
    DeviceError::Driver {
        call,
        code: String::from_utf8_lossy(code).into_owned(),
        detail: String::from_utf8_lossy(detail).into_owned(),
    }
}

/// Starts the listener through which ranks of other processes join this process's cliques.
pub(super) fn serve(shared: Arc<NcclShared>) -> std::result::Result<(), String> {
    let name = socket_name(std::process::id(), shared.instance);
    let listener = abstract_addr(&name)
        .and_then(|a| UnixListener::bind_addr(&a))
        .map_err(|e| {
            format!(
                "cannot listen on the abstract socket {name:?} for ranks of other processes: {e}"
            )
        })?;
    std::thread::Builder::new()
        .name("ember-emu-nccl".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let shared = shared.clone();
                let _ = std::thread::Builder::new()
                    .name("ember-emu-nccl-rank".into())
                    .spawn(move || member(&shared, conn));
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the emulator's NCCL listener: {e}"))
}

/// Serves one remote rank: its join, then its calls until it leaves.
fn member(shared: &Arc<NcclShared>, mut conn: UnixStream) {
    let Ok((JOIN, b)) = read_frame(&mut conn) else {
        return;
    };
    let field = |i: usize| u64_at(&b, 8 * i).and_then(|v| usize::try_from(v).ok());
    let (Some(key), Some(nranks), Some(rank), Some(device)) =
        (u64_at(&b, 0), field(1), field(2), field(3))
    else {
        return;
    };
    let c = match shared.join(key, nranks, rank, device, true) {
        Ok(c) => c,
        Err(e) => {
            let _ = write_frame(&mut conn, ERR, &[&error_reply(&e)]);
            return;
        }
    };
    if write_frame(&mut conn, OK, &[]).is_err() {
        shared.leave(c, Some(Ended::Lost(rank)));
        return;
    }
    let Ok(mut writer) = conn.try_clone() else {
        shared.leave(c, Some(Ended::Lost(rank)));
        return;
    };
    let (tx, rx) = mpsc::channel::<Result<Ticket>>();
    let waiter = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            for t in rx {
                let sent = match t.and_then(|t| shared.wait(t)) {
                    Ok(out) => write_frame(&mut writer, OK, &[&out.unwrap_or_default()]),
                    Err(e) => write_frame(&mut writer, ERR, &[&error_reply(&e)]),
                };
                if sent.is_err() {
                    return;
                }
            }
        })
    };
    let ended = loop {
        match read_frame(&mut conn) {
            Ok((COLL, b)) => {
                let deposited = match decode_op(&b) {
                    Some(op) => shared.deposit(c, &op, Some(b[OP_BYTES..].to_vec())),
                    None => Err(invalid("ncclCollective", "a malformed call".into())),
                };
                if tx.send(deposited).is_err() {
                    break Some(Ended::Lost(rank));
                }
            }
            Ok((DESTROY, _)) => break None,
            Ok((ABORT, _)) => break Some(Ended::Aborted(rank)),
            Ok(_) | Err(_) => break Some(Ended::Lost(rank)),
        }
    };
    shared.leave(c, ended);
    drop(tx);
    let _ = waiter.join();
}

/// This process's rank in a clique run by another process.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) rank: usize,
    pub(super) device: usize,
    pub(super) nranks: usize,
    /// The process that runs the clique.
    host: u32,
    writer: Mutex<UnixStream>,
    reader: Mutex<UnixStream>,
    /// Shut down by `close`, waking a thread waiting for a reply.
    closer: UnixStream,
}

impl Link {
    /// Joins the clique of id `key` run by process `pid` as rank `rank` on `device`.
    pub(super) fn join(
        pid: u32,
        instance: u64,
        key: u64,
        nranks: usize,
        rank: usize,
        device: usize,
    ) -> Result<Link> {
        const CALL: &str = "ncclCommInitRank";
        let name = socket_name(pid, instance);
        let fail = |e: std::io::Error| DeviceError::Driver {
            call: CALL,
            code: "ncclSystemError".into(),
            detail: format!(
                "rank {rank} cannot join the clique of process {pid} (which made the unique id) through the socket {name:?}: {e} (the emulator's NCCL joins processes of one machine; has that process ended?)"
            ),
        };
        let mut conn = abstract_addr(&name)
            .and_then(|a| UnixStream::connect_addr(&a))
            .map_err(fail)?;
        let mut join = Vec::with_capacity(32);
        for v in [key, nranks as u64, rank as u64, device as u64] {
            join.extend_from_slice(&v.to_le_bytes());
        }
        conn.set_read_timeout(Some(REPLY_MARGIN)).map_err(fail)?;
        write_frame(&mut conn, JOIN, &[&join]).map_err(fail)?;
        match read_frame(&mut conn).map_err(fail)? {
            (OK, _) => {}
            (_, b) => return Err(decode_error(CALL, &b)),
        }
        let reader = conn.try_clone().map_err(fail)?;
        let closer = conn.try_clone().map_err(fail)?;
        Ok(Link {
            rank,
            device,
            nranks,
            host: pid,
            writer: Mutex::new(conn),
            reader: Mutex::new(reader),
            closer,
        })
    }

    fn lost(&self, call: &'static str, e: &std::io::Error) -> DeviceError {
        DeviceError::Driver {
            call,
            code: "ncclRemoteError".into(),
            detail: format!(
                "rank {}'s connection to process {}, which runs the clique (the process that made the unique id, rank 0's under `ember launch`), closed ({e}): that process ended, or this communicator was aborted",
                self.rank, self.host
            ),
        }
    }

    /// Sends one call with its send buffer's bytes.
    pub(super) fn send(&self, op: &Collective, input: &[u8]) -> Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        write_frame(&mut *w, COLL, &[&encode_op(op), input]).map_err(|e| self.lost(op.call(), &e))
    }

    /// Waits for the reply to the oldest call sent: the bytes this rank receives.
    pub(super) fn receive(&self, call: &'static str) -> Result<Vec<u8>> {
        let mut r = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let _ = r.set_read_timeout(Some(COLLECTIVE_TIMEOUT + REPLY_MARGIN));
        match read_frame(&mut *r).map_err(|e| self.lost(call, &e))? {
            (OK, b) => Ok(b),
            (_, b) => Err(decode_error(call, &b)),
        }
    }

    /// Leaves the clique (`abort`: ending it for every rank, as `ncclCommAbort`), and wakes
    /// a thread of this process waiting for a reply.
    pub(super) fn close(&self, abort: bool) {
        if let Ok(mut w) = self.writer.try_lock() {
            let _ = write_frame(&mut *w, if abort { ABORT } else { DESTROY }, &[]);
        }
        let _ = self.closer.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_round_trip_through_the_wire_format() {
        let ops = [
            Collective::AllReduce {
                send: DevicePtr(0),
                recv: DevicePtr(0),
                count: 7,
                dtype: NcclType::Bf16,
                op: ReduceOp::Avg,
            },
            Collective::Broadcast {
                send: DevicePtr(0),
                recv: DevicePtr(0),
                count: 3,
                dtype: NcclType::I64,
                root: 2,
            },
            Collective::Reduce {
                send: DevicePtr(0),
                recv: DevicePtr(0),
                count: 1,
                dtype: NcclType::F64,
                op: ReduceOp::Min,
                root: 1,
            },
            Collective::AllGather {
                send: DevicePtr(0),
                recv: DevicePtr(0),
                count: 5,
                dtype: NcclType::U8,
            },
            Collective::ReduceScatter {
                send: DevicePtr(0),
                recv: DevicePtr(0),
                count: 9,
                dtype: NcclType::F32,
                op: ReduceOp::Prod,
            },
        ];
        for op in ops {
            let b = encode_op(&op);
            assert_eq!(b.len(), OP_BYTES);
            assert_eq!(decode_op(&b), Some(op));
        }
        assert_eq!(decode_op(&[9; OP_BYTES]), None);
        let e = DeviceError::Driver {
            call: "ncclAllReduce",
            code: "ncclRemoteError".into(),
            detail: "rank 1 was lost".into(),
        };
        assert_eq!(decode_error("ncclAllReduce", &error_reply(&e)), e);
    }
}
