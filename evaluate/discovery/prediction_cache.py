"""A model's stored predictions on generated subgroups, so that a subgroup several work items need
(a subdomain that many models' searches visit, evaluated on every reference) is predicted once
per model: ``store/subgroup-predictions/<hash of the model key and world>/batch-*.npz``, one
batch file per writer, each written atomically and never changed (two writers at once each
write their own file; a subgroup in both holds the same bits)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from counteraudit.evaluate.discovery.auditors.base import Subgroup
from counteraudit.train.core.artifacts import atomic_save_npz, inside_runs, stable_hash, store_dir
from counteraudit.train.core.payloads import read_npz
from counteraudit.train.core.model_spec import ModelSpec

PREDICTIONS = "subgroup-predictions"


class PredictionCache:
    """One reference's predictions on generated subgroups, read from and added to its folder.

    ``get(subgroup)`` -> (probabilities, labels) or None; ``put`` keeps new ones in memory until
    ``save`` writes them as one more batch file (atomic; a batch never changes once written)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.known: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.new: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for batch in sorted(inside_runs(self.directory, reading=True).glob("batch-*.npz")):
            arrays = read_npz(inside_runs(batch, reading=True), "stored subgroup predictions")  # unreadable: set aside
            for name in arrays or {}:
                if name.startswith("p_") and "l_" + name[2:] in arrays:
                    self.known[name[2:]] = (arrays[name], arrays["l_" + name[2:]])

    @staticmethod
    def key(subgroup: Subgroup) -> str:
        return stable_hash(subgroup.to_dict(), length=20)

    def get(self, subgroup: Subgroup) -> tuple[np.ndarray, np.ndarray] | None:
        key = self.key(subgroup)
        return self.known.get(key) or self.new.get(key)

    def put(self, subgroup: Subgroup, probabilities: np.ndarray, labels: np.ndarray) -> None:
        self.new[self.key(subgroup)] = (np.asarray(probabilities), np.asarray(labels))

    def save(self) -> None:
        if not self.new:
            return
        arrays = {}
        for key, (probabilities, labels) in sorted(self.new.items()):
            arrays["p_" + key], arrays["l_" + key] = probabilities, labels
        atomic_save_npz(self.directory / f"batch-{stable_hash(sorted(self.new), length=16)}.npz",
                        **arrays)
        self.known.update(self.new)
        self.new = {}


def predictions_dir(runs_root, reference: ModelSpec, world: dict[str, Any]) -> Path:
    return store_dir(runs_root) / PREDICTIONS / stable_hash({"reference_id": reference.key,
                                                             "world": dict(world)}, length=16)


