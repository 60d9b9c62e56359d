"""The CPU threads torch computes on, which are part of what a result is.

oneDNN, MKL and ATen split a convolution, a product or a sum by the thread count, each split
rounding its own way: a model's logits on 3 threads were not those on 1, 2 or 8, and lpips-vgg's
distances differed on every count from 2 to 32. So every computation whose result is stored runs
on a count the suite fixes, never on what a machine, a worker or a Slurm allocation happens to
have: training and explanations on their model's ``recipe.cpu_threads``, every other work item
on its suite's (train/core/stage.py), the distances on one (evaluate/scoring/distances/base.py).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """torch on ``count`` CPU threads inside (None: as it is), the caller's count after."""
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
