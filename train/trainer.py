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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from counteraudit.train import group_trainer
from counteraudit.train.architectures import Classifier, build_model
from counteraudit.train.core.artifacts import atomic_write_json, derive_seed
from counteraudit.train.checkpoint import (CHECKPOINT_EVERY_EPOCHS, CHECKPOINT_NAME, METRICS_NAME,
                                           SPEC_NAME, WEIGHTS_NAME, finite_weights, is_trained,
                                           load_training_state, model_dir, read_metrics,
                                           save_training_state, training_lock)
from counteraudit.train.core.model_spec import ModelSpec, REFERENCE
from counteraudit.train.core.published_recipes import provenance
from counteraudit.train.core.threads import torch_threads
from counteraudit.train.core.weights import load_backbone_weights, load_weights_only
from counteraudit.train.training_parts import (EpochMeter, Processes, TrainingProgress,
                                               build_family, diverged_error,
                                               distributed_rank_and_size,
                                               evaluate_and_save, log_epoch, new_model,
                                               optimizer_and_scheduler, output_classes,
                                               training_metrics, warmup_lr)
from counteraudit.train.worlds import Batch, World, build_world


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} was requested but CUDA is not available on this "
                             "machine; use --device cpu")
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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


def _processes(emulate_processes: int) -> Processes:
    rank, world_size = distributed_rank_and_size()
    if world_size > 1 and emulate_processes > 1:
        raise ValueError(f"emulate_processes={emulate_processes} is for a single process; this one "
                         f"is rank {rank} of a real {world_size}-process run")
    return Processes(rank, world_size, emulate_processes)


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

    A spec whose recipe's engine is grouped trains as a group of one, filled up to its
    group_size (train/group_trainer.py), so it gets the bits it would get in any group.
    """
    directory = Path(directory)
    if is_trained(directory):
        return read_metrics(directory)
    if type(emulate_processes) is not int or emulate_processes < 1:
        raise ValueError(f"emulate_processes={emulate_processes!r} must be a whole number >= 1")
    device = pick_device(str(device) if device is not None else None)
    # One process trains a model at a time (two suites' runs may need it at once); the ranks of
    # one distributed run train it together, so they take no lock (they would wait on each other).
    lock = training_lock(directory) if distributed_rank_and_size()[1] == 1 else contextlib.nullcontext()
    with torch_threads(spec.recipe.cpu_threads if device.type == "cpu" else None), lock:
        if is_trained(directory):  # trained by the process this one waited for
            return read_metrics(directory)
        return _train(spec, directory, world, device, progress, stop_after_epoch, runs_root,
                      emulate_processes)


def _train(spec: ModelSpec, directory: Path, world: World | None, device: torch.device,
           progress: bool, stop_after_epoch: int | None, runs_root,
           emulate_processes: int = 1) -> dict[str, Any]:
    """The recipe: set up, resume from the last checkpoint, train the remaining epochs with a
    checkpoint after each, evaluate and save. The order of these calls is part of the result (the
    torch RNG draws init, then a resume restores its state), as are the float operations of the
    helpers: a model keeps its bits, and a runs folder its models, only while both stay."""
    processes = _processes(emulate_processes)
    world = world or build_world(spec.world, runs_root=runs_root)
    if processes.writes:
        atomic_write_json(directory / SPEC_NAME, spec.to_dict())
    model = new_model(spec, world).to(device)
    if spec.checkpoint:
        load_backbone_weights(model, spec.checkpoint)
        return evaluate_and_save(spec, directory, model, world, device, {
            "source": "external", "external_checkpoint": str(spec.checkpoint),
            **({"checkpoint_recipe": spec.checkpoint_recipe,
                "provenance": provenance(spec.checkpoint, spec.checkpoint_recipe, None)}
               if spec.checkpoint_recipe else {})}, processes)

    family = build_family(spec, world)
    if family is not None and family.reference_seed() is not None:
        return _derive_from_reference(spec, directory, family, world, device, progress, runs_root,
                                      processes)
    if group_trainer.trains_grouped(spec, family):  # a group of one, filled up to group_size
        if processes.slices > 1:
            raise ValueError(f"{spec.name}: the grouped engine trains in one process; give its "
                             "recipe engine = \"alone\" to train it with several")
        return group_trainer.train_group([spec], [directory], world, device, progress,
                                         stop_after_epoch, lock=False)[0]
    split = world.split("train") if family is None else family.training_split(world.split("train"))
    optimizer, scheduler = optimizer_and_scheduler(model, spec.recipe)
    done = _resume(directory, spec, model, optimizer, scheduler, processes)
    run = _training_run(spec, model, family, split, optimizer, scheduler, device, processes,
                        progress)
    for epoch in range(done.next_epoch, spec.recipe.epochs):
        record, images = train_one_epoch(run, epoch)
        # before its checkpoint: a diverged epoch is never saved, so never resumed or used
        check_finite(run, epoch, record)
        done.add_epoch(record, images)
        if processes.writes:
            log_epoch(spec, record)
        last = epoch + 1 == spec.recipe.epochs
        if processes.writes and ((epoch + 1) % CHECKPOINT_EVERY_EPOCHS == 0 or last):
            _save_checkpoint(directory, run, epoch, done)
        if processes.world_size > 1:
            dist.barrier()  # no rank runs ahead of the checkpoint
        if stop_after_epoch is not None and epoch + 1 >= stop_after_epoch and not last:
            return {"interrupted_after_epoch": epoch + 1}
    return evaluate_and_save(spec, directory, model, world, device,
                              training_metrics(spec, done, processes), processes)


def derived_reference(spec: ModelSpec, seed: int) -> ModelSpec:
    """The reference a derived model (a family's ``reference_seed``) starts from: the suite's
    reference of that seed, as the spec's world, architecture and recipe make it (the same key,
    so the same stored model)."""
    return replace(spec, name=f"{spec.name}-reference", family=REFERENCE, seed=seed, params={},
                   checkpoint=None, row=None, configuration=None, replicate=None,
                   checkpoint_recipe=None)


def _derive_from_reference(spec: ModelSpec, directory: Path, family, world: World,
                           device: torch.device, progress: bool, runs_root,
                           processes: Processes) -> dict[str, Any]:
    """A model made from a trained reference, not trained (cascading randomisation): the
    reference is read from the store, trained there first if it is not yet (under its own lock,
    so a stage training it at the same time is waited for), then changed by the family."""
    reference = derived_reference(spec, family.reference_seed())
    reference_directory = model_dir(runs_root, reference)
    train_model(reference, reference_directory, world, device, progress, runs_root=runs_root)
    # changed on the CPU, so the random draws are the same bits whatever the device
    model = load_trained_model(reference_directory, reference, world, "cpu")
    family.derive(model)
    return evaluate_and_save(spec, directory, model.to(device), world, device, {
        "source": "derived", "reference_key": reference.key, "reference_seed": reference.seed},
        processes)


# ---------------------------------------------------------------- set-up, resume, checkpoint


@dataclass
class TrainingRun:
    """One model's training, set up: what its epochs and steps use."""
    spec: ModelSpec
    model: Classifier       # the model itself: its backbone is what is saved
    net: nn.Module          # what the step runs: the model, or its DDP wrapper
    family: Any             # the anomaly family (None: a reference model)
    split: Any              # the training split (the family's, which may add images)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    device: torch.device
    processes: Processes
    autocast: contextlib.AbstractContextManager
    loss_fn: nn.Module
    data_seed: int
    steps_per_epoch: int
    warmup_steps: int
    progress: bool          # show a progress bar


def _resume(directory: Path, spec: ModelSpec, model: Classifier, optimizer: torch.optim.Optimizer,
            scheduler, processes: Processes) -> TrainingProgress:
    """Restore the last checkpoint's model, optimizer, schedule and torch RNG; its progress (none
    without a checkpoint)."""
    state = load_training_state(directory)
    if state is None:
        return TrainingProgress()
    if state["spec_key"] != spec.key:
        raise RuntimeError(f"{directory / 'checkpoint.pth'} belongs to spec {state['spec_key']},"
                           f" not {spec.key}; delete the folder to retrain")
    model.backbone.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if processes.writes:  # always logged: it is how a requeued job shows it lost no finished epoch
        print(f"[train] {spec.name}: resuming after epoch {state['epoch'] + 1}/{spec.recipe.epochs}"
              f" from {directory / CHECKPOINT_NAME}", flush=True)
    return TrainingProgress(state["epoch"] + 1, state["history"], state["train_seconds"],
                            state["images_seen"])


def _save_checkpoint(directory: Path, run: TrainingRun, epoch: int,
                     done: TrainingProgress) -> None:
    """Everything a resume after ``epoch`` needs (the keys checkpoint.TRAINING_STATE_KEYS names)."""
    save_training_state(directory, {
        "spec_key": run.spec.key, "epoch": epoch, "model": run.model.backbone.state_dict(),
        "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(), "history": done.history,
        "train_seconds": done.train_seconds, "images_seen": done.images_seen})


def _training_run(spec: ModelSpec, model: Classifier, family, split, optimizer, scheduler,
                  device: torch.device, processes: Processes, progress: bool) -> TrainingRun:
    """The model in its training layout (and DDP wrapper), the precision, and the step counts."""
    recipe = spec.recipe
    cuda = device.type == "cuda"
    # channels_last: the fast convolution layout on GPUs and, for these small models, on CPUs too
    # (1.5x measured on the 2-core CI machine). bf16 autocast on CUDA, and on CPU if the recipe
    # asks (recipe.cpu_bf16).
    model = model.to(memory_format=torch.channels_last)
    net: nn.Module = model
    if processes.world_size > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if cuda or recipe.cpu_bf16
                else contextlib.nullcontext())
    steps_per_epoch = len(split) // recipe.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{spec.name}: batch_size {recipe.batch_size} is larger than the "
                         f"{len(split)} training images; lower recipe.batch_size")
    if recipe.batch_size < processes.slices:
        raise ValueError(f"{spec.name}: batch_size {recipe.batch_size} cannot be split over "
                         f"{processes.slices} processes; use fewer GPUs/tasks or a larger batch")
    return TrainingRun(spec, model, net, family, split, optimizer, scheduler, device, processes,
                       autocast, nn.CrossEntropyLoss(), derive_seed(spec.seed, "data"),
                       steps_per_epoch, int(round(recipe.lr_warmup_epochs * steps_per_epoch)),
                       progress)


# ---------------------------------------------------------------- one epoch, one step


def train_one_epoch(run: TrainingRun, epoch: int) -> tuple[dict[str, Any], int]:
    """Train one epoch, the scheduler's step included; its history record, and how many images
    every process trained on."""
    recipe = run.spec.recipe
    run.model.train()
    generator = torch.Generator().manual_seed(derive_seed(run.spec.seed, "anomaly", epoch))
    started, meter = time.perf_counter(), EpochMeter()
    crop = recipe.crop_size(epoch)  # progressive resizing: from the epoch alone, resumable
    batches = run.split.train_batches(recipe.batch_size, run.data_seed, epoch,
                                      part=(run.processes.rank, run.processes.world_size),
                                      image_size=crop)
    bar = tqdm(batches, total=run.steps_per_epoch,
               desc=f"{run.spec.name} epoch {epoch + 1}/{recipe.epochs}", leave=False,
               disable=not run.progress or not run.processes.writes, dynamic_ncols=True)
    for step, batch in enumerate(bar):
        if run.warmup_steps:
            lr = warmup_lr(recipe, epoch, step, run.steps_per_epoch, run.warmup_steps)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
        train_one_step(run, batch, generator, meter)
        meter.steps += 1
        if meter.diverged_at is not None and run.processes.world_size == 1:
            break  # fails now (check_finite); ranks of a DDP run find out together, at the epoch's end
        bar.set_postfix(loss=f"{meter.loss:.3f}", acc=f"{meter.accuracy:.3f}")
    run.scheduler.step()
    seconds = time.perf_counter() - started
    return {"epoch": epoch + 1, "loss": meter.loss, "train_accuracy": meter.accuracy,
            "seconds": seconds, "lr": run.optimizer.param_groups[0]["lr"],
            **({"crop_size": crop} if crop is not None else {}),
            **({"diverged_at": meter.diverged_at} if meter.diverged_at else {})}, meter.global_seen


def check_finite(run: TrainingRun, epoch: int, record: dict[str, Any]) -> None:
    """A TrainingDiverged naming the model, the epoch and step and the likely cause when a loss of
    this epoch or the weights after it are inf or nan (every rank of a DDP run holds the same
    weights, so all of them stop here together)."""
    diverged = record.get("diverged_at")
    if diverged is None and finite_weights(run.model.state_dict()):
        return
    raise diverged_error(run.spec, epoch, run.steps_per_epoch, diverged)


def _batch_slices(batch: Batch, emulate_processes: int) -> list[Batch]:
    """The batches this process trains on in one step: the one it loaded (under DDP, the world
    loaded only this process's slice), or the N slices of the whole batch when emulating N."""
    if emulate_processes > 1:
        return [batch.part(index, emulate_processes) for index in range(emulate_processes)]
    return [batch]


def train_one_step(run: TrainingRun, batch: Batch, generator: torch.Generator,
                   meter: EpochMeter) -> None:
    """One optimizer step on a batch: this process's slice of it, or, emulating N processes, the
    N slices one after the other with their gradients averaged as DDP averages them."""
    slices = _batch_slices(batch, run.processes.emulated)
    meter.global_seen += batch.global_size
    # Every process draws the family's randomness for the whole global batch, from the same
    # generator state; emulated processes therefore each start from the step's.
    step_rng = generator.get_state() if run.family is not None and len(slices) > 1 else None
    run.optimizer.zero_grad(set_to_none=True)
    rank0_buffers = None
    for index, part in enumerate(slices):
        images, labels = _slice_inputs(run, part, generator, step_rng)
        with run.autocast:
            logits = run.net(images)
            loss = run.loss_fn(logits.float(), labels)
        # Emulated processes: DDP averages the N processes' gradients, so each slice's loss
        # counts 1/N (each slice's own mean, as on its own process).
        (loss / len(slices) if len(slices) > 1 else loss).backward()
        if len(slices) > 1 and index == 0:  # BatchNorm running statistics: rank 0's
            rank0_buffers = [b.detach().clone() for b in run.model.buffers()]
        meter.add(loss, logits, labels)
    if rank0_buffers is not None:
        with torch.no_grad():
            for buffer, saved in zip(run.model.buffers(), rank0_buffers):
                buffer.copy_(saved)
    run.optimizer.step()


def _slice_inputs(run: TrainingRun, part: Batch, generator: torch.Generator,
                  step_rng: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A slice's images (channels_last) and labels on the device, changed by the anomaly family."""
    images, labels = part.images, part.labels
    if run.family is not None:
        if step_rng is not None:
            generator.set_state(step_rng)
        # Under the training's autocast, PGD's passes included: they cost (steps) x the training
        # step, and bf16 runs them at the training's speed.
        with run.autocast:
            images, labels = run.family.training_inputs(run.model, images, labels, generator,
                                                        part.offset, part.global_size)
    images = images.to(run.device, non_blocking=True)
    labels = labels.to(run.device, non_blocking=True)
    return images.contiguous(memory_format=torch.channels_last), labels


# ---------------------------------------------------------------- evaluate and save


def summarize_references(metrics: list[dict[str, Any]]) -> dict[str, float]:
    accuracies = np.array([m["val_accuracy"] for m in metrics if m["family"] == "reference"])
    if len(accuracies) == 0:
        return {}
    return {"count": int(len(accuracies)), "mean": float(accuracies.mean()),
            "std": float(accuracies.std(ddof=1)) if len(accuracies) > 1 else 0.0,
            "min": float(accuracies.min()), "max": float(accuracies.max())}
