"""What one model's training and a grouped training (train/group_trainer.py) share: the seeded
model and anomaly family of a spec, the optimizer and learning-rate schedule, the epoch's meter
and record, the progress a checkpoint saves, and the evaluation and files of a trained model."""
from __future__ import annotations

import math
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from counteraudit.train.architectures import Classifier, build_model
from counteraudit.train.checkpoint import save_trained_model
from counteraudit.train.core import numerics
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.recipe import Recipe
from counteraudit.train.core.registries import FAMILIES
from counteraudit.train.worlds import World


class TrainingDiverged(ValueError):
    """A training whose loss or weights became inf or nan: nothing of it is stored as trained."""


def diverged_error(spec: ModelSpec, epoch: int, steps_per_epoch: int,
                   diverged: tuple[int, float] | None) -> TrainingDiverged:
    """The error of a model whose loss (``diverged``: its step and value) or weights became inf or
    nan in ``epoch``: the model, where, and the likely cause."""
    recipe = spec.recipe
    where = (f"the training loss is {diverged[1]} at epoch {epoch + 1}/{recipe.epochs}, step "
             f"{diverged[0]}/{steps_per_epoch}" if diverged else
             f"its weights hold inf or nan after epoch {epoch + 1}/{recipe.epochs}")
    return TrainingDiverged(
        f"model {spec.name} ({spec.key}) diverged: {where}. The likely cause is a learning "
        f"rate or weight decay too large for it (lr = {recipe.lr}, weight_decay = "
        f"{recipe.weight_decay}): lower [recipe] lr (the paper: 0.1) or weight_decay (1e-4), or "
        "add lr_warmup_epochs. Nothing of it is stored as trained")


def build_family(spec: ModelSpec, world: World):
    if spec.is_reference:
        return None
    return FAMILIES.get(spec.family)(spec.params, world, spec.seed)


def output_classes(spec: ModelSpec, world: World) -> list[int] | None:
    """The classes a spec's output layer has (None: every class of the world)."""
    family = build_family(spec, world)
    return None if family is None else family.output_classes()


def new_model(spec: ModelSpec, world: World) -> Classifier:
    torch.manual_seed(derive_seed(spec.seed, "init"))
    return build_model(spec.architecture, world.num_classes, world.mean, world.std,
                       output_classes(spec, world))


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


def distributed_rank_and_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class Processes:
    """Who trains a model: this process, rank ``rank`` of ``world_size`` DDP processes, or one
    process emulating ``emulated`` of them (module docstring)."""
    rank: int = 0
    world_size: int = 1
    emulated: int = 1

    @property
    def writes(self) -> bool:
        """Rank 0 writes the files and the log; the other ranks train alongside it."""
        return self.rank == 0

    @property
    def slices(self) -> int:
        """Into how many slices each global batch is cut."""
        return max(self.world_size, self.emulated)


@dataclass
class TrainingProgress:
    """What the finished epochs produced: a checkpoint saves it, a resume restores it."""
    next_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    train_seconds: float = 0.0
    images_seen: int = 0  # every process's images

    def add_epoch(self, record: dict[str, Any], images: int) -> None:
        self.next_epoch = record["epoch"]
        self.train_seconds += record["seconds"]
        self.images_seen += images
        self.history.append(record)


def optimizer_and_scheduler(model: nn.Module, recipe: Recipe
                             ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum,
                                weight_decay=recipe.weight_decay)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, recipe.lr_step_epochs,
                                                      recipe.lr_gamma)


def warmup_lr(recipe: Recipe, epoch: int, step: int, steps_per_epoch: int,
              warmup_steps: int) -> float:
    """The learning rate at ``step`` of ``epoch``: the step schedule's, ramped up linearly over
    the first ``warmup_steps`` steps. From the step alone, so a resumed run gets the same."""
    done = epoch * steps_per_epoch + step + 1
    return (recipe.lr * recipe.lr_gamma ** (epoch // recipe.lr_step_epochs)
            * min(1.0, done / warmup_steps))


@dataclass
class EpochMeter:
    """An epoch's loss and accuracy, summed slice by slice in training order (the order the
    history's floats depend on)."""
    loss_sum: float = 0.0
    correct: int = 0
    seen: int = 0         # this process's images
    global_seen: int = 0  # every process's images, this one's slice or not
    steps: int = 0        # optimizer steps taken
    diverged_at: tuple[int, float] | None = None  # (step, loss) of the first inf or nan loss

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        value = float(loss.detach())
        if not math.isfinite(value) and self.diverged_at is None:
            self.diverged_at = (self.steps + 1, value)
        self.loss_sum += value * len(labels)
        self.correct += int((logits.argmax(1) == labels).sum())
        self.seen += len(labels)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.seen, 1)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.seen, 1)


def log_epoch(spec: ModelSpec, record: dict[str, Any]) -> None:
    crop = record.get("crop_size")
    print(f"[train] {spec.name} epoch {record['epoch']}/{spec.recipe.epochs}: loss "
          f"{record['loss']:.3f}, train acc {record['train_accuracy']:.3f}, "
          f"{record['seconds']:.1f}s{f', {crop} px' if crop is not None else ''}", flush=True)


def training_metrics(spec: ModelSpec, done: TrainingProgress,
                      processes: Processes) -> dict[str, Any]:
    return {"source": "trained", "epochs": spec.recipe.epochs, "history": done.history,
            "train_seconds": done.train_seconds,
            "images_per_second": done.images_seen / max(done.train_seconds, 1e-9),
            "processes": processes.world_size,
            **({"distributed_backend": str(dist.get_backend())}
               if processes.world_size > 1 else {}),
            **({"emulated_processes": processes.emulated} if processes.emulated > 1 else {})}


def evaluate_and_save(spec: ModelSpec, directory: Path, model: Classifier, world: World,
                       device: torch.device, extra: dict[str, Any],
                       processes: Processes) -> dict[str, Any]:
    """Validation accuracy, then (rank 0) weights.pth and metrics.json; the metrics."""
    model = model.to(memory_format=torch.contiguous_format).eval()
    val = evaluate_accuracy(model, world.split("val"), batch_size=spec.recipe.eval_batch_size,
                            device=device)
    metrics = {"name": spec.name, "key": spec.key, "family": spec.family, "seed": spec.seed,
               "val_accuracy": val["accuracy"], "val_per_class_accuracy": val["per_class_accuracy"],
               "device": str(device), "torch": torch.__version__, "host": platform.node(),
               "numerics": numerics.record(device), **extra}
    if processes.writes:
        metrics = save_trained_model(directory, model.backbone, metrics)
    return metrics
