"""How much a verdict hangs on one model, and which clean models lie far from the others.

A verdict that flips when one clean model is swapped is a statement about that model, not about the
method. So every verdict (``verdicts.py``: per model, per family, per configuration) is recomputed
with each fitting null left out in turn (the null fit, the power level and the Benjamini-Hochberg
family all move) and, where a configuration has replicates, with each replicate left out (a
family's rate and interval move). A verdict that any of these changes is **fragile**, and
``flipped_by`` names the model that flips it and what the verdict becomes without it.

A clean held-out model far outside the others (``outlying_nulls``) is named with its accuracy, its
robust distance from the others per method and the verdicts leaving it out would flip, so that no
fit depends on it silently.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.detection import ROLE_ANOMALOUS
from counteraudit.evaluate.scoring.null_tests.base import NULL_TESTS
from counteraudit.evaluate.scoring.null_tests.huber import huber_location_scale
from counteraudit.evaluate.scoring.verdicts import (NullPlan, null_abars, family_verdicts,
                                                    model_verdicts)

OUTLYING_DISTANCE = 3.5  # robust SDs of log Abar from the other clean models (Iglewicz & Hoaglin)

VerdictTables = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]  # per model, family, configuration


def _all_verdicts(per_model: pd.DataFrame, plan: NullPlan, *,
                   configurations: Mapping[str, str] | None = None,
                   implants_passed: Mapping[str, bool | None] | None = None,
                   family_order: Sequence[str] | None = None) -> VerdictTables:
    """The per-model, per-family and per-configuration verdicts (``verdicts.py``)."""
    verdicts = model_verdicts(per_model, plan, configurations=configurations,
                              implants_passed=implants_passed)
    return (verdicts, family_verdicts(verdicts, plan, family_order=family_order),
            family_verdicts(verdicts, plan, family_order=family_order, by="configuration"))


def left_out_models(per_model: pd.DataFrame, plan: NullPlan,
                    configurations: Mapping[str, str] | None = None) -> list[str]:
    """The models each verdict is recomputed without: every fitting null (when the test still
    has enough without one) and every anomalous model whose configuration has replicates."""
    nulls = list(plan.fit) if len(plan.fit) - 1 >= NULL_TESTS.get(plan.test).nulls_needed() else []
    configurations = dict(configurations or {})
    anomalous = list(dict.fromkeys(per_model.loc[per_model["role"] == ROLE_ANOMALOUS, "model"]))
    sizes = pd.Series([configurations.get(m, m) for m in anomalous]).value_counts()
    return nulls + [m for m in anomalous if sizes[configurations.get(m, m)] > 1]


def without(per_model: pd.DataFrame, plan: NullPlan, model: str) -> tuple[pd.DataFrame, NullPlan]:
    """The detection table and plan with ``model`` left out (a fitting null leaves the fit)."""
    if model in plan.fit:
        return per_model, dataclasses.replace(plan, fit=tuple(m for m in plan.fit if m != model))
    return per_model[per_model["model"] != model], plan


def with_stability(per_model: pd.DataFrame, plan: NullPlan, *,
                   configurations: Mapping[str, str] | None = None,
                   implants_passed: Mapping[str, bool | None] | None = None,
                   family_order: Sequence[str] | None = None) -> VerdictTables:
    """``_all_verdicts`` with two more columns in each: ``fragile`` (some model left out
    changes the verdict) and ``flipped_by`` ("without <model>: <verdict>; ...", every such
    model)."""
    def tables(table, chosen_plan):
        return _all_verdicts(table, chosen_plan, configurations=configurations,
                              implants_passed=implants_passed, family_order=family_order)
    full = tables(per_model, plan)
    flips: list[list[dict[tuple, str]]] = [[{} for _ in range(len(t))] for t in full]
    keys = (["method", "model"], ["family", "method"], ["family", "configuration", "method"])
    indexes = [{tuple(row): i for i, row in enumerate(t[k].itertuples(index=False, name=None))}
               for t, k in zip(full, keys)]
    for left_out in left_out_models(per_model, plan, configurations):
        for position, table in enumerate(tables(*without(per_model, plan, left_out))):
            base = full[position]
            for row in table[keys[position] + ["verdict"]].itertuples(index=False, name=None):
                at = indexes[position].get(tuple(row[:-1]))
                if at is not None and base["verdict"].iat[at] != row[-1]:
                    flips[position][at][left_out] = row[-1]
    return tuple(t.assign(fragile=[bool(f) for f in flipped],
                          flipped_by=[describe_flips(f) for f in flipped])
                 for t, flipped in zip(full, flips))


def describe_flips(flips: Mapping[str, str]) -> str:
    """"without held-out-07: inconclusive; without ..." ("" for none)."""
    return "; ".join(f"without {name}: {verdict}" for name, verdict in flips.items())


def outlying_nulls(per_model: pd.DataFrame, plan: NullPlan,
                   accuracies: Mapping[str, float] | None = None,
                   families: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every held-out clean model (fitting and checking), its validation accuracy, its robust
    distance from the other held-out models per method (``distance_<method>``: its log Abar
    minus their Huber location, over their Huber scale; Huber's fit so that one far model does
    not hide another), ``outlying_in`` (the methods where that distance exceeds
    ``OUTLYING_DISTANCE``), ``every_method`` and ``moves`` (the family verdicts that leaving it
    out of the fit flips: ``families`` with stability columns). Sorted farthest first."""
    everyone = [*plan.fit, *plan.check]
    methods = list(dict.fromkeys(per_model["method"]))
    accuracies = dict(accuracies or {})
    distances = {}
    for method in methods:
        logs = np.log(null_abars(per_model, method, everyone))
        others = np.stack([np.delete(logs, i) for i in range(len(logs))])
        location, scale = huber_location_scale(others)
        with np.errstate(divide="ignore", invalid="ignore"):
            distances[method] = (logs - location) / scale
    moved = {name: [] for name in everyone}
    if families is not None and "flipped_by" in families:
        for row in families.itertuples(index=False):
            for name in everyone:
                if f"without {name}:" in row.flipped_by:
                    moved[name].append(f"{row.method} on {row.family}")
    rows = []
    for i, name in enumerate(everyone):
        far = [m for m in methods if abs(distances[m][i]) > OUTLYING_DISTANCE]
        rows.append({"model": name, "role": "fitting" if name in plan.fit else "checking",
                     "val_accuracy": accuracies.get(name, np.nan),
                     **{f"distance_{m}": float(distances[m][i]) for m in methods},
                     "outlying_in": ", ".join(far), "every_method": len(far) == len(methods),
                     "moves": "; ".join(moved[name])})
    table = pd.DataFrame(rows)
    farthest = table[[f"distance_{m}" for m in methods]].abs().max(axis=1)
    return table.loc[farthest.sort_values(ascending=False, kind="stable").index].reset_index(drop=True)
