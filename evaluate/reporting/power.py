"""The power tables evaluate/reference_count.py prints (and the report shows): detection and
localization against n, m and p, and what each method needs to see each defect."""
from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd

from counteraudit.anomalies.image_sets import localizable, set_sizes
from counteraudit.evaluate.reporting.svg import Series, line_plot
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.evaluate.scoring.stage import detection_scores, localization_scores
from counteraudit.evaluate.studies.power import (detection_by_image_count, image_sizes,
                                                 localization_by_image_count, needed_text,
                                                 smallest_sufficient)
from counteraudit.train.core.artifacts import inside_runs


@dataclass(frozen=True)
class PowerSettings:
    """How the power tables are measured: ``subsets`` random subsets per size, a size suffices
    when a method detects (localizes at AUROC >= ``auroc_target``) in ``level`` of them."""
    subsets: int = 200
    level: float = 0.8
    auroc_target: float = 0.8


def power_tables(suite, methods: list[str], distance, settings: PowerSettings,
                 runs_root=None, *, detection_by_n: pd.DataFrame | None,
                 localization_by_n: pd.DataFrame | None,
                 rng: np.random.Generator) -> dict[str, pd.DataFrame]:
    """Detection against m and localization against p from the stored score tables (scored when
    missing), beside the n tables given, and ``needs``: per (method, model) the smallest n, m, p."""
    references = [s.name for s in suite.references]
    anomalous = [s.name for s in suite.anomalies]
    # one grid of sizes for every method and model, from the suite's own m and p
    m_sizes, p_sizes = (image_sizes(count) for count in set_sizes(suite))
    scores = detection_scores(suite, distance, methods, runs_root)
    by_m = []
    for method in methods:
        own = scores[scores["method"] == method]
        sizes = [m for m in m_sizes if m <= own["image"].nunique()]
        by_m.append(detection_by_image_count(own, references, anomalous, sizes, settings.subsets, rng)
                    .assign(method=method))
    by_m = pd.concat(by_m, ignore_index=True)
    by_p = None
    if localizable(suite):
        frame = localization_scores(suite, distance, methods, runs_root)
        frame = (frame.groupby(["method", "model", "image", "abnormal"], sort=False)["score"]
                 .mean().reset_index())
        frame = frame[np.isfinite(frame["score"].to_numpy(float))]
        rows = []
        for (method, model), group in frame.groupby(["method", "model"], sort=False):
            is_abnormal = group["abnormal"].astype(bool).to_numpy()
            values = group["score"].to_numpy(float)
            sizes = [p for p in p_sizes if p <= is_abnormal.sum()]  # flagged images are gone
            rows.append(localization_by_image_count(values[is_abnormal], values[~is_abnormal],
                                                    sizes, settings.subsets, rng, settings.auroc_target)
                        .assign(method=method, model=model))
        by_p = pd.concat(rows, ignore_index=True)
    needs = needs_table(detection_by_n, by_m, localization_by_n, by_p, settings.level)
    tables = {"detection-by-m": by_m, "needs": needs}
    if detection_by_n is not None:
        tables["detection-by-n"] = detection_by_n
    if localization_by_n is not None:
        tables["localization-by-n-power"] = localization_by_n
    if by_p is not None:
        tables["localization-by-p"] = by_p
    return tables


def _needed(frame: pd.DataFrame | None, size: str, value: str, level: float) -> dict:
    """(method, model) -> the smallest sufficient size, as text ("> N" when the largest falls short)."""
    if frame is None or not len(frame):
        return {}
    out = {}
    for (method, model), group in frame.groupby(["method", "model"], sort=False):
        sizes = group[size].to_numpy(int)
        out[(method, model)] = needed_text(smallest_sufficient(sizes, group[value].to_numpy(float),
                                                               level), int(sizes.max()))
    return out


def needs_table(detection_by_n, detection_by_m, localization_by_n, localization_by_p,
                level: float) -> pd.DataFrame:
    """Per (method, model): the smallest n and m at which the method detects the model in at
    least ``level`` of the random subsets, and the smallest n and p at which it reaches the AUROC
    target as often ("-": not measured, e.g. a model that is not localizable)."""
    columns = {"detect: n": _needed(detection_by_n, "n", "fraction_detected", level),
               "detect: m": _needed(detection_by_m, "m", "fraction_detected", level),
               "localize: n": _needed(localization_by_n, "n", "fraction_reaching", level),
               "localize: p": _needed(localization_by_p, "p", "fraction_reaching", level)}
    keys = list(dict.fromkeys(k for c in columns.values() for k in c))
    return pd.DataFrame([{"method": method, "model": model,
                          **{name: cells.get((method, model), "-") for name, cells in columns.items()}}
                         for method, model in keys])


def wide(frame: pd.DataFrame, size: str, value: str) -> pd.DataFrame:
    """Rows (model, method), one column per size: the value (a share of subsets)."""
    table = frame.pivot_table(index=["model", "method"], columns=size, values=value, sort=False)
    table.columns = [f"{size}={c}" for c in table.columns]
    return table.reset_index()


def print_power(tables: dict[str, pd.DataFrame], suite, settings: PowerSettings) -> None:
    share = f"share of {settings.subsets} random subsets"
    if "detection-by-n" in tables:
        print(f"\nDetection with n of the {len(suite.references)} references ({share} in which the "
              "model's Abar exceeds all n references', scored leave-one-out among them)\n")
        print(to_markdown(wide(tables["detection-by-n"], "n", "fraction_detected"),
                          float_format="{:.2f}"))
    print(f"\nDetection with m of the detection images ({share} of m images)\n")
    print(to_markdown(wide(tables["detection-by-m"], "m", "fraction_detected"), float_format="{:.2f}"))
    if "localization-by-n-power" in tables:
        print(f"\nLocalization with n references: {share} reaching AUROC >= {settings.auroc_target}\n")
        print(to_markdown(wide(tables["localization-by-n-power"], "n", "fraction_reaching"),
                          float_format="{:.2f}"))
    if "localization-by-p" in tables:
        print(f"\nLocalization with p abnormal and p normal images: {share} reaching AUROC >= "
              f"{settings.auroc_target}\n")
        print(to_markdown(wide(tables["localization-by-p"], "p", "fraction_reaching"),
                          float_format="{:.2f}"))
    print(f"\nHow many references and images does a method need to see this defect? The smallest n "
          f"(references), m (detection images) and p (abnormal images) at which it detects the "
          f"model, or localizes it at AUROC >= {settings.auroc_target}, in >= {settings.level:.0%} of the "
          f"random subsets of that size and of every larger size measured (tables above); "
          f"'> N': not even with all N the suite has\n")
    print(to_markdown(tables["needs"]))


def power_section(tables_dir, distance_name: str, html_table, command: str) -> str:
    """The report's power section from the power-* tables evaluate/reference_count.py wrote, or
    a line saying how to make them (``command``: the command line that does, for this suite)."""
    def read(name):
        path = inside_runs(Path(tables_dir) / f"power-{name}-{distance_name}.csv", reading=True)
        return pd.read_csv(path, keep_default_na=False, na_values=[""]) if path.is_file() else None
    needs = read("needs")
    if needs is None:
        return ('<section id="power"><h2>Power</h2><p class="note">No power tables for this suite '
                f"yet: <code>{escape(command)}</code> adds how many references and images each "
                "method needs to see each defect.</p></section>")
    plots = []
    for name, size, value, what in [("detection-by-n", "n", "fraction_detected", "detected"),
                                    ("detection-by-m", "m", "fraction_detected", "detected"),
                                    ("localization-by-n-power", "n", "fraction_reaching",
                                     "AUROC reached"),
                                    ("localization-by-p", "p", "fraction_reaching", "AUROC reached")]:
        frame = read(name)
        if frame is None:
            continue
        for model, group in frame.groupby("model", sort=False):
            sizes = sorted(group[size].unique())
            series = [Series(method, sizes,
                             rows.set_index(size)[value].reindex(sizes).to_numpy(float))
                      for method, rows in group.groupby("method", sort=False)]
            plots.append(line_plot(series, x_label=size, y_label=f"share {what}",
                                   y_range=(0, 1), title=f"{model}: {what} against {size}",
                                   width=380, height=200))
    return ('<section id="power"><h2>Power</h2><p class="note">How many references (n), detection '
            "images (m) and abnormal images (p) a method needs: the smallest size at which it "
            "detects the model (localizes it at the AUROC target) in at least the chosen share of "
            "random subsets of that size and of every larger one; '&gt; N': not even with all N. "
            f"From <code>{escape(command)}</code>.</p>"
            + html_table(needs, caption="What each method needs to see each defect")
            + f'<details><summary>{len(plots)} curves: share of subsets against n, m, p</summary>'
            f'<div class="plots">{"".join(plots)}</div></details></section>')
