"""The grouped engine (a recipe's ``engine = "grouped"``): ``group_size`` models of one world,
architecture and recipe trained as one grouped network (train/grouped.py).

Each member is its solo twin's training, side by side: its own init (``new_model``), its own
training split, data order and augmentation draws (its data seed), its own anomaly draws (its
per-epoch generator), its own BatchNorm statistics (its channels), and its own gradient (the loss
is the sum of the members' own mean losses). SGD with momentum and weight decay is elementwise, so
each member's update is the solo formula on its own block of the stacked parameters; the learning
rate schedule is the recipe's, one for all. The rounding is not the solo run's (grouped
convolutions, another reduction order), so a member's weights differ from its twin's in their
low bits, then by what training makes of them: a grouped model has its own key (the recipe's
engine and group_size). Its bits depend on the group size (measured: a group of 2 and one of 4
differ after four steps) and never on its companions (bit for bit equal with other companions, at
another position), so every group is filled up to ``group_size`` with copies of its first member,
whose results are dropped.

Members share a group only when they step in lockstep through the same network: the same number
of steps per epoch, the same output classes, the same resume epoch (``subgroups``). A family whose
training runs the model itself (the adversarial family's PGD: ``training_reads_model``) gets a view
of its one member (``MemberView``): the attack costs what it costs alone, and only the update is
grouped. A model derived from a reference and an external checkpoint are made as before, under
train/trainer.py's ``train_model``.

Every member is saved as a solo model is: its spec.json, a checkpoint.pth after every epoch (its
own weights and its own share of the optimizer, in the solo form), weights.pth and metrics.json.
A group interrupted between epochs resumes from its members' checkpoints; members already trained
are not trained again.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from counteraudit.train.checkpoint import (SPEC_NAME, finite_weights, is_trained, load_training_state,
                                           read_metrics, save_training_state, training_lock)
from counteraudit.train.core.artifacts import atomic_write_json, derive_seed
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.threads import torch_threads
from counteraudit.train.grouped import (GroupedClassifier, MemberView,
                                        load_member_optimizer_states, member_optimizer_state)
from counteraudit.train.training_parts import (EpochMeter, Processes, TrainingProgress, build_family,
                                               diverged_error, evaluate_and_save, log_epoch,
                                               new_model, optimizer_and_scheduler,
                                               training_metrics, warmup_lr)
from counteraudit.train.worlds import World


def trains_grouped(spec: ModelSpec, family) -> bool:
    """Whether this model trains in a grouped network: its recipe's engine is grouped and it is
    trained here step by step (not loaded, not derived from a reference)."""
    return (spec.recipe.engine == "grouped" and not spec.checkpoint
            and (family is None or family.reference_seed() is None))


@dataclass
class Member:
    """One model of a group, set up: its model at its resume point, and what its steps draw from."""
    spec: ModelSpec
    directory: Path
    model: nn.Module
    family: Any
    split: Any
    steps_per_epoch: int
    state: dict[str, Any] | None          # its last checkpoint (None: from the first epoch)
    done: TrainingProgress = field(default_factory=TrainingProgress)

    @property
    def data_seed(self) -> int:
        return derive_seed(self.spec.seed, "data")

    @property
    def lockstep(self) -> tuple:
        """What members of one group must share."""
        classes = self.model.output_classes
        return (self.steps_per_epoch, None if classes is None else tuple(classes.tolist()),
                self.done.next_epoch)


def train_group(specs: Sequence[ModelSpec], directories: Sequence[Path], world: World,
                device: torch.device, progress: bool = True, stop_after_epoch: int | None = None,
                lock: bool = True) -> list[dict[str, Any]]:
    """Train (or resume) models that ``trains_grouped`` accepts, of one world, architecture and
    recipe, in groups of the recipe's group_size; each one's metrics (``{"interrupted_after_epoch":
    n}`` for one stopped by ``stop_after_epoch``, as ``train_model``). ``lock``: take each model's
    training lock (False: the caller holds them)."""
    recipe = specs[0].recipe
    for spec in specs:
        if spec.recipe != recipe or spec.world != specs[0].world \
                or spec.architecture != specs[0].architecture:
            raise ValueError(f"{spec.name} cannot share a group with {specs[0].name}: grouped "
                             "models need one world, architecture and recipe")
    with torch_threads(recipe.cpu_threads if device.type == "cpu" else None), \
            contextlib.ExitStack() as locks:
        if lock:  # in one order, so two processes locking overlapping groups never deadlock
            for directory in sorted(set(map(str, directories))):
                locks.enter_context(training_lock(Path(directory)))
        results: dict[str, dict[str, Any]] = {}
        members = []
        for spec, directory in zip(specs, directories):
            if is_trained(directory):
                results[spec.key] = read_metrics(directory)
            elif spec.key not in {member.spec.key for member in members}:
                members.append(_member(spec, Path(directory), world))
        for group in subgroups(members, recipe.group_size):
            results.update(_train_members(group, recipe.group_size, world, device, progress,
                                          stop_after_epoch))
        return [results[spec.key] for spec in specs]


def subgroups(members: Sequence[Member], size: int) -> list[list[Member]]:
    """Members in groups of at most ``size`` that step in lockstep (``Member.lockstep``), in
    their order."""
    by_kind: dict[tuple, list[Member]] = {}
    for member in members:
        by_kind.setdefault(member.lockstep, []).append(member)
    return [kind[start:start + size] for kind in by_kind.values()
            for start in range(0, len(kind), size)]


def _member(spec: ModelSpec, directory: Path, world: World) -> Member:
    """A member at its resume point: its solo twin's init, then its last checkpoint's weights."""
    family = build_family(spec, world)
    if not trains_grouped(spec, family):
        raise ValueError(f"{spec.name} does not train in a grouped network (train it with "
                         "train_model)")
    atomic_write_json(directory / SPEC_NAME, spec.to_dict())
    model = new_model(spec, world)
    split = world.split("train") if family is None else family.training_split(world.split("train"))
    steps = len(split) // spec.recipe.batch_size
    if steps == 0:
        raise ValueError(f"{spec.name}: batch_size {spec.recipe.batch_size} is larger than the "
                         f"{len(split)} training images; lower recipe.batch_size")
    state = load_training_state(directory)
    member = Member(spec, directory, model, family, split, steps, state)
    if state is not None:
        if state["spec_key"] != spec.key:
            raise RuntimeError(f"{directory / 'checkpoint.pth'} belongs to spec "
                               f"{state['spec_key']}, not {spec.key}; delete the folder to retrain")
        model.backbone.load_state_dict(state["model"])
        member.done = TrainingProgress(state["epoch"] + 1, state["history"], state["train_seconds"],
                                       state["images_seen"])
        print(f"[train] {spec.name}: resuming after epoch {state['epoch'] + 1}/"
              f"{spec.recipe.epochs} in a group", flush=True)
    return member


@dataclass
class _GroupRun:
    members: list[Member]
    net: GroupedClassifier
    optimizer: torch.optim.Optimizer
    scheduler: Any
    device: torch.device
    autocast: contextlib.AbstractContextManager
    warmup_steps: int
    progress: bool
    views: list[MemberView | None]  # each member as its own model, where its family runs it


def _train_members(members: list[Member], size: int, world: World, device: torch.device,
                   progress: bool, stop_after_epoch: int | None) -> dict[str, dict[str, Any]]:
    """One group, filled up to ``size`` with copies of its first member: its remaining epochs,
    a checkpoint per member after each, then each member evaluated and saved."""
    recipe = members[0].spec.recipe
    slots = members + [members[0]] * (size - len(members))
    net = GroupedClassifier([member.model for member in slots]).to(device)
    net = net.to(memory_format=torch.channels_last)
    optimizer, scheduler = optimizer_and_scheduler(net, recipe)
    if members[0].state is not None:
        load_member_optimizer_states(optimizer, net.backbone,
                                     [member.state["optimizer"] for member in slots])
        scheduler.load_state_dict(members[0].state["scheduler"])
    cuda = device.type == "cuda"
    run = _GroupRun(members, net, optimizer, scheduler, device,
                    torch.autocast(device.type, dtype=torch.bfloat16) if cuda or recipe.cpu_bf16
                    else contextlib.nullcontext(),
                    int(round(recipe.lr_warmup_epochs * members[0].steps_per_epoch)), progress,
                    [MemberView(net, member.model.to(device), index)
                     if member.family is not None and member.family.training_reads_model else None
                     for index, member in enumerate(members)])
    for epoch in range(members[0].done.next_epoch, recipe.epochs):
        records, images = _train_epoch(run, size, epoch)
        for index, (member, record) in enumerate(zip(members, records)):
            diverged = record.get("diverged_at")
            if diverged is not None or not finite_weights(net.member_state(index)):
                raise diverged_error(member.spec, epoch, member.steps_per_epoch, diverged)
        for index, (member, record) in enumerate(zip(members, records)):
            member.done.add_epoch(record, images)
            log_epoch(member.spec, record)
            _save_checkpoint(run, index, size, epoch)
        if stop_after_epoch is not None and epoch + 1 >= stop_after_epoch \
                and epoch + 1 < recipe.epochs:
            return {member.spec.key: {"interrupted_after_epoch": epoch + 1} for member in members}
    results = {}
    for index, member in enumerate(members):
        member.model.backbone.load_state_dict(net.member_state(index))
        metrics = {**training_metrics(member.spec, member.done, Processes()),
                   "engine": "grouped", "group_size": size, "group_members": len(members)}
        results[member.spec.key] = evaluate_and_save(member.spec, member.directory,
                                                     member.model.to(device), world, device,
                                                     metrics, Processes())
    return results


def _save_checkpoint(run: _GroupRun, index: int, size: int, epoch: int) -> None:
    """Member ``index``'s checkpoint, in the solo form (checkpoint.TRAINING_STATE_KEYS)."""
    member = run.members[index]
    save_training_state(member.directory, {
        "spec_key": member.spec.key, "epoch": epoch, "model": run.net.member_state(index),
        "optimizer": member_optimizer_state(run.optimizer, run.net.backbone, index, size),
        "scheduler": run.scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
        "history": member.done.history, "train_seconds": member.done.train_seconds,
        "images_seen": member.done.images_seen})


def _train_epoch(run: _GroupRun, size: int, epoch: int) -> tuple[list[dict[str, Any]], int]:
    """One epoch of every member in lockstep, the scheduler's step included: each member's
    history record (as a solo epoch's), and how many images each trained on."""
    members, recipe = run.members, run.members[0].spec.recipe
    run.net.train()
    generators = [torch.Generator().manual_seed(derive_seed(member.spec.seed, "anomaly", epoch))
                  for member in members]
    crop = recipe.crop_size(epoch)
    epochs = [member.split.train_batches(recipe.batch_size, member.data_seed, epoch,
                                         image_size=crop) for member in members]
    meters = [EpochMeter() for _ in members]
    started = time.perf_counter()
    steps = members[0].steps_per_epoch
    bar = tqdm(zip(*epochs), total=steps, leave=False, disable=not run.progress,
               desc=f"group of {len(members)} ({members[0].spec.name}, ...) epoch "
                    f"{epoch + 1}/{recipe.epochs}", dynamic_ncols=True)
    for step, batches in enumerate(bar):
        if run.warmup_steps:
            lr = warmup_lr(recipe, epoch, step, steps, run.warmup_steps)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
        _train_step(run, size, batches, generators, meters)
        if any(meter.diverged_at is not None for meter in meters):
            break  # fails now (the caller names the member)
    run.scheduler.step()
    seconds = time.perf_counter() - started
    records = [{"epoch": epoch + 1, "loss": meter.loss, "train_accuracy": meter.accuracy,
                "seconds": seconds, "lr": run.optimizer.param_groups[0]["lr"],
                **({"crop_size": crop} if crop is not None else {}),
                **({"diverged_at": meter.diverged_at} if meter.diverged_at else {})}
               for meter in meters]
    return records, meters[0].global_seen


def _train_step(run: _GroupRun, size: int, batches, generators, meters) -> None:
    """One optimizer step of every member on its own batch, changed by its own family; the
    filling slots train on the first member's."""
    inputs = []
    for member, view, batch, generator in zip(run.members, run.views, batches, generators):
        images, labels = batch.images, batch.labels
        if member.family is not None:
            with run.autocast:  # as the solo step; the member's own view, for PGD
                images, labels = member.family.training_inputs(view, images, labels, generator,
                                                               batch.offset, batch.global_size)
        inputs.append((images, labels.to(run.device, non_blocking=True)))
    inputs += [inputs[0]] * (size - len(inputs))
    images = torch.cat([member_images for member_images, _ in inputs], 1).to(run.device)
    images = images.contiguous(memory_format=torch.channels_last)
    run.optimizer.zero_grad(set_to_none=True)
    with run.autocast:
        logits = run.net(images)
        # each member's own mean loss: the sum's gradient is each member's own gradient
        losses = [nn.functional.cross_entropy(logits[:, index].float(), labels)
                  for index, (_, labels) in enumerate(inputs)]
    torch.stack(losses).sum().backward()
    for index, (meter, batch) in enumerate(zip(meters, batches)):
        meter.global_seen += batch.global_size
        meter.add(losses[index], logits[:, index], inputs[index][1])
        meter.steps += 1
    run.optimizer.step()
