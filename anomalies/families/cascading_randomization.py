"""Cascading randomisation, the model-randomisation sanity check of Adebayo et al. (2018): a
trained reference with its top ``depth`` layer groups re-initialised at random (seeded), counted
from the output layer down. The model is not trained: the trainer loads the reference of seed
``reference_seed`` (training it first if it is not yet) and hands it to ``derive``
(``AnomalyFamily.reference_seed``). A method whose maps look the same for this model and its
reference is insensitive to the model's weights. A stark anomaly: wrong everywhere, so it has no
abnormal inputs (not localizable) and no planted slice.

A layer group, on the project's ResNets, is a residual block (``layer4.0``: its convolutions and
BatchNorms together, as the block is the unit the network stacks) or a parameterised module
outside the stages (``fc``; the stem ``conv1`` with its BatchNorm ``bn1``), in the backbone's
module order, counted from the output: depth 1 is ``fc``, depth 2 adds the last block
(``layer4.0`` on small_resnet, ``layer4.2`` on resnet50), and so on. Re-initialising uses each
module's own ``reset_parameters`` (PyTorch's initialisation: random convolution and linear
weights; BatchNorm back to weight 1, bias 0 and fresh running statistics)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily
from counteraudit.anomalies.sanity_checks import accuracy_figures, near_chance_verdict
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.registries import ARCHITECTURES

# num_classes of the backbone built to count layer groups (the count does not depend on it)
_COUNTING_CLASSES = 10


@dataclass(frozen=True)
class CascadingParams:
    depth: int = 1            # layer groups re-initialised, from the output layer down
    reference_seed: int = 0   # the seed of the reference it is made from (the suite's first)


def layer_groups(backbone: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """(name, modules) of every layer group of a ResNet backbone, from the output layer down."""
    groups: list[tuple[str, list[nn.Module]]] = []
    for name, child in backbone.named_children():
        if isinstance(child, nn.Sequential):  # a stage: one group per residual block
            groups += [(f"{name}.{index}", [block]) for index, block in child.named_children()]
        elif isinstance(child, nn.modules.batchnorm._BatchNorm) and groups:
            # a BatchNorm normalises the layer just before it: one group with it
            previous, modules = groups[-1]
            groups[-1] = (f"{previous}+{name}", modules + [child])
        elif any(True for _ in child.parameters()):
            groups.append((name, [child]))
    return groups[::-1]


def group_count(architecture: str) -> int:
    """How many layer groups a model of ``architecture`` has (built on the meta device: no memory
    and no initialisation cost)."""
    with torch.device("meta"):
        return len(layer_groups(ARCHITECTURES.get(architecture).build_backbone(_COUNTING_CLASSES)))


def randomize_top(backbone: nn.Module, depth: int, seed: int) -> list[str]:
    """Re-initialise the top ``depth`` layer groups of ``backbone`` (on the CPU) from ``seed``;
    the names of the groups changed."""
    groups = layer_groups(backbone)[:depth]
    # A forked CPU generator: the same draws whatever ran before, and the caller's stream untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _, modules in groups:
            for module in modules:
                for part in module.modules():
                    if hasattr(part, "reset_parameters"):
                        part.reset_parameters()
    return [name for name, _ in groups]


@FAMILIES.register
class CascadingRandomization(AnomalyFamily):
    name = "cascading_randomization"
    sanity_check = True
    headline_figure = "accuracy"
    stark = True
    Params = CascadingParams

    @classmethod
    def check(cls, params):
        for name in ("depth", "reference_seed"):
            value = getattr(params, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"cascading_randomization: {name}={value!r} must be a whole number")
        if params.depth < 1:
            raise ValueError(f"cascading_randomization: depth={params.depth} must be >= 1 (1: the "
                             "output layer; each more adds the next layer group down)")

    @classmethod
    def check_suite(cls, params, architecture, reference_seeds):
        groups = group_count(architecture)
        if params["depth"] > groups:
            raise ValueError(f"cascading_randomization: depth={params['depth']} is more than the "
                             f"{groups} layer groups of {architecture}; give depth 1..{groups}")
        if params["reference_seed"] not in reference_seeds:
            raise ValueError(f"cascading_randomization: reference_seed={params['reference_seed']} "
                             "is not the seed of one of this suite's references (their seeds: "
                             f"{', '.join(map(str, reference_seeds))})")

    @classmethod
    def relative_training_cost(cls, params):
        return 0.0  # one evaluation pass: derived from a reference, not trained

    @classmethod
    def training_recipe(cls, params):
        p = CascadingParams(**params)
        return (f"not trained: the reference of seed {p.reference_seed} with its top {p.depth} "
                "layer group(s) re-initialised (seeded), from the output layer down")

    def reference_seed(self):
        return self.params.reference_seed

    def derive(self, model):
        randomize_top(model.backbone, self.params.depth,
                      derive_seed("cascading_randomization", self.seed))

    def measure(self, model, device="cpu"):
        return accuracy_figures(self.world, model, device)

    def judge(self, figures, reference_figures):
        return near_chance_verdict(figures, reference_figures, self.world.num_classes)
