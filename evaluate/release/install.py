"""Import a verified release into a runs folder's store: each model under its own key, each image
set under its id, written by the store's own writers (the payload first, the marker last), so a
suite that needs them finds them and trains nothing, and an interrupted import leaves nothing
that reads as finished. What the store already holds is kept, never overwritten.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counteraudit.anomalies.image_sets import IMAGE_SET
from counteraudit.evaluate.release.export import WEIGHTS_RELEASED
from counteraudit.evaluate.release.verify import VerifiedRelease, read_weights
from counteraudit.explain.stage import IMAGE_SETS
from counteraudit.train.checkpoint import METRICS_NAME, MODELS, TRAINED_MODEL, is_trained
from counteraudit.train.core.artifacts import atomic_torch_save, atomic_write_bytes, store_dir
from counteraudit.train.core.keyed_store import as_stored
from counteraudit.train.core.numerics import key_tag


@dataclass
class Imported:
    """What an import wrote, and what the store already held."""
    models: list[str] = field(default_factory=list)
    models_kept: list[str] = field(default_factory=list)
    image_sets: list[str] = field(default_factory=list)
    image_sets_kept: list[str] = field(default_factory=list)
    identical_weights: int = 0  # imported weights.pth whose bytes are the exporter's own


def _install_model(release: VerifiedRelease, key: str, store: Path, imported: Imported) -> bool:
    """One model's folder; False where the store already holds it trained."""
    directory = store / MODELS / key
    if is_trained(directory):
        return False
    prefix = f"models/{key}/"
    own = sorted(path for path in release.manifest.files if path.startswith(prefix))
    for path in own:  # spec, implant records and figures: plain JSON files, written as they are
        name = path.removeprefix(prefix)
        if name not in (METRICS_NAME, WEIGHTS_RELEASED):
            atomic_write_bytes(directory / name, release.read(path))
    metrics: dict[str, Any] = json.loads(release.read(prefix + METRICS_NAME))
    exported_digest = metrics.pop(TRAINED_MODEL.digest_field, None)
    weights = read_weights(release.read(prefix + WEIGHTS_RELEASED))
    metrics["imported_from"] = {"population": release.population_id, "source": release.source}
    record = TRAINED_MODEL.save(directory, key, lambda path: atomic_torch_save(path, weights), metrics)
    imported.identical_weights += record[TRAINED_MODEL.digest_field] == exported_digest
    return True


def _install_image_set(release: VerifiedRelease, set_id: str, store: Path) -> bool:
    folder = store / IMAGE_SETS / set_id
    if IMAGE_SET.is_stored(folder, set_id):
        return False
    prefix = f"image_sets/{set_id}/"
    for path in sorted(release.manifest.files):
        if path.startswith(prefix + "png/"):
            atomic_write_bytes(folder / path.removeprefix(prefix), release.read(path))
    index = json.loads(release.read(prefix + IMAGE_SET.marker))
    extra = {k: v for k, v in index.items() if k not in (IMAGE_SET.key_field, IMAGE_SET.digest_field)}
    images = release.read(prefix + IMAGE_SET.payload)
    IMAGE_SET.save(folder, set_id, lambda path: atomic_write_bytes(path, images), extra)
    return True


def mode_mismatch(release: VerifiedRelease) -> str | None:
    """Why this run's suites would not find the release's models, or None: their keys carry the
    numeric mode they were trained in (train/core/numerics.py), and this process runs another."""
    here = as_stored(key_tag())
    if release.manifest.numerics != here:
        return (f"the release was made with numerics {release.manifest.numerics}, and this run "
                f"uses {here}: suites run in this mode look for other keys and will train their "
                "own models (set COUNTERAUDIT_NUMERICS to the release's mode to use it)")
    return None


def install_release(release: VerifiedRelease, runs_root=None) -> Imported:
    store = store_dir(runs_root)
    imported = Imported()
    for entry in release.manifest.models:
        wrote = _install_model(release, entry.key, store, imported)
        (imported.models if wrote else imported.models_kept).append(entry.name)
    for entry in release.manifest.image_sets:
        wrote = _install_image_set(release, entry.id, store)
        (imported.image_sets if wrote else imported.image_sets_kept).append(entry.name)
    return imported
