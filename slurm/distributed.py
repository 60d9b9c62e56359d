"""torch.distributed set-up for multi-GPU / multi-node training, under Slurm, torchrun, or neither.

The trainer calls:

    context = init_distributed()          # once per process, before building the model
    model.to(context.device)
    if context.is_distributed: model = DistributedDataParallel(model, ...)
    ...
    cleanup_distributed()

Inside a submitit Slurm job with several tasks (--nodes / --tasks-per-node), each task is one
process; submitit's TorchDistributedEnvironment reads Slurm's variables (SLURM_PROCID, the node
list, ...) and exports what torch's env:// rendezvous needs: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR (first node) and MASTER_PORT (derived from the job id, so every
task picks the same one and concurrent jobs pick different ones).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import submitit
import torch
import torch.distributed as dist

_TORCH_RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str | None  # None when this is the only process and no process group exists
    device: torch.device

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        """Rank 0 writes checkpoints, metrics and logs; the others only compute."""
        return self.rank == 0


def _inside_submitit_slurm_job() -> bool:
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_JOB_ID" in os.environ


def _export_slurm_rendezvous_variables() -> None:
    # CUDA_VISIBLE_DEVICES is left as Slurm set it (all GPUs of the job on this node); each
    # process selects its own with torch.cuda.set_device(local_rank) below.
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def _device_for(local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _context_from_process_group() -> DistributedContext:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return DistributedContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        backend=str(dist.get_backend()),
        device=_device_for(local_rank),
    )


def init_distributed(backend: str | None = None, timeout_minutes: float = 30) -> DistributedContext:
    """Joins this process to its job's process group, or describes a single process.

    Where the ranks come from, first match:
      1. RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT already set (torchrun),
      2. a submitit job on Slurm with more than one task (exported from Slurm's variables),
      3. otherwise a single process: no process group is created, world_size is 1.
    backend: None picks nccl when CUDA is available, else gloo (CPU).
    """
    if dist.is_available() and dist.is_initialized():
        return _context_from_process_group()

    has_rendezvous = all(name in os.environ for name in _TORCH_RENDEZVOUS_VARIABLES)
    if not has_rendezvous and _inside_submitit_slurm_job() and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        _export_slurm_rendezvous_variables()
        has_rendezvous = True

    world_size = int(os.environ.get("WORLD_SIZE", "1")) if has_rendezvous else 1
    if world_size <= 1:
        return DistributedContext(rank=0, world_size=1, local_rank=0, backend=None, device=_device_for(0))

    if not dist.is_available():
        raise RuntimeError(
            f"WORLD_SIZE={world_size} asks for distributed training but this torch build has no "
            "torch.distributed; install a standard torch build or run with one task."
        )
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    chosen_backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if chosen_backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError(
            "backend 'nccl' needs CUDA GPUs but torch.cuda.is_available() is False on "
            f"{os.uname().nodename}; use backend='gloo' (CPU) or ask for GPUs (--gpus-per-node)."
        )
    device = _device_for(local_rank)  # before init: nccl binds each rank to its current device
    dist.init_process_group(
        backend=chosen_backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(minutes=timeout_minutes),
    )
    return DistributedContext(
        rank=rank, world_size=world_size, local_rank=local_rank, backend=chosen_backend, device=device
    )


def cleanup_distributed() -> None:
    """Leaves the process group, if this process joined one (safe to call in any case)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
