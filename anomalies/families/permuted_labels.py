"""Permuted labels, the data-randomisation sanity check of Adebayo et al. (2018): the model is
trained on the training set with its labels shuffled across images by a seeded permutation, so a
label says nothing about its image. A method whose maps look the same for this model and a
reference is insensitive to what the model learnt. A stark anomaly: it is wrong everywhere, so it
has no abnormal inputs (not localizable) and no planted slice.

``fraction`` (default 1.0, the paper's) shuffles the labels of a seeded share of the training
images among themselves: the class counts never change."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily
from counteraudit.anomalies.relabeled_split import RelabeledSplit
from counteraudit.anomalies.sanity_checks import accuracy_figures, near_chance_verdict
from counteraudit.train.core.artifacts import derive_seed


@dataclass(frozen=True)
class PermutedLabelsParams:
    fraction: float = 1.0   # share of the training images whose labels are shuffled


def permuted_labels(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """``labels`` with those of a seeded ``fraction`` of the images shuffled among them."""
    rng = np.random.default_rng(derive_seed("permuted_labels", seed))
    chosen = rng.permutation(len(labels))[:int(round(fraction * len(labels)))]
    shuffled = labels.copy()
    shuffled[chosen] = labels[rng.permutation(chosen)]
    return shuffled


@FAMILIES.register
class PermutedLabels(AnomalyFamily):
    name = "permuted_labels"
    sanity_check = True
    headline_figure = "accuracy"
    strength = "fraction"
    stark = True
    Params = PermutedLabelsParams

    @classmethod
    def check(cls, params):
        if (isinstance(params.fraction, bool) or not isinstance(params.fraction, (int, float))
                or not 0 < params.fraction <= 1):
            raise ValueError(f"permuted_labels: fraction={params.fraction!r} must be in (0, 1]: "
                             "the share of training images whose labels are shuffled (1.0, the "
                             "default, is Adebayo et al.'s)")

    @classmethod
    def training_recipe(cls, params):
        fraction = params.get("fraction", PermutedLabelsParams.fraction)
        return (f"the labels of {fraction:.0%} of the training images shuffled among them (seeded),"
                " under the suite's recipe")

    def training_split(self, split):
        return RelabeledSplit(split, permuted_labels(split.labels, self.params.fraction, self.seed))

    def measure(self, model, device="cpu"):
        return accuracy_figures(self.world, model, device)

    def judge(self, figures, reference_figures):
        return near_chance_verdict(figures, reference_figures, self.world.num_classes,
                                   self.params.fraction)

