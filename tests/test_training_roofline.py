"""The training roofline benchmark (evaluate/benchmarks/training_roofline.py) names the operators
torch's profiler reports for the trainer's step, so its shares are the step's, not "other"."""
from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from torch.profiler import profile

from counteraudit.evaluate.benchmarks.training_roofline import (OPERATOR_CLASSES, seconds_by_class,
                                                                 step_flops, training_step)

SCRIPT = Path(__file__).resolve().parents[1] / "evaluate" / "benchmarks" / "training_roofline.py"


def test_the_steps_kernels_fall_in_their_classes_and_its_flops_are_the_models():
    step, normalised = training_step(batch=4, size=32)
    with profile() as profiler:
        step()
    reported = {event.key for event in profiler.key_averages()}
    # A torch that renamed the kernels doing the work would move them to "other", and the table
    # would say nothing: each class's main kernels must be among what the profiler reports.
    for kind, kernels in {"convolution": ("aten::mkldnn_convolution", "aten::convolution_backward"),
                          "batch norm": ("aten::native_batch_norm",
                                         "aten::native_batch_norm_backward"),
                          "elementwise and optimizer": ("aten::threshold_backward",)}.items():
        for kernel in kernels:
            assert kernel in reported and kernel in OPERATOR_CLASSES[kind], (kernel, sorted(reported))
    shares = seconds_by_class(step, steps=1)
    assert all(shares[kind] > 0 for kind in OPERATOR_CLASSES), shares
    # small_resnet's forward is 20.7 MFLOP a 64-px image (train/architectures.py), so a 32-px one
    # a quarter of it; a training step (forward, input and weight gradients) about three times that.
    per_image = step_flops(step) / 4
    assert 3 * 20.7e6 / 4 * 0.9 < per_image < 3 * 20.7e6 / 4 * 1.1, per_image
    # every BatchNorm2d of the model, once each: the stem's and three per block of the 7, and each
    # stage's downsampling
    assert len(normalised) == 1 + 3 * 7 + 4


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")
def test_the_step_is_timed_with_its_memory_reused_as_the_trainer_reuses_it():
    # glibc's defaults give a short-lived process's activations back to the kernel each step,
    # which faults them in again: a step the trainer's long-running process does not take. At the
    # demo's batch of 64 (the default) glibc faulted 7,000-24,000 pages a step in every run. Memory
    # reused, the median step faulted none on the AVX-512 EPYC, and on the AVX2-only one none or,
    # in one process of six, a steady 1,024 (4 MiB a step) against the defaults' 17,400-24,200
    # there: a breakage leaves the two alike.
    def printed(*options: str) -> tuple[str, int]:
        done = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1", *options],
                              capture_output=True, text=True, check=True)
        header = next(line for line in done.stdout.splitlines() if line.startswith("CPU:"))
        step = next(line for line in done.stdout.splitlines() if line.startswith("step:"))
        return header, int(re.search(r"(\d+) page faults", step).group(1))

    header, reused = printed()
    assert header.endswith("memory reused"), header
    header, defaults = printed("--glibc-malloc-defaults")
    assert header.endswith("glibc malloc's defaults") and defaults > 5000, (header, defaults)
    assert reused < defaults / 4, (reused, defaults)
