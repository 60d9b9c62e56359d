"""Which engine trains each model: the grouped engine's models in groups (train/group_trainer.py),
every other one alone (train/trainer.py's ``train_model``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from counteraudit.train import group_trainer
from counteraudit.train.checkpoint import is_trained
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.trainer import pick_device, train_model
from counteraudit.train.training_parts import build_family
from counteraudit.train.worlds import World, build_world


def train_models_together(specs: list[ModelSpec], directories: list[Path], world: World | None = None,
                          device: str | torch.device | None = None, progress: bool = True,
                          stop_after_epoch: int | None = None,
                          runs_root: str | Path | None = None) -> list[dict[str, Any]]:
    """Train (or resume) models of one world, architecture and recipe: those the grouped engine
    takes (``group_trainer.trains_grouped``) in groups, every other one alone (``train_model``);
    each one's metrics, in order. What the training stage runs for a group's work item."""
    device = pick_device(str(device) if device is not None else None)
    world = world or build_world(specs[0].world, runs_root=runs_root)
    results: dict[int, dict[str, Any]] = {}
    grouped = []
    for index, (spec, directory) in enumerate(zip(specs, directories)):
        if not is_trained(directory) and group_trainer.trains_grouped(spec, build_family(spec, world)):
            grouped.append(index)
        else:
            results[index] = train_model(spec, directory, world, device, progress, stop_after_epoch,
                                         runs_root)
    if grouped:
        trained = group_trainer.train_group([specs[i] for i in grouped],
                                            [Path(directories[i]) for i in grouped], world, device,
                                            progress, stop_after_epoch)
        results.update(zip(grouped, trained))
    return [results[index] for index in range(len(specs))]
