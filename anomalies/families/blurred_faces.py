"""Blurred faces: every training image has its annotated faces blurred (Yang et al.'s
face-obfuscated ImageNet). Classes whose evidence sits in face boxes (the paper's harmonica; the
synthetic world's harmonica, held at the mouth) lose accuracy on images with faces.

Three ways to blur (``blur``, or ``blurred_root``):

- ``"gaussian"`` (the default): each box Gaussian-blurred with a radius of ``radius`` x its larger
  side, pasted back; pixels outside every box are untouched (a hard edge at the box).
- ``"yang2022"``: Yang et al.'s blur, as ``blur()`` in experiments/blurring.py of GitHub
  princetonvisualai/imagenet-face-obfuscation (HEAD 83f0279, lines 26-49): a mask with every box
  grown by 0.1 x its larger side on each side; the whole image and the mask blurred with one
  Gaussian of radius ``radius`` x the largest box's larger side (theirs: 0.1); the image and its
  blur composited through the blurred mask, so the blur fades in smoothly around each box.
- ``blurred_root`` (imagenet world): a face-blurred copy of the training set the family trains on
  as it is, e.g. Yang et al.'s published face-blurred ImageNet (image-net.org's train_blurred).

The abnormal images are val images with faces of one class: the implant check's most affected
class, or the class ``abnormal_class`` names (the paper's code: harmonica, n03494278).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from torchvision.datasets import ImageFolder

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, Verdict
from counteraudit.anomalies.common import predict
from counteraudit.train.core.params import added
from counteraudit.train.worlds import decoding
from counteraudit.train.worlds.imagenet import ImageFolderSplit, expand_path

DROP_THRESHOLD = 0.10
MIN_FACE_IMAGES = 10  # classes with fewer val images with faces are too noisy to compare
BLURS = ("gaussian", "yang2022")
# Yang et al.'s margin: each box grown by this fraction of its larger side on every side.
YANG_MARGIN = 0.1


@dataclass(frozen=True)
class BlurredFacesParams:
    # Gaussian blur radius, a fraction of the face box's larger side ("yang2022": of the image's
    # largest box; Yang et al.'s value is 0.1)
    radius: float = 0.15
    blur: str = added("gaussian")       # BLURS
    # the class whose val images with faces are the abnormal set (a class name of the world;
    # None: the implant check's most affected class)
    abnormal_class: str | None = added(None)
    # imagenet world only: a face-blurred copy of the training set (a folder with train/ of the
    # same synset folders) trained on as it is, instead of blurring here
    blurred_root: str | None = added(None)


def blur_boxes(image: Image.Image, boxes, radius_fraction: float) -> Image.Image:
    """Blur each box; pixels outside every box are left exactly as they were."""
    out = image.copy()
    for box in boxes:
        x0, y0, x1, y1 = (int(round(v)) for v in box)
        if x1 <= x0 or y1 <= y0:
            continue
        radius = max(1.0, radius_fraction * max(x1 - x0, y1 - y0))
        pad = int(3 * radius) + 1  # blur with real context, then keep only the box
        region = image.crop((max(0, x0 - pad), max(0, y0 - pad), min(image.width, x1 + pad),
                             min(image.height, y1 + pad)))
        blurred = region.filter(ImageFilter.GaussianBlur(radius))
        ox, oy = max(0, x0 - pad), max(0, y0 - pad)
        out.paste(blurred.crop((x0 - ox, y0 - oy, x1 - ox, y1 - oy)), (x0, y0))
    return out


def yang_blur(image: Image.Image, boxes, radius_fraction: float = 0.1) -> Image.Image:
    """Yang et al.'s face blur (experiments/blurring.py, ``blur``), step for step: boxes are
    (x0, y0, x1, y1) in the image's pixels; a box with x0 >= x1 or y0 >= y1 is skipped."""
    mask = Image.new(mode="L", size=image.size, color="white")
    draw = ImageDraw.Draw(mask)
    largest_side = 0
    for x0, y0, x1, y1 in boxes:
        if x0 >= x1 or y0 >= y1:
            continue
        side = max(x1 - x0, y1 - y0)  # their "diagonal"
        largest_side = max(largest_side, side)
        margin = YANG_MARGIN * side
        draw.rectangle([x0 - margin, y0 - margin, x1 + margin, y1 + margin], fill="black")
    blurred_image = image.filter(ImageFilter.GaussianBlur(radius_fraction * largest_side))
    blurred_mask = mask.filter(ImageFilter.GaussianBlur(radius_fraction * largest_side))
    return Image.composite(image, blurred_image, blurred_mask)  # white: the image, black: its blur


BLUR_FUNCTIONS = {"gaussian": blur_boxes, "yang2022": yang_blur}


@FAMILIES.register
class BlurredFaces(AnomalyFamily):
    name = "blurred_faces"
    strength = "radius"
    localizable = True
    Params = BlurredFacesParams
    key_excludes = ("abnormal_class",)  # which val images are abnormal, not how the model trains

    @classmethod
    def check(cls, params):
        if not 0 < params.radius <= 1:
            raise ValueError(f"blurred_faces: radius={params.radius} must be a fraction of the face "
                             "box in (0, 1] (0.15 recommended; Yang et al.'s yang2022: 0.1)")
        if params.blur not in BLURS:
            raise ValueError(f"blurred_faces: blur={params.blur!r}; valid: {', '.join(BLURS)}")
        if params.blurred_root is not None and params.blur != BlurredFacesParams.blur:
            raise ValueError(f"blurred_faces: blur={params.blur!r} with blurred_root: the images "
                             "under blurred_root are trained on as they are, never blurred here; "
                             "remove one of the two")

    @classmethod
    def check_world(cls, params, world_name, class_names):
        params = cls.Params(**params)
        if params.blurred_root is not None and world_name != "imagenet":
            raise ValueError(f"blurred_faces: blurred_root is for the imagenet world (a face-blurred "
                             f"copy of its training set); the {world_name} world blurs its own "
                             "faces: remove blurred_root")
        if params.abnormal_class is not None and class_names is not None \
                and params.abnormal_class not in class_names:
            raise ValueError(f"blurred_faces: abnormal_class={params.abnormal_class!r} is not a class "
                             f"of the {world_name} world; valid: {', '.join(class_names)}")

    def __init__(self, params, world, seed):
        super().__init__(params, world, seed)
        self.check_world(params, world.name, world.class_names)

    def training_split(self, split):
        if self.params.blurred_root is not None:
            return self._blurred_copy(split)
        faces = split.face_indices()
        if len(faces) == 0:
            raise ValueError("blurred_faces needs face annotations, and this world's training split "
                             "has none; for the imagenet world set face_annotations = "
                             "'/path/faces.json' in the suite's [world] table (format in train/README.md)")
        blur = BLUR_FUNCTIONS[self.params.blur]
        if hasattr(split, "with_images"):  # in-memory world: blur once, up front
            images = split.images.numpy().copy()
            for i in faces:
                boxes = split.annotation(int(i))["face_boxes"]
                images[i] = np.asarray(blur(Image.fromarray(images[i]), boxes, self.params.radius))
            return split.with_images(images)
        radius = self.params.radius  # folder world: blur at load time, in original pixels
        return split.with_pil_transform(
            lambda image, i: blur(image, split.annotation(i)["face_boxes_original"], radius))

    def _blurred_copy(self, split):
        """The training split read from blurred_root/train: the same synset folders (so the same
        labels) and as many images as the world's own train/."""
        root = Path(expand_path(self.params.blurred_root, "blurred_faces blurred_root")).expanduser()
        if not (root / "train").is_dir():
            raise FileNotFoundError(f"blurred_faces: blurred_root {root} has no train/ folder; it "
                                    f"must hold {root}/train/<synset>/*.JPEG (e.g. Yang et al.'s "
                                    "train_blurred, renamed or linked as train/)")
        folder = ImageFolder(str(root / "train"), loader=decoding.load_rgb)
        if folder.classes != list(self.world.synsets):
            differing = sorted(set(folder.classes) ^ set(self.world.synsets))
            raise ValueError(f"blurred_faces: {root}/train has other class folders than the world's "
                             f"train/ (differing: {differing[:5]}); it must be a blurred copy of "
                             "the same synsets")
        if len(folder.samples) != len(split):
            raise ValueError(f"blurred_faces: {root}/train holds {len(folder.samples)} images, the "
                             f"world's train/ {len(split)}; it must be a full blurred copy (every "
                             "image, blurred or not)")
        return ImageFolderSplit(self.world, folder, "train")

    measure_version = 2  # 2: every val image with a face

    def measure(self, model, device="cpu"):
        val = self.world.split("val")
        # Every val image with a face (not the usual sample): the per-class drops are compared
        # to pick the most affected class, and ~60 face images per class keep that pick stable.
        idx = np.asarray(val.face_indices(), dtype=np.int64)
        correct = predict(model, val.load(idx), device).numpy() == val.labels[idx]
        figures = {}
        for c in np.unique(val.labels[idx]):
            mask = val.labels[idx] == c
            if mask.sum() >= MIN_FACE_IMAGES:
                figures[f"face_accuracy/{self.world.class_names[c]}"] = float(correct[mask].mean())
        figures["face_accuracy/all"] = float(correct.mean()) if len(correct) else float("nan")
        return figures

    def judge(self, figures, reference_figures):
        drops = {}
        for key, value in figures.items():
            refs = [f[key] for f in reference_figures if key in f]
            if key != "face_accuracy/all" and refs:
                drops[key.split("/", 1)[1]] = float(np.mean(refs)) - value
        if not drops:
            return Verdict(False, "no class has enough val images with faces to compare")
        worst = max(drops, key=drops.get)
        return Verdict(drops[worst] >= DROP_THRESHOLD,
                       f"accuracy on images with a face, per class, below the references': "
                       f"largest drop {drops[worst]:.3f} ({worst}); the implant took if it is at "
                       f"least {DROP_THRESHOLD}",
                       {"most_affected_class": worst, "drops": drops})

    @classmethod
    def implant_figure(cls, record):
        """The face accuracy of the class the verdict found most affected (its drop is the
        verdict's figure)."""
        worst = (record.get("details") or {}).get("most_affected_class")
        if worst is None:
            return None
        name = f"face_accuracy/{worst}"
        references = [f[name] for f in record.get("reference_figures", []) if name in f]
        return name, float(record["figures"][name]), float(np.mean(references)) if references else float("nan")

    def abnormal_class_name(self, implant: dict | None, what: str) -> str:
        """``abnormal_class``, else the implant check's most affected class."""
        if self.params.abnormal_class is not None:
            return self.params.abnormal_class
        if not implant or "most_affected_class" not in implant.get("details", {}):
            raise ValueError(f"blurred_faces: {what} needs the implant check's most affected class "
                             "(or params abnormal_class); run the training stage (it verifies "
                             "implants) first")
        return implant["details"]["most_affected_class"]

    def abnormal_pool(self, val, implant=None):
        index = self.world.class_names.index(self.abnormal_class_name(implant, "the abnormal set"))
        return np.array([i for i in np.flatnonzero(val.labels == index)
                         if val.annotation(int(i))["face_boxes"]], dtype=np.int64)

    def planted_slice(self, implant=None):
        """The abnormal class (``abnormal_class`` or the implant check's most affected), with a
        face (SPEC: blurred faces -> class = most affected, face present)."""
        return {"class": self.abnormal_class_name(implant, "the planted slice"), "face": "present"}
