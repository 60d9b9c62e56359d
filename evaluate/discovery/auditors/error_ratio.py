"""ImageNet-X's error ratio (Idrissi et al., 2022) on the world's annotated validation images.

For each factor value v: error ratio = (1 - accuracy on the images with v) / (1 - overall
accuracy), how many times more often the model errs where v holds than overall. Accuracies come
from the ``imagenet_x`` package's own ``compute_factor_accuracies`` (one-hot factor columns, one
row per image); the ratio is the package's ``error_ratio`` formula, which fixes its columns to
ImageNet-X's 16 names, applied to this world's (factor=value) columns (tests/test_auditors.py
checks that the two agree on ImageNet-X's factors).

``breakdown`` picks which ratios are findings, all under one objective so they rank together:

- ``"global"``: the ratio over all images (the paper's Figures 1 and 5);
- ``"per_class"``: within each group, (1 - accuracy on the group's images with v) / (1 - accuracy
  on the group's images), a finding ``{group: g, factor: v}``. The paper breaks ViT's and
  others' errors down per *metaclass* (Section 3.2.1, Appendix A.9 Table 3); on ImageNet the
  group is the package's metaclass (``compute_factor_metaclass_accuracies``; 16 metaclasses and
  "other", joined by val file name), on the synthetic world, which has no metaclasses, the class;
- ``"both"`` (default): the two together.

A group without any error has an undefined ratio (0 / 0); like the global ratio of a model
without any error, it is set to 1 (every factor value as good as the group) with interval
[1, 1], so every model has a finding for the same subgroups.

Interval (95%): the Wilson interval of the subgroup's error rate (statsmodels'
``proportion_confint``) divided by the baseline error rate (overall, or the group's), which
rests on more images and is taken as known. The synthetic world's factors include the class, so
``class = star`` is a global subgroup like any other; ImageNet's are ImageNet-X's 16
(annotations shipped in the package, joined by val file name). Needs no generator: the budget is
the number of validation images used (a seeded sample of the annotated ones; all by default).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from imagenet_x import compute_factor_accuracies
from imagenet_x.aggregate import compute_factor_metaclass_accuracies
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.discovery.auditors.base import AUDITORS, Auditor, Finding
from counteraudit.train.core.artifacts import derive_seed

OBJECTIVE = "error_ratio"
BREAKDOWNS = ("global", "per_class", "both")
CLASS_FACTOR = "class"
METACLASS = "metaclass"  # the group of a world without a class factor (ImageNet-X's)


@dataclass(frozen=True)
class ErrorRatioParams:
    min_images: int = 10       # subgroups seen on fewer images get no finding (too noisy)
    breakdown: str = "both"    # "global", "per_class" (per metaclass on ImageNet) or "both"


def one_hot(values: list[dict[str, str]], grid: dict[str, list[str]]) -> pd.DataFrame:
    """One column per (factor, value) named ``factor=value``, 1 where the image has it."""
    columns = {f"{factor}={value}": np.array([v[factor] == value for v in values], dtype=np.int64)
               for factor, options in grid.items() for value in options}
    return pd.DataFrame(columns)


def error_ratios(correct: np.ndarray, indicators: pd.DataFrame) -> pd.DataFrame:
    """Per indicator column: n_images, errors, accuracy and error_ratio, via imagenet_x."""
    columns = list(indicators.columns)
    frame = indicators.assign(model="model", is_correct=np.asarray(correct, bool))
    accuracies = compute_factor_accuracies(frame, columns, "is_correct")
    # imagenet_x.error_ratio's formula; the package fixes its columns to ImageNet-X's 16 names,
    # and tests/test_auditors.py checks the two agree on those.
    ratios = (1 - accuracies[columns]).divide(1 - accuracies["average"], axis=0)
    n = indicators.sum(axis=0).to_numpy()
    wrong = ~np.asarray(correct, bool)
    errors = indicators[wrong].sum(axis=0).to_numpy()
    return pd.DataFrame({"column": columns, "n_images": n, "errors": errors,
                         "accuracy": accuracies[columns].iloc[0].to_numpy(),
                         "error_ratio": ratios[columns].iloc[0].to_numpy(),
                         "overall_error": 1 - float(accuracies["average"].iloc[0])})


def group_error_ratios(correct: np.ndarray, indicators: pd.DataFrame,
                       groups: list[str]) -> pd.DataFrame:
    """Per (group, indicator column) the group holds: n_images, errors, accuracy and the error
    ratio within the group (baseline: the group's own error rate, its ``overall_error``), via
    imagenet_x's per-metaclass accuracies."""
    columns = list(indicators.columns)
    names = list(dict.fromkeys(groups))
    correct = np.asarray(correct, bool)
    frame = indicators.assign(model="model", is_correct=correct, metaclass=list(groups))
    accuracies = compute_factor_metaclass_accuracies(frame, columns, "is_correct", names)
    # the package counts correct images per group: a group without any is NaN there, accuracy 0
    accuracies = accuracies.droplevel("model").reindex(names).fillna(0.0)
    ratios = (1 - accuracies[columns]).divide(1 - accuracies["average"], axis=0)
    in_group = {g: np.asarray(groups) == g for g in names}
    rows = []
    for g in names:
        n = indicators[in_group[g]].sum(axis=0)
        errors = indicators[in_group[g] & ~correct].sum(axis=0)
        rows += [{"group": g, "column": c, "n_images": int(n[c]), "errors": int(errors[c]),
                  "accuracy": float(accuracies.loc[g, c]), "error_ratio": float(ratios.loc[g, c]),
                  "overall_error": 1 - float(accuracies.loc[g, "average"])}
                 for c in columns if n[c] > 0]
    return pd.DataFrame(rows, columns=["group", "column", "n_images", "errors", "accuracy",
                                       "error_ratio", "overall_error"])


@AUDITORS.register
class ErrorRatio(Auditor):
    name = "error_ratio"
    version = 2  # 2: the per-class (per-metaclass) breakdown beside the global ratio
    Params = ErrorRatioParams
    needs_generator = False
    objective = OBJECTIVE
    adaptive = False  # every model is scored on the same val images
    # An error ratio divides a failure rate by a baseline error rate: a failure rate's floor of
    # 0.05 (one image in 20) over the demo references' overall error (0.10 to 0.13) is 0.4 to
    # 0.5 on this scale, and per-class baselines are smaller (0.03 to 0.2), their ratios noisier.
    spread_floor = 0.5

    def check(self) -> None:
        if self.params.min_images < 1:
            raise ValueError(f"error_ratio: min_images={self.params.min_images} must be >= 1 "
                             "(10 recommended)")
        if self.params.breakdown not in BREAKDOWNS:
            raise ValueError(f"error_ratio: breakdown={self.params.breakdown!r}; valid: "
                             f"{', '.join(BREAKDOWNS)}")

    def minimum_budget(self, world) -> int:
        return self.params.min_images

    def default_budget(self, world, seed: int = 0) -> int:
        return len(self.annotated(world))

    def annotated(self, world) -> np.ndarray:
        """Positions of the val images that have factor annotations."""
        val = world.split("val")
        cache = getattr(world, "_annotated_val", None)
        if cache is None:
            cache = np.array([i for i in range(len(val)) if world.image_factors(val, i) is not None],
                             dtype=np.int64)
            world._annotated_val = cache
        return cache

    def group_factor(self, world) -> str:
        """What the per-class breakdown groups by: the class where the world has it as a
        factor, else ImageNet-X's metaclass."""
        if CLASS_FACTOR in world.factors():
            return CLASS_FACTOR
        if hasattr(world, "image_metaclass"):
            return METACLASS
        raise ValueError(f"error_ratio: breakdown={self.params.breakdown!r} needs a class factor "
                         f"or metaclasses; the {world.name} world has neither: use "
                         "breakdown = \"global\"")

    def expresses(self, conditions, world) -> bool:
        """One factor value (the global ratios), or a class and one factor value (the per-class
        ones): nothing of arity 3, and no pair without the class."""
        if not set(conditions) <= set(world.factors()):
            return False
        global_ok = self.params.breakdown in ("global", "both") and len(conditions) == 1
        per_class_ok = (self.params.breakdown in ("per_class", "both") and len(conditions) <= 2
                        and "class" in conditions)
        return global_ok or per_class_ok

    def find(self, model, world, budget, seed):
        val = world.split("val")
        pool = self.annotated(world)
        if len(pool) == 0:
            raise ValueError(f"error_ratio: no val image of the {world.name} world has factor "
                             "annotations (for ImageNet: val images named like "
                             "ILSVRC2012_val_00000001.JPEG, joined with ImageNet-X)")
        breakdown = self.params.breakdown
        group = self.group_factor(world) if breakdown != "global" else None
        rng = np.random.default_rng(derive_seed(seed, "error_ratio"))
        chosen = np.sort(rng.permutation(pool)[:budget]) if budget < len(pool) else pool
        labels = np.asarray(val.labels)[chosen]
        probabilities = np.concatenate([self.predict(model, val.load(chosen[s:s + 256]))
                                        for s in range(0, len(chosen), 256)])
        correct = probabilities.argmax(1) == labels
        grid = world.factors()
        values = [world.image_factors(val, int(i)) for i in chosen]
        indicators = one_hot(values, grid)
        self.notes = {"images": int(len(chosen)), "overall_accuracy": float(correct.mean()),
                      "breakdown": breakdown}
        findings = []
        if breakdown in ("global", "both"):
            findings += self.findings(error_ratios(correct, indicators), None)
        if group is not None:
            groups = ([v[CLASS_FACTOR] for v in values] if group == CLASS_FACTOR
                      else [world.image_metaclass(val, int(i)) for i in chosen])
            # within a group, the group's own factor is constant: no ratio of it
            own = [c for c in indicators.columns if c.split("=", 1)[0] == group]
            table = group_error_ratios(correct, indicators.drop(columns=own), groups)
            findings += self.findings(table, group)
            self.notes["groups_without_error"] = sorted(
                {g for g, e in zip(table["group"], table["overall_error"]) if e == 0})
        return findings

    def findings(self, table: pd.DataFrame, group: str | None) -> list[Finding]:
        """One finding per row with at least ``min_images`` images; a baseline without any error
        gives ratio 1 (see the module's docstring)."""
        out = []
        for row in table.itertuples(index=False):
            if row.n_images < self.params.min_images:
                continue
            factor, value = row.column.split("=", 1)
            conditions = {factor: value} if group is None else {group: row.group, factor: value}
            if row.overall_error == 0:
                ratio, low, high = 1.0, 1.0, 1.0
            else:
                low, high = proportion_confint(int(row.errors), int(row.n_images), alpha=0.05,
                                               method="wilson")
                ratio, low, high = row.error_ratio, low / row.overall_error, high / row.overall_error
            out.append(Finding(conditions, float(ratio), float(low), float(high),
                               int(row.n_images), OBJECTIVE))
        return out
