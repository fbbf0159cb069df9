//! The CUDA side of the optimizers' multi-tensor steps (`ops/optim.rs`, kernels in
//! `kernels/optim.cu`): one launch per dtype present updates every parameter of that dtype,
//! through a table in device memory as Note [Multi-tensor launches] (`cuda/amp.rs`)
//! describes, here with chunk entries so that the blocks spread over all the tensors.

use ember_device::driver::LaunchConfig;
use ember_kernels::{BLOCK_1D, KernelArgs, MAX_GRID_1D};

use super::{CudaStorage, kernel_name};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;

/// Elements per chunk entry of the table: `OPTIM_CHUNK` in kernels/optim.cu.
const OPTIM_CHUNK: usize = 32768;

/// One parameter's row of a multi-tensor step: its tensors (param, grad, then the state
/// tensors; `None` for a state the options leave out, passed as address 0) and the
/// per-tensor values that follow the element counts in the table.
pub(crate) struct OptimRow<'a> {
    /// Contiguous views of one float dtype and one element count; the first is the param.
    pub tensors: Vec<Option<(&'a CudaStorage, &'a Layout)>>,
    /// The kernel's per-tensor entries after the element counts (flags, f64 bit patterns).
    pub extras: Vec<i64>,
}

/// Launches `{kernel}_{dtype}` once per float dtype present among `rows` (rows of empty
/// tensors are skipped); `scalars` pushes the kernel's parameters after the table.
pub(crate) fn optim_step<'a>(
    op: &'static str,
    kernel: &str,
    rows: &[OptimRow<'a>],
    scalars: impl Fn(&mut KernelArgs),
) -> Result<()> {
    for dtype in [DType::F32, DType::F64, DType::F16, DType::Bf16] {
        let of_dtype: Vec<(&OptimRow<'a>, &'a CudaStorage, usize)> = rows
            .iter()
            .filter_map(|r| {
                let (s, l) = r.tensors.first().copied().flatten()?;
                (s.dtype() == dtype && l.numel() > 0).then_some((r, s, l.numel()))
            })
            .collect();
        let Some(&(row0, s0, _)) = of_dtype.first() else {
            continue;
        };
        let ctx = s0.ctx().clone();
        let (count, columns) = (of_dtype.len(), row0.tensors.len());
        let mut table: Vec<i64> = Vec::with_capacity((columns + 2) * count);
        for c in 0..columns {
            for (r, _, _) in &of_dtype {
                let t = r.tensors.get(c).copied().flatten();
                // The address's bits as an i64 (the kernel reads them back as u64); 0 for a
                // state the options leave out.
                table.push(t.map_or(0, |(s, l)| s.ptr_at(l.offset()).0 as i64));
            }
        }
        table.extend(of_dtype.iter().map(|(_, _, n)| *n as i64));
        for e in 0..row0.extras.len() {
            for (r, _, _) in &of_dtype {
                let v = r.extras.get(e).copied();
                table.push(v.ok_or_else(|| {
                    TensorError::invalid(op, "internal error: a row without its extras")
                })?);
            }
        }
        let mut chunks = 0usize;
        for (t, (_, _, n)) in of_dtype.iter().enumerate() {
            for c in 0..n.div_ceil(OPTIM_CHUNK) {
                table.push(((t as i64) << 32) | c as i64);
                chunks += 1;
            }
        }
        let table = CudaStorage::upload_table(&ctx, &table)?;
        let mut args = KernelArgs::new();
        args.push(count as i64)
            .push(chunks as i64)
            .ptr(table.ptr_at(0));
        scalars(&mut args);
        let config = LaunchConfig {
            grid: (chunks.clamp(1, MAX_GRID_1D as usize) as u32, 1, 1),
            block: (BLOCK_1D, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `{kernel}_{dtype}(i64 n, i64 num_chunks, const i64* table, ...scalars)` as
        // kernels/optim.cu declares them (the callers in `ops/optim.rs` push exactly its
        // scalars). The table holds, per column, `count` addresses, each the first element
        // of a contiguous view of `numel` elements of `dtype` inside its live storage (the
        // front checked contiguity, dtype and element counts of every row, and holds every
        // storage's lock, params and states for writing, so none is freed or touched
        // meanwhile), or 0 for a state the kernel does not read because its flags say so;
        // then the counts, the extras, and `chunks` chunk entries each naming a tensor
        // `t < count` and a chunk inside it. The table stays alive until the end of this
        // function, and a later reuse of its block is ordered after the launch on the
        // same stream.
        unsafe { ctx.launch(&kernel_name(kernel, dtype), config, &mut args)? };
    }
    Ok(())
}
