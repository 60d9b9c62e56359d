"""The report's dose-response section (evaluate/report.py): one panel per sweep of a suite's
[[sweeps]], drawn from ``evaluate.dose_response``'s tables.

Each panel: the implant figure against the strength (the model's and the references' mean), every
method's detection margin (dashed: 1, the rule's cut) and, for localizable families, every
method's localization AUROC with its 95% bootstrap band over images (dashed: 0.5, chance); then the
sweep's table and each method's thresholds.
"""
from __future__ import annotations

from html import escape

import numpy as np
import pandas as pd

from counteraudit.evaluate.reporting.svg import Series, line_plot
from counteraudit.evaluate.studies.dose_response import sweep_table, threshold_text

# Sweeps spanning more than this ratio of strengths are drawn on a log axis (nu 0.005 .. 0.3).
LOG_SPAN = 8.0


def sweep_panel(dose: pd.DataFrame, limits: pd.DataFrame, sweep: str, html_table) -> str:
    group = dose[dose["sweep"] == sweep].sort_values("strength", kind="stable")
    first = group.drop_duplicates("strength")
    strengths = first["strength"].to_numpy(float)
    parameter, family = first["parameter"].iloc[0], first["family"].iloc[0]
    log_x = bool(strengths.min() > 0 and strengths.max() / strengths.min() > LOG_SPAN)
    label = f"{family} {parameter}"
    figure = first["implant_figure"].iloc[0] or "implant figure"
    plots = [line_plot([Series("model", strengths, first["implant_value"].to_numpy(float)),
                        Series("references (mean)", strengths,
                               first["implant_reference"].to_numpy(float))],
                       x_label=label, y_label=figure.replace("_", " "),
                       title=f"{sweep}: implant figure", log_x=log_x)]
    methods = list(dict.fromkeys(group["method"]))
    by_method = {m: group[group["method"] == m] for m in methods}
    plots.append(line_plot([Series(m, strengths, by_method[m]["margin"].to_numpy(float))
                            for m in methods],
                           x_label=label, y_label="detection margin", reference=1.0,
                           reference_label="detected above", title=f"{sweep}: detection margin",
                           log_x=log_x))
    if np.isfinite(group["auroc"].to_numpy(float)).any():
        plots.append(line_plot(
            [Series(m, strengths, by_method[m]["auroc"].to_numpy(float),
                               by_method[m]["auroc_low"].to_numpy(float),
                               by_method[m]["auroc_high"].to_numpy(float)) for m in methods],
            x_label=label, y_label="localization AUROC", reference=0.5, reference_label="chance",
            y_range=(0, 1),
            title=f"{sweep}: localization AUROC (95% band)", log_x=log_x))
    own = limits[limits["sweep"] == sweep]
    shown = pd.DataFrame({
        "method": own["method"].to_numpy(),
        "detects from": [threshold_text(v, m) for v, m in
                         zip(own["detection_threshold"], own["detection_monotone"])],
        "localizes from": [threshold_text(v, m) for v, m in
                           zip(own["localization_threshold"], own["localization_monotone"])]})
    return (f'<h3 id="dose-{escape(sweep)}">{escape(sweep)}: {escape(family)}, {escape(parameter)}'
            f' = {escape(", ".join(f"{v:g}" for v in strengths))}</h3>'
            f'<div class="plots">{"".join(plots)}</div>'
            + html_table(sweep_table(dose, sweep), caption=f"{sweep}: margin (* detected) and "
                         "AUROC [95% band]")
            + html_table(shown, caption=f"{sweep}: thresholds (weakest strength detected; "
                         "localized: AUROC band above 0.5)"))


def dose_section(dose: pd.DataFrame, limits: pd.DataFrame, html_table) -> str:
    panels = [sweep_panel(dose, limits, sweep, html_table) for sweep in dict.fromkeys(dose["sweep"])]
    return ('<section id="dose"><h2>Dose-response</h2><p class="note">Each sweep trains one family '
            "at several strengths with one seed and recipe. A method's detection threshold is the "
            "weakest strength whose margin exceeds 1 (above every reference); its localization "
            "threshold the weakest whose AUROC band lies above 0.5. 'none': no strength of the "
            "sweep; 'not monotone': a stronger model is missed again.</p>"
            + "\n".join(panels) + "</section>")
