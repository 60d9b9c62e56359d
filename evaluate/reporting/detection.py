"""The report's detection sections: Table 1 and its per-model and per-layer tables, the detection
examples (each anomalous model's median image beside a reference's), and the Abar strip plots."""
from __future__ import annotations

from html import escape

from counteraudit.anomalies.image_sets import DETECTION
from counteraudit.evaluate.reporting.html import (fmt, fraction_class, html_table, is_detected, legend,
                                                  margin_class, median_image)
from counteraudit.evaluate.scoring.baseline import DETECTION_VERSUS_CAPTION as VERSUS_CAPTION
from counteraudit.evaluate.scoring.detection import margin_wide, paper_rule_caution
from counteraudit.evaluate.scoring.explain_time import EXPLAIN_TIME, EXPLAIN_TIME_CAPTION
from counteraudit.evaluate.scoring.model_blind import DETECTION_CONSEQUENCE, blind_methods
from counteraudit.explain.stage import detection_set_for
from counteraudit.evaluate.reporting.svg import (FLAGGED_COLOR, MISSED_COLOR, REFERENCE_COLOR, StripRow,
                                                 strip_plot)


def detection_section(report) -> str:
    summary, per_model = report.table("detection"), report.table("detection-per-model")
    per_layer = report.table("detection-per-layer")
    where = f"{report.distance_name}; {len(report.references)} references"
    parts = ['<section id="detection"><h2>Detection (Table 1)</h2>',
             html_table(summary, cell_class=fraction_class,
                        class_columns=[c for c in summary.columns if c not in ("family", "n_models")],
                        caption=f"Table 1: fraction of each family's models detected ({where})"),
             legend(("v-paper-rule", "every model flagged by the paper's rule, not a statistical "
                                     "verdict"),
                    "v-partial", ("", "uncoloured: none flagged")),
             f'<p class="note">Table 1 counts by '
             f"{escape(paper_rule_caution(len(report.references)))}.</p>",
             '<p class="note">E detects f when Abar(f, E), the mean anomaly score over the detection '
             "images, exceeds every reference's own leave-one-out Abar. Margin = Abar(f) / max_i Abar(g_i) "
             "(above 1 means detected); p = rank p-value.</p>",
             *(f'<p class="note">{escape(line)}.</p>' for line in blind_methods(
                 report.optional_table("detection-model-blind"), DETECTION_CONSEQUENCE).values())]
    intervals = report.optional_table("detection-intervals")
    if intervals is not None and (intervals["n_models"] >= 2).any():
        parts.append(html_table(intervals, caption=(
            f"Table 1 with exact (Clopper-Pearson) 95% intervals for families of two models or "
            f"more ({where})")))
    ratios = report.optional_table("detection-vs-outputs")
    if ratios is not None:
        parts.append(html_table(ratios, caption=f"{VERSUS_CAPTION} ({where})"))
    nulls = report.optional_table("detection-null")
    if nulls is not None:
        parts.append(html_table(nulls, caption=(
            f"Null row: held-out references scored as if anomalous; the fraction flagged is "
            f"the rule's empirical false-positive rate (exact 95% interval), beside 1/(n+1) "
            f"({where})")))
    anomalous = per_model[per_model["role"] != "reference"]
    if not anomalous.empty:
        wide = margin_wide(anomalous)
        parts.append(html_table(wide, cell_class=margin_class,
                                class_columns=[c for c in wide.columns if c not in ("family", "model")],
                                caption=f"Margin per anomalous model, Abar(f) / max_i Abar(g_i) ({where}; "
                                        "above 1: detected; printed with the digits it takes to show "
                                        "which side of 1 it is on)"))
    times = report.optional_table(EXPLAIN_TIME, per_distance=False)
    if times is not None:
        parts.append(html_table(times, float_format="{:.3g}", caption=EXPLAIN_TIME_CAPTION))
    parts.append("<details><summary>Per-model detection table (every model, every method)</summary>"
                 + html_table(per_model, caption=f"Per-model detection ({where})") + "</details>")
    for method in dict.fromkeys(per_layer["method"]):
        rows = per_layer[(per_layer["method"] == method) & (per_layer["role"] != "reference")]
        if rows.empty:
            continue
        parts.append(html_table(margin_wide(rows, columns="layer"),
                                caption=f"{method}: margin per layer ({where})"))
        parts.append(f"<details><summary>{escape(method)}: per-layer detection table</summary>"
                     + html_table(per_layer[per_layer["method"] == method],
                                  caption=f"{method} per layer ({where})") + "</details>")
    return "\n".join(parts) + "</section>"


def detection_examples(report) -> str:
    reference = report.references[0]
    per_model = report.table("detection-per-model")
    parts = ['<section id="detection-examples"><h2>Detection examples</h2>',
             f'<p class="note">For each method and anomalous model: the detection image on which the '
             f"model's anomaly score is the median of its {len(report.image_sets[DETECTION].images)}, "
             f"reference {escape(reference)}'s visualization of it and the model's, with their anomaly "
             "scores A on that image (the reference scored leave-one-out). Abar and margin are the "
             "model's over all images.</p>"]
    for method in report.methods:
        layer = report.shown_layer(method)
        shown_set = detection_set_for(method)  # a model-level method: the classes' rows
        rows = []
        for spec in report.anomalies:
            scores = report.image_scores(report.detection, method, layer, spec.name)
            position = median_image(scores)
            if position is None:
                continue
            reference_score = report.image_scores(report.detection, method, layer, reference).get(position)
            verdict = per_model[(per_model["method"] == method) & (per_model["model"] == spec.name)]
            summary = ""
            if not verdict.empty:
                v = verdict.iloc[0]
                summary = (f"<br>Abar {fmt(v['abar'])}, margin {fmt(v['margin'])}<br>"
                           + ('<span class="v-paper-rule">detected by the paper\'s rule</span>'
                              if is_detected(v["detected"]) else "not flagged by the paper's rule"))
            reference_figure = report.figure(
                report.visualization(method, reference, shown_set, position),
                f"{method} {reference} image {position}", f"{escape(reference)}<br>A = {fmt(reference_score)}")
            model_figure = report.figure(
                report.visualization(method, spec.name, shown_set, position),
                f"{method} {spec.name} image {position}",
                f"<b>{escape(spec.name)}</b><br>A = {fmt(scores.get(position))}")
            shown_input = (report.input_figure(DETECTION, position, "input") if shown_set == DETECTION
                           else f"class {position}<br><small>(model-level: no input)</small>")
            rows.append(f"<tr><th>{escape(spec.name)}<br><small>{escape(spec.family)}</small>{summary}</th>"
                        f"<td>{shown_input}</td>"
                        f"<td>{reference_figure}</td><td>{model_figure}</td></tr>")
        title = method + (f" (layer {layer})" if layer else "")
        parts.append(f'<h3>{escape(title)}</h3><div class="table-wrap"><table class="examples"><thead>'
                     "<tr><th>model</th><th>input</th><th>reference</th><th>anomalous model</th></tr>"
                     f"</thead><tbody>{''.join(rows)}</tbody></table></div>")
    return "\n".join(parts) + "</section>"


def distributions(report) -> str:
    per_model = report.table("detection-per-model")
    plots = []
    for method in report.methods:
        rows = per_model[per_model["method"] == method]
        references = rows[rows["role"] == "reference"]
        strips = [StripRow("references", references["abar"].tolist(), REFERENCE_COLOR,
                           [f"{m}: Abar {a:.4g}" for m, a in zip(references["model"], references["abar"])])]
        nulls = rows[rows["role"] == "null"]
        if not nulls.empty:  # the rule's null distribution: held-out references
            flagged = int(nulls["detected"].map(is_detected).sum())
            strips.append(StripRow(f"held-out references ({flagged}/{len(nulls)} flagged)",
                                   nulls["abar"].tolist(), REFERENCE_COLOR,
                                   [f"{m}: Abar {a:.4g}, margin {fmt(g)}" for m, a, g in
                                    zip(nulls["model"], nulls["abar"], nulls["margin"])]))
        for record in rows[rows["role"] == "anomalous"].to_dict("records"):
            detected = is_detected(record["detected"])
            strips.append(StripRow(record["model"], [record["abar"]],
                                   FLAGGED_COLOR if detected else MISSED_COLOR,
                                   [f"{record['model']} ({record['family']}): Abar {record['abar']:.4g}, "
                                    f"margin {fmt(record['margin'])}, {'detected' if detected else 'not detected'}"]))
        threshold = references["abar"].max() if not references.empty else None
        plots.append(strip_plot(strips, x_label="Abar (mean anomaly score)", threshold=threshold,
                                threshold_label="max reference Abar", title=method))
    return ('<section id="distributions"><h2>Score distributions</h2>'
            f'<p class="note">Per method: each model\'s mean anomaly score Abar over the detection images '
            f"({report.distance_name}; layered methods: mean over layers). Grey: references (each scored "
            "leave-one-out); green: anomalous model flagged by the paper's rule; blue: not flagged. "
            "Dashed: the highest reference Abar, the detection threshold. Hover a point for its value."
            '</p><div class="plots">'
            + "".join(plots) + "</div></section>")
