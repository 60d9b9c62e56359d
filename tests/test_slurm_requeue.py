"""A job interrupted on the real local Slurm cluster resumes from its own progress file and ends
with the same result as an uninterrupted run: after `scontrol requeue` (Slurm restarts the job)
and after a preemption signal (submitit calls ResumableCall.checkpoint and requeues)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from slurm.cluster import require_slurm_cluster
from slurm.executor import ExecutorConfig, run_items, submit_items

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEP_COUNT = 30


@pytest.fixture(autouse=True)
def _slurm_cluster():
    require_slurm_cluster()


def count_with_progress_file(job: tuple[str, float]) -> dict:
    """Resumable work: each step's state is saved atomically; a restart continues from the file
    and records where it resumed. The result does not depend on the pace (seconds per step)."""
    progress_path, seconds_per_step = job
    path = Path(progress_path)
    state = json.loads(path.read_text()) if path.exists() else {"steps_done": 0, "total": 0, "starts": []}
    state["starts"].append(state["steps_done"])
    while True:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        temporary.replace(path)
        if state["steps_done"] == STEP_COUNT:
            break
        time.sleep(seconds_per_step)
        state["steps_done"] += 1
        state["total"] += state["steps_done"] ** 2
    return {"steps_done": state["steps_done"], "total": state["total"]}


def read_progress(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"steps_done": 0, "starts": []}


def wait_for_steps(path: Path, steps: int, timeout_seconds: float = 60) -> None:
    deadline = time.monotonic() + timeout_seconds
    while read_progress(path)["steps_done"] < steps:
        assert time.monotonic() < deadline, f"job made no progress in {timeout_seconds} s: {read_progress(path)}"
        time.sleep(0.2)


def uninterrupted_result(tmp_path: Path) -> dict:
    [result] = run_items(count_with_progress_file, [(str(tmp_path / "uninterrupted.json"), 0.0)],
                         ExecutorConfig(), "count")  # fmt: skip
    return result


def test_scontrol_requeue_resumes_from_the_progress_file(tmp_path):
    progress = tmp_path / "requeued.json"
    stage = submit_items(count_with_progress_file, [(str(progress), 0.25)],
                         ExecutorConfig(executor="slurm", log_dir=tmp_path / "logs"), "count")  # fmt: skip
    wait_for_steps(progress, 4)

    subprocess.run(["scontrol", "requeue", stage.job_ids[0]], check=True, capture_output=True)
    [result] = stage.results()

    starts = read_progress(progress)["starts"]
    assert len(starts) == 2 and starts[0] == 0 and 4 <= starts[1] < STEP_COUNT, starts
    assert result == uninterrupted_result(tmp_path)


def test_preemption_signal_checkpoints_requeues_and_resumes(tmp_path):
    progress = tmp_path / "preempted.json"
    stage = submit_items(count_with_progress_file, [(str(progress), 0.25)],
                         ExecutorConfig(executor="slurm", log_dir=tmp_path / "logs"), "count")  # fmt: skip
    wait_for_steps(progress, 4)

    # What Slurm sends before a time limit or a preemption: submitit's handler calls
    # ResumableCall.checkpoint(), saves the resubmission and requeues the job itself.
    subprocess.run(["scancel", "--signal=USR2", stage.job_ids[0]], check=True, capture_output=True)
    [result] = stage.results()

    starts = read_progress(progress)["starts"]
    assert len(starts) == 2 and starts[0] == 0 and 4 <= starts[1] < STEP_COUNT, starts
    assert result == uninterrupted_result(tmp_path)
    log = stage.jobs[0].paths.stdout.read_text()
    assert "this job is preempted" in log and "Calling checkpoint method" in log and "Requeued job" in log
