"""Before CPU training: is the suite's precision (``recipe.cpu_bf16``) much slower on this CPU?

The precision is part of every model's key (bf16 autocast changes the weights), so the suite fixes
it and the same suite gives the same models on every machine. Its speed, though, is a property of
the CPU: with one thread, the small ResNet at 64 px and batch 64 trained no faster in bf16 than in
fp32 on an Intel Xeon, 1.37x faster on an AMD EPYC, and a CPU that emulates bf16 runs it far
slower. CPU flags (avx512_bf16, amx_bf16) do not predict which, so this module measures: a short
timed probe runs the trainer's step (forward, cross-entropy, backward, SGD step, channels_last) in
fp32 and under bf16 autocast, for the suite's architecture, image size, batch (at most 64) and
threads, on random inputs. Where the suite's choice is more than ``MUCH_SLOWER`` times slower than
the other, the run says so once, with the figures and how to switch (a different model key, so
different models and a retrain). It never changes what is trained.

The figures are cached in ``<runs root>/store/cpu-probe/<key>.json``, keyed by all they depend on
(CPU model, torch version, architecture, image size, batch, threads), so a CPU is probed once.

``COUNTERAUDIT_CPU_PROBE=off`` (or ``0``, ``false``, ``no``) skips the probe: nothing is measured
and nothing said.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any

import torch
from torch import nn

from counteraudit.train.architectures import build_model
from counteraudit.train.core.artifacts import atomic_write_json, inside_runs, read_json, stable_hash, store_dir
from counteraudit.train.core import numerics
from counteraudit.train.core.registries import WORLDS
from counteraudit.train.core.threads import torch_threads

# Warn when the other precision trains more than this many times faster. Not lower: on one AMD
# EPYC the probe's fp32 figure alone varied 640-890 images/s from run to run (bf16 1085-1180), so
# a 1.5 threshold would warn on some runs and not others; a CPU that emulates bf16 is far past 2.
MUCH_SLOWER = 2.0
PROBE_BATCH = 64       # at most this batch: enough to time the kernels the training step runs
PROBE_VERSION = 1      # part of the cache key: bump when the probe's step changes
ENV_VAR = "COUNTERAUDIT_CPU_PROBE"
_WARNED: set[tuple[str, str]] = set()  # (suite name, cache key): say it once per process


def measure_precisions(architecture: str, num_classes: int, image_size: int, batch_size: int,
                       threads: int, steps: int = 5, max_seconds: float = 20.0) -> dict[str, Any]:
    """Training images/s of fp32 and of bf16 autocast on this CPU, for the trainer's step.

    One warm-up step per precision (first-call kernel setup), then up to ``steps`` timed rounds,
    each one fp32 step and one bf16 step, so a load on a shared machine falls on both sides; each
    precision's figure is its fastest step. Stops early after ``max_seconds`` of timed rounds (a
    large model on a slow CPU), with at least one round. The caller's RNG and threads are kept.
    """
    with torch_threads(threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        images = torch.rand(batch_size, 3, image_size, image_size).contiguous(
            memory_format=torch.channels_last)
        labels = torch.randint(num_classes, (batch_size,))
        precisions = {"fp32": contextlib.nullcontext,
                      "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
        steps_of = {name: _training_step(architecture, num_classes, images, labels, autocast)
                    for name, autocast in precisions.items()}
        for step in steps_of.values():
            step()  # warm-up
        best = {name: math.inf for name in steps_of}
        started = time.perf_counter()
        for _ in range(steps):
            for name, step in steps_of.items():
                tic = time.perf_counter()
                step()
                best[name] = min(best[name], time.perf_counter() - tic)
            if time.perf_counter() - started > max_seconds:
                break
    return {"fp32_images_per_second": batch_size / best["fp32"],
            "bf16_images_per_second": batch_size / best["bf16"],
            "architecture": architecture, "num_classes": num_classes, "image_size": image_size,
            "batch_size": batch_size, "threads": threads, "cpu": numerics.cpu_model(),
            "torch": torch.__version__}


def _training_step(architecture, num_classes, images, labels, autocast):
    """The trainer's step (train/trainer.py train_one_step) on one fixed batch, as a closure."""
    # Normalisation constants only condition the inputs; they do not change the step's cost.
    model = build_model(architecture, num_classes, (0.5,) * 3, (0.25,) * 3)
    model = model.to(memory_format=torch.channels_last).train()
    # A small learning rate: a few steps on random labels must not diverge into NaNs or
    # denormals, which would time something other than training.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(model(images).float(), labels)
        loss.backward()
        optimizer.step()
    return step


def _probe_settings(suite) -> dict[str, Any]:
    """What the figures depend on, read from the suite without building its world (building the
    ImageNet world lists every image)."""
    world_class = WORLDS.get(suite.world.get("name", "synthetic"))
    # Worlds whose classes are fixed (synthetic) name them on the class; otherwise (ImageNet reads
    # its class folders) 10: the class count only sizes the last linear layer, a negligible share
    # of a step's cost.
    class_names = getattr(world_class, "class_names", None)
    return {"architecture": suite.architecture, "num_classes": len(class_names or ()) or 10,
            "image_size": int(suite.world.get("image_size", world_class.default_image_size)),
            "batch_size": min(suite.recipe.batch_size, PROBE_BATCH),
            "threads": suite.recipe.cpu_threads}


def _valid(figures: Any) -> bool:
    return isinstance(figures, dict) and all(
        isinstance(figures.get(k), (int, float)) and 0 < figures[k] < math.inf
        for k in ("fp32_images_per_second", "bf16_images_per_second"))


def check_cpu_precision(suite, runs_root: str | os.PathLike | None = None,
                        device: str | torch.device | None = "cpu") -> str | None:
    """The warning, when the suite's CPU precision trains more than ``MUCH_SLOWER`` times slower
    here than the other precision; else None. Printed the first time in a process (per suite and
    probe key), returned every time. None without measuring on a GPU or with $COUNTERAUDIT_CPU_PROBE
    off. Device None: the trainer's default (CUDA if available)."""
    if os.environ.get(ENV_VAR, "").strip().lower() in {"off", "0", "false", "no"}:
        return None
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type != "cpu":
        return None
    settings = _probe_settings(suite)
    cache_key = stable_hash({"cpu": numerics.cpu_model(), "torch": torch.__version__,
                             "version": PROBE_VERSION, **settings})
    # checked before the read below, whose errors mean "measure again"
    cache = inside_runs(store_dir(runs_root) / "cpu-probe" / f"{cache_key}.json")
    try:
        figures = read_json(cache)
    except (OSError, ValueError):  # missing, or corrupt (ValueError covers JSON and UTF-8 errors)
        figures = None
    if not _valid(figures):
        figures = measure_precisions(**settings)
        atomic_write_json(cache, figures)

    bf16, fp32 = figures["bf16_images_per_second"], figures["fp32_images_per_second"]
    chosen, other = ("bf16", "fp32") if suite.recipe.cpu_bf16 else ("fp32", "bf16")
    speed = {"bf16": bf16, "fp32": fp32}
    ratio = speed[other] / speed[chosen]
    if ratio <= MUCH_SLOWER:
        return None
    switch = "false" if suite.recipe.cpu_bf16 else "true"
    s = settings
    warning = (
        f"[train] CPU precision: suite {suite.name!r} trains in {chosen} (cpu_bf16 = "
        f"{str(suite.recipe.cpu_bf16).lower()}), but on this CPU ({figures.get('cpu', 'unknown')}) "
        f"bf16 trains {bf16:.0f} images/s and fp32 {fp32:.0f} images/s: {chosen} is {ratio:.1f}x "
        f"slower ({s['architecture']}, {s['image_size']} px, batch {s['batch_size']}, "
        f"{s['threads']} thread(s); figures in {cache}). To train in {other}, set cpu_bf16 = "
        f"{switch} in the suite's [recipe] (a different model key: different models, trained "
        f"anew); this run trains the suite's models as specified.")
    if (suite.name, cache_key) not in _WARNED:
        _WARNED.add((suite.name, cache_key))
        print(warning, flush=True)
    return warning
