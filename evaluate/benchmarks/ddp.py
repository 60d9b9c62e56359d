"""The trainer's step with and without DistributedDataParallel, per process, and the all-reduce of
a model's gradients alone: what several processes per model (``--gpus-per-node N``) cost.

    torchrun --nproc-per-node 1 evaluate/benchmarks/ddp.py --device cuda      # NCCL, one GPU
    torchrun --nproc-per-node 4 evaluate/benchmarks/ddp.py --device cuda      # NCCL, 4 GPUs
    python evaluate/benchmarks/ddp.py --nproc 2                               # gloo, 2 CPU processes
    python evaluate/benchmarks/ddp.py --device cuda --architecture resnet50 --image-size 224 \\
        --batch-size 300 --num-classes 1000                                   # the paper's step

Each process trains its own copy of the model on its own batch of ``--batch-size`` images (a
slice of the global batch, as the trainer gives each process): channels_last, SGD with momentum,
bf16 autocast on CUDA as the trainer's (``--precision``), and for ``--step adversarial`` the
adversarial family's L-inf PGD (``--pgd-steps``, eps 8/255) before the update, under the same
autocast. Timed, as medians of ``--repeats`` interleaved rounds of ``--steps`` steps (rank 0's):

- ``plain``: the model alone;
- ``ddp``: the model wrapped in DistributedDataParallel, whose gradient buckets are all-reduced
  over the process group during the backward pass, as the trainer wraps it;
- ``all-reduce``: ``torch.distributed.all_reduce`` of one flat tensor the size of the model's
  gradients (fp32), alone; NCCL's bus bandwidth is its size x 2(n-1)/n per second;
- ``pgd-start`` (adversarial steps): PGD's random start drawn on the host as the family draws it,
  alone, and its share of the step.

The process group is the trainer's (slurm/distributed.py: env:// from torchrun's or Slurm's
variables; NCCL on GPUs, gloo on CPUs). One process is a group of one here, made by the benchmark,
where the trainer makes none and never wraps the model: DDP's hooks and the backend's calls are
then still paid, and the figure is their overhead. ``--nproc N`` starts N local processes itself
(gloo on the CPU, or one per GPU). Nothing is written.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import contextlib
import copy
import os
import socket
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from counteraudit.anomalies.families.adversarial import pgd, random_start
from counteraudit.evaluate.benchmarks import benchmark_parser, interleaved_seconds
from counteraudit.slurm.distributed import cleanup_distributed, init_distributed
from counteraudit.train.architectures import build_model
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.core.registries import ARCHITECTURES

EPS = 8 / 255


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("DistributedDataParallel", __doc__, add_help)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per process and NCCL; cpu: gloo")
    parser.add_argument("--nproc", type=int, default=None,
                        help="start this many local processes (without torchrun; default 1)")
    parser.add_argument("--architecture", default="small_resnet",
                        help="a registered architecture (small_resnet: the demo's; resnet50: the paper's)")
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64, help="images per process per step")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                        help="default: bf16 autocast on CUDA, fp32 on the CPU (the trainer's)")
    parser.add_argument("--step", choices=("plain", "adversarial"), default="plain")
    parser.add_argument("--pgd-steps", type=int, default=3,
                        help="PGD steps of an adversarial step (3: the paper suite's)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per timed call (default 10 on a GPU, 1 on the CPU)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed rounds")
    return parser


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _training_step(net: nn.Module, model: nn.Module, args, device: torch.device,
                   autocast) -> Callable[[], None]:
    """``--steps`` steps of ``net`` (the model, or its DDP wrapper) on one fixed batch."""
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    images = torch.rand(args.batch_size, 3, args.image_size, args.image_size, generator=generator)
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, args.num_classes, (args.batch_size,), generator=generator).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    def step():
        for _ in range(args.steps):
            with autocast:
                x = images
                if args.step == "adversarial":  # on the model itself: no gradient to all-reduce
                    model.eval()
                    x = pgd(model, images, labels, "linf", EPS, args.pgd_steps,
                            2.5 * EPS / args.pgd_steps, generator)
                    model.train()
                loss = nn.functional.cross_entropy(net(x), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        _synchronize(device)
    return step


def _all_reduce(model: nn.Module, device: torch.device, steps: int) -> tuple[Callable[[], None], int]:
    flat = torch.ones(sum(p.numel() for p in model.parameters()), device=device)

    def reduce():
        for _ in range(steps):
            dist.all_reduce(flat)
        _synchronize(device)
    return reduce, flat.numel() * flat.element_size()


def _pgd_start(args) -> Callable[[], None]:
    """The part of an adversarial step spent on the host: PGD's random start for the whole
    batch, drawn on the CPU as the adversarial family's pgd draws it."""
    generator = torch.Generator().manual_seed(0)
    shape = (args.batch_size, 3, args.image_size, args.image_size)

    def draw():
        for _ in range(args.steps):
            random_start(shape, "linf", EPS, generator)
    return draw


def measure(args: argparse.Namespace) -> dict[str, float] | None:
    """Rank 0's figures: images/s per process of each step, and the all-reduce's seconds."""
    context = init_distributed(backend="nccl" if args.device == "cuda" else "gloo")
    if not dist.is_initialized():  # one process: a group of one, so DDP's costs are paid
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="env://",
                                rank=0, world_size=1)
    try:
        device = context.device if args.device == "cuda" else torch.device("cpu")
        if args.device == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))
        torch.manual_seed(0)
        model = build_model(args.architecture, args.num_classes, (0.5,) * 3, (0.25,) * 3)
        model = model.to(device).to(memory_format=torch.channels_last).train()
        wrapped_model = copy.deepcopy(model)
        ddp = nn.parallel.DistributedDataParallel(
            wrapped_model, device_ids=[device.index] if device.type == "cuda" else None)
        bf16 = (args.precision or ("bf16" if device.type == "cuda" else "fp32")) == "bf16"
        autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if bf16
                    else contextlib.nullcontext())
        reduce, nbytes = _all_reduce(model, device, args.steps)
        timed = {"plain": _training_step(model, model, args, device, autocast),
                 "ddp": _training_step(ddp, wrapped_model, args, device, autocast),
                 "all-reduce": reduce}
        if args.step == "adversarial":
            timed["pgd-start"] = _pgd_start(args)
        seconds = interleaved_seconds(timed, args.repeats)
        medians = {name: statistics.median(times) / args.steps for name, times in seconds.items()}
        figures = {"plain": args.batch_size / medians["plain"], "ddp": args.batch_size / medians["ddp"],
                   "all_reduce_seconds": medians["all-reduce"], "gradient_bytes": nbytes,
                   "world_size": dist.get_world_size(), "backend": str(dist.get_backend()),
                   "pgd_start_seconds": medians.get("pgd-start"),
                   "precision": "bf16" if bf16 else "fp32",
                   "where": (f"GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda"
                             else f"CPU: {cpu_model()}")}
        return figures if dist.get_rank() == 0 else None
    finally:
        cleanup_distributed()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _measure_and_report(args: argparse.Namespace) -> None:
    figures = measure(args)
    if figures is not None:  # rank 0 reports
        report(figures, args)


def _local_process(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _measure_and_report(args)


def report(figures: dict, args: argparse.Namespace) -> None:
    n = figures["world_size"]
    seconds = figures["all_reduce_seconds"]
    bus = (f"bus bandwidth {figures['gradient_bytes'] * 2 * (n - 1) / n / seconds / 1e9:.1f} GB/s"
           if n > 1 else "one process: nothing crosses a link")
    print(f"{figures['where']}; torch {torch.__version__}; {args.architecture}, "
          f"{args.image_size} px, batch {args.batch_size} per process, {figures['precision']}, "
          f"{args.step} step; {n} process(es), {figures['backend']}; median of {args.repeats} "
          f"rounds of {args.steps} steps")
    print(f"  images/s per process: plain {figures['plain']:.1f}, ddp {figures['ddp']:.1f} "
          f"({figures['ddp'] / figures['plain']:.3f}x); all processes with ddp: "
          f"{figures['ddp'] * n:.1f}")
    print(f"  all-reduce of the gradients ({figures['gradient_bytes'] / 1e6:.1f} MB fp32): "
          f"{seconds * 1e3:.3f} ms, {bus}", flush=True)
    if figures["pgd_start_seconds"] is not None:
        step = args.batch_size / figures["ddp"]
        print(f"  PGD's random start drawn on the host, alone: {figures['pgd_start_seconds'] * 1e3:.1f} ms "
              f"a step ({figures['pgd_start_seconds'] / step:.0%} of the ddp step's {step * 1e3:.1f} ms)",
              flush=True)


def main(args: argparse.Namespace) -> None:
    if args.architecture not in ARCHITECTURES:
        raise ValueError(f"--architecture {args.architecture!r} is not registered; choose one "
                         f"of {', '.join(ARCHITECTURES.names())}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU on this machine; use --device cpu")
    args.steps = args.steps or (10 if args.device == "cuda" else 1)
    under_launcher = all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                         "MASTER_PORT"))
    if under_launcher:
        _measure_and_report(args)
        return
    world_size = args.nproc or 1
    if args.device == "cuda" and world_size > torch.cuda.device_count():
        raise ValueError(f"--nproc {world_size}: NCCL needs one GPU per process and this machine "
                         f"has {torch.cuda.device_count()}")
    mp.start_processes(_local_process, args=(world_size, _free_port(), args), nprocs=world_size,
                       start_method="spawn")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
