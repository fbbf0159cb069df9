//! Data parallelism, as `torch.nn.parallel` and `torch.distributed`: `DataParallel` over
//! the devices of one process, process groups whose collectives run on NCCL (CUDA tensors)
//! and Open MPI (CPU tensors; the `mpi` feature), `DistributedDataParallel`,
//! `DistributedSampler`, and the rendezvous behind `ember launch`.
//!
//! Collectives run on existing engines, never on a network layer of Ember's own; the only
//! socket code is the small key-value rendezvous that hands NCCL its unique id.

pub mod sampler;

pub use sampler::DistributedSampler;
