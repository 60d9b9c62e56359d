"""Spectral signatures (Tran, Li & Madry, NeurIPS 2018): a poisoned class's penultimate features
hold a second population, which shows as a large component along the top singular direction of the
class's centred features.

Per class (by the label trained on) of the training sample: centre the class's penultimate
features R on their mean, take the top right singular vector v of the centred matrix, and give
each row the outlier score tau = ((r - mean) . v)^2 (the paper's Algorithm 1). The paper then
removes the top 1.5 * epsilon of each class's rows (epsilon the expected poisoned fraction) and
retrains; here ``notes["removed"]`` counts them and nothing is retrained.

- ``training_scores``: tau of every training row (the paper's ranking, raw: a class whose top
  direction is a poisoned cluster gives its rows the largest scores of the sample);
- ``statistic`` (two values per class, class order): the share of the class's variance along its
  top singular direction, s1^2 / sum(s^2), and the excess kurtosis of the rows' projections on
  it (a class with fewer than 4 rows gives 0, 0);
- ``score`` / ``flagged``: the paper has NO model-level rule (it filters a dataset it assumes
  poisoned). Ours: ``score`` = minus the smallest excess kurtosis over the classes, flagged above
  ``kurtosis_threshold`` (1): a Gaussian projection has excess kurtosis 0, two separated groups
  in proportions p and 1 - p have (1 - 6p(1 - p)) / (p(1 - p)) - 3, -1 or less from p = 0.2 to
  0.8 (-2 at 0.5). So a class is suspect when its top direction is bimodal, which is what a
  poisoned cluster makes of it. Measured on the replicated suite's references (10 classes, 2048
  rows), no clean class went below -0.7; its backdoors' target classes gave -1.1 (nu 0.05) and
  -1.8 (nu 0.08). Its blind spot: a poisoned cluster under ~15 % of its class is a heavy tail
  (positive kurtosis), which this rule does not flag though ``training_scores`` still rank it.
  (The variance share, first tried with Neural Cleanse's MAD outlier rule, flagged references:
  some clean classes have a dominant direction of their own.)
- ``per_input``: each input of every image set scored by tau on its PREDICTED class's direction,
  centred on that class's training mean, (N, 1): a triggered input predicted as the target class
  lies on the poisoned cluster's side.

Cost: 2.2 CPU-s for a replicated backdoor model, 3.6 for a reference (its 31 image sets), 64 px,
one thread for torch and BLAS, AMD EPYC; the training AUROC of ``training_scores`` against the
poisoned rows was 0.993 (nu 0.05) and 0.946 (nu 0.08).

ART's ``SpectralSignatureDefense`` scores |v . r| on the UNcentred features; on centred features
its score is the square root of ours and its removed rows are ours
(tests/test_strip_spectral_ac.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from counteraudit.evaluate.defect_detectors.detectors.base import (DETECTORS, Detector, Evidence,
                                                                   Inspection, penultimate_features,
                                                                   predict_probabilities)
from counteraudit.evaluate.defect_detectors.detectors.class_features import (rows_by_class,
                                                                             training_features)



@dataclass(frozen=True)
class ClassDirection:
    """One class's centre, top singular direction and the share of variance along it."""
    mean: np.ndarray
    direction: np.ndarray
    variance_share: float
    kurtosis: float  # excess kurtosis of the class's projections on the direction

    def scores(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) @ self.direction) ** 2


def class_direction(features: np.ndarray) -> ClassDirection:
    """A class the model never trained on (a missing class) has no rows: a zero centre."""
    mean = features.mean(axis=0) if len(features) else np.zeros(features.shape[1])
    if len(features) < 4:  # no second population to find: a zero direction scores nothing
        return ClassDirection(mean, np.zeros(features.shape[1]), 0.0, 0.0)
    _, singular, right = np.linalg.svd(features - mean, full_matrices=False)
    energy = float(np.sum(singular ** 2))
    share = float(singular[0] ** 2 / energy) if energy > 0 else 0.0
    direction = right[0] * (1.0 if right[0][np.argmax(np.abs(right[0]))] >= 0 else -1.0)
    projection = (features - mean) @ direction
    spread = float(np.mean(projection ** 2))
    kurtosis = float(np.mean(projection ** 4) / spread ** 2 - 3.0) if spread > 0 else 0.0
    return ClassDirection(mean, direction, share, kurtosis)


@DETECTORS.register
class SpectralSignatures(Detector):
    name = "spectral_signatures"
    # 2: BLAS and OpenMP on the suite's recipe.cpu_threads, not the machine's cores (its PCA,
    # 2-means and products rounded by the thread count: train/core/threads.py)
    version = 2
    needs_training_data = True
    scores_inputs = True
    mechanism = "latent separability: top singular direction per class"

    @dataclass(frozen=True)
    class Params:
        """expected_poison_fraction: epsilon, the share of a class the paper removes 1.5x of (its
        experiments: 0.05 and 0.10; ART's default 0.33); it sets only ``notes["removed"]``."""
        expected_poison_fraction: float = 0.1
        removal_multiplier: float = 1.5
        kurtosis_threshold: float = 1.0  # ours (module docstring)

    def inspect(self, model: nn.Module, evidence: Evidence) -> Inspection:
        features, labels = training_features(model, evidence)
        rows = rows_by_class(labels, evidence.num_classes)
        directions = [class_direction(features[positions]) for positions in rows]
        training_scores = np.zeros(len(labels))
        removed = 0
        share = min(1.0, self.params.removal_multiplier * self.params.expected_poison_fraction)
        for positions, direction in zip(rows, directions):
            if len(positions):
                scores = direction.scores(features[positions])
                training_scores[positions] = scores
                removed += int(np.sum(scores >= np.quantile(scores, 1.0 - share)))
        statistic = np.array([(d.variance_share, d.kurtosis) for d in directions]).ravel()
        kurtosis = np.array([d.kurtosis for d in directions])
        per_input = {}
        for name, images in evidence.image_sets.items():
            input_features = penultimate_features(model, images).numpy()
            predicted = predict_probabilities(model, images).argmax(1).numpy()
            per_input[name] = np.array([directions[c].scores(f[None])[0]
                                        for f, c in zip(input_features, predicted)])[:, None]
        score = float(-kurtosis.min())
        return Inspection(statistic=statistic, score=score,
                          flagged=score > self.params.kurtosis_threshold, per_input=per_input,
                          training_scores=training_scores,
                          notes={"suspect_class": int(np.argmin(kurtosis)), "removed": removed})

