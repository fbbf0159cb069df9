//! `impl Driver for RealDriver`: the driver API and cuBLAS calls, most one or two checked
//! calls per method; cuDNN, NCCL and CUPTI calls go to their modules (`cudnn.rs`,
//! `cudnn_graph.rs`, `nccl.rs`, `cupti.rs`).

use super::*;
use crate::driver::{
    Collective, ConvAlgoPerf, ConvDesc, ConvProblem, ConvSearch, NcclComm, NcclUniqueId,
};

use sys::CUdevice_attribute as A;

impl Driver for RealDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Real
    }

    fn driver_version(&self) -> i32 {
        self.version
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn properties(&self, device: usize) -> Result<DeviceProperties> {
        let dev = self.bind(device)?;
        let mut name = [0u8; 256];
        // SAFETY: the buffer is valid for its length; `dev` is a valid device.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as c_int, dev)
        })?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let mut total: usize = 0;
        // SAFETY: the out-pointer is a valid local; `dev` is a valid device.
        check("cuDeviceTotalMem", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total, dev)
        })?;
        let at = |attr| self.attribute(dev, attr);
        let u = |attr| at(attr).map(|v| v.max(0) as u32);
        Ok(DeviceProperties {
            name: String::from_utf8_lossy(&name[..end]).into_owned(),
            total_memory: total as u64,
            major: u(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            minor: u(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            multi_processor_count: u(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_cache_size: u64::from(u(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?),
            max_threads_per_block: u(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_threads_per_multi_processor: u(
                A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
            )?,
            warp_size: u(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
            shared_memory_per_block: u64::from(u(
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            )?),
            shared_memory_per_block_optin: u64::from(u(
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?),
            regs_per_multiprocessor: u(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            memory_bus_width: u(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?,
            memory_clock_rate_khz: u(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?,
            clock_rate_khz: u(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?,
            pci_bus_id: format!(
                "{:04x}:{:02x}:{:02x}",
                at(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                at(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                at(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
            ),
            integrated: at(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
            emulated: false,
        })
    }

    fn mem_get_info(&self, device: usize) -> Result<(u64, u64)> {
        self.bind(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers are valid locals; the device's context is current.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        self.bind(device)?;
        // SAFETY: the device's context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn malloc(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
        self.bind(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a valid local; the device's context is current.
        match unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) } {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(DeviceError::OutOfMemory { device, bytes })
            }
            status => check("cuMemAlloc", status).map(|()| DevicePtr(ptr)),
        }
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<()> {
        self.bind(device)?;
        // SAFETY: the driver validates `ptr`; an invalid one is an error status.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr.0) })
    }

    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        self.bind(0)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; a context is current.
        let status = unsafe { sys::cuMemAllocHost_v2(&mut ptr, bytes.max(1)) };
        check("cuMemAllocHost", status).map(|()| ptr.cast())
    }

    unsafe fn free_host(&self, ptr: *mut u8, _bytes: usize) -> Result<()> {
        self.bind(0)?;
        // SAFETY: the caller guarantees `ptr` came from `malloc_host` and is unused.
        check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(ptr.cast()) })
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8], stream: StreamHandle) -> Result<()> {
        let (_, s) = self.stream("cuMemcpyHtoDAsync", stream, None, Some(dst))?;
        // SAFETY: `src` is valid for its length until the stream is synchronised below.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.0, src.as_ptr().cast(), src.len(), s)
        })?;
        // SAFETY: `s` is a live stream (or the null stream) of the current context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s)
        })
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: StreamHandle) -> Result<()> {
        let (_, s) = self.stream("cuMemcpyDtoHAsync", stream, None, Some(src))?;
        // SAFETY: `dst` is valid for writes of its length until the synchronisation below.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src.0, dst.len(), s)
        })?;
        // SAFETY: as above.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s)
        })
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let (_, s) = self.stream("cuMemcpyHtoDAsync", stream, None, Some(dst))?;
        // SAFETY: the caller keeps `src` valid until the copy completes on the stream.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.0, src.cast(), bytes, s)
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let (_, s) = self.stream("cuMemcpyDtoHAsync", stream, None, Some(src))?;
        // SAFETY: the caller keeps `dst` valid and untouched until the copy completes.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast(), src.0, bytes, s)
        })
    }

    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let (_, s) = self.stream("cuMemcpyDtoDAsync", stream, None, Some(dst))?;
        // SAFETY: the driver validates both device ranges (unified addressing covers peers).
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, s)
        })
    }

    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let (_, s) = self.stream("cuMemsetD8Async", stream, None, Some(dst))?;
        // SAFETY: the driver validates the device range.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(dst.0, value, bytes, s)
        })
    }

    fn stream_create(&self, device: usize) -> Result<StreamHandle> {
        self.bind(device)?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the device's context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        self.tables().streams.insert(s as u64, device);
        Ok(StreamHandle(s as u64))
    }

    fn stream_destroy(&self, stream: StreamHandle) -> Result<()> {
        let (_, s) = self.stream("cuStreamDestroy", stream, None, None)?;
        if stream == StreamHandle::DEFAULT {
            return Err(DeviceError::InvalidHandle {
                what: "cuStreamDestroy",
                kind: "stream",
                handle: 0,
            });
        }
        self.tables().streams.remove(&stream.0);
        self.free_cublas_workspaces(stream);
        // SAFETY: `s` is a live stream from `stream_create`, now removed from the table.
        check("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(s) })
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> Result<()> {
        if stream == StreamHandle::DEFAULT {
            return (0..self.devices.len()).try_for_each(|d| self.synchronize(d));
        }
        let (_, s) = self.stream("cuStreamSynchronize", stream, None, None)?;
        // SAFETY: `s` is a live stream of the current context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s)
        })
    }

    fn stream_query(&self, stream: StreamHandle) -> Result<bool> {
        let devices: Vec<Option<usize>> = if stream == StreamHandle::DEFAULT {
            (0..self.devices.len()).map(Some).collect()
        } else {
            vec![None]
        };
        for device in devices {
            let (_, s) = self.stream("cuStreamQuery", stream, device, None)?;
            // SAFETY: `s` is a live stream (or the null stream) of the current context.
            match unsafe { sys::cuStreamQuery(s) } {
                sys::CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                status => check("cuStreamQuery", status)?,
            }
        }
        Ok(true)
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        let (device, _) = self.event("cuStreamWaitEvent", event)?;
        let (_, s) = self.stream("cuStreamWaitEvent", stream, Some(device), None)?;
        // SAFETY: both handles are live (checked against the tables).
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(s, event.0 as sys::CUevent, 0)
        })
    }

    fn event_create(&self, device: usize, timing: bool) -> Result<EventHandle> {
        self.bind(device)?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the device's context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, flags as u32)
        })?;
        self.tables().events.insert(e as u64, (device, timing));
        Ok(EventHandle(e as u64))
    }

    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        self.event("cuEventDestroy", event)?;
        self.tables().events.remove(&event.0);
        // SAFETY: the event was live and is now removed from the table.
        check("cuEventDestroy", unsafe {
            sys::cuEventDestroy_v2(event.0 as sys::CUevent)
        })
    }

    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        let (device, _) = self.event("cuEventRecord", event)?;
        let (_, s) = self.stream("cuEventRecord", stream, Some(device), None)?;
        // SAFETY: both handles are live.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.0 as sys::CUevent, s)
        })
    }

    fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        self.event("cuEventSynchronize", event)?;
        // SAFETY: the event is live.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event.0 as sys::CUevent)
        })
    }

    fn event_query(&self, event: EventHandle) -> Result<bool> {
        self.event("cuEventQuery", event)?;
        // SAFETY: the event is live.
        match unsafe { sys::cuEventQuery(event.0 as sys::CUevent) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            status => check("cuEventQuery", status).map(|()| true),
        }
    }

    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        self.event("cuEventElapsedTime", end)?;
        self.event("cuEventElapsedTime", start)?;
        let mut ms: f32 = 0.0;
        // SAFETY: both events are live; the out-pointer is a valid local.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start.0 as sys::CUevent, end.0 as sys::CUevent)
        })?;
        Ok(ms)
    }

    fn module_load(&self, device: usize, image: &[u8]) -> Result<ModuleHandle> {
        self.bind(device)?;
        // The image needs 8-byte alignment (include_bytes! gives none) and, for PTX, a NUL.
        let mut aligned = vec![0u64; (image.len() + 1).div_ceil(8)];
        for (word, chunk) in aligned.iter_mut().zip(image.chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(bytes);
        }
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `aligned` holds the image, aligned and NUL-terminated, for the whole call.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, aligned.as_ptr().cast())
        })?;
        self.tables().modules.insert(module as u64, device);
        Ok(ModuleHandle(module as u64))
    }

    fn module_function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle> {
        let device = *self
            .tables()
            .modules
            .get(&module.0)
            .ok_or(DeviceError::InvalidHandle {
                what: "cuModuleGetFunction",
                kind: "module",
                handle: module.0,
            })?;
        self.bind(device)?;
        let cname = std::ffi::CString::new(name).map_err(|_| DeviceError::Driver {
            call: "cuModuleGetFunction",
            code: "CUDA_ERROR_INVALID_VALUE".into(),
            detail: format!("kernel name {name:?} contains a NUL byte"),
        })?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is live; `cname` is a valid C string for the call.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, module.0 as sys::CUmodule, cname.as_ptr())
        })
        .map_err(|e| match e {
            DeviceError::Driver { call, code, .. } => DeviceError::Driver {
                call,
                code,
                detail: format!("kernel {name:?}"),
            },
            other => other,
        })?;
        self.tables().functions.insert(f as u64, device);
        Ok(FunctionHandle(f as u64))
    }

    unsafe fn launch_kernel(
        &self,
        function: FunctionHandle,
        config: LaunchConfig,
        stream: StreamHandle,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let device =
            *self
                .tables()
                .functions
                .get(&function.0)
                .ok_or(DeviceError::InvalidHandle {
                    what: "cuLaunchKernel",
                    kind: "function",
                    handle: function.0,
                })?;
        let (_, s) = self.stream("cuLaunchKernel", stream, Some(device), None)?;
        let (g, b) = (config.grid, config.block);
        // SAFETY: the function and stream are live; the caller guarantees `params` matches
        // the kernel's parameters and every device pointer among them.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                function.0 as sys::CUfunction,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                config.shared_mem_bytes,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn gemm(&self, device: usize, stream: StreamHandle, desc: &GemmDesc) -> Result<()> {
        const CALL: &str = "cublasGemmStridedBatchedEx";
        let (_, s) = self.stream(CALL, stream, Some(device), None)?;
        let handle = self.cublas(device)?;
        let int = |v: usize, what: &str| {
            c_int::try_from(v).map_err(|_| DeviceError::Driver {
                call: CALL,
                code: "CUBLAS_STATUS_INVALID_VALUE".into(),
                detail: format!("{what} = {v} does not fit cuBLAS's 32-bit int"),
            })
        };
        let long = |v: usize| v as c_longlong;
        use cublas_sys::{cublasComputeType_t as C, cudaDataType as T};
        let (ty, compute) = match desc.dtype {
            GemmType::F32 if desc.allow_tf32 => (T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_TF32),
            GemmType::F32 => (T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
            GemmType::F64 => (T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
            GemmType::F16 => (T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
            GemmType::Bf16 => (T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
        };
        // alpha/beta are in the compute type: f64 for COMPUTE_64F, f32 otherwise.
        let (alpha32, beta32) = (desc.alpha as f32, desc.beta as f32);
        let (alpha_p, beta_p): (*const c_void, *const c_void) = if desc.dtype == GemmType::F64 {
            (
                (&desc.alpha as *const f64).cast(),
                (&desc.beta as *const f64).cast(),
            )
        } else {
            (
                (&alpha32 as *const f32).cast(),
                (&beta32 as *const f32).cast(),
            )
        };
        let op = |t: bool| {
            if t {
                cublas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cublas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // The thread's own handle: bound to the stream, then given the (handle, stream)
        // workspace (binding a stream resets it), Note [cuBLAS handles].
        let (_, ws, ws_bytes) = self.cublas_workspace(device, handle, stream)?;
        // SAFETY: `handle` belongs to this device and to this thread; the stream is live and
        // its pointer type is cast between the driver's and cuBLAS's identical CUstream_st
        // declarations.
        check_blas("cublasSetStream", unsafe {
            cublas_sys::cublasSetStream_v2(handle, s.cast())
        })?;
        // SAFETY: `ws` is a live allocation of `ws_bytes` on this device, used by this
        // handle on this stream only.
        check_blas("cublasSetWorkspace", unsafe {
            cublas_sys::cublasSetWorkspace_v2(handle, ws.0 as *mut c_void, ws_bytes)
        })?;
        // SAFETY: alpha/beta point at locals of the compute type alive for the call; the
        // driver validates the matrices' device pointers, cuBLAS the dimensions.
        check_blas(CALL, unsafe {
            cublas_sys::cublasGemmStridedBatchedEx(
                handle,
                op(desc.trans_a),
                op(desc.trans_b),
                int(desc.m, "m")?,
                int(desc.n, "n")?,
                int(desc.k, "k")?,
                alpha_p,
                desc.a.0 as *const c_void,
                ty,
                int(desc.lda, "lda")?,
                long(desc.stride_a),
                desc.b.0 as *const c_void,
                ty,
                int(desc.ldb, "ldb")?,
                long(desc.stride_b),
                beta_p,
                desc.c.0 as *mut c_void,
                ty,
                int(desc.ldc, "ldc")?,
                long(desc.stride_c),
                int(desc.batch, "batch")?,
                compute,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }

    fn cudnn_version(&self, device: usize) -> Result<usize> {
        self.cudnn_version_impl(device)
    }

    fn conv_algorithms(
        &self,
        device: usize,
        stream: StreamHandle,
        problem: &ConvProblem,
        search: ConvSearch,
    ) -> Result<Vec<ConvAlgoPerf>> {
        self.conv_algorithms_impl(device, stream, problem, search)
    }

    fn conv(&self, device: usize, stream: StreamHandle, desc: &ConvDesc) -> Result<()> {
        self.conv_impl(device, stream, desc)
    }

    fn nccl_version(&self) -> Result<i32> {
        self.nccl_version_impl()
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
        super::cupti::version()
    }

    fn activity_enable(&self) -> Result<()> {
        super::cupti::enable()
    }

    fn activity_disable(&self) -> Result<()> {
        super::cupti::disable()
    }

    fn activity_push_correlation(&self, id: u64) -> Result<()> {
        super::cupti::push(id)
    }

    fn activity_pop_correlation(&self) -> Result<()> {
        super::cupti::pop()
    }

    fn activity_flush(&self) -> Result<Vec<crate::driver::ActivityRecord>> {
        super::cupti::take()
    }

    fn activity_timestamp_ns(&self) -> Result<u64> {
        super::cupti::timestamp_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_why_without_panicking() {
        match RealDriver::probe() {
            // A machine with a GPU: the driver works.
            Ok(driver) => assert!(driver.device_count() > 0),
            Err(reason) => assert!(
                reason.contains("no CUDA driver library")
                    || reason.contains("no CUDA device")
                    || reason.contains("driver too old"),
                "{reason}"
            ),
        }
    }
}
