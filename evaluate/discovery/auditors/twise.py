"""PromptAttack (Metzen et al., 2023): t-wise combinatorial search of the factor grid.

The operational design domain is the product of the world's factors. A t-wise covering array
(every combination of t factor values appears in at least one row) picks the subgroups, built by
covertable (pure Python, any strength t, and constraints: value combinations the world cannot
produce, ``World.feasible``, are left out instead of generated). Two designs, by name:

- ``design = "promptattack"`` (default; the paper's): the source class is fixed and the covering
  array spans the OTHER factors, one array per class (the paper prompts one source class, e.g.
  minivan, over viewpoint x size x colour x weather x background with n_C = 3), t = 3 by default.
  Rows are evaluated round-robin across classes (row k of every class before row k + 1), so a
  budget below the whole design still covers every class evenly; the notes record, per class,
  the share of its t-tuples the evaluated rows hold.
- ``design = "joint"``: the class is one factor of a single array over everything (the project's
  earlier design; ``t = 2`` gives its results).

Each subgroup gets n_s = 16 generated images (the paper's choice, where its ranking was close to
optimal) and two objectives:

- systematic error: the median over the images of 1 - f(y|x) (``systematic_error``);
- systematic misclassification, per target class t: the median of f(y_t|x), for every class t
  other than the subgroup's own (``misclassification:<class>``).

Medians are robust to a few off-distribution samples, as in the paper; their 95% intervals are
distribution-free (order statistics). ``mode = "exhaustive"`` evaluates every subgroup of the grid
(for small grids: ``factors`` picks a subset of the world's factors), the reference a covering
array approximates. With a budget below the whole design, the first budget // n_s rows are
evaluated (a prefix: ``findings_within``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np

from counteraudit.evaluate.discovery.auditors.base import (AUDITORS, Auditor, BudgetError, Finding,
                                                           conditions_key, median_interval)
from counteraudit.evaluate.discovery.covering_arrays import (cached_covering_array,
                                                             cached_feasible_tuples, uncovered)
from counteraudit.train.core.params import at_most
from counteraudit.train.core import size_bounds as bounds

SYSTEMATIC_ERROR = "systematic_error"
MISCLASSIFICATION = "misclassification"
MODES = ("covering", "exhaustive")
DESIGNS = ("promptattack", "joint")
CLASS_FACTOR = "class"
EXHAUSTIVE_LIMIT = 4096  # subgroups: beyond this, pick fewer factors


@dataclass(frozen=True)
class TwiseParams:
    design: str = "promptattack"        # or "joint": the class as one factor of one array
    t: int = 3                          # strength of the covering array (the paper's n_C = 3)
    images_per_subgroup: Annotated[int, at_most(bounds.DISCOVERY_IMAGES)] = 16  # n_s (the paper's choice)
    mode: str = "covering"              # or "exhaustive": every subgroup of the grid
    factors: tuple[str, ...] = field(default=())  # the grid's factors; () = all the world's


def round_robin(per_class: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Row k of every class (in class order) before row k + 1 of any: every prefix is as even
    across classes as it can be."""
    rows = []
    for k in range(max((len(r) for r in per_class), default=0)):
        rows += [r[k] for r in per_class if k < len(r)]
    return rows


def t_tuples(rows: list[dict[str, str]], names: list[str], t: int) -> set[tuple]:
    """The distinct t-tuples of values (over ``names``) that the rows hold."""
    return {(combo, tuple(row[n] for n in combo)) for row in rows
            for combo in itertools.combinations(names, t)}


@AUDITORS.register
class Twise(Auditor):
    name = "twise"
    version = 2  # 2: the promptattack design (per class, t = 3) is the default; score_subgroup
    Params = TwiseParams
    objective = SYSTEMATIC_ERROR
    statistic_ceiling = 1.0  # a median of 1 - f(y|x)
    adaptive = False  # the same rows and images for every model
    test_params = {"factors": ("class", "face", "size", "clutter"), "images_per_subgroup": 2,
                   "t": 2}

    def check(self) -> None:
        p = self.params
        if p.design not in DESIGNS:
            raise ValueError(f"twise: design={p.design!r}; valid: {', '.join(DESIGNS)}")
        if p.mode not in MODES:
            raise ValueError(f"twise: mode={p.mode!r}; valid: {', '.join(MODES)}")
        if p.t < 1:
            raise ValueError(f"twise: t={p.t} must be >= 1 (the paper used 3)")
        if p.images_per_subgroup < 1:
            raise ValueError(f"twise: images_per_subgroup={p.images_per_subgroup} must be >= 1 "
                             "(16 recommended, the paper's n_s)")

    @property
    def per_class(self) -> bool:
        """Whether the class is fixed per array (the promptattack design, covering mode)."""
        return self.params.design == "promptattack" and self.params.mode == "covering"

    def searchable_factors(self, world) -> list[str]:
        return list(self.grid(world))

    def grid(self, world) -> dict[str, list[str]]:
        factors = world.factors()
        names = list(self.params.factors) or list(factors)
        for name in names:
            if name not in factors:
                raise ValueError(f"twise: unknown factor {name!r}; this world's factors: "
                                 f"{', '.join(factors)}")
        if self.per_class:
            if CLASS_FACTOR not in names:
                raise ValueError(f"twise: design=\"promptattack\" fixes the class in every row; "
                                 f"add {CLASS_FACTOR!r} to factors (or use design = \"joint\")")
            others = [n for n in names if n != CLASS_FACTOR]
            if self.params.t > len(others):
                raise ValueError(f"twise: t={self.params.t} is larger than the number of factors "
                                 f"besides the class ({len(others)}: {', '.join(others)}); use "
                                 f"t <= {len(others)} or name more factors")
        elif self.params.mode == "covering" and self.params.t > len(names):
            raise ValueError(f"twise: t={self.params.t} is larger than the number of factors "
                             f"({len(names)}: {', '.join(names)}); use t <= {len(names)}")
        return {name: factors[name] for name in names}

    def class_arrays(self, world, seed: int,
                     limit: int | None = None) -> dict[str, list[dict[str, str]]]:
        """Per class, its covering array over the other factors (the class fixed in the grid, so
        the world's constraints that involve the class hold), or its first ``limit`` rows;
        cached per world and seed."""
        grid = self.grid(world)
        others = {n: v for n, v in grid.items() if n != CLASS_FACTOR}
        return {c: cached_covering_array(world, {CLASS_FACTOR: [c], **others}, self.params.t, seed,
                                         limit)
                for c in grid[CLASS_FACTOR]}

    def class_prefix(self, world, seed: int, count: int) -> list[dict[str, str]]:
        """The first ``count`` rows of the promptattack design, building only as many rows of
        each class's array as they need (the long tail of a t = 3 array under constraints
        takes minutes to build and a budget rarely reaches it)."""
        classes = len(self.grid(world)[CLASS_FACTOR])
        limit = -(-count // classes)
        while True:
            arrays = list(self.class_arrays(world, seed, limit).values())
            rows = round_robin(arrays)
            if len(rows) >= count or all(len(a) < limit for a in arrays):
                return rows[:count]
            limit *= 2  # some classes' arrays ended early: the others give more rows

    def subgroups(self, world, seed: int, count: int | None = None) -> list[dict[str, str]]:
        """The first ``count`` rows to evaluate, in order (all: None; cached per world and
        seed)."""
        if self.per_class and count is not None:
            return self.class_prefix(world, seed, count)
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
            elif self.per_class:
                rows = round_robin(list(self.class_arrays(world, seed).values()))
            else:
                rows = cached_covering_array(world, grid, self.params.t, seed)
            memo[key] = rows
            self._rows = memo
        return memo[key][:count]

    def minimum_budget(self, world) -> int:
        if self.params.mode == "exhaustive":
            return self.params.images_per_subgroup * len(self.subgroups(world, 0))
        if self.per_class:  # one row of every class
            return self.params.images_per_subgroup * len(self.grid(world)[CLASS_FACTOR])
        return self.params.images_per_subgroup

    def default_budget(self, world, seed: int = 0) -> int:
        """Every row of the design (its size depends on the seed, covertable's salt). Builds the
        whole design: for promptattack's t = 3 on the synthetic world, minutes per class once
        (cached); a suite sets ``[discover.budget] twise`` to evaluate a prefix instead."""
        return self.params.images_per_subgroup * len(self.subgroups(world, seed))

    def score_subgroup(self, conditions, probabilities, labels):
        """Systematic error (median of 1 - f(y|x)) and, per class other than the subgroup's
        own, systematic misclassification (median of f(y_t|x))."""
        labels = np.asarray(labels)
        error = 1 - probabilities[np.arange(len(labels)), labels]
        findings = [Finding(dict(conditions), float(np.median(error)), *median_interval(error),
                            len(labels), SYSTEMATIC_ERROR)]
        for target, name in enumerate(self.class_names):
            if np.all(labels == target):
                continue  # the subgroup's own class: that is the other objective
            scores = probabilities[:, target]
            findings.append(Finding(dict(conditions), float(np.median(scores)),
                                    *median_interval(scores), len(labels),
                                    f"{MISCLASSIFICATION}:{name}"))
        return findings

    def reevaluate(self, model, world, result):
        # score_subgroup names the misclassification objectives by the world's classes
        self.class_names = list(world.class_names)
        return super().reevaluate(model, world, result)

    def find(self, model, world, budget, seed):
        n_s = self.params.images_per_subgroup
        if self.per_class:  # the whole design is not built: only the rows the budget reaches
            rows = evaluated = self.subgroups(world, seed, budget // n_s)
        else:
            rows = self.subgroups(world, seed)
            evaluated = rows[:budget // n_s]
        if self.params.mode == "exhaustive" and budget < n_s * len(rows):
            raise BudgetError(f"twise: exhaustive mode evaluates all {len(rows)} subgroups; the "
                              f"minimum budget is {n_s * len(rows)} images, got {budget}")
        self.class_names = list(world.class_names)
        findings = []
        for row in evaluated:
            findings += self.score_subgroup(row, *self.evaluate_subgroup(model, world, row, n_s,
                                                                         seed))
        self.notes = {"evaluated": len(evaluated), "t": self.params.t, "mode": self.params.mode,
                      "design": self.params.design}
        if not self.per_class:
            self.notes["subgroups"] = len(rows)
        if self.per_class:
            self.notes["t_tuple_coverage"] = self.class_coverage(world, seed, evaluated)
        elif len(evaluated) < len(rows) and self.params.mode == "covering":
            grid = self.grid(world)
            total = len(uncovered([], grid, self.params.t, world.feasible))
            self.notes["t_tuples_uncovered"] = len(uncovered(evaluated, grid, self.params.t,
                                                             world.feasible))
            self.notes["t_tuples_feasible"] = total
        return findings

    def class_coverage(self, world, seed: int, evaluated) -> dict[str, float]:
        """Per class, the share of the feasible t-tuples of the other factors (those the world
        can produce with the class; counted once per world and cached) that the evaluated rows
        hold; a row the world can produce holds only feasible ones."""
        grid = self.grid(world)
        others = {n: v for n, v in grid.items() if n != CLASS_FACTOR}
        coverage = {}
        for c in grid[CLASS_FACTOR]:
            reached = [r for r in evaluated if r[CLASS_FACTOR] == c]
            feasible = cached_feasible_tuples(world, others, self.params.t, {CLASS_FACTOR: c})
            coverage[c] = round(len(t_tuples(reached, list(others), self.params.t)) / feasible, 6)
        return coverage

    def findings_within(self, result, images, world, seed):
        """The findings of the first ``images // n_s`` rows: a smaller budget evaluates a prefix
        of the same rows (covering mode)."""
        if self.params.mode == "exhaustive":
            return super().findings_within(result, images, world, seed)
        count = images // self.params.images_per_subgroup
        if count < 1 or images < self.minimum_budget(world):  # a run would refuse the budget
            return None
        kept = {conditions_key(row) for row in self.subgroups(world, seed, count)}
        return [f for f in result.findings if conditions_key(f.conditions) in kept]
