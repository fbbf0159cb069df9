//! The host computation of the emulated NCCL's collectives (Note [Emulated NCCL] in
//! `nccl.rs`): every rank's call checked against the others, inputs read, reduced in f64
//! (integers in i64) in rank order, outputs written. The buffers of ranks in other processes
//! (Note [NCCL across processes] in `nccl_net.rs`) come and go as bytes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use half::{bf16, f16};

use super::memory::MemoryState;
use crate::driver::{Collective, DevicePtr, NcclType, ReduceOp};
use crate::error::{DeviceError, Result};

pub(super) fn invalid(call: &'static str, detail: String) -> DeviceError {
    DeviceError::Driver {
        call,
        code: "ncclInvalidArgument".into(),
        detail,
    }
}

/// Values of one buffer: floats in f64, integers in i64.
#[derive(Debug, Clone)]
enum Values {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

fn decode(dtype: NcclType, bytes: &[u8]) -> Values {
    let f = Values::Float;
    match dtype {
        NcclType::F32 => f(bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect()),
        NcclType::F64 => f(bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()),
        NcclType::F16 => f(bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect()),
        NcclType::Bf16 => f(bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect()),
        NcclType::I8 => Values::Int(bytes.iter().map(|&b| i64::from(b as i8)).collect()),
        NcclType::U8 => Values::Int(bytes.iter().map(|&b| i64::from(b)).collect()),
        NcclType::I32 => Values::Int(
            bytes
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        NcclType::I64 => Values::Int(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
    }
}

fn encode(dtype: NcclType, values: &Values, out: &mut [u8]) {
    let size = dtype.size();
    match values {
        Values::Float(v) => {
            for (x, o) in v.iter().zip(out.chunks_exact_mut(size)) {
                match dtype {
                    NcclType::F32 => o.copy_from_slice(&(*x as f32).to_le_bytes()),
                    NcclType::F64 => o.copy_from_slice(&x.to_le_bytes()),
                    NcclType::F16 => o.copy_from_slice(&f16::from_f64(*x).to_le_bytes()),
                    NcclType::Bf16 => o.copy_from_slice(&bf16::from_f64(*x).to_le_bytes()),
                    // Integer types decode to `Values::Int`.
                    _ => {}
                }
            }
        }
        Values::Int(v) => {
            for (x, o) in v.iter().zip(out.chunks_exact_mut(size)) {
                match dtype {
                    NcclType::I8 | NcclType::U8 => o[0] = *x as u8,
                    NcclType::I32 => o.copy_from_slice(&(*x as i32).to_le_bytes()),
                    NcclType::I64 => o.copy_from_slice(&x.to_le_bytes()),
                    _ => {}
                }
            }
        }
    }
}

/// Reduce the ranks' values (in rank order) with `op`.
fn reduce(op: ReduceOp, inputs: &[Values]) -> Values {
    let n = inputs.len();
    match inputs.first() {
        Some(Values::Float(first)) => {
            let mut acc = first.clone();
            for v in &inputs[1..] {
                let Values::Float(v) = v else { continue };
                for (a, &x) in acc.iter_mut().zip(v) {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => *a + x,
                        ReduceOp::Prod => *a * x,
                        ReduceOp::Max => a.max(x),
                        ReduceOp::Min => a.min(x),
                    };
                }
            }
            if op == ReduceOp::Avg {
                acc.iter_mut().for_each(|a| *a /= n as f64);
            }
            Values::Float(acc)
        }
        Some(Values::Int(first)) => {
            let mut acc = first.clone();
            for v in &inputs[1..] {
                let Values::Int(v) = v else { continue };
                for (a, &x) in acc.iter_mut().zip(v) {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(x),
                        ReduceOp::Prod => a.wrapping_mul(x),
                        ReduceOp::Max => (*a).max(x),
                        ReduceOp::Min => (*a).min(x),
                    };
                }
            }
            if op == ReduceOp::Avg {
                acc.iter_mut().for_each(|a| *a /= n as i64);
            }
            Values::Int(acc)
        }
        None => Values::Float(Vec::new()),
    }
}

fn slice_of(v: &Values, start: usize, len: usize) -> Values {
    match v {
        Values::Float(x) => Values::Float(x[start..start + len].to_vec()),
        Values::Int(x) => Values::Int(x[start..start + len].to_vec()),
    }
}

/// The buffers of a collective's ranks in other processes: what they send, and (filled by
/// [`run`]) what they receive, as bytes.
#[derive(Debug, Default)]
pub(super) struct RemoteBuffers<'a> {
    /// The ranks whose buffers live in another process.
    pub(super) ranks: Option<&'a BTreeSet<usize>>,
    /// rank → its send buffer's bytes (for the ranks that send).
    pub(super) inputs: HashMap<usize, Vec<u8>>,
    /// rank → its recv buffer's new bytes (for the ranks that receive).
    pub(super) outputs: HashMap<usize, Vec<u8>>,
}

impl RemoteBuffers<'_> {
    fn has(&self, rank: usize) -> bool {
        self.ranks.is_some_and(|r| r.contains(&rank))
    }
}

/// Run collective `number` of a clique: `calls` holds every rank's call; the buffers of
/// the ranks in `remote.ranks` are `remote.inputs`, and their results go to
/// `remote.outputs`.
pub(super) fn run(
    mem: &mut MemoryState,
    calls: &BTreeMap<usize, Collective>,
    members: &BTreeMap<usize, usize>,
    number: u64,
    remote: &mut RemoteBuffers<'_>,
) -> std::result::Result<(), DeviceError> {
    let Some(first) = calls.values().next().copied() else {
        return Ok(());
    };
    let call = first.call();
    if let Some((rank, other)) = calls.iter().find(|(_, c)| !c.matches(&first)) {
        let issued: Vec<String> = calls
            .iter()
            .map(|(r, c)| {
                format!(
                    "rank {r} (cuda:{}): {}",
                    members.get(r).copied().unwrap_or(0),
                    c.describe()
                )
            })
            .collect();
        return Err(invalid(
            call,
            format!(
                "collective #{number}: ranks disagree (rank {rank} issued {}, rank 0 {}): {}",
                other.describe(),
                first.describe(),
                issued.join("; ")
            ),
        ));
    }
    let nranks = calls.len();
    let dtype = first.dtype();
    let size = dtype.size();
    let count = first.count();
    let read = |mem: &MemoryState, rank: usize, ptr: DevicePtr, n: usize| -> Result<Values> {
        if !remote.has(rank) {
            return Ok(decode(dtype, mem.slice(call, ptr, n * size)?));
        }
        match remote.inputs.get(&rank) {
            Some(b) if b.len() == n * size => Ok(decode(dtype, b)),
            other => Err(invalid(
                call,
                format!(
                    "rank {rank} (another process) sent {} bytes, expected {}",
                    other.map_or(0, Vec::len),
                    n * size
                ),
            )),
        }
    };
    // Read every input first, then write: in-place calls see the inputs.
    let mut writes: Vec<(usize, DevicePtr, Values)> = Vec::new();
    match first {
        Collective::AllReduce { op, .. } => {
            let inputs = calls
                .iter()
                .map(|(&r, c)| match *c {
                    Collective::AllReduce { send, .. } => read(mem, r, send, count),
                    _ => unreachable_kind(call),
                })
                .collect::<Result<Vec<_>>>()?;
            let out = reduce(op, &inputs);
            for (&r, c) in calls {
                if let Collective::AllReduce { recv, .. } = *c {
                    writes.push((r, recv, out.clone()));
                }
            }
        }
        Collective::Broadcast { root, .. } => {
            let Some(Collective::Broadcast { send, .. }) = calls.get(&root).copied() else {
                return unreachable_kind(call);
            };
            let value = read(mem, root, send, count)?;
            for (&r, c) in calls {
                if let Collective::Broadcast { recv, .. } = *c {
                    writes.push((r, recv, value.clone()));
                }
            }
        }
        Collective::Reduce { op, root, .. } => {
            let inputs = calls
                .iter()
                .map(|(&r, c)| match *c {
                    Collective::Reduce { send, .. } => read(mem, r, send, count),
                    _ => unreachable_kind(call),
                })
                .collect::<Result<Vec<_>>>()?;
            if let Some(Collective::Reduce { recv, .. }) = calls.get(&root).copied() {
                writes.push((root, recv, reduce(op, &inputs)));
            }
        }
        Collective::AllGather { .. } => {
            let mut all = Vec::with_capacity(nranks);
            for (&r, c) in calls {
                if let Collective::AllGather { send, .. } = *c {
                    all.push(read(mem, r, send, count)?);
                }
            }
            let joined = match all.first() {
                Some(Values::Int(_)) => Values::Int(
                    all.iter()
                        .flat_map(|v| match v {
                            Values::Int(x) => x.clone(),
                            Values::Float(_) => Vec::new(),
                        })
                        .collect(),
                ),
                _ => Values::Float(
                    all.iter()
                        .flat_map(|v| match v {
                            Values::Float(x) => x.clone(),
                            Values::Int(_) => Vec::new(),
                        })
                        .collect(),
                ),
            };
            for (&r, c) in calls {
                if let Collective::AllGather { recv, .. } = *c {
                    writes.push((r, recv, joined.clone()));
                }
            }
        }
        Collective::ReduceScatter { op, .. } => {
            let inputs = calls
                .iter()
                .map(|(&r, c)| match *c {
                    Collective::ReduceScatter { send, .. } => read(mem, r, send, count * nranks),
                    _ => unreachable_kind(call),
                })
                .collect::<Result<Vec<_>>>()?;
            let out = reduce(op, &inputs);
            for (&rank, c) in calls {
                if let Collective::ReduceScatter { recv, .. } = *c {
                    writes.push((rank, recv, slice_of(&out, rank * count, count)));
                }
            }
        }
    }
    for (rank, ptr, values) in writes {
        let n = match &values {
            Values::Float(v) => v.len(),
            Values::Int(v) => v.len(),
        };
        if remote.has(rank) {
            let mut out = vec![0u8; n * size];
            encode(dtype, &values, &mut out);
            remote.outputs.insert(rank, out);
        } else {
            let out = mem.slice_mut(call, ptr, n * size)?;
            encode(dtype, &values, out);
        }
    }
    Ok(())
}

/// Calls were checked to be of one kind before `run` reads them.
fn unreachable_kind<T>(call: &'static str) -> Result<T> {
    Err(invalid(call, "ranks issued different collectives".into()))
}
