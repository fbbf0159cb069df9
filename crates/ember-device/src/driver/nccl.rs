//! NCCL through the driver seam: the types of [`crate::driver::Driver`]'s `nccl_*` calls.
//!
//! Note [NCCL through the seam]:
//!
//! Collectives among CUDA devices go through the seam as GEMM and convolutions do, so that
//! the same code runs on NVIDIA's library and on the emulator:
//!
//! - [`Driver::nccl_version`](crate::driver::Driver::nccl_version) says whether NCCL is
//!   usable (`ncclGetVersion`), or why not ([`crate::DeviceError::Unsupported`]); the real
//!   driver loads `libnccl.so` at run time (cudarc's `dynamic-loading`), so a machine without
//!   NCCL still runs everything else and `ember info` says why NCCL is absent.
//! - Communicators ([`NcclComm`]) are made for several devices of one process at once
//!   (`ncclCommInitAll`, what `DataParallel`'s comm functions use) or one rank at a time
//!   from a [`NcclUniqueId`] handed around by a rendezvous (`ncclGetUniqueId` +
//!   `ncclCommInitRank`, what a process group's `nccl` backend uses).
//! - A [`Collective`] is enqueued on a stream of the communicator's device. One thread
//!   driving several devices brackets the per-device calls with `nccl_group_start` /
//!   `nccl_group_end` (`ncclGroupStart`/`ncclGroupEnd`); without the group the first call
//!   would wait for ranks that are never issued.
//! - A communicator whose collective will never complete (a rank that skipped it or died)
//!   is aborted with `nccl_comm_abort` (`ncclCommAbort`), from any thread: the collectives
//!   waiting on it end with an error and the handle is gone (neither used nor destroyed
//!   again), as PyTorch's watchdog aborts its communicators after a timeout.
//!
//! The emulator serves the same calls among its own devices; see Note [Emulated NCCL] in
//! `emulator/nccl.rs`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A communicator: one rank of an NCCL clique, bound to one device. Issued by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NcclComm(pub u64);

/// The 128-byte identity of a clique (`ncclUniqueId`), made by one rank and sent to the
/// others through a rendezvous.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclUniqueId(pub [u8; NcclUniqueId::BYTES]);

impl NcclUniqueId {
    /// Size of the id in bytes (`NCCL_UNIQUE_ID_BYTES`).
    pub const BYTES: usize = 128;
}

impl fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclUniqueId(")?;
        for b in &self.0[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// Element types of a collective (`ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NcclType {
    /// `ncclInt8`.
    I8,
    /// `ncclUint8`.
    U8,
    /// `ncclInt32`.
    I32,
    /// `ncclInt64`.
    I64,
    /// `ncclFloat16`.
    F16,
    /// `ncclBfloat16`.
    Bf16,
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat64`.
    F64,
}

impl NcclType {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            NcclType::I8 | NcclType::U8 => 1,
            NcclType::F16 | NcclType::Bf16 => 2,
            NcclType::I32 | NcclType::F32 => 4,
            NcclType::I64 | NcclType::F64 => 8,
        }
    }

    /// Lower-case name (`f32`, `bf16`, `i64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            NcclType::I8 => "i8",
            NcclType::U8 => "u8",
            NcclType::I32 => "i32",
            NcclType::I64 => "i64",
            NcclType::F16 => "f16",
            NcclType::Bf16 => "bf16",
            NcclType::F32 => "f32",
            NcclType::F64 => "f64",
        }
    }
}

/// Reduction operators (`ncclRedOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`: the sum divided by the number of ranks (integer division for integers).
    Avg,
}

/// One rank's part of a collective: its buffers, element count, type and operator. Every rank
/// of the communicator must issue the same kind with the same count, type, operator and root.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Collective {
    /// `ncclAllReduce`: `recv[i] = op over ranks of send[i]`, `count` elements.
    AllReduce {
        /// This rank's input (may equal `recv`).
        send: crate::driver::DevicePtr,
        /// This rank's output.
        recv: crate::driver::DevicePtr,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: NcclType,
        /// Operator.
        op: ReduceOp,
    },
    /// `ncclBroadcast`: every rank's `recv` gets root's `send` (`send` is read on the root
    /// only), `count` elements.
    Broadcast {
        /// The root's input (ignored on other ranks).
        send: crate::driver::DevicePtr,
        /// This rank's output.
        recv: crate::driver::DevicePtr,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: NcclType,
        /// The rank whose `send` is broadcast.
        root: usize,
    },
    /// `ncclReduce`: root's `recv` gets the reduction of every rank's `send` (`recv` is
    /// written on the root only).
    Reduce {
        /// This rank's input.
        send: crate::driver::DevicePtr,
        /// The root's output (ignored on other ranks).
        recv: crate::driver::DevicePtr,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: NcclType,
        /// Operator.
        op: ReduceOp,
        /// The rank that receives the result.
        root: usize,
    },
    /// `ncclAllGather`: `recv[r * count + i] = send of rank r [i]`; `count` elements per
    /// rank, `recv` holds `nranks * count`.
    AllGather {
        /// This rank's input.
        send: crate::driver::DevicePtr,
        /// This rank's output, `nranks * count` elements.
        recv: crate::driver::DevicePtr,
        /// Elements sent by each rank.
        count: usize,
        /// Element type.
        dtype: NcclType,
    },
    /// `ncclReduceScatter`: `recv[i] = op over ranks of send[rank * count + i]`; `send` holds
    /// `nranks * count` elements, `recv` `count`.
    ReduceScatter {
        /// This rank's input, `nranks * count` elements.
        send: crate::driver::DevicePtr,
        /// This rank's output.
        recv: crate::driver::DevicePtr,
        /// Elements received by each rank.
        count: usize,
        /// Element type.
        dtype: NcclType,
        /// Operator.
        op: ReduceOp,
    },
}

impl Collective {
    /// The NCCL entry point's name (`ncclAllReduce`, ...).
    pub fn call(&self) -> &'static str {
        match self {
            Collective::AllReduce { .. } => "ncclAllReduce",
            Collective::Broadcast { .. } => "ncclBroadcast",
            Collective::Reduce { .. } => "ncclReduce",
            Collective::AllGather { .. } => "ncclAllGather",
            Collective::ReduceScatter { .. } => "ncclReduceScatter",
        }
    }

    /// Element type.
    pub fn dtype(&self) -> NcclType {
        match *self {
            Collective::AllReduce { dtype, .. }
            | Collective::Broadcast { dtype, .. }
            | Collective::Reduce { dtype, .. }
            | Collective::AllGather { dtype, .. }
            | Collective::ReduceScatter { dtype, .. } => dtype,
        }
    }

    /// The count argument (per rank for all-gather and reduce-scatter).
    pub fn count(&self) -> usize {
        match *self {
            Collective::AllReduce { count, .. }
            | Collective::Broadcast { count, .. }
            | Collective::Reduce { count, .. }
            | Collective::AllGather { count, .. }
            | Collective::ReduceScatter { count, .. } => count,
        }
    }

    /// The operator, for the reducing collectives.
    pub fn op(&self) -> Option<ReduceOp> {
        match *self {
            Collective::AllReduce { op, .. }
            | Collective::Reduce { op, .. }
            | Collective::ReduceScatter { op, .. } => Some(op),
            Collective::Broadcast { .. } | Collective::AllGather { .. } => None,
        }
    }

    /// The root, for broadcast and reduce.
    pub fn root(&self) -> Option<usize> {
        match *self {
            Collective::Broadcast { root, .. } | Collective::Reduce { root, .. } => Some(root),
            _ => None,
        }
    }

    /// One line describing what this rank issued (`ncclAllReduce of 10 f32 (Sum)`), for
    /// mismatch errors.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} of {} {}",
            self.call(),
            self.count(),
            self.dtype().name()
        );
        if let Some(op) = self.op() {
            s.push_str(&format!(" ({op:?})"));
        }
        if let Some(root) = self.root() {
            s.push_str(&format!(" root {root}"));
        }
        s
    }

    /// Whether two ranks' calls belong to the same collective (kind, count, type, operator
    /// and root agree).
    pub fn matches(&self, other: &Collective) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.count() == other.count()
            && self.dtype() == other.dtype()
            && self.op() == other.op()
            && self.root() == other.root()
    }
}

/// `2.23.4` from NCCL's version code (`22304`; codes below 10000 are the old
/// `major * 1000 + minor * 100 + patch`).
pub fn nccl_version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}
