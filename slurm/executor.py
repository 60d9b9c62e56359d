"""Run a stage's independent work items, locally or as a Slurm job array, through one code path.

    parser = add_executor_args(argparse.ArgumentParser())
    args = parser.parse_args()
    config = executor_config_from(executor_options(args), suite.slurm, stage_name="train")
    results = run_items(train_model, specs_to_train, config, "train")

Local: fn(item) runs in this process, item after item, or with --jobs N in N worker processes
that end with this one (slurm/worker_pool.py). Slurm: one submitit job array with one
task per item (at most config.array_parallelism at once), logs in <log_dir>/<stage>/, and this
process waits for all of them. Either way every item is attempted; if some fail, ItemsFailedError
lists them and keeps the others' results, and a rerun redoes only what is missing (the stage
functions skip finished artifacts). One exception, locally: once a write finds no space left, no
further item starts (OutOfSpaceError says how much the rest needs).

To chain stages on Slurm without waiting in between, submit the first and pass it as `after`:
the second array then starts only once the first one has fully succeeded (afterok).

    training = submit_items(train_model, specs, config, "train")
    explanations = submit_items(explain_model, jobs, config, "explain", after=[training])
    explanations.results()
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any, TypeVar

import submitit
import torch

from counteraudit.slurm.checkpointing import resumable
from counteraudit.slurm.cluster import max_array_size
from counteraudit.slurm.errors import (ExecutorConfigError, ItemFailure, NoGpuError, OutOfSpaceError,
                                       SlurmUnreachableError, SubmissionError, out_of_space)
from counteraudit.slurm.executor_config import (ExecutorConfig, add_executor_args, executor_config_from,
                                                executor_options)
from counteraudit.slurm.request_checks import (check_local_gpus, check_local_layout, check_slurm_request,
                                               sbatch_parameters)
from counteraudit.slurm.stage_run import FinishedStageRun, SlurmStageRun, StageRun, default_item_name, say
from counteraudit.slurm.worker_pool import PRELOADED, worker_pool

__all__ = [
    "ExecutorConfig",
    "FinishedStageRun",
    "SlurmStageRun",
    "StageRun",
    "add_executor_args",
    "default_item_name",
    "executor_config_from",
    "executor_options",
    "run_items",
    "submit_items",
]

Item = TypeVar("Item")
Result = TypeVar("Result")


def _print_dry_run(
    config: ExecutorConfig,
    stage_name: str,
    item_names: list[str],
    dependency_ids: list[str],
    note: str = "",
    warning: str = "",
) -> None:
    lines = []
    if config.executor == "local":
        lines.append(f"[dry-run] stage '{stage_name}': would run {len(item_names)} items locally, in order")
    else:
        parameters = sbatch_parameters(config, stage_name, dependency_ids)
        parallel = min(config.array_parallelism, len(item_names))
        what = (
            "1 Slurm job"
            if len(item_names) == 1
            else f"1 Slurm job array of {len(item_names)} jobs (at most {parallel} at once)"
        )
        lines.append(f"[dry-run] stage '{stage_name}': would submit {what}")
        lines.append(
            "  per job: "
            f"partition={config.partition or '(cluster default)'} nodes={config.nodes} "
            f"tasks_per_node={config.effective_tasks_per_node} gpus_per_node={config.gpus_per_node} "
            f"cpus_per_task={config.cpus_per_task or '(default)'} mem={parameters.get('mem', '(default)')} "
            f"time={config.time_minutes}min account={config.account or '-'} qos={config.qos or '-'} "
            f"constraint={config.constraint or '-'}"
        )
        extra = parameters.get("additional_parameters", {})
        if extra:
            lines.append("  extra sbatch options: " + " ".join(f"--{k}={v}" for k, v in sorted(extra.items())))
        lines.append(f"  logs: {config.stage_log_folder(stage_name)}/")
    if note:
        lines.append(f"  note: {note}")
    if warning:
        lines.append(f"  WARNING: without --dry-run this would fail: {warning}")
    lines.append("  items:")
    lines.extend(f"    {name}" for name in item_names)
    lines.append("  nothing was run or submitted (--dry-run)")
    print("\n".join(lines), flush=True)


def default_local_jobs() -> int:
    """One process per core on a machine without a GPU, else 1 (what stages use for --jobs)."""

    return 1 if torch.cuda.is_available() else max(1, os.cpu_count() or 1)


def local_job_count(config: ExecutorConfig, item_count: int) -> int:
    return max(1, min(config.local_jobs or 1, item_count))


# In a worker process of _run_locally: set once an item found no space to write, so the items
# already queued to the workers are skipped instead of computed to fail at the same write.
_stop_scheduling = None


def _start_worker(threads: int, stop_scheduling) -> None:
    global _stop_scheduling
    torch.set_num_threads(threads)
    _stop_scheduling = stop_scheduling


# What became of an item: its result, an exception, a write without space, or not run at all.
DONE, FAILED, NO_SPACE, NOT_RUN = "done", "failed", "no space", "not run"


def _call_with_traceback(fn: Callable[[Any], Any], item: Any) -> tuple[str, Any]:
    """Runs in a worker process: (DONE, result), (FAILED or NO_SPACE, (reason, traceback,
    exception)), or (NOT_RUN, None) once another item found no space."""
    if _stop_scheduling is not None and _stop_scheduling.is_set():
        return NOT_RUN, None
    try:
        return DONE, fn(item)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        no_space = out_of_space(error)
        if no_space is None:
            return FAILED, (reason, traceback.format_exc(), error)
        if _stop_scheduling is not None:
            _stop_scheduling.set()
        # the OSError itself: an exception's chain does not survive the way back from a worker
        return NO_SPACE, (reason, traceback.format_exc(), no_space)


def _outcomes_in_workers(fn: Callable[[Any], Any], items: list[Any], stage_name: str,
                         jobs: int) -> dict[int, tuple[str, Any]]:
    """Each item's outcome, from ``jobs`` worker processes that end with this one; once an item
    finds no space, no further item starts (the running ones finish)."""
    # Not a fork of this process: a forked child of a process that already ran OpenMP threads can
    # hang. Forks of a server that has only imported (PRELOADED) start in a fraction of a second.
    threads = max(1, (os.cpu_count() or 1) // jobs)
    say(stage_name, f"running {len(items)} items, {jobs} at a time ({threads} thread(s) each)")
    stop_scheduling = multiprocessing.get_context("spawn").Event()
    outcomes: dict[int, tuple[str, Any]] = {}
    with worker_pool(jobs, PRELOADED, _start_worker, (threads, stop_scheduling),
                     preload=(getattr(fn, "__module__", None) or "__main__",)) as pool:
        futures = {pool.submit(_call_with_traceback, fn, item): index for index, item in enumerate(items)}
        for future in as_completed(futures):
            if future.cancelled():
                continue
            outcomes[futures[future]] = outcome = future.result()
            if outcome[0] == NO_SPACE:
                stop_scheduling.set()
                for waiting in futures:
                    waiting.cancel()
    return outcomes


def _run_locally(
    fn: Callable[[Any], Any], items: list[Any], item_names: list[str], stage_name: str, jobs: int = 1,
    space_needed: Callable[[list[Any]], int | None] | None = None,
) -> FinishedStageRun:
    if jobs > 1:
        outcomes = _outcomes_in_workers(fn, items, stage_name, jobs)
    else:
        outcomes = {}
        for index, item in enumerate(items):  # KeyboardInterrupt still stops the run
            outcomes[index] = _call_with_traceback(fn, item)
            if outcomes[index][0] == NO_SPACE:
                break
    results_by_index: dict[int, Any] = {}
    failures: list[ItemFailure] = []
    first_exception: BaseException | None = None
    for index in sorted(outcomes):
        kind, value = outcomes[index]
        if kind == DONE:
            results_by_index[index] = value
        elif kind != NOT_RUN:
            reason, trace, error = value  # every item is attempted, unless the disk is full
            first_exception = first_exception or error
            failures.append(ItemFailure(index=index, item_name=item_names[index], reason=reason, details=trace))
            say(stage_name, f"item {item_names[index]} failed: {reason}")
    no_space = next((value[2] for kind, value in outcomes.values() if kind == NO_SPACE), None)
    if no_space is None:
        return FinishedStageRun(stage_name, item_names, results_by_index, failures, first_exception)
    unfinished = [item for index, item in enumerate(items) if index not in results_by_index]
    error = OutOfSpaceError(stage_name, failures, results_by_index, len(items), cause=no_space,
                            needed_bytes=space_needed(unfinished) if space_needed else None)
    return FinishedStageRun(stage_name, item_names, results_by_index, failures, first_exception, error)


def _remove_stale_results(jobs: list[submitit.Job], submitted_at: float) -> None:
    """Job ids can repeat when a cluster's state is reset (e.g. local_cluster.sh stop --purge);
    a result file older than this submission then belongs to an earlier job of the same id in
    the same log folder and must not be taken for this job's result."""
    for job in jobs:
        for task in range(job.num_tasks):
            result_path = job.task(task).paths.result_pickle
            try:
                if result_path.stat().st_mtime < submitted_at - 2:
                    result_path.unlink()
            except FileNotFoundError:
                pass


def _check_stage_name(stage_name: str) -> None:
    if not stage_name or not all(c.isalnum() or c in "-_." for c in stage_name) or stage_name.startswith("."):
        raise ExecutorConfigError(
            f"stage name {stage_name!r} must be a simple folder name (letters, digits, - _ .), "
            "since logs go to <log_dir>/<stage>/"
        )


def submit_items(
    fn: Callable[[Item], Result],
    items: Iterable[Item],
    config: ExecutorConfig,
    stage_name: str,
    *,
    item_name: Callable[[Item], str] = default_item_name,
    after: Sequence[StageRun] = (),
    space_needed: Callable[[list[Item]], int | None] | None = None,
) -> StageRun:
    """Starts fn(item) for every item and returns without waiting on Slurm (locally, the items
    run right away). `after`: stages that must succeed first (Slurm: an afterok dependency;
    locally: their results() is awaited). fn and the items must be picklable for Slurm (module
    functions, functools.partial, dataclasses); fn(item) should skip work that is already done.

    Locally, once an item fails for lack of space (ENOSPC, EDQUOT), no further item starts and
    results() raises OutOfSpaceError, whose message gives `space_needed(unfinished items)`: the
    bytes they would store (None: no estimate)."""
    _check_stage_name(stage_name)
    items = list(items)
    item_names = [item_name(item) for item in items]

    if not items:  # a finished stage: nothing to run, so nothing to check either
        say(stage_name, "nothing to do: no items")
        return FinishedStageRun(stage_name, [], {}, [])

    if config.executor == "local":
        return _submit_locally(fn, items, item_names, config, stage_name, after, space_needed)
    for earlier_stage in after:
        if isinstance(earlier_stage, FinishedStageRun):
            earlier_stage.results()  # already over: raises if it failed, as afterok would cancel us
    dependency_ids = sorted({job_id for stage in after for job_id in stage.pending_dependency_ids})
    if config.dry_run:
        note = warning = ""
        try:
            check_slurm_request(config)  # an unknown partition still fails a dry run
        except SlurmUnreachableError as error:
            note = f"the partition and GPUs were not checked: {error}"
        except NoGpuError as error:  # e.g. planning a GPU run against a CPU-only test cluster
            warning = str(error)
        _print_dry_run(config, stage_name, item_names, dependency_ids, note, warning)
        return FinishedStageRun(stage_name, [], {}, [])
    down = [partition.name for partition in check_slurm_request(config) if not partition.is_up]
    if down:
        say(stage_name, f"partition {', '.join(down)} is not up: the jobs will wait in the queue until it is")

    log_folder = config.stage_log_folder(stage_name)
    submitted_at = time.time()
    jobs = _submit_arrays(fn, items, config, stage_name, dependency_ids, log_folder)
    array_ids = " ".join(sorted({job.job_id.split("_", 1)[0] for job in jobs}))
    waits_for = f", after {' '.join(dependency_ids)} succeeds" if dependency_ids else ""
    _remove_stale_results(jobs, submitted_at)
    jobs_text = "1 job" if len(jobs) == 1 else f"{len(jobs)} jobs"
    say(stage_name, f"submitted {jobs_text} as Slurm job {array_ids}{waits_for}; logs: {log_folder}/")
    return SlurmStageRun(stage_name, item_names, jobs, log_folder)


def _submit_locally(fn: Callable[[Item], Result], items: list[Item], item_names: list[str],
                    config: ExecutorConfig, stage_name: str, after: Sequence[StageRun],
                    space_needed: Callable[[list[Item]], int | None] | None) -> StageRun:
    """``submit_items`` on this machine: the plan on a dry run, else every item run now."""
    check_local_layout(config)
    if config.dry_run:
        # A dry run only prints: a plan made on a machine without the GPUs it asks for (a
        # laptop, a login node) is still shown, with the error the real run would give.
        try:
            check_local_gpus(config)
            warning = ""
        except NoGpuError as error:
            warning = str(error)
        _print_dry_run(config, stage_name, item_names, [], warning=warning)
        return FinishedStageRun(stage_name, [], {}, [])
    check_local_gpus(config)
    for earlier_stage in after:
        earlier_stage.results()
    return _run_locally(fn, items, item_names, stage_name, local_job_count(config, len(items)),
                        space_needed)


def _submit_arrays(fn: Callable[[Item], Result], items: list[Item], config: ExecutorConfig,
                   stage_name: str, dependency_ids: list[str], log_folder: Path) -> list:
    """The items submitted as submitit job arrays (one per MaxArraySize items); a refused
    submission leaves no pickle behind and raises one ``SubmissionError`` with what to check."""
    log_folder.mkdir(parents=True, exist_ok=True)
    files_before = set(log_folder.iterdir())
    executor = submitit.SlurmExecutor(folder=log_folder, max_num_timeout=config.max_timeout_requeues)
    executor.update_parameters(**sbatch_parameters(config, stage_name, dependency_ids))
    # A driver that itself runs inside a Slurm job must not pass its SLURM_* variables on.
    with submitit.helpers.clean_env():
        try:
            # A chunked paper suite has thousands of items; one array may hold MaxArraySize.
            # (--array-parallelism then bounds each array, not their sum.)
            array_size = max_array_size()
            return [job for start in range(0, len(items), array_size)
                    for job in executor.map_array(resumable(fn), items[start:start + array_size])]
        except Exception as error:
            for leftover in set(log_folder.iterdir()) - files_before:  # pickles of jobs never submitted
                leftover.unlink(missing_ok=True)
            raise SubmissionError(
                f"sbatch refused stage '{stage_name}' ({len(items)} jobs, partition "
                f"{config.partition or '(default)'}): {str(error).strip()}\n"
                "Check what the jobs ask for (--mem-gb, --cpus-per-task, --time, --account, --qos, "
                "--constraint, --slurm-extra) against the cluster's limits: sinfo -o '%P %c %m %l %f'"
            ) from error


def run_items(
    fn: Callable[[Item], Result],
    items: Iterable[Item],
    config: ExecutorConfig,
    stage_name: str,
    *,
    item_name: Callable[[Item], str] = default_item_name,
    after: Sequence[StageRun] = (),
    space_needed: Callable[[list[Item]], int | None] | None = None,
) -> list[Result]:
    """fn(item) for every item, locally or on Slurm per config; results in item order.

    Raises ItemsFailedError (carrying the successful items' results) if any item failed; its
    subclass OutOfSpaceError when a local run stopped for lack of space (see submit_items); and
    before running anything: UnknownPartitionError, SlurmUnreachableError, NoGpuError,
    SubmissionError. With config.dry_run, prints the plan and returns [].
    """
    return submit_items(fn, items, config, stage_name, item_name=item_name, after=after,
                        space_needed=space_needed).results()
