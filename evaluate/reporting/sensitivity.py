"""The report's section on protocol sensitivity (tables written by evaluate/sensitivity.py)."""
from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Callable

import pandas as pd

from counteraudit.evaluate.scoring.stage import TABLES
from counteraudit.evaluate.studies.sensitivity import CHANGED, side_by_side
from counteraudit.train.core.artifacts import inside_runs

SECTION_ID = "sensitivity"
TITLE = "Sensitivity to protocol choices"


def stored_sensitivity(suite, distance_name: str, runs_root=None) -> dict[str, pd.DataFrame] | None:
    """The sensitivity tables evaluate/sensitivity.py saved for this suite and distance, or None."""
    folder = Path(suite.root(runs_root)) / TABLES
    paths = {kind: folder / f"sensitivity-{kind}-{distance_name}.csv"
             for kind in ("detection", "localization")}
    if not all(path.is_file() for path in paths.values()):
        return None
    return {kind: pd.read_csv(inside_runs(path, reading=True), keep_default_na=False, na_values=[""])
            for kind, path in paths.items()}


def sensitivity_section(tables: dict[str, pd.DataFrame] | None, html_table: Callable,
                        command: str) -> str:
    """The section, or a line saying how to make it (``command``: the command line that does)."""
    if tables is None:
        return (f'<section id="{SECTION_ID}"><h2>{TITLE}</h2><p class="note">Not run for this '
                f"suite: <code>{escape(command)}</code> explains and scores it again under each "
                "protocol choice (renderer, IG baseline, gradient space, Caricature noise, "
                "explained class) and adds this section.</p></section>")
    detection, localization = tables["detection"], tables["localization"]
    anomalous = detection[detection["family"] != "reference"]
    flips = {"detection": int(anomalous["detection_changed"].sum()),
             "localization": int(localization["localization_changed"].sum())}
    if "versus_outputs_changed" in localization:
        flips["against outputs-only"] = int(localization["versus_outputs_changed"].sum())
    summary = ", ".join(f"{count} {what}" for what, count in flips.items())
    parts = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>',
             '<p class="note">The suite explained and scored again with one protocol choice '
             "changed at a time (everything else shared through the store). Each cell reads "
             f"<i>the suite's protocol -&gt; the alternative</i>; <b>{escape(CHANGED)}</b> marks a "
             "changed verdict: detection (Table 1's rule), localization (AUROC above the chance "
             "band of label permutations), or adds / same / less against the outputs-only "
             f"control. Verdicts changed: {escape(summary)}.</p>"]
    for choice, rows in anomalous.groupby("choice", sort=False):
        parts.append(html_table(side_by_side(rows, "margin", ["detection_changed"]),
                                caption=f"{choice}: Table 1 margins (Abar / max reference Abar)"))
    for choice, rows in localization.groupby("choice", sort=False):
        parts.append(html_table(
            side_by_side(rows, "auroc", ["localization_changed", "versus_outputs_changed"]),
            caption=f"{choice}: Table 2 AUROCs"))
    parts.append("</section>")
    return "\n".join(parts)
