//! NCCL on the real driver: cudarc's raw NCCL bindings, `libnccl.so` loaded at run time.
//! See Note [NCCL through the seam].
//!
//! The library is probed once per process ([`probe`]): its presence first, then
//! `ncclGetVersion` under `catch_unwind` with the panic hook silenced (cudarc panics on a
//! missing symbol). Every later call goes through the loaded library. Communicators are kept
//! in the driver's tables (handle → device, rank, ranks), so an unknown or destroyed one is
//! [`DeviceError::InvalidHandle`], not undefined behaviour.

use std::ffi::c_int;
use std::sync::OnceLock;

use cudarc::nccl::sys as nccl_sys;

use super::RealDriver;
use crate::driver::{Collective, NcclComm, NcclType, NcclUniqueId, ReduceOp, StreamHandle};
use crate::error::{DeviceError, Result};

/// Oldest NCCL accepted: 2.18 (the first with the bindings' `ncclCommInitRank`
/// behaviour and bf16 everywhere).
pub const MIN_NCCL_VERSION: i32 = 21800;

fn check_nccl(call: &'static str, status: nccl_sys::ncclResult_t) -> Result<()> {
    if status == nccl_sys::ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(DeviceError::driver(call, format!("{status:?}")))
    }
}

static PROBE: OnceLock<std::result::Result<i32, String>> = OnceLock::new();

/// NCCL's version code, or why NCCL cannot be used; probed once per process.
pub fn probe() -> std::result::Result<i32, String> {
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the library and closes it again.
            if !unsafe { nccl_sys::is_culib_present() } {
                return Err("no NCCL library (libnccl.so.2) found".to_string());
            }
            let outcome = super::quietly(|| {
                let mut version: c_int = 0;
                // SAFETY: the out-pointer is a valid local.
                let status = unsafe { nccl_sys::ncclGetVersion(&mut version) };
                (status, version)
            });
            match outcome {
                Some((nccl_sys::ncclResult_t::ncclSuccess, v)) if v >= MIN_NCCL_VERSION => Ok(v),
                Some((nccl_sys::ncclResult_t::ncclSuccess, v)) => Err(format!(
                    "NCCL {} is too old: Ember needs NCCL {} or newer",
                    crate::driver::nccl_version_string(v),
                    crate::driver::nccl_version_string(MIN_NCCL_VERSION)
                )),
                Some((status, _)) => Err(format!("ncclGetVersion failed: {status:?}")),
                None => Err(
                    "the NCCL library could not be used (an entry point is missing: NCCL too old?)"
                        .to_string(),
                ),
            }
        })
        .clone()
}

fn dtype(t: NcclType) -> nccl_sys::ncclDataType_t {
    use nccl_sys::ncclDataType_t as D;
    match t {
        NcclType::I8 => D::ncclInt8,
        NcclType::U8 => D::ncclUint8,
        NcclType::I32 => D::ncclInt32,
        NcclType::I64 => D::ncclInt64,
        NcclType::F16 => D::ncclFloat16,
        NcclType::Bf16 => D::ncclBfloat16,
        NcclType::F32 => D::ncclFloat32,
        NcclType::F64 => D::ncclFloat64,
    }
}

fn red_op(op: ReduceOp) -> nccl_sys::ncclRedOp_t {
    use nccl_sys::ncclRedOp_t as R;
    match op {
        ReduceOp::Sum => R::ncclSum,
        ReduceOp::Prod => R::ncclProd,
        ReduceOp::Max => R::ncclMax,
        ReduceOp::Min => R::ncclMin,
        ReduceOp::Avg => R::ncclAvg,
    }
}

impl RealDriver {
    /// NCCL usable, or [`DeviceError::Unsupported`] saying why.
    fn nccl_ready(&self) -> Result<i32> {
        probe().map_err(|why| DeviceError::Unsupported {
            what: format!("NCCL ({why})"),
            driver: "real",
        })
    }

    pub(super) fn nccl_version_impl(&self) -> Result<i32> {
        self.nccl_ready()
    }

    pub(super) fn nccl_unique_id_impl(&self) -> Result<NcclUniqueId> {
        self.nccl_ready()?;
        let mut id = nccl_sys::ncclUniqueId {
            internal: [0; NcclUniqueId::BYTES],
        };
        // SAFETY: the out-pointer is a valid local of the right type.
        check_nccl("ncclGetUniqueId", unsafe {
            nccl_sys::ncclGetUniqueId(&mut id)
        })?;
        Ok(NcclUniqueId(id.internal.map(|b| b as u8)))
    }

    pub(super) fn nccl_comm_init_all_impl(&self, devices: &[usize]) -> Result<Vec<NcclComm>> {
        self.nccl_ready()?;
        for &d in devices {
            self.bind(d)?;
        }
        let list = devices
            .iter()
            .map(|&d| {
                c_int::try_from(d)
                    .map_err(|_| DeviceError::driver("ncclCommInitAll", "ncclInvalidArgument"))
            })
            .collect::<Result<Vec<c_int>>>()?;
        let mut comms: Vec<nccl_sys::ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one communicator per listed device; the list is valid
        // for its length.
        check_nccl("ncclCommInitAll", unsafe {
            nccl_sys::ncclCommInitAll(comms.as_mut_ptr(), list.len() as c_int, list.as_ptr())
        })?;
        let mut tables = self.tables();
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                tables
                    .nccl
                    .insert(c as u64, (devices[rank], rank, devices.len()));
                NcclComm(c as u64)
            })
            .collect())
    }

    pub(super) fn nccl_comm_init_rank_impl(
        &self,
        device: usize,
        nranks: usize,
        id: &NcclUniqueId,
        rank: usize,
    ) -> Result<NcclComm> {
        self.nccl_ready()?;
        self.bind(device)?;
        let bad = || DeviceError::driver("ncclCommInitRank", "ncclInvalidArgument");
        let n = c_int::try_from(nranks).map_err(|_| bad())?;
        let r = c_int::try_from(rank).map_err(|_| bad())?;
        let raw = nccl_sys::ncclUniqueId {
            internal: id.0.map(|b| b as std::ffi::c_char),
        };
        let mut comm: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the device's context is current, which is
        // the device NCCL binds the communicator to.
        check_nccl("ncclCommInitRank", unsafe {
            nccl_sys::ncclCommInitRank(&mut comm, n, raw, r)
        })?;
        self.tables()
            .nccl
            .insert(comm as u64, (device, rank, nranks));
        Ok(NcclComm(comm as u64))
    }

    fn nccl_comm(&self, call: &'static str, comm: NcclComm) -> Result<(usize, usize, usize)> {
        self.tables()
            .nccl
            .get(&comm.0)
            .copied()
            .ok_or(DeviceError::InvalidHandle {
                what: call,
                kind: "NCCL communicator",
                handle: comm.0,
            })
    }

    pub(super) fn nccl_comm_info_impl(&self, comm: NcclComm) -> Result<(usize, usize, usize)> {
        self.nccl_comm("ncclCommCount", comm)
    }

    pub(super) fn nccl_comm_destroy_impl(&self, comm: NcclComm) -> Result<()> {
        let (device, _, _) = self.nccl_comm("ncclCommDestroy", comm)?;
        self.bind(device)?;
        self.tables().nccl.remove(&comm.0);
        // SAFETY: `comm` was issued by ncclCommInit* and is removed from the table, so it is
        // destroyed once.
        check_nccl("ncclCommDestroy", unsafe {
            nccl_sys::ncclCommDestroy(comm.0 as nccl_sys::ncclComm_t)
        })
    }

    pub(super) fn nccl_comm_abort_impl(&self, comm: NcclComm) -> Result<()> {
        let (device, _, _) = self.nccl_comm("ncclCommAbort", comm)?;
        self.bind(device)?;
        self.tables().nccl.remove(&comm.0);
        // SAFETY: `comm` was issued by ncclCommInit* and is removed from the table, so it is
        // aborted once and never used or destroyed after; NCCL allows the abort while
        // another thread waits in a call on the communicator.
        check_nccl("ncclCommAbort", unsafe {
            nccl_sys::ncclCommAbort(comm.0 as nccl_sys::ncclComm_t)
        })
    }

    pub(super) fn nccl_group_start_impl(&self) -> Result<()> {
        self.nccl_ready()?;
        // SAFETY: no preconditions.
        check_nccl("ncclGroupStart", unsafe { nccl_sys::ncclGroupStart() })
    }

    pub(super) fn nccl_group_end_impl(&self) -> Result<()> {
        self.nccl_ready()?;
        // SAFETY: no preconditions (NCCL reports a missing start as an error status).
        check_nccl("ncclGroupEnd", unsafe { nccl_sys::ncclGroupEnd() })
    }

    pub(super) fn nccl_collective_impl(
        &self,
        comm: NcclComm,
        stream: StreamHandle,
        op: &Collective,
    ) -> Result<()> {
        let call = op.call();
        let (device, _, nranks) = self.nccl_comm(call, comm)?;
        let (stream_device, s) = self.stream(call, stream, Some(device), None)?;
        if stream_device != device {
            return Err(DeviceError::Driver {
                call,
                code: "ncclInvalidArgument".into(),
                detail: format!(
                    "the communicator is on cuda:{device}, the stream belongs to cuda:{stream_device}"
                ),
            });
        }
        if let Some(root) = op.root()
            && root >= nranks
        {
            return Err(DeviceError::Driver {
                call,
                code: "ncclInvalidArgument".into(),
                detail: format!("root {root} is not in 0..{nranks}"),
            });
        }
        let c = comm.0 as nccl_sys::ncclComm_t;
        let s = s as nccl_sys::cudaStream_t;
        let p = |ptr: crate::driver::DevicePtr| ptr.0 as *mut std::ffi::c_void;
        // SAFETY: (all arms) `c` is a live communicator from the table, `s` a live stream of
        // its device whose context is current; the buffers are device memory the caller
        // sized for the collective (NCCL validates what it can and reports errors).
        let status = unsafe {
            match *op {
                Collective::AllReduce {
                    send,
                    recv,
                    count,
                    dtype: t,
                    op,
                } => nccl_sys::ncclAllReduce(p(send), p(recv), count, dtype(t), red_op(op), c, s),
                Collective::Broadcast {
                    send,
                    recv,
                    count,
                    dtype: t,
                    root,
                } => {
                    nccl_sys::ncclBroadcast(p(send), p(recv), count, dtype(t), root as c_int, c, s)
                }
                Collective::Reduce {
                    send,
                    recv,
                    count,
                    dtype: t,
                    op,
                    root,
                } => nccl_sys::ncclReduce(
                    p(send),
                    p(recv),
                    count,
                    dtype(t),
                    red_op(op),
                    root as c_int,
                    c,
                    s,
                ),
                Collective::AllGather {
                    send,
                    recv,
                    count,
                    dtype: t,
                } => nccl_sys::ncclAllGather(p(send), p(recv), count, dtype(t), c, s),
                Collective::ReduceScatter {
                    send,
                    recv,
                    count,
                    dtype: t,
                    op,
                } => {
                    nccl_sys::ncclReduceScatter(p(send), p(recv), count, dtype(t), red_op(op), c, s)
                }
            }
        };
        check_nccl(call, status)
    }
}
