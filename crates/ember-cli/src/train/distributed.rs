//! Joining the ranks of a distributed `ember train` (Note [Distributed training]).

use ember_device::{Device, cuda};
use ember_nn::Error;
use ember_parallel::{Backend, InitMethod, ProcessGroup};

/// Note [Distributed training]: `ember train` started by `ember launch --nproc-per-node N`
/// (which sets torchrun's `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR`,
/// `MASTER_PORT`) or by `mpirun -n N` trains one model on N processes: a process group, the
/// model wrapped in `DistributedDataParallel`, each rank loading its shard of each epoch
/// through a `DistributedSampler` seeded with the run's seed, and `--batch-size` kept as the
/// global batch (each rank takes `batch_size / N`, so one step sees as many samples as one
/// process's). With CUDA each rank takes `cuda:LOCAL_RANK` and the group runs on the `nccl`
/// backend, the ranks meeting at `MASTER_ADDR:MASTER_PORT` (the emulator's NCCL joins ranks
/// of separate processes too); where NCCL cannot serve it (no NCCL library, or ranks
/// started by `mpirun` without torchrun's variables) the `mpi` backend stages the CUDA
/// tensors through host memory, and `device_reason` says why. Under `ember launch
/// --max-restarts`, `--save P --resume P` continues a restarted job from its last epoch. On the CPU the group is
/// `mpi`. Every rank validates (their weights are equal); rank 0 alone writes the
/// checkpoint, and the command line prints on rank 0 only. The summary's `world_size` says
/// how many processes trained, and `device_reason` which backend joined them.
pub(super) struct Distributed {
    pub(super) group: ProcessGroup,
    pub(super) rank: usize,
}

/// The backend for a run on `device` started with `init`, and why not `nccl` when it is
/// `mpi` on a CUDA device.
fn backend_for(device: Device, init: InitMethod) -> (Backend, Option<String>) {
    if !device.is_cuda() {
        return (Backend::Mpi, None);
    }
    let why = if init != InitMethod::Env {
        "the ranks were started by mpirun without RANK/WORLD_SIZE/MASTER_ADDR (start them with `ember launch`)".to_string()
    } else {
        match cuda::driver().and_then(|d| d.nccl_version()) {
            Ok(_) => return (Backend::Nccl, None),
            Err(e) => format!("NCCL is not available ({e})"),
        }
    };
    (
        Backend::Mpi,
        Some(format!(
            "{why}: the mpi backend stages CUDA tensors through host memory"
        )),
    )
}

impl Distributed {
    /// The process group of this run, when it was started as several processes, with the
    /// device this rank trains on and the reason extended by the rank's device and backend.
    pub(super) fn from_env(
        device: Device,
        reason: String,
    ) -> Result<(Option<Distributed>, Device, String), Error> {
        let var = |k: &str| std::env::var(k).ok();
        let init = if var("WORLD_SIZE").is_some() {
            InitMethod::Env
        } else if var("OMPI_COMM_WORLD_SIZE").is_some() {
            InitMethod::Mpi
        } else {
            return Ok((None, device, reason));
        };
        let local_rank = var("LOCAL_RANK")
            .or_else(|| var("OMPI_COMM_WORLD_LOCAL_RANK"))
            .and_then(|v| v.parse().ok());
        let (device, mut reason) = match (device, local_rank) {
            (Device::Cuda(_), Some(l)) => (
                Device::Cuda(l),
                format!("{reason}; this rank takes cuda:LOCAL_RANK"),
            ),
            _ => (device, reason),
        };
        let group = if ember_parallel::is_initialized() {
            ember_parallel::default_group()?
        } else {
            let (backend, why) = backend_for(device, init);
            if let Some(why) = why {
                eprintln!("ember train: {why}");
                reason = format!("{reason}; {why}");
            }
            let mut opts = ember_parallel::InitOptions::new(backend, init);
            if let Device::Cuda(d) = device {
                opts = opts.with_device(d);
            }
            ember_parallel::init_process_group_with(opts)?
        };
        reason = format!(
            "{reason}; process group over {} (world size {})",
            group.backend(),
            group.world_size()
        );
        if group.world_size() == 1 {
            return Ok((None, device, reason));
        }
        let rank = group.rank();
        Ok((Some(Distributed { group, rank }), device, reason))
    }
}
