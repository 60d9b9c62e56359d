"""Failure-rate lift of captions of misclassified images (Wiles, Albuquerque & Gowal, 2022).

The paper's two objectives, for a class y and a description z (the class's prompt plus sentences):

- Eq. 1, ``lift``: any failure. E_{x~p(x|z,y)}[f(x) != y] > E_{x~p(x|y)}[f(x) != y]; the
  statistic is the ratio of the two failure rates (the paper's "Failure rate (any)" column).
- Eq. 2, ``target_lift:<class>``: failures toward a target class t != y.
  E_{x~p(x|z,y)}[f(x) = t] > E_{x~p(x|y)}[f(x) = t]; the ratio of the two target rates (the
  paper's "Failure rate (target)" column, its headline 497x and 3721x).

The design (``hypotheses = "clusters"``, the paper's Sec. 3):

1. Per class, ``images_per_class`` images conditioned on the class alone: the baseline rates
   (the right-hand sides of Eq. 1 and 2).
2. The baseline's failures are split by predicted label (the paper's "optional clustering", its
   first step; its second, a feature-space clustering within each split, is not done): the split
   y -> t is a cluster when it holds at least ``min_recurrence`` images.
3. The world's annotations stand in for the captioner: an image's caption is one sentence per
   described factor ("the background is X"). By default the captioner describes EVERY factor of
   the world (``captioner = "all"``); ``captioner = "partial"`` describes only
   ``described_factors``, and ``caption_noise`` is the probability that a sentence names a wrong
   value (drawn uniformly from the factor's other values): a weaker captioner, as options.
4. A cluster's caption is built greedily, as the paper combines sentences to maximise the
   likelihood of the cluster's images (s_j = argmax_s prod_x P([s_1..s_j-1, s] | x, y)): with a
   captioner that names each value correctly with a fixed probability, that product is largest
   for the sentence shared by the most images, so s_j is the sentence that the most images share
   with s_1..s_j-1; sentences are added up to ``max_sentences`` while at least
   ``min_recurrence`` images share them all. The paper's first refinement rule then tests every
   single sentence of the caption with the class prompt. Each description is tested for Eq. 1 and
   for Eq. 2 toward the cluster's predicted label (a description two clusters propose is tested
   toward both targets).
5. Each description, in a fixed order (largest cluster first; the caption, then its sentences),
   as long as the budget lasts, gets ``images_per_description`` FRESH images generated from it
   (never the baseline images it was described from: another stream of the world's generator).
6. The p-value is Fisher's exact test (one-sided: the description's rate exceeds the baseline's;
   scipy), Benjamini-Hochberg (statsmodels ``fdr_bh``) at false-discovery rate ``fdr`` across
   every test of both objectives (one family); the findings are the significant tests.

``hypotheses = "recurring"`` (this project's earlier adaptation): no split by predicted label;
every combination of 1..``max_sentences`` sentences that at least ``min_recurrence`` failures of
the class share is a description, most recurring first, tested for Eq. 2 toward the predicted
label most frequent among those failures.

What is adapted from the paper: the lift is estimated with a half count added to each cell
(Haldane-Anscombe), ((k + 1/2)/(n + 1)) / ((K + 1/2)/(N + 1)), because with hundreds of images a
baseline often has no failure toward a target (the paper generated up to 9.1M images per
caption), and the paper's plain ratio k/n / (K/N) is then infinite; the notes keep the plain ratio
too (``raw_lift``). Significance: Fisher + BH, where the paper's appendix used a Mann-Whitney U test
over ten runs. The paper counts a top-3 WordNet-aware failure; here a failure is a wrong top-1
class (the world has no label hierarchy).

The paper conditions on a class and refines it, so a defect that is the class itself (a missing
class fails on every image of it: every refinement has lift 1) is out of its reach. A class-level
test (one class's failure rate against the others', on the images it was picked from) was
removed: "every class is equally hard" is false for any healthy model, so it flagged healthy
references; whether a class fails more than the references' does is the reference-relative
score's question.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from scipy.stats import fisher_exact
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.discovery.auditors.base import (AUDITORS, Auditor, Finding, Subgroup,
                                                           conditions_key)
from counteraudit.train.core.params import at_most
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.artifacts import derive_seed

LIFT = "lift"                  # Eq. 1: any failure
TARGET_LIFT = "target_lift"    # Eq. 2: failures toward a target class, "target_lift:<class>"
HYPOTHESES = ("clusters", "recurring")
CAPTIONERS = ("all", "partial")
HALF_COUNT = 0.5  # Haldane-Anscombe: a finite lift where a baseline count is zero


@dataclass(frozen=True)
class CaptionLiftParams:
    images_per_class: Annotated[int, at_most(bounds.DISCOVERY_IMAGES)] = 100       # baseline images per class
    images_per_description: Annotated[int, at_most(bounds.DISCOVERY_IMAGES)] = 50  # fresh images per tested description
    hypotheses: str = "clusters"         # "clusters" (the paper) or "recurring"
    captioner: str = "all"               # "all" factors, or "partial": described_factors only
    described_factors: tuple[str, ...] = ()   # with captioner = "partial"
    caption_noise: float = 0.0           # probability that a sentence names a wrong value
    max_sentences: int = 3               # sentences combined into one caption
    min_recurrence: int = 3              # failures a cluster (a recurring description) needs
    fdr: float = 0.05                    # Benjamini-Hochberg false-discovery rate
    descriptions: Annotated[int, at_most(bounds.DISCOVERY_IMAGES)] = 30  # default budget: tested descriptions


def target_objective(target: str) -> str:
    return f"{TARGET_LIFT}:{target}"


# ---------------------------------------------------------------- the statistics (pure)
def fisher_greater(failures: int, n: int, base_failures: int, base_n: int) -> float:
    """One-sided p-value that the failure rate k/n exceeds the baseline K/N (Fisher's exact)."""
    table = [[failures, n - failures], [base_failures, base_n - base_failures]]
    return float(fisher_exact(table, alternative="greater").pvalue)


def corrected_rate(count: int, n: int) -> float:
    return (count + HALF_COUNT) / (n + 2 * HALF_COUNT)


def lift(failures: int, n: int, base_failures: int, base_n: int) -> float:
    """(k/n) / (K/N) with a half count added to each cell (finite when K = 0)."""
    return corrected_rate(failures, n) / corrected_rate(base_failures, base_n)


def raw_lift(failures: int, n: int, base_failures: int, base_n: int) -> float | None:
    """The paper's plain ratio (k/n) / (K/N); None where it is infinite (K = 0 < k; JSON has no
    infinity), 1 when both counts are 0."""
    if base_failures == 0:
        return None if failures > 0 else 1.0
    return (failures / n) / (base_failures / base_n)


def lift_interval(failures: int, n: int, base_failures: int, base_n: int) -> tuple[float, float]:
    """95% interval of the lift: the Wilson interval of k/n (statsmodels) over the baseline's
    corrected rate taken as known, as error_ratio does (the Wilson interval holds the corrected
    rate (k + 1/2)/(n + 1), which lies between k/n and the interval's centre)."""
    low, high = proportion_confint(failures, n, alpha=0.05, method="wilson")
    base_rate = corrected_rate(base_failures, base_n)
    return float(low / base_rate), float(high / base_rate)


def lift_test(objective: str, conditions: dict[str, str], failures: int, n: int,
              base_failures: int, base_n: int) -> dict:
    """The record of one test: counts, lift (and the paper's plain ratio), interval, p-value."""
    return {"objective": objective, "conditions": dict(conditions), "failures": int(failures),
            "n": int(n), "baseline_failures": int(base_failures), "baseline_n": int(base_n),
            "lift": lift(failures, n, base_failures, base_n),
            "raw_lift": raw_lift(failures, n, base_failures, base_n),
            "interval": lift_interval(failures, n, base_failures, base_n),
            "p_value": fisher_greater(failures, n, base_failures, base_n)}


def description_tests(conditions: dict[str, str], predicted: np.ndarray,
                      base_predicted: np.ndarray, label: int, targets: dict[int, str]) -> list[dict]:
    """Eq. 1 and Eq. 2 (toward each of ``targets``, {class index: name}) of one description, from
    the predicted labels of its images and of its class's baseline images (true label ``label``)."""
    predicted, base_predicted = np.asarray(predicted), np.asarray(base_predicted)
    tests = [lift_test(LIFT, conditions, int((predicted != label).sum()), len(predicted),
                       int((base_predicted != label).sum()), len(base_predicted))]
    for index, name in targets.items():
        tests.append(lift_test(target_objective(name), conditions,
                               int((predicted == index).sum()), len(predicted),
                               int((base_predicted == index).sum()), len(base_predicted)))
    return tests


def benjamini_hochberg(p_values: list[float], fdr: float) -> np.ndarray:
    """Which hypotheses Benjamini-Hochberg rejects at false-discovery rate ``fdr``."""
    if not p_values:
        return np.zeros(0, bool)
    return multipletests(np.asarray(p_values, float), alpha=fdr, method="fdr_bh")[0]


def as_finding(test: dict) -> Finding:
    return Finding(test["conditions"], test["lift"], *test["interval"], test["n"],
                   test["objective"])


def significant_findings(tested: list[dict], fdr: float) -> list[Finding]:
    """The tests BH keeps (one family: every test of both objectives), as findings."""
    keep = benjamini_hochberg([t["p_value"] for t in tested], fdr)
    return [as_finding(t) for t, kept in zip(tested, keep) if kept]


# ---------------------------------------------------------------- the hypotheses
def sentences(caption: dict[str, str]) -> list[tuple[str, str]]:
    return [(f, v) for f, v in caption.items() if f != "class"]


def greedy_caption(captions: list[dict[str, str]], max_sentences: int,
                   min_recurrence: int) -> list[tuple[str, str]]:
    """The sentences of a cluster's caption: each the one the most captions share with those
    already chosen (ties by text), while at least ``min_recurrence`` share them all."""
    chosen: list[tuple[str, str]] = []
    sharing = [set(sentences(c)) for c in captions]
    while len(chosen) < max_sentences:
        counts: dict[tuple[str, str], int] = {}
        for caption in sharing:
            if all(s in caption for s in chosen):
                for s in caption:
                    if s[0] not in {f for f, _ in chosen}:
                        counts[s] = counts.get(s, 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda s: (-counts[s], s))
        if counts[best] < min_recurrence:
            break
        chosen.append(best)
    return chosen


def cluster_descriptions(failures: list[tuple[dict[str, str], int]], max_sentences: int,
                         min_recurrence: int) -> list[tuple[dict[str, str], int, int]]:
    """(description, target, cluster size) from (caption, predicted label) of misclassified
    images: split by (class, predicted label), largest split first (ties by class, target), each
    split with at least ``min_recurrence`` images gives its greedy caption, then each of its
    sentences alone (the paper's refinement rule (i))."""
    clusters: dict[tuple[str, int], list[dict[str, str]]] = {}
    for caption, predicted in failures:
        clusters.setdefault((caption["class"], predicted), []).append(caption)
    out = []
    for (name, target), members in sorted(clusters.items(),
                                          key=lambda item: (-len(item[1]), item[0])):
        if len(members) < min_recurrence:
            continue
        chosen = greedy_caption(members, max_sentences, min_recurrence)
        if not chosen:
            continue
        for part in [chosen] + ([[s] for s in chosen] if len(chosen) > 1 else []):
            out.append(({"class": name, **dict(part)}, target, len(members)))
    return out


def recurring_descriptions(captions: list[dict[str, str]], max_sentences: int,
                           min_recurrence: int) -> list[tuple[dict[str, str], int]]:
    """(description, count) shared by at least ``min_recurrence`` captions, most recurring first
    (ties by text). A caption is {"class": c, factor: value, ...}; a description is its class
    with 1..max_sentences of its other values."""
    counts: dict[str, int] = {}
    for caption in captions:
        for size in range(1, max_sentences + 1):
            for chosen in itertools.combinations(sentences(caption), size):
                key = json.dumps({"class": caption["class"], **dict(chosen)}, sort_keys=True)
                counts[key] = counts.get(key, 0) + 1
    frequent = [(json.loads(k), c) for k, c in counts.items() if c >= min_recurrence]
    return sorted(frequent, key=lambda item: (-item[1], json.dumps(item[0], sort_keys=True)))


def recurring_with_targets(failures: list[tuple[dict[str, str], int]], max_sentences: int,
                           min_recurrence: int) -> list[tuple[dict[str, str], int, int]]:
    """(description, target, count): the recurring descriptions, each toward the label most
    often predicted on the failures that share it (ties: the lower class index)."""
    out = []
    for description, count in recurring_descriptions([c for c, _ in failures], max_sentences,
                                                     min_recurrence):
        labels = [p for c, p in failures if all(c.get(k) == v for k, v in description.items())]
        out.append((description, int(np.bincount(labels).argmax()), count))
    return out


def ordered_descriptions(proposals) -> list[tuple[dict[str, str], list[int]]]:
    """Distinct descriptions in first-proposed order, each with its targets (in order)."""
    merged: dict[str, tuple[dict[str, str], list[int]]] = {}
    for description, target, _ in proposals:
        entry = merged.setdefault(conditions_key(description), (description, []))
        if target not in entry[1]:
            entry[1].append(target)
    return list(merged.values())


@AUDITORS.register
class CaptionLift(Auditor):
    name = "caption_lift"
    Params = CaptionLiftParams
    # 2: Eq. 2 (target_lift:<class>), clusters by predicted label, every factor described, the
    # half-count lift, and no class-level tests.
    version = 2
    objective = LIFT
    adaptive = True   # the descriptions come from the model's own failures
    # Lifts are ratios to a class's baseline (1: no effect). A quarter of that is about what one
    # image changes on a 50-image description at a 10% baseline (0.02 / 0.1 = 0.2): a smaller
    # spread among the references is counting noise, not agreement.
    spread_floor = 0.25
    # Only significant descriptions are findings: an untrained model may have none.
    filters_findings = True
    null_statistic = 1.0  # no significant description: nothing fails more than its baseline
    test_params = {"images_per_class": 8, "images_per_description": 4, "captioner": "partial",
                   "described_factors": ("face",), "max_sentences": 1, "min_recurrence": 1,
                   "descriptions": 3}

    def check(self) -> None:
        p = self.params
        for name, value, advice in (("images_per_class", p.images_per_class, "100"),
                                    ("images_per_description", p.images_per_description, "50"),
                                    ("max_sentences", p.max_sentences, "3"),
                                    ("min_recurrence", p.min_recurrence, "3"),
                                    ("descriptions", p.descriptions, "30")):
            if value < 1:
                raise ValueError(f"caption_lift: {name}={value} must be >= 1 ({advice} "
                                 "recommended)")
        if not 0 < p.fdr < 1:
            raise ValueError(f"caption_lift: fdr={p.fdr} must be in (0, 1) (0.05 recommended)")
        if not 0 <= p.caption_noise < 1:
            raise ValueError(f"caption_lift: caption_noise={p.caption_noise} must be in [0, 1) "
                             "(the probability that a sentence names a wrong value; 0: none)")
        if p.hypotheses not in HYPOTHESES:
            raise ValueError(f"caption_lift: hypotheses={p.hypotheses!r}; valid: "
                             f"{', '.join(HYPOTHESES)}")
        if p.captioner not in CAPTIONERS:
            raise ValueError(f"caption_lift: captioner={p.captioner!r}; valid: "
                             f"{', '.join(CAPTIONERS)}")
        if p.captioner == "partial" and not p.described_factors:
            raise ValueError("caption_lift: captioner='partial' needs described_factors (the "
                             "factors its captions mention, e.g. ['face', 'size'])")
        if p.captioner == "all" and p.described_factors:
            raise ValueError("caption_lift: described_factors is read only with captioner = "
                             "'partial' (captioner = 'all' describes every factor)")

    def described(self, world) -> list[str]:
        """The factors the captioner mentions (every factor but the class, by default)."""
        factors = [f for f in world.factors() if f != "class"]
        if self.params.captioner == "all":
            return factors
        for name in self.params.described_factors:
            if name not in factors:
                raise ValueError(f"caption_lift: described_factors names {name!r}, which cannot "
                                 f"be described; this world's factors besides the class: "
                                 f"{', '.join(factors)}")
        return list(self.params.described_factors)

    def searchable_factors(self, world) -> list[str]:
        """The class and the factors its captioner describes."""
        return ["class", *self.described(world)]

    def baseline_images(self, world) -> int:
        return self.params.images_per_class * len(world.factors()["class"])

    def minimum_budget(self, world) -> int:
        return self.baseline_images(world)

    def default_budget(self, world, seed: int = 0) -> int:
        return self.baseline_images(world) + (self.params.descriptions
                                              * self.params.images_per_description)

    def caption(self, values: dict[str, str], name: str, described: list[str], grid,
                rng: np.random.Generator) -> dict[str, str]:
        """The captioner: the image's class and described values, each wrong with probability
        ``caption_noise`` (then another value of the factor, uniformly)."""
        caption = {"class": name}
        for factor in described:
            value = values[factor]
            if self.params.caption_noise > 0 and rng.random() < self.params.caption_noise:
                others = [v for v in grid[factor] if v != value]
                value = others[int(rng.integers(len(others)))] if others else value
            caption[factor] = value
            self._wrong_sentences += value != values[factor]
        return caption

    def find(self, model, world, budget, seed):
        p = self.params
        grid = world.factors()
        described = self.described(world)  # a bad factor name fails before any image
        class_index = {name: k for k, name in enumerate(world.class_names)}
        rng = np.random.default_rng(derive_seed(seed, "caption_lift", "captioner"))
        self._wrong_sentences = 0
        baseline: dict[str, np.ndarray] = {}
        failures: list[tuple[dict[str, str], int]] = []
        for name in grid["class"]:
            # evaluate_subgroup's steps, keeping the images: the captioner reads their factors
            images = world.generate({"class": name}, p.images_per_class, seed)
            self._subgroups.append(Subgroup({"class": name}, p.images_per_class, seed))
            predicted = self.predict(model, images.load(range(len(images)))).argmax(1)
            baseline[name] = predicted
            for index in np.flatnonzero(predicted != np.asarray(images.labels)):
                values = images.annotation(int(index))["factors"]
                failures.append((self.caption(values, name, described, grid, rng),
                                 int(predicted[index])))
        propose = cluster_descriptions if p.hypotheses == "clusters" else recurring_with_targets
        proposed = ordered_descriptions(propose(failures, p.max_sentences, p.min_recurrence))
        feasible = [(d, t) for d, t in proposed if world.feasible(d)]  # a noisy caption may not be
        affordable = (budget - self.baseline_images(world)) // p.images_per_description
        tested = []
        for number, (description, targets) in enumerate(feasible[:affordable]):
            probabilities, _ = self.evaluate_subgroup(model, world, description,
                                                      p.images_per_description, seed)
            label = class_index[description["class"]]
            for test in description_tests(description, probabilities.argmax(1),
                                          baseline[description["class"]], label,
                                          {t: world.class_names[t] for t in targets}):
                tested.append({**test, "description": number})
        self.notes = {
            "baseline": {c: [int((v != class_index[c]).sum()), len(v)] for c, v in baseline.items()},
            "captioner": {"kind": p.captioner, "factors": described, "noise": p.caption_noise,
                          "sentences": len(failures) * len(described),
                          "wrong_sentences": int(self._wrong_sentences)},
            "hypotheses": p.hypotheses, "failures": len(failures), "proposed": len(proposed),
            "infeasible": len(proposed) - len(feasible), "descriptions_tested":
                min(affordable, len(feasible)), "tested": tested, "fdr": p.fdr}
        return significant_findings(tested, p.fdr)

    def findings_within(self, result, images, world, seed):
        """BH over the tests of the descriptions a smaller budget would have tested (the same
        fixed order)."""
        base = self.baseline_images(world)
        if images < base:
            return None
        count = (images - base) // self.params.images_per_description
        return significant_findings([t for t in result.notes["tested"]
                                     if t["description"] < count], result.notes["fdr"])

    def reevaluate(self, model, world, result):
        """The findings' lifts as ``model`` scores them on the same baseline and description
        images (every finding, significant for it or not: the references' side); only the
        subgroups the findings rest on are evaluated."""
        if not result.findings:  # nothing to score: generate nothing
            return []
        class_index = {name: k for k, name in enumerate(world.class_names)}
        predicted = {}
        # only the findings' descriptions and their classes' baselines: a fifth of the images
        needed = {conditions_key(c) for f in result.findings
                  for c in (f.conditions, {"class": f.conditions["class"]})}
        with self._evaluating(model, budget=None):
            for subgroup in result.subgroups:
                if conditions_key(subgroup.conditions) not in needed:
                    continue
                probabilities, _ = self.evaluate_subgroup(model, world, subgroup.conditions,
                                                          subgroup.n, subgroup.seed)
                predicted[conditions_key(subgroup.conditions)] = probabilities.argmax(1)
        findings = []
        for finding in result.findings:
            name = finding.conditions["class"]
            target = finding.objective.partition(":")[2]
            targets = {class_index[target]: target} if target else {}
            tests = description_tests(finding.conditions,
                                      predicted[conditions_key(finding.conditions)],
                                      predicted[conditions_key({"class": name})],
                                      class_index[name], targets)
            findings.append(as_finding(tests[-1]))
        return findings
