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

from slurm.cluster import list_partitions, require_slurm_cluster
from slurm.errors import ExecutorError, NoGpuError, SlurmUnreachableError, SubmissionError, UnknownPartitionError
from slurm.executor import ExecutorConfig, run_items

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


def test_unreachable_controller_says_so_and_how_to_fix_it(tmp_path, monkeypatch):
    # A copy of the cluster's config whose controller port has nobody listening.
    live_config = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).resolve()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    other_lines = re.sub(r"(?mi)^\s*SlurmctldPort\s*=.*$", "", live_config.read_text())
    dead_config = tmp_path / "slurm.conf"
    dead_config.write_text(f"{other_lines}\nSlurmctldPort={free_port}\n")
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
