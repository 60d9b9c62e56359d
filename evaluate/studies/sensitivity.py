"""The protocol-sensitivity study (evaluate/sensitivity.py runs it): each alternative of each
protocol choice as a derived suite, scored like the suite's own, and its verdicts compared cell by
cell with the suite's own protocol."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from counteraudit.evaluate.scoring.stage import detection_scores, localization_scores
from counteraudit.evaluate.scoring.tables import detection_tables, localization_tables
from counteraudit.evaluate.studies.protocol_choices import PROTOCOL_CHOICES
from counteraudit.explain.settings import method_specs
from counteraudit.explain.stage import explain_suite, explained_images_line
from counteraudit.train.core.stage import RunOptions
from counteraudit.train.core.suite import write_derived_suite

SENSITIVITY = "sensitivity"
CHANGED = "!"  # marks a cell whose verdict differs from the suite's own protocol



@dataclass(frozen=True)
class Variant:
    """One alternative protocol: a choice, its value, and the suite that runs it."""
    choice: str
    value: Any
    suite: Any               # train.suite.Suite, derived from the base suite's file
    methods: list[str]       # the suite's methods whose results this value changes


def plan_variants(suite, methods: list[str], choice_names: list[str] | None,
                  runs_root=None) -> tuple[list[Variant], list[str]]:
    """The alternatives to run (their suite files written), and a line for each choice skipped."""
    names = choice_names or PROTOCOL_CHOICES.names()
    chosen = [PROTOCOL_CHOICES.get(name) for name in names]  # unknown names list the valid ones
    architecture = suite.architecture

    def description(of, method: str) -> dict[str, Any]:
        spec = method_specs(of, [method])[method]
        return spec.build().describe(architecture, spec.batch_size)

    variants, skipped = [], []
    for choice in chosen:
        applicable = choice.applicable(methods, suite)
        if not applicable:
            skipped.append(f"{choice.name}: no method of the suite has the parameter "
                           f"{choice.parameter!r} (methods: {', '.join(methods)})")
            continue
        current = choice.current(suite, methods)
        for value in choice.options:
            if value == current:
                continue
            name = f"{suite.name}-{SENSITIVITY}-{choice.name}-{value}"
            path = suite.root(runs_root) / SENSITIVITY / f"{choice.name}-{value}.toml"
            # the command line's chunking (merged into the suite) holds for its variants too
            variant = write_derived_suite(suite, name, choice.patch(suite, methods, value), path).with_settings(
                explain={"chunk_images": suite.explain.chunk_images})
            changed = [m for m in methods if description(variant, m) != description(suite, m)]
            variants.append(Variant(choice.name, value, variant, changed))
    return variants, skipped


def scored_tables(suite, methods: list[str], distance,
                  options: RunOptions) -> dict[str, pd.DataFrame]:
    """Table 1's per-model rows and Table 2's per-model rows (with the outputs-only comparison)
    of ``methods`` on ``suite``, explaining what is missing first."""
    distance_name = distance.name
    counts = explain_suite(suite, options, methods=method_specs(suite, methods))
    print(f"{counts['computed']} visualization set(s) computed, {counts['stored']} already stored; "
          f"{explained_images_line(counts)}", flush=True)
    detection = detection_tables(suite, detection_scores(suite, distance, methods,
                                                         options.runs_dir, options), distance_name)
    localization = localization_tables(localization_scores(suite, distance, methods,
                                                           options.runs_dir, options), distance_name)
    out = {"detection": detection[f"detection-per-model-{distance_name}"],
           "localization": localization[f"localization-per-model-{distance_name}"]}
    versus = localization.get(f"localization-vs-outputs-per-model-{distance_name}")
    if versus is not None:
        out["localization"] = out["localization"].merge(
            versus[["method", "model", "verdict"]], on=["method", "model"], how="left")
    return out


def compare(base: dict[str, pd.DataFrame], other: dict[str, pd.DataFrame], variant: Variant,
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of ``variant``'s changed methods beside the suite's own, verdict changes marked."""
    keys = ["method", "model"]
    det_cols = ["family", "margin", "detected"]
    base_det = base["detection"][base["detection"]["role"] != "reference"]
    det = other["detection"][other["detection"]["method"].isin(variant.methods)]
    det = det[det["role"] != "reference"][keys + det_cols].merge(
        base_det[keys + det_cols[1:]], on=keys, suffixes=("", "_suite"))
    det["detection_changed"] = det["detected"].astype(bool) != det["detected_suite"].astype(bool)

    loc_cols = ["auroc", "chance_high"] + (["verdict"] if "verdict" in other["localization"] else [])
    loc = other["localization"][other["localization"]["method"].isin(variant.methods)]
    loc = loc[keys + loc_cols].merge(base["localization"][keys + loc_cols], on=keys,
                                     suffixes=("", "_suite"))
    loc["localizes"] = loc["auroc"] > loc["chance_high"]
    loc["localizes_suite"] = loc["auroc_suite"] > loc["chance_high_suite"]
    loc["localization_changed"] = loc["localizes"] != loc["localizes_suite"]
    if "verdict" in loc:
        # outputs-only has no verdict against itself (NaN on both sides): unchanged
        loc["versus_outputs_changed"] = (loc["verdict"].fillna("") != loc["verdict_suite"].fillna(""))
    for frame in (det, loc):
        frame.insert(0, "value", str(variant.value))
        frame.insert(0, "choice", variant.choice)
    return det, loc


def side_by_side(table: pd.DataFrame, value: str, changed: list[str], digits: int = 2) -> pd.DataFrame:
    """One choice's rows as model x method cells "suite -> alternative", "!" on a changed verdict."""
    def cell(row) -> str:
        mark = CHANGED if any(bool(row[c]) for c in changed if c in row) else ""
        return f"{row[value + '_suite']:.{digits}f} -> {row[value]:.{digits}f}{mark}"
    cells = table.assign(cell=table.apply(cell, axis=1))
    wide = cells.pivot_table(index=["choice", "value", "model"], columns="method", values="cell",
                             aggfunc="first", sort=False)
    return wide.reset_index()
