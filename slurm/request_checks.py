"""Checks made before anything runs, so that a bad request fails at once and costs nothing,
and the sbatch options a request becomes."""

from __future__ import annotations

from typing import Any

import torch

from counteraudit.slurm import job_environment
from counteraudit.slurm.cluster import Partition, list_partitions
from counteraudit.slurm.errors import ExecutorConfigError, NoGpuError, UnknownPartitionError
from counteraudit.slurm.executor_config import ExecutorConfig


def check_local_gpus(config: ExecutorConfig) -> None:
    if config.gpus_per_node == 0:
        return

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available == 0:
        raise NoGpuError(
            f"--gpus-per-node {config.gpus_per_node} asks for GPUs, but this machine has no CUDA device "
            "(torch.cuda.is_available() is False). Use --gpus-per-node 0 to run on the CPU, or "
            "--executor slurm with a partition that has GPUs."
        )
    if available < config.gpus_per_node:
        raise NoGpuError(
            f"--gpus-per-node {config.gpus_per_node} asks for more GPUs than this machine has ({available}). "
            f"Use --gpus-per-node {available} or fewer, or --executor slurm."
        )


def check_local_layout(config: ExecutorConfig) -> None:
    if config.nodes > 1 or (config.tasks_per_node or 1) > 1:
        raise ExecutorConfigError(
            f"--nodes {config.nodes} --tasks-per-node {config.tasks_per_node or 1} ask for several processes "
            "per item, but the local executor runs items in this one process. Use --executor slurm, "
            "or launch the script with torchrun for several local processes."
        )


def _describe_partitions(partitions: list[Partition]) -> str:
    return ", ".join(
        f"{p.name}{' (default)' if p.is_default else ''}"
        f"{f' [{p.max_gpus_per_node} GPUs/node]' if p.max_gpus_per_node else ''}"
        for p in partitions
    )


def check_slurm_request(config: ExecutorConfig) -> list[Partition]:
    """The partitions the jobs may run in; raises if they don't exist or lack the asked GPUs.
    Also raises SlurmUnreachableError when the controller does not answer."""
    partitions = list_partitions()
    by_name = {partition.name: partition for partition in partitions}
    if config.partition is None:
        chosen = [partition for partition in partitions if partition.is_default]
        if not chosen:
            raise UnknownPartitionError(
                "no --partition given and this cluster has no default partition; "
                f"choose one of: {_describe_partitions(partitions)}"
            )
    else:
        chosen = []
        # sbatch accepts a comma-separated list: the job runs in whichever can start it first.
        for name in config.partition.split(","):
            if name.strip() not in by_name:
                raise UnknownPartitionError(
                    f"partition {name.strip()!r} does not exist on this cluster; its partitions are: "
                    f"{_describe_partitions(partitions)}. Pass one with --partition or the suite's "
                    "[slurm] partition = ..."
                )
            chosen.append(by_name[name.strip()])
    if config.gpus_per_node > 0:
        most_gpus = max(partition.max_gpus_per_node for partition in chosen)
        if most_gpus < config.gpus_per_node:
            with_gpus = [p for p in partitions if p.max_gpus_per_node >= config.gpus_per_node]
            where = ", ".join(p.name for p in chosen) + (" (the default)" if config.partition is None else "")
            seen = "; ".join(f"{p.name}: {', '.join(p.gres)}" for p in chosen)
            alternatives = (
                f"partitions with {config.gpus_per_node}+ GPUs per node: {_describe_partitions(with_gpus)}"
                if with_gpus
                else "no partition of this cluster has that many GPUs per node"
            )
            raise NoGpuError(
                f"--gpus-per-node {config.gpus_per_node} but the nodes of partition {where} have "
                f"{'no GPUs' if most_gpus == 0 else f'at most {most_gpus} GPUs'} (sinfo -o %G: {seen}); "
                f"{alternatives}. Use --gpus-per-node 0 to run on CPUs, or choose another --partition."
            )
    return chosen


def sbatch_parameters(config: ExecutorConfig, stage_name: str, dependency_ids: list[str]) -> dict[str, Any]:
    """submitit.SlurmExecutor parameters (sbatch options under submitit's names)."""
    tasks_per_node = config.effective_tasks_per_node
    parameters: dict[str, Any] = {
        "job_name": stage_name,
        "time": config.time_minutes,
        "nodes": config.nodes,
        "ntasks_per_node": tasks_per_node,
        "array_parallelism": config.array_parallelism,
        # submitit's signal (USR2) comes this long before the time limit, to checkpoint and requeue.
        "signal_delay_s": max(10, min(120, config.time_minutes * 60 // 5)),
    }
    optional = {
        "partition": config.partition,
        "cpus_per_task": config.cpus_per_task,
        "gpus_per_node": config.gpus_per_node or None,
        "account": config.account,
        "qos": config.qos,
        "constraint": config.constraint,
    }
    parameters.update({key: value for key, value in optional.items() if value is not None})
    if config.mem_gb is not None:
        mem_gb = config.mem_gb
        parameters["mem"] = f"{int(mem_gb)}GB" if float(mem_gb).is_integer() else f"{int(mem_gb * 1024)}MB"
    if config.nodes * tasks_per_node > 1:
        # One failed rank must end the job, not leave the others blocked in a collective.
        parameters["srun_args"] = ["--kill-on-bad-exit=1"]
    additional: dict[str, Any] = dict(config.slurm_extra)
    if dependency_ids:
        additional["dependency"] = "afterok:" + ":".join(dependency_ids)
        # If the earlier stage fails, cancel these jobs instead of leaving them pending forever.
        additional["kill-on-invalid-dep"] = "yes"
    if additional:
        parameters["additional_parameters"] = additional
    exports = job_environment.export_lines()
    if exports:
        parameters["setup"] = exports
    return parameters
