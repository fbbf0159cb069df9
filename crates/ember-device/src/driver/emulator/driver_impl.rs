//! `impl Driver for Emulator`. See Note [Emulated streams] for the scheduling rules.

use std::alloc::Layout;
use std::ffi::c_void;
use std::time::Instant;

use super::activity as act;
use super::launch_trace::{self, record_host_wait};
use super::{
    Emulator, EventState, FunctionState, HOST_ALIGN, KernelLaunch, cudnn, device_of_address,
    invalid_handle, kernel_name_ok, lookup_kernel, translate_for_kernel,
};
use crate::driver::{ActivityKind, ActivityRecord, Collective, NcclComm, NcclUniqueId};
use crate::driver::{
    ConvAlgoPerf, ConvBuffers, ConvDesc, ConvProblem, ConvSearch, DeviceProperties, DevicePtr,
    Driver, DriverKind, EventHandle, FunctionHandle, GemmDesc, LaunchConfig, ModuleHandle,
    StreamHandle,
};
use crate::error::{DeviceError, Result};

/// CUDA's limit on threads per block.
const MAX_THREADS_PER_BLOCK: u64 = 1024;

impl Driver for Emulator {
    fn kind(&self) -> DriverKind {
        DriverKind::Emulated
    }

    fn driver_version(&self) -> i32 {
        13000
    }

    fn device_count(&self) -> usize {
        self.config.devices.len()
    }

    fn properties(&self, device: usize) -> Result<DeviceProperties> {
        let d = self
            .config
            .devices
            .get(device)
            .ok_or(self.bad_index(device))?;
        Ok(DeviceProperties {
            name: d.name.clone(),
            total_memory: d.total_memory,
            major: d.major,
            minor: d.minor,
            multi_processor_count: d.multi_processor_count,
            l2_cache_size: d.l2_cache_size,
            max_threads_per_block: MAX_THREADS_PER_BLOCK as u32,
            max_threads_per_multi_processor: 2048,
            warp_size: 32,
            shared_memory_per_block: 48 * 1024,
            shared_memory_per_block_optin: d.shared_memory_per_block_optin,
            regs_per_multiprocessor: 65536,
            memory_bus_width: 5120,
            memory_clock_rate_khz: 2_619_000,
            clock_rate_khz: 1_980_000,
            pci_bus_id: format!("0000:{:02x}:00", 0xE0 + device),
            integrated: false,
            emulated: true,
        })
    }

    fn mem_get_info(&self, device: usize) -> Result<(u64, u64)> {
        let mem = self.mem();
        let d = mem.devices.get(device).ok_or(self.bad_index(device))?;
        Ok((d.total - d.used, d.total))
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        record_host_wait("cuCtxSynchronize");
        self.check_device(device)?;
        self.handles().host_reads.observe_all();
        Ok(())
    }

    fn malloc(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
        self.mem().malloc(device, bytes)
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<()> {
        record_host_wait("cuMemFree");
        self.mem().free(device, ptr)
    }

    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        let layout =
            Layout::from_size_align(bytes.max(1), HOST_ALIGN).map_err(|_| DeviceError::Driver {
                call: "cuMemAllocHost",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("{bytes} bytes is too large"),
            })?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(DeviceError::Driver {
                call: "cuMemAllocHost",
                code: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                detail: format!("host allocation of {bytes} bytes failed"),
            });
        }
        self.handles().host.insert(ptr as usize, bytes);
        Ok(ptr)
    }

    unsafe fn free_host(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        let mut handles = self.handles();
        match handles.host.get(&(ptr as usize)) {
            Some(&b) if b == bytes => {}
            Some(&b) => {
                return Err(DeviceError::Driver {
                    call: "cuMemFreeHost",
                    code: "CUDA_ERROR_INVALID_VALUE".into(),
                    detail: format!("block {ptr:p} has {b} bytes, but free_host was given {bytes}"),
                });
            }
            None => return Err(invalid_handle("cuMemFreeHost", "host pointer", ptr as u64)),
        }
        handles.host.remove(&(ptr as usize));
        let layout = Layout::from_size_align(bytes.max(1), HOST_ALIGN)
            .map_err(|_| DeviceError::driver("cuMemFreeHost", "CUDA_ERROR_INVALID_VALUE"))?;
        // SAFETY: `ptr` was allocated by `malloc_host` with this same layout (checked against
        // the live-block table above) and the caller guarantees no one uses it any more.
        unsafe { std::alloc::dealloc(ptr, layout) };
        Ok(())
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8], stream: StreamHandle) -> Result<()> {
        record_host_wait("cuMemcpyHtoD");
        self.check_on_stream("cuMemcpyHtoD", stream, dst)?;
        let describe = || transfer(ActivityKind::MemcpyHtoD, dst, src.len());
        self.activity.run(describe, || {
            self.mem()
                .slice_mut("cuMemcpyHtoD", dst, src.len())?
                .copy_from_slice(src);
            Ok(())
        })?;
        self.handles().host_reads.observe_all();
        Ok(())
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: StreamHandle) -> Result<()> {
        record_host_wait("cuMemcpyDtoH");
        self.check_on_stream("cuMemcpyDtoH", stream, src)?;
        let len = dst.len();
        let describe = || transfer(ActivityKind::MemcpyDtoH, src, len);
        self.activity.run(describe, || {
            dst.copy_from_slice(self.mem().slice("cuMemcpyDtoH", src, dst.len())?);
            Ok(())
        })?;
        self.handles().host_reads.observe_all();
        Ok(())
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        if bytes == 0 {
            return self.check_on_stream("cuMemcpyHtoDAsync", stream, dst);
        }
        if src.is_null() {
            return Err(DeviceError::Driver {
                call: "cuMemcpyHtoDAsync",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: "null host source".into(),
            });
        }
        // SAFETY: the caller guarantees `src` is valid for reads of `bytes` bytes until the
        // copy completes, which is before this call returns (Note [Emulated streams]).
        let src = unsafe { std::slice::from_raw_parts(src, bytes) };
        self.check_on_stream("cuMemcpyHtoDAsync", stream, dst)?;
        {
            let mut h = self.handles();
            h.host_reads
                .check(src)
                .map_err(|detail| DeviceError::Driver {
                    call: "cuMemcpyHtoDAsync",
                    code: "EMULATOR_HOST_SOURCE_OVERWRITTEN".into(),
                    detail,
                })?;
            h.host_reads.push(src);
        }
        self.activity.run(
            || transfer(ActivityKind::MemcpyHtoD, dst, bytes),
            || {
                self.mem()
                    .slice_mut("cuMemcpyHtoDAsync", dst, bytes)?
                    .copy_from_slice(src);
                Ok(())
            },
        )
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        if bytes == 0 {
            return self.check_on_stream("cuMemcpyDtoHAsync", stream, src);
        }
        if dst.is_null() {
            return Err(DeviceError::Driver {
                call: "cuMemcpyDtoHAsync",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: "null host destination".into(),
            });
        }
        // SAFETY: the caller guarantees `dst` is valid for writes of `bytes` bytes and not
        // otherwise accessed until the copy completes, before this call returns.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
        self.check_on_stream("cuMemcpyDtoHAsync", stream, src)?;
        self.activity.run(
            || transfer(ActivityKind::MemcpyDtoH, src, bytes),
            || {
                dst.copy_from_slice(self.mem().slice("cuMemcpyDtoHAsync", src, bytes)?);
                Ok(())
            },
        )
    }

    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        // Peer copies: the stream may belong to either device, or to neither; only validate it.
        self.stream_device("cuMemcpyDtoDAsync", stream)?;
        let describe = || transfer(ActivityKind::MemcpyDtoD, dst, bytes);
        self.activity.run(describe, || {
            let mem = self.mem();
            let s = mem.translate("cuMemcpyDtoDAsync", src, bytes)?;
            let d = mem.translate("cuMemcpyDtoDAsync", dst, bytes)?;
            // SAFETY: both ranges were checked to lie inside live allocations, which cannot
            // be freed while `mem` (the lock) is held; `ptr::copy` allows them to overlap.
            unsafe { std::ptr::copy(s, d, bytes) };
            Ok(())
        })
    }

    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.check_on_stream("cuMemsetD8Async", stream, dst)?;
        let describe = || transfer(ActivityKind::Memset, dst, bytes);
        self.activity.run(describe, || {
            self.mem()
                .slice_mut("cuMemsetD8Async", dst, bytes)?
                .fill(value);
            Ok(())
        })
    }

    fn stream_create(&self, device: usize) -> Result<StreamHandle> {
        self.check_device(device)?;
        let mut h = self.handles();
        let id = h.issue();
        h.streams.insert(id, device);
        Ok(StreamHandle(id))
    }

    fn stream_destroy(&self, stream: StreamHandle) -> Result<()> {
        match self.handles().streams.remove(&stream.0) {
            Some(_) => {
                // The stream's cuBLAS workspaces go with it (Note [cuBLAS handles]).
                self.blas_handles.release_stream(stream);
                Ok(())
            }
            None => Err(invalid_handle("cuStreamDestroy", "stream", stream.0)),
        }
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> Result<()> {
        record_host_wait("cuStreamSynchronize");
        self.stream_device("cuStreamSynchronize", stream)?;
        self.handles().host_reads.observe_all();
        Ok(())
    }

    fn stream_query(&self, stream: StreamHandle) -> Result<bool> {
        self.stream_device("cuStreamQuery", stream)?;
        self.handles().host_reads.observe_all();
        Ok(true)
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        self.stream_device("cuStreamWaitEvent", stream)?;
        self.event("cuStreamWaitEvent", event).map(|_| ())
    }

    fn event_create(&self, device: usize, timing: bool) -> Result<EventHandle> {
        self.check_device(device)?;
        let mut h = self.handles();
        let id = h.issue();
        h.events.insert(
            id,
            EventState {
                device,
                timing,
                recorded: None,
                reads_seq: 0,
            },
        );
        launch_trace::record_event_call("cuEventCreate");
        Ok(EventHandle(id))
    }

    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        match self.handles().events.remove(&event.0) {
            Some(_) => {
                launch_trace::record_event_call("cuEventDestroy");
                Ok(())
            }
            None => Err(invalid_handle("cuEventDestroy", "event", event.0)),
        }
    }

    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        let state = self.event("cuEventRecord", event)?;
        if let Some(device) = self.stream_device("cuEventRecord", stream)?
            && device != state.device
        {
            return Err(DeviceError::Driver {
                call: "cuEventRecord",
                code: "CUDA_ERROR_INVALID_HANDLE".into(),
                detail: format!(
                    "event of cuda:{} recorded on a stream of cuda:{device}",
                    state.device
                ),
            });
        }
        let now = Instant::now();
        let mut h = self.handles();
        let seq = h.host_reads.now();
        if let Some(e) = h.events.get_mut(&event.0) {
            e.recorded = Some(now);
            e.reads_seq = seq;
        }
        Ok(())
    }

    fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        record_host_wait("cuEventSynchronize");
        let e = self.event("cuEventSynchronize", event)?;
        self.handles().host_reads.observe_until(e.reads_seq);
        Ok(())
    }

    fn event_query(&self, event: EventHandle) -> Result<bool> {
        let e = self.event("cuEventQuery", event)?;
        self.handles().host_reads.observe_until(e.reads_seq);
        Ok(true)
    }

    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        const CALL: &str = "cuEventElapsedTime";
        let mut times = [None; 2];
        for (slot, (which, handle)) in times.iter_mut().zip([("start", start), ("end", end)]) {
            let e = self.event(CALL, handle)?;
            let problem = if !e.timing {
                "was created with timing disabled"
            } else if e.recorded.is_none() {
                "has not been recorded"
            } else {
                ""
            };
            if !problem.is_empty() {
                return Err(DeviceError::Driver {
                    call: CALL,
                    code: "CUDA_ERROR_INVALID_HANDLE".into(),
                    detail: format!("the {which} event {:#x} {problem}", handle.0),
                });
            }
            *slot = e.recorded;
        }
        let (Some(t0), Some(t1)) = (times[0], times[1]) else {
            return Err(DeviceError::driver(CALL, "CUDA_ERROR_INVALID_HANDLE"));
        };
        let ms = if t1 >= t0 {
            t1.duration_since(t0).as_secs_f64() * 1e3
        } else {
            -(t0.duration_since(t1).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }

    fn module_load(&self, device: usize, _image: &[u8]) -> Result<ModuleHandle> {
        self.check_device(device)?;
        let mut h = self.handles();
        let id = h.issue();
        h.modules.insert(id, device);
        Ok(ModuleHandle(id))
    }

    fn module_function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle> {
        const CALL: &str = "cuModuleGetFunction";
        let device = *self
            .handles()
            .modules
            .get(&module.0)
            .ok_or(invalid_handle(CALL, "module", module.0))?;
        if !kernel_name_ok(name) {
            return Err(DeviceError::Driver {
                call: CALL,
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("invalid kernel name {name:?}"),
            });
        }
        let Some(kernel) = lookup_kernel(name) else {
            return Err(DeviceError::Driver {
                call: CALL,
                code: "CUDA_ERROR_NOT_FOUND".into(),
                detail: format!(
                    "no emulated kernel named {name:?} is registered; the emulated kernels come from `kernels/` \
                     (compiled for the CPU and registered by the CUDA backend) or from emulator::register_kernel"
                ),
            });
        };
        let mut h = self.handles();
        let id = h.issue();
        h.functions.insert(
            id,
            FunctionState {
                device,
                name: name.to_string(),
                kernel,
            },
        );
        Ok(FunctionHandle(id))
    }

    unsafe fn launch_kernel(
        &self,
        function: FunctionHandle,
        config: LaunchConfig,
        stream: StreamHandle,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        const CALL: &str = "cuLaunchKernel";
        let f = self
            .handles()
            .functions
            .get(&function.0)
            .cloned()
            .ok_or(invalid_handle(CALL, "function", function.0))?;
        if let Some(device) = self.stream_device(CALL, stream)?
            && device != f.device
        {
            return Err(DeviceError::Driver {
                call: CALL,
                code: "CUDA_ERROR_INVALID_HANDLE".into(),
                detail: format!(
                    "kernel {:?} of a module on cuda:{} launched on a stream of cuda:{device}",
                    f.name, f.device
                ),
            });
        }
        let (g, b) = (config.grid, config.block);
        let threads = u64::from(b.0) * u64::from(b.1) * u64::from(b.2);
        let optin = self.config.devices[f.device].shared_memory_per_block_optin;
        let problem = if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            Some("grid and block dimensions must be at least 1".to_string())
        } else if threads > MAX_THREADS_PER_BLOCK {
            Some(format!(
                "{threads} threads per block, at most {MAX_THREADS_PER_BLOCK} allowed"
            ))
        } else if u64::from(config.shared_mem_bytes) > optin {
            Some(format!(
                "{} bytes of dynamic shared memory, at most {optin} allowed",
                config.shared_mem_bytes
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(DeviceError::Driver {
                call: CALL,
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("kernel {:?}: {problem}", f.name),
            });
        }
        let describe =
            || ActivityRecord::kernel(f.name.clone(), f.device, [g.0, g.1, g.2], [b.0, b.1, b.2]);
        // SAFETY: forwarded from this function's contract.
        self.activity
            .run(describe, || unsafe { self.run_kernel(&f, config, params) })
    }

    fn gemm(&self, device: usize, stream: StreamHandle, desc: &GemmDesc) -> Result<()> {
        const CALL: &str = "cublasGemmStridedBatchedEx";
        self.check_device(device)?;
        if let Some(d) = self.stream_device(CALL, stream)?
            && d != device
        {
            return Err(DeviceError::Driver {
                call: CALL,
                code: "CUBLAS_STATUS_INVALID_VALUE".into(),
                detail: format!("GEMM on cuda:{device} enqueued on a stream of cuda:{d}"),
            });
        }
        if desc.m == 0 || desc.n == 0 || desc.batch == 0 {
            return Ok(());
        }
        let operands: &[(&str, DevicePtr)] = if desc.k == 0 {
            &[("C", desc.c)]
        } else {
            &[("A", desc.a), ("B", desc.b), ("C", desc.c)]
        };
        for &(name, ptr) in operands {
            if device_of_address(ptr) != Some(device) {
                return Err(DeviceError::Driver {
                    call: CALL,
                    code: "CUBLAS_STATUS_INVALID_VALUE".into(),
                    detail: format!("{name} at {ptr:?} is not memory of cuda:{device}"),
                });
            }
        }
        let describe = || {
            let name = format!(
                "emulated_gemm_{}_{}x{}x{}_batch{}",
                format!("{:?}", desc.dtype).to_lowercase(),
                desc.m,
                desc.n,
                desc.k,
                desc.batch
            );
            ActivityRecord::kernel(name, device, [1; 3], [1; 3])
        };
        // The calling thread's handle, bound to the stream, with the (handle, stream)
        // workspace: Note [cuBLAS handles], Note [Emulated cuBLAS].
        let h = self
            .blas_handles
            .handle(device, || self.blas_create(device))?;
        let workspace = self
            .blas_handles
            .workspace(h, stream, || Ok(Default::default()))?;
        self.blas_set_stream(h, stream)?;
        self.blas_set_workspace(h, workspace)?;
        self.activity.run(describe, || self.blas_gemm(h, desc))
    }

    fn cudnn_version(&self, device: usize) -> Result<usize> {
        self.check_device(device)?;
        cudnn::version()
    }

    fn conv_algorithms(
        &self,
        device: usize,
        stream: StreamHandle,
        problem: &ConvProblem,
        search: ConvSearch,
    ) -> Result<Vec<ConvAlgoPerf>> {
        self.check_library_call("cudnnFindConvolution*AlgorithmEx", device, stream)?;
        if let ConvSearch::Benchmark(b) = search {
            self.check_conv_buffers("cudnnFindConvolution*AlgorithmEx", device, problem, &b)?;
        }
        cudnn::algorithms(&self.mem(), problem, search)
    }

    fn conv(&self, device: usize, stream: StreamHandle, desc: &ConvDesc) -> Result<()> {
        let call = cudnn::run_name(desc.problem.direction);
        self.check_library_call(call, device, stream)?;
        self.check_conv_buffers(call, device, &desc.problem, &desc.buffers)?;
        let describe = || {
            let p = &desc.problem;
            let name = format!(
                "emulated_conv_{:?}_{}_x{:?}_w{:?}_algo{}",
                p.direction,
                format!("{:?}", p.dtype).to_lowercase(),
                p.x_dims,
                p.w_dims,
                desc.algo
            );
            ActivityRecord::kernel(name, device, [1; 3], [1; 3])
        };
        self.activity
            .run(describe, || cudnn::run(&mut self.mem(), desc))
    }

    fn nccl_version(&self) -> Result<i32> {
        Ok(super::EMULATED_NCCL_VERSION)
    }

    fn nccl_unique_id(&self) -> Result<NcclUniqueId> {
        self.nccl_unique_id_impl()
    }

    fn nccl_comm_init_all(&self, devices: &[usize]) -> Result<Vec<NcclComm>> {
        self.nccl_comm_init_all_impl(devices)
    }

    fn nccl_comm_init_rank(
        &self,
        device: usize,
        nranks: usize,
        id: &NcclUniqueId,
        rank: usize,
    ) -> Result<NcclComm> {
        self.nccl_comm_init_rank_impl(device, nranks, id, rank)
    }

    fn nccl_comm_info(&self, comm: NcclComm) -> Result<(usize, usize, usize)> {
        self.nccl_comm_info_impl(comm)
    }

    fn nccl_comm_destroy(&self, comm: NcclComm) -> Result<()> {
        self.nccl_comm_destroy_impl(comm)
    }

    fn nccl_comm_abort(&self, comm: NcclComm) -> Result<()> {
        self.nccl_comm_abort_impl(comm)
    }

    fn nccl_group_start(&self) -> Result<()> {
        self.nccl_group_start_impl()
    }

    fn nccl_group_end(&self) -> Result<()> {
        self.nccl_group_end_impl()
    }

    fn nccl_collective(&self, comm: NcclComm, stream: StreamHandle, op: &Collective) -> Result<()> {
        self.nccl_collective_impl(comm, stream, op)
    }

    fn activity_version(&self) -> Result<u32> {
        act::version()
    }

    fn activity_enable(&self) -> Result<()> {
        act::version()?;
        self.activity.set_enabled(true);
        Ok(())
    }

    fn activity_disable(&self) -> Result<()> {
        self.activity.set_enabled(false);
        Ok(())
    }

    fn activity_push_correlation(&self, id: u64) -> Result<()> {
        act::push(id);
        Ok(())
    }

    fn activity_pop_correlation(&self) -> Result<()> {
        act::pop()
    }

    fn activity_flush(&self) -> Result<Vec<ActivityRecord>> {
        Ok(self.activity.flush())
    }

    fn activity_timestamp_ns(&self) -> Result<u64> {
        Ok(self.activity.now_ns())
    }
}

impl Emulator {
    /// A library call on `device` enqueued on `stream`: the device exists and the stream is
    /// the default one or one of that device's.
    fn check_library_call(
        &self,
        call: &'static str,
        device: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.check_device(device)?;
        match self.stream_device(call, stream)? {
            Some(d) if d != device => Err(DeviceError::Driver {
                call,
                code: "CUDNN_STATUS_BAD_PARAM".into(),
                detail: format!("a call on cuda:{device} enqueued on a stream of cuda:{d}"),
            }),
            _ => Ok(()),
        }
    }

    /// The convolution's tensors (and workspace, if any) are memory of `device`.
    fn check_conv_buffers(
        &self,
        call: &'static str,
        device: usize,
        problem: &ConvProblem,
        b: &ConvBuffers,
    ) -> Result<()> {
        let [nx, nw, ny] = problem.numels();
        let mut operands = vec![("x", b.x, nx), ("w", b.w, nw), ("y", b.y, ny)];
        operands.push(("workspace", b.workspace, b.workspace_bytes));
        for (i, (name, ptr, len)) in operands.into_iter().enumerate() {
            if len > 0 && device_of_address(ptr) != Some(device) {
                return Err(DeviceError::Driver {
                    call,
                    code: "CUDNN_STATUS_BAD_PARAM".into(),
                    detail: format!("{name} at {ptr:?} is not memory of cuda:{device}"),
                });
            }
            // The three tensors have the alignment the problem (and so a plan) was made for.
            let align = problem.align.max(1);
            if i < 3 && len > 0 && (!align.is_power_of_two() || ptr.0 % align as u64 != 0) {
                return Err(DeviceError::Driver {
                    call,
                    code: "CUDNN_STATUS_BAD_PARAM".into(),
                    detail: format!(
                        "{name} at {ptr:?} does not have the problem's alignment of {} bytes",
                        problem.align
                    ),
                });
            }
        }
        Ok(())
    }

    /// Run a checked launch of `f` (the body of `launch_kernel`).
    ///
    /// # Safety
    /// As [`Driver::launch_kernel`]: `params` matches the kernel's parameters.
    unsafe fn run_kernel(
        &self,
        f: &FunctionState,
        config: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        const CALL: &str = "cuLaunchKernel";
        let (g, b) = (config.grid, config.block);
        let mem = self.mem();
        let launch = KernelLaunch {
            grid: [g.0, g.1, g.2],
            block: [b.0, b.1, b.2],
            shared_mem_bytes: config.shared_mem_bytes,
            params: params.as_mut_ptr(),
            num_params: params.len(),
            translate_ctx: &*mem as *const _ as *const c_void,
            translate: translate_for_kernel,
        };
        // Before it runs, so that a kernel that aborts the process still counts (Note [Launch
        // trace]).
        super::launch_trace::record_launch(&f.name);
        // SAFETY: the caller guarantees `params` matches the kernel's parameters; `launch`
        // and the memory state it points at outlive the call, and the lock is held throughout.
        let status = unsafe { (f.kernel)(&launch) };
        drop(mem);
        if status == 0 {
            Ok(())
        } else {
            Err(DeviceError::Driver {
                call: CALL,
                code: "CUDA_ERROR_LAUNCH_FAILED".into(),
                detail: format!("emulated kernel {:?} returned status {status}", f.name),
            })
        }
    }
}

/// A copy or memset of `bytes` touching `ptr` (its device; 0 for host memory).
fn transfer(kind: ActivityKind, ptr: DevicePtr, bytes: usize) -> ActivityRecord {
    ActivityRecord::transfer(kind, device_of_address(ptr).unwrap_or(0), bytes as u64)
}
