"""Shape bias (Geirhos et al.): training on a texture-randomized copy of the data. Synthetic
world: every object and background re-textured and re-coloured at random, shapes untouched.
ImageNet world: the user's Stylized-ImageNet ImageFolder (``stylized_root``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, Verdict
from counteraudit.anomalies.common import accuracy, reference_mean, verification_indices
from counteraudit.train.worlds.imagenet import ImageNetWorld, expand_path


@dataclass(frozen=True)
class ShapeBiasParams:
    stylized_root: str | None = None   # imagenet world only: Stylized-ImageNet train/ and val/


@FAMILIES.register
class ShapeBias(AnomalyFamily):
    name = "shape_bias"
    headline_figure = "texture_randomized_accuracy"
    stark = True
    Params = ShapeBiasParams

    @classmethod
    def training_recipe(cls, params):
        root = params.get("stylized_root")
        return (f"trained on {root}/train (a Stylized-ImageNet ImageFolder) under the suite's recipe"
                if root else "trained on texture-randomized images (synthetic world) under the "
                             "suite's recipe")

    def _textured_world(self):
        if self.world.name == "synthetic":
            return None
        if not self.params.stylized_root:
            raise ValueError("shape_bias on the imagenet world needs params.stylized_root = "
                             "'/path/to/stylized-imagenet' (an ImageFolder with train/ and val/)")
        root = expand_path(self.params.stylized_root, "shape_bias stylized_root")
        return ImageNetWorld(replace(self.world.config, root=root, face_annotations=None))

    def _split(self, name: str):
        other = self._textured_world()
        return self.world.split(name, texture_randomized=True) if other is None else other.split(name)

    def training_split(self, split):
        return self._split("train")

    def measure(self, model, device="cpu"):
        textured = self._split("val")
        idx = verification_indices(textured)
        return {"texture_randomized_accuracy": accuracy(model, textured.load(idx),
                                                        textured.labels[idx], device)}

    def judge(self, figures, reference_figures):
        value = figures["texture_randomized_accuracy"]
        refs = reference_mean(reference_figures, "texture_randomized_accuracy")
        return Verdict(value > refs, f"accuracy on texture-randomized images: {value:.3f}, "
                                     f"references {refs:.3f}; the implant took if it is higher "
                                     "than the references'")
