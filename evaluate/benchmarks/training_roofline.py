"""Where one training step of the demo's model spends its time, against what this CPU core can do:
how far the trainer is from its ceiling, so a speed target is set against a measured bound.

    python evaluate/benchmarks/training_roofline.py                 # the demo's step, one thread
    python evaluate/benchmarks/training_roofline.py --batch-size 128 --threads 2

One SGD step of small_resnet (channels_last, as train/trainer.py trains it; batch 64, 64 px, 10
classes: the demo's) runs under torch.profiler, and its operators fall into classes: convolutions
(forward and backward), batch norm (forward and backward), the other elementwise ops and the
optimizer, the rest. ``FlopCounterMode`` counts the step's floating-point operations (2 per
multiply-add), nearly all in convolutions. Two ceilings of this core are measured in the same
process and numeric mode:

- compute: a wide 3x3 convolution (64 channels in and out, 32x32, batch 32), forward and backward,
  which oneDNN runs near the core's FMA peak;
- memory: copying a 64 MiB tensor (read once, written once), in GB/s.

The step's convolutions are then rated as a share of the compute ceiling, and its batch norms in
"copies": how many times a copy of every tensor they normalise their time would buy. The
printed ceiling is the step's images/s if its convolutions ran at the compute ceiling and
everything else cost nothing, so a speed-up beyond it needs fewer operations (a smaller world, fewer
epochs, another model: a change of protocol), not faster kernels. Nothing is written.

The step is measured with its memory reused, as the trainer's long-running process mostly reuses
it: in this short-lived process glibc malloc's default thresholds hand each step's activations
back to the kernel, which faults them in again (7,000-20,000 minor page faults a step on the demo's
step, making it 1.1-1.5x slower, inside whichever operator first writes a fresh tensor: mostly batch norm
and ReLU), while the trainer under the same defaults faulted 2,000-4,000 times a step, averaged
over its whole process, and ran its epoch at the reused-memory step's speed. So this process fixes
malloc's thresholds (``mallopt``, glibc only); ``--glibc-malloc-defaults`` measures the faulting
step instead. The median step's page faults are printed: a mean of a few steps would count a
one-off growth of the heap as every step's.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import ctypes
import platform
import resource
import statistics
from collections.abc import Callable

import torch
from torch import nn
from torch.profiler import profile
from torch.utils.flop_counter import FlopCounterMode

from counteraudit.evaluate.benchmarks import benchmark_parser, interleaved_seconds
from counteraudit.train.architectures import SmallResNet
from counteraudit.train.core import numerics
from counteraudit.train.core.command_line import run_cli

# Operator classes, by the aten names the profiler reports (self time, so nothing counts twice).
OPERATOR_CLASSES = {
    "convolution": ("aten::mkldnn_convolution", "aten::convolution_backward",
                    "aten::_convolution", "aten::convolution", "aten::conv2d"),
    "batch norm": ("aten::native_batch_norm", "aten::native_batch_norm_backward",
                   "aten::_batch_norm_impl_index", "aten::batch_norm"),
    "elementwise and optimizer": ("aten::relu_", "aten::relu", "aten::threshold_backward",
                                  "aten::add_", "aten::add", "aten::mul_", "aten::clamp_min_",
                                  "aten::_foreach_add_", "aten::_foreach_mul_", "aten::addcmul_"),
}
COPY_BYTES = 64 * 2 ** 20
# mallopt's parameters (glibc's malloc.h) and the values that keep a step's activations in the
# process: blocks up to 32 MiB (glibc's largest mmap threshold) from the heap, freed memory up to
# 256 MiB kept at its top.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 256 << 20


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("training roofline", __doc__, add_help)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--repeats", type=int, default=9,
                        help="timed calls of each measurement (the median is reported)")
    parser.add_argument("--glibc-malloc-defaults", action="store_true",
                        help="keep glibc malloc's default thresholds: each step's activations "
                             "are faulted in afresh (see above)")
    return parser


def reuse_freed_memory() -> bool:
    """Fix glibc malloc's thresholds so this process keeps the memory a step frees; whether it
    could (glibc only)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def page_faults_per_call(function: Callable[[], object], calls: int = 5) -> float:
    """Minor page faults (fresh pages the kernel zeroed) of the median call of ``calls``, after a
    warm-up call."""
    function()
    faults = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        function()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(faults)


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    """The median of ``repeats`` timed calls, after a warm-up call."""
    return statistics.median(interleaved_seconds({"call": function}, repeats)["call"])


def training_step(batch: int, size: int) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """One SGD step of the demo's model as the trainer takes it (taken once), and every tensor its
    batch norms normalise (recorded by a forward hook, for their sizes)."""
    torch.manual_seed(0)
    model = SmallResNet(10).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    images = torch.rand(batch, 3, size, size).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch,))
    normalised: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, inputs, _out: normalised.append(inputs[0]))
             for m in model.modules() if isinstance(m, nn.BatchNorm2d)]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()

    step()
    for hook in hooks:
        hook.remove()
    return step, normalised


def step_flops(step: Callable[[], None]) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def seconds_by_class(step: Callable[[], None], steps: int = 3) -> dict[str, float]:
    """Self CPU seconds per operator class over one step (the mean of ``steps`` profiled)."""
    with profile() as profiler:
        for _ in range(steps):
            step()
    totals = dict.fromkeys([*OPERATOR_CLASSES, "other"], 0.0)
    for event in profiler.key_averages():
        kind = next((name for name, ops in OPERATOR_CLASSES.items() if event.key in ops), "other")
        totals[kind] += event.self_cpu_time_total / 1e6 / steps
    return totals


def convolution_ceiling(repeats: int) -> float:
    """FLOP/s of a wide 3x3 convolution's forward and backward: this core's practical peak."""
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).to(memory_format=torch.channels_last)
    inputs = torch.rand(32, 64, 32, 32).contiguous(memory_format=torch.channels_last)
    inputs.requires_grad_(True)

    def forward_backward() -> None:
        conv(inputs).sum().backward()

    return step_flops(forward_backward) / median_seconds(forward_backward, repeats)


def copy_bandwidth(repeats: int) -> float:
    """Bytes/s of copying a large tensor (each byte read once and written once)."""
    source = torch.rand(COPY_BYTES // 4)
    target = torch.empty_like(source)
    return 2 * COPY_BYTES / median_seconds(lambda: target.copy_(source), repeats)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    memory = "glibc malloc's defaults" if args.glibc_malloc_defaults else (
        "memory reused" if reuse_freed_memory() else "memory reuse unavailable (not glibc)")
    step, normalised = training_step(args.batch_size, args.image_size)
    flops = step_flops(step)
    seconds = median_seconds(step, args.repeats)
    faults = page_faults_per_call(step)
    shares = seconds_by_class(step)
    profiled = sum(shares.values())
    peak = convolution_ceiling(args.repeats)
    bandwidth = copy_bandwidth(args.repeats)
    normalised_bytes = sum(t.numel() * t.element_size() for t in normalised)
    print(f"CPU: {numerics.cpu_model()}; numerics {numerics.requested_mode()}; torch "
          f"{torch.__version__}; {args.threads} thread(s); {memory}")
    print(f"step: small_resnet, batch {args.batch_size}, {args.image_size} px: {seconds * 1e3:.1f} "
          f"ms, {args.batch_size / seconds:.0f} images/s, {flops / 1e9:.2f} GFLOP "
          f"({flops / args.batch_size / 3e6:.1f} MFLOP per image forward), {faults:.0f} page "
          "faults (the median step)")
    for kind, spent in shares.items():
        print(f"  {kind:26s} {spent * 1e3:6.1f} ms  {spent / profiled:5.1%} of the profiled step")
    convolution = shares["convolution"]
    print(f"compute ceiling (a 64-channel 3x3 convolution, forward and backward): "
          f"{peak / 1e9:.1f} GFLOP/s; the step's convolutions run at "
          f"{flops / convolution / 1e9:.1f} GFLOP/s, {flops / convolution / peak:.0%} of it")
    batch_norm = shares["batch norm"]
    copy_seconds = 2 * normalised_bytes / bandwidth
    print(f"memory: copy {bandwidth / 1e9:.1f} GB/s; the batch norms normalise "
          f"{normalised_bytes / 2 ** 20:.0f} MiB a step and take {batch_norm * 1e3:.1f} ms, "
          f"{batch_norm / copy_seconds:.1f} copies of it")
    ceiling = args.batch_size / (flops / peak)
    print(f"ceiling: {ceiling:.0f} images/s if the convolutions ran at the compute ceiling and "
          f"nothing else cost anything ({ceiling * seconds / args.batch_size:.2f}x this step)")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
