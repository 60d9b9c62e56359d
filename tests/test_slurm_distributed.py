"""init_distributed in a 2-task Slurm job on the real local cluster: both tasks join one gloo
process group through the variables exported from Slurm's environment."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from tests.conftest import require_slurm_cluster
from counteraudit.slurm.distributed import cleanup_distributed, init_distributed
from counteraudit.slurm.executor import ExecutorConfig, run_items

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def _slurm_cluster():
    require_slurm_cluster()


def sum_of_ranks(offset: int) -> dict:



    context = init_distributed()
    try:
        value = torch.tensor([float(context.rank + offset)])
        dist.all_reduce(value)
        return {
            "rank": context.rank,
            "world_size": context.world_size,
            "backend": context.backend,
            "device": str(context.device),
            "sum": value.item(),
            "exported": all(
                name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
            ),
        }
    finally:
        cleanup_distributed()


def test_two_tasks_form_a_gloo_process_group(tmp_path):
    config = ExecutorConfig(executor="slurm", tasks_per_node=2, cpus_per_task=1, time_minutes=5,
                            log_dir=tmp_path / "logs")  # fmt: skip
    results = run_items(sum_of_ranks, [10], config, "ddp")

    # ranks 0 and 1: (0 + offset) + (1 + offset); the item's result is rank 0's
    assert results == [{"rank": 0, "world_size": 2, "backend": "gloo", "device": "cpu", "sum": 21.0, "exported": True}]
