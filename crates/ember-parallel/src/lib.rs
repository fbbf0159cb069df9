//! Data parallelism, as `torch.nn.parallel` and `torch.distributed`: `DataParallel` over
//! the devices of one process, process groups whose collectives run on NCCL (CUDA tensors)
//! and Open MPI (CPU tensors; the `mpi` feature), `DistributedDataParallel`,
//! `DistributedSampler`, and the rendezvous behind `ember launch`.
//!
//! Collectives run on existing engines, never on a network layer of Ember's own; the only
//! socket code is the small key-value rendezvous that hands NCCL its unique id.
//!
//! Modules:
//! - `comm`: moving tensors between the devices of one process (`torch.nn.parallel.comm`)
//!   and the autograd functions built on it (Note [Collectives or copies]).
//! - `data_parallel`: [`DataParallel`] (Note [Replicas]).

pub mod comm;
mod data_parallel;

pub use data_parallel::{DataParallel, ReplicaFactory};
