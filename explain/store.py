"""Save and load one (model, method, image set) result, and tell whether it is already done.

A result lives in one folder as two files, both written atomically (train/core/artifacts.py):
- ``explanation.npz``: ``images`` (uint8), ``targets`` (int64), ``raw`` as float16 where the method
  has one (half the disk; far more precise than the uint8 images that distances use), ``layers``
  for per-layer methods, and ``diag_<name>`` for each diagnostic;
- ``params.json``: the result key (method, its recorded parameters, renderer version, model id,
  image set id), the SHA-256 of ``explanation.npz`` (a file that does not match it, e.g. a
  truncated one, is set aside and the result recomputed), plus shapes and layers, for people
  browsing the run folder, and ``timing``: what computing it cost where it ran (wall and
  process CPU seconds, and the images explained, rows taken from a stored result not counted),
  outside the key, so a rerun elsewhere reuses the result and keeps its first cost.
``params.json`` is removed before and written after the arrays, so it marks completion: a folder
without it, or whose key differs from the one asked for, is recomputed.

A chunked explain stage (explain/stage.py, ``chunk_images``) stores each image range of a set
as a *part*: the same two files in ``<result folder>/parts/<start>-<stop>/``, keyed like the full
result plus ``image_range``. ``gather_parts`` concatenates the parts into the full result (the
same files, key and arrays an unchunked run writes) and removes ``parts/``.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from counteraudit.explain.base import Explanation
from counteraudit.train.core.artifacts import atomic_save_npz, inside_runs
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.payloads import fields_problem, npz_arrays

ARRAYS_FILE = "explanation.npz"
PARAMS_FILE = "params.json"
DIAGNOSTIC_PREFIX = "diag_"
PARTS_DIR = "parts"
TIMING = "timing"  # params.json's field: {"seconds", "cpu_seconds", "images"}
RANGE_KEY = "image_range"  # [start, stop) of a part, in its key only
# One result (or part): its arrays, marked by params.json.
VISUALIZATION = KeyedArtifact(payload=ARRAYS_FILE, marker=PARAMS_FILE,
                              digest_field="arrays_sha256", what="visualization",
                              marker_what="visualization index", fields={"key": dict},
                              check=npz_arrays(aligned=False, images=(4, 5), targets=1))


def result_key(description: dict[str, Any], model_id: str, image_set_id: str) -> dict[str, Any]:
    """What identifies a result: ``ExplanationMethod.describe(...)`` + model and image set ids."""
    return {**description, "model_id": model_id, "image_set_id": image_set_id}


def part_dir(directory: str | os.PathLike, start: int, stop: int) -> Path:
    """The folder of the part holding images [start, stop) of the result in ``directory``."""
    return Path(directory) / PARTS_DIR / f"{start}-{stop}"


def part_key(key: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """The key of a part: the full result's key (``result_key``) plus its image range."""
    return {**key, RANGE_KEY: [int(start), int(stop)]}


def save_explanation(directory: str | os.PathLike, explanation: Explanation, model_id: str,
                     image_set_id: str, image_range: tuple[int, int] | None = None,
                     timing: dict[str, float] | None = None) -> dict[str, Any]:
    """Write one result into ``directory`` (a part's folder with ``image_range``, the images
    [start, stop) of the set, which its key then records); ``timing`` is what computing it cost
    (``TIMING``), None where nothing was computed. Returns what params.json holds."""
    arrays: dict[str, np.ndarray] = {"images": explanation.images,
                                     "targets": explanation.targets.astype(np.int64)}
    if explanation.raw is not None:
        arrays["raw"] = explanation.raw.astype(np.float16)
    if explanation.layers is not None:
        arrays["layers"] = np.array(explanation.layers, dtype=str)
    for name, values in explanation.diagnostics.items():
        arrays[DIAGNOSTIC_PREFIX + name] = np.asarray(values)
    key = result_key(explanation.params, model_id, image_set_id)
    if image_range is not None:
        key = part_key(key, *image_range)
    return VISUALIZATION.save(directory, key, lambda path: atomic_save_npz(path, **arrays), {
        "images_shape": list(explanation.images.shape),
        "layers": list(explanation.layers) if explanation.layers is not None else None,
        **({TIMING: timing} if timing is not None else {}),
    })


def stored_timing(directory: str | os.PathLike) -> dict[str, float] | None:
    """What computing the result in ``directory`` cost (``TIMING``), or None: not stored, or
    stored by a version that did not record it, or made of stored rows alone (or recorded in
    another shape than ``save_explanation`` writes: a cost is only reported)."""
    record = VISUALIZATION.read_marker(directory)
    timing = record.get(TIMING) if record else None
    if fields_problem(timing, dict.fromkeys(("seconds", "cpu_seconds", "images"), (int, float))):
        return None
    return timing


def total_timing(timings: list[dict[str, float] | None]) -> dict[str, float] | None:
    """The sum of the recorded costs (``TIMING``), None when none was recorded."""
    recorded = [t for t in timings if t is not None]
    if not recorded:
        return None
    return {field: sum(float(t[field]) for t in recorded)
            for field in ("seconds", "cpu_seconds", "images")}


def is_stored(directory: str | os.PathLike, key: dict[str, Any]) -> bool:
    """True if ``directory`` holds a finished result whose key equals ``key`` (see ``result_key``)."""
    return VISUALIZATION.is_stored(directory, key)


def load_explanation(directory: str | os.PathLike) -> Explanation:
    """The stored result (``raw`` comes back as float32 from its float16 copy)."""
    stored = VISUALIZATION.require(directory, f"no finished explanation in {directory}; "
                                              "run the explain stage for it")
    key = dict(stored["key"])
    key.pop("model_id", None)
    key.pop("image_set_id", None)
    key.pop(RANGE_KEY, None)
    with np.load(inside_runs(VISUALIZATION.payload_path(directory), reading=True)) as data:
        return Explanation(
            images=data["images"],
            targets=data["targets"],
            params=key,
            raw=data["raw"].astype(np.float32) if "raw" in data else None,
            layers=tuple(str(s) for s in data["layers"]) if "layers" in data else None,
            diagnostics={name[len(DIAGNOSTIC_PREFIX):]: data[name] for name in data.files
                         if name.startswith(DIAGNOSTIC_PREFIX)})


def stored_key(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The key of a finished result in ``directory`` (None if there is none)."""
    params = VISUALIZATION.read_marker(directory)
    return params.get("key") if params else None


def gather_parts(directory: str | os.PathLike, key: dict[str, Any],
                 ranges: list[tuple[int, int]]) -> bool:
    """Make the full result in ``directory`` from its parts, if all of them are there.

    ``key`` is the full result's key (``result_key``), ``ranges`` the consecutive [start, stop)
    ranges that cover the set. If every part is stored with its ``part_key``, their arrays are
    concatenated along the image axis and saved with ``save_explanation`` -- the files, key and
    arrays an unchunked run writes (``raw`` goes float16 -> float32 -> float16, which is exact) --
    and ``parts/`` is removed. Returns whether the full result is stored now; leftover parts of a
    result that is already stored are removed."""
    directory = inside_runs(directory)  # parts/ is removed: never through a link that leads out
    if is_stored(directory, key):
        shutil.rmtree(directory / PARTS_DIR, ignore_errors=True)
        return True
    folders = [part_dir(directory, start, stop) for start, stop in ranges]
    if not ranges or not all(is_stored(f, part_key(key, *r)) for f, r in zip(folders, ranges)):
        return False
    explanation = concatenate([load_explanation(f) for f in folders], f"the parts in "
                              f"{directory / PARTS_DIR}")
    save_explanation(directory, explanation, key["model_id"], key["image_set_id"],
                     timing=total_timing([stored_timing(f) for f in folders]))
    shutil.rmtree(directory / PARTS_DIR, ignore_errors=True)
    return True


def concatenate(pieces: list[Explanation], what: str = "the pieces") -> Explanation:
    """Consecutive image ranges of one result joined into one (images along their image axis,
    which is -4 for per-layer methods too; diagnostics along their last axis)."""
    first = pieces[0]
    if any(p.layers != first.layers or p.params != first.params for p in pieces):
        raise ValueError(f"{what} disagree on layers or parameters")
    return Explanation(
        images=np.concatenate([p.images for p in pieces], axis=-4),
        targets=np.concatenate([p.targets for p in pieces]),
        params=first.params,
        raw=None if first.raw is None else np.concatenate([p.raw for p in pieces]),
        layers=first.layers,
        diagnostics={name: np.concatenate([p.diagnostics[name] for p in pieces], axis=-1)
                     for name in first.diagnostics})


def row_range(explanation: Explanation, start: int, stop: int) -> Explanation:
    """The rows of images [start, stop) of a result."""
    return Explanation(
        images=explanation.images[..., start:stop, :, :, :],
        targets=explanation.targets[start:stop],
        params=explanation.params,
        raw=None if explanation.raw is None else explanation.raw[start:stop],
        layers=explanation.layers,
        diagnostics={name: values[..., start:stop]
                     for name, values in explanation.diagnostics.items()})
