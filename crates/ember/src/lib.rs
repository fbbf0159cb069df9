//! Ember: a deep-learning framework in Rust with PyTorch's GPU workflow.
//!
//! This umbrella crate re-exports the layered crates so users write `ember::Device`,
//! `ember::cuda::is_available()`, `ember::memory::memory_allocated(..)`:
//!
//! ```
//! use ember::{cuda, memory, Device};
//! let device = Device::cuda_if_available();
//! println!("CUDA available: {}, using {device}", cuda::is_available());
//! println!("{} bytes allocated on cpu", memory::memory_allocated(Device::Cpu)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Tensor`] — PyTorch's `torch.Tensor`: the eager tensor of `ember-tensor` with
//!   autograd (`ember-autograd`); [`DType`] and the rest of [`tensor`] (the tensor core
//!   without a tape), [`autograd`] (`backward`, `grad`, hooks, `checkpoint`, `gradcheck`),
//!   [`no_grad`] and the other grad modes:
//!
//! ```
//! use ember::{DType, Device, Tensor};
//! let x = Tensor::ones([2, 3], (&Device::Cpu, DType::F32))?.requires_grad_(true)?;
//! let y = x.matmul(&x.t()?)?;
//! assert_eq!(y.to_vec::<f32>()?, vec![3.0, 3.0, 3.0, 3.0]);
//! y.sum(())?.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![4.0; 6]);
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! - [`Device`], [`try_gpu`], [`try_all_gpus`] — from `ember-device`.
//! - [`cuda`] — `torch.cuda`'s discovery calls, streams and events; [`driver`] the seam.
//! - [`memory`] — the caching allocator and its statistics (`ember-memory`).
//! - [`backends`] — `torch.backends.cudnn`: `allow_tf32`, `benchmark`, `deterministic`,
//!   `enabled` for convolutions on CUDA (`ember::backends::cudnn::set_benchmark(true)`).
//! - [`trace`] — scoped ranges the profiler subscribes to.
//! - [`nn`] — `torch.nn`: [`Module`](nn::Module), layers, losses, init; [`optim`] —
//!   optimizers, learning-rate schedulers, gradient clipping; [`data`] — `Dataset`,
//!   `DataLoader`, the shipped digits (all `ember-nn`).
//! - [`amp`] — automatic mixed precision (`ember-amp`): `autocast` regions and the
//!   policy table.
//! - [`parallel`] — data parallelism (`ember-parallel`): `DataParallel`, process groups
//!   (`init_process_group`, collectives), `DistributedDataParallel`, `DistributedSampler`,
//!   the launcher behind `ember launch`.
//! - [`profiler`] — the profiler (`ember-profiler`): `profile`, `record_function`,
//!   schedules, `key_averages` tables, Chrome/TensorBoard traces, memory timelines.
//!
//! - [`prelude`] — what a training loop uses, in one `use ember::prelude::*`.
//! - [`save`] and [`load`] — one checkpoint of everything (`torch.save` of a dict): a
//!   [`StateDict`] nesting the model's, the optimizer's, the scaler's and a scheduler's
//!   states with plain values (epoch, step, config), as safetensors with a checksum;
//!   [`io`] for the rest; [`half`] — `f16` and `bf16`.
//! - [`manual_seed`] — seeds everything a run draws from: every device's default
//!   generator, and so initialisation, dropout, `random_split` and the `DataLoader`'s
//!   shuffle (`torch.manual_seed`).
//!
//! ```
//! use ember::prelude::*;
//! manual_seed(0);
//! let model = Sequential::new().add(Linear::new(4, 2, ())?);
//! let mut opt = Adam::new(model.parameters(), AdamOptions::default())?;
//! let mut scaler = GradScaler::new(Device::Cpu)?;
//! let path = std::env::temp_dir().join(format!("ember-lib-doc-{}.safetensors", std::process::id()));
//! // torch.save({"model": ..., "optimizer": ..., "scaler": ..., "epoch": 3}, path)
//! let state = StateDict::new()
//!     .with("model", model.state_dict()?)
//!     .with("optimizer", opt.state_dict()?)
//!     .with("scaler", scaler.state_dict()?)
//!     .with("epoch", 3);
//! ember::save(&state, &path)?;
//! // ckpt = torch.load(path); model.load_state_dict(ckpt["model"]); ...
//! let ckpt = ember::load(&path, Device::Cpu)?;
//! model.load_state_dict(&ckpt.sub("model"))?;
//! opt.load_state_dict(&ckpt.sub("optimizer"))?;
//! scaler.load_state_dict(&ckpt.sub("scaler"))?;
//! assert_eq!(ckpt.item::<usize>("epoch")?, 3);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! [`Error`] is the one error of all of these: every call returns [`Result`], and
//! [`Error::kind`] says what went wrong ([`ErrorKind::OutOfMemory`], `DeviceMismatch`,
//! `Shape`, `DType`, ...) whichever crate it came from:
//!
//! ```
//! use ember::prelude::*;
//! let a = Tensor::zeros([2, 3], ())?;
//! match a.matmul(&a) {
//!     Err(e) if e.kind() == ErrorKind::Shape => println!("{e}"), // cannot multiply [2, 3] by [2, 3]
//!     Err(e) if e.is_out_of_memory() => println!("out of memory: {e}"),
//!     other => { other?; }
//! }
//! # Ok::<(), ember::Error>(())
//! ```

/// README.md's Rust code, compiled as a doctest so that the README keeps up with the API
/// (`crates/ember/tests/readme.rs` runs the same training loop).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

pub use ember_autograd::{
    AutogradError, Error, ErrorKind, Result, Tensor, enable_grad, inference_mode, no_grad,
    set_grad_enabled, r#where,
};
pub use ember_device::{Device, DeviceError, cuda, driver, trace, try_all_gpus, try_gpu};
pub use ember_nn::io::{load, save};
pub use ember_nn::{FromValue, StateDict, Value, data, io, optim};
pub use ember_tensor::random::manual_seed;
pub use ember_tensor::{Approximate, DType, Options, Reduction, Scalar, backends};
/// `f16` and `bf16` (the `half` crate Ember uses), for reading 16-bit tensors:
/// `x.to_vec::<ember::half::bf16>()`.
pub use half;

/// What a training loop uses, in one `use ember::prelude::*;`: tensors and devices, the
/// common layers and losses, the optimizers and schedulers, the data pipeline, mixed
/// precision, state dicts and their values, `manual_seed`, the grad modes, and the modules
/// `nn`, `F` (`nn.functional`), `optim`, `data`, `amp`, `cuda`, `memory`, `profiler`.
///
/// ```
/// use ember::prelude::*;
/// manual_seed(0);
/// let model = Sequential::new().add(Linear::new(4, 2, ())?);
/// let x = Tensor::randn([3, 4], ())?;
/// let loss = F::cross_entropy(&model.forward(&x)?, &Tensor::from_vec(vec![0i64, 1, 1], [3], ())?, ())?;
/// loss.backward()?;
/// # Ok::<(), ember::Error>(())
/// ```
pub mod prelude {
    pub use crate::amp::{self, GradScaler, autocast};
    pub use crate::data::{self, DataLoader, Dataset, TensorDataset, random_split};
    pub use crate::nn::{
        self, AvgPool2d, BCEWithLogitsLoss, BatchNorm1d, BatchNorm2d, BatchNorm3d, Conv2d,
        CrossEntropyLoss, Dropout, Embedding, Flatten, GELU, LayerNorm, Linear, Loss, MSELoss,
        MaxPool2d, Module, ReLU, Replicate, Sequential, SiLU, Sigmoid, Tanh, functional as F,
    };
    pub use crate::optim::{
        self, Adam, AdamOptions, AdamW, AdamWOptions, LrScheduler, Optimizer, SGD, SgdOptions,
        clip_grad_norm_,
    };
    pub use crate::{
        DType, Device, Error, ErrorKind, Result, Scalar, StateDict, Tensor, Value, cuda,
        enable_grad, inference_mode, manual_seed, memory, no_grad, profiler,
    };
}

/// The tensor core without a tape (`ember-tensor`): dtypes, shapes, the eager
/// `tensor::Tensor` and its ops, random numbers, safetensors, op options.
pub mod tensor {
    pub use ember_tensor::*;
}

/// Autograd (`ember-autograd`): `backward`/`grad` over several tensors, grad modes, hooks,
/// `checkpoint`, `gradcheck`, the autocast hook. [`Tensor`](crate::Tensor) is its tensor.
///
/// ```
/// use ember::autograd::Tensor;
/// use ember::Device;
/// let x = Tensor::from_vec(vec![1f32, 2.], [2], &Device::Cpu)?.requires_grad_(true)?;
/// x.mul(&x)?.sum(())?.backward()?;
/// assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![2., 4.]);
/// # Ok::<(), ember::Error>(())
/// ```
pub mod autograd {
    pub use ember_autograd::*;
}

/// Automatic mixed precision (`ember-amp`, `torch.amp`): autocast regions and the policy
/// table.
///
/// ```
/// use ember::amp::autocast;
/// use ember::{DType, Device, Tensor};
/// let a = Tensor::ones([2, 2], ())?;
/// let _g = autocast(Device::Cpu, DType::Bf16)?;
/// assert_eq!(a.matmul(&a)?.dtype(), DType::Bf16);
/// # Ok::<(), ember::Error>(())
/// ```
pub mod amp {
    pub use ember_amp::*;
}

/// The profiler (`ember-profiler`, `torch.profiler`): `profile`, `record_function`,
/// schedules, `key_averages` tables, Chrome/TensorBoard traces, memory timelines.
///
/// ```
/// use ember::profiler::{ProfileOptions, ProfilerActivity, profile, record_function};
/// use ember::Tensor;
/// let mut prof = profile(ProfileOptions::new().activities([ProfilerActivity::Cpu]).record_shapes(true))?;
/// {
///     let _r = record_function("matmul");
///     let a = Tensor::ones([4, 4], ())?;
///     a.matmul(&a)?;
/// }
/// prof.stop()?;
/// let averages = prof.key_averages()?;
/// assert_eq!(averages.get("matmul").map(|r| r.count), Some(1));
/// assert!(averages.get("aten::matmul").is_some());
/// # Ok::<(), ember::Error>(())
/// ```
pub mod profiler {
    pub use ember_profiler::*;
}

/// Data parallelism (`ember-parallel`, `torch.nn.parallel` and `torch.distributed`):
/// `DataParallel` over the devices of one process, process groups over MPI (the `mpi`
/// feature) with their collectives, `DistributedDataParallel`, `DistributedSampler`.
///
/// ```
/// use std::sync::Arc;
/// use ember::data::{DataLoader, TensorDataset};
/// use ember::parallel::DistributedSampler;
/// use ember::Tensor;
/// let x = Tensor::ones([10, 2], ())?;
/// let dataset = Arc::new(TensorDataset::new(vec![x])?);
/// // Rank 1 of 2: half of each epoch's shuffled order.
/// let sampler = Arc::new(DistributedSampler::with_replicas(dataset.as_ref(), 2, 1)?);
/// let loader = DataLoader::new(dataset).sampler(sampler.clone()).batch_size(5);
/// sampler.set_epoch(0);
/// assert_eq!(loader.len(), 1);
/// # Ok::<(), ember::Error>(())
/// ```
pub mod parallel {
    pub use ember_parallel::*;
}

/// The caching allocator and memory statistics, for every device (the CPU included).
pub mod memory {
    pub use ember_memory::*;
}

/// `torch.nn`: the [`Module`](nn::Module) trait, layers, losses and initialisers
/// (`ember-nn`).
///
/// ```
/// use ember::nn::{Module, Linear, ReLU, Sequential, CrossEntropyLoss, Loss};
/// use ember::{Device, Tensor};
/// let device = Device::cuda_if_available();
/// let model = Sequential::new().add(Linear::new(4, 8, ())?).add(ReLU::new()).add(Linear::new(8, 3, ())?);
/// model.to(&device)?;
/// let x = Tensor::randn([2, 4], device)?;
/// let target = Tensor::from_vec(vec![0i64, 2], [2], &device)?;
/// let loss = CrossEntropyLoss::new().forward(&model.forward(&x)?, &target)?;
/// loss.backward()?;
/// assert!(model.parameters()[0].grad().is_some());
/// # Ok::<(), ember::Error>(())
/// ```
pub mod nn {
    pub use ember_nn::layers::*;
    pub use ember_nn::loss::*;
    pub use ember_nn::{
        __derive, ChildModules, ClonePlainField, ForwardHook, ForwardPreHook, HookHandle,
        IncompatibleKeys, Module, ModuleHooks, ModuleParts, ModuleTarget, NnError, ReplicaMemo,
        Replicate, StateDict, StateItem, TensorField, TrainingFlag, Value, checkpoint, parameter,
    };
    pub use ember_nn::{functional, init};
}
