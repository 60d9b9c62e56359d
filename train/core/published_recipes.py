"""The published checkpoints the paper's stark models came from, each with the recipe it was
trained with: an [[anomalies]] entry that loads one (``checkpoint = "..."``) names it with
``checkpoint_recipe = "<name>"``, so a dry run, the model's metrics and a report say "loaded:
<recipe>" rather than the project's own training recipe ("trained here: ...").

Each recipe names its family and the parameters it fixes (the entry's must match: the implant
check measures with them), a one-line description, where to download it, and what of that line
was read at its source (``checked``) rather than recalled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from counteraudit.train.core.registry import nearest


@dataclass(frozen=True)
class PublishedRecipe:
    name: str
    family: str
    params: dict[str, Any]      # the family's parameters this checkpoint was trained with
    description: str
    source: str                 # where the checkpoint is published
    checked: str                # what of the description was read at the source


_COHEN = "https://github.com/locuslab/smoothing"
_SALMAN = "https://github.com/microsoft/robust-models-transfer"
_ENGSTROM = "https://github.com/MadryLab/robustness"
_GEIRHOS = "https://github.com/rgeirhos/texture-vs-shape"


def _cohen(sigma: str) -> PublishedRecipe:
    return PublishedRecipe(
        f"cohen2019-sigma{sigma}", "randomized_smoothing", {"sigma": float(sigma)},
        f"Cohen et al. 2019 randomized smoothing: ResNet-50 trained on ImageNet with Gaussian "
        f"noise sigma={sigma} on every input in [0, 1] pixels (before normalisation), 90 epochs, "
        f"batch 400 (models/imagenet/resnet50/noise_{sigma}/checkpoint.pth.tar)",
        f"{_COHEN} (models: the Google Drive link in its README)",
        "the three sigmas and train.py --batch 400 read in the README; 90 epochs and the noise "
        "before the normalise layer recalled from code/train.py, not re-read")


def _salman(norm: str, eps: str, eps_value: float) -> PublishedRecipe:
    file_eps = f"{float(eps):.1f}" if norm == "linf" else eps
    return PublishedRecipe(
        f"salman2020-{norm}-{eps}", "adversarial", {"norm": norm, "eps": eps_value},
        f"Salman et al. 2020 (robustness library): ResNet-50 adversarially trained on ImageNet, "
        f"{norm} PGD eps={eps}{'/255' if norm == 'linf' else ''} "
        f"(resnet50_{norm}_eps{file_eps}.ckpt)",
        f"{_SALMAN} (README tables; also huggingface.co/madrylab/robust-imagenet-models)",
        "the model list (ResNet-50 l2 eps 0-5, linf eps 0.5/255-8/255) read in the README; the "
        "attack's steps and step size not verified here")


def _engstrom(norm: str, eps: str, eps_value: float) -> PublishedRecipe:
    return PublishedRecipe(
        f"engstrom2019-{norm}-{eps}", "adversarial", {"norm": norm, "eps": eps_value},
        f"Engstrom et al. 2019 robustness library: ResNet-50 adversarially trained on ImageNet, "
        f"{norm} PGD eps={eps}{'/255' if norm == 'linf' else ''}",
        f"{_ENGSTROM} (README, pretrained models)",
        "not verified here: recalled from the robustness library's README")


_RECIPES = [
    *(_cohen(sigma) for sigma in ("0.25", "0.50", "1.00")),
    _salman("linf", "4", 4 / 255), _salman("linf", "8", 8 / 255),
    *(_salman("l2", eps, float(eps))
      for eps in ("0.01", "0.03", "0.05", "0.1", "0.25", "0.5", "1", "3", "5")),
    _engstrom("linf", "4", 4 / 255), _engstrom("linf", "8", 8 / 255), _engstrom("l2", "3", 3.0),
    PublishedRecipe(
        "geirhos2019-sin", "shape_bias", {},
        "Geirhos et al. 2019: ResNet-50 trained on Stylized-ImageNet (SIN) only, 60 epochs, "
        "batch 256 (resnet50_train_60_epochs-c8e5653e.pth.tar, 'resnet50_trained_on_SIN')",
        f"{_GEIRHOS} (models/load_pretrained_models.py: bitbucket.org/robert_geirhos/"
        "texture-vs-shape-pretrained-models)",
        "the file name (60 epochs) read in copies of its model_urls; batch 256 not verified here"),
]
PUBLISHED_RECIPES: dict[str, PublishedRecipe] = {recipe.name: recipe for recipe in _RECIPES}


def _same(given: Any, expected: Any) -> bool:
    if isinstance(expected, float) and isinstance(given, (int, float)):
        return math.isclose(float(given), expected, rel_tol=1e-4)  # 0.015686 is 4/255
    return given == expected


def checkpoint_recipe_problems(name: str | None, checkpoint: str | None, family: str,
                               params: dict[str, Any], where: str) -> list[str]:
    """What is wrong with an entry's ``checkpoint_recipe``: no checkpoint to describe, an
    unknown name (the valid ones listed), another family's, or parameters that differ."""
    if name is None:
        return []
    if checkpoint is None:
        return [f"{where} checkpoint_recipe = {name!r} describes a loaded checkpoint, and the entry "
                "has no checkpoint =; add checkpoint = \"/path/model.pth\" or remove "
                "checkpoint_recipe"]
    recipe = PUBLISHED_RECIPES.get(name)
    if recipe is None:
        return [f"{where} checkpoint_recipe = {name!r} is unknown{nearest(name, PUBLISHED_RECIPES)}; "
                f"valid: {', '.join(PUBLISHED_RECIPES)}"]
    if recipe.family != family:
        mine = [r for r, entry in PUBLISHED_RECIPES.items() if entry.family == family]
        return [f"{where} checkpoint_recipe = {name!r} is a {recipe.family} checkpoint, the entry's "
                f"family is {family}; valid for {family}: {', '.join(mine) or 'none'}"]
    return [f"{where} params {key} = {params.get(key)!r}, but checkpoint_recipe {name!r} was "
            f"trained with {key} = {value!r}; set params {key} = {value!r} (the implant check "
            "measures with it)"
            for key, value in recipe.params.items() if not _same(params.get(key), value)]


def provenance(checkpoint: str | None, checkpoint_recipe: str | None,
               trained_here: str | None) -> str:
    """One line on where a model's weights come from: "loaded: <recipe>" for a checkpoint,
    "trained here: <the family's recipe>" otherwise ("" where neither is known)."""
    if checkpoint is not None:
        if checkpoint_recipe is None:
            return f"loaded: {checkpoint} (recipe not declared: add checkpoint_recipe)"
        return f"loaded: {PUBLISHED_RECIPES[checkpoint_recipe].description}"
    return f"trained here: {trained_here}" if trained_here else ""
