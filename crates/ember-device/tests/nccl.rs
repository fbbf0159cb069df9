#![allow(clippy::unwrap_used)]
//! NCCL through the driver seam, on 2 and 3 emulated devices, against naive host references
//! (Note [Emulated NCCL]); and the real driver's NCCL probe, which must never panic.

use ember_device::DeviceError;
use ember_device::driver::emulator::{Emulator, EmulatorConfig};
use ember_device::driver::{
    Collective, DevicePtr, Driver, NcclComm, NcclType, ReduceOp, StreamHandle,
};

mod nccl_common;
use nccl_common::{DTYPES, OPS, assert_values, data, decode, encode, reference};

struct Fixture {
    emu: Emulator,
    comms: Vec<NcclComm>,
}

impl Fixture {
    fn new(devices: usize) -> Fixture {
        let emu = Emulator::new(EmulatorConfig::devices(devices)).unwrap();
        let list: Vec<usize> = (0..devices).collect();
        let comms = emu.nccl_comm_init_all(&list).unwrap();
        Fixture { emu, comms }
    }

    fn upload(&self, device: usize, dtype: NcclType, values: &[f64]) -> DevicePtr {
        let bytes = encode(dtype, values);
        let p = self.emu.malloc(device, bytes.len().max(1)).unwrap();
        self.emu
            .memcpy_htod(p, &bytes, StreamHandle::DEFAULT)
            .unwrap();
        p
    }

    fn zeros(&self, device: usize, dtype: NcclType, n: usize) -> DevicePtr {
        self.upload(device, dtype, &vec![0.0; n])
    }

    fn download(&self, ptr: DevicePtr, dtype: NcclType, n: usize) -> Vec<f64> {
        let mut bytes = vec![0u8; n * dtype.size()];
        self.emu
            .memcpy_dtoh(&mut bytes, ptr, StreamHandle::DEFAULT)
            .unwrap();
        decode(dtype, &bytes)
    }

    /// Issue one collective per rank from this thread inside a group.
    fn group(&self, ops: &[Collective]) -> Result<(), DeviceError> {
        self.emu.nccl_group_start()?;
        for (comm, op) in self.comms.iter().zip(ops) {
            self.emu.nccl_collective(*comm, StreamHandle::DEFAULT, op)?;
        }
        self.emu.nccl_group_end()
    }
}

fn each_size(body: impl Fn(usize)) {
    for devices in [2, 3] {
        body(devices);
    }
}

#[test]
fn comm_info_names_device_rank_and_size() {
    each_size(|n| {
        let f = Fixture::new(n);
        for (r, c) in f.comms.iter().enumerate() {
            assert_eq!(f.emu.nccl_comm_info(*c).unwrap(), (r, r, n));
        }
        assert!(f.emu.nccl_version().unwrap() >= 21800);
    });
}

#[test]
fn all_reduce_matches_the_naive_reduction() {
    each_size(|n| {
        let f = Fixture::new(n);
        let count = 13;
        for dtype in DTYPES {
            for op in OPS {
                let inputs: Vec<Vec<f64>> = (0..n).map(|r| data(r, count)).collect();
                let sends: Vec<_> = (0..n).map(|r| f.upload(r, dtype, &inputs[r])).collect();
                let recvs: Vec<_> = (0..n).map(|r| f.zeros(r, dtype, count)).collect();
                let ops: Vec<_> = (0..n)
                    .map(|r| Collective::AllReduce {
                        send: sends[r],
                        recv: recvs[r],
                        count,
                        dtype,
                        op,
                    })
                    .collect();
                f.group(&ops).unwrap();
                let want = reference(dtype, op, &inputs);
                for (r, &recv) in recvs.iter().enumerate() {
                    let got = f.download(recv, dtype, count);
                    assert_values(
                        dtype,
                        &got,
                        &want,
                        &format!("all_reduce {op:?} n={n} rank {r}"),
                    );
                    // The input is untouched.
                    assert_values(
                        dtype,
                        &f.download(sends[r], dtype, count),
                        &inputs[r],
                        "send",
                    );
                }
            }
        }
    });
}

#[test]
fn all_reduce_in_place() {
    each_size(|n| {
        let f = Fixture::new(n);
        let dtype = NcclType::F32;
        let inputs: Vec<Vec<f64>> = (0..n).map(|r| data(r, 5)).collect();
        let bufs: Vec<_> = (0..n).map(|r| f.upload(r, dtype, &inputs[r])).collect();
        let ops: Vec<_> = bufs
            .iter()
            .map(|&b| Collective::AllReduce {
                send: b,
                recv: b,
                count: 5,
                dtype,
                op: ReduceOp::Sum,
            })
            .collect();
        f.group(&ops).unwrap();
        let want = reference(dtype, ReduceOp::Sum, &inputs);
        for &b in &bufs {
            assert_values(dtype, &f.download(b, dtype, 5), &want, "in place");
        }
    });
}

#[test]
fn broadcast_and_reduce_use_the_root() {
    each_size(|n| {
        let f = Fixture::new(n);
        let count = 7;
        for dtype in DTYPES {
            for root in 0..n {
                let inputs: Vec<Vec<f64>> = (0..n).map(|r| data(r, count)).collect();
                let sends: Vec<_> = (0..n).map(|r| f.upload(r, dtype, &inputs[r])).collect();
                let recvs: Vec<_> = (0..n).map(|r| f.zeros(r, dtype, count)).collect();
                let ops: Vec<_> = (0..n)
                    .map(|r| Collective::Broadcast {
                        send: sends[r],
                        recv: recvs[r],
                        count,
                        dtype,
                        root,
                    })
                    .collect();
                f.group(&ops).unwrap();
                for &recv in &recvs {
                    assert_values(
                        dtype,
                        &f.download(recv, dtype, count),
                        &inputs[root],
                        "broadcast",
                    );
                }
                let outs: Vec<_> = (0..n).map(|r| f.zeros(r, dtype, count)).collect();
                let ops: Vec<_> = (0..n)
                    .map(|r| Collective::Reduce {
                        send: sends[r],
                        recv: outs[r],
                        count,
                        dtype,
                        op: ReduceOp::Max,
                        root,
                    })
                    .collect();
                f.group(&ops).unwrap();
                let want = reference(dtype, ReduceOp::Max, &inputs);
                for (r, &out) in outs.iter().enumerate() {
                    let got = f.download(out, dtype, count);
                    if r == root {
                        assert_values(dtype, &got, &want, "reduce at root");
                    } else {
                        assert_values(dtype, &got, &vec![0.0; count], "reduce off root");
                    }
                }
            }
        }
    });
}

#[test]
fn all_gather_and_reduce_scatter() {
    each_size(|n| {
        let f = Fixture::new(n);
        let count = 4;
        for dtype in DTYPES {
            let inputs: Vec<Vec<f64>> = (0..n).map(|r| data(r, count)).collect();
            let sends: Vec<_> = (0..n).map(|r| f.upload(r, dtype, &inputs[r])).collect();
            let recvs: Vec<_> = (0..n).map(|r| f.zeros(r, dtype, count * n)).collect();
            let ops: Vec<_> = (0..n)
                .map(|r| Collective::AllGather {
                    send: sends[r],
                    recv: recvs[r],
                    count,
                    dtype,
                })
                .collect();
            f.group(&ops).unwrap();
            let want: Vec<f64> = inputs.concat();
            for &recv in &recvs {
                assert_values(
                    dtype,
                    &f.download(recv, dtype, count * n),
                    &want,
                    "all_gather",
                );
            }

            let big: Vec<Vec<f64>> = (0..n).map(|r| data(r + 1, count * n)).collect();
            let sends: Vec<_> = (0..n).map(|r| f.upload(r, dtype, &big[r])).collect();
            let recvs: Vec<_> = (0..n).map(|r| f.zeros(r, dtype, count)).collect();
            let ops: Vec<_> = (0..n)
                .map(|r| Collective::ReduceScatter {
                    send: sends[r],
                    recv: recvs[r],
                    count,
                    dtype,
                    op: ReduceOp::Sum,
                })
                .collect();
            f.group(&ops).unwrap();
            let full = reference(dtype, ReduceOp::Sum, &big);
            for (r, &recv) in recvs.iter().enumerate() {
                assert_values(
                    dtype,
                    &f.download(recv, dtype, count),
                    &full[r * count..(r + 1) * count],
                    "reduce_scatter",
                );
            }
        }
    });
}

#[test]
fn ranks_on_threads_meet_without_a_group() {
    each_size(|n| {
        let emu = Emulator::new(EmulatorConfig::devices(n)).unwrap();
        let id = emu.nccl_unique_id().unwrap();
        let dtype = NcclType::F64;
        let inputs: Vec<Vec<f64>> = (0..n).map(|r| data(r, 6)).collect();
        let results: Vec<Vec<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let (emu, inputs) = (&emu, &inputs);
                    s.spawn(move || {
                        let comm = emu.nccl_comm_init_rank(rank, n, &id, rank).unwrap();
                        let stream = emu.stream_create(rank).unwrap();
                        let bytes = encode(dtype, &inputs[rank]);
                        let p = emu.malloc(rank, bytes.len()).unwrap();
                        emu.memcpy_htod(p, &bytes, stream).unwrap();
                        let op = Collective::AllReduce {
                            send: p,
                            recv: p,
                            count: 6,
                            dtype,
                            op: ReduceOp::Sum,
                        };
                        emu.nccl_collective(comm, stream, &op).unwrap();
                        let mut out = vec![0u8; bytes.len()];
                        emu.memcpy_dtoh(&mut out, p, stream).unwrap();
                        emu.nccl_comm_destroy(comm).unwrap();
                        decode(dtype, &out)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want = reference(dtype, ReduceOp::Sum, &inputs);
        for got in results {
            assert_values(dtype, &got, &want, "threaded all_reduce");
        }
    });
}

/// `nccl_comm_abort` from another thread wakes a rank blocked in a collective on the
/// clique with an error, and leaves the aborted handle and the clique unusable (Note
/// [Emulated NCCL]); nothing waits for the emulator's own timeout.
#[test]
fn abort_wakes_a_blocked_rank_and_the_clique_is_unusable() {
    let f = Fixture::new(2);
    let p0 = f.upload(0, NcclType::F32, &[1.0, 2.0]);
    let p1 = f.upload(1, NcclType::F32, &[3.0, 4.0]);
    let op = |p| Collective::AllReduce {
        send: p,
        recv: p,
        count: 2,
        dtype: NcclType::F32,
        op: ReduceOp::Sum,
    };
    let started = std::time::Instant::now();
    let blocked = std::thread::scope(|s| {
        // Rank 0 waits for rank 1, which never issues its part.
        let h = s.spawn(|| {
            f.emu
                .nccl_collective(f.comms[0], StreamHandle::DEFAULT, &op(p0))
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!h.is_finished(), "rank 0 did not wait for rank 1");
        f.emu.nccl_comm_abort(f.comms[0]).unwrap();
        h.join().unwrap()
    });
    let e = blocked.unwrap_err().to_string();
    assert!(
        e.contains("communicator of rank 0 of this clique was aborted")
            && e.contains("rank 0's collectives"),
        "{e}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // The other rank's later call fails instead of pairing with the abandoned one.
    let e = f
        .emu
        .nccl_collective(f.comms[1], StreamHandle::DEFAULT, &op(p1))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 1's collectives on the clique cannot complete"),
        "{e}"
    );
    assert_eq!(f.download(p1, NcclType::F32, 2), vec![3.0, 4.0]);
    // The aborted handle is gone, with a reason; aborting or destroying it again is an error.
    for e in [
        f.emu.nccl_comm_info(f.comms[0]).unwrap_err(),
        f.emu.nccl_comm_abort(f.comms[0]).unwrap_err(),
        f.emu.nccl_comm_destroy(f.comms[0]).unwrap_err(),
    ] {
        assert!(e.to_string().contains("was aborted (ncclCommAbort)"), "{e}");
    }
    f.emu.nccl_comm_destroy(f.comms[1]).unwrap();
}

#[test]
fn mismatched_counts_or_types_are_errors_on_every_rank() {
    let f = Fixture::new(2);
    let a = f.zeros(0, NcclType::F32, 8);
    let b = f.zeros(1, NcclType::F32, 8);
    let op = |send, count, dtype| Collective::AllReduce {
        send,
        recv: send,
        count,
        dtype,
        op: ReduceOp::Sum,
    };
    let err = f
        .group(&[op(a, 8, NcclType::F32), op(b, 6, NcclType::F32)])
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("disagree") && msg.contains("of 6 f32"),
        "{msg}"
    );
    let err = f
        .group(&[op(a, 4, NcclType::F32), op(b, 4, NcclType::F64)])
        .unwrap_err();
    assert!(err.to_string().contains("f64"), "{err}");
    // The clique still works afterwards.
    f.group(&[op(a, 8, NcclType::F32), op(b, 8, NcclType::F32)])
        .unwrap();
}

#[test]
fn bad_calls_are_errors() {
    let f = Fixture::new(2);
    let on0 = f.zeros(0, NcclType::F32, 4);
    // A buffer of another device.
    let err = f
        .emu
        .nccl_collective(
            f.comms[1],
            StreamHandle::DEFAULT,
            &Collective::AllReduce {
                send: on0,
                recv: on0,
                count: 4,
                dtype: NcclType::F32,
                op: ReduceOp::Sum,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("not memory of cuda:1"), "{err}");
    // A buffer too small for the count.
    let err = f
        .emu
        .nccl_collective(
            f.comms[0],
            StreamHandle::DEFAULT,
            &Collective::AllReduce {
                send: on0,
                recv: on0,
                count: 5,
                dtype: NcclType::F32,
                op: ReduceOp::Sum,
            },
        )
        .unwrap_err();
    assert!(matches!(err, DeviceError::Driver { .. }), "{err}");
    // A stream of another device.
    let s1 = f.emu.stream_create(1).unwrap();
    let err = f
        .emu
        .nccl_collective(
            f.comms[0],
            s1,
            &Collective::Broadcast {
                send: on0,
                recv: on0,
                count: 4,
                dtype: NcclType::F32,
                root: 0,
            },
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("stream belongs to cuda:1"),
        "{err}"
    );
    // A root out of range.
    let err = f
        .emu
        .nccl_collective(
            f.comms[0],
            StreamHandle::DEFAULT,
            &Collective::Broadcast {
                send: on0,
                recv: on0,
                count: 4,
                dtype: NcclType::F32,
                root: 2,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("root 2"), "{err}");
    // Init errors and unknown handles.
    assert!(f.emu.nccl_comm_init_all(&[0, 0]).is_err());
    assert!(f.emu.nccl_comm_init_all(&[0, 5]).is_err());
    assert!(f.emu.nccl_group_end().is_err());
    let id = f.emu.nccl_unique_id().unwrap();
    f.emu.nccl_comm_init_rank(0, 2, &id, 0).unwrap();
    assert!(
        f.emu.nccl_comm_init_rank(1, 2, &id, 0).is_err(),
        "rank twice"
    );
    assert!(
        f.emu.nccl_comm_init_rank(1, 3, &id, 1).is_err(),
        "size differs"
    );
    let other = Emulator::new(EmulatorConfig::devices(2)).unwrap();
    assert!(
        other.nccl_comm_init_rank(1, 2, &id, 1).is_err(),
        "other emulator"
    );
    f.emu.nccl_comm_destroy(f.comms[0]).unwrap();
    assert!(matches!(
        f.emu.nccl_comm_destroy(f.comms[0]),
        Err(DeviceError::InvalidHandle { .. })
    ));
}

#[test]
fn real_nccl_probe_never_panics() {
    match ember_device::driver::real::probe_nccl() {
        Ok(v) => assert!(v >= ember_device::driver::real::MIN_NCCL_VERSION),
        Err(why) => assert!(why.contains("NCCL"), "{why}"),
    }
}
