"""Save and load one (model, method, image set) result, and tell whether it is already done.

A result lives in one folder as two files, both written atomically (train/artifacts.py):
- ``explanation.npz``: ``images`` (uint8), ``targets`` (int64), ``raw`` as float16 where the method
  has one (half the disk; far more precise than the uint8 images that distances use), ``layers``
  for per-layer methods, and ``diag_<name>`` for each diagnostic;
- ``params.json``: the result key (method, its recorded parameters, renderer version, model id,
  image set id) plus shapes and layers, for people browsing the run folder.
``params.json`` is removed before and written after the arrays, so it marks completion: a folder
without it, or whose key differs from the one asked for, is recomputed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from explain.base import Explanation
from train.artifacts import atomic_save_npz, atomic_write_json, read_json

ARRAYS_FILE = "explanation.npz"
PARAMS_FILE = "params.json"
DIAGNOSTIC_PREFIX = "diag_"


def result_key(description: dict[str, Any], model_id: str, image_set_id: str) -> dict[str, Any]:
    """What identifies a result: ``ExplanationMethod.describe(...)`` + model and image set ids."""
    return {**description, "model_id": model_id, "image_set_id": image_set_id}


def _normalised(obj: Any) -> Any:
    """JSON round trip, so tuples and lists (and int/float keys) compare as stored."""
    return json.loads(json.dumps(obj, sort_keys=True))


def save_explanation(directory: str | os.PathLike, explanation: Explanation, model_id: str,
                     image_set_id: str) -> Path:
    """Write one result into ``directory``; returns the params file path."""
    directory = Path(directory)
    params_path = directory / PARAMS_FILE
    params_path.unlink(missing_ok=True)  # from here until the end, the folder reads as unfinished
    arrays: dict[str, np.ndarray] = {"images": explanation.images,
                                     "targets": explanation.targets.astype(np.int64)}
    if explanation.raw is not None:
        arrays["raw"] = explanation.raw.astype(np.float16)
    if explanation.layers is not None:
        arrays["layers"] = np.array(explanation.layers, dtype=str)
    for name, values in explanation.diagnostics.items():
        arrays[DIAGNOSTIC_PREFIX + name] = np.asarray(values)
    atomic_save_npz(directory / ARRAYS_FILE, **arrays)
    return atomic_write_json(params_path, {
        "key": _normalised(result_key(explanation.params, model_id, image_set_id)),
        "images_shape": list(explanation.images.shape),
        "layers": list(explanation.layers) if explanation.layers is not None else None,
    })


def is_stored(directory: str | os.PathLike, key: dict[str, Any]) -> bool:
    """True if ``directory`` holds a finished result whose key equals ``key`` (see ``result_key``)."""
    directory = Path(directory)
    params_path = directory / PARAMS_FILE
    if not (params_path.exists() and (directory / ARRAYS_FILE).exists()):
        return False
    try:
        return read_json(params_path).get("key") == _normalised(key)
    except (json.JSONDecodeError, OSError):
        return False


def load_explanation(directory: str | os.PathLike) -> Explanation:
    """The stored result (``raw`` comes back as float32 from its float16 copy)."""
    directory = Path(directory)
    params_path = directory / PARAMS_FILE
    if not params_path.exists():
        raise FileNotFoundError(f"no finished explanation in {directory} (no {PARAMS_FILE}); "
                                "run the explain stage for it")
    stored = read_json(params_path)
    key = dict(stored["key"])
    key.pop("model_id", None)
    key.pop("image_set_id", None)
    with np.load(directory / ARRAYS_FILE) as data:
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
    params_path = Path(directory) / PARAMS_FILE
    return read_json(params_path).get("key") if params_path.exists() else None
