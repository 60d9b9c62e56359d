"""The errors a stage run can end with; each says what was wrong and what to do.

All derive from ExecutorError, so a command-line script can print them without a traceback:

    except ExecutorError as error:
        sys.exit(f"error: {error}")
"""

from __future__ import annotations

import errno
import shutil
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


# A write that fails for lack of space: the disk is full, or the user's quota is used up.
OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def out_of_space(error: BaseException | None) -> OSError | None:
    """The OSError "no space left on device" or "disk quota exceeded" behind ``error`` (itself, or
    one it was raised from or while handling), else None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in OUT_OF_SPACE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def size_text(size: float) -> str:
    """Bytes for people: 1.2 GB, 350 MB, 12 kB (powers of 1000, as df -H and file managers)."""
    units = ("B", "kB", "MB", "GB", "TB")
    power = 0
    while abs(size) >= 1000 and power < len(units) - 1:
        size, power = size / 1000, power + 1
    return f"{size:.0f} B" if power == 0 else f"{size:.1f} {units[power]}"


def disk_usage_near(path: Path):
    """``shutil.disk_usage`` (total, used, free) of the file system holding ``path`` (its nearest
    existing folder); None where no folder of it exists."""
    for folder in (path, *path.parents):
        if folder.is_dir():
            return shutil.disk_usage(folder)
    return None


class OutOfSpaceError(ItemsFailedError):
    """A write found no space left (full disk or used-up quota), so the stage stopped scheduling
    items: every further item would compute its work only to fail at the same write. What was
    finished is stored; a rerun after freeing space does only the rest."""

    def __init__(self, *failed: Any, cause: OSError, needed_bytes: int | None) -> None:
        """``failed``: ItemsFailedError's arguments; ``cause``: the write that found no space;
        ``needed_bytes``: about what the unfinished items need (None: no estimate)."""
        self.cause = cause
        self.path = Path(cause.filename) if cause.filename else None
        usage = disk_usage_near(self.path) if self.path else None
        self.free_bytes = usage.free if usage else None
        self.needed_bytes = needed_bytes
        super().__init__(*failed)

    @property
    def unfinished_count(self) -> int:
        return self.item_count - len(self.results_by_index)

    def _message(self) -> str:
        what = (self.cause.strerror or "no space left").lower()
        where = f" writing {self.path}" if self.path else ""
        lines = [f"stage '{self.stage_name}' stopped: {what}{where}."]
        free = (f"{size_text(self.free_bytes)} free in {self.path.parent}; " if self.free_bytes is not None
                else "")
        need = (f"need about {size_text(self.needed_bytes)}" if self.needed_bytes is not None
                else "need more (no estimate)")
        lines.append(f"{free}the {self.unfinished_count} unfinished item(s) {need}.")
        lines.append(
            f"Free {'that much' if self.needed_bytes is not None else 'some'} space (or use a --runs-dir "
            f"on a larger disk) and rerun the same command: the {len(self.results_by_index)} finished "
            "item(s) are stored and are not computed again."
        )
        return "\n".join(lines)
