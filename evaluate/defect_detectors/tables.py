"""The tables only detectors have, beside their rows in Tables 1 and 2:

- ``detector-own-rule``: per (family, detector) the share of models the detector's *own*
  published rule flags (Neural Cleanse's anomaly index above 2, ...), with its exact 95% interval;
  the held-out references' row is that rule's false-positive rate on clean models. Table 1's
  verdicts judge the same detectors against the null population instead; the two can disagree,
  and where they do the benchmark's verdict is the one calibrated on this world.
- ``detector-trigger-masks``: for each reverse-engineering detector and each model whose defect is
  a fixed-position pixel trigger, the recovered mask against the planted trigger's footprint:
  the pixel-level AUROC (footprint pixels positive) and the share of the mask's mass inside it.
- ``detector-training-localization``: for each detector that reads training data and each model
  whose family changed only some training rows, the AUROC of its suspicion of each training
  image for the rows the family changed (poisoned) against the rest.
- ``inspect-time``: what each detector cost, in the explain-time table's form, per model.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from counteraudit.anomalies.image_sets import DETECTION
from counteraudit.evaluate.defect_detectors.detectors import DETECTORS
from counteraudit.evaluate.defect_detectors.stage import StoredInspection
from counteraudit.evaluate.scoring.detection import NULL_FAMILY, ROLE_REFERENCE
from counteraudit.evaluate.scoring.localization import auroc
from counteraudit.explain.stage import load_image_sets
from counteraudit.train.core.suite import Suite
from counteraudit.train.training_parts import build_family
from counteraudit.train.worlds import build_world

OWN_RULE = "detector-own-rule"
TRIGGER_MASKS = "detector-trigger-masks"
TRAINING_LOCALIZATION = "detector-training-localization"
INSPECT_TIME = "inspect-time"
# A pixel belongs to a trigger's footprint when the abnormal inputs change it on at least this
# share of images; a defect whose changes fall mostly outside such a fixed footprint (blurred
# faces, a spurious cue drawn where the object is) has no trigger to compare a mask with.
FOOTPRINT_SHARE = 0.9
Inspections = Mapping[tuple[str, str], StoredInspection]
CAPTIONS = {
    OWN_RULE: ("Each detector's own published rule (not the benchmark's verdict): the share of each "
               "family's models it flags, exact 95% interval; the null row is its false-positive "
               "rate on clean held-out models, the references' row its rate on the references"),
    TRIGGER_MASKS: ("Trigger reverse-engineering: each recovered mask against the planted trigger's "
                    "footprint (pixel AUROC, footprint pixels positive; share of the mask's mass "
                    "inside the footprint)"),
    TRAINING_LOCALIZATION: ("Training-data detectors on the training images they read: AUROC of "
                            "their suspicion of each image for the rows the anomaly family changed "
                            "(poisoned) against the rest"),
    INSPECT_TIME: ("What each detector cost, as recorded where each inspection was computed: wall "
                   "and CPU seconds summed over the models, and CPU seconds per model"),
}


def _roles(suite: Suite) -> dict[str, tuple[str, str]]:
    """model -> (family column, role) as Table 1 names them."""
    roles = {s.name: (ROLE_REFERENCE, ROLE_REFERENCE) for s in suite.references}
    roles.update({s.name: (NULL_FAMILY, "null") for s in suite.held_out})
    roles.update({s.name: (s.family, "anomalous") for s in suite.anomalies})
    return roles


def own_rule_table(suite: Suite, detectors: Sequence[str], inspections: Inspections
                   ) -> pd.DataFrame:
    """Per (family, detector): n_models, n_flagged, rate_flagged with its exact 95% interval
    (models of a family, then the held-out references as the null row, then the references).
    A control without a rule of its own has no rows."""
    roles = _roles(suite)
    order = list(dict.fromkeys([s.family for s in suite.anomalies] + [NULL_FAMILY, ROLE_REFERENCE]))
    rows = []
    for detector in detectors:
        flags: dict[str, list[bool]] = {}
        for spec in suite.models:
            flagged = inspections[(detector, spec.name)].inspection.flagged
            if flagged is not None:
                flags.setdefault(roles[spec.name][0], []).append(bool(flagged))
        for family in [f for f in order if f in flags]:
            values = flags[family]
            interval = binomtest(sum(values), len(values)).proportion_ci(method="exact")
            rows.append({"family": family, "detector": detector, "n_models": len(values),
                         "n_flagged": sum(values), "rate_flagged": sum(values) / len(values),
                         "low": interval.low, "high": interval.high})
    return pd.DataFrame(rows, columns=["family", "detector", "n_models", "n_flagged",
                                       "rate_flagged", "low", "high"])


def trigger_footprint(family, images, labels) -> np.ndarray | None:
    """(H, W) bool: the pixels the family's abnormal inputs change on at least FOOTPRINT_SHARE of
    ``images``; None where its changes are not such a fixed footprint (module docstring)."""
    changed = (family.abnormal_images(images, labels) != images).any(dim=1).numpy()  # (N, H, W)
    share = changed.mean(axis=0)
    footprint = share >= FOOTPRINT_SHARE
    if not footprint.any() or changed[:, footprint].sum() < 0.5 * changed.sum():
        return None
    return footprint


def trigger_mask_table(suite: Suite, detectors: Sequence[str], inspections: Inspections,
                       runs_root=None) -> pd.DataFrame:
    """Per (reverse-engineering detector, model with a pixel trigger): mask_auroc, mass_inside,
    trigger_pixels, and the detector's own flag."""
    reversing = [d for d in detectors if DETECTORS.get(d).reverse_engineers_trigger]
    rows = []
    if not reversing:
        return pd.DataFrame(rows)
    world = build_world(suite.world, runs_root=runs_root)
    detection = load_image_sets(suite, runs_root, world)[DETECTION]
    images, labels = detection.tensor(), np.asarray(detection.labels)
    for spec in suite.anomalies:
        family = build_family(spec, world)
        footprint = trigger_footprint(family, images, labels)
        if footprint is None:
            continue
        for detector in reversing:
            inspection = inspections[(detector, spec.name)].inspection
            if inspection.mask is None:
                continue
            mask = np.asarray(inspection.mask, dtype=np.float64)
            rows.append({"family": spec.family, "model": spec.name, "detector": detector,
                         "trigger_pixels": int(footprint.sum()),
                         "mask_auroc": auroc(mask[footprint], mask[~footprint]),
                         "mass_inside": float(mask[footprint].sum() / mask.sum())
                         if mask.sum() > 0 else np.nan,
                         "flagged": inspection.flagged})
    return pd.DataFrame(rows, columns=["family", "model", "detector", "trigger_pixels",
                                       "mask_auroc", "mass_inside", "flagged"])


def training_localization_table(suite: Suite, detectors: Sequence[str], inspections: Inspections,
                                runs_root=None) -> pd.DataFrame:
    """Per (training-data detector, model whose family changed some training rows but not all):
    n_changed of n_images and the AUROC of the detector's training scores for the changed rows."""
    reading = [d for d in detectors if DETECTORS.get(d).needs_training_data]
    if not reading:
        return pd.DataFrame()
    rows = []
    for spec in suite.anomalies:
        for detector in reading:
            stored = inspections[(detector, spec.name)]
            values, changed = stored.inspection.training_scores, stored.training_changed
            if values is None or changed is None or changed.all() or not changed.any():
                continue
            rows.append({"family": spec.family, "model": spec.name, "detector": detector,
                         "n_images": len(values), "n_changed": int(changed.sum()),
                         "auroc": auroc(values[changed], values[~changed])})
    return pd.DataFrame(rows, columns=["family", "model", "detector", "n_images", "n_changed",
                                       "auroc"])


def inspect_time_table(suite: Suite, detectors: Sequence[str], inspections: Inspections
                       ) -> pd.DataFrame:
    """One row per detector: models inspected, wall and CPU seconds summed over them (as recorded
    where each was computed), and CPU seconds per model."""
    rows = []
    for detector in detectors:
        costs = [inspections[(detector, s.name)].cost for s in suite.models]
        seconds = sum(c["seconds"] for c in costs)
        cpu = sum(c["cpu_seconds"] for c in costs)
        rows.append({"method": detector, "models": len(costs), "seconds": seconds,
                     "cpu_seconds": cpu, "cpu_seconds_per_model": cpu / len(costs)})
    return pd.DataFrame(rows, columns=["method", "models", "seconds", "cpu_seconds",
                                       "cpu_seconds_per_model"])


def detector_tables(suite: Suite, detectors: Sequence[str], inspections: Inspections,
                    runs_root=None) -> dict[str, pd.DataFrame]:
    return {OWN_RULE: own_rule_table(suite, detectors, inspections),
            TRIGGER_MASKS: trigger_mask_table(suite, detectors, inspections, runs_root),
            TRAINING_LOCALIZATION: training_localization_table(suite, detectors, inspections,
                                                               runs_root),
            INSPECT_TIME: inspect_time_table(suite, detectors, inspections)}
