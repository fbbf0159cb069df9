//! Joining the ranks of a distributed `ember train` (Note [Distributed training]).

use ember_nn::Error;
use ember_parallel::{Backend, InitMethod, ProcessGroup};

/// Note [Distributed training]: `ember train` started by `ember launch --nproc-per-node N`
/// (which sets torchrun's `WORLD_SIZE`, `RANK`, `LOCAL_RANK`) or by `mpirun -n N` trains
/// one model on N processes: a process group over the `mpi` backend (CUDA tensors are
/// staged through host memory until the NCCL backend is wired), the model wrapped in
/// `DistributedDataParallel`, each rank loading its shard of each epoch through a
/// `DistributedSampler` seeded with the run's seed, and `--batch-size` kept as the global
/// batch (each rank takes `batch_size / N`, so one step sees as many samples as one
/// process's). With CUDA each rank takes `cuda:LOCAL_RANK`. Every rank validates (their
/// weights are equal); rank 0 alone writes the checkpoint, and the command line prints on
/// rank 0 only. The summary's `world_size` says how many processes trained.
pub(super) struct Distributed {
    pub(super) group: ProcessGroup,
    pub(super) rank: usize,
    pub(super) local_rank: usize,
}

impl Distributed {
    /// The process group of this run, when it was started as several processes.
    pub(super) fn from_env() -> Result<Option<Distributed>, Error> {
        let var = |k: &str| std::env::var(k).ok();
        let init = if var("WORLD_SIZE").is_some() {
            InitMethod::Env
        } else if var("OMPI_COMM_WORLD_SIZE").is_some() {
            InitMethod::Mpi
        } else {
            return Ok(None);
        };
        let group = if ember_parallel::is_initialized() {
            ember_parallel::default_group()?
        } else {
            ember_parallel::init_process_group(Backend::Mpi, init)?
        };
        if group.world_size() == 1 {
            return Ok(None);
        }
        let rank = group.rank();
        let local_rank = var("LOCAL_RANK")
            .or_else(|| var("OMPI_COMM_WORLD_LOCAL_RANK"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(rank);
        Ok(Some(Distributed {
            group,
            rank,
            local_rank,
        }))
    }
}
