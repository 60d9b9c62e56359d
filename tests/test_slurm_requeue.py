"""A job interrupted on the real local Slurm cluster resumes from its own progress file and ends
with the same result as an uninterrupted run: after `scontrol requeue` (Slurm restarts the job)
and after a preemption signal (submitit calls ResumableCall.checkpoint and requeues); and a real
training job requeued mid-run resumes from its per-epoch checkpoint to the same weights."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import cloudpickle
import pytest
import torch

from counteraudit.slurm.executor import ExecutorConfig, run_items, submit_items
from counteraudit.train.checkpoint import CHECKPOINT_NAME, WEIGHTS_NAME, model_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.stage import TrainItem, train_one
from tests.conftest import TINY_WORLD, require_slurm_cluster, write_suite

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


# A real training job, about 1.3 s per epoch on the AVX-512 EPYC (2.9 s on the AVX2-only one).
# `scontrol requeue` sends SIGTERM, which submitit's handler ignores ("Bypassing signal
# SIGTERM"), so the job trains on until Slurm kills it KillWait (2 s on the local cluster) later:
# it needs well over 2 s of training left after its first checkpoint (5 epochs).
REQUEUE_EPOCHS = 6


def test_training_job_requeued_mid_run_resumes_from_its_checkpoint_to_the_same_weights(tmp_path):
    """`scontrol requeue` kills a running training job after its first per-epoch checkpoint;
    Slurm restarts it, train_one resumes from checkpoint.pth (the one definition in
    train/checkpoint.py), loses at most the epoch in progress, and ends with weights bit-identical
    to an uninterrupted local run."""


    suite_path = write_suite(tmp_path / "requeuetiny.toml", references=2, epochs=REQUEUE_EPOCHS,
                             world={**TINY_WORLD, "num_train": 2560})  # fmt: skip
    suite = load_suite(suite_path)
    spec = suite.references[0]
    item = TrainItem(suite=suite, runs_dir=str(tmp_path / "slurm"), model=spec.name, progress=False)
    directory = model_dir(tmp_path / "slurm", spec)
    config = ExecutorConfig(executor="slurm", cpus_per_task=1, time_minutes=10, log_dir=tmp_path / "logs")
    stage = submit_items(train_one, [item], config, "train", item_name=lambda i: i.model)

    deadline = time.monotonic() + 90
    while not (directory / CHECKPOINT_NAME).exists():
        assert time.monotonic() < deadline, "the training job wrote no checkpoint in 90 s"
        time.sleep(0.1)
    subprocess.run(["scontrol", "requeue", stage.job_ids[0]], check=True, capture_output=True)
    # While Slurm holds the requeued job back (KillWait, then cred_expire: 10 s), train the same
    # model locally, uninterrupted.
    train_one(replace(item, runs_dir=str(tmp_path / "local")))
    [metrics] = stage.results()

    log = stage.jobs[0].paths.stdout.read_text()
    resumed = re.findall(rf"{spec.name}: resuming after epoch (\d+)/{REQUEUE_EPOCHS}", log)
    assert len(resumed) == 1, log
    resumed_after = int(resumed[0])
    assert 1 <= resumed_after < REQUEUE_EPOCHS
    finished = [int(e) for e in re.findall(rf"{spec.name} epoch (\d+)/{REQUEUE_EPOCHS}:", log)]
    # epochs up to the checkpoint ran once; only the epoch in progress at the requeue may repeat
    assert all(finished.count(epoch) == 1 for epoch in range(1, resumed_after + 1)), finished
    assert sorted(set(finished)) == list(range(1, REQUEUE_EPOCHS + 1))
    assert len(finished) <= REQUEUE_EPOCHS + 1
    assert [entry["epoch"] for entry in metrics["history"]] == list(range(1, REQUEUE_EPOCHS + 1))

    requeued = torch.load(directory / WEIGHTS_NAME)
    uninterrupted = torch.load(model_dir(tmp_path / "local", spec) / WEIGHTS_NAME)
    assert requeued.keys() == uninterrupted.keys()
    assert all(torch.equal(requeued[name], uninterrupted[name]) for name in requeued)
