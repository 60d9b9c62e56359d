"""Detectors scored as the explanation methods are: the anomaly score of a model's output against
the references' (SPEC "Anomaly score"), in the same tidy frames, so that Table 1's rule, the null
p-values, the verdicts and Table 2 read a detector's rows as they read a method's.

What is compared is the detector's output, with the Euclidean distance between vectors in place
of an image distance (``StatisticDistance``):
- a detector that scores inputs (``Detector.scores_inputs``: STRIP's entropy of each input, ...)
  gives a vector per image of each set, and is scored per image on the same images as the
  methods: the detection set for Table 1, a localizable model's abnormal and normal images for
  Table 2;
- any other detector gives one vector for the model (Neural Cleanse's per-class trigger norms,
  the weight statistics, ...): one "image", the pseudo set ``MODEL_SET``, for Table 1; Table 2
  does not apply to it (it says nothing of an input).

A reference is scored leave-one-out against the others, as everywhere. The frames carry the run's
distance name in their ``distance`` column, so that every table of the run holds them; the
captions say what a detector's distance is.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from counteraudit.anomalies.image_sets import DETECTION, abnormal_set_name, localizable, normal_images
from counteraudit.evaluate.defect_detectors.detectors import DETECTORS
from counteraudit.evaluate.defect_detectors.stage import StoredInspection
from counteraudit.evaluate.scoring.detection import NO_LAYER
from counteraudit.evaluate.scoring.distances.base import Distance, Features
from counteraudit.evaluate.scoring.scores import SCORE_COLUMNS, anomaly_scores
from counteraudit.explain.stage import load_image_sets
from counteraudit.train.core.suite import Suite
from counteraudit.train.worlds import build_world

MODEL_SET = "model"  # the pseudo image set of a model-level detector: one row, the model
STATISTIC_DISTANCE = "euclidean distance between the detectors' output vectors"
Inspections = Mapping[tuple[str, str], StoredInspection]


class StatisticDistance(Distance):
    """Euclidean distance between two detector outputs (float64 vectors), each sum exactly
    rounded (``math.fsum``), so the same on every CPU. Not an image distance: it is not in
    ``DISTANCES`` and no ``--distance`` names it."""
    name = "detector-statistic"

    def features(self, images: np.ndarray) -> Features:
        vectors = np.asarray(images, dtype=np.float64)
        vectors = vectors.reshape(len(vectors), -1)
        return Features(self.name, (torch.from_numpy(np.ascontiguousarray(vectors)),), (1, 1))

    def paired(self, features_a: Features, features_b: Features) -> np.ndarray:
        self._check_pair(features_a, features_b)
        (a,), (b,) = features_a.tensors, features_b.tensors
        if a.shape != b.shape:
            raise ValueError(f"detector outputs of different lengths: {tuple(a.shape)} and "
                             f"{tuple(b.shape)}; a detector must give every model a vector of one "
                             "length")
        difference = (a - b).numpy()
        return np.array([math.sqrt(math.fsum(row * row)) for row in difference])


def _vectors(inspections: Inspections, detector: str, model: str, image_set: str) -> np.ndarray:
    inspection = inspections[(detector, model)].inspection
    if image_set == MODEL_SET:
        return np.asarray(inspection.statistic, dtype=np.float64)[None, :]
    if image_set not in inspection.per_input:
        raise KeyError(f"the {detector} inspection of {model} has no scores of the image set "
                       f"{image_set!r} (it has {sorted(inspection.per_input)})")
    return inspection.per_input[image_set]


def score_detector_set(inspections: Inspections, references: Sequence[str], detector: str,
                       image_set: str, models: Sequence[str], distance_name: str) -> pd.DataFrame:
    """Anomaly scores of ``models`` on one image set (or ``MODEL_SET``), as ``scoring.stage.
    score_set`` gives a method's."""
    needed = list(dict.fromkeys([*references, *models]))
    distance = StatisticDistance()
    features = {model: distance.features(_vectors(inspections, detector, model, image_set))
                for model in needed}
    table = anomaly_scores(features, list(references), distance, models=needed,
                           labels={"distance": distance_name, "method": detector,
                                   "layer": NO_LAYER, "image_set": image_set})
    return table[table["model"].isin(list(models))].reset_index(drop=True)


def detection_set_of(detector: str) -> str:
    """The set a detector's Table 1 row reads: the detection set for one that scores inputs,
    the model itself for the others."""
    return DETECTION if DETECTORS.get(detector).scores_inputs else MODEL_SET


def detector_detection_scores(suite: Suite, detectors: Sequence[str], inspections: Inspections,
                              distance_name: str) -> pd.DataFrame:
    """Every model's scores per detector, on its ``detection_set_of`` (Table 1's input)."""
    references = [s.name for s in suite.references]
    models = [s.name for s in suite.models]
    frames = [score_detector_set(inspections, references, name, detection_set_of(name), models,
                                 distance_name) for name in detectors]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["distance", "method", "layer", "image_set", *SCORE_COLUMNS])


def localizing_detectors(detectors: Sequence[str]) -> list[str]:
    """The detectors Table 2 applies to: those that score inputs."""
    return [name for name in detectors if DETECTORS.get(name).scores_inputs]


def detector_localization_scores(suite: Suite, detectors: Sequence[str], inspections: Inspections,
                                 distance_name: str, runs_root=None) -> pd.DataFrame:
    """As ``scoring.stage.localization_scores`` for the detectors that score inputs: each
    localizable model's scores on its abnormal set (abnormal = True) and its normal images."""
    references = [s.name for s in suite.references]
    world = build_world(suite.world, runs_root=runs_root)
    image_sets = load_image_sets(suite, runs_root, world)
    frames = []
    for name in localizing_detectors(detectors):
        for spec in localizable(suite):
            normal_set, normal = normal_images(suite, spec, world, image_sets)
            on_normal = score_detector_set(inspections, references, name, normal_set, [spec.name],
                                           distance_name)
            abnormal = score_detector_set(inspections, references, name, abnormal_set_name(spec),
                                          [spec.name], distance_name)
            frames += [on_normal[on_normal["image"].isin(normal)].assign(abnormal=False),
                       abnormal.assign(abnormal=True)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["distance", "method", "layer", "image_set", *SCORE_COLUMNS, "abnormal"])
