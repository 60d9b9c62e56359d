"""The image sets the benchmark explains, built deterministically from the suite's seed.

- ``detection``: m images drawn uniformly from the val split (SPEC: m = 50). Every model is
  explained on it.
- ``<model>-abnormal`` for each localizable anomalous model: p inputs it misbehaves on (triggered
  images, images with the class-index cue, images of the removed class, face images of the class
  the blurred-faces model lost most on). That model and every reference are explained on it.
- The matching *normal* images are the first p detection images that the family counts as normal
  (uniform val images; for a missing class, excluding that class). They are uniform val images as
  SPEC asks, and their visualizations already exist, so localization costs only the abnormal set.

Every set is a *nested* draw: a seeded permutation of its pool (all val images, or the family's
abnormal pool), cut after its count. So the demo's m = 36 detection images are the first 36 of
demo-full's m = 50, and p = 25 abnormal images the first 25 of p = 40. Sets that differ only in
their count share a *lineage* (the hash of their recipe without the count), and the explain stage
reuses the visualizations of a stored set of the same lineage for the images they share
(explain/prefixes.py) instead of explaining them again.

A user's folder of images can replace any set (the suite's ``[image_sets]``, e.g. the original's
published PNGs; train/core/image_folders.py): its id is the hash of its pixels and labels, and a
``<model>-normal`` folder gives that model its own normal set in place of the detection images.

Each set is stored once, in the store shared by every suite (``runs/store/image_sets/<id>/``, the id
being the hash of everything that determines its pixels; ``runs/<suite>/image_sets/<name>`` links
to it), as ``images.npz`` (uint8 N x H x W x 3), ``index.json`` (val positions, labels, how it was
made, its id, the SHA-256 of ``images.npz``) and one PNG per image, so a person can look at exactly
what was explained.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

from counteraudit.anomalies.base import FAMILIES
from counteraudit.train.core.artifacts import (atomic_save_npz, atomic_write_bytes, derive_seed,
                                               find_or_make, lock_beside, stable_hash)
from counteraudit.train.core.image_folders import (DETECTION, ImageFolder, abnormal_name, content_digest,
                                                   normal_name)
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.payloads import npz_arrays
from counteraudit.train.core.size_bounds import pool_problem
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.worlds import World

# A set's images, marked by index.json, which also records how the set was made; its key is the
# set's id.
IMAGE_SET = KeyedArtifact(payload="images.npz", marker="index.json", digest_field="images_sha256",
                          fields={"id": str, "name": str, "recipe": dict, "val_indices": list,
                                  "labels": list},
                          check=npz_arrays(length_of="labels", images=4),
                          what="image set", marker_what="image set index", key_field="id")


@dataclass
class ImageSet:
    name: str
    id: str                     # hash of everything that determines its pixels
    images: np.ndarray          # uint8 (N, H, W, 3)
    val_indices: np.ndarray
    labels: np.ndarray
    recipe: dict[str, Any]      # how it was made

    @property
    def lineage(self) -> str:
        """What it shares with every set drawn the same way, whatever its count."""
        return set_lineage(self.recipe)

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.images).permute(0, 3, 1, 2).float().div_(255)


# In every recipe: the sets are permutation prefixes (see the module docstring); sets of older
# versions were sorted draws, which must not be taken for prefixes of each other.
DRAW = "permutation-prefix"
FOLDER = "folder"  # a set's recipe "source" when a user's folder replaces the draw
COUNT_KEYS = ("m", "p")


def set_lineage(recipe: dict[str, Any]) -> str:
    """The hash of a set's recipe without its count: equal for the nested draws of one pool."""
    return stable_hash({k: v for k, v in recipe.items() if k not in COUNT_KEYS})


def nested_draw(pool: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` positions from ``pool`` without replacement, such that a smaller count draws a
    prefix of a larger one (the same rng state permutes the whole pool, then it is cut)."""
    return rng.permutation(np.asarray(pool))[:count]


def set_sizes(suite: Suite) -> tuple[int, int]:
    """(m, p): images per detection set and per abnormal set ([evaluate], its schema's ranges)."""
    return suite.evaluate.detection_images, suite.evaluate.localization_images


def image_set_seed(suite: Suite) -> int:
    return suite.evaluate.seed


def abnormal_set_name(spec: ModelSpec) -> str:
    return abnormal_name(spec.name)


def normal_set_name(suite: Suite, spec: ModelSpec) -> str:
    """The set holding the model's normal images: its own folder ``<model>-normal`` when the
    suite's [image_sets] gives one (the original's layout), else the detection set."""
    name = normal_name(spec.name)
    return name if name in image_folders(suite) else DETECTION


def image_folders(suite: Suite) -> dict[str, str]:
    """The suite's [image_sets]: set name -> the folder that replaces its seeded draw."""
    return dict(suite.image_sets)


def set_names(suite: Suite) -> list[str]:
    """The names of the suite's image sets, as ``build_image_sets`` makes them."""
    names = [DETECTION]
    for spec in localizable(suite):
        names += [abnormal_set_name(spec)] + ([normal_name(spec.name)]
                                              if normal_set_name(suite, spec) != DETECTION else [])
    return names


def set_sources(suite: Suite, names: list[str] | None = None) -> str:
    """Where the sets' images come from, for people (tables' captions, the report): each folder
    [image_sets] names, then the sets drawn with the suite's seed."""
    folders = image_folders(suite)
    names = set_names(suite) if names is None else names
    drawn = [name for name in names if name not in folders]
    parts = [f"{name}: folder {folders[name]}" for name in names if name in folders]
    if drawn:
        parts.append(f"{', '.join(drawn)}: seeded draw (seed {image_set_seed(suite)})")
    return "; ".join(parts)


def localizable(suite: Suite) -> list[ModelSpec]:
    return [s for s in suite.anomalies if FAMILIES.get(s.family).localizable]


def _to_uint8(images: torch.Tensor) -> np.ndarray:
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def _save(root: Path, image_set: ImageSet, source: dict[str, Any] | None = None) -> None:
    folder = root / image_set.id
    for i, image in enumerate(image_set.images):
        val = image_set.val_indices[i]  # a folder's images have none (-1)
        path = folder / "png" / (f"{i:03d}-val{val}.png" if val >= 0 else f"{i:03d}.png")
        if not path.exists():
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="PNG")
            atomic_write_bytes(path, buffer.getvalue())
    IMAGE_SET.save(folder, image_set.id,
                   lambda path: atomic_save_npz(path, images=image_set.images), {
                       "name": image_set.name, "recipe": image_set.recipe,
                       "lineage": image_set.lineage, "count": len(image_set.images),
                       "val_indices": image_set.val_indices, "labels": image_set.labels,
                       **(source or {})})


def _load(root: Path, name: str, expected_id: str) -> ImageSet | None:
    folder = root / expected_id
    index = IMAGE_SET.find(folder, expected_id)
    if index is None:
        return None
    with np.load(IMAGE_SET.payload_path(folder)) as data:
        images = data["images"]
    return ImageSet(name, index["id"], images, np.asarray(index["val_indices"]),
                    np.asarray(index["labels"]), index["recipe"])


def _load_or_make(root: Path, name: str, set_id: str, make: Callable[[], ImageSet]) -> ImageSet:
    """The stored set, else ``make()`` (which stores it): once, when two runs need it at once."""
    return find_or_make(lambda: _load(root, name, set_id), make,
                        lock_beside(root / set_id, "image sets",
                                    f"making the image set {name} in {root / set_id}"))


def same_lineage(root: Path, image_set: ImageSet) -> list[ImageSet]:
    """The other stored sets of ``image_set``'s lineage (the same draw with another count), each
    checked to start with the images they share with it."""
    found = []
    for index_path in sorted(Path(root).glob(f"*/{IMAGE_SET.marker}")):
        index = IMAGE_SET.read_marker(index_path.parent)
        if not index or index.get("id") == image_set.id or \
                set_lineage(index.get("recipe", {})) != image_set.lineage:
            continue
        other = _load(root, index.get("name", ""), index["id"])
        shared = min(len(other.images), len(image_set.images)) if other else 0
        if other is not None and np.array_equal(other.val_indices[:shared],
                                                image_set.val_indices[:shared]) \
                and np.array_equal(other.images[:shared], image_set.images[:shared]):
            found.append(other)
    return found


def folder_set(suite: Suite, name: str, world: World, root: Path, count: int) -> ImageSet:
    """The set ``name`` from the user's folder (``[image_sets]``), stored under the hash of its
    pixels and labels; ``index.json`` names the folder it was read from."""
    what, path = f"[image_sets] {name}", image_folders(suite)[name]
    folder = ImageFolder.read(path, what)
    images, labels = folder.load(what, count, world.image_size)
    if (labels >= world.num_classes).any():
        raise ValueError(f"{what}: class subfolder(s) {sorted(set(labels[labels >= world.num_classes]))} "
                         f"of {folder.folder} name no class of the world's {world.num_classes}")
    recipe = {"source": FOLDER, "pixels_sha256": content_digest(images, labels), "count": count}
    set_id = stable_hash(recipe)

    def make() -> ImageSet:
        image_set = ImageSet(name, set_id, images, np.full(count, -1), labels, recipe)
        _save(root, image_set, {"folder": str(folder.folder),
                                "files": [str(p.relative_to(folder.folder)) for p in folder.files[:count]]})
        return image_set
    return _load_or_make(root, name, set_id, make)


def detection_recipe(suite: Suite) -> dict[str, Any]:
    """Everything that determines the seeded detection set's pixels (its id is their hash)."""
    m, _ = set_sizes(suite)
    return {"kind": DETECTION, "world": suite.world, "m": m, "seed": image_set_seed(suite),
            "draw": DRAW}


# The one entry of an abnormal set's recipe that is known only after training: the class the
# blurred-faces model lost most on (its implant check's finding).
IMPLANT_DETAILS = "details"


def abnormal_recipe(suite: Suite, spec: ModelSpec, implant: dict | None) -> dict[str, Any]:
    """Everything that determines a model's seeded abnormal set's pixels."""
    _, p = set_sizes(suite)
    return {"kind": "abnormal", "world": suite.world, "family": spec.family, "params": spec.params,
            "p": p, "seed": image_set_seed(suite),
            # the draw is seeded from the name, the family built with the model's seed
            "model": spec.name, "model_seed": spec.seed,
            # the blurred-faces set depends on which class the model lost most on
            IMPLANT_DETAILS: (implant or {}).get("details", {}).get("most_affected_class"),
            "draw": DRAW}


def detection_set(suite: Suite, world: World, root: Path) -> ImageSet:
    m, _ = set_sizes(suite)
    if DETECTION in image_folders(suite):
        return folder_set(suite, DETECTION, world, root, m)
    val = world.split("val")
    # more than the world holds is an error, never a smaller set (a suite of the synthetic world
    # is refused when it loads; a world whose val split is known only once built, here)
    problem = pool_problem("[evaluate] detection_images", m, len(val), "validation images of the world")
    if problem:
        raise ValueError(f"suite file {suite.path}: {problem}")
    recipe = detection_recipe(suite)
    set_id = stable_hash(recipe)

    def make() -> ImageSet:
        rng = np.random.default_rng(derive_seed(image_set_seed(suite), DETECTION))
        indices = nested_draw(np.arange(len(val)), m, rng)
        image_set = ImageSet(DETECTION, set_id, _to_uint8(val.load(indices)), indices,
                             val.labels[indices], recipe)
        _save(root, image_set)
        return image_set
    return _load_or_make(root, DETECTION, set_id, make)


def abnormal_set(suite: Suite, spec: ModelSpec, world: World, root: Path,
                 implant: dict | None) -> ImageSet:
    _, p = set_sizes(suite)
    name = abnormal_set_name(spec)
    if name in image_folders(suite):
        return folder_set(suite, name, world, root, p)
    family = FAMILIES.get(spec.family)(spec.params, world, spec.seed)
    val = world.split("val")
    recipe = abnormal_recipe(suite, spec, implant)
    set_id = stable_hash(recipe)

    def make() -> ImageSet:
        rng = np.random.default_rng(derive_seed(image_set_seed(suite), name))
        pool = family.abnormal_pool(val, implant)
        if pool is None or len(pool) == 0:
            raise ValueError(f"{spec.name}: its family {spec.family} found no abnormal val images")
        indices = nested_draw(pool, p, rng)
        labels = val.labels[indices]
        images = family.abnormal_images(val.load(indices), torch.as_tensor(labels))
        image_set = ImageSet(name, set_id, _to_uint8(images), indices, labels, recipe)
        _save(root, image_set)
        return image_set
    return _load_or_make(root, name, set_id, make)


@dataclass
class _LabelsOnly:
    """A folder set as a family's ``normal_pool`` reads a split: its labels (positions: the set's)."""
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def normal_positions(suite: Suite, spec: ModelSpec, world: World, detection: ImageSet) -> np.ndarray:
    """Positions in the detection set of the p images that count as normal for this model (a
    folder's images: judged by their labels, which the suite check required where the family
    reads them)."""
    _, p = set_sizes(suite)
    family = FAMILIES.get(spec.family)(spec.params, world, spec.seed)
    if detection.recipe.get("source") == FOLDER:
        allowed = set(family.normal_pool(_LabelsOnly(detection.labels)).tolist())
        positions = [i for i in range(len(detection.labels)) if i in allowed][:p]
    else:
        allowed = set(family.normal_pool(world.split("val")).tolist())
        positions = [i for i, v in enumerate(detection.val_indices) if int(v) in allowed][:p]
    if len(positions) < p:
        raise ValueError(f"{spec.name}: only {len(positions)} of the {len(detection.val_indices)} "
                         f"detection images count as normal, {p} needed; raise [evaluate] "
                         "detection_images or lower localization_images")
    return np.asarray(positions)


def normal_images(suite: Suite, spec: ModelSpec, world: World,
                  image_sets: dict[str, ImageSet]) -> tuple[str, np.ndarray]:
    """The set holding the model's p normal images and their positions in it: its own folder's
    first p, or the detection images its family counts as normal (``normal_positions``)."""
    name = normal_set_name(suite, spec)
    if name == DETECTION:
        return name, normal_positions(suite, spec, world, image_sets[DETECTION])
    return name, np.arange(set_sizes(suite)[1])


CLASSES = "classes"  # the pseudo set of model-level methods: one row per class of the world
CLASS_CANVAS = 128  # its pixels' value (uint8): a constant the methods never look at


def classes_recipe(suite: Suite) -> dict[str, Any]:
    """What determines the ``classes`` set: the world alone (its [world] table fixes its classes
    and image size), so every suite of one world shares its id, and the model-level results keyed
    by it (explain/store.py, ``result_key``)."""
    return {"kind": CLASSES, "world": suite.world}


def classes_set_id(suite: Suite) -> str:
    return stable_hash(classes_recipe(suite))


def classes_set(suite: Suite, world: World) -> ImageSet:
    """The pseudo image set a model-level method (``ExplanationMethod.model_level``, e.g. feature
    synthesis) explains: row c is class c (its label), its pixels a constant canvas at the world's
    image size, never looked at. Made in memory, never stored: it is a function of the world."""
    count, side = world.num_classes, world.image_size
    return ImageSet(CLASSES, classes_set_id(suite),
                    np.full((count, side, side, 3), CLASS_CANVAS, np.uint8),
                    np.full(count, -1), np.arange(count), classes_recipe(suite))


def build_image_sets(suite: Suite, world: World, root: Path,
                     implants: dict[str, dict]) -> dict[str, ImageSet]:
    """Every set the suite needs: detection + one abnormal set per localizable anomaly (+ its
    normal set, where the suite gives it a folder)."""
    sets = {DETECTION: detection_set(suite, world, root)}
    _, p = set_sizes(suite)
    for spec in localizable(suite):
        sets[abnormal_set_name(spec)] = abnormal_set(suite, spec, world, root, implants.get(spec.name))
        if normal_set_name(suite, spec) != DETECTION:
            name = normal_set_name(suite, spec)
            sets[name] = folder_set(suite, name, world, root, p)
    return sets
