"""Explaining k models of one architecture in one pass: their gradients on the same images through
one grouped network (train/grouped.py), for the methods whose passes allow it.

A method allows it (``ExplanationMethod.groups_models``) when its ``attribute`` draws no random
numbers and every forward pass it makes sees whole copies of its input batch, in order: captum's
gradients, and its integrated gradients, which stack the batch once per step. The k models' rows
then enter as one batch of k * n rows, model i's copy of the n images at rows i * n to
(i + 1) * n (``MemberRows``); the grouped network computes each model on its own rows, so the
gradient of the k models' target logits with respect to the rows is each model's own gradient.
Grad-CAM's layer activations, Caricatures' optimisation and the per-image seeded methods do not
fit this shape and run alone.

Bits: a grouped network's convolutions round otherwise than a model's own (train/README.md,
"Training many models at once"), so a grouped result is not its solo twin's bits; its rendered
images differ at most by a level in a few pixels (tests/test_model_groups.py). A result records
``model_group`` (k) in its parameters, so the store keeps grouped and solo results apart. A
member's bits depend on k, not on its companions or its place among them (the test checks it), so
a group short of members is filled up with copies of its first, whose results are dropped: the
same model gives the same bits in any group of that size.

Rows per pass: captum's ``internal_batch_size`` (integrated gradients' images x steps per forward
pass, outside the key) counts the group's rows, and a pass holds at least one whole copy of the
k x n rows. Scaling it by k instead, so each model's share of a pass is its solo one, made
integrated gradients slower on a CPU core (k = 4, 16 images a batch: 0.68x alone's speed, against
0.82x as it is; the grouped activations leave the cache).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from counteraudit.explain.base import (BatchContext, BatchOutput, Explanation, ExplanationMethod,
                                       check_images, explained_classes, model_device,
                                       seeded_rng)
from counteraudit.explain.explainable import explainable
from counteraudit.train.architectures import Classifier
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.grouped import grouped_network

# What a result's parameters record about its grouping; absent: the model was explained alone.
MODEL_GROUP = "model_group"


class _RowsBackbone(nn.Module):
    """The grouped backbone seen as one backbone of rows laid out (m, k, n): any number m of
    stacked copies (captum's steps) of k blocks of n rows, block i model i's."""

    def __init__(self, network: nn.Module, count: int):
        super().__init__()
        self.network = network
        self.count = count
        self.rows_per_model = 1

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        k, n = self.count, self.rows_per_model
        if rows.shape[0] % (k * n):
            raise ValueError(f"a grouped pass of {k} models got {rows.shape[0]} rows, not whole "
                             f"copies of {k} x {n}; the method's passes do not fit a model group "
                             "(set its groups_models to False)")
        side_by_side = (rows.unflatten(0, (-1, k, n)).transpose(1, 2)
                        .flatten(2, 3).flatten(0, 1))                   # (m * n, k * 3, H, W)
        logits = self.network(side_by_side)                             # (m * n, k, classes)
        return logits.unflatten(0, (-1, n)).transpose(1, 2).flatten(0, 2)


class MemberRows(Classifier):
    """k Classifiers of one architecture, normalisation and output classes as one Classifier of
    rows: image j of model i at row i * n + j of a batch of k * n (``rows_per_model`` n), and of
    each copy of such a batch stacked after it. Being a Classifier, it runs every method's
    gradient space and baseline as a model does."""

    def __init__(self, members: Sequence[Classifier]):
        first = members[0]
        super().__init__(_RowsBackbone(grouped_network([m.backbone for m in members]),
                                       len(members)),
                         first.mean.flatten().tolist(), first.std.flatten().tolist(),
                         first.architecture, first.num_classes,
                         None if first.output_classes is None else first.output_classes.tolist())
        self.to(model_device(first))

    def set_rows_per_model(self, count: int) -> None:
        self.backbone.rows_per_model = count


def grouping_key(model: nn.Module) -> tuple | None:
    """What models must share to be explained in one grouped pass (None: this one cannot be
    grouped): a Classifier's architecture, normalisation and output classes."""
    if not isinstance(model, Classifier):
        return None
    return (model.architecture, tuple(model.mean.flatten().tolist()),
            tuple(model.std.flatten().tolist()), model.num_classes,
            None if model.output_classes is None else tuple(model.output_classes.tolist()))


def grouping_problem(models: Sequence[nn.Module]) -> str | None:
    """Why these models cannot share a grouped pass (None: they can)."""
    keys = {grouping_key(model) for model in models}
    if None in keys:
        return "only Classifiers (train.architectures) can be grouped"
    if len(keys) > 1:
        return ("the models differ in architecture, normalisation or output classes, so they "
                "cannot share a grouped network")
    return None


def grouped_description(description: dict[str, Any], group_size: int) -> dict[str, Any]:
    """A method's recorded parameters (``describe``) for results computed in groups of
    ``group_size``; alone (1) they are unchanged, so solo results keep their keys."""
    return description if group_size == 1 else {**description, MODEL_GROUP: group_size}


def run_models(method: ExplanationMethod, models: Sequence[nn.Module],
               images: torch.Tensor | np.ndarray, group_size: int, batch_size: int | None = None,
               first_position: int = 0, labels: Any = None) -> list[Explanation]:
    """``method.run`` for each of ``models`` (at most ``group_size``) on the same images, in one
    grouped pass of ``group_size`` models (filled up with copies of the first); one Explanation
    per model, each recording ``model_group``. Each model's targets are its own (``method.run``'s),
    and each batch runs under the seed a solo run gives it."""
    if not method.groups_models:
        raise ValueError(f"method {method.name!r} cannot explain models in groups (its passes "
                         "are not whole copies of its batch); explain its models one at a time")
    if not 1 <= len(models) <= group_size:
        raise ValueError(f"{len(models)} models for groups of {group_size}")
    problem = grouping_problem(models)
    if problem:
        raise ValueError(f"method {method.name!r}: {problem}")
    images = check_images(images)
    batch_size = batch_size or method.default_batch_size
    members = list(models) + [models[0]] * (group_size - len(models))
    description = grouped_description(method.describe(models[0].architecture, batch_size),
                                      group_size)
    seed = getattr(method.params, "seed", 0)
    device = model_device(models[0])
    targets = [explained_classes(method.params, model, images, batch_size, labels, method.name)
               for model in models]
    targets += [targets[0]] * (group_size - len(models))
    outputs: list[list[BatchOutput]] = [[] for _ in models]
    rows = MemberRows(members).eval()  # one row per model: the example below
    example = images[:1].repeat(group_size, 1, 1, 1).to(device)
    with explainable(rows, example) as safe_rows, warnings.catch_warnings():
        # captum's notice that a pass holds at least one whole copy of the k x n rows, more than
        # an internal_batch_size set for one model: the group's pass is meant to
        warnings.filterwarnings("ignore", message="Internal batch size cannot be less than",
                                category=UserWarning)
        for start in range(0, len(images), batch_size):
            stop = min(start + batch_size, len(images))
            batch = images[start:stop].to(device)
            safe_rows.set_rows_per_model(stop - start)
            context = BatchContext(range(first_position + start, first_position + stop))
            with seeded_rng(derive_seed(seed, first_position + start)):
                raw = method.attribute_batch(
                    safe_rows, batch.repeat(group_size, 1, 1, 1),
                    torch.cat([member[start:stop] for member in targets]).to(device), context)
            raw = np.asarray(raw.detach().cpu(), np.float32)
            pixels = batch.cpu().numpy()
            for index, own in enumerate(np.split(raw, group_size)[:len(models)]):
                output = BatchOutput(images=method.render(own, pixels), raw=own)
                outputs[index].append(method.checked_output(output, batch))
    return [Explanation(images=np.concatenate([o.images for o in own]),
                        targets=targets[index].numpy().astype(np.int64), params=description,
                        raw=np.concatenate([o.raw for o in own]))
            for index, own in enumerate(outputs)]
