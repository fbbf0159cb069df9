//! [`Module`]: Ember's kernels loaded on one device, with function handles cached by name, and
//! [`launch_config_1d`] and [`launch_config_elementwise`], the launch geometry of the
//! grid-stride kernels.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ember_device::driver::{Driver, FunctionHandle, LaunchConfig, ModuleHandle, StreamHandle};
use ember_device::trace::device::{ActivityKind, Launch, timed};

use crate::{KernelArgs, KernelsError, load_module};

/// Threads per block of the elementwise kernels.
pub const BLOCK_1D: u32 = 256;
/// The most blocks a 1-D grid-stride launch uses; each thread then loops.
pub const MAX_GRID_1D: u32 = 65_535;

/// The launch of a grid-stride kernel over `n` elements: [`BLOCK_1D`] threads per block, one
/// thread per element up to [`MAX_GRID_1D`] blocks (at least one block, also for `n == 0`).
pub fn launch_config_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK_1D as usize).clamp(1, MAX_GRID_1D as usize) as u32;
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (BLOCK_1D, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Groups per thread per pass of the contiguous elementwise loops (`ELEMENTWISE_UNROLL` in
/// `kernels/ember.cuh`, Note [Elementwise loops]); a group is 16 bytes of the widest operand.
pub const ELEMENTWISE_UNROLL: usize = 4;
/// The most blocks per SM an elementwise launch uses: four waves of the eight
/// [`BLOCK_1D`]-thread blocks that fill an SM's 2048 threads. Past that, threads loop.
pub const ELEMENTWISE_BLOCKS_PER_SM: usize = 32;

/// The launch of an elementwise kernel (unary, binary, comparison, where, cast) over `n`
/// elements whose widest operand has `widest` bytes per element, on a device with
/// `sm_count` SMs: [`BLOCK_1D`] threads per block, one thread per
/// [`ELEMENTWISE_UNROLL`] groups of 16 bytes of the widest operand when every operand is
/// `contiguous` (one pass of the vector loop), one per element otherwise, at most
/// [`ELEMENTWISE_BLOCKS_PER_SM`] blocks per SM and at least one block. Any grid is correct
/// (the kernels loop); this one is sized for bandwidth, not the 65 535-block cap of
/// [`launch_config_1d`].
pub fn launch_config_elementwise(
    n: usize,
    widest: usize,
    contiguous: bool,
    sm_count: usize,
) -> LaunchConfig {
    let per_thread = if contiguous {
        ELEMENTWISE_UNROLL * (16 / widest.clamp(1, 16))
    } else {
        1
    };
    let most = sm_count.max(1).saturating_mul(ELEMENTWISE_BLOCKS_PER_SM);
    let blocks = n
        .div_ceil(per_thread)
        .div_ceil(BLOCK_1D as usize)
        .clamp(1, most.min(u32::MAX as usize)) as u32;
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (BLOCK_1D, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Ember's kernels loaded on one device of a driver (see [`load_module`]), with each
/// function looked up once.
pub struct Module {
    driver: Arc<dyn Driver>,
    device: usize,
    handle: ModuleHandle,
    functions: Mutex<HashMap<String, FunctionHandle>>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.device)
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// Load the kernels on `device` (the CPU-compiled ones under the emulator, the fatbin on
    /// a real GPU).
    pub fn load(driver: Arc<dyn Driver>, device: usize) -> Result<Module, KernelsError> {
        let handle = load_module(driver.as_ref(), device)?;
        Ok(Module {
            driver,
            device,
            handle,
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The device the module was loaded on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The driver it was loaded with.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The kernel `name` (looked up on first use, then cached).
    pub fn function(&self, name: &str) -> Result<FunctionHandle, KernelsError> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&f) = functions.get(name) {
            return Ok(f);
        }
        let f = self.driver.module_function(self.handle, name)?;
        functions.insert(name.to_string(), f);
        Ok(f)
    }

    /// Enqueue kernel `name` on `stream`.
    ///
    /// # Safety
    /// `args` must hold exactly the kernel's parameters, in order, each of its exact type
    /// (its `.cu` file lists them), and every device pointer among them must be valid for
    /// every access the kernel makes with these arguments and this geometry.
    pub unsafe fn launch(
        &self,
        name: &str,
        config: LaunchConfig,
        stream: StreamHandle,
        args: &mut KernelArgs,
    ) -> Result<(), KernelsError> {
        let f = self.function(name)?;
        let mut params = args.params();
        let describe = || Launch {
            api: "cudaLaunchKernel",
            kind: ActivityKind::Kernel,
            name: Cow::Owned(name.to_string()),
            bytes: 0,
            grid: [config.grid.0, config.grid.1, config.grid.2],
            block: [config.block.0, config.block.1, config.block.2],
        };
        // Timed on the device while the profiler listens (Note [Device activity]).
        timed(&*self.driver, self.device, stream, describe, || {
            // SAFETY: forwarded from this function's contract; `params` points into `args`,
            // which outlives the call.
            unsafe { self.driver.launch_kernel(f, config, stream, &mut params) }
        })?;
        Ok(())
    }
}
