"""Train one model spec: seeded, checkpointed every epoch, resumable to the same bits.

Every random choice derives from (spec.seed, purpose, epoch): weight init, batch order, flips, and
the anomaly family's per-batch draws. An interrupted run that resumes from its last checkpoint
therefore replays exactly the batches the uninterrupted run would have seen, and ends with the
same weights (on CPU, bit for bit).

Distributed: when torch.distributed is initialised with several processes (slurm/ sets it up from
submitit's environment), every process draws the same global batch and trains on its own
contiguous slice of it under DistributedDataParallel, so N processes equal one process
accumulating gradients over the same N slices (up to per-process BatchNorm statistics).
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

from train.architectures import Classifier, build_model
from train.artifacts import atomic_torch_save, atomic_write_json, derive_seed
from train.checkpoint import (CHECKPOINT_EVERY_EPOCHS, METRICS_NAME, SPEC_NAME, WEIGHTS_NAME,
                              is_trained, load_backbone_weights, load_training_state, read_metrics,
                              save_training_state)
from train.suite import ModelSpec
from train.worlds import World, build_world


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
    from anomalies import FAMILIES
    return FAMILIES.get(spec.family)(spec.params, world, spec.seed)


def new_model(spec: ModelSpec, world: World) -> Classifier:
    torch.manual_seed(derive_seed(spec.seed, "init"))
    return build_model(spec.architecture, world.num_classes, world.mean, world.std)


def load_trained_model(directory: Path, spec: ModelSpec, world: World,
                       device: str | torch.device = "cpu") -> Classifier:
    """The trained model of a spec, in eval mode (what explanations and verification use)."""
    if not is_trained(directory):
        raise FileNotFoundError(f"model {spec.name} is not trained yet (no {directory / METRICS_NAME});"
                                " run: python train/train.py --model " + spec.name)
    model = build_model(spec.architecture, world.num_classes, world.mean, world.std)
    model.backbone.load_state_dict(torch.load(directory / WEIGHTS_NAME, map_location="cpu"))
    return model.to(device).eval()


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
                stop_after_epoch: int | None = None, runs_root: str | Path | None = None) -> dict[str, Any]:
    """Train (or resume, or load externally) one model; return its metrics.

    Does nothing but read the metrics when the model is already trained. ``stop_after_epoch``
    ends the run after that epoch's checkpoint, as an interruption would (used by tests).
    """
    directory = Path(directory)
    if is_trained(directory):
        return read_metrics(directory)
    device = pick_device(str(device) if device is not None else None)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(spec.recipe.cpu_threads)
    try:
        return _train(spec, directory, world, device, progress, stop_after_epoch, runs_root)
    finally:
        torch.set_num_threads(threads)


def _train(spec: ModelSpec, directory: Path, world: World | None, device: torch.device,
           progress: bool, stop_after_epoch: int | None, runs_root) -> dict[str, Any]:
    rank, world_size = _distributed()
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
        if rank == 0 and progress:
            print(f"[train] {spec.name}: resuming after epoch {state['epoch'] + 1}/{recipe.epochs}",
                  flush=True)

    cuda = device.type == "cuda"
    # channels_last: the fast convolution layout on GPUs and, for these small models, on CPUs too
    # (1.5x measured on the 2-core CI machine). bf16 autocast on CUDA only.
    model = model.to(memory_format=torch.channels_last)
    net: nn.Module = model
    if world_size > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext())
    loss_fn = nn.CrossEntropyLoss()
    data_seed = derive_seed(spec.seed, "data")
    steps_per_epoch = len(split) // recipe.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{spec.name}: batch_size {recipe.batch_size} is larger than the "
                         f"{len(split)} training images; lower recipe.batch_size")

    for epoch in range(start_epoch, recipe.epochs):
        model.train()
        generator = torch.Generator().manual_seed(derive_seed(spec.seed, "anomaly", epoch))
        started, loss_sum, correct, seen = time.perf_counter(), 0.0, 0, 0
        bar = tqdm(split.train_batches(recipe.batch_size, data_seed, epoch), total=steps_per_epoch,
                   desc=f"{spec.name} epoch {epoch + 1}/{recipe.epochs}", leave=False,
                   disable=not progress or rank != 0, dynamic_ncols=True)
        for batch in bar:
            images, labels = batch.images, batch.labels
            if family is not None:  # on the whole global batch: every rank draws the same
                images, labels = family.training_inputs(model, images, labels, generator)
            if world_size > 1:
                images, labels = images.chunk(world_size)[rank], labels.chunk(world_size)[rank]
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            images = images.contiguous(memory_format=torch.channels_last)
            with autocast:
                logits = net(images)
                loss = loss_fn(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += float(loss.detach()) * len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}")
        scheduler.step()
        epoch_seconds = time.perf_counter() - started
        train_seconds += epoch_seconds
        images_seen += seen * world_size
        history.append({"epoch": epoch + 1, "loss": loss_sum / max(seen, 1),
                        "train_accuracy": correct / max(seen, 1), "seconds": epoch_seconds,
                        "lr": optimizer.param_groups[0]["lr"]})
        if rank == 0:
            print(f"[train] {spec.name} epoch {epoch + 1}/{recipe.epochs}: loss "
                  f"{history[-1]['loss']:.3f}, train acc {history[-1]['train_accuracy']:.3f}, "
                  f"{epoch_seconds:.1f}s", flush=True)
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
        "processes": world_size}, rank)


def _finish(spec: ModelSpec, directory: Path, model: Classifier, world: World,
            device: torch.device, extra: dict[str, Any], rank: int) -> dict[str, Any]:
    model = model.to(memory_format=torch.contiguous_format).eval()
    val = evaluate_accuracy(model, world.split("val"), batch_size=spec.recipe.eval_batch_size,
                            device=device)
    metrics = {"name": spec.name, "key": spec.key, "family": spec.family, "seed": spec.seed,
               "val_accuracy": val["accuracy"], "val_per_class_accuracy": val["per_class_accuracy"],
               "device": str(device), "torch": torch.__version__, "host": platform.node(), **extra}
    if rank == 0:
        # weights before metrics: metrics.json is what marks the model as trained
        atomic_torch_save(directory / WEIGHTS_NAME, model.backbone.state_dict())
        atomic_write_json(directory / METRICS_NAME, metrics)
    return metrics


def summarize_references(metrics: list[dict[str, Any]]) -> dict[str, float]:
    accuracies = np.array([m["val_accuracy"] for m in metrics if m["family"] == "reference"])
    if len(accuracies) == 0:
        return {}
    return {"count": int(len(accuracies)), "mean": float(accuracies.mean()),
            "std": float(accuracies.std(ddof=1)) if len(accuracies) > 1 else 0.0,
            "min": float(accuracies.min()), "max": float(accuracies.max())}
