//! The profiler of Ember, as `torch.profiler`: where the time and the memory of a training
//! step go, on the host and on the device.
//!
//! ```
//! use ember_profiler::{ProfileOptions, ProfilerActivity, profile, record_function};
//! let mut prof = profile(
//!     ProfileOptions::new()
//!         .activities([ProfilerActivity::Cpu, ProfilerActivity::Cuda])
//!         .record_shapes(true),
//! )?;
//! {
//!     let _step = record_function("train_step");
//!     // ... forward, backward, optimizer step ...
//! }
//! prof.stop()?;
//! println!("{}", prof.key_averages()?.table("cpu_time_total", 10)?);
//! # Ok::<(), ember_profiler::ProfilerError>(())
//! ```
//!
//! - [`profile`] / [`with_profile`] start a [`Profiler`] with [`ProfileOptions`]
//!   (`activities`, `record_shapes`, `profile_memory`, `with_stack`, `schedule`,
//!   `on_trace_ready`); [`record_function`] marks a range of the user's.
//! - [`schedule`](mod@schedule) cycles through wait, warm-up and active steps;
//!   [`Profiler::step`] moves it on.
//! - [`table`]: `key_averages()` and PyTorch's table.
//! - `export_chrome_trace` and [`tensorboard_trace_handler`] (the schema is below).
//! - [`timeline`]: the memory timeline, `export_memory_timeline` (Note [Memory categories]).
//!
//! # Where the events come from
//!
//! The profiler listens to `ember_device::trace` (Note [Zero-cost tracing] there): every
//! tensor op of `ember-tensor` opens a range named as PyTorch's op (shown as `aten::mm`),
//! the autograd engine opens `autograd::engine::evaluate_function: MmBackward0` and
//! `MmBackward0` around each node, optimizers open `Optimizer.step#Adam.step`, the
//! DataLoader `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` (and
//! `DataLoader.fetch` on its worker threads), the caching allocators emit a point per
//! allocation and free. With [`ProfilerActivity::Cuda`], every kernel launch, cuBLAS and
//! cuDNN call and copy is timed on the device, through CUPTI's activity records where the
//! driver loads CUPTI (as PyTorch's profiler; a library call shows the kernels it ran) and
//! with CUDA events otherwise or when [`ProfileOptions::device_timing`] asks for them (Note
//! [Device activity] in `ember_device::trace::device`), and linked to the op that issued
//! it; [`Profile::device_timing`] says which. On the CUDA emulator the same events are
//! produced, from its emulated CUPTI or its events, with the emulator's durations (the
//! trace says so).
//!
//! # The trace schema
//!
//! [`Profile::chrome_trace`] writes the Trace Event Format with the top-level keys PyTorch's
//! (Kineto's) traces have: `schemaVersion` (1), `deviceProperties` (one object per CUDA
//! device that ran recorded work: `id`, `name`, `totalGlobalMem`, `computeMajor`,
//! `computeMinor`, `maxThreadsPerBlock`, `maxThreadsPerMultiprocessor`,
//! `regsPerMultiprocessor`, `warpSize`, `sharedMemPerBlock`, `sharedMemPerBlockOptin`,
//! `numSms`, and `emulated`), `trace_id`, `profile_memory`, `record_shapes`, `with_stack`
//! (0 or 1), `host_name`, `displayTimeUnit` (`"ms"`), `baseTimeNanoseconds` (the wall clock
//! at the trace's start; `ts` are microseconds after it), `traceName` and `traceEvents`:
//!
//! | `ph` | `cat` | what | `pid` / `tid` | `args` |
//! | --- | --- | --- | --- | --- |
//! | `X` | `cpu_op` | a tensor op (`aten::mm`), an autograd node | process / thread | `External id`, `Record function id`, `Ev Idx`; with `record_shapes`: `Input Dims`, `Input type`; with `with_stack` (ops and annotations): `Call stack`, the user's frames joined by `;` (see [`Event::stack`]); `truncated` when the trace ended inside it |
//! | `X` | `user_annotation` | `record_function`, `ProfilerStep#N`, optimizer steps, DataLoader batches | process / thread | as above |
//! | `X` | `cuda_runtime` | `cudaLaunchKernel`, `cudaMemcpyAsync`, `cublasGemmStridedBatchedEx` | process / thread | as above, and `correlation` |
//! | `X` | `kernel`, `gpu_memcpy`, `gpu_memset` | device work | device ordinal / stream | `External id` (the op's), `device`, `stream`, `correlation`, `grid`, `block`, `bytes`; `emulated` on the emulator |
//! | `s`, `f` | `ac2g` | the flow from a runtime call to its device work | | `id` = correlation |
//! | `i` | `cpu_instant_event` | `[memory]`: an allocation (`Bytes` > 0) or free (< 0) | process / thread | `Total Reserved`, `Total Allocated`, `Bytes`, `Device Id` (-1: host), `Device Type` (0 host, 1 CUDA), `Addr` |
//! | `C` | | `Memory (cuda:0)`, `Memory (cpu)`: allocated and reserved bytes over time | process / 0 | `Allocated`, `Reserved` |
//! | `M` | | `process_name`, `thread_name` | | `name` |

mod chrome;
mod collector;
mod device_records;
mod device_times;
mod error;
mod event;
mod profiler;
pub mod schedule;
mod stack;
pub mod table;
pub mod timeline;

pub use chrome::{tensorboard_trace_handler, write_tensorboard_trace};
pub use error::{ProfilerError, Result};
pub use event::{Event, EventType, MemoryRecord, Profile, Track};
pub use profiler::{
    DeviceTiming, ProfileOptions, Profiler, ProfilerActivity, TraceHandler, profile,
    record_function, with_profile,
};
pub use schedule::{ProfilerAction, Schedule, schedule};
pub use stack::call_sites_resolvable;
pub use table::{FunctionEventAvg, KeyAverages};
pub use timeline::{DeviceTimeline, MemoryCategory};
