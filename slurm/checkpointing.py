"""Surviving Slurm time limits and preemption.

submitit sends the job a signal before Slurm kills it (time limit) or when it is preempted; if
the submitted callable has a `checkpoint` method, submitit calls it, saves the DelayedSubmission
it returns, and requeues the job, which then runs that submission. (An external
`scontrol requeue` restarts the job with its original submission instead.)

Our stage functions resume by themselves from their own artifacts (the trainer from its
per-epoch checkpoint, named in train/checkpoint.py), so both paths simply call the same function
with the same item again: nothing needs to be carried in the pickle.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import submitit


def limit_threads_to_allocation() -> None:
    """Inside a Slurm job, use as many torch threads as the task was given CPUs. torch otherwise
    takes every core of the node, and jobs sharing a node then oversubscribe it: OpenMP threads
    spinning against each other made two 1-CPU training jobs on a 2-core node 10x slower.

    This module does not import torch: a job whose callable never computes with it (a job that
    only moves files) would pay seconds of CPU for the import alone. A callable's module is
    imported when the job unpickles it, so a stage's torch is loaded by the time this runs and
    is set here; a torch loaded later starts on ``OMP_NUM_THREADS``, exported here first."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE")
    if not (cpus and cpus.isdigit() and int(cpus) > 0):
        return
    os.environ.setdefault("OMP_NUM_THREADS", cpus)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(cpus))


class ResumableCall(submitit.helpers.Checkpointable):
    """Wraps a function that resumes its own work, so that submitit requeues it when the job
    times out or is preempted (the pattern of DINO's run_with_submitit.py Trainer).

        run_items(ResumableCall(train_model), specs, config, "train")

    run_items wraps every function this way already; use it directly with submitit.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        limit_threads_to_allocation()
        return self.function(*args, **kwargs)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # The function's own files hold its progress, so the same call resumes it.
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)

    def __repr__(self) -> str:
        return f"ResumableCall({getattr(self.function, '__qualname__', self.function)!r})"


def resumable(function: Callable[..., Any]) -> Callable[..., Any]:
    """The function itself when submitit can already checkpoint it, else wrapped in ResumableCall."""
    if callable(getattr(function, "checkpoint", None)):
        return function
    return ResumableCall(function)
