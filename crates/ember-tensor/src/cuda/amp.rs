//! The CUDA side of the GradScaler's ops (`ops/amp.rs`, kernels in `kernels/amp.cu`): one
//! multi-tensor launch per dtype for the inf/NaN check and unscale, one single-thread launch
//! for the scale update. See Note [Multi-tensor launches].

use ember_device::driver::LaunchConfig;
use ember_kernels::{KernelArgs, launch_config_1d};

use super::{CudaStorage, kernel_name};
use crate::cpu::amp::ScaleUpdate;
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::Layout;

// Note [Multi-tensor launches]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's `_amp_foreach_non_finite_check_and_unscale_` passes the tensors' addresses to
// its kernel inside a by-value struct, in launches of at most ~110 tensors. Ember's
// emulator translates only top-level pointer parameters (kernels/README.md), so the
// addresses go through device memory instead: the host uploads one i64 table, the
// tensors' element addresses followed by their element counts, and `amp_unscale_{dtype}`
// reads it, turning each address into a pointer with `device_ptr` (the pointer itself on
// a GPU, a checked translation in the emulator). So one launch covers every gradient of
// one dtype on one device however many there are; the table upload is one small
// synchronous copy. Each tensor is walked by a grid-stride loop of the whole grid, which is
// sized for the largest tensor.

/// `amp_unscale_{dtype}` over `grads` (contiguous views, float dtypes), one launch per dtype
/// present; `found_inf` is set to 1 by any launch that meets an infinity or a NaN.
pub(crate) fn amp_unscale(
    grads: &[(&CudaStorage, &Layout)],
    (found_inf, lf): (&mut CudaStorage, &Layout),
    (inv_scale, li): (&CudaStorage, &Layout),
) -> Result<()> {
    let ctx = found_inf.ctx().clone();
    for dtype in [DType::F32, DType::F64, DType::F16, DType::Bf16] {
        let of_dtype: Vec<&(&CudaStorage, &Layout)> = grads
            .iter()
            .filter(|(s, l)| s.dtype() == dtype && l.numel() > 0)
            .collect();
        if of_dtype.is_empty() {
            continue;
        }
        let count = of_dtype.len();
        let mut table: Vec<i64> = Vec::with_capacity(2 * count);
        // The address's bits as an i64 (the kernel reads them back as u64).
        table.extend(of_dtype.iter().map(|(s, l)| s.ptr_at(l.offset()).0 as i64));
        table.extend(of_dtype.iter().map(|(_, l)| l.numel() as i64));
        let largest = of_dtype.iter().map(|(_, l)| l.numel()).max().unwrap_or(0);
        let table = CudaStorage::upload_table(&ctx, &table)?;
        let mut args = KernelArgs::new();
        args.push(count as i64)
            .ptr(table.ptr_at(0))
            .ptr(table.ptr_at(count))
            .ptr(found_inf.ptr_at(lf.offset()))
            .ptr(inv_scale.ptr_at(li.offset()));
        // SAFETY: `amp_unscale_{dtype}(i64 n, const u64* addrs, const i64* numels, float*
        // found_inf, const float* inv_scale)`; the table holds `count` addresses then
        // `count` counts, each address the first element of a contiguous view of `numel`
        // elements of `dtype` inside its live storage (the front checked contiguity, the
        // dtype is filtered above, and the caller holds every storage's write lock, so none
        // is freed or touched meanwhile); `found_inf` and `inv_scale` are one-element f32
        // views on this device. The table stays alive until the end of this function, and a
        // later reuse of its block is ordered after the launch on the same stream.
        unsafe {
            ctx.launch(
                &kernel_name("amp_unscale", dtype),
                launch_config_1d(largest),
                &mut args,
            )?
        };
    }
    Ok(())
}

/// `amp_update_scale_f32` on one-element views: an f32 scale, an i32 growth tracker, an f32
/// found_inf.
pub(crate) fn amp_update_scale(
    (scale, ls): (&mut CudaStorage, &Layout),
    (tracker, lt): (&mut CudaStorage, &Layout),
    (found_inf, lf): (&CudaStorage, &Layout),
    u: ScaleUpdate,
) -> Result<()> {
    let mut args = KernelArgs::new();
    args.ptr(scale.ptr_at(ls.offset()))
        .ptr(tracker.ptr_at(lt.offset()))
        .ptr(found_inf.ptr_at(lf.offset()))
        .push(u.growth_factor)
        .push(u.backoff_factor)
        .push(u.growth_interval);
    let one = LaunchConfig {
        grid: (1, 1, 1),
        block: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `amp_update_scale_f32(float* scale, i32* tracker, const float* found_inf,
    // double, double, i32)`; the front checked that the three views are one element each of
    // f32, i32 and f32 on this device; one thread touches only those three elements.
    unsafe { scale.ctx().launch("amp_update_scale_f32", one, &mut args)? };
    Ok(())
}
