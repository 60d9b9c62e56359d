"""Failure-rate lift of descriptions of misclassified images (seed 000, Wiles et al., 2022).

1. Per class, generate ``images_per_class`` images conditioned on the class alone: the class's
   baseline failure rate (misclassified / generated).
2. Describe each misclassified image. The world's annotations stand in for the captioner: an
   image's "caption" is its class and its values of ``factors`` (one sentence per factor); a
   description combines the class with up to ``max_sentences`` of its sentences, as the seed
   greedily combines caption sentences. A description is *recurring* when at least
   ``min_recurrence`` misclassified images of the class share it.
3. For each recurring description (most recurring first, as long as the budget lasts), generate
   ``images_per_description`` fresh images conditioned on it. Its lift is its failure rate over
   the class's baseline; the p-value is Fisher's exact test (one-sided: higher than the
   baseline; scipy), the 95% interval the description's Wilson interval (statsmodels) over
   the baseline rate.
4. Benjamini-Hochberg across every tested description (statsmodels ``multipletests``,
   ``fdr_bh``) at false-discovery rate ``fdr``; the findings are the significant descriptions,
   ranked by lift.

The seed conditions on a given class and refines it, so a defect that is the class itself (a
missing class fails on every image of it: every refinement has lift 1) is out of its reach. With
``class_level`` (default on) each class with recurring failures is tested too, as the refinement
of "any class": its phase-1 failure rate against the other classes' (Fisher, on the phase-1
images, no extra images), in the same BH family.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import fisher_exact
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.discovery.auditors.base import AUDITORS, Auditor, Finding
from counteraudit.evaluate.discovery.auditors.surrogate_search import DEMO_FACTORS

OBJECTIVE = "lift"


@dataclass(frozen=True)
class CaptionLiftParams:
    images_per_class: int = 100          # baseline images per class
    images_per_description: int = 50     # fresh images per tested description
    factors: tuple[str, ...] = field(default=DEMO_FACTORS[1:])  # what the "captioner" mentions
    max_sentences: int = 2               # sentences combined into one description
    min_recurrence: int = 3              # misclassified images a description must recur in
    fdr: float = 0.05                    # Benjamini-Hochberg false-discovery rate
    class_level: bool = True             # also test each class against the other classes
    descriptions: int = 20               # default budget: this many tested descriptions


def fisher_greater(failures: int, n: int, base_failures: int, base_n: int) -> float:
    """One-sided p-value that the failure rate k/n exceeds the baseline K/N (Fisher's exact)."""
    table = [[failures, n - failures], [base_failures, base_n - base_failures]]
    return float(fisher_exact(table, alternative="greater").pvalue)


def lift_interval(failures: int, n: int, base_failures: int, base_n: int) -> tuple[float, float]:
    """95% interval of (k/n) / (K/N): the Wilson interval of k/n (statsmodels) over the baseline
    rate taken as known, as error_ratio does (it holds the estimate; the baseline rests on the
    more images)."""
    low, high = proportion_confint(failures, n, alpha=0.05, method="wilson")
    base_rate = base_failures / base_n
    if base_rate == 0:
        return (float("inf") if low > 0 else 0.0), float("inf")
    return float(low / base_rate), float(high / base_rate)


def benjamini_hochberg(p_values: list[float], fdr: float) -> np.ndarray:
    """Which hypotheses Benjamini-Hochberg rejects at false-discovery rate ``fdr``."""
    if not p_values:
        return np.zeros(0, bool)
    return multipletests(np.asarray(p_values, float), alpha=fdr, method="fdr_bh")[0]


def tested_description(conditions, failures, n, base_failures, base_n) -> dict:
    """The record of one test: counts, lift, interval and p-value."""
    base_rate = base_failures / base_n
    lift = (failures / n) / base_rate if base_rate > 0 else float("inf")
    return {"conditions": dict(conditions), "failures": int(failures), "n": int(n),
            "baseline_failures": int(base_failures), "baseline_n": int(base_n), "lift": lift,
            "interval": lift_interval(failures, n, base_failures, base_n),
            "p_value": fisher_greater(failures, n, base_failures, base_n)}


def significant_findings(tested: list[dict], fdr: float) -> list[Finding]:
    """The tested descriptions BH keeps, as findings (statistic = lift)."""
    keep = benjamini_hochberg([t["p_value"] for t in tested], fdr)
    return [Finding(t["conditions"], t["lift"], *t["interval"], t["n"], OBJECTIVE)
            for t, kept in zip(tested, keep) if kept]


def recurring_descriptions(captions: list[dict[str, str]], max_sentences: int,
                           min_recurrence: int) -> list[tuple[dict[str, str], int]]:
    """(description, count) shared by at least ``min_recurrence`` captions, most recurring first
    (ties by text). A caption is {"class": c, factor: value, ...}; a description is its class
    with 1..max_sentences of its other values."""
    counts: dict[str, int] = {}
    for caption in captions:
        sentences = [(f, v) for f, v in caption.items() if f != "class"]
        for size in range(1, max_sentences + 1):
            for chosen in itertools.combinations(sentences, size):
                key = json.dumps({"class": caption["class"], **dict(chosen)}, sort_keys=True)
                counts[key] = counts.get(key, 0) + 1
    frequent = [(json.loads(k), c) for k, c in counts.items() if c >= min_recurrence]
    return sorted(frequent, key=lambda item: (-item[1], json.dumps(item[0], sort_keys=True)))


@AUDITORS.register
class CaptionLift(Auditor):
    name = "caption_lift"
    Params = CaptionLiftParams
    objective = OBJECTIVE
    # Only significant descriptions are findings: an untrained model may have none.
    filters_findings = True
    null_statistic = 1.0  # no significant description: nothing fails more than its baseline
    test_params = {"images_per_class": 8, "images_per_description": 4, "factors": ("face",),
                   "max_sentences": 1, "min_recurrence": 1, "descriptions": 3}

    def check(self) -> None:
        p = self.params
        for name, value, advice in (("images_per_class", p.images_per_class, "100"),
                                    ("images_per_description", p.images_per_description, "50"),
                                    ("max_sentences", p.max_sentences, "2"),
                                    ("min_recurrence", p.min_recurrence, "3"),
                                    ("descriptions", p.descriptions, "20")):
            if value < 1:
                raise ValueError(f"caption_lift: {name}={value} must be >= 1 ({advice} "
                                 "recommended)")
        if not 0 < p.fdr < 1:
            raise ValueError(f"caption_lift: fdr={p.fdr} must be in (0, 1) (0.05 recommended)")

    def baseline_images(self, world) -> int:
        return self.params.images_per_class * len(world.factors()["class"])

    def minimum_budget(self, world) -> int:
        return self.baseline_images(world)

    def default_budget(self, world, seed: int = 0) -> int:
        return self.baseline_images(world) + (self.params.descriptions
                                              * self.params.images_per_description)

    def find(self, model, world, budget, seed):
        p = self.params
        factors = world.factors()
        for name in p.factors:
            if name not in factors or name == "class":
                raise ValueError(f"caption_lift: factor {name!r} cannot be described; this "
                                 f"world's factors besides the class: "
                                 f"{', '.join(f for f in factors if f != 'class')}")
        baseline: dict[str, tuple[int, int]] = {}
        captions = []
        for name in factors["class"]:
            images = world.generate({"class": name}, p.images_per_class, seed)
            predicted = self.predict(model, images.load(range(len(images)))).argmax(1)
            wrong = predicted != np.asarray(images.labels)
            baseline[name] = (int(wrong.sum()), len(wrong))
            for index in np.flatnonzero(wrong):  # the "captioner": the image's annotation
                values = images.annotation(int(index))["factors"]
                captions.append({"class": name, **{f: values[f] for f in p.factors}})
        tested = []
        if p.class_level:
            total_failures = sum(k for k, _ in baseline.values())
            total = sum(n for _, n in baseline.values())
            for name, (failures, n) in baseline.items():
                if failures >= p.min_recurrence:
                    tested.append(tested_description({"class": name}, failures, n,
                                                     total_failures - failures, total - n))
        class_tests = len(tested)
        candidates = recurring_descriptions(captions, p.max_sentences, p.min_recurrence)
        affordable = (budget - self.baseline_images(world)) // p.images_per_description
        for conditions, _ in candidates[:affordable]:
            images = world.generate(conditions, p.images_per_description, seed)
            predicted = self.predict(model, images.load(range(len(images)))).argmax(1)
            failures = int((predicted != np.asarray(images.labels)).sum())
            tested.append(tested_description(conditions, failures, len(images),
                                             *baseline[conditions["class"]]))
        self.notes = {"baseline": {c: list(v) for c, v in baseline.items()},
                      "recurring": len(candidates), "class_tests": class_tests,
                      "tested": tested, "fdr": p.fdr}
        return significant_findings(tested, p.fdr)

    def findings_within(self, result, images, world, seed):
        """BH over the class tests and the descriptions a smaller budget would have tested (the
        most recurring first, the same order)."""
        base = self.baseline_images(world)
        if images < base:
            return None
        notes = result.notes
        count = notes["class_tests"] + (images - base) // self.params.images_per_description
        return significant_findings(notes["tested"][:count], notes["fdr"])
