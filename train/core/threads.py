"""The CPU threads torch computes on, which are part of what a result is.

oneDNN, MKL and ATen split a convolution, a product or a sum by the thread count, each split
rounding its own way: a model's logits on 3 threads were not those on 1, 2 or 8, and lpips-vgg's
distances differed on every count from 2 to 32. NumPy's OpenBLAS does too (a float32 product and
scikit-learn's PCA differed on each of 1, 2, 3, 4 and 8 threads), and so does scikit-learn's
OpenMP (2-means on 1 thread against 2 or more). So every computation whose result is stored runs
on a count the suite fixes, never on what a machine, a worker or a Slurm allocation happens to
have: every work item on its suite's ``recipe.cpu_threads`` (``compute_threads``, in
train/core/stage.py), training and explanations inside it on their model's, the distances on
one (evaluate/scoring/distances/base.py). Outside work items, NumPy's BLAS runs on one thread
in every process (train/core/numerics.py, ``OPENBLAS_NUM_THREADS``).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits


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


@contextmanager
def compute_threads(count: int) -> Iterator[None]:
    """torch, and the BLAS and OpenMP pools of NumPy, SciPy and scikit-learn, on ``count``
    threads inside; the caller's counts after."""
    with threadpool_limits(limits=count), torch_threads(count):
        yield
