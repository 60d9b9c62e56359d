"""One model trained by a 2-task DistributedDataParallel Slurm job (CPU, gloo), through the
project's own training entry (train/stage.py's train_one, the function `train.py --executor
slurm` submits), against one process that emulates the two processes."""
from __future__ import annotations

import pytest
import torch

from counteraudit.slurm.executor import ExecutorConfig, run_items
from tests.conftest import write_suite
from counteraudit.train.architectures import build_model
from counteraudit.train.checkpoint import WEIGHTS_NAME, model_dir
from counteraudit.train.stage import TrainItem, train_one
from counteraudit.train.core.suite import load_suite

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def _max_difference(a: dict, b: dict, names: list[str]) -> float:
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in names)


def test_two_process_ddp_training_matches_one_process_accumulating_the_two_half_batches(tmp_path):
    """Each of the 2 tasks trains on its half of every global batch (64 images: 32 each); DDP
    averages the two halves' gradients, so the parameters must equal, to float tolerance, those of
    one process that sums the two half-batches' mean losses / 2 before each SGD step (momentum and
    weight decay then act on the same gradient): train_model(emulate_processes=2).

    It is NOT the same as one process on the full batch of 64: BatchNorm normalizes each process's
    half with that half's own mean and variance, so the forward pass, and so the gradients,
    differ; the test checks that the full-batch run is clearly different, so the comparison means
    something. BatchNorm running statistics: a naive accumulation would update them from both
    halves, while the saved DDP model carries rank 0's only (DDP broadcasts rank 0's buffers to
    every process before each forward, and rank 0 writes the weights); the emulation keeps slice
    0's update, so they are compared too, with their own assertion and tolerance.
    (On this CPU, with a fixed thread count, both come out identical to the bit; the tolerances
    leave room for other CPUs' reduction orders.)
    """
    suite_path = write_suite(tmp_path / "ddptiny.toml", references=2, epochs=2)
    suite = load_suite(suite_path)
    spec = suite.references[0]

    def item(runs: str, **extra) -> TrainItem:
        return TrainItem(suite=suite, runs_dir=str(tmp_path / runs), model=spec.name, progress=False, **extra)

    config = ExecutorConfig(executor="slurm", tasks_per_node=2, cpus_per_task=1, time_minutes=10,
                            log_dir=tmp_path / "logs")
    [ddp_metrics] = run_items(train_one, [item("ddp")], config, "train-ddp",
                              item_name=lambda i: i.model)
    assert ddp_metrics["processes"] == 2 and ddp_metrics["distributed_backend"] == "gloo"
    assert len(list((tmp_path / "logs" / "train-ddp").glob("*_1_log.out"))) == 1  # a second task ran

    emulated_metrics = train_one(item("emulated", emulate_processes=2))
    train_one(item("whole"))
    assert emulated_metrics["emulated_processes"] == 2

    def weights(runs: str) -> dict:
        return torch.load(model_dir(tmp_path / runs, spec) / WEIGHTS_NAME)

    ddp, emulated, whole = weights("ddp"), weights("emulated"), weights("whole")
    backbone = build_model(spec.architecture, 10, (0.5,) * 3, (0.25,) * 3).backbone
    parameters = [name for name, _ in backbone.named_parameters()]
    running_stats = [name for name, value in backbone.named_buffers() if value.is_floating_point()]
    assert ddp.keys() == emulated.keys() == set(parameters) | {n for n, _ in backbone.named_buffers()}

    parameter_gap = _max_difference(ddp, emulated, parameters)
    stats_gap = _max_difference(ddp, emulated, running_stats)
    print(f"max |DDP - emulated|: parameters {parameter_gap:.3g}, running statistics {stats_gap:.3g};"
          f" max |DDP - full batch|: parameters {_max_difference(ddp, whole, parameters):.3g}")
    assert parameter_gap < 1e-5, f"DDP and emulated parameters differ by up to {parameter_gap}"
    assert stats_gap < 1e-4, f"BatchNorm running statistics differ by up to {stats_gap}"
    counters = [name for name, value in backbone.named_buffers() if not value.is_floating_point()]
    assert all(torch.equal(ddp[name], emulated[name]) for name in counters)  # num_batches_tracked
    assert _max_difference(ddp, whole, parameters) > 1e-3, "the full-batch run should differ"
