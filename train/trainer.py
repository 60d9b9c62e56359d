"""Train one model spec: seeded, checkpointed every epoch, resumable to the same bits.

Every random choice derives from (spec.seed, purpose, epoch): weight init, batch order, flips, and
the anomaly family's per-batch draws. An interrupted run that resumes from its last checkpoint
therefore replays exactly the batches the uninterrupted run would have seen, and ends with the
same weights (on CPU, bit for bit).

Distributed: when torch.distributed is initialised with several processes (train/stage.py's
train_one sets it up from submitit's environment in a multi-task Slurm job), every process draws
the same global batch order and loads, augments, changes (poison, noise, PGD) and trains on only
its own contiguous slice of each batch (``tensor_split``'s cut: sizes differ by at most one image)
under DistributedDataParallel. Each image's augmentation comes from the image, and a family draws
its per-batch randomness for the global batch and applies the rows it holds, so the slices are
exactly the rows one process would have made. DDP averages the slices' gradients, so N
processes equal one process that sums the N slices' mean losses divided by N, which is what
``emulate_processes=N`` does on one device (slice by slice: the family, PGD included, sees each
slice alone, as each process does). It is not the same as one process on the whole batch:
BatchNorm normalizes each slice with that slice's own statistics. The running statistics saved are
rank 0's (DDP broadcasts rank 0's buffers to the others before every forward), so the emulation
keeps the running-statistics update of slice 0 only and the saved state matches too.
"""
from __future__ import annotations

import contextlib
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from counteraudit.train.architectures import Classifier, build_model
from counteraudit.train.core.artifacts import atomic_write_json, derive_seed
from counteraudit.train.checkpoint import (CHECKPOINT_EVERY_EPOCHS, CHECKPOINT_NAME, METRICS_NAME,
                                           SPEC_NAME, WEIGHTS_NAME, is_trained,
                                           load_backbone_weights, load_training_state,
                                           load_weights_only, read_metrics, save_trained_model,
                                           save_training_state, training_lock)
from counteraudit.train.core.suite import ModelSpec
from counteraudit.train.worlds import Batch, World, build_world


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} was requested but CUDA is not available on this "
                             "machine; use --device cpu")
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_family(spec: ModelSpec, world: World):
    if spec.is_reference:
        return None
    from counteraudit.anomalies import FAMILIES
    return FAMILIES.get(spec.family)(spec.params, world, spec.seed)


def output_classes(spec: ModelSpec, world: World) -> list[int] | None:
    """The classes a spec's output layer has (None: every class of the world)."""
    family = build_family(spec, world)
    return None if family is None else family.output_classes()


def new_model(spec: ModelSpec, world: World) -> Classifier:
    torch.manual_seed(derive_seed(spec.seed, "init"))
    return build_model(spec.architecture, world.num_classes, world.mean, world.std,
                       output_classes(spec, world))


def load_trained_model(directory: Path, spec: ModelSpec, world: World,
                       device: str | torch.device = "cpu") -> Classifier:
    """The trained model of a spec, in eval mode (what explanations and verification use)."""
    if not is_trained(directory):
        raise FileNotFoundError(f"model {spec.name} is not trained yet (no {directory / METRICS_NAME});"
                                " run: python train/train.py --model " + spec.name)
    model = build_model(spec.architecture, world.num_classes, world.mean, world.std,
                        output_classes(spec, world))
    model.backbone.load_state_dict(load_weights_only(directory / WEIGHTS_NAME))
    # channels_last, as in training: on one CPU core the small ResNet's eval forward runs 1.3x
    # faster in it at batch 100, and 2x at batch 500 (evaluate/benchmarks/explain-style timing, 64 px).
    return model.to(device).to(memory_format=torch.channels_last).eval()


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, images_or_split, labels=None, batch_size: int = 500,
                      device: torch.device | str = "cpu") -> dict[str, Any]:
    """Top-1 accuracy and per-class accuracy on a split (or on an (images, labels) pair)."""
    model.eval()
    predictions, truths = [], []
    if labels is None:
        batches = ((b.images, b.labels) for b in images_or_split.eval_batches(batch_size))
    else:
        batches = ((images_or_split[i:i + batch_size], labels[i:i + batch_size])
                   for i in range(0, len(labels), batch_size))
    for images, target in batches:
        predictions.append(model(images.to(device)).argmax(1).cpu())
        truths.append(torch.as_tensor(target))
    pred, truth = torch.cat(predictions), torch.cat(truths)
    per_class = {int(c): float((pred[truth == c] == c).float().mean()) for c in truth.unique()}
    return {"accuracy": float((pred == truth).float().mean()), "per_class_accuracy": per_class,
            "count": int(len(truth))}


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train_model(spec: ModelSpec, directory: str | Path, world: World | None = None,
                device: str | torch.device | None = None, progress: bool = True,
                stop_after_epoch: int | None = None, runs_root: str | Path | None = None,
                emulate_processes: int = 1) -> dict[str, Any]:
    """Train (or resume, or load externally) one model; return its metrics.

    Does nothing but read the metrics when the model is already trained. ``stop_after_epoch``
    ends the run after that epoch's checkpoint, as an interruption would (used by tests).
    ``emulate_processes=N`` reproduces, in this one process, a DistributedDataParallel run with N
    processes (e.g. an 8-GPU Slurm job on one GPU): each batch is cut into the same N slices, their
    gradients accumulated as DDP averages them, BatchNorm statistics kept per slice as DDP keeps
    them per process (module docstring). Default 1: the ordinary run. Not part of the model's key,
    like the number of processes of a real DDP run.
    """
    directory = Path(directory)
    if is_trained(directory):
        return read_metrics(directory)
    if type(emulate_processes) is not int or emulate_processes < 1:
        raise ValueError(f"emulate_processes={emulate_processes!r} must be a whole number >= 1")
    device = pick_device(str(device) if device is not None else None)
    # One process trains a model at a time (two suites' runs may need it at once); the ranks of
    # one distributed run train it together, so they take no lock (they would wait on each other).
    lock = training_lock(directory) if _distributed()[1] == 1 else contextlib.nullcontext()
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(spec.recipe.cpu_threads)
    try:
        with lock:
            if is_trained(directory):  # trained by the process this one waited for
                return read_metrics(directory)
            return _train(spec, directory, world, device, progress, stop_after_epoch, runs_root,
                          emulate_processes)
    finally:
        torch.set_num_threads(threads)


def _batch_slices(batch: Batch, emulate_processes: int) -> list[Batch]:
    """The batches this process trains on in one step: the one it loaded (under DDP, the world
    loaded only this process's slice), or the N slices of the whole batch when emulating N."""
    if emulate_processes > 1:
        return [batch.part(index, emulate_processes) for index in range(emulate_processes)]
    return [batch]


def _train(spec: ModelSpec, directory: Path, world: World | None, device: torch.device,
           progress: bool, stop_after_epoch: int | None, runs_root,
           emulate_processes: int = 1) -> dict[str, Any]:
    rank, world_size = _distributed()
    if world_size > 1 and emulate_processes > 1:
        raise ValueError(f"emulate_processes={emulate_processes} is for a single process; this one "
                         f"is rank {rank} of a real {world_size}-process run")
    world = world or build_world(spec.world, runs_root=runs_root)
    if rank == 0:
        atomic_write_json(directory / SPEC_NAME, spec.to_dict())
    model = new_model(spec, world).to(device)
    if spec.checkpoint:
        load_backbone_weights(model, spec.checkpoint)
        return _finish(spec, directory, model, world, device, {"source": "external",
                       "external_checkpoint": str(spec.checkpoint)}, rank)

    family = build_family(spec, world)
    split = world.split("train")
    if family is not None:
        split = family.training_split(split)
    recipe = spec.recipe
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum,
                                weight_decay=recipe.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, recipe.lr_step_epochs, recipe.lr_gamma)
    state = load_training_state(directory)
    start_epoch, history, train_seconds, images_seen = 0, [], 0.0, 0
    if state is not None:
        if state["spec_key"] != spec.key:
            raise RuntimeError(f"{directory / 'checkpoint.pth'} belongs to spec {state['spec_key']},"
                               f" not {spec.key}; delete the folder to retrain")
        model.backbone.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        train_seconds, images_seen = state["train_seconds"], state["images_seen"]
        if rank == 0:  # always logged: it is how a requeued job shows it lost no finished epoch
            print(f"[train] {spec.name}: resuming after epoch {state['epoch'] + 1}/{recipe.epochs}"
                  f" from {directory / CHECKPOINT_NAME}", flush=True)

    cuda = device.type == "cuda"
    # channels_last: the fast convolution layout on GPUs and, for these small models, on CPUs too
    # (1.5x measured on the 2-core CI machine). bf16 autocast on CUDA, and on CPU if the recipe
    # asks (recipe.cpu_bf16).
    model = model.to(memory_format=torch.channels_last)
    net: nn.Module = model
    if world_size > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if cuda or recipe.cpu_bf16
                else contextlib.nullcontext())
    loss_fn = nn.CrossEntropyLoss()
    data_seed = derive_seed(spec.seed, "data")
    steps_per_epoch = len(split) // recipe.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{spec.name}: batch_size {recipe.batch_size} is larger than the "
                         f"{len(split)} training images; lower recipe.batch_size")
    warmup_steps = int(round(recipe.lr_warmup_epochs * steps_per_epoch))
    slice_count = max(world_size, emulate_processes)
    if recipe.batch_size < slice_count:
        raise ValueError(f"{spec.name}: batch_size {recipe.batch_size} cannot be split over "
                         f"{slice_count} processes; use fewer GPUs/tasks or a larger batch")

    for epoch in range(start_epoch, recipe.epochs):
        model.train()
        generator = torch.Generator().manual_seed(derive_seed(spec.seed, "anomaly", epoch))
        started, loss_sum, correct, seen, global_seen = time.perf_counter(), 0.0, 0, 0, 0
        crop = recipe.crop_size(epoch)  # progressive resizing: from the epoch alone, resumable
        batches = split.train_batches(recipe.batch_size, data_seed, epoch, part=(rank, world_size),
                                      image_size=crop)
        bar = tqdm(batches, total=steps_per_epoch,
                   desc=f"{spec.name} epoch {epoch + 1}/{recipe.epochs}", leave=False,
                   disable=not progress or rank != 0, dynamic_ncols=True)
        for step, batch in enumerate(bar):
            if warmup_steps:  # the step schedule times the warmup, from the step alone: resumable
                done = epoch * steps_per_epoch + step + 1
                for group in optimizer.param_groups:
                    group["lr"] = (recipe.lr * recipe.lr_gamma ** (epoch // recipe.lr_step_epochs)
                                   * min(1.0, done / warmup_steps))
            slices = _batch_slices(batch, emulate_processes)
            global_seen += batch.global_size  # every process's images, this one's slice or not
            # Every process draws the family's randomness for the whole global batch, from the
            # same generator state; emulated processes therefore each start from the step's.
            step_rng = generator.get_state() if family is not None and len(slices) > 1 else None
            optimizer.zero_grad(set_to_none=True)
            rank0_buffers = None
            for index, part in enumerate(slices):
                images, labels = part.images, part.labels
                if family is not None:
                    if step_rng is not None:
                        generator.set_state(step_rng)
                    # Under the training's autocast, PGD's passes included: they cost (steps) x
                    # the training step, and bf16 runs them at the training's speed.
                    with autocast:
                        images, labels = family.training_inputs(model, images, labels, generator,
                                                                part.offset, part.global_size)
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                images = images.contiguous(memory_format=torch.channels_last)
                with autocast:
                    logits = net(images)
                    loss = loss_fn(logits.float(), labels)
                # Emulated processes: DDP averages the N processes' gradients, so each slice's
                # loss counts 1/N (each slice's own mean, as on its own process).
                (loss / len(slices) if len(slices) > 1 else loss).backward()
                if len(slices) > 1 and index == 0:  # BatchNorm running statistics: rank 0's
                    rank0_buffers = [b.detach().clone() for b in model.buffers()]
                loss_sum += float(loss.detach()) * len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                seen += len(labels)
            if rank0_buffers is not None:
                with torch.no_grad():
                    for buffer, saved in zip(model.buffers(), rank0_buffers):
                        buffer.copy_(saved)
            optimizer.step()
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}")
        scheduler.step()
        epoch_seconds = time.perf_counter() - started
        train_seconds += epoch_seconds
        images_seen += global_seen
        history.append({"epoch": epoch + 1, "loss": loss_sum / max(seen, 1),
                        "train_accuracy": correct / max(seen, 1), "seconds": epoch_seconds,
                        "lr": optimizer.param_groups[0]["lr"],
                        **({"crop_size": crop} if crop is not None else {})})
        if rank == 0:
            print(f"[train] {spec.name} epoch {epoch + 1}/{recipe.epochs}: loss "
                  f"{history[-1]['loss']:.3f}, train acc {history[-1]['train_accuracy']:.3f}, "
                  f"{epoch_seconds:.1f}s{f', {crop} px' if crop is not None else ''}", flush=True)
        last = epoch + 1 == recipe.epochs
        if rank == 0 and ((epoch + 1) % CHECKPOINT_EVERY_EPOCHS == 0 or last):
            save_training_state(directory, {
                "spec_key": spec.key, "epoch": epoch, "model": model.backbone.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(), "history": history,
                "train_seconds": train_seconds, "images_seen": images_seen})
        if world_size > 1:
            dist.barrier()  # no rank runs ahead of the checkpoint
        if stop_after_epoch is not None and epoch + 1 >= stop_after_epoch and not last:
            return {"interrupted_after_epoch": epoch + 1}

    return _finish(spec, directory, model, world, device, {
        "source": "trained", "epochs": recipe.epochs, "history": history,
        "train_seconds": train_seconds, "images_per_second": images_seen / max(train_seconds, 1e-9),
        "processes": world_size,
        **({"distributed_backend": str(dist.get_backend())} if world_size > 1 else {}),
        **({"emulated_processes": emulate_processes} if emulate_processes > 1 else {})}, rank)


def _finish(spec: ModelSpec, directory: Path, model: Classifier, world: World,
            device: torch.device, extra: dict[str, Any], rank: int) -> dict[str, Any]:
    model = model.to(memory_format=torch.contiguous_format).eval()
    val = evaluate_accuracy(model, world.split("val"), batch_size=spec.recipe.eval_batch_size,
                            device=device)
    metrics = {"name": spec.name, "key": spec.key, "family": spec.family, "seed": spec.seed,
               "val_accuracy": val["accuracy"], "val_per_class_accuracy": val["per_class_accuracy"],
               "device": str(device), "torch": torch.__version__, "host": platform.node(), **extra}
    if rank == 0:
        metrics = save_trained_model(directory, model.backbone, metrics)
    return metrics


def summarize_references(metrics: list[dict[str, Any]]) -> dict[str, float]:
    accuracies = np.array([m["val_accuracy"] for m in metrics if m["family"] == "reference"])
    if len(accuracies) == 0:
        return {}
    return {"count": int(len(accuracies)), "mean": float(accuracies.mean()),
            "std": float(accuracies.std(ddof=1)) if len(accuracies) > 1 else 0.0,
            "min": float(accuracies.min()), "max": float(accuracies.max())}
