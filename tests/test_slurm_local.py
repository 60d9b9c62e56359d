"""Executor options, the local executor, and the pieces that need no Slurm cluster."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
import torch

from counteraudit.slurm.checkpointing import ResumableCall, resumable
from counteraudit.slurm.distributed import cleanup_distributed, init_distributed
from counteraudit.slurm.errors import ExecutorConfigError, ItemsFailedError, NoGpuError, SlurmUnreachableError
from counteraudit.slurm.executor_config import add_executor_args
from counteraudit.slurm.executor import ExecutorConfig, executor_config_from, executor_options, run_items


def parse(*command_line: str) -> dict:
    """The executor options of a command line, as an entry script hands them down."""
    return executor_options(add_executor_args(argparse.ArgumentParser()).parse_args(list(command_line)))


def test_defaults_without_options_or_suite_table():
    config = executor_config_from(parse())
    assert config == ExecutorConfig()
    assert config.executor == "local" and config.gpus_per_node == 0 and config.time_minutes == 60


def test_command_line_wins_over_suite_table_and_stage_table_over_general_keys():
    suite_table = {
        "executor": "slurm",
        "partition": "debug",
        "time": 30,
        "mem_gb": 8,
        "slurm_extra": {"reservation": "ours", "comment": "suite"},
        "train": {"gpus_per_node": 1, "time": 240, "slurm_extra": {"comment": "training"}},
    }
    args = parse("--partition", "long", "--slurm-extra", "exclusive", "--slurm-extra", "comment=cli")

    train = executor_config_from(args, suite_table, stage_name="train")
    assert train.executor == "slurm"
    assert train.partition == "long"  # command line over suite
    assert train.gpus_per_node == 1 and train.time_minutes == 240  # [slurm.train] over [slurm]
    assert train.mem_gb == 8.0
    assert train.slurm_extra == {"reservation": "ours", "comment": "cli", "exclusive": True}

    score = executor_config_from(parse(), suite_table, stage_name="score")
    assert score.gpus_per_node == 0 and score.time_minutes == 30 and score.partition == "debug"
    assert score.slurm_extra == {"reservation": "ours", "comment": "suite"}


def test_all_command_line_options_reach_the_config(tmp_path):
    args = parse(
        "--executor", "slurm", "--partition", "gpu", "--gpus-per-node", "2", "--nodes", "2",
        "--tasks-per-node", "2", "--cpus-per-task", "4", "--mem-gb", "15.5", "--time", "90",
        "--account", "lab", "--qos", "high", "--constraint", "a100", "--array-parallelism", "3",
        "--max-timeout-requeues", "7", "--dry-run", "--log-dir", str(tmp_path),
    )  # fmt: skip
    config = executor_config_from(args)
    assert config == ExecutorConfig(
        executor="slurm", partition="gpu", gpus_per_node=2, nodes=2, tasks_per_node=2, cpus_per_task=4,
        mem_gb=15.5, time_minutes=90, account="lab", qos="high", constraint="a100", array_parallelism=3,
        max_timeout_requeues=7, dry_run=True, log_dir=tmp_path,
    )  # fmt: skip


def test_one_process_per_gpu_by_default():
    assert ExecutorConfig(gpus_per_node=4).effective_tasks_per_node == 4
    assert ExecutorConfig(gpus_per_node=4, tasks_per_node=1).effective_tasks_per_node == 1
    assert ExecutorConfig().effective_tasks_per_node == 1


def test_unknown_suite_key_is_named_with_the_valid_ones():
    with pytest.raises(ExecutorConfigError, match=r"unknown key 'gpu_per_node'.*gpus_per_node"):
        executor_config_from(None, {"gpu_per_node": 1})
    with pytest.raises(ExecutorConfigError, match=r"\[slurm.train\] table has unknown key 'partion'"):
        # checked even while running another stage, so a typo shows up at once
        executor_config_from(None, {"train": {"partion": "gpu"}}, stage_name="score")


@pytest.mark.parametrize(
    ("suite_table", "message"),
    [
        ({"gpus_per_node": -1}, r"gpus_per_node \(--gpus-per-node\) must be a whole number from 0 to 1024, got -1"),
        ({"time": "2h"}, r"time_minutes \(--time\) must be a whole number from 1 to 525600, got '2h'"),
        ({"executor": "kubernetes"}, r"executor 'kubernetes' is unknown; use one of: local, slurm"),
        ({"mem_gb": 0}, r"mem_gb \(--mem-gb\) must be a number of GB from 0.001 to 1048576 .*, got 0"),
        ({"partition": ""}, r"partition \(--partition\) must be names of letters, .*, got ''"),
    ],
)
def test_bad_values_are_named(suite_table, message):
    with pytest.raises(ExecutorConfigError, match=message):
        executor_config_from(None, suite_table)


def test_slurm_extra_needs_an_option_name():
    with pytest.raises(SystemExit):  # argparse prints the error and exits
        parse("--slurm-extra", "=value")


def square(number: int) -> int:
    return number * number


def square_but_not_three(number: int) -> int:
    if number == 3:
        raise ValueError(f"item {number} is broken")
    return number * number


def test_local_executor_runs_items_in_order():
    calls = []

    def record_and_square(number: int) -> int:
        calls.append(number)
        return number * number

    assert run_items(record_and_square, [3, 1, 2], ExecutorConfig(), "local-order") == [9, 1, 4]
    assert calls == [3, 1, 2]


def test_local_partial_failure_keeps_the_other_results():
    with pytest.raises(ItemsFailedError) as raised:
        run_items(square_but_not_three, range(5), ExecutorConfig(), "local-partial",
                  item_name=lambda number: f"item-{number}")  # fmt: skip
    error = raised.value
    assert error.failed_item_names == ["item-3"]
    assert error.results_by_index == {0: 0, 1: 1, 2: 4, 4: 16}
    assert "item-3 (local run): ValueError: item 3 is broken" in str(error)
    assert isinstance(error.__cause__, ValueError)


def test_local_dry_run_prints_the_items_and_runs_nothing(capsys):
    calls = []
    results = run_items(calls.append, ["a", "b"], ExecutorConfig(dry_run=True), "local-dry")
    assert results == [] and calls == []
    printed = capsys.readouterr().out
    assert "would run 2 items locally" in printed and "    a\n    b\n" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_local_gpus_without_cuda_fail_before_running_anything():
    calls = []
    with pytest.raises(NoGpuError, match=r"--gpus-per-node 1 asks for GPUs, but this machine has no CUDA"):
        run_items(calls.append, [1, 2], ExecutorConfig(gpus_per_node=1), "local-gpu")
    assert calls == []


def test_local_executor_refuses_several_processes():
    with pytest.raises(ExecutorConfigError, match="--tasks-per-node 2 ask for several processes"):
        run_items(square, [1], ExecutorConfig(tasks_per_node=2), "local-ddp")


def test_stage_name_must_be_a_folder_name():
    with pytest.raises(ExecutorConfigError, match="stage name '../x'"):
        run_items(square, [1], ExecutorConfig(), "../x")


def test_log_dir_from_suite_table_is_a_path_and_stage_logs_go_below_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = executor_config_from(None, {"log_dir": "somewhere/logs"})
    assert config.log_dir == Path("somewhere/logs")
    assert config.stage_log_folder("train") == tmp_path / "somewhere" / "logs" / "train"
    assert ExecutorConfig().stage_log_folder("train") == tmp_path / "runs" / "slurm-logs" / "train"


def test_missing_slurm_commands_are_named(tmp_path, monkeypatch):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    assert shutil.which("sinfo") is None
    calls = []
    with pytest.raises(SlurmUnreachableError, match=r"`sinfo` is not on PATH.*--executor local"):
        run_items(calls.append, [1], ExecutorConfig(executor="slurm", log_dir=tmp_path / "logs"), "nocommands")
    assert calls == [] and not (tmp_path / "logs").exists()


def test_resumable_wraps_once_and_checkpoint_resubmits_the_same_call():
    wrapped = resumable(square)
    assert isinstance(wrapped, ResumableCall) and resumable(wrapped) is wrapped
    assert wrapped(3) == 9
    resubmission = wrapped.checkpoint(3)
    assert resubmission.function is wrapped and resubmission.args == (3,)


def test_a_single_process_needs_no_process_group(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    context = init_distributed()
    assert (context.rank, context.world_size, context.backend, context.is_main_process) == (0, 1, None, True)
    cleanup_distributed()  # harmless without a process group
