//! Data parallelism, as `torch.nn.parallel` and `torch.distributed`: `DataParallel` over
//! the devices of one process, process groups whose collectives run on NCCL (CUDA tensors)
//! and Open MPI (CPU tensors; the `mpi` feature), `DistributedDataParallel`,
//! `DistributedSampler`, and the rendezvous behind `ember launch`.
//!
//! Collectives run on existing engines, never on a network layer of Ember's own; the only
//! socket code is the small key-value rendezvous that hands NCCL its unique id.
//!
//! Modules:
//! - [`comm`]: moving tensors between the devices of one process (`torch.nn.parallel.comm`)
//!   and the autograd functions built on it (Note [Collectives or copies]);
//! - `data_parallel`: [`DataParallel`] (Note [Replicas]);
//! - [`ddp`]: [`DistributedDataParallel`] (Note [DDP buckets]);
//! - [`group`]: process groups (`init_process_group`, `ProcessGroup` and its collectives,
//!   `Work`), over the `nccl` backend (CUDA tensors, on a communication stream) and the
//!   `mpi` backend (the `mpi` feature);
//! - [`store`]: the TCP key-value rendezvous on `MASTER_ADDR:MASTER_PORT` (torchrun's
//!   `TCPStore`);
//! - [`launch`]: `ember launch`, the torchrun-style launcher;
//! - [`sampler`]: [`DistributedSampler`], each rank's shard of a dataset;
//! - [`testing`]: runs a test as N MPI ranks under `cargo test`.

pub mod comm;
mod data_parallel;
pub mod ddp;
pub mod error;
pub mod group;
pub mod launch;
mod rendezvous;
pub mod sampler;
pub mod store;
mod tagged;
pub mod testing;

pub use data_parallel::DataParallel;
pub use ddp::{DdpError, DdpOptions, DistributedDataParallel, NoSyncGuard};
pub use error::DistError;
pub use group::{
    Backend, InitMethod, InitOptions, ProcessGroup, ReduceOp, Work, default_group,
    destroy_process_group, get_rank, get_world_size, init_process_group, init_process_group_with,
    is_initialized,
};
pub use sampler::DistributedSampler;
