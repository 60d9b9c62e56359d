"""Blurred faces: every training image has its annotated faces Gaussian-blurred (Yang et al.'s
face-obfuscated ImageNet). Classes whose evidence sits in face boxes (the paper's harmonica; the
synthetic world's harmonica, held at the mouth) lose accuracy on images with faces."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, Verdict
from counteraudit.anomalies.common import predict

DROP_THRESHOLD = 0.10
MIN_FACE_IMAGES = 10  # classes with fewer val images with faces are too noisy to compare


@dataclass(frozen=True)
class BlurredFacesParams:
    radius: float = 0.15    # Gaussian blur radius, fraction of the face box's larger side


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


@FAMILIES.register
class BlurredFaces(AnomalyFamily):
    name = "blurred_faces"
    strength = "radius"
    localizable = True
    Params = BlurredFacesParams

    @classmethod
    def check(cls, params):
        if not 0 < params.radius <= 1:
            raise ValueError(f"blurred_faces: radius={params.radius} must be a fraction of the face "
                             "box in (0, 1] (0.15 recommended)")

    def training_split(self, split):
        faces = split.face_indices()
        if len(faces) == 0:
            raise ValueError("blurred_faces needs face annotations, and this world's training split "
                             "has none; for the imagenet world set face_annotations = "
                             "'/path/faces.json' in the suite's [world] table (format in README)")
        if hasattr(split, "with_images"):  # in-memory world: blur once, up front
            images = split.images.numpy().copy()
            for i in faces:
                boxes = split.annotation(int(i))["face_boxes"]
                images[i] = np.asarray(blur_boxes(Image.fromarray(images[i]), boxes, self.params.radius))
            return split.with_images(images)
        radius = self.params.radius  # folder world: blur at load time, in original pixels
        return split.with_pil_transform(
            lambda image, i: blur_boxes(image, split.annotation(i)["face_boxes_original"], radius))

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
                       f"largest drop on face images: {worst} {drops[worst]:.3f} below the "
                       f"references (needs >= {DROP_THRESHOLD})",
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

    def abnormal_pool(self, val, implant=None):
        if not implant or "most_affected_class" not in implant.get("details", {}):
            raise ValueError("blurred_faces: the abnormal set needs the implant check's most "
                             "affected class; run the training stage (it verifies implants) first")
        index = self.world.class_names.index(implant["details"]["most_affected_class"])
        return np.array([i for i in np.flatnonzero(val.labels == index)
                         if val.annotation(int(i))["face_boxes"]], dtype=np.int64)

    def planted_slice(self, implant=None):
        """The implant check's most affected class, with a face (SPEC: blurred faces -> class =
        most affected, face present)."""
        if not implant or "most_affected_class" not in implant.get("details", {}):
            raise ValueError("blurred_faces: the planted slice needs the implant check's most "
                             "affected class; run the training stage (it verifies implants) first")
        return {"class": implant["details"]["most_affected_class"], "face": "present"}
