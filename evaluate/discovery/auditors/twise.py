"""PromptAttack (Metzen et al., 2023): t-wise combinatorial search of the factor grid.

The operational design domain is the product of the world's factors. A t-wise covering array
(every combination of t factor values appears in at least one row; t = 2 by default, the paper
used 3) picks the subgroups, built by covertable (pure Python, any strength t, and constraints:
value combinations the world cannot produce, ``World.feasible``, are left out instead of
generated). Each subgroup gets n_s = 16 generated images (the paper's choice, where its ranking
was close to optimal) and two objectives:

- systematic error: the median over the images of 1 - f(y|x) (``systematic_error``);
- systematic misclassification, per target class t: the median of f(y_t|x), for every class t
  other than the subgroup's own (``misclassification:<class>``).

Medians are robust to a few off-distribution samples, as in the paper; their 95% intervals are
distribution-free (order statistics). ``mode = "exhaustive"`` evaluates every subgroup of the grid
(for small grids: ``factors`` picks a subset of the world's factors), the reference a covering
array approximates. With a budget below the whole array, the first budget // n_s rows are
evaluated and the t-tuple coverage reached is recorded.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from counteraudit.evaluate.discovery.auditors.base import (AUDITORS, Auditor, BudgetError, Finding,
                                                           conditions_key, median_interval)
from counteraudit.evaluate.discovery.covering_arrays import cached_covering_array, uncovered

SYSTEMATIC_ERROR = "systematic_error"
MISCLASSIFICATION = "misclassification"
MODES = ("covering", "exhaustive")
EXHAUSTIVE_LIMIT = 4096  # subgroups: beyond this, pick fewer factors


@dataclass(frozen=True)
class TwiseParams:
    t: int = 2                          # strength of the covering array (the paper: 3)
    images_per_subgroup: int = 16       # n_s (the paper's choice)
    mode: str = "covering"              # or "exhaustive": every subgroup of the grid
    factors: tuple[str, ...] = field(default=())  # the grid's factors; () = all the world's


@AUDITORS.register
class Twise(Auditor):
    name = "twise"
    Params = TwiseParams
    objective = SYSTEMATIC_ERROR
    statistic_ceiling = 1.0  # a median of 1 - f(y|x)
    test_params = {"factors": ("class", "face", "size"), "images_per_subgroup": 4}

    def check(self) -> None:
        p = self.params
        if p.mode not in MODES:
            raise ValueError(f"twise: mode={p.mode!r}; valid: {', '.join(MODES)}")
        if p.t < 1:
            raise ValueError(f"twise: t={p.t} must be >= 1 (2 recommended; the paper used 3)")
        if p.images_per_subgroup < 1:
            raise ValueError(f"twise: images_per_subgroup={p.images_per_subgroup} must be >= 1 "
                             "(16 recommended, the paper's n_s)")

    def grid(self, world) -> dict[str, list[str]]:
        factors = world.factors()
        names = list(self.params.factors) or list(factors)
        for name in names:
            if name not in factors:
                raise ValueError(f"twise: unknown factor {name!r}; this world's factors: "
                                 f"{', '.join(factors)}")
        if self.params.t > len(names):
            raise ValueError(f"twise: t={self.params.t} is larger than the number of factors "
                             f"({len(names)}: {', '.join(names)}); use t <= {len(names)}")
        return {name: factors[name] for name in names}

    def subgroups(self, world, seed: int) -> list[dict[str, str]]:
        """The rows to evaluate, in order (cached per world and seed)."""
        memo = getattr(self, "_rows", {})
        key = (id(world), seed)
        if key not in memo:
            grid = self.grid(world)
            if self.params.mode == "exhaustive":
                size = int(np.prod([len(v) for v in grid.values()]))
                if size > EXHAUSTIVE_LIMIT:
                    raise ValueError(f"twise: the exhaustive grid of {', '.join(grid)} has {size} "
                                     f"subgroups (limit {EXHAUSTIVE_LIMIT}); name fewer factors "
                                     "(factors = [...]) or use mode = \"covering\"")
                rows = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
                rows = [row for row in rows if world.feasible(row)]
            else:
                rows = cached_covering_array(world, grid, self.params.t, seed)
            memo[key] = rows
            self._rows = memo
        return memo[key]

    def minimum_budget(self, world) -> int:
        if self.params.mode == "exhaustive":
            return self.params.images_per_subgroup * len(self.subgroups(world, 0))
        return self.params.images_per_subgroup

    def default_budget(self, world, seed: int = 0) -> int:
        """Every row of the covering array (its size depends on the seed, covertable's salt)."""
        return self.params.images_per_subgroup * len(self.subgroups(world, seed))

    def find(self, model, world, budget, seed):
        n_s = self.params.images_per_subgroup
        rows = self.subgroups(world, seed)
        if self.params.mode == "exhaustive" and budget < n_s * len(rows):
            raise BudgetError(f"twise: exhaustive mode evaluates all {len(rows)} subgroups; the "
                              f"minimum budget is {n_s * len(rows)} images, got {budget}")
        evaluated = rows[:budget // n_s]
        classes = list(world.class_names)
        findings = []
        for row in evaluated:
            probabilities, labels = self.evaluate_subgroup(model, world, row, n_s, seed)
            error = 1 - probabilities[np.arange(len(labels)), labels]
            findings.append(Finding(row, float(np.median(error)), *median_interval(error),
                                    len(labels), SYSTEMATIC_ERROR))
            for target, name in enumerate(classes):
                if np.all(labels == target):
                    continue  # the subgroup's own class: that is the other objective
                scores = probabilities[:, target]
                findings.append(Finding(row, float(np.median(scores)), *median_interval(scores),
                                        len(labels), f"{MISCLASSIFICATION}:{name}"))
        grid = self.grid(world)
        self.notes = {"subgroups": len(rows), "evaluated": len(evaluated), "t": self.params.t,
                      "mode": self.params.mode}
        if len(evaluated) < len(rows) and self.params.mode == "covering":
            total = len(uncovered([], grid, self.params.t, world.feasible))
            self.notes["t_tuples_uncovered"] = len(uncovered(evaluated, grid, self.params.t,
                                                             world.feasible))
            self.notes["t_tuples_feasible"] = total
        return findings

    def findings_within(self, result, images, world, seed):
        """The findings of the first ``images // n_s`` rows: a smaller budget evaluates a prefix
        of the same rows (covering mode)."""
        if self.params.mode == "exhaustive":
            return super().findings_within(result, images, world, seed)
        count = images // self.params.images_per_subgroup
        if count < 1:
            return None
        kept = {conditions_key(row) for row in self.subgroups(world, seed)[:count]}
        return [f for f in result.findings if conditions_key(f.conditions) in kept]
