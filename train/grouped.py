"""k models of one architecture as one network: model i's weights are block i of every layer.

Convolutions get ``groups = k`` (model i's channels are group i, so no value crosses from one
model to another), one BatchNorm holds the k models' channels (statistics per channel, so each
model keeps its own), and the k output layers become one batched product (``GroupedLinear``).
The k models' images enter side by side as channel groups, (B, k * 3, H, W); the logits come out
as (B, k, classes).

``stacked_state`` and ``member_state`` convert between the grouped network's state dict and each
model's own (the state dict of a solo backbone, the keys and shapes ``weights.pth`` holds), so a
model trained in a group is saved, loaded and resumed as any other. The trainer's grouped engine
(train/group_trainer.py) trains on it; evaluate/benchmarks/grouped_training.py times it.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from counteraudit.train.architectures import Classifier

# How a grouped state tensor holds the k models' tensors: "blocks" (concatenated along dim 0:
# convolution weights, BatchNorm parameters and statistics), "stacked" (a new leading dim of k:
# the output layers), "shared" (one value for all: BatchNorm's step count, equal in lockstep).
BLOCKS, STACKED, SHARED = "blocks", "stacked", "shared"


class GroupedLinear(nn.Module):
    """k linear layers as one batched product: (B, k * F) -> (B, k, out)."""

    def __init__(self, layers: Sequence[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        features = features.view(features.shape[0], self.weight.shape[0], -1)
        return torch.einsum("bkf,kof->bko", features, self.weight) + self.bias


def grouped_network(models: Sequence[nn.Module]) -> nn.Module:
    """One network computing k models of one architecture side by side: input (B, k * 3, H, W),
    the k models' images as channel groups; output (B, k, classes). Model i's weights, BatchNorm
    statistics included, are channel block i of each layer."""
    network = copy.deepcopy(models[0])
    sources = [dict(model.named_modules()) for model in models]
    modules = dict(network.named_modules())
    for name, module in list(modules.items()):
        parts = [source[name] for source in sources]
        if isinstance(module, nn.Conv2d):
            new = nn.Conv2d(len(models) * module.in_channels, len(models) * module.out_channels,
                            module.kernel_size, module.stride, module.padding,
                            bias=module.bias is not None, groups=len(models) * module.groups,
                            dtype=module.weight.dtype)
        elif isinstance(module, nn.BatchNorm2d):
            new = nn.BatchNorm2d(len(models) * module.num_features, module.eps, module.momentum,
                                 dtype=module.weight.dtype)
        elif isinstance(module, nn.Linear):
            new = GroupedLinear(parts)
        elif next(module.parameters(recurse=False), None) is not None:
            raise ValueError(f"layer {name!r} ({type(module).__name__}) has weights of a kind a "
                             "grouped network cannot hold (convolutions, BatchNorm and linear "
                             "layers only); train this architecture with engine = \"alone\"")
        else:
            continue
        parent, _, attribute = name.rpartition(".")
        setattr(modules[parent] if parent else network, attribute, new)
    network.load_state_dict(stacked_state(network, [model.state_dict() for model in models]))
    return network


def state_layout(network: nn.Module) -> dict[str, str]:
    """Each state-dict entry of a grouped network: how it holds the k models' (module constants)."""
    layout = {}
    for name, module in network.named_modules():
        prefix = f"{name}." if name else ""
        kind = (STACKED if isinstance(module, GroupedLinear) else
                BLOCKS if isinstance(module, (nn.Conv2d, nn.BatchNorm2d)) else None)
        if kind is None:
            continue
        for key, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            layout[prefix + key] = SHARED if key == "num_batches_tracked" else kind
    return layout


def stacked_state(network: nn.Module, states: Sequence[dict[str, torch.Tensor]]
                  ) -> dict[str, torch.Tensor]:
    """The grouped network's state dict holding the k models' own state dicts."""
    stacked = {}
    for key, kind in state_layout(network).items():
        tensors = [state[key] for state in states]
        stacked[key] = (torch.cat(tensors) if kind == BLOCKS else torch.stack(tensors)
                        if kind == STACKED else tensors[0].clone())
    return stacked


def member_tensor(tensor: torch.Tensor, kind: str, index: int, count: int) -> torch.Tensor:
    """Model ``index``'s part of a grouped tensor (a copy, in the contiguous layout)."""
    if kind == BLOCKS:
        tensor = tensor.reshape(count, -1, *tensor.shape[1:])[index]
    elif kind == STACKED:
        tensor = tensor[index]
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def member_state(network: nn.Module, index: int, count: int) -> dict[str, torch.Tensor]:
    """Model ``index``'s own state dict, as its solo backbone's ``state_dict()`` keys it."""
    layout = state_layout(network)
    return {key: member_tensor(value, layout[key], index, count)
            for key, value in network.state_dict().items()}


def member_optimizer_state(optimizer: torch.optim.Optimizer, network: nn.Module, index: int,
                           count: int) -> dict[str, Any]:
    """Model ``index``'s share of an optimizer over the grouped network's parameters, in the form
    of a solo optimizer's ``state_dict()`` over its backbone (the parameters in the same order)."""
    whole = optimizer.state_dict()
    kinds = _parameter_kinds(network)
    state = {position: {name: (member_tensor(value, kinds[position], index, count)
                               if torch.is_tensor(value) and value.dim() > 0 else value)
                        for name, value in entry.items()}
             for position, entry in whole["state"].items()}
    return {"state": state, "param_groups": copy.deepcopy(whole["param_groups"])}


def load_member_optimizer_states(optimizer: torch.optim.Optimizer, network: nn.Module,
                                 states: Sequence[dict[str, Any]]) -> None:
    """Load the k models' solo-form optimizer states (``member_optimizer_state``) into the
    optimizer over the grouped network (the param groups are the first model's: one recipe)."""
    kinds = _parameter_kinds(network)
    merged = {}
    for position in states[0]["state"]:
        entries = [state["state"][position] for state in states]
        merged[position] = {
            name: ((torch.cat if kinds[position] == BLOCKS else torch.stack)(
                [entry[name] for entry in entries]) if torch.is_tensor(value) and value.dim() > 0
                   else value)
            for name, value in entries[0].items()}
    optimizer.load_state_dict({"state": merged, "param_groups": states[0]["param_groups"]})


def _parameter_kinds(network: nn.Module) -> list[str]:
    layout = state_layout(network)
    return [layout[name] for name, _ in network.named_parameters()]


class PerModelLogits(nn.Module):
    """The grouped network seen as one classifier of k * B images: logits (B * k, classes),
    image b of model i at row b * k + i."""

    def __init__(self, network: nn.Module):
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.network(images)
        return logits.reshape(-1, logits.shape[-1])


class GroupedClassifier(nn.Module):
    """k Classifiers with one output layer's classes as one module: images in [0, 1], (B, k * 3,
    H, W); logits (B, k, classes of the world), each model's normalised and spread into the
    world's class indices as its own Classifier does."""

    def __init__(self, members: Sequence[Classifier]):
        super().__init__()
        first = members[0]
        self.count = len(members)
        self.backbone = grouped_network([member.backbone for member in members])
        self.register_buffer("mean", first.mean.repeat(1, self.count, 1, 1), persistent=False)
        self.register_buffer("std", first.std.repeat(1, self.count, 1, 1), persistent=False)
        # what Classifier.in_class_indices reads: the grouping gives every member the same
        self.num_classes = first.num_classes
        self.register_buffer("output_classes", first.output_classes, persistent=False)

    in_class_indices = Classifier.in_class_indices

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.backbone((images - self.mean) / self.std)
        rows = self.in_class_indices(logits.reshape(-1, logits.shape[-1]))
        return rows.view(logits.shape[0], self.count, -1)

    def member_state(self, index: int) -> dict[str, torch.Tensor]:
        return member_state(self.backbone, index, self.count)


class MemberView(nn.Module):
    """Member ``index`` of a grouped classifier seen as its own Classifier, for a family whose
    training runs the model (PGD): ``model``'s modules computing with views of the member's block
    of the grouped parameters and BatchNorm statistics, so a pass costs one solo pass, and a
    training-mode pass updates the member's statistics in the group, as the solo trainer's attack
    updates its model's. BatchNorm's step count (unused: the momentum is set) is a private copy,
    so the group's counts only the group's passes."""

    def __init__(self, grouped: GroupedClassifier, model: Classifier, index: int):
        super().__init__()
        self.model = model
        self.grouped = [grouped]  # not a submodule: its parameters are not this view's
        self.index = index

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        grouped = self.grouped[0]
        self.model.train(grouped.training)
        layout = state_layout(grouped.backbone)
        tensors = {}
        for key, value in [*grouped.backbone.named_parameters(), *grouped.backbone.named_buffers()]:
            kind = layout[key]
            tensors[f"backbone.{key}"] = (value.unflatten(0, (grouped.count, -1))[self.index]
                                          if kind == BLOCKS else value[self.index]
                                          if kind == STACKED else value.clone())
        return functional_call(self.model, tensors, (images,))
