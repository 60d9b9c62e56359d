"""Training k small models at once as one grouped network, against training them one after the
other: images per second per model, on this CPU, for a plain and an adversarial (PGD) step, and
for the input gradients of k models on the same images (what a saliency method computes).

    python evaluate/benchmarks/grouped_training.py                  # k = 1, 2, 4, 8, 16; 1 and 2 threads
    python evaluate/benchmarks/grouped_training.py --k 1 --k 4 --threads 1 --repeats 3

Three ways to run one SGD step of k models of the demo's architecture (small_resnet, 64 px,
batch 64, 10 classes), each model on its own batch:

- ``alone``: k models, one step each in turn (what the trainer does today, one model per process);
- ``grouped``: the grouped engine's network (train/grouped.py): convolutions with k groups
  (``groups=k``: model i's channels are group i), one BatchNorm over the k models' channels
  (per-channel statistics, so each model keeps its own), and a batched matrix product for the k
  output layers; the k batches enter side by side as channels, and the loss is the sum of the k
  models' mean losses, so each model's gradient is its own;
- ``vmap``: ``torch.func.stack_module_state`` with ``functional_call`` under ``vmap`` (its
  convolution rule batches the weights into a grouped convolution too).

The adversarial step runs the adversarial family's PGD (2 steps, L-inf 8/255: the demo's) before
the update, on each model alone or on the grouped network at once. The three run interleaved, so a
load on a shared machine falls on all of them; the figure is the median over ``--repeats``
interleaved rounds. Nothing is written. ``--profile`` prints where one model's step spends its time.

On a GPU (``--device cuda``) each timed call runs ``--steps`` steps and then waits for the GPU,
and ``--precision bf16`` runs each step under bf16 autocast, as the trainer does on CUDA:

    python evaluate/benchmarks/grouped_training.py --device cuda --precision fp32 --precision bf16
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
import statistics
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, stack_module_state
from torch.profiler import profile

from counteraudit.anomalies.families.adversarial import pgd, random_start
from counteraudit.evaluate.benchmarks import benchmark_parser, interleaved_seconds
from counteraudit.train.architectures import SmallResNet
from counteraudit.train.grouped import PerModelLogits, grouped_network
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.trainer import pick_device
from counteraudit.train.core.command_line import run_cli

ENGINES = ("alone", "grouped", "vmap")
STEPS = ("plain", "adversarial", "gradient")
PRECISIONS = ("fp32", "bf16")
EPS, PGD_STEPS = 8 / 255, 2


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("grouped training", __doc__, add_help)
    parser.add_argument("--k", type=int, action="append", default=None, metavar="K",
                        help="models per group (repeatable; default 1, 2, 4, 8, 16)")
    parser.add_argument("--threads", type=int, action="append", default=None, metavar="N",
                        help="intra-op threads (repeatable; default 1 and 2)")
    parser.add_argument("--engine", action="append", choices=ENGINES, default=None,
                        help="engines to time (repeatable; default all)")
    parser.add_argument("--step", action="append", choices=STEPS, default=None,
                        help="steps to time (repeatable; default all): a plain or an adversarial "
                             "training step, or the input gradient of every model on the same "
                             "images (what a saliency method computes, the models in eval mode)")
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda or cuda:N (on a GPU, --threads sets only the host's threads)")
    parser.add_argument("--precision", action="append", choices=PRECISIONS, default=None,
                        help="fp32, or bf16 autocast as the trainer's on CUDA and with cpu_bf16 "
                             "(repeatable; default fp32)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per timed call (default 1 on the CPU, 20 on a GPU, where one "
                             "small step is shorter than the wait for its result)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per model per step")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds")
    parser.add_argument("--profile", action="store_true",
                        help="also print torch.profiler's table of one model's plain step")
    return parser


# ---------------------------------------------------------------- the timed steps
def _sgd(parameters) -> torch.optim.SGD:
    return torch.optim.SGD(parameters, lr=0.01, momentum=0.9, weight_decay=1e-4)


def _step_functions(k: int, batch: int, size: int, kind: str, engines: list[str],
                    device: torch.device = torch.device("cpu"),
                    precision: str = "fp32") -> dict[str, Callable[[], None]]:
    """One step of each engine on k models: ``kind`` is "plain", "adversarial" (PGD, then the
    update) or "gradient" (every model's input gradient on the same images, no update)."""
    torch.manual_seed(0)
    models = [SmallResNet(10) for _ in range(k)]  # on the CPU: each engine moves its own copy
    images = [torch.rand(batch, 3, size, size).to(device) for _ in range(k)]
    labels = [torch.randint(0, 10, (batch,)).to(device) for _ in range(k)]
    if kind == "gradient":  # a saliency method's case: every model explains the same images
        images, labels = [images[0]] * k, [labels[0]] * k
        for model in models:
            model.eval()
    generator = torch.Generator().manual_seed(0)
    steps: dict[str, Callable[[], None]] = {}

    def attacked(model, x, y):
        if kind != "adversarial":
            return x
        model.eval()  # as the family's attack on a training model: BatchNorm untouched
        x = pgd(model, x, y, "linf", EPS, PGD_STEPS, 2.5 * EPS / PGD_STEPS, generator)
        model.train()
        return x

    def update(model, optimizer, x, y):
        if kind == "gradient":
            x = x.detach().requires_grad_(True)
            torch.autograd.grad(model(x).gather(1, y[:, None]).sum(), x)
            return
        x = attacked(model, x, y)
        optimizer.zero_grad(set_to_none=True)
        # grouped: the mean over k * B rows, times k, is the sum of the k models' mean losses,
        # so each model's gradient is its own
        (nn.functional.cross_entropy(model(x), y) * (len(y) // batch)).backward()
        optimizer.step()

    if "alone" in engines:
        alone = [m.to(device, memory_format=torch.channels_last) for m in copy.deepcopy(models)]
        optimizers = [_sgd(m.parameters()) for m in alone]
        inputs = [x.contiguous(memory_format=torch.channels_last) for x in images]

        def step_alone():
            for model, optimizer, x, y in zip(alone, optimizers, inputs, labels):
                update(model, optimizer, x, y)
        steps["alone"] = step_alone

    if "grouped" in engines:
        grouped = PerModelLogits(grouped_network(models)).to(device, memory_format=torch.channels_last)
        optimizer = _sgd(grouped.parameters())
        side_by_side = torch.cat(images, 1).contiguous(memory_format=torch.channels_last)
        interleaved = torch.stack(labels, 1).reshape(-1)  # row b * k + i: model i's image b
        steps["grouped"] = lambda: update(grouped, optimizer, side_by_side, interleaved)

    if "vmap" in engines:
        template = copy.deepcopy(models[0]).to("meta")
        parameters, buffers = stack_module_state([m.to(device) for m in copy.deepcopy(models)])
        optimizer = _sgd(list(parameters.values()))
        stacked, stacked_labels = torch.stack(images), torch.stack(labels)

        def loss(params, buffers, x, y):
            return nn.functional.cross_entropy(functional_call(template, (params, buffers), (x,)), y)

        def target_logits(params, buffers, x, y):
            return functional_call(template, (params, buffers), (x,)).gather(1, y[:, None]).sum()

        batched_loss = torch.vmap(loss)

        def step_vmap():
            if kind == "gradient":
                torch.vmap(torch.func.grad(target_logits, argnums=2))(
                    parameters, buffers, stacked, stacked_labels)
                return
            x = stacked
            if kind == "adversarial":  # PGD on every model at once: the summed losses' gradient
                delta = random_start(stacked.shape, "linf", EPS, generator).to(device)
                for _ in range(PGD_STEPS):
                    delta.requires_grad_(True)
                    grad, = torch.autograd.grad(batched_loss(parameters, buffers,
                                                             (stacked + delta).clamp(0, 1),
                                                             stacked_labels).sum(), delta)
                    delta = (delta.detach() + 2.5 * EPS / PGD_STEPS * grad.sign()).clamp(-EPS, EPS)
                x = (stacked + delta).clamp(0, 1)
            optimizer.zero_grad(set_to_none=True)
            batched_loss(parameters, buffers, x, stacked_labels).sum().backward()
            optimizer.step()
        steps["vmap"] = step_vmap
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())

    def under_autocast(step: Callable[[], None]) -> Callable[[], None]:
        def run():
            with autocast:
                step()
        return run
    return {name: under_autocast(step) for name, step in steps.items()}


def _repeated(step: Callable[[], None], count: int, device: torch.device) -> Callable[[], None]:
    """``count`` steps, then the wait for the device: a GPU runs asynchronously, and only the
    finished work counts."""
    def run():
        for _ in range(count):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return run


def measure(k: int, threads: int, batch: int, size: int, kind: str, repeats: int,
            engines: list[str], device: torch.device = torch.device("cpu"),
            precision: str = "fp32", steps: int = 1) -> dict[str, float]:
    """Images per second per model of each engine: the median over interleaved rounds."""
    torch.set_num_threads(threads)
    functions = _step_functions(k, batch, size, kind, engines, device, precision)
    seconds = interleaved_seconds({name: _repeated(step, steps, device)
                                   for name, step in functions.items()}, repeats)
    return {name: batch * steps / statistics.median(times) for name, times in seconds.items()}


def _profile(batch: int, size: int) -> None:
    torch.set_num_threads(1)
    step = _step_functions(1, batch, size, "plain", ["alone"])["alone"]
    step()
    with profile() as profiler:
        for _ in range(3):
            step()
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


def main(args: argparse.Namespace) -> None:
    device = pick_device(args.device)
    gpu = device.type == "cuda"
    # on a GPU the host's threads only launch kernels: one setting, not a sweep
    ks, threads = args.k or [1, 2, 4, 8, 16], args.threads or ([1] if gpu else [1, 2])
    engines = args.engine or list(ENGINES)
    steps = args.steps or (20 if gpu else 1)
    where = f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}" if gpu \
        else f"CPU: {cpu_model()}"
    print(f"{where}; small_resnet, batch {args.batch_size} per model, {args.image_size} px, "
          f"{steps} step(s) per timed call, median of {args.repeats} interleaved rounds")
    print("images/s per model (ratio: grouped or vmap / alone)")
    for precision in args.precision or ["fp32"]:
        for kind in args.step or list(STEPS):
            for thread_count in threads:
                for k in ks:
                    rates = measure(k, thread_count, args.batch_size, args.image_size, kind,
                                    args.repeats, engines, device, precision, steps)
                    cells = "  ".join(
                        f"{name} {rate:7.1f}" + (f" ({rate / rates['alone']:.2f}x)"
                                                 if name != "alone" and "alone" in rates else "")
                        for name, rate in rates.items())
                    print(f"{precision} {kind:11s} threads={thread_count} k={k:2d}: {cells}",
                          flush=True)
    if args.profile:
        _profile(args.batch_size, args.image_size)


if __name__ == "__main__":
    run_cli(main, get_args_parser())
