"""run_items on the real local Slurm cluster (slurm/local_cluster.sh start): same results as the
local executor, failures reported per item, dry runs submit nothing, stages chain with afterok."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import uuid
from pathlib import Path

import cloudpickle
import pytest
import torch

from tests.conftest import require_slurm_cluster
from counteraudit.slurm.cluster import DEFAULT_MAX_ARRAY_SIZE, max_array_size
from counteraudit.slurm.errors import ItemsFailedError
from counteraudit.slurm.executor import ExecutorConfig, run_items, submit_items

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

# Jobs unpickle these functions in a fresh Python that cannot import this test module by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def _slurm_cluster():
    require_slurm_cluster()


def slurm_config(tmp_path: Path, **changes) -> ExecutorConfig:
    return ExecutorConfig(executor="slurm", log_dir=tmp_path / "logs", time_minutes=5, **changes)


def unique_stage(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def jobs_named(job_name: str) -> list[str]:
    listed = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--name", job_name, "--format=%i"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def describe_number(number: int) -> dict:
    return {"number": number, "square": number * number, "text": f"item {number}"}


def square_but_broken(number: int) -> int:
    if number == 1:
        raise ValueError(f"item {number} is broken")
    if number == 3:
        os._exit(7)  # dies without a Python exception: no result file, Slurm reports FAILED
    return number * number


def write_number(job: tuple[str, int]) -> str:
    folder, number = job
    path = Path(folder) / f"{number}.json"
    path.write_text(json.dumps({"number": number}))
    return str(path)


def read_and_double(path: str) -> int:
    return 2 * json.loads(Path(path).read_text())["number"]


def threads_of_a_torch_loaded_before_the_call(_: int) -> int:
    return torch.get_num_threads()  # a global of the function: the job loads torch to unpickle it


def threads_of_a_torch_loaded_in_the_call(_: int) -> int:
    import torch as loaded_late  # noqa: PLC0415  (the point: torch loads after the job started)
    return loaded_late.get_num_threads()


def torch_loaded(_: int) -> bool:
    return "torch" in sys.modules


def test_job_array_gives_the_same_results_as_the_local_executor(tmp_path):
    items = list(range(6))
    stage = unique_stage("parity")

    local_results = run_items(describe_number, items, ExecutorConfig(), stage)
    slurm_results = run_items(describe_number, items, slurm_config(tmp_path, array_parallelism=2), stage)

    assert slurm_results == local_results
    # one array task per item, all logging into <log_dir>/<stage>/
    stage_logs = tmp_path / "logs" / stage
    array_ids = {path.name.split("_")[0] for path in stage_logs.glob("*_log.out")}
    assert len(array_ids) == 1
    assert sorted(int(path.name.split("_")[1]) for path in stage_logs.glob("*_0_log.out")) == items


def test_more_items_than_the_clusters_array_size_go_out_as_several_arrays(tmp_path, monkeypatch):
    assert max_array_size() == DEFAULT_MAX_ARRAY_SIZE  # read from the local cluster's scontrol
    monkeypatch.setattr("counteraudit.slurm.executor.max_array_size", lambda: 2)
    stage = unique_stage("arrays")
    results = run_items(describe_number, list(range(5)), slurm_config(tmp_path), stage)
    assert results == [describe_number(n) for n in range(5)]
    array_ids = {path.name.split("_")[0] for path in (tmp_path / "logs" / stage).glob("*_log.out")}
    assert len(array_ids) == 3  # 2 + 2 + 1


def test_partial_failure_names_failed_items_and_keeps_the_others(tmp_path):
    names = {number: f"item-{number}" for number in range(5)}
    with pytest.raises(ItemsFailedError) as raised:
        run_items(square_but_broken, range(5), slurm_config(tmp_path), unique_stage("partial"),
                  item_name=names.get)  # fmt: skip
    error = raised.value

    assert error.failed_item_names == ["item-1", "item-3"]
    assert error.results_by_index == {0: 0, 2: 4, 4: 16}
    by_name = {failure.item_name: failure for failure in error.failures}
    assert by_name["item-1"].reason == "ValueError: item 1 is broken"
    assert "without writing a result" in by_name["item-3"].reason
    assert "FAILED" in by_name["item-3"].reason
    assert all(failure.log_paths[-1].name.endswith("_log.err") for failure in error.failures)
    assert "item-1" in str(error) and "item-3" in str(error) and "rerun" in str(error)


def test_dry_run_prints_the_plan_and_submits_nothing(tmp_path, capsys):
    stage = unique_stage("dry")
    calls_folder = tmp_path / "calls"
    config = slurm_config(tmp_path, dry_run=True, partition="long", cpus_per_task=1, mem_gb=1,
                          array_parallelism=2, slurm_extra={"comment": "hello"})  # fmt: skip

    results = run_items(write_number, [(str(calls_folder), n) for n in range(3)], config, stage,
                        item_name=lambda job: f"number-{job[1]}")  # fmt: skip

    assert results == []
    printed = capsys.readouterr().out
    assert "would submit 1 Slurm job array of 3 jobs (at most 2 at once)" in printed
    assert "partition=long" in printed and "cpus_per_task=1" in printed and "mem=1GB" in printed
    assert "--comment=hello" in printed
    assert all(f"number-{n}" in printed for n in range(3))
    assert jobs_named(stage) == []
    assert not calls_folder.exists() and not (tmp_path / "logs" / stage).exists()


def test_a_stage_submitted_after_another_starts_once_it_succeeded(tmp_path):
    folder = tmp_path / "numbers"
    folder.mkdir()
    config = slurm_config(tmp_path)
    writing = submit_items(write_number, [(str(folder), n) for n in range(3)], config, unique_stage("write"))
    # Submitted before the files exist: only the afterok dependency makes this work.
    paths = [str(folder / f"{n}.json") for n in range(3)]
    reading = submit_items(read_and_double, paths, config, unique_stage("read"), after=[writing])

    assert reading.results() == [0, 2, 4]
    assert writing.results() == paths


def test_a_job_computes_on_its_allocations_cpus_and_loads_torch_only_when_its_callable_does(
        tmp_path):
    """The node has 2 CPUs and leaves a task all of them (TaskPlugin=task/none): a 1-CPU job's
    torch runs on 1 thread, whether it was loaded to unpickle the callable or by the callable; a
    job whose callable never uses torch does not import it (seconds of CPU a job)."""
    config = slurm_config(tmp_path, cpus_per_task=1)
    stages = [submit_items(function, [0], config, unique_stage(name)) for function, name in
              [(threads_of_a_torch_loaded_before_the_call, "threads-early"),
               (threads_of_a_torch_loaded_in_the_call, "threads-late"), (torch_loaded, "no-torch")]]
    assert [stage.results() for stage in stages] == [[1], [1], [False]]


def fail_loudly(number: int) -> int:
    raise RuntimeError(f"first stage broke on {number}")


def test_a_stage_after_a_failed_one_is_cancelled_not_left_pending(tmp_path):
    config = slurm_config(tmp_path)
    failing = submit_items(fail_loudly, [1], config, unique_stage("broken"))
    waiting = submit_items(describe_number, [1, 2], config, unique_stage("after-broken"), after=[failing])

    with pytest.raises(ItemsFailedError, match="first stage broke on 1"):
        failing.results()
    with pytest.raises(ItemsFailedError) as raised:
        waiting.results()
    assert len(raised.value.failures) == 2
    assert all("CANCELLED (reason: DependencyNeverSatisfied)" in failure.reason for failure in raised.value.failures)


def test_a_result_file_left_by_an_earlier_job_with_the_same_id_is_ignored(tmp_path):
    """Job ids restart when a cluster's state is reset; an old result must not pass for a new one."""
    stage = unique_stage("stale")
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    next_job_id = re.search(r"NEXT_JOB_ID\s*=\s*(\d+)", shown).group(1)
    stale_result = tmp_path / "logs" / stage / f"{next_job_id}_0_result.pkl"
    stale_result.parent.mkdir(parents=True)
    stale_result.write_bytes(pickle.dumps(("success", "stale result of an earlier cluster")))
    os.utime(stale_result, (1_000_000_000, 1_000_000_000))

    assert run_items(describe_number, [5], slurm_config(tmp_path), stage) == [describe_number(5)]
