"""Bad requests to the real local Slurm cluster fail at once, with one clear error each, before
anything is submitted or computed."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import cloudpickle
import pytest
import torch

from counteraudit.slurm.cluster import list_partitions
from counteraudit.slurm.errors import (ExecutorError, NoGpuError, SlurmUnreachableError, SubmissionError,
                                       UnknownPartitionError)
from counteraudit.slurm.executor import ExecutorConfig, run_items
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.train import get_args_parser, main as train_main
from counteraudit.train.trainer import train_model
from tests.conftest import require_slurm_cluster, write_suite

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def _slurm_cluster():
    require_slurm_cluster()


def touch(path: str) -> str:
    Path(path).touch()
    return path


def run_one_item(tmp_path: Path, stage: str, **config_changes) -> None:
    config = ExecutorConfig(executor="slurm", log_dir=tmp_path / "logs", time_minutes=5, **config_changes)
    run_items(touch, [str(tmp_path / "computed")], config, stage)


def assert_nothing_submitted(tmp_path: Path, stage: str) -> None:
    listed = subprocess.run(["squeue", "--noheader", "--states=all", "--name", stage, "--format=%i"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert listed.stdout.split() == []
    assert not (tmp_path / "computed").exists()
    assert not (tmp_path / "logs" / stage).exists()


def test_local_cluster_has_a_default_and_a_second_partition_without_gpus():
    partitions = {partition.name: partition for partition in list_partitions()}
    assert partitions["debug"].is_default and partitions["debug"].is_up
    assert len(partitions) >= 2
    assert all(partition.max_gpus_per_node == 0 for partition in partitions.values())


def test_unknown_partition_lists_the_clusters_partitions(tmp_path):
    stage = f"badpart-{uuid.uuid4().hex[:8]}"
    with pytest.raises(UnknownPartitionError) as raised:
        run_one_item(tmp_path, stage, partition="no-such-partition")
    message = str(raised.value)
    assert "partition 'no-such-partition' does not exist" in message
    assert "debug (default)" in message and "long" in message and "--partition" in message
    assert_nothing_submitted(tmp_path, stage)


def test_gpus_on_a_partition_without_gpus(tmp_path):
    stage = f"nogpu-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NoGpuError) as raised:
        run_one_item(tmp_path, stage, partition="debug", gpus_per_node=1)
    message = str(raised.value)
    assert "--gpus-per-node 1" in message and "partition debug have no GPUs" in message
    assert "(null)" in message  # what sinfo -o %G shows, so the user can check it
    assert "--gpus-per-node 0" in message
    assert_nothing_submitted(tmp_path, stage)


def dead_controller_config(tmp_path: Path) -> tuple[Path, Path]:
    """(live config, a copy of it whose controller port has nobody listening). Slurm's commands
    retry a refused connection for MessageTimeout - 1 seconds (9 s at the local cluster's 10):
    the copy's 1 has them give up at once, with the same error."""
    live_config = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).resolve()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    other_lines = re.sub(r"(?mi)^\s*(SlurmctldPort|MessageTimeout)\s*=.*$", "", live_config.read_text())
    dead_config = tmp_path / "slurm.conf"
    dead_config.write_text(f"{other_lines}\nSlurmctldPort={free_port}\nMessageTimeout=1\n")
    return live_config, dead_config


def test_unreachable_controller_says_so_and_how_to_fix_it(tmp_path, monkeypatch):
    live_config, dead_config = dead_controller_config(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(dead_config))
    stage = f"dead-{uuid.uuid4().hex[:8]}"

    with pytest.raises(SlurmUnreachableError) as raised:
        run_one_item(tmp_path, stage)
    message = str(raised.value)
    assert "unreachable" in message and f"SLURM_CONF={dead_config}" in message
    assert "local_cluster.sh start" in message
    assert isinstance(raised.value, ExecutorError)

    monkeypatch.setenv("SLURM_CONF", str(live_config))
    assert_nothing_submitted(tmp_path, stage)


def test_request_sbatch_refuses_is_reported_with_its_message(tmp_path):
    stage = f"toobig-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SubmissionError) as raised:
        run_one_item(tmp_path, stage, mem_gb=100_000)  # 100 TB: no node has that
    message = str(raised.value)
    assert "sbatch refused stage" in message and "Requested node configuration is not available" in message
    assert "--mem-gb" in message
    assert list((tmp_path / "logs" / stage).iterdir()) == []  # no orphaned job pickles
    assert not (tmp_path / "computed").exists()


def _files_with_stamps(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_mtime_ns, path.stat().st_size)
            for path in sorted(folder.rglob("*")) if path.is_file()}  # fmt: skip


def test_bad_training_requests_fail_clearly_and_lose_nothing_already_trained(tmp_path, monkeypatch):
    """train.py with a missing partition, an unreachable controller, or GPUs where there are none
    (on Slurm, and a suite asking GPUs on the CPU-only local executor): one clear error each, no
    job, and a trained model and a half-trained checkpoint stay as they were; the next good run
    trains only what is missing, resuming the half-trained model from its checkpoint."""


    suite_path = write_suite(tmp_path / "kept.toml", references=2, epochs=2)
    suite = load_suite(suite_path)
    runs = tmp_path / "runs"
    root = suite.root(runs)
    finished, half = suite.references
    train_model(finished, model_dir(runs, finished), progress=False, runs_root=runs)
    train_model(half, model_dir(runs, half), progress=False, runs_root=runs, stop_after_epoch=1)
    computed = _files_with_stamps(runs / "store" / "models")
    jobs_before = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i"], capture_output=True, text=True,
                                 check=True).stdout.split()  # fmt: skip

    def train(*options: str, suite_file: Path = suite_path):
        command_line = ["--suite", str(suite_file), "--runs-dir", str(runs), "--no-progress", *options]
        return train_main(get_args_parser().parse_args(command_line))

    def assert_nothing_lost_or_submitted():
        assert _files_with_stamps(runs / "store" / "models") == computed
        assert not (root / "slurm-logs").exists()
        jobs = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%o"], capture_output=True, text=True,
                              check=True).stdout.split()  # fmt: skip
        assert not [job for job in jobs if job.split("|")[0] not in jobs_before and str(tmp_path) in job]

    # On the command line: one line, no traceback.
    script = Path(__file__).resolve().parents[1] / "train" / "train.py"
    shown = subprocess.run([sys.executable, str(script), "--suite", str(suite_path), "--runs-dir", str(runs),
                            "--executor", "slurm", "--partition", "no-such-partition"],
                           capture_output=True, text=True)  # fmt: skip
    assert shown.returncode == 2 and "Traceback" not in shown.stderr
    assert shown.stderr.strip().splitlines() == [
        "counteraudit training: error: partition 'no-such-partition' does not exist on this cluster; its "
        "partitions are: debug (default), long. Pass one with --partition or the suite's [slurm] partition = ..."]
    assert_nothing_lost_or_submitted()

    with pytest.raises(UnknownPartitionError, match="partition 'gpu' does not exist"):
        train("--executor", "slurm", "--partition", "gpu")
    assert_nothing_lost_or_submitted()
    with pytest.raises(NoGpuError, match="--gpus-per-node 2 but the nodes of partition debug have no GPUs"):
        train("--executor", "slurm", "--partition", "debug", "--gpus-per-node", "2")
    assert_nothing_lost_or_submitted()
    if not torch.cuda.is_available():
        # The suite's own [slurm] table asks for GPUs; the local executor has none.
        gpu_suite = tmp_path / "gpu" / "kept.toml"  # same name, so the same models and folders
        gpu_suite.parent.mkdir()
        gpu_suite.write_text(suite_path.read_text() + "\n[slurm]\ngpus_per_node = 1\n")
        with pytest.raises(NoGpuError, match="--gpus-per-node 1 asks for GPUs, but this machine has no CUDA"):
            train(suite_file=gpu_suite)
        assert_nothing_lost_or_submitted()
    live_config, dead_config = dead_controller_config(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(dead_config))
    with pytest.raises(SlurmUnreachableError, match="The Slurm controller is unreachable"):
        train("--executor", "slurm", "--partition", "debug")
    monkeypatch.setenv("SLURM_CONF", str(live_config))
    assert_nothing_lost_or_submitted()

    # The good request: only the half-trained model runs, from its checkpoint.
    metrics = train("--executor", "slurm", "--partition", "debug", "--cpus-per-task", "1")
    assert [m["name"] for m in metrics] == [finished.name, half.name]
    after = _files_with_stamps(runs / "store" / "models")
    finished_folder = model_dir(runs, finished).name
    finished_files = {name: stamp for name, stamp in computed.items() if name.startswith(finished_folder)}
    assert finished_files and all(after[name] == stamp for name, stamp in finished_files.items())
    [log] = (root / "slurm-logs" / "train").glob("*_0_log.out")  # one job: the half-trained model
    assert f"{half.name}: resuming after epoch 1/2" in log.read_text()
    assert f"{half.name} epoch 1/2:" not in log.read_text()
