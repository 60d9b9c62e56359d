"""A stage's items once started: run already (local executor, dry run) or queued on Slurm.

results() returns every item's result in item order, or raises ItemsFailedError naming the
failed items and keeping the others' results.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import pickle_load

from counteraudit.slurm.errors import ItemFailure, ItemsFailedError
from counteraudit.slurm.slurm_queue import job_states

# A job that has left the queue may still be writing its result on a networked file system.
_RESULT_GRACE_SECONDS = 15
_LOG_TAIL_LINES = 30


def default_item_name(item: Any) -> str:
    """An item's `name` attribute (model specs have one), else its text, shortened."""
    name = getattr(item, "name", None)
    if isinstance(name, str) and name:
        return name
    text = str(item)
    return text if len(text) <= 80 else text[:77] + "..."


def say(stage_name: str, message: str) -> None:
    """Progress goes to stderr: stdout stays for what a script prints on purpose (dry-run plans)."""
    print(f"[{stage_name}] {message}", file=sys.stderr, flush=True)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


def _tail(path: Path, line_count: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-line_count:])
    except OSError:
        return ""


class StageRun:
    """A stage's items, running or finished. results() waits and returns them in item order."""

    stage_name: str
    item_names: list[str]

    def results(self) -> list[Any]:
        raise NotImplementedError

    @property
    def job_ids(self) -> list[str]:
        """Slurm job ids, one per item (empty when run locally)."""
        return []

    @property
    def pending_dependency_ids(self) -> list[str]:
        """Job ids a later stage must wait for (none once this stage is known finished)."""
        return []


class FinishedStageRun(StageRun):
    """Items already run in this process (local executor), or a dry run (no results)."""

    def __init__(
        self,
        stage_name: str,
        item_names: list[str],
        results_by_index: dict[int, Any],
        failures: list[ItemFailure],
        first_exception: BaseException | None = None,
        stopped: ItemsFailedError | None = None,
    ) -> None:
        self.stage_name = stage_name
        self.item_names = item_names
        self._results_by_index = results_by_index
        self._failures = failures
        self._first_exception = first_exception
        self._stopped = stopped  # why the run stopped before every item was attempted

    def results(self) -> list[Any]:
        if self._stopped is not None:
            raise self._stopped from self._first_exception
        if self._failures:
            raise ItemsFailedError(
                self.stage_name, self._failures, dict(self._results_by_index), len(self.item_names)
            ) from self._first_exception
        return [self._results_by_index[index] for index in sorted(self._results_by_index)]


class SlurmStageRun(StageRun):
    """A submitted job array; results() waits for it."""

    def __init__(
        self,
        stage_name: str,
        item_names: list[str],
        jobs: list[submitit.Job],
        log_folder: Path,
        poll_seconds: float = 1.0,
        max_poll_seconds: float = 10.0,
    ) -> None:
        self.stage_name = stage_name
        self.item_names = item_names
        self.jobs = jobs
        self.log_folder = log_folder
        self._poll_seconds = poll_seconds
        self._max_poll_seconds = max_poll_seconds
        self._finished: FinishedStageRun | None = None

    @property
    def job_ids(self) -> list[str]:
        return [job.job_id for job in self.jobs]

    @property
    def pending_dependency_ids(self) -> list[str]:
        if self._finished is not None:
            return []
        return sorted({job_id.split("_", 1)[0] for job_id in self.job_ids})

    def cancel(self) -> None:
        for array_id in sorted({job_id.split("_", 1)[0] for job_id in self.job_ids}):
            submitit.SlurmJob(folder=self.log_folder, job_id=array_id).cancel(check=False)

    def _outcome_from_result_files(self, index: int) -> tuple[str, Any] | None:
        """('success', result) / ('error', traceback) once every task wrote its result, else None.
        Result files are written by submitit through a temp file and a rename, so a file that
        exists is complete."""
        job = self.jobs[index]
        task_jobs = [job.task(task) for task in range(job.num_tasks)]
        if not all(task_job.paths.result_pickle.exists() for task_job in task_jobs):
            return None
        outcomes = [pickle_load(task_job.paths.result_pickle) for task_job in task_jobs]
        for task, (status, value) in enumerate(outcomes):
            if status != "success":
                prefix = f"task {task}: " if len(outcomes) > 1 else ""
                return "error", prefix + str(value)
        return outcomes[0]  # with several tasks (DDP), rank 0's result stands for the item

    def _failure(self, index: int, reason: str, details: str) -> ItemFailure:
        paths = self.jobs[index].task(0).paths
        return ItemFailure(
            index=index,
            item_name=self.item_names[index],
            reason=reason,
            details=details,
            log_paths=tuple(path for path in (paths.stdout, paths.stderr) if path.exists()),
            job_id=self.jobs[index].job_id,
        )

    def results(self) -> list[Any]:
        if self._finished is None:
            try:
                self._finished = self._wait()
            except KeyboardInterrupt:
                array_ids = " ".join(sorted({job_id.split("_", 1)[0] for job_id in self.job_ids}))
                say(
                    self.stage_name,
                    f"stopped waiting; the jobs keep running on Slurm (squeue -j {array_ids}). "
                    f"Cancel them with: scancel {array_ids}. Rerunning later picks up their artifacts.",
                )
                raise
        return self._finished.results()

    def _wait(self) -> FinishedStageRun:
        waiting = set(range(len(self.jobs)))
        results_by_index: dict[int, Any] = {}
        failures: dict[int, ItemFailure] = {}
        final_since: dict[int, float] = {}  # when Slurm first reported the item's job as over
        # A finished job is seen by its result file, which costs a stat, every poll_seconds; the
        # controller is asked (squeue) less and less often, up to every max_poll_seconds.
        query_seconds = self._poll_seconds
        next_query = time.monotonic()
        last_report = ""
        controller_silent_since: float | None = None
        while waiting:
            try:  # touching the folder makes NFS clients refresh its listing (submitit does the same)
                self.log_folder.chmod(self.log_folder.stat().st_mode)
            except OSError:
                pass
            for index in sorted(waiting):
                outcome = self._outcome_from_result_files(index)
                if outcome is None:
                    continue
                waiting.discard(index)
                status, value = outcome
                if status == "success":
                    results_by_index[index] = value
                else:
                    failures[index] = self._failure(index, _last_line(value), value)
                    say(self.stage_name, f"item {self.item_names[index]} failed: {_last_line(value)}")
            if not waiting:
                break
            if time.monotonic() < next_query:
                time.sleep(self._poll_seconds)
                continue

            states = job_states(self.jobs[index].job_id for index in waiting)
            now = time.monotonic()
            next_query = now + query_seconds
            query_seconds = min(query_seconds * 1.5, self._max_poll_seconds)
            if states is None:
                controller_silent_since = controller_silent_since or now
                if now - controller_silent_since > 60:
                    say(self.stage_name, "the Slurm controller does not answer squeue; still waiting")
                    controller_silent_since = now
            else:
                controller_silent_since = None
                for index in sorted(waiting):
                    job_id = self.jobs[index].job_id
                    state = states.get(job_id)
                    if state is not None and not state.is_final:
                        final_since.pop(index, None)
                        continue
                    # A job that ran may still be writing its result; one that never started won't.
                    started = self.jobs[index].task(0).paths.stdout.exists()
                    if started and now - final_since.setdefault(index, now) < _RESULT_GRACE_SECONDS:
                        continue
                    waiting.discard(index)
                    how = (
                        f"ended as {state.state} (reason: {state.reason})"
                        if state is not None
                        else "is no longer known to Slurm"
                    )
                    stderr_tail = _tail(self.jobs[index].task(0).paths.stderr)
                    reason = f"Slurm job {job_id} {how} without writing a result"
                    if stderr_tail:
                        reason += f"; last log line: {_last_line(stderr_tail)}"
                    failures[index] = self._failure(index, reason, stderr_tail)
                    say(self.stage_name, f"item {self.item_names[index]}: {reason}")
                # a job over without a result is failed when its grace ends, not at a later query
                graces = [final_since[index] + _RESULT_GRACE_SECONDS for index in waiting if index in final_since]
                next_query = min([next_query, *graces])
                report = self._progress(states, waiting, len(results_by_index), len(failures))
                if report != last_report:
                    say(self.stage_name, report)
                    last_report = report
            if waiting:
                time.sleep(self._poll_seconds)

        ordered_failures = [failures[index] for index in sorted(failures)]
        ordered_results = {index: results_by_index[index] for index in sorted(results_by_index)}
        return FinishedStageRun(self.stage_name, self.item_names, ordered_results, ordered_failures)

    def _progress(self, states: dict, waiting: set[int], succeeded: int, failed: int) -> str:
        running = sum(
            1 for index in waiting if (state := states.get(self.jobs[index].job_id)) and state.state == "RUNNING"
        )
        return (
            f"{succeeded} done, {failed} failed, {running} running, "
            f"{len(waiting) - running} queued, of {len(self.jobs)}"
        )
