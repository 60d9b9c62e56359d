"""Budgeted failure search: generation, evaluation and selection over subdomains, with a
surrogate model choosing the next one.

A subdomain is one combination of values of the grid's factors (``factors``; the demo grid is
class x face x size x background, 196 feasible subdomains of 240). The search evaluates 10 random
subdomains, then one at a time the subdomain its selection function chooses
(``evaluate/discovery/selection.py``: random, nwise, genetic, bo -- a Bayesian-ridge surrogate --
and bo_lasso_bootstrap, the seed's Lasso), until the image budget is spent: each
subdomain gets ``images_per_subdomain`` = 50 generated images (the seed's count) and its failure
rate (1 - accuracy), with a 95% Wilson interval (statsmodels). The findings are the evaluated
subdomains, worst first.

A subdomain's images are generated with the fixed seed ``IMAGE_SEED`` whatever the search seed:
a subdomain is evaluated on the same images by every search, so a search on a model equals a
lookup in the model's exhaustive reference (``evaluate/discovery/exhaustive.py``), which evaluates every
subdomain once and compares the selection functions over many search seeds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.discovery.auditors.base import (AUDITORS, Auditor, BudgetError, Finding,
                                                           Subgroup, conditions_key)
from counteraudit.evaluate.discovery.covering_arrays import cached_covering_array
from counteraudit.evaluate.discovery.relative import relative_score
from counteraudit.evaluate.discovery.selection import SELECTIONS, BudgetBelowInitial, Subdomains, search
from counteraudit.train.core.params import at_most
from counteraudit.train.core import size_bounds as bounds

OBJECTIVE = "failure_rate"
IMAGE_SEED = 0
DEMO_FACTORS = ("class", "face", "size", "background")


@dataclass(frozen=True)
class SurrogateSearchParams:
    selection: str = "bo"                 # random, nwise, genetic, bo or bo_lasso_bootstrap
    factors: tuple[str, ...] = DEMO_FACTORS   # the grid; () = all the world's (a huge grid)
    images_per_subdomain: Annotated[int, at_most(bounds.DISCOVERY_IMAGES)] = 50  # the seed's count
    initial: int = 10                     # random subdomains first (the seed's warm start)
    budget_fraction: float = 0.4          # default budget: this share of the subdomains


def wilson_finding(conditions: dict[str, str], failures: int, n: int) -> Finding:
    low, high = proportion_confint(int(failures), int(n), alpha=0.05, method="wilson")
    return Finding(dict(conditions), failures / n, float(low), float(high), int(n), OBJECTIVE)


def misclassified(probabilities: np.ndarray, labels: np.ndarray) -> int:
    return int((probabilities.argmax(1) != labels).sum())


@AUDITORS.register
class SurrogateSearch(Auditor):
    name = "surrogate_search"
    Params = SurrogateSearchParams
    # 2: bo's surrogate is a Bayesian ridge (the seed's Lasso bootstrap: bo_lasso_bootstrap)
    version = 2
    objective = OBJECTIVE
    searches_relative = True  # under a relative score, it steers by it
    adaptive = True  # which subdomains are evaluated depends on the model's failure rates
    statistic_ceiling = 1.0  # a failure rate
    test_params = {"factors": ("class", "face", "size"), "images_per_subdomain": 4, "initial": 3}

    def check(self) -> None:
        p = self.params
        SELECTIONS.get(p.selection)  # an unknown name lists the valid ones
        if p.images_per_subdomain < 1:
            raise ValueError(f"surrogate_search: images_per_subdomain={p.images_per_subdomain} "
                             "must be >= 1 (50 recommended, the seed's count)")
        if p.initial < 1:
            raise ValueError(f"surrogate_search: initial={p.initial} must be >= 1 (10 "
                             "recommended, the seed's)")
        if not 0 < p.budget_fraction <= 1:
            raise ValueError(f"surrogate_search: budget_fraction={p.budget_fraction} must be in "
                             "(0, 1] (0.4 recommended: where the seed's bo had every one of the "
                             "10% worst subdomains)")

    def searchable_factors(self, world) -> list[str]:
        return list(self.grid(world))  # the demo's: class, face, size, background

    def grid(self, world) -> dict[str, list[str]]:
        factors = world.factors()
        names = list(self.params.factors) or list(factors)
        for name in names:
            if name not in factors:
                raise ValueError(f"surrogate_search: unknown factor {name!r}; this world's "
                                 f"factors: {', '.join(factors)}")
        return {name: factors[name] for name in names}

    def subdomains(self, world):
        """The grid's feasible subdomains (built once per world)."""
        memo = getattr(self, "_subdomains", None)
        if memo is None or memo[0] is not world:
            grid = self.grid(world)
            memo = (world, Subdomains(grid, world.feasible,
                                      lambda t, seed: cached_covering_array(world, grid, t, seed)))
            self._subdomains = memo
        return memo[1]

    def minimum_budget(self, world) -> int:
        return self.params.initial * self.params.images_per_subdomain

    def default_budget(self, world, seed: int = 0) -> int:
        count = int(np.ceil(self.params.budget_fraction * len(self.subdomains(world))))
        return max(count, self.params.initial) * self.params.images_per_subdomain

    def failures(self, model, world, conditions: dict[str, str]) -> tuple[int, int]:
        """(misclassified, n) on the subdomain's ``images_per_subdomain`` images."""
        probabilities, labels = self.evaluate_subgroup(model, world, conditions,
                                                       self.params.images_per_subdomain, IMAGE_SEED)
        return misclassified(probabilities, labels), len(labels)

    def score_subgroup(self, conditions, probabilities, labels):
        """The subdomain's failure rate (1 - accuracy) with its Wilson interval."""
        return [wilson_finding(conditions, misclassified(probabilities, labels), len(labels))]

    def find(self, model, world, budget, seed):
        subdomains = self.subdomains(world)
        found: dict[int, Finding] = {}

        def score(position: int) -> float:
            """The subdomain's failure rate, or, with a reference panel, its relative score (what
            the selection function steers by; the findings keep the rate)."""
            conditions = subdomains.rows[position]
            found[position], = self.score_subgroup(conditions, *self.evaluate_subgroup(
                model, world, conditions, self.params.images_per_subdomain, IMAGE_SEED))
            if not self.reference_panel:
                return found[position].statistic
            subgroup = Subgroup(dict(conditions), self.params.images_per_subdomain, IMAGE_SEED)
            rates = [self.score_subgroup(conditions, *predicted)[0].statistic
                     for predicted in self.reference_predictions(world, subgroup)]
            return relative_score(found[position].statistic, rates, self.spread_floor)

        try:
            state = search(subdomains, score, self.params.selection,
                           budget // self.params.images_per_subdomain, seed, self.params.initial)
        except BudgetBelowInitial as error:
            raise BudgetError(f"surrogate_search: {error}; the minimum is "
                              f"{self.minimum_budget(world)} images") from None
        self.notes = {"selection": self.params.selection, "subdomains": len(subdomains),
                      "steered_by": "relative" if self.reference_panel else "failure_rate",
                      "evaluated": [subdomains.rows[p] for p in state.evaluated]}
        return [found[p] for p in state.evaluated]

    def findings_within(self, result, images, world, seed):
        """The findings of the first ``images // images_per_subdomain`` subdomains evaluated: a
        smaller budget would have stopped the same search there."""
        count = images // self.params.images_per_subdomain
        if count < self.params.initial:
            return None
        kept = {conditions_key(c) for c in result.notes["evaluated"][:count]}
        return [f for f in result.findings if conditions_key(f.conditions) in kept]
