"""evaluate/benchmarks/ddp.py in one process: the trainer makes no process group for one
process, so the benchmark makes a group of one itself and wraps the model in DDP; it leaves no
group behind, and an adversarial step times PGD's host-drawn start beside the step."""
from __future__ import annotations

import counteraudit.train  # noqa: F401, I001  (first: the numeric mode)

import torch.distributed as dist

from counteraudit.evaluate.benchmarks.ddp import _free_port, get_args_parser, measure
from counteraudit.train.architectures import build_model


def test_one_process_is_a_gloo_group_of_one_and_leaves_no_group(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    args = get_args_parser().parse_args(["--image-size", "16", "--batch-size", "4", "--repeats", "1",
                                         "--step", "adversarial", "--pgd-steps", "1"])
    args.steps = 1
    figures = measure(args)
    assert (figures["world_size"], figures["backend"], figures["precision"]) == (1, "gloo", "fp32")
    assert figures["plain"] > 0 and figures["ddp"] > 0
    assert figures["pgd_start_seconds"] > 0
    model = build_model("small_resnet", 10, (0.5,) * 3, (0.25,) * 3)
    assert figures["gradient_bytes"] == 4 * sum(p.numel() for p in model.parameters())  # fp32
    assert not dist.is_initialized()
