"""The synthetic world's images (``synthetic.py`` is the world over them): procedural, seeded,
annotated images that stand in for ImageNet.

Each image shows one object whose class is carried by its *shape* (disk, square, triangle, ...),
drawn with a texture and colours, on a textured background with clutter. Like ImageNet:
- texture and colour are *correlated* with the class (each class has a typical texture and hue,
  used with probability ``typical_texture_prob``), so a model can partly lean on texture; the
  shape-bias anomaly removes that correlation by re-drawing textures at random;
- a share of images show a drawn *face* next to the object, with its box annotated;
- the ``harmonica`` class is a small bar with holes that is usually held at a face's mouth, inside
  the face box, so recognising it depends on that region, as the paper's harmonica does on faces.

Rendering is a pure function of an image's attributes (recorded in its annotation), and the
attributes of image i come from a generator seeded by (world seed, split, i): the same config gives
the same bits whatever the number of worker processes, and a texture-randomized copy re-renders the
same objects with new textures.
"""
from __future__ import annotations

import colorsys
import math
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw
from pydantic import Field

from counteraudit.slurm.worker_pool import worker_pool
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.artifacts import atomic_save_npz, derive_seed
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.payloads import npz_arrays
from counteraudit.train.worlds.base import Batch, Split, part_bounds

# Bump when rendering changes: it is part of the cache key, so old caches are never reused.
GENERATOR_VERSION = 4

CLASS_NAMES = ["disk", "square", "triangle", "star", "cross", "ring", "crescent", "heart",
               "arrow", "harmonica"]
HARMONICA = CLASS_NAMES.index("harmonica")
# The smallest turn (degrees) that renders each symmetric shape as it was (0: any turn); the
# shapes not listed (triangle, crescent, heart, arrow) change under every turn of their outline
# that is not a full one. On a listed shape the rotation factor's quarter-turn bin cannot be read
# from the image (a square at 10 and at 100 degrees is one picture); tests/test_world.py renders it.
SYMMETRY_TURN = {"disk": 0, "ring": 0, "square": 90, "cross": 90, "star": 72, "harmonica": 180}
TEXTURES = ["solid", "stripes", "checker", "dots", "noise", "gradient"]
BACKGROUNDS = ["solid", "gradient", "noise", "stripes"]
SPLIT_IDS = {"train": 0, "val": 1}


@dataclass(frozen=True)
class SyntheticConfig:
    """The synthetic world's [world] options; each annotation carries its range (checked when a
    suite is read, train/core/suite_schema.py)."""
    seed: Annotated[int, Field(ge=0, description="the world's seed")] = 0
    image_size: Annotated[int, Field(ge=32, le=bounds.IMAGE_SIDE.limit, json_schema_extra=bounds.IMAGE_SIDE.extra,
                                     description=(
        "image side in pixels: 32 or more to draw faces and objects legibly (the demo: 64)"))] = 64
    num_train: Annotated[int, Field(ge=1, description="training images (the demo: 7000)")] = 10000
    num_val: Annotated[int, Field(ge=1, description="validation images (the demo: 2000)")] = 2000
    face_prob: Annotated[float, Field(ge=0, le=1, description=(
        "share of non-harmonica images that show a face (0.3)"))] = 0.3
    harmonica_face_prob: Annotated[float, Field(ge=0, le=1, description=(
        "share of harmonica images held at a face's mouth (0.8)"))] = 0.8
    typical_texture_prob: Annotated[float, Field(ge=0, le=1, description=(
        "how strongly texture and hue predict the class (0.85)"))] = 0.85
    clutter_max: Annotated[int, Field(ge=0, le=bounds.CLUTTER.limit, json_schema_extra=bounds.CLUTTER.extra,
                                      description=(
        "distractor strokes per image, 0 to clutter_max (2)"))] = 2


# ---------------------------------------------------------------- attributes
def _colour(rng: np.random.Generator, hue: float | None = None, sat=(0.5, 1.0), val=(0.45, 1.0)):
    h = rng.random() if hue is None else hue % 1.0
    return [round(c * 255) for c in colorsys.hsv_to_rgb(h, rng.uniform(*sat), rng.uniform(*val))]


def _texture_attrs(rng: np.random.Generator, kind: str, hue: float | None) -> dict[str, Any]:
    c1 = _colour(rng, hue)
    c2 = _colour(rng, None if hue is None else hue + rng.uniform(-0.08, 0.08), val=(0.1, 0.6))
    return {"kind": kind, "colours": [c1, c2], "angle": float(rng.uniform(0, math.pi)),
            "period": float(rng.uniform(3, 8)), "seed": int(rng.integers(2**31))}


def _background_attrs(rng: np.random.Generator) -> dict[str, Any]:
    # Muted and low in contrast, like most photo backgrounds: the object stands out by its
    # outline, which is what the class is (the object's own texture is bolder).
    kind = BACKGROUNDS[rng.integers(len(BACKGROUNDS))]
    hue, value = rng.random(), rng.uniform(0.3, 0.9)
    c1 = _colour(rng, hue, sat=(0.0, 0.35), val=(value, value))
    c2 = _colour(rng, hue + rng.uniform(-0.1, 0.1), sat=(0.0, 0.35),
                 val=(max(0.0, value - 0.2), min(1.0, value + 0.2)))
    return {"kind": kind, "colours": [c1, c2], "angle": float(rng.uniform(0, math.pi)),
            "period": float(rng.uniform(6, 16)), "seed": int(rng.integers(2**31))}


def _object_texture(rng: np.random.Generator, label: int, typical_prob: float) -> dict[str, Any]:
    if label == HARMONICA:  # metal: grey-blue, solid or brushed
        kind = "solid" if rng.random() < 0.5 else "stripes"
        tex = _texture_attrs(rng, kind, 0.6)
        v = int(rng.integers(140, 230))
        tex["colours"][0] = [v - 20, v - 10, v]
        return tex
    if rng.random() < typical_prob:
        return _texture_attrs(rng, TEXTURES[label % len(TEXTURES)], label / len(CLASS_NAMES)
                              + rng.uniform(-0.04, 0.04))
    return _texture_attrs(rng, TEXTURES[rng.integers(len(TEXTURES))], None)


def sample_attributes(rng: np.random.Generator, label: int, cfg: SyntheticConfig) -> dict[str, Any]:
    s = cfg.image_size
    has_face = rng.random() < (cfg.harmonica_face_prob if label == HARMONICA else cfg.face_prob)
    attrs: dict[str, Any] = {"label": label, "shape": CLASS_NAMES[label], "face": None,
                             "background": _background_attrs(rng),
                             "texture": _object_texture(rng, label, cfg.typical_texture_prob)}
    if has_face:
        face_size = rng.uniform(0.36, 0.48) * s
        side = 1 if rng.random() < 0.5 else -1
        if label == HARMONICA:  # held at the mouth, inside the face box
            fx = s / 2 + rng.uniform(-0.22, 0.22) * s
            fy = s / 2 + rng.uniform(-0.18, 0.18) * s
            size = face_size * rng.uniform(0.55, 0.7)
            cx, cy = fx + rng.uniform(-0.04, 0.04) * face_size, fy + 0.24 * face_size * 1.2
            rotation = rng.uniform(-0.25, 0.25)
        else:  # the face stands next to the object
            fx = s / 2 + side * rng.uniform(0.2, 0.28) * s
            fy = s / 2 + rng.uniform(-0.2, 0.2) * s
            size = rng.uniform(0.3, 0.42) * s
            cx, cy = s / 2 - side * rng.uniform(0.16, 0.24) * s, s / 2 + rng.uniform(-0.2, 0.2) * s
            rotation = rng.uniform(0, 2 * math.pi)
        attrs["face"] = {"cx": float(fx), "cy": float(fy), "size": float(face_size),
                         "skin": [int(v) for v in _skin(rng)]}
    else:
        size = rng.uniform(0.38, 0.62) * s
        margin = size / 2
        cx, cy = rng.uniform(margin, s - margin), rng.uniform(margin, s - margin)
        rotation = rng.uniform(0, 2 * math.pi) if label != HARMONICA else rng.uniform(-0.5, 0.5)
    attrs.update(size=float(size), cx=float(cx), cy=float(cy), rotation=float(rotation))
    attrs["clutter"] = [
        {"kind": "line" if rng.random() < 0.6 else "dot", "colour": _colour(rng, sat=(0, 1), val=(0, 1)),
         "xy": [float(v) for v in rng.uniform(0, s, 4)], "width": int(rng.integers(1, 3))}
        for _ in range(int(rng.integers(0, cfg.clutter_max + 1)))]
    return attrs


def _skin(rng: np.random.Generator) -> np.ndarray:
    tones = np.array([[255, 220, 185], [235, 190, 150], [200, 150, 110], [150, 100, 70], [95, 65, 45]])
    return np.clip(tones[rng.integers(len(tones))] + rng.integers(-12, 13, 3), 0, 255)


def randomize_textures(attrs: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Same objects, faces and layout; object and background textures and colours re-drawn at
    random, independent of the class (the synthetic world's Stylized-ImageNet)."""
    new = dict(attrs)
    new["texture"] = _texture_attrs(rng, TEXTURES[rng.integers(len(TEXTURES))], None)
    new["background"] = _background_attrs(rng)
    return new


# ---------------------------------------------------------------- rendering
def _shape_polygons(shape: str, n_points: int = 40) -> list[tuple[str, np.ndarray]]:
    """Unit-size outlines (radius ~0.5) as (mode, points): 'add' or 'cut' polygons."""
    t = np.linspace(0, 2 * math.pi, n_points, endpoint=False)
    circle = np.stack([np.cos(t), np.sin(t)], 1) * 0.5

    def regular(k: int, r=0.5, phase=0.0):
        a = np.arange(k) * 2 * math.pi / k + phase
        return np.stack([np.cos(a), np.sin(a)], 1) * r

    if shape == "disk":
        return [("add", circle)]
    if shape == "square":
        return [("add", regular(4, 0.55, math.pi / 4))]
    if shape == "triangle":
        return [("add", regular(3, 0.58, -math.pi / 2) + [0, 0.08])]
    if shape == "star":
        a = np.arange(10) * math.pi / 5 - math.pi / 2
        r = np.where(np.arange(10) % 2 == 0, 0.55, 0.22)
        return [("add", np.stack([np.cos(a) * r, np.sin(a) * r], 1))]
    if shape == "cross":
        w = 0.17
        return [("add", np.array([[-w, -0.5], [w, -0.5], [w, -w], [0.5, -w], [0.5, w], [w, w],
                                  [w, 0.5], [-w, 0.5], [-w, w], [-0.5, w], [-0.5, -w], [-w, -w]]))]
    if shape == "ring":
        return [("add", circle), ("cut", circle * 0.55)]
    if shape == "crescent":
        return [("add", circle), ("cut", circle * 0.85 + [0.22, -0.05])]
    if shape == "heart":
        h = np.stack([16 * np.sin(t) ** 3, -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t)
                                             - np.cos(4 * t))], 1)
        return [("add", (h - [0, 2.5]) / 32)]
    if shape == "arrow":
        return [("add", np.array([[-0.5, -0.12], [0.1, -0.12], [0.1, -0.32], [0.5, 0.0],
                                  [0.1, 0.32], [0.1, 0.12], [-0.5, 0.12]]))]
    if shape == "harmonica":
        return [("add", np.array([[-0.5, -0.15], [0.5, -0.15], [0.5, 0.15], [-0.5, 0.15]]))]
    raise ValueError(f"unknown shape {shape!r}; valid shapes: {', '.join(CLASS_NAMES)}")


_SUPERSAMPLE = 2  # masks are drawn at 2x and box-filtered down, for anti-aliased edges


def _place(points: np.ndarray, attrs: dict[str, Any]) -> list[tuple[float, float]]:
    c, s = math.cos(attrs["rotation"]), math.sin(attrs["rotation"])
    rotated = points @ np.array([[c, s], [-s, c]]) * attrs["size"]
    xy = (rotated + [attrs["cx"], attrs["cy"]]) * _SUPERSAMPLE
    return [tuple(p) for p in xy]


def _object_mask(attrs: dict[str, Any], size: int) -> np.ndarray:
    canvas = Image.new("L", (size * _SUPERSAMPLE,) * 2, 0)
    draw = ImageDraw.Draw(canvas)
    for mode, points in _shape_polygons(attrs["shape"]):
        draw.polygon(_place(points, attrs), fill=255 if mode == "add" else 0)
    small = canvas.resize((size, size), Image.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    return x, y


def _texture(tex: dict[str, Any], size: int) -> np.ndarray:
    x, y = _grid(size)
    c1, c2 = (np.array(c, dtype=np.float32) for c in tex["colours"])
    kind, p, a = tex["kind"], tex["period"], tex["angle"]
    if kind == "solid":
        t = np.zeros((size, size), np.float32)
    elif kind == "stripes":
        t = (np.sin((x * math.cos(a) + y * math.sin(a)) * 2 * math.pi / p) > 0).astype(np.float32)
    elif kind == "checker":
        q = max(2, int(p))
        t = ((x // q + y // q) % 2).astype(np.float32)
    elif kind == "dots":
        q = max(3.0, p)
        t = (((x % q) - q / 2) ** 2 + ((y % q) - q / 2) ** 2 < (q / 3.2) ** 2).astype(np.float32)
    elif kind == "noise":
        cells = max(2, int(size / p))
        small = np.random.default_rng(tex["seed"]).random((cells, cells)).astype(np.float32)
        t = np.asarray(Image.fromarray(small).resize((size, size), Image.BILINEAR))
    elif kind == "gradient":
        t = (x * math.cos(a) + y * math.sin(a))
        t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    else:
        raise ValueError(f"unknown texture {kind!r}; valid: {', '.join(TEXTURES)}")
    return c1 * (1 - t[..., None]) + c2 * t[..., None]


def _draw_face(image: Image.Image, face: dict[str, Any]) -> tuple[int, int, int, int]:
    ss = _SUPERSAMPLE
    w, h = face["size"], face["size"] * 1.2
    x0, y0, x1, y1 = face["cx"] - w / 2, face["cy"] - h / 2, face["cx"] + w / 2, face["cy"] + h / 2
    draw = ImageDraw.Draw(image)
    draw.ellipse([x0 * ss, y0 * ss, x1 * ss, y1 * ss], fill=tuple(face["skin"]))
    eye_r = max(1.0, 0.07 * w)
    for ex in (-0.2, 0.2):
        cx, cy = face["cx"] + ex * w, face["cy"] - 0.1 * h
        draw.ellipse([(cx - eye_r) * ss, (cy - eye_r) * ss, (cx + eye_r) * ss, (cy + eye_r) * ss],
                     fill=(30, 25, 25))
    draw.arc([(face["cx"] - 0.22 * w) * ss, (face["cy"] + 0.05 * h) * ss,
              (face["cx"] + 0.22 * w) * ss, (face["cy"] + 0.3 * h) * ss], 20, 160,
             fill=(120, 30, 30), width=max(1, int(0.05 * w * ss)))
    size = image.size[0] // ss
    return (max(0, int(math.floor(x0))), max(0, int(math.floor(y0))),
            min(size, int(math.ceil(x1))), min(size, int(math.ceil(y1))))


def render(attrs: dict[str, Any], size: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Image (size, size, 3) uint8 and its annotation, from attributes alone."""
    canvas = _texture(attrs["background"], size)
    # Clutter and the face are drawn at 2x on a PIL canvas, then composited with the object.
    big = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8)).resize(
        (size * _SUPERSAMPLE,) * 2, Image.NEAREST)
    draw = ImageDraw.Draw(big)
    for stroke in attrs["clutter"]:
        xy = [v * _SUPERSAMPLE for v in stroke["xy"]]
        if stroke["kind"] == "line":
            draw.line(xy, fill=tuple(stroke["colour"]), width=stroke["width"] * _SUPERSAMPLE)
        else:
            r = 1.5 * stroke["width"] * _SUPERSAMPLE
            draw.ellipse([xy[0] - r, xy[1] - r, xy[0] + r, xy[1] + r], fill=tuple(stroke["colour"]))
    face_boxes = []
    if attrs["face"] is not None:
        face_boxes.append(_draw_face(big, attrs["face"]))
    canvas = np.asarray(big.resize((size, size), Image.BOX), dtype=np.float32)
    mask = _object_mask(attrs, size)[..., None]
    canvas = canvas * (1 - mask) + _texture(attrs["texture"], size) * mask
    if attrs["shape"] == "harmonica":  # a row of holes along the bar
        canvas = _harmonica_holes(canvas, attrs, size)
    ys, xs = np.nonzero(mask[..., 0] > 0.5)
    object_box = ((int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
                  if len(xs) else (0, 0, 0, 0))
    image = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    annotation = {"class": attrs["label"], "object_box": object_box, "face_boxes": face_boxes,
                  "attributes": attrs}
    return image, annotation


def _harmonica_holes(canvas: np.ndarray, attrs: dict[str, Any], size: int) -> np.ndarray:
    holes = Image.new("L", (size * _SUPERSAMPLE,) * 2, 0)
    draw = ImageDraw.Draw(holes)
    for k in range(5):
        x = -0.4 + k * 0.2
        square = np.array([[x - 0.05, -0.06], [x + 0.05, -0.06], [x + 0.05, 0.06], [x - 0.05, 0.06]])
        draw.polygon(_place(square, attrs), fill=255)
    m = np.asarray(holes.resize((size, size), Image.BOX), dtype=np.float32)[..., None] / 255
    return canvas * (1 - m) + np.array([25, 25, 30], np.float32) * m


# ---------------------------------------------------------------- generation and caching
def _generate_chunk(chunk: tuple[SyntheticConfig, str, int, int, bool]):
    cfg, split, start, stop, texture_randomized = chunk
    images = np.empty((stop - start, cfg.image_size, cfg.image_size, 3), np.uint8)
    annotations = []
    for i in range(start, stop):
        label = i % len(CLASS_NAMES)  # balanced classes
        rng = np.random.default_rng([cfg.seed, SPLIT_IDS[split], i])
        attrs = sample_attributes(rng, label, cfg)
        if texture_randomized:
            attrs = randomize_textures(attrs, np.random.default_rng([cfg.seed, SPLIT_IDS[split], i, 7]))
        images[i - start], annotation = render(attrs, cfg.image_size)
        annotations.append(annotation)
    return images, annotations


def generate(cfg: SyntheticConfig, split: str, texture_randomized: bool = False,
             workers: int | None = None) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    n = cfg.num_train if split == "train" else cfg.num_val
    chunk = 250
    jobs = [(cfg, split, s, min(n, s + chunk), texture_randomized) for s in range(0, n, chunk)]
    parts = map_in_processes(_generate_chunk, jobs, workers)
    images = np.concatenate([p[0] for p in parts])
    annotations = [a for p in parts for a in p[1]]
    labels = np.array([a["class"] for a in annotations], np.int64)
    return images, labels, annotations


def map_in_processes(function: Callable, jobs: list, workers: int | None = None) -> list:
    """``[function(job) for job in jobs]`` on up to ``workers`` processes (default: one per core,
    at most 16); in this process when one worker or one job. Results come back in job order and
    do not depend on the number of workers (each job seeds its own draws)."""
    workers = max(1, min(workers or os.cpu_count() or 1, 16))
    if workers == 1 or len(jobs) <= 1:
        return [function(job) for job in jobs]
    # fork: workers inherit the imported modules, no re-import cost; results do not depend on it.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with worker_pool(min(workers, len(jobs)), method) as pool:  # workers that end with this process
        return list(pool.map(function, jobs))


def cached_images(stem: str) -> KeyedArtifact:
    """A cache of rendered images (a split, or a conditional generation) in a world's folder:
    ``<stem>.npz`` (images, labels), marked by ``<stem>-annotations.json`` (its key is ``stem``,
    with the annotations and the .npz's SHA-256), both verified at every read like any keyed
    artifact, so a damaged cache is named, set aside and generated again."""
    return KeyedArtifact(payload=f"{stem}.npz", marker=f"{stem}-annotations.json",
                         digest_field="arrays_sha256", what="world images",
                         marker_what="world annotations", fields={"annotations": list},
                         check=npz_arrays(length_of="annotations", images=4, labels=1))


def load_cached(folder: Path, stem: str) -> tuple[np.ndarray, np.ndarray, list[dict]] | None:
    """Cached (images, labels, annotations) of ``save_cached``; None while they are not there
    (or were set aside: ``cached_images``)."""
    store = cached_images(stem)
    record = store.find(folder, stem)
    if record is None:
        return None
    with np.load(store.payload_path(folder), allow_pickle=False) as data:
        return data["images"], data["labels"], record["annotations"]


def save_cached(folder: Path, stem: str, images: np.ndarray, labels: np.ndarray,
                annotations: list[dict]) -> list[dict]:
    """Store the images; returns the annotations as a later read gives them (tuples as lists)."""
    store = cached_images(stem)
    store.save(folder, stem, lambda path: atomic_save_npz(path, images=images, labels=labels),
               {"annotations": annotations})
    return store.read_marker(folder)["annotations"]


class InMemorySplit(Split):
    """A split held as one uint8 array; batches are cut and augmented in torch, no DataLoader."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, annotations: list[dict],
                 hflip: bool = True):
        self.images = torch.from_numpy(np.ascontiguousarray(images))  # (N, H, W, 3) uint8
        self._labels = np.asarray(labels, np.int64)
        self.annotations = annotations
        self.hflip = hflip

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def annotation(self, index: int) -> dict[str, Any]:
        return self.annotations[index]

    def load(self, indices: Sequence[int]) -> torch.Tensor:
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        return self.images[idx].permute(0, 3, 1, 2).float().div_(255)

    def train_batches(self, batch_size: int, seed: int, epoch: int, drop_last: bool = True,
                      part: tuple[int, int] = (0, 1),
                      image_size: int | None = None) -> Iterator[Batch]:
        if image_size not in (None, self.images.shape[1]):
            raise ValueError(f"the synthetic world's images are rendered at {self.images.shape[1]}"
                             f" px and cannot be trained at {image_size} px; a resolution "
                             "schedule needs a world that crops from files (imagenet)")
        generator = torch.Generator().manual_seed(derive_seed(seed, "batches", epoch))
        order = torch.randperm(len(self), generator=generator)
        flips = torch.rand(len(self), generator=generator) < 0.5  # per image: any part agrees
        labels = torch.from_numpy(self._labels)
        stop = len(order) - (len(order) % batch_size if drop_last else 0)
        for start in range(0, stop, batch_size):
            whole = order[start:start + batch_size]
            first, last = part_bounds(len(whole), *part)
            idx = whole[first:last]
            images = self.images[idx].permute(0, 3, 1, 2).float().div_(255)
            if self.hflip:
                flip = flips[idx]
                images[flip] = images[flip].flip(-1)
            yield Batch(images, labels[idx], idx, offset=first, global_size=len(whole))

    def subset(self, indices: Sequence[int]) -> "InMemorySplit":
        idx = np.asarray(indices, np.int64)
        return InMemorySplit(self.images.numpy()[idx], self._labels[idx],
                             [self.annotations[i] for i in idx], self.hflip)

    def with_images(self, images: np.ndarray) -> "InMemorySplit":
        """Same labels and annotations, other pixels (blurred faces, re-textured copies)."""
        if images.shape != tuple(self.images.shape):
            raise ValueError(f"new images have shape {images.shape}, expected {tuple(self.images.shape)}")
        return InMemorySplit(images, self._labels, self.annotations, self.hflip)


