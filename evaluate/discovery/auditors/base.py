"""The plug-in interface of failure-discovery auditors, and the loop they share.

An auditor looks for *conditions* under which a model fails: conjunctions of the world's factor
values (``World.factors()``). It is a small class that sets ``name`` (and, optionally, a
``Params`` dataclass, as explanation methods do) and implements ONE method:

    find(model, world, budget, seed) -> list[Finding]

using the shared helpers ``predict`` (a batch of images through the model, counted against the
budget) and ``evaluate_subgroup`` (generate n images of a subgroup and predict them). ``run``
does the rest once for every auditor: checks the budget, evaluates under no_grad, refuses a run
that used more images than its budget, and ranks the findings (per objective, worst first, ties
broken by the conditions' text, so the same seed gives the same ranking).

Register with ``@AUDITORS.register`` (evaluate/discovery/auditor_registry.py) and set ``name`` to a
string; ``AUDITORS`` imports every module of this folder on first lookup, so a new auditor is one
new file there, and ``tests/test_auditors.py`` tests it. The first line of its module's docstring
is its line in ``discover --help``.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np
import torch
from scipy.stats import binom

from counteraudit.evaluate.discovery.auditor_registry import AUDITORS
from counteraudit.train.core.params import NoParams, parse_params, recorded_params
from counteraudit.train.core.plugin_files import plugin_description

PREDICT_BATCH = 256


def probabilities(model: torch.nn.Module, images: torch.Tensor) -> np.ndarray:
    """Softmax probabilities (N, classes) as float64, in batches, on the model's device."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(images), PREDICT_BATCH):
        logits = model(images[start:start + PREDICT_BATCH].to(device))
        out.append(torch.softmax(logits.float(), dim=1).double().cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, 0))


def subgroup_images(world, subgroup: Subgroup) -> tuple[torch.Tensor, np.ndarray]:
    """(images (n, 3, H, W) in [0, 1], labels (n,)) of one subgroup, from the world's generator
    (deterministic in the subgroup's conditions, n and seed)."""
    images = world.generate(dict(subgroup.conditions), subgroup.n, subgroup.seed)
    return images.load(range(len(images))), np.asarray(images.labels)


def build_auditor(name: str, params: Mapping[str, Any] | None = None) -> "Auditor":
    return AUDITORS.get(name)(params)


@dataclass(frozen=True)
class Finding:
    """A subgroup (a conjunction of factor values), how badly the model does on it (higher is
    worse) with a 95% interval, the images it rests on, and the objective measured."""
    conditions: dict[str, str]
    statistic: float
    low: float
    high: float
    n_images: int
    objective: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "statistic": float(self.statistic), "low": float(self.low),
                "high": float(self.high), "n_images": int(self.n_images)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Finding":
        return cls(**data)

    def label(self) -> str:
        """e.g. ``class=star & face=present``."""
        return " & ".join(f"{k}={v}" for k, v in self.conditions.items()) or "(everything)"

    def covers(self, slice_conditions: Mapping[str, str]) -> bool:
        """Whether this subgroup lies inside the slice (it fixes every factor the slice fixes,
        to the slice's value)."""
        return all(self.conditions.get(k) == v for k, v in slice_conditions.items())


@dataclass(frozen=True)
class Subgroup:
    """One evaluated subgroup: what regenerates its images (the world's ``generate`` is
    deterministic in these), so that another model can be evaluated on the very same images."""
    conditions: dict[str, str]
    n: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {"conditions": dict(self.conditions), "n": int(self.n), "seed": int(self.seed)}


@dataclass
class AuditResult:
    findings: list[Finding]
    images_used: int
    notes: dict[str, Any]
    # every subgroup evaluated, in order (reference-relative scoring evaluates the references on
    # the same images: ``Auditor.reevaluate``)
    subgroups: list[Subgroup] = field(default_factory=list)


class BudgetError(ValueError):
    """A budget too small for the auditor; the message names the minimum."""


class Auditor(ABC):
    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    # Bump when the results change for the same parameters: part of the stored result's key.
    version: ClassVar[int] = 1
    # False: works on the world's annotated validation images (worlds without a generator too).
    needs_generator: ClassVar[bool] = True
    # The objective whose top finding is the model-level statistic (Table 3) and whose ranking
    # places the planted slice (Table 4).
    objective: ClassVar[str]
    # Small parameters with which tests/test_auditors.py runs every registered auditor in
    # seconds on a tiny world (the generic tests: same bits, budget, resume).
    test_params: ClassVar[dict[str, Any]] = {}
    # True when findings are only what passes a test (possibly none, e.g. on an untrained
    # model): the generic tests then check the notes, and the auditor's own tests the findings.
    filters_findings: ClassVar[bool] = False
    # The model-level statistic (Table 3) of a result without any finding (NaN: undefined).
    null_statistic: ClassVar[float] = float("nan")
    # The largest value the statistic can take (a failure rate: 1): where the references already
    # reach it, no model can score clearly above them, and Table 3 marks the verdict saturated.
    statistic_ceiling: ClassVar[float] = float("inf")
    # True when the subgroups evaluated depend on the model (a search, a test of the model's own
    # errors): the references are then evaluated on this model's subgroups (``reevaluate``) for
    # its reference-relative score. False: every model gets the same subgroups on the same
    # images, so the references' own results already hold their statistics.
    adaptive: ClassVar[bool] = False
    # True when the auditor chooses what to evaluate next by the scores seen so far (a search):
    # under a relative score it then needs the references during ``find`` (``reference_panel``),
    # or it would steer toward what is hard for every model.
    searches_relative: ClassVar[bool] = False
    # The least spread of the references' statistic the relative score divides by (on the
    # statistic's own scale): where every reference gives the same value, a tiny difference would
    # otherwise be an infinite score. A failure rate's: 0.05 (one image in 20).
    spread_floor: ClassVar[float] = 0.05

    def __init__(self, params: Mapping[str, Any] | Any | None = None):
        self.params = parse_params(self.Params, params, f"auditor {self.name!r}")
        self.check()
        self._used = 0
        self._budget: int | None = 0
        self._subgroups: list[Subgroup] = []
        # A model's stored predictions by subgroup (get / put), set where a model is evaluated
        # on subgroups other models chose (the references, ``reevaluate``): each once.
        self.prediction_cache = None
        # The references' (model, PredictionCache) pairs, set by the discover stage where the
        # score is relative and the auditor ``searches_relative``: its search then steers by the
        # relative score (``reference_predictions``); None: by the statistic itself.
        self.reference_panel = None
        self.notes: dict[str, Any] = {}

    def check(self) -> None:
        """Raise ValueError for invalid parameter values (say the valid range)."""

    def describe(self) -> dict[str, Any]:
        return plugin_description("auditor", type(self), recorded_params(self.params))

    def searchable_factors(self, world) -> list[str]:
        """The factors this auditor's subgroups can fix (default: every factor of the world)."""
        return list(world.factors())

    def expresses(self, conditions: Mapping[str, str], world) -> bool:
        """Whether one of this auditor's subgroups can lie inside the slice ``conditions`` (it
        fixes every factor the slice fixes). One that cannot is outside its reach: Table 4 says
        so instead of counting a miss. Default: every factor of the slice is searchable."""
        return set(conditions) <= set(self.searchable_factors(world))

    def minimum_budget(self, world) -> int:
        """The fewest images that give one finding."""
        return 1

    def default_budget(self, world, seed: int = 0) -> int:
        """The budget a suite gets without ``[discover.budget]`` (for its discover seed)."""
        return self.minimum_budget(world)

    def findings_within(self, result: AuditResult, images: int, world,
                        seed: int) -> list[Finding] | None:
        """The findings this auditor would have returned with a budget of ``images`` (None: too
        few for any), for budget curves. By default only at the images it used (a fixed cost);
        an auditor whose evaluations come in a fixed order overrides this, so that one run at
        the largest budget gives the whole curve."""
        return result.findings if images >= result.images_used else None

    @abstractmethod
    def find(self, model: torch.nn.Module, world, budget: int, seed: int) -> list[Finding]:
        """The findings for one model (any order; ``run`` ranks them)."""

    def score_subgroup(self, conditions: dict[str, str], probabilities: np.ndarray,
                       labels: np.ndarray) -> list[Finding]:
        """The findings (every objective) of one subgroup from a model's predictions on its
        images: what ``reevaluate`` computes for another model. An auditor whose findings are
        each one subgroup's implements it and calls it from ``find``; one whose statistic spans
        subgroups (a lift over its class) overrides ``reevaluate`` instead."""
        raise NotImplementedError(f"auditor {self.name} implements neither score_subgroup nor "
                                  "reevaluate: its findings cannot be scored on the references")

    def reevaluate(self, model: torch.nn.Module, world, result: AuditResult) -> list[Finding]:
        """``result``'s findings as ``model`` scores them on the same subgroups and images (the
        references' side of the relative score); not counted against any budget."""
        findings = []
        with self._evaluating(model, budget=None):
            for subgroup in result.subgroups:
                findings += self.score_subgroup(dict(subgroup.conditions),
                                                *self.evaluate_subgroup(model, world,
                                                                        subgroup.conditions,
                                                                        subgroup.n, subgroup.seed))
        return findings

    # ---- shared helpers
    def predict(self, model: torch.nn.Module, images: torch.Tensor | np.ndarray) -> np.ndarray:
        """Softmax probabilities (N, classes) as float64, batched; counted against the budget."""
        if isinstance(images, np.ndarray):  # uint8 (N, H, W, 3)
            images = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255)
        self._used += len(images)
        if self._budget is not None and self._used > self._budget:
            raise RuntimeError(f"auditor {self.name} evaluated {self._used} images, more than its "
                               f"budget of {self._budget}: a bug in its find()")
        return probabilities(model, images)

    def reference_predictions(self, world, subgroup: Subgroup) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each model of ``reference_panel`` on one subgroup's images: (probabilities, labels),
        from its prediction cache or predicted now (not counted against the budget, which is
        the audited model's images)."""
        panel = list(self.reference_panel or ())
        found = [cache.get(subgroup) for _, cache in panel]
        if any(predicted is None for predicted in found):
            pixels, labels = subgroup_images(world, subgroup)  # once for every reference
            for k, (model, cache) in enumerate(panel):
                if found[k] is None:
                    found[k] = (probabilities(model, pixels), labels)
                    cache.put(subgroup, *found[k])
        return found

    def evaluate_subgroup(self, model, world, conditions: Mapping[str, str], n: int,
                          seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities (n, classes), labels (n,)) on n generated images of the subgroup;
        recorded in the result's ``subgroups``."""
        subgroup = Subgroup(dict(conditions), int(n), int(seed))
        self._subgroups.append(subgroup)
        cached = self.prediction_cache.get(subgroup) if self.prediction_cache is not None else None
        if cached is not None:
            return cached
        pixels, labels = subgroup_images(world, subgroup)
        predicted = self.predict(model, pixels), labels
        if self.prediction_cache is not None:
            self.prediction_cache.put(subgroup, *predicted)
        return predicted

    # ---- the run
    def run(self, model: torch.nn.Module, world, budget: int, seed: int) -> AuditResult:
        minimum = self.minimum_budget(world)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < minimum:
            raise BudgetError(f"{self.name}: budget={budget!r} images is smaller than one "
                              f"subgroup; the minimum is {minimum} images")
        self.notes = {}
        with self._evaluating(model, budget):
            findings = self.find(model, world, budget, seed)
            return AuditResult(rank(findings), self._used, dict(self.notes), list(self._subgroups))

    @contextmanager
    def _evaluating(self, model: torch.nn.Module, budget: int | None):
        """Eval mode and no gradients for the span, the image count (and subgroups) from zero,
        the model's mode restored after. ``budget`` None: not counted against one."""
        self._used, self._budget, self._subgroups = 0, budget, []
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            model.train(was_training)


def conditions_key(conditions: Mapping[str, str]) -> str:
    """A subgroup's conditions as text that does not depend on their order."""
    return json.dumps(dict(conditions), sort_keys=True)


def rank(findings: list[Finding]) -> list[Finding]:
    """Per objective (first appearance order), worst first; ties by the conditions' text."""
    order = {objective: k for k, objective in enumerate(dict.fromkeys(f.objective for f in findings))}
    return sorted(findings, key=lambda f: (order[f.objective], -f.statistic,
                                           json.dumps(f.conditions, sort_keys=True)))


def ranked(findings: list[Finding], objective: str) -> list[Finding]:
    """The findings of one objective, in rank order."""
    return [f for f in findings if f.objective == objective]


def median_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for a median: the order statistics x_(k) and x_(n-k+1), with
    k the largest rank whose binomial coverage is still >= ``confidence`` (scipy's binomial)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    k = 0
    for candidate in range(1, n // 2 + 1):  # coverage of [x_(c), x_(n-c+1)] = 1 - 2 P(B <= c-1)
        if 1 - 2 * binom.cdf(candidate - 1, n, 0.5) >= confidence:
            k = candidate
    if k == 0:  # too few values for the confidence: the whole range
        return float(x[0]), float(x[-1])
    return float(x[k - 1]), float(x[n - k])
