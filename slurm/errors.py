"""The errors a stage run can end with; each says what was wrong and what to do.

All derive from ExecutorError, so a command-line script can print them without a traceback:

    except ExecutorError as error:
        sys.exit(f"error: {error}")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ExecutorError(RuntimeError):
    """Base of every error raised by the stage executor."""


class ExecutorConfigError(ExecutorError, ValueError):
    """A command-line option or a suite's [slurm] value is malformed."""


class SlurmUnreachableError(ExecutorError):
    """Slurm's commands are missing or its controller does not answer."""


class UnknownPartitionError(ExecutorError):
    """The requested partition does not exist on the cluster."""


class NoGpuError(ExecutorError):
    """GPUs were asked for where there are none."""


class SubmissionError(ExecutorError):
    """sbatch refused the job (bad account, qos, constraint, extra option...)."""


@dataclass(frozen=True)
class ItemFailure:
    index: int  # position in the items given to run_items
    item_name: str
    reason: str  # one line: the exception, or how Slurm ended the job
    details: str = ""  # full traceback or log tail
    log_paths: tuple[Path, ...] = ()
    job_id: str | None = None


class ItemsFailedError(ExecutorError):
    """Some items failed. The others' results are kept in `results_by_index` (and their artifacts
    are on disk), so a rerun only redoes the failed ones."""

    def __init__(
        self,
        stage_name: str,
        failures: list[ItemFailure],
        results_by_index: dict[int, Any],
        item_count: int,
    ) -> None:
        self.stage_name = stage_name
        self.failures = failures
        self.results_by_index = results_by_index
        self.item_count = item_count
        super().__init__(self._message())

    @property
    def failed_item_names(self) -> list[str]:
        return [failure.item_name for failure in self.failures]

    def _message(self) -> str:
        succeeded = len(self.results_by_index)
        lines = [
            f"stage '{self.stage_name}': {len(self.failures)} of {self.item_count} items failed "
            + f"({succeeded} succeeded; their results are kept):"
        ]
        for failure in self.failures:
            where = f"job {failure.job_id}" if failure.job_id else "local run"
            logs = f"\n      log: {failure.log_paths[-1]}" if failure.log_paths else ""
            lines.append(f"  - {failure.item_name} ({where}): {failure.reason}{logs}")
        lines.append(
            "Fix the cause and rerun the same command: finished items are skipped, only the failed ones are redone."
        )
        return "\n".join(lines)
