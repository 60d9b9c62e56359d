"""Job states as the Slurm controller sees them, read with `squeue`.

submitit watches jobs with `sacct`, which needs Slurm's accounting database; many small clusters
(and the local test cluster) have none, and then a job that died without writing its result would
be waited for forever. `squeue --states=all` works everywhere and still lists finished jobs for
MinJobAge (300 s by default), long enough to see how they ended.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

# States after which a job will not run again by itself (REQUEUED/PENDING/... are not final).
FINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",  # only final when not requeued; a requeued job shows PENDING/REQUEUED
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
_SQUEUE_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class JobState:
    state: str  # RUNNING, PENDING, COMPLETED, FAILED, ...
    reason: str  # why pending or how it ended, e.g. "Resources", "NonZeroExitCode"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_JOB_STATES


def job_states(job_ids: Iterable[str]) -> dict[str, JobState] | None:
    """State of each job and job-array task ('123', '123_4') of the given jobs or arrays.

    Jobs the controller has forgotten are absent. None when squeue itself failed (controller
    unreachable), so that callers keep waiting rather than declare running jobs lost.
    """
    base_ids = sorted({str(job_id).split("_", 1)[0] for job_id in job_ids})
    if not base_ids:
        return {}
    command = ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T|%r", "--jobs", ",".join(base_ids)]
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=_SQUEUE_TIMEOUT_SECONDS, check=False
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    if completed.returncode != 0:
        # Asking only for forgotten jobs is an error, but it means "none of them is known".
        if "Invalid job id" in completed.stderr:
            return {}
        return None
    states = {}
    for line in completed.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            job_id, state, reason = parts
            # squeue may append a flag, e.g. "CANCELLED by 0" or "REQUEUE_HOLD".
            states[job_id] = JobState(state=state.split()[0], reason=reason)
    return states
