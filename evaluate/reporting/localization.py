"""The report's localization sections: Table 2 and its per-model table, the paper's Figures 2-4
(normal and abnormal inputs explained by a reference and by the model), and the ROC curves."""
from __future__ import annotations

from html import escape

import numpy as np
import pandas as pd
from sklearn.metrics import roc_curve

from counteraudit.anomalies.image_sets import abnormal_set_name, normal_set_name
from counteraudit.evaluate.reporting.html import (auroc_class, call_class, fmt, html_table, legend,
                                                  versus_class)
from counteraudit.evaluate.reporting.summary import LOCALIZED_AUROC
from counteraudit.evaluate.reporting.svg import ANOMALOUS_COLOR, MISSED_COLOR, StripRow, roc_plot, strip_plot
from counteraudit.evaluate.scoring.model_blind import LOCALIZATION_CONSEQUENCE, blind_methods
from counteraudit.evaluate.scoring.localization import LOCALIZATION_CALLS, localization_call, table2_bands
from counteraudit.evaluate.scoring.tables import (chance_band_note, localization_power_note,
                                                  zoo_summary_caption)


def localization_section(report) -> str:
    if not report.localizable:
        return ""
    summary, per_model = report.table("localization"), report.table("localization-per-model")
    per_layer = report.table("localization-per-layer")
    detail = pd.DataFrame({
        "method": per_model["method"], "model": per_model["model"], "AUROC": per_model["auroc"],
        "reading": [localization_call(a, low, high) or "n/a" for a, low, high in zip(
            per_model["auroc"], per_model["chance_low"], per_model["chance_high"])],
        "95% CI": [f"[{fmt(a)}, {fmt(b)}]" for a, b in zip(per_model["ci_low"], per_model["ci_high"])],
        "chance band": [f"[{fmt(a)}, {fmt(b)}]" for a, b in zip(per_model["chance_low"], per_model["chance_high"])],
        "p": per_model["p_value"], "n abnormal": per_model["n_abnormal"], "n normal": per_model["n_normal"],
        "n flagged": per_model["n_flagged"], "flag": per_model["flag"]})
    parts = ['<section id="localization"><h2>Localization (Table 2)</h2>',
             html_table(summary, float_format="{:.2f}",
                        cell_class_at=auroc_class(LOCALIZED_AUROC, table2_bands(per_model, per_layer)),
                        class_columns=[c for c in summary.columns if c != "method"],
                        caption=f"Table 2: AUROC of the anomaly score, abnormal vs normal inputs "
                                f"({report.distance_name}); each cell read against its own "
                                "model's chance band (the per-model table below)"),
             legend("v-localized", "v-above-chance", "v-within-chance", "v-below-chance"),
             *(f'<p class="note">{escape(line)}.</p>' for line in blind_methods(
                 report.optional_table("localization-model-blind"),
                 LOCALIZATION_CONSEQUENCE).values()),
             f'<p class="note">{escape(chance_band_note(per_model))} '
             "CI: seeded bootstrap, abnormal and normal images resampled "
             f"separately. {escape(localization_power_note(report.suite) or '')}</p>",
             html_table(detail, cell_class=lambda value: call_class(
                 value if value in LOCALIZATION_CALLS else None), class_columns=["reading"],
                        caption=f"Per-model localization ({report.distance_name}); reading: the "
                                "AUROC against this model's own chance band")]
    replicated = report.optional_table("localization-replicates")
    if replicated is not None:
        parts.insert(2, html_table(replicated, float_format="{:.2f}", caption=(
            f"Table 2 over replicates: each configuration's mean AUROC over its seeds, 95% "
            f"interval resampling models, then each drawn model's images, and the band that mean "
            f"falls in by chance (chance_low, chance_high: each model's labels permuted; above "
            f"it, localized beyond chance) ({report.distance_name})")))
    versus = report.optional_table("localization-vs-outputs")
    if versus is not None:
        parts.append(html_table(versus, cell_class=versus_class, caption=(
            f"Against the outputs-only control: AUROC(method) - AUROC(outputs_only) on the "
            f"same images, paired bootstrap 95% interval; adds = the explanation localizes "
            f"better than the model's outputs alone, same = no better, less = worse "
            f"({report.distance_name})")))
    summary = report.optional_table("zoo-summary")
    if summary is not None:
        parts.append(html_table(summary, float_format="{:.2f}",
                                caption=zoo_summary_caption(
                                    report.suite, report.optional_table("detection-families"),
                                    report.distance_name)))
    if not per_layer.empty:
        parts.append("<details><summary>Per-layer localization table</summary>"
                     + html_table(per_layer, caption=f"Localization per layer ({report.distance_name})")
                     + "</details>")
    return "\n".join(parts) + "</section>"


def localization_examples(report) -> str:
    if not report.localizable:
        return ""
    reference = report.references[0]
    parts = ['<section id="localization-examples"><h2>Localization examples</h2>',
             f'<p class="note">As in the paper\'s Figures 2-4: for each localizable model, its first '
             f"{report.examples} normal and first {report.examples} abnormal input(s) (the same for every "
             f"method), explained by reference {escape(reference)} and by the anomalous model, with the "
             "model's anomaly score A on each. Localization works when A is higher on the abnormal "
             "inputs.</p>"]
    for spec in report.localizable:
        normal, abnormal = report.example_positions(spec)
        normal_set, abnormal_set = normal_set_name(report.suite, spec), abnormal_set_name(spec)
        columns = [(normal_set, p, False) for p in normal] + [(abnormal_set, p, True) for p in abnormal]
        head = "".join(f'<th colspan="2">{report.input_figure(s, p, "abnormal input" if a else "normal input")}</th>'
                       for s, p, a in columns)
        rows = []
        for method in report.localized_methods:
            layer = report.shown_layer(method)
            cells = []
            for set_name, position, is_abnormal in columns:
                score = report.image_scores(report.localization, method, layer, spec.name,
                                          abnormal=is_abnormal).get(position)
                kind = "abnormal" if is_abnormal else "normal"
                cells.append("<td>" + report.figure(
                    report.visualization(method, reference, set_name, position),
                    f"{method} {reference} {set_name} image {position}", escape(reference)) + "</td>")
                cells.append("<td>" + report.figure(
                    report.visualization(method, spec.name, set_name, position),
                    f"{method} {spec.name} {set_name} image {position}",
                    f"<b>{escape(spec.name)}</b><br>A = {fmt(score)} ({kind})") + "</td>")
            label = escape(method) + (f"<br><small>layer {escape(layer)}</small>" if layer else "")
            rows.append(f"<tr><th>{label}</th>{''.join(cells)}</tr>")
        parts.append(f"<h3>{escape(spec.name)} ({escape(spec.family)})</h3>"
                     f'<div class="table-wrap"><table class="examples"><thead><tr><th>method</th>{head}'
                     f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
    return "\n".join(parts) + "</section>"


def roc_section(report) -> str:
    if not report.localizable:
        return ""
    per_model = report.table("localization-per-model")
    # the per-image overall score, as localization_table ranks it (layers averaged)
    overall = (report.localization.groupby(["method", "model", "image", "abnormal"], sort=False)
               .agg(score=("score", "mean")).reset_index())
    parts = ['<section id="roc"><h2>ROC curves</h2>',
             '<p class="note">Per localizable model and method: the per-image anomaly scores of its normal '
             "(blue) and abnormal (red) inputs, and the ROC curve of abnormal vs normal (sklearn's "
             "roc_curve; layered methods: the score averaged over layers). The dashed diagonal is "
             "chance.</p>"]
    for spec in report.localizable:
        plots = []
        for method in report.localized_methods:
            rows = overall[(overall["model"] == spec.name) & (overall["method"] == method)]
            rows = rows[np.isfinite(rows["score"].to_numpy(dtype=float))]
            is_abnormal = rows["abnormal"].astype(bool).to_numpy()
            scores = rows["score"].to_numpy(dtype=float)
            stats = per_model[(per_model["model"] == spec.name) & (per_model["method"] == method)]
            label = "AUROC n/a"
            if not stats.empty:
                s = stats.iloc[0]
                label = f"AUROC {fmt(s['auroc'])} [{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]"
            if is_abnormal.any() and (~is_abnormal).any():
                fpr, tpr, _ = roc_curve(is_abnormal.astype(int), scores)
            else:
                fpr, tpr = [], []
            images = rows["image"].astype(int).tolist()
            strips = [StripRow("normal", scores[~is_abnormal], MISSED_COLOR,
                               [f"normal image {i}: A {v:.4g}" for i, v in
                                zip(np.asarray(images)[~is_abnormal], scores[~is_abnormal])]),
                      StripRow("abnormal", scores[is_abnormal], ANOMALOUS_COLOR,
                               [f"abnormal image {i}: A {v:.4g}" for i, v in
                                zip(np.asarray(images)[is_abnormal], scores[is_abnormal])])]
            plots.append('<div class="plots">' + roc_plot(fpr, tpr, title=method, subtitle=label, size=260)
                         + strip_plot(strips, x_label="anomaly score A", width=300, label_width=70,
                                      title=f"{method}: per-image scores") + "</div>")
        parts.append(f"<h3>{escape(spec.name)} ({escape(spec.family)})</h3>"
                     f'<div class="plots">{"".join(plots)}</div>')
    return "\n".join(parts) + "</section>"
