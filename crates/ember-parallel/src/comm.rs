//! Moving tensors between the devices of one process, as `torch.nn.parallel.comm` (alias
//! `torch.cuda.comm`): [`broadcast`], [`broadcast_coalesced`], [`reduce_add`],
//! [`reduce_add_coalesced`], [`scatter`], [`gather`]; and the autograd functions PyTorch's
//! `DataParallel` is built from: [`Broadcast`], [`ReduceAddCoalesced`], [`Scatter`],
//! [`Gather`].
//!
//! Note [Collectives or copies]: broadcasts and reductions among distinct CUDA devices run
//! on NCCL through the driver seam (Note [NCCL through the seam] in `ember-device`): one
//! `ncclGroupStart`/`ncclGroupEnd` around one call per tensor and device, each on the current
//! stream of its device, over communicators made once per device list
//! (`ncclCommInitAll`) and kept for the process, as PyTorch's `torch.cuda.nccl` caches them.
//! Under the emulator the same calls run among the emulated devices. When NCCL cannot serve
//! a call (a CPU tensor among them, one device, a dtype NCCL has no type for, or no NCCL on
//! the machine) the copy path runs instead: `to_device` copies and additions on the
//! destination, which give the same values. Scatter and gather are copies on both paths
//! (narrowed views copied to each device; copies concatenated on the destination), as in
//! PyTorch. "Coalesced" keeps PyTorch's signature: the tensors of one call go out in one
//! group, so there is no need to flatten them into buckets first.
//!
//! The plain functions return tensors that are not recorded by autograd (as
//! `torch.cuda.comm`'s); the functions' `apply` record nodes (Note [Custom ops] in
//! `ember-autograd`): the backward of a broadcast sends each copy's gradient back to the
//! source device, where the engine sums them (a reduce-add); of a reduce-add, a broadcast;
//! of a scatter, the chunk's gradient placed into zeros of the input's shape (the engine's
//! sum of them is the gather); of a gather, a scatter.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use ember_autograd::custom_op;
use ember_device::driver::{Collective, DevicePtr, Driver, NcclComm, NcclType, ReduceOp};
use ember_device::{Device, cuda};
use ember_nn::{Error, NnError, Result, Tensor};
use ember_tensor::{DType, Tensor as Raw, with_cuda_buffers};

/// The element type NCCL moves a dtype as, if it has one.
pub(crate) fn nccl_type(dtype: DType) -> Option<NcclType> {
    Some(match dtype {
        DType::F32 => NcclType::F32,
        DType::F64 => NcclType::F64,
        DType::F16 => NcclType::F16,
        DType::Bf16 => NcclType::Bf16,
        DType::I64 => NcclType::I64,
        DType::I32 => NcclType::I32,
        DType::U8 | DType::Bool => NcclType::U8,
    })
}

/// The CUDA ordinals of `devices` when NCCL can serve a collective among them: at least two,
/// all CUDA, distinct, NCCL usable.
fn nccl_devices(devices: &[Device], dtypes: impl IntoIterator<Item = DType>) -> Option<Vec<usize>> {
    if devices.len() < 2 {
        return None;
    }
    let mut ords = Vec::with_capacity(devices.len());
    for d in devices {
        match d {
            Device::Cuda(i) if !ords.contains(i) => ords.push(*i),
            _ => return None,
        }
    }
    if dtypes.into_iter().any(|t| nccl_type(t).is_none()) {
        return None;
    }
    let driver = cuda::driver().ok()?;
    driver.nccl_version().ok()?;
    Some(ords)
}

/// The communicators of a device list (rank `i` on `devices[i]`), made on first use.
fn communicators(driver: &dyn Driver, devices: &[usize]) -> Result<Vec<NcclComm>> {
    static COMMS: Mutex<Option<HashMap<Vec<usize>, Vec<NcclComm>>>> = Mutex::new(None);
    let mut table = COMMS.lock().unwrap_or_else(PoisonError::into_inner);
    let table = table.get_or_insert_with(HashMap::new);
    if let Some(c) = table.get(devices) {
        return Ok(c.clone());
    }
    let comms = driver.nccl_comm_init_all(devices)?;
    table.insert(devices.to_vec(), comms.clone());
    Ok(comms)
}

/// Runs `f` between `nccl_group_start` and `nccl_group_end`; the group is closed even when
/// `f` fails (the thread's group depth must not leak).
///
/// One group at a time in the process, as PyTorch's `torch.cuda.nccl` holds CUDA's free
/// mutex around each call: the communicators of a device list are shared (cached above),
/// and NCCL needs every rank of a communicator to see its collectives in the same order,
/// which two threads issuing groups at once (two `DataParallel`s, or tests run in
/// parallel) would interleave.
fn grouped(driver: &dyn Driver, f: impl FnOnce() -> Result<()>) -> Result<()> {
    static ISSUE: Mutex<()> = Mutex::new(());
    let _one_at_a_time = ISSUE.lock().unwrap_or_else(PoisonError::into_inner);
    driver.nccl_group_start()?;
    let issued = f();
    let ended = driver.nccl_group_end();
    issued?;
    ended?;
    Ok(())
}

fn invalid(op: &'static str, msg: impl Into<String>) -> ember_nn::Error {
    NnError::invalid(op, msg).into()
}

/// `torch.chunk`'s split of `len` into at most `chunks` pieces: each `ceil(len / chunks)`
/// long, the last shorter, so there may be fewer pieces than asked (5 into 3 is `[2, 2,
/// 1]`, 4 into 3 is `[2, 2]`). Empty for `len == 0`.
pub fn chunk_sizes(len: usize, chunks: usize) -> Vec<usize> {
    if len == 0 || chunks == 0 {
        return Vec::new();
    }
    let size = len.div_ceil(chunks);
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let n = size.min(left);
        out.push(n);
        left -= n;
    }
    out
}

// --- raw (unrecorded) implementations ------------------------------------------------------

/// `out[i][j]`: tensor `j` on `devices[i]`; `devices[0]` must be where every tensor is, and
/// `out[0]` are the tensors themselves.
pub(crate) fn broadcast_raw(tensors: &[Raw], devices: &[Device]) -> Result<Vec<Vec<Raw>>> {
    const OP: &str = "broadcast_coalesced";
    let Some(&source) = devices.first() else {
        return Err(invalid(OP, "expected at least one device, got none"));
    };
    if let Some((j, t)) = tensors
        .iter()
        .enumerate()
        .find(|(_, t)| t.device() != source)
    {
        return Err(invalid(
            OP,
            format!(
                "all tensors must be on devices[0] ({source}), but tensor {j} is on {}",
                t.device()
            ),
        ));
    }
    let mut out = vec![tensors.to_vec()];
    if let Some(ords) = nccl_devices(devices, tensors.iter().map(Raw::dtype)) {
        let srcs = tensors
            .iter()
            .map(Raw::contiguous)
            .collect::<ember_tensor::Result<Vec<_>>>()?;
        let mut copies = Vec::with_capacity(devices.len() - 1);
        for &d in &devices[1..] {
            copies.push(
                srcs.iter()
                    .map(|t| Raw::empty(t.shape().clone(), (d, t.dtype())))
                    .collect::<ember_tensor::Result<Vec<_>>>()?,
            );
        }
        let driver = cuda::driver()?;
        let comms = communicators(&*driver, &ords)?;
        let reads: Vec<&Raw> = srcs.iter().collect();
        let writes: Vec<&Raw> = copies.iter().flatten().collect();
        let m = srcs.len();
        with_cuda_buffers(&reads, &writes, |r, w| {
            grouped(&*driver, || {
                for (j, src) in r.iter().enumerate() {
                    if src.len == 0 {
                        continue;
                    }
                    let dtype = nccl_type(src.dtype).unwrap_or(NcclType::U8);
                    for (rank, (&ord, comm)) in ords.iter().zip(&comms).enumerate() {
                        let recv = if rank == 0 {
                            src.ptr
                        } else {
                            w[(rank - 1) * m + j].ptr
                        };
                        let call = Collective::Broadcast {
                            send: src.ptr,
                            recv,
                            count: src.len,
                            dtype,
                            root: 0,
                        };
                        driver.nccl_collective(*comm, cuda::current_stream(ord), &call)?;
                    }
                }
                Ok(())
            })
            .map_err(|e| Error::invalid(OP, e.to_string()))
        })?;
        out.extend(copies);
    } else {
        for &d in &devices[1..] {
            out.push(
                tensors
                    .iter()
                    .map(|t| t.to_device(d))
                    .collect::<ember_tensor::Result<Vec<_>>>()?,
            );
        }
    }
    Ok(out)
}

/// `out[j]`: the sum over `i` of `inputs[i][j]`, on `destination`.
pub(crate) fn reduce_add_raw(inputs: &[Vec<Raw>], destination: Device) -> Result<Vec<Raw>> {
    const OP: &str = "reduce_add_coalesced";
    let Some(first) = inputs.first() else {
        return Err(invalid(
            OP,
            "expected inputs from at least one device, got none",
        ));
    };
    let mut devices = Vec::with_capacity(inputs.len());
    for (i, list) in inputs.iter().enumerate() {
        if list.len() != first.len() {
            return Err(invalid(
                OP,
                format!(
                    "every device must give the same number of tensors: device 0 gives {}, device {i} gives {}",
                    first.len(),
                    list.len()
                ),
            ));
        }
        let device = list.first().map_or(Device::Cpu, Raw::device);
        for (j, (t, f)) in list.iter().zip(first).enumerate() {
            if t.dims() != f.dims() || t.dtype() != f.dtype() {
                return Err(invalid(
                    OP,
                    format!(
                        "tensor {j} of input {i} is {} {}, but of input 0 {} {}",
                        t.dtype(),
                        t.shape(),
                        f.dtype(),
                        f.shape()
                    ),
                ));
            }
            if t.device() != device {
                return Err(invalid(
                    OP,
                    format!(
                        "the tensors of input {i} must be on one device: found {device} and {}",
                        t.device()
                    ),
                ));
            }
        }
        devices.push(device);
    }
    let root = devices.iter().position(|d| *d == destination);
    let nccl = root.and_then(|root| {
        nccl_devices(&devices, first.iter().map(Raw::dtype)).map(|ords| (root, ords))
    });
    let Some((root, ords)) = nccl else {
        // Copy path: sum on the destination, in input order.
        let mut out = Vec::with_capacity(first.len());
        for j in 0..first.len() {
            let mut acc = inputs[0][j].to_device(destination)?;
            for list in &inputs[1..] {
                acc = acc.add(&list[j].to_device(destination)?)?;
            }
            out.push(acc);
        }
        return Ok(out);
    };
    let srcs: Vec<Vec<Raw>> = inputs
        .iter()
        .map(|l| l.iter().map(Raw::contiguous).collect())
        .collect::<ember_tensor::Result<_>>()?;
    let outs = srcs[root]
        .iter()
        .map(|t| Raw::empty(t.shape().clone(), (destination, t.dtype())))
        .collect::<ember_tensor::Result<Vec<_>>>()?;
    let driver = cuda::driver()?;
    let comms = communicators(&*driver, &ords)?;
    let reads: Vec<&Raw> = srcs.iter().flatten().collect();
    let writes: Vec<&Raw> = outs.iter().collect();
    let m = first.len();
    with_cuda_buffers(&reads, &writes, |r, w| {
        grouped(&*driver, || {
            for (j, out) in w.iter().enumerate() {
                if out.len == 0 {
                    continue;
                }
                let dtype = nccl_type(out.dtype).unwrap_or(NcclType::U8);
                for (rank, (&ord, comm)) in ords.iter().zip(&comms).enumerate() {
                    let call = Collective::Reduce {
                        send: r[rank * m + j].ptr,
                        recv: if rank == root {
                            out.ptr
                        } else {
                            DevicePtr::NULL
                        },
                        count: out.len,
                        dtype,
                        op: ReduceOp::Sum,
                        root,
                    };
                    driver.nccl_collective(*comm, cuda::current_stream(ord), &call)?;
                }
            }
            Ok(())
        })
        .map_err(|e| Error::invalid(OP, e.to_string()))
    })?;
    Ok(outs)
}

/// The sizes a scatter of `len` rows over `devices` uses: `chunk_sizes` if given (checked to
/// add up to `len`, one per device), else [`chunk_sizes`].
fn split_sizes(
    op: &'static str,
    len: usize,
    devices: &[Device],
    sizes: Option<&[usize]>,
) -> Result<Vec<usize>> {
    if devices.is_empty() {
        return Err(invalid(op, "expected at least one device, got none"));
    }
    match sizes {
        None => Ok(chunk_sizes(len, devices.len())),
        Some(s) => {
            if s.len() != devices.len() {
                return Err(invalid(
                    op,
                    format!(
                        "expected one chunk size per device ({}), got {}",
                        devices.len(),
                        s.len()
                    ),
                ));
            }
            if s.iter().sum::<usize>() != len {
                return Err(invalid(
                    op,
                    format!(
                        "chunk sizes {s:?} add up to {}, but dim has size {len}",
                        s.iter().sum::<usize>()
                    ),
                ));
            }
            Ok(s.to_vec())
        }
    }
}

/// Chunk `i` of `tensor` along `dim` on `devices[i]`, for the (possibly fewer) chunks.
pub(crate) fn scatter_raw(
    tensor: &Raw,
    devices: &[Device],
    sizes: Option<&[usize]>,
    dim: usize,
) -> Result<Vec<Raw>> {
    let len = tensor.size(dim)?;
    let sizes = split_sizes("scatter", len, devices, sizes)?;
    let mut out = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for (&n, &d) in sizes.iter().zip(devices) {
        out.push(tensor.narrow(dim, start, n)?.to_device(d)?.contiguous()?);
        start += n;
    }
    Ok(out)
}

/// The tensors concatenated along `dim` on `destination`.
pub(crate) fn gather_raw(tensors: &[Raw], dim: usize, destination: Device) -> Result<Raw> {
    if tensors.is_empty() {
        return Err(invalid("gather", "expected at least one tensor, got none"));
    }
    let moved = tensors
        .iter()
        .map(|t| t.to_device(destination))
        .collect::<ember_tensor::Result<Vec<_>>>()?;
    let refs: Vec<&Raw> = moved.iter().collect();
    Raw::cat(&refs, dim)
}

// --- torch.cuda.comm ----------------------------------------------------------------------

/// `comm.broadcast(tensor, devices)`: `tensor` copied to each of `devices` (the first is
/// where it is, and gets the tensor itself). Not recorded by autograd.
pub fn broadcast(tensor: &Tensor, devices: &[Device]) -> Result<Vec<Tensor>> {
    Ok(broadcast_coalesced(std::slice::from_ref(tensor), devices)?
        .into_iter()
        .filter_map(|mut v| v.pop())
        .collect())
}

/// `comm.broadcast_coalesced(tensors, devices)`: `out[i][j]` is tensor `j` on `devices[i]`;
/// every tensor must be on `devices[0]`, and `out[0]` holds them. One NCCL group among CUDA
/// devices (Note [Collectives or copies]). Not recorded by autograd.
pub fn broadcast_coalesced(tensors: &[Tensor], devices: &[Device]) -> Result<Vec<Vec<Tensor>>> {
    let raw: Vec<Raw> = tensors.iter().map(Tensor::data).collect();
    broadcast_raw(&raw, devices)
}

/// `comm.reduce_add(inputs, destination)`: the sum of tensors of one shape and dtype, one
/// per device, on `destination` (the first input's device when `None`).
pub fn reduce_add(inputs: &[Tensor], destination: Option<Device>) -> Result<Tensor> {
    let lists: Vec<Vec<Tensor>> = inputs.iter().map(|t| vec![t.clone()]).collect();
    reduce_add_coalesced(&lists, destination)?
        .pop()
        .ok_or_else(|| invalid("reduce_add", "expected at least one input, got none"))
}

/// `comm.reduce_add_coalesced(inputs, destination)`: `inputs[i]` is a list of tensors on
/// device `i`; `out[j]` is the sum over devices of tensor `j`, on `destination` (the first
/// list's device when `None`). One NCCL group among CUDA devices when the destination is one
/// of them. Not recorded by autograd.
pub fn reduce_add_coalesced(
    inputs: &[Vec<Tensor>],
    destination: Option<Device>,
) -> Result<Vec<Tensor>> {
    let raw: Vec<Vec<Raw>> = inputs
        .iter()
        .map(|l| l.iter().map(Tensor::data).collect())
        .collect();
    let dest = destination.unwrap_or_else(|| {
        raw.first()
            .and_then(|l| l.first())
            .map_or(Device::Cpu, Raw::device)
    });
    reduce_add_raw(&raw, dest)
}

/// `comm.scatter(tensor, devices, chunk_sizes, dim)`: chunk `i` of `tensor` along `dim` on
/// `devices[i]`. Without `chunk_sizes` the split is `torch.chunk`'s ([`chunk_sizes`]), which
/// may use fewer devices than given. Not recorded by autograd.
pub fn scatter(
    tensor: &Tensor,
    devices: &[Device],
    chunk_sizes: Option<&[usize]>,
    dim: usize,
) -> Result<Vec<Tensor>> {
    scatter_raw(&tensor.data(), devices, chunk_sizes, dim)
}

/// `comm.gather(tensors, dim, destination)`: the tensors concatenated along `dim` on
/// `destination` (the current CUDA device when `None`, as PyTorch). Not recorded by autograd.
pub fn gather(tensors: &[Tensor], dim: usize, destination: Option<Device>) -> Result<Tensor> {
    let dest = match destination {
        Some(d) => d,
        None => Device::Cuda(cuda::current_device()?),
    };
    let raw: Vec<Raw> = tensors.iter().map(Tensor::data).collect();
    gather_raw(&raw, dim, dest)
}

// --- autograd functions -------------------------------------------------------------------

/// PyTorch's `Broadcast` function: differentiable [`broadcast_coalesced`].
#[derive(Debug, Clone, Copy)]
pub struct Broadcast;

impl Broadcast {
    /// `out[i][j]`: tensor `j` on `devices[i]`, recorded so that each copy's gradient
    /// returns to the source device, where the engine sums them.
    pub fn apply(devices: &[Device], tensors: &[Tensor]) -> Result<Vec<Vec<Tensor>>> {
        let raw: Vec<Raw> = tensors.iter().map(Tensor::data).collect();
        let copies = broadcast_raw(&raw, devices)?;
        copies
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .zip(tensors)
                    .map(|(c, t)| {
                        let source = t.device();
                        custom_op("BroadcastBackward", &c, &[t], move |g| {
                            Ok(vec![Some(g.to_device(source)?)])
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

/// PyTorch's `ReduceAddCoalesced` function: differentiable [`reduce_add_coalesced`].
#[derive(Debug, Clone, Copy)]
pub struct ReduceAddCoalesced;

impl ReduceAddCoalesced {
    /// `out[j]`: the sum over devices of `inputs[i][j]` on `destination`; the gradient of
    /// each output is broadcast back to every input's device.
    pub fn apply(destination: Device, inputs: &[Vec<Tensor>]) -> Result<Vec<Tensor>> {
        let raw: Vec<Vec<Raw>> = inputs
            .iter()
            .map(|l| l.iter().map(Tensor::data).collect())
            .collect();
        let sums = reduce_add_raw(&raw, destination)?;
        sums.into_iter()
            .enumerate()
            .map(|(j, s)| {
                let ins: Vec<&Tensor> = inputs.iter().map(|l| &l[j]).collect();
                let devices: Vec<Device> = ins.iter().map(|t| t.device()).collect();
                custom_op("ReduceAddCoalescedBackward", &s, &ins, move |g| {
                    devices.iter().map(|&d| Ok(Some(g.to_device(d)?))).collect()
                })
            })
            .collect()
    }
}

/// PyTorch's `Scatter` function: differentiable [`scatter`].
#[derive(Debug, Clone, Copy)]
pub struct Scatter;

impl Scatter {
    /// Chunk `i` of `input` along `dim` on `devices[i]`; each chunk's gradient returns to
    /// its place in the input (so the input's gradient is the gather of the chunks').
    pub fn apply(
        devices: &[Device],
        chunk_sizes: Option<&[usize]>,
        dim: usize,
        input: &Tensor,
    ) -> Result<Vec<Tensor>> {
        let data = input.data();
        let len = data.size(dim)?;
        let sizes = split_sizes("Scatter", len, devices, chunk_sizes)?;
        let chunks = scatter_raw(&data, &devices[..sizes.len()], Some(&sizes), dim)?;
        let (source, dims, dtype) = (data.device(), data.dims().to_vec(), data.dtype());
        let mut start = 0;
        let mut out = Vec::with_capacity(chunks.len());
        for (c, n) in chunks.into_iter().zip(sizes) {
            let (dims, offset) = (dims.clone(), start);
            out.push(custom_op("ScatterBackward", &c, &[input], move |g| {
                let g = g.to_device(source)?;
                let mut pieces = Vec::with_capacity(3);
                let zeros = |rows: usize| {
                    let mut shape = dims.clone();
                    shape[dim] = rows;
                    Raw::zeros(shape, (source, dtype))
                };
                if offset > 0 {
                    pieces.push(zeros(offset)?);
                }
                pieces.push(g);
                let after = dims[dim] - offset - n;
                if after > 0 {
                    pieces.push(zeros(after)?);
                }
                let refs: Vec<&Raw> = pieces.iter().collect();
                Ok(vec![Some(Raw::cat(&refs, dim)?)])
            })?);
            start += n;
        }
        Ok(out)
    }
}

/// PyTorch's `Gather` function: differentiable [`gather`].
#[derive(Debug, Clone, Copy)]
pub struct Gather;

impl Gather {
    /// The inputs concatenated along `dim` on `destination`; the gradient is scattered back
    /// to the inputs' devices in their sizes.
    pub fn apply(destination: Device, dim: usize, inputs: &[Tensor]) -> Result<Tensor> {
        let raw: Vec<Raw> = inputs.iter().map(Tensor::data).collect();
        let out = gather_raw(&raw, dim, destination)?;
        let devices: Vec<Device> = raw.iter().map(Raw::device).collect();
        let sizes = raw
            .iter()
            .map(|t| t.size(dim))
            .collect::<ember_tensor::Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        custom_op("GatherBackward", &out, &refs, move |g| {
            Ok(scatter_raw(g, &devices, Some(&sizes), dim)?
                .into_iter()
                .map(Some)
                .collect())
        })
    }
}
