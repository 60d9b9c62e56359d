"""ImageNet-X's error ratio (Idrissi et al., 2022) on the world's annotated validation images.

For each factor value v: error ratio = (1 - accuracy on the images with v) / (1 - overall
accuracy), how many times more often the model errs where v holds than overall. Accuracies come
from the ``imagenet_x`` package's own ``compute_factor_accuracies`` (one-hot factor columns, one
row per image); the ratio is the package's ``error_ratio`` formula, which fixes its columns to
ImageNet-X's 16 names, applied to this world's (factor=value) columns (tests/test_auditors.py
checks that the two agree on ImageNet-X's factors).

Interval (95%): the Wilson interval of the subgroup's error rate (statsmodels'
``proportion_confint``) divided by the overall error rate, which rests on every image used and is
taken as known. The synthetic world's factors include the class, so ``class = star`` is a
subgroup like any other; ImageNet's are ImageNet-X's 16 (annotations shipped in the package,
joined by val file name). Needs no generator: the budget is the number of validation images used
(a seeded sample of the annotated ones; all of them by default).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from imagenet_x import compute_factor_accuracies
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.discovery.auditors.base import AUDITORS, Auditor, Finding
from counteraudit.train.core.artifacts import derive_seed

OBJECTIVE = "error_ratio"


@dataclass(frozen=True)
class ErrorRatioParams:
    min_images: int = 10    # factor values seen on fewer images get no finding (too noisy)


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


@AUDITORS.register
class ErrorRatio(Auditor):
    name = "error_ratio"
    Params = ErrorRatioParams
    needs_generator = False
    objective = OBJECTIVE

    def check(self) -> None:
        if self.params.min_images < 1:
            raise ValueError(f"error_ratio: min_images={self.params.min_images} must be >= 1 "
                             "(10 recommended)")

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

    def find(self, model, world, budget, seed):
        val = world.split("val")
        pool = self.annotated(world)
        if len(pool) == 0:
            raise ValueError(f"error_ratio: no val image of the {world.name} world has factor "
                             "annotations (for ImageNet: val images named like "
                             "ILSVRC2012_val_00000001.JPEG, joined with ImageNet-X)")
        rng = np.random.default_rng(derive_seed(seed, "error_ratio"))
        chosen = np.sort(rng.permutation(pool)[:budget]) if budget < len(pool) else pool
        labels = np.asarray(val.labels)[chosen]
        probabilities = np.concatenate([self.predict(model, val.load(chosen[s:s + 256]))
                                        for s in range(0, len(chosen), 256)])
        correct = probabilities.argmax(1) == labels
        grid = world.factors()
        table = error_ratios(correct, one_hot([world.image_factors(val, int(i)) for i in chosen],
                                              grid))
        self.notes = {"images": int(len(chosen)), "overall_accuracy": float(correct.mean())}
        overall_error = float(1 - correct.mean())
        findings = []
        for row in table.itertuples(index=False):
            if row.n_images < self.params.min_images:
                continue
            factor, value = row.column.split("=", 1)
            if overall_error == 0:  # no error anywhere: every factor is as good as overall
                ratio, low, high = 1.0, 1.0, 1.0
            else:
                low, high = proportion_confint(int(row.errors), int(row.n_images), alpha=0.05,
                                               method="wilson")
                ratio, low, high = row.error_ratio, low / overall_error, high / overall_error
            findings.append(Finding({factor: value}, float(ratio), float(low), float(high),
                                    int(row.n_images), OBJECTIVE))
        return findings
