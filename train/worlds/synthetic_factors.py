"""The synthetic world's named factors, and conditional generation from its own sampler.

Factors (finite values; continuous attributes binned), read from an image's generating attributes:

    class       the object's shape (the label)
    colour      hue of the object's main colour in six bins, or grey when it is unsaturated
    texture     the object's texture kind
    background  the background's texture kind
    size        object size / image side: small < 0.4 <= medium < 0.5 <= large
    position    object centre: centre (within 0.1 of the middle on both axes), else the side it
                is shifted to most (left, right, top, bottom)
    rotation    angle to the nearest quarter turn (0deg, 90deg, 180deg, 270deg)
    clutter     number of distractor strokes (0 .. clutter_max)
    face        present or absent

Conditional generation. ``sample_attributes`` (synthetic.py) draws, given the class, four parts
that do not depend on each other: the object's *appearance* (texture and colour), the
*background*, the *layout* (face, size, position, rotation) and the *clutter*. A pool of
``POOL_PER_CLASS`` attribute sets per class is drawn once with the world's own sampler (seeded by
the world seed, a pool id and the position, as the splits are) and its factor values cached. An
image for conditions C takes, for each part, a pool draw chosen uniformly among those whose part
satisfies C's conditions on that part, and renders the parts together with the world's own
``render``. Because the parts are independent given the class, this samples the world's own
conditional distribution of the other factors given C (up to the pool's finite size; a value
combination never seen in the pool counts as impossible, e.g. a grey star: stars are never grey).
Without a class condition the class is uniform over the classes where C is possible, as the
world's splits are class-balanced. Nothing of the splits' sampler or renderer is changed, so the
train/val images stay bit-identical.
"""
from __future__ import annotations

import colorsys
import copy
import itertools
import json
import math
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from counteraudit.train.core.artifacts import (artifact_lock, atomic_save_npz, atomic_write_text, derive_seed,
                                               file_sha256, find_or_make, intact, read_marker,
                                               set_aside, stable_hash)
from counteraudit.train.worlds.synthetic_images import (load_cached, map_in_processes, render,
                                                        sample_attributes, save_cached)

# Bump when the factor definitions, the pool or the composition change: part of every cache key.
FACTORS_VERSION = 1
POOL_PER_CLASS = 4000
POOL_SPLIT_ID = 2        # the splits use 0 (train) and 1 (val)
GENERATED_SPLIT_ID = 3   # the per-image choice of pool draws

COLOURS = ["red", "yellow", "green", "cyan", "blue", "magenta", "grey"]
SIZES = ["small", "medium", "large"]
POSITIONS = ["centre", "left", "right", "top", "bottom"]
ROTATIONS = ["0deg", "90deg", "180deg", "270deg"]
FACE = ["present", "absent"]

# The independent parts of an attribute set, given the class: factor names and attribute keys.
PARTS = {
    "appearance": (("texture", "colour"), ("texture",)),
    "background": (("background",), ("background",)),
    "layout": (("face", "size", "position", "rotation"), ("face", "size", "cx", "cy", "rotation")),
    "clutter": (("clutter",), ("clutter",)),
}


def factor_grid(class_names: list[str], textures: list[str], backgrounds: list[str],
                clutter_max: int) -> dict[str, list[str]]:
    return {"class": list(class_names), "colour": COLOURS, "texture": list(textures),
            "background": list(backgrounds), "size": SIZES, "position": POSITIONS,
            "rotation": ROTATIONS, "clutter": [str(k) for k in range(clutter_max + 1)],
            "face": FACE}


def colour_bin(rgb) -> str:
    h, s, _ = colorsys.rgb_to_hsv(*(c / 255 for c in rgb))
    if s < 0.25:
        return "grey"
    return COLOURS[int(((h * 360 + 30) % 360) // 60)]


def size_bin(size: float, image_size: int) -> str:
    fraction = size / image_size
    return "small" if fraction < 0.4 else "medium" if fraction < 0.5 else "large"


def position_bin(cx: float, cy: float, image_size: int) -> str:
    dx, dy = cx / image_size - 0.5, cy / image_size - 0.5
    if max(abs(dx), abs(dy)) < 0.1:
        return "centre"
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "top" if dy < 0 else "bottom"


def rotation_bin(angle: float) -> str:
    return ROTATIONS[int(round((angle % (2 * math.pi)) / (math.pi / 2))) % 4]


def factor_values(attrs: Mapping[str, Any], image_size: int) -> dict[str, str]:
    """An image's factor values, from the generating attributes its annotation records."""
    return {"class": attrs["shape"], "colour": colour_bin(attrs["texture"]["colours"][0]),
            "texture": attrs["texture"]["kind"], "background": attrs["background"]["kind"],
            "size": size_bin(attrs["size"], image_size),
            "position": position_bin(attrs["cx"], attrs["cy"], image_size),
            "rotation": rotation_bin(attrs["rotation"]), "clutter": str(len(attrs["clutter"])),
            "face": "present" if attrs["face"] is not None else "absent"}


def check_conditions(conditions: Mapping[str, Any], grid: dict[str, list[str]]) -> dict[str, str]:
    """The conditions as {factor: value}; an unknown factor or value is one error listing the
    valid ones."""
    if not isinstance(conditions, Mapping):
        raise ValueError(f"conditions must be a mapping {{factor: value}}, got {conditions!r}; "
                         f"factors: {', '.join(grid)}")
    checked = {}
    for factor, value in conditions.items():
        if factor not in grid:
            raise ValueError(f"unknown factor {factor!r}; this world's factors: {', '.join(grid)}")
        if str(value) not in grid[factor] or isinstance(value, bool):
            raise ValueError(f"unknown value {value!r} of factor {factor!r}; valid values: "
                             f"{', '.join(grid[factor])}")
        checked[factor] = str(value)
    return dict(sorted(checked.items()))


# ---------------------------------------------------------------- the pool
def _pool_rng(seed: int, label: int, j: int) -> np.random.Generator:
    return np.random.default_rng([seed, POOL_SPLIT_ID, label, j])


def _pool_chunk(chunk) -> tuple[np.ndarray, list[dict[str, Any]]]:
    cfg, grid, label, start, stop = chunk
    names = list(grid)
    index = {f: {v: k for k, v in enumerate(grid[f])} for f in names}
    codes = np.empty((stop - start, len(names)), np.uint8)
    draws = []
    for j in range(start, stop):
        attrs = sample_attributes(_pool_rng(cfg.seed, label, j), label, cfg)
        values = factor_values(attrs, cfg.image_size)
        codes[j - start] = [index[f][values[f]] for f in names]
        draws.append(attrs)
    return codes, draws


_POOLS: dict[tuple[str, int], "FactorPool"] = {}


class FactorPool:
    """Factor codes (classes, POOL_PER_CLASS, factors) of the pool draws, cached on disk."""

    def __init__(self, cfg, grid: dict[str, list[str]], cache_dir: Path,
                 per_class: int | None = None):
        per_class = per_class or POOL_PER_CLASS
        self.cfg, self.grid, self.per_class = cfg, grid, per_class
        self.names = list(grid)
        cache = Path(cache_dir)

        def draw() -> tuple[np.ndarray, list]:
            self.codes, self.draws = self._draw()
            self._write_cache(cache)
            return self.codes, self.draws

        self.codes, self.draws = find_or_make(lambda: self._read_cache(cache), draw, artifact_lock(
            cache, ".factor-pool.lock", "world",
            f"drawing the synthetic world's factor pool in {cache}"))
        self._masks: dict[tuple, np.ndarray] = {}
        self.cache_dir = Path(cache_dir)
        _POOLS[(str(self.cache_dir), per_class)] = self  # worker processes find it (fork)

    @classmethod
    def shared(cls, cfg, grid, cache_dir: Path, per_class: int) -> "FactorPool":
        """This process's pool of a world (loaded from its cache once per process)."""
        found = _POOLS.get((str(Path(cache_dir)), per_class))
        return found if found is not None else cls(cfg, grid, cache_dir, per_class)

    def _cache_paths(self, cache_dir: Path) -> tuple[Path, Path]:
        """The cache: the codes (.npz) and the draws with the codes' SHA-256 (.json, written last:
        it marks the pair finished). No pickle: a shared runs folder may come from a stranger, and
        unpickling runs code; a ``.pkl`` file in the cache folder is never read."""
        stem = f"factor-pool-v{FACTORS_VERSION}-{self.per_class}"
        return cache_dir / f"{stem}-codes.npz", cache_dir / f"{stem}-draws.json"

    def _write_cache(self, cache_dir: Path) -> None:
        codes_path, draws_path = self._cache_paths(cache_dir)
        atomic_save_npz(codes_path, codes=self.codes)
        # Not atomic_write_json: its sorted keys would change the draws' key order on the way back.
        atomic_write_text(draws_path, json.dumps({"codes_sha256": file_sha256(codes_path),
                                                  "draws": self.draws}, separators=(",", ":")))

    def _read_cache(self, cache_dir: Path) -> tuple[np.ndarray, list[list[dict[str, Any]]]] | None:
        """The cached (codes, draws), or None: not cached yet, or a pair that does not match
        (set aside, so the pool is drawn again). JSON and a pickle-free .npz: no code runs."""
        codes_path, draws_path = self._cache_paths(cache_dir)
        stored = read_marker(draws_path, "factor pool draws")
        if stored is None:
            return None
        digest = stored.get("codes_sha256") if isinstance(stored, dict) else None
        if not isinstance(digest, str) or not intact(codes_path, digest, "factor pool codes"):
            set_aside(draws_path, "its codes file is missing or does not match it",
                      "factor pool draws")
            return None
        try:
            with np.load(codes_path) as data:  # allow_pickle=False: arrays only
                codes = data["codes"]
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
            set_aside(codes_path, f"{type(error).__name__}: {error}", "factor pool codes")
            return None
        draws = stored.get("draws")
        shape = (len(self.grid["class"]), self.per_class, len(self.names))
        counts = ([len(d) if isinstance(d, list) else None for d in draws]
                  if isinstance(draws, list) else [])
        if codes.shape != shape or counts != [shape[1]] * shape[0]:
            set_aside(draws_path, f"codes of shape {codes.shape} and draws per class {counts[:3]}"
                                  f"... where {shape} was expected", "factor pool draws")
            return None
        return codes, draws

    def _draw(self) -> tuple[np.ndarray, list[list[dict[str, Any]]]]:
        """Factor codes (classes, per_class, factors) and the attribute sets (per class) of the
        pool draws, drawn over worker processes (the same bits for any number of them)."""
        classes, chunk = len(self.grid["class"]), 1000
        jobs = [(self.cfg, self.grid, label, s, min(self.per_class, s + chunk))
                for label in range(classes) for s in range(0, self.per_class, chunk)]
        parts = map_in_processes(_pool_chunk, jobs)
        codes = np.concatenate([p[0] for p in parts]).reshape(classes, self.per_class, -1)
        flat = [d for p in parts for d in p[1]]
        draws = [flat[c * self.per_class:(c + 1) * self.per_class] for c in range(classes)]
        return codes, draws

    def attributes(self, label: int, j: int) -> dict[str, Any]:
        """The attribute set of pool draw j of a class (read-only: ``compose`` copies)."""
        return self.draws[label][j]

    def matches(self, label: int, part: str, conditions: dict[str, str]) -> np.ndarray:
        """Pool positions of a class whose ``part`` satisfies the conditions on that part."""
        part_conditions = tuple((f, conditions[f]) for f in PARTS[part][0] if f in conditions)
        key = (label, part_conditions)
        if key not in self._masks:
            mask = np.ones(self.per_class, bool)
            for factor, value in part_conditions:
                column = self.names.index(factor)
                mask &= self.codes[label, :, column] == self.grid[factor].index(value)
            self._masks[key] = np.flatnonzero(mask)
        return self._masks[key]

    def impossible_part(self, label: int, conditions: dict[str, str]) -> str | None:
        """The first part whose conditions no pool draw of the class satisfies, or None."""
        for part in PARTS:
            if len(self.matches(label, part, conditions)) == 0:
                return part
        return None

    def support(self) -> list[dict[str, set[tuple]]]:
        """Per class and part, every partial assignment some pool draw's part satisfies (as
        sorted (factor, value) tuples): a feasibility test in a few set look-ups."""
        if getattr(self, "_support", None) is None:
            support = []
            for label in range(len(self.grid["class"])):
                parts = {}
                for part, (names, _) in PARTS.items():
                    columns = [self.names.index(f) for f in names]
                    seen = set()
                    for codes in {tuple(r) for r in self.codes[label][:, columns].tolist()}:
                        values = [(f, self.grid[f][c]) for f, c in zip(names, codes)]
                        for size in range(len(values) + 1):
                            seen.update(itertools.combinations(values, size))
                    parts[part] = seen
                support.append(parts)
            self._support = support
        return self._support

    def feasible(self, conditions: Mapping[str, str]) -> bool:
        """Whether some class has, for every part, a pool draw satisfying the conditions."""
        support = self.support()
        labels = ([self.grid["class"].index(conditions["class"])] if "class" in conditions
                  else range(len(self.grid["class"])))
        projections = {part: tuple((f, conditions[f]) for f in names if f in conditions)
                       for part, (names, _) in PARTS.items()}
        return any(all(projections[part] in support[label][part] for part in PARTS)
                   for label in labels)

    def feasible_classes(self, conditions: dict[str, str]) -> list[int]:
        labels = ([self.grid["class"].index(conditions["class"])] if "class" in conditions
                  else range(len(self.grid["class"])))
        return [label for label in labels if self.impossible_part(label, conditions) is None]


# ---------------------------------------------------------------- generation
def compose(parts: dict[str, dict[str, Any]], label: int, shape: str) -> dict[str, Any]:
    """One attribute set from the parts of several pool draws (``PARTS``)."""
    attrs: dict[str, Any] = {"label": label, "shape": shape}
    for part, (_, keys) in PARTS.items():
        for key in keys:
            attrs[key] = copy.deepcopy(parts[part][key])
    return attrs


def _feasible_labels(pool: FactorPool, conditions: dict[str, str]) -> list[int]:
    labels = pool.feasible_classes(conditions)
    if not labels:
        label = pool.grid["class"].index(conditions["class"]) if "class" in conditions else 0
        part = pool.impossible_part(label, conditions) or "layout"
        said = {f: v for f, v in conditions.items() if f in PARTS[part][0] or f == "class"}
        raise ValueError(f"no image of the synthetic world satisfies {conditions}: the "
                         f"combination {said} never occurs in its {pool.per_class} draws per class "
                         "(e.g. harmonicas are always grey, faces are never beside a large "
                         "object); relax one of these conditions")
    return labels


def _generate_chunk(chunk):
    cfg, (grid, cache_dir, per_class), conditions, stream, start, stop = chunk
    pool = FactorPool.shared(cfg, grid, cache_dir, per_class)
    labels_ok = _feasible_labels(pool, conditions)
    images = np.empty((stop - start, cfg.image_size, cfg.image_size, 3), np.uint8)
    annotations = []
    for k in range(start, stop):
        rng = np.random.default_rng([cfg.seed, GENERATED_SPLIT_ID, stream, k])
        label = labels_ok[int(rng.integers(len(labels_ok)))]
        parts = {}
        for part in PARTS:
            candidates = pool.matches(label, part, conditions)
            parts[part] = pool.attributes(label, int(candidates[rng.integers(len(candidates))]))
        attrs = compose(parts, label, pool.grid["class"][label])
        images[k - start], annotation = render(attrs, cfg.image_size)
        annotation["factors"] = factor_values(attrs, cfg.image_size)
        annotations.append(annotation)
    return images, annotations


PARALLEL_FROM = 512  # images; fewer are made in this process (a worker pool costs ~0.1 s)


def generate_images(cfg, pool: FactorPool, conditions: dict[str, str], n: int, seed: int,
                    workers: int | None = None):
    """(images uint8 (n, H, W, 3), labels, annotations) of n images satisfying the conditions.
    Image k depends only on (world seed, conditions, seed, k): the same bits for any number of
    worker processes."""
    _feasible_labels(pool, conditions)  # one clear error before any work
    stream = derive_seed(stable_hash(conditions, length=16), seed) % (2**63)
    chunk = 250
    where = (pool.grid, pool.cache_dir, pool.per_class)  # workers find the pool, not a copy of it
    jobs = [(cfg, where, conditions, stream, s, min(n, s + chunk)) for s in range(0, n, chunk)]
    parts = map_in_processes(_generate_chunk, jobs, 1 if n < PARALLEL_FROM else workers)
    images = np.concatenate([p[0] for p in parts])
    annotations = [a for p in parts for a in p[1]]
    labels = np.array([a["class"] for a in annotations], np.int64)
    return images, labels, annotations


def cached_generation(cfg, pool: Callable[[], FactorPool], cache_dir: Path,
                      conditions: dict[str, str], n: int, seed: int):
    """``generate_images``, stored once under ``cache_dir/generated/`` (atomic, like the splits);
    ``pool`` is called only when the images are not stored yet."""
    key = stable_hash({"version": FACTORS_VERSION, "pool": POOL_PER_CLASS,
                       "conditions": conditions, "n": n, "seed": seed}, length=16)
    folder = Path(cache_dir) / "generated"

    def make():
        images, labels, annotations = generate_images(cfg, pool(), conditions, n, seed)
        return images, labels, save_cached(folder, key, images, labels, annotations)

    return find_or_make(lambda: load_cached(folder, key), make, artifact_lock(
        folder, f".{key}.lock", "world", f"generating images {conditions} in {folder}"))
