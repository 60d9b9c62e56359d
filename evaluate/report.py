"""One self-contained HTML report of a suite's results: tables, implant checks, example
visualizations, score distributions and ROC curves.

    python evaluate/report.py                  # the demo suite end to end, then the report
    python evaluate/report.py --quick
    python evaluate/report.py --suite paper --distance lpips-alex --output ~/report.html

Runs whatever upstream work is missing (like detect.py and localize.py, whose score functions and
tables it reuses and whose table files it writes too), then writes ONE HTML file (default
runs/<suite>/report/report.html): inline CSS, images as PNG data URIs, plots as inline SVG, no
external resources, so it can be mailed or opened offline. The output depends only on the run's
artifacts (no date), so the same run gives the same bytes.

Contents: a header (suite, distance and any fallback note, model counts); Table 1 with the
per-model and per-layer detection tables; Table 2 with the per-model localization table (AUROC,
bootstrap interval, chance band); each anomalous model's implant check with its family's figures
against the references'; example visualizations (for every anomalous model and method: the
detection image with the model's median anomaly score, a reference's visualization of it and the
model's, with their scores; for every localizable model: normal and abnormal inputs explained by a
reference and by the model, as in the paper's Figures 2-4); per-method score distributions; ROC
curves per localizable model and method.

Layered methods (Caricatures): the example images show the FIRST layer only, with that layer's
scores (the tables and plots use the overall score, the mean over layers, and list every layer).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file: the code is imported as counteraudit.* (pip install -e .); this folder's
    # modules (train.py, ...) must not shadow other packages of the same name.
    sys.path.pop(0)

import argparse
import base64
import io
import math
from html import escape
from typing import Any

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.stage import localization_power_note, pipeline_parser
from counteraudit.evaluate.reporting.sensitivity import SECTION_ID as SENSITIVITY_ID
from counteraudit.evaluate.reporting.sensitivity import TITLE as SENSITIVITY_TITLE
from counteraudit.train.core.stage import run_cli

DEFAULT_EXAMPLES = 1     # normal and abnormal inputs shown per localizable model
DEFAULT_IMAGE_SIDE = 128  # embedded images are downscaled to at most this many pixels a side


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = pipeline_parser("counteraudit report", add_help)
    parser.add_argument("--output", default=None, metavar="PATH",
                        help="the HTML file to write (default: runs/<suite>/report/report.html)")
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES,
                        help="normal and abnormal example inputs per localizable model")
    parser.add_argument("--image-side", type=int, default=DEFAULT_IMAGE_SIDE,
                        help="embedded images larger than this (pixels a side) are downscaled")
    return parser


def main(args: argparse.Namespace) -> Path | None:
    from counteraudit.anomalies.image_sets import localizable
    from counteraudit.anomalies.verify import read_implant
    from counteraudit.evaluate.scoring.stage import (detection_scores, detection_tables,
                                                localization_scores, localization_tables, prepare,
                                                write_tables)
    from counteraudit.explain.stage import load_image_sets
    from counteraudit.train.core.artifacts import atomic_write_text
    if args.examples < 1 or args.image_side < 8:
        raise ValueError(f"--examples {args.examples} must be >= 1 and --image-side {args.image_side} >= 8")
    suite, methods, distance, distance_name, note = prepare(args)
    if getattr(args, "dry_run", False):
        return None
    detection = detection_scores(suite, distance, distance_name, methods, args.runs_dir, args=args)
    tables = detection_tables(suite, detection, distance_name)
    localization = None
    if localizable(suite):
        localization = localization_scores(suite, distance, distance_name, methods, args.runs_dir, args=args)
        tables.update(localization_tables(localization, distance_name))
    implants = {s.name: read_implant(suite, s, args.runs_dir) for s in suite.anomalies}
    if suite.sweeps:  # dose-response: one panel per sweep
        from counteraudit.evaluate.studies.dose_response import suite_dose
        dose, limits = suite_dose(suite, detection, localization, implants)
        tables.update({f"dose-{distance_name}": dose, f"dose-thresholds-{distance_name}": limits})
    write_tables(suite, tables, args.runs_dir)
    discovery = stored_discovery(suite, args.runs_dir)
    from counteraudit.evaluate.reporting.sensitivity import stored_sensitivity
    report = Report(suite=suite, methods=methods, distance_name=distance_name, note=note,
                    detection=detection, localization=localization, tables=tables,
                    implants=implants,
                    image_sets=load_image_sets(suite, args.runs_dir), runs_root=args.runs_dir,
                    examples=args.examples, image_side=args.image_side, discovery=discovery,
                    sensitivity=stored_sensitivity(suite, distance_name, args.runs_dir))
    output = Path(args.output) if args.output else suite.root(args.runs_dir) / "report" / "report.html"
    text = report.html()
    atomic_write_text(output, text)
    print(f"\nreport ({len(text.encode()) / 1e6:.2f} MB, {report.image_count} images): {output}")
    return output


def stored_discovery(suite, runs_root=None):
    """(findings, tables, world) of the failure-discovery auditors when evaluate/discover.py has
    run for this suite, else None (the report then says how to add them)."""
    from counteraudit.evaluate.discovery.tables import discovery_tables
    from counteraudit.evaluate.discovery.stage import load_suite_findings
    from counteraudit.evaluate.discovery.stage import FINDINGS
    from counteraudit.train.core.artifacts import store_dir
    from counteraudit.train.worlds import build_world
    if not any((store_dir(runs_root) / FINDINGS).glob("*/*")):
        return None  # never run: don't build covering arrays only to find nothing
    world = build_world(suite.world, runs_root=runs_root)
    try:
        results = load_suite_findings(suite, runs_root, world=world)
    except FileNotFoundError:
        return None
    from counteraudit.evaluate.discovery.search_study import search_study
    from counteraudit.evaluate.discovery.stage import discover_seed
    tables = discovery_tables(suite, results, world, runs_root)
    tables.update(search_study(suite, results, world, runs_root, discover_seed(suite)).get(
        "tables", {}))
    return results, tables, world


# ---------------------------------------------------------------- the page's script and style
# Installed first in <head>: counts script errors and console.error calls from the start, and on
# load records on <body> whether every image decoded, so a headless browser's DOM dump shows it.
SCRIPT = """
(function () {
  var errors = [];
  window.addEventListener("error", function (event) {
    errors.push(String(event.message || "error"));
  });
  window.addEventListener("unhandledrejection", function (event) {
    errors.push("unhandled rejection: " + String(event.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, " "));
    return consoleError.apply(console, arguments);
  };
  window.addEventListener("load", function () {
    var images = document.images, loaded = 0, broken = [];
    for (var i = 0; i < images.length; i++) {
      if (images[i].complete && images[i].naturalWidth > 0) { loaded++; }
      else { broken.push(images[i].alt); images[i].classList.add("broken"); }
    }
    document.body.setAttribute("data-images-loaded", loaded + "/" + images.length);
    document.body.setAttribute("data-errors", String(errors.length));
    if (broken.length) { document.body.setAttribute("data-broken-images", broken.join(" | ")); }
    if (errors.length) { document.body.setAttribute("data-error-messages", errors.join(" | ")); }
  });
})();
"""

STYLE = """
body { font-family: sans-serif; font-size: 14px; margin: 1.5em auto; max-width: 1250px; color: #222;
       padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #ccc; margin-top: 2em; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }
.note { color: #555; max-width: 60em; } .warn { color: #b00; font-weight: bold; }
.pass { color: #070; font-weight: bold; } .fail { color: #b00; font-weight: bold; }
figure { display: inline-block; margin: 2px 4px; text-align: center; vertical-align: top; }
figcaption { font-size: 11px; color: #333; max-width: 130px; overflow-wrap: anywhere; }
img.viz { image-rendering: pixelated; border: 1px solid #ccc; background: #fff; }
img.broken { outline: 3px solid red; }
table.examples td, table.examples th { text-align: center; }
.plots { display: flex; flex-wrap: wrap; gap: 10px 24px; align-items: flex-start; }
details { margin: 0.4em 0; } summary { cursor: pointer; color: #035; }
nav ul { columns: 2; }
"""


# ---------------------------------------------------------------- helpers
def html_table(frame: pd.DataFrame, *, float_format: str = "{:.3f}", caption: str | None = None) -> str:
    """A pandas frame (flat columns, index ignored) as an HTML table; numbers right-aligned."""
    from counteraudit.evaluate.reporting.tables import format_cell
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in frame.columns]
    head = "".join(f"<th>{escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = "".join(f'<td{" class=num" if num else ""}>{escape(format_cell(v, float_format))}</td>'
                        for v, num in zip(row, numeric))
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def png_data_uri(image: np.ndarray, max_side: int) -> tuple[str, int, int]:
    """A uint8 (H, W, 3) image as a PNG data URI (downscaled to ``max_side``), with its size."""
    from PIL import Image
    picture = Image.fromarray(np.ascontiguousarray(image.astype(np.uint8)))
    if max(picture.size) > max_side:
        scale = max_side / max(picture.size)
        picture = picture.resize((max(1, round(picture.width * scale)), max(1, round(picture.height * scale))),
                                 Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=True)
    return ("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii"),
            picture.width, picture.height)


def fmt(value: Any, digits: int = 2) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def is_detected(value: Any) -> bool:
    """The ``detected`` column holds booleans for anomalous models and NaN for references."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def median_image(scores: pd.Series) -> int | None:
    """The image (index of ``scores``) with the lower-median finite score; ties by image index."""
    finite = scores[np.isfinite(scores.to_numpy(dtype=float))]
    if finite.empty:
        return int(scores.index.min()) if len(scores) else None
    ordered = sorted(zip(finite.to_numpy(dtype=float), finite.index.astype(int)))
    return int(ordered[(len(ordered) - 1) // 2][1])


# ---------------------------------------------------------------- the report
class Report:
    def __init__(self, *, suite, methods: list[str], distance_name: str, note: str | None,
                 detection: pd.DataFrame, localization: pd.DataFrame | None,
                 tables: dict[str, pd.DataFrame], implants: dict[str, dict | None], image_sets: dict,
                 runs_root=None, examples: int = DEFAULT_EXAMPLES, image_side: int = DEFAULT_IMAGE_SIDE,
                 discovery=None, sensitivity: dict[str, pd.DataFrame] | None = None):
        from counteraudit.anomalies.image_sets import localizable
        from counteraudit.evaluate.scoring.detection import with_layer_column
        self.suite, self.methods, self.distance_name, self.note = suite, methods, distance_name, note
        self.detection = with_layer_column(detection)
        self.localization = with_layer_column(localization) if localization is not None else None
        self.tables, self.implants, self.image_sets = tables, implants, image_sets
        self.runs_root, self.examples, self.image_side = runs_root, examples, image_side
        self.references = [s.name for s in suite.references]
        self.anomalies = list(suite.anomalies)
        self.localizable = list(localizable(suite)) if localization is not None else []
        self.discovery = discovery  # (findings, tables, world) or None
        self.sensitivity = sensitivity  # evaluate/sensitivity.py's tables, or None
        self._explanations: dict[tuple[str, str, str], Any] = {}
        self.image_count = 0

    # ---- data access
    def table(self, name: str) -> pd.DataFrame:
        return self.tables[f"{name}-{self.distance_name}"]

    def explanation(self, method: str, model: str, image_set: str):
        from counteraudit.explain.stage import load_results
        key = (method, model, image_set)
        if key not in self._explanations:
            self._explanations[key] = load_results(self.suite, method, [model], image_set, self.runs_root)[model]
        return self._explanations[key]

    def shown_layer(self, method: str) -> str:
        """The layer whose images the examples show: the first of a layered method, else ''."""
        from counteraudit.evaluate.scoring.detection import NO_LAYER
        layers = self.explanation(method, self.references[0], "detection").layers
        return str(layers[0]) if layers else NO_LAYER

    def visualization(self, method: str, model: str, image_set: str, position: int) -> np.ndarray:
        result = self.explanation(method, model, image_set)
        images = result.images[0] if result.layers is not None else result.images
        return images[position]

    @staticmethod
    def image_scores(frame: pd.DataFrame, method: str, layer: str, model: str, **where) -> pd.Series:
        """image -> score of one model, method and layer (optionally more column filters)."""
        mask = (frame["method"] == method) & (frame["layer"] == layer) & (frame["model"] == model)
        for column, value in where.items():
            mask &= frame[column] == value
        return frame[mask].set_index("image")["score"]

    # ---- pieces of HTML
    def figure(self, image: np.ndarray, alt: str, caption: str, display: int = 112) -> str:
        uri, width, height = png_data_uri(image, self.image_side)
        self.image_count += 1
        scale = display / max(width, height)
        return (f'<figure><img class="viz" src="{uri}" alt="{escape(alt)}" title="{escape(alt)}" '
                f'width="{round(width * scale)}" height="{round(height * scale)}">'
                f"<figcaption>{caption}</figcaption></figure>")

    def input_figure(self, set_name: str, position: int, what: str) -> str:
        image_set = self.image_sets[set_name]
        label = int(image_set.labels[position])
        caption = f"{escape(what)}<br>{escape(set_name)} #{position}, class {label}"
        return self.figure(image_set.images[position], f"{what}: {set_name} image {position}", caption)

    def html(self) -> str:
        sections = [self.header(), self.detection_section(), self.localization_section(),
                    self.implant_section(), self.detection_examples(), self.localization_examples(),
                    self.distributions(), self.roc_section(), self.dose_section(),
                    self.power_section(), self.sensitivity_section(),
                    self.discovery_section()]
        title = f"counteraudit report: {self.suite.name}"
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{escape(title)}</title>\n<script>{SCRIPT}</script>\n<style>{STYLE}</style></head>\n"
                '<body data-images-loaded="pending" data-errors="pending">\n'
                + "\n".join(s for s in sections if s) + "\n</body></html>\n")

    def header(self) -> str:
        from counteraudit.anomalies.image_sets import set_sizes
        m, p = set_sizes(self.suite)
        failed = [name for name, r in self.implants.items() if r is not None and not r["passed"]]
        unchecked = [name for name, r in self.implants.items() if r is None]
        lines = [f"<h1>{escape(f'counteraudit report: suite {self.suite.name}')}</h1>",
                 '<p id="distance"><b>Distance:</b> ' + escape(self.distance_name)
                 + (f' <span class="warn">({escape(self.note)})</span>' if self.note else "") + "</p>",
                 f"<p><b>Models:</b> {len(self.suite.models)} ({len(self.references)} references, "
                 f"{len(self.anomalies)} anomalous, {len(self.localizable)} of them localizable). "
                 f"<b>Methods:</b> {escape(', '.join(self.methods))}. <b>Images:</b> m = {m} detection, "
                 f"p = {p} normal + {p} abnormal per localizable model.</p>",
                 '<p class="note">Example images of layered methods (Caricatures) show their first layer only, '
                 "with that layer's scores; tables and plots use the overall score (mean over layers).</p>"]
        if failed:
            lines.append(f'<p class="warn">IMPLANT FAILED for {len(failed)} model(s): {escape(", ".join(failed))}. '
                         "Their defect did not take, so they are not counter-audits.</p>")
        if unchecked:
            lines.append(f'<p class="warn">No implant check recorded for: {escape(", ".join(unchecked))}.</p>')
        entries = [("detection", "Detection (Table 1)"), ("localization", "Localization (Table 2)"),
                   ("implants", "Implant verification"), ("detection-examples", "Detection examples"),
                   ("localization-examples", "Localization examples"),
                   ("distributions", "Score distributions"), ("roc", "ROC curves")]
        if self.suite.sweeps:
            entries.append(("dose", "Dose-response"))
        entries.append(("power", "Power"))
        entries.append((SENSITIVITY_ID, SENSITIVITY_TITLE))
        if self.discovery is not None:
            entries.append(("discovery", "Failure discovery (Tables 3 and 4)"))
        if not self.localizable:
            entries = [e for e in entries if e[0] not in ("localization", "localization-examples", "roc")]
        lines.append("<nav><ul>" + "".join(f'<li><a href="#{i}">{escape(t)}</a></li>' for i, t in entries)
                     + "</ul></nav>")
        return "<header>" + "\n".join(lines) + "</header>"

    def sensitivity_section(self) -> str:
        from counteraudit.evaluate.reporting.sensitivity import sensitivity_section
        return sensitivity_section(self.sensitivity, html_table)

    def power_section(self) -> str:
        from counteraudit.evaluate.reporting.power import power_section
        from counteraudit.evaluate.scoring.stage import TABLES
        return power_section(self.suite.root(self.runs_root) / TABLES, self.distance_name, html_table)

    def dose_section(self) -> str:
        name = f"dose-{self.distance_name}"
        if name not in self.tables:
            return ""
        from counteraudit.evaluate.reporting.dose import dose_section
        return dose_section(self.tables[name], self.table("dose-thresholds"), html_table)

    def discovery_section(self) -> str:
        if self.discovery is None:
            return ('<p class="note">No failure-discovery findings for this suite yet: '
                    "python evaluate/discover.py adds Tables 3 and 4 and their section.</p>")
        from counteraudit.evaluate.reporting.discovery import discovery_section
        results, tables, world = self.discovery
        return discovery_section(results, tables, world, self.figure, html_table)

    def detection_section(self) -> str:
        summary, per_model = self.table("detection"), self.table("detection-per-model")
        per_layer = self.table("detection-per-layer")
        where = f"{self.distance_name}; {len(self.references)} references"
        parts = ['<section id="detection"><h2>Detection (Table 1)</h2>',
                 html_table(summary, caption=f"Table 1: fraction of each family's models detected ({where})"),
                 '<p class="note">E detects f when Abar(f, E), the mean anomaly score over the detection '
                 "images, exceeds every reference's own leave-one-out Abar. Margin = Abar(f) / max_i Abar(g_i) "
                 "(above 1 means detected); p = rank p-value.</p>"]
        intervals = self.tables.get(f"detection-intervals-{self.distance_name}")
        if intervals is not None and (intervals["n_models"] >= 2).any():
            parts.append(html_table(intervals, caption=(
                f"Table 1 with exact (Clopper-Pearson) 95% intervals for families of two models or "
                f"more ({where})")))
        ratios = self.tables.get(f"detection-vs-outputs-{self.distance_name}")
        if ratios is not None:
            parts.append(html_table(ratios, float_format="{:.2f}", caption=(
                f"Against the outputs-only control: margin(method) / margin(outputs_only) per "
                f"anomalous model (above 1: the explanation sets the model further from the "
                f"references than the outputs do; {where})")))
        nulls = self.tables.get(f"detection-null-{self.distance_name}")
        if nulls is not None:
            parts.append(html_table(nulls, caption=(
                f"Null row: held-out references scored as if anomalous; the fraction flagged is "
                f"the rule's empirical false-positive rate (exact 95% interval), beside 1/(n+1) "
                f"({where})")))
        anomalous = per_model[per_model["role"] != "reference"]
        if not anomalous.empty:
            wide = anomalous.pivot_table(index=["family", "model"], columns="method", values="margin",
                                         sort=False).reset_index()
            wide.columns.name = None
            parts.append(html_table(wide, float_format="{:.2f}", caption=f"Margin per anomalous model ({where})"))
        parts.append("<details><summary>Per-model detection table (every model, every method)</summary>"
                     + html_table(per_model, caption=f"Per-model detection ({where})") + "</details>")
        for method in dict.fromkeys(per_layer["method"]):
            rows = per_layer[(per_layer["method"] == method) & (per_layer["role"] != "reference")]
            if rows.empty:
                continue
            wide = rows.pivot_table(index=["family", "model"], columns="layer", values="margin",
                                    sort=False).reset_index()
            wide.columns.name = None
            parts.append(html_table(wide, float_format="{:.2f}",
                                    caption=f"{method}: margin per layer ({where})"))
            parts.append(f"<details><summary>{escape(method)}: per-layer detection table</summary>"
                         + html_table(per_layer[per_layer["method"] == method],
                                      caption=f"{method} per layer ({where})") + "</details>")
        return "\n".join(parts) + "</section>"

    def localization_section(self) -> str:
        if not self.localizable:
            return ""
        summary, per_model = self.table("localization"), self.table("localization-per-model")
        per_layer = self.table("localization-per-layer")
        band = per_model[["chance_low", "chance_high"]].median()
        detail = pd.DataFrame({
            "method": per_model["method"], "model": per_model["model"], "AUROC": per_model["auroc"],
            "95% CI": [f"[{fmt(a)}, {fmt(b)}]" for a, b in zip(per_model["ci_low"], per_model["ci_high"])],
            "chance band": [f"[{fmt(a)}, {fmt(b)}]" for a, b in zip(per_model["chance_low"], per_model["chance_high"])],
            "p": per_model["p_value"], "n abnormal": per_model["n_abnormal"], "n normal": per_model["n_normal"],
            "n flagged": per_model["n_flagged"], "flag": per_model["flag"]})
        parts = ['<section id="localization"><h2>Localization (Table 2)</h2>',
                 html_table(summary, float_format="{:.2f}",
                            caption=f"Table 2: AUROC of the anomaly score, abnormal vs normal inputs "
                                    f"({self.distance_name})"),
                 f'<p class="note">At these set sizes an AUROC inside [{fmt(band["chance_low"])}, '
                 f'{fmt(band["chance_high"])}] cannot be told from chance (95% of label permutations); '
                 "0.7 counts as success. CI: seeded bootstrap, abnormal and normal images resampled "
                 f"separately. {escape(localization_power_note(self.suite) or '')}</p>",
                 html_table(detail, caption=f"Per-model localization ({self.distance_name})")]
        versus = self.tables.get(f"localization-vs-outputs-{self.distance_name}")
        if versus is not None:
            parts.append(html_table(versus, caption=(
                f"Against the outputs-only control: AUROC(method) - AUROC(outputs_only) on the "
                f"same images, paired bootstrap 95% interval; adds = the explanation localizes "
                f"better than the model's outputs alone, same = no better, less = worse "
                f"({self.distance_name})")))
        if not per_layer.empty:
            parts.append("<details><summary>Per-layer localization table</summary>"
                         + html_table(per_layer, caption=f"Localization per layer ({self.distance_name})")
                         + "</details>")
        return "\n".join(parts) + "</section>"

    def implant_section(self) -> str:
        from counteraudit.evaluate.reporting.svg import ANOMALOUS_COLOR, REFERENCE_COLOR, StripRow, strip_plot
        rows, blocks = [], []
        for spec in self.anomalies:
            record = self.implants.get(spec.name)
            if record is None:
                rows.append(f"<tr><td>{escape(spec.name)}</td><td>{escape(spec.family)}</td>"
                            '<td colspan="4" class="warn">no implant record</td></tr>')
                continue
            params = ", ".join(f"{k}={v}" for k, v in sorted(record.get("params", {}).items()))
            verdict = '<span class="pass">yes</span>' if record["passed"] else '<span class="fail">NO</span>'
            rows.append(f"<tr><td>{escape(spec.name)}</td><td>{escape(record['family'])}</td>"
                        f"<td>{escape(params)}</td><td class=num>{fmt(record['val_accuracy'], 3)} "
                        f"({fmt(record['reference_val_accuracy_mean'], 3)})</td>"
                        f"<td>{escape(record['summary'])}</td><td>{verdict}</td></tr>")
            plots = []
            for figure_name, value in sorted(record.get("figures", {}).items()):
                reference_values = [r.get(figure_name, float("nan")) for r in record.get("reference_figures", [])]
                plots.append(strip_plot(
                    [StripRow("references", reference_values, REFERENCE_COLOR,
                              [f"{n}: {v:.4g}" for n, v in zip(self.references, reference_values)]),
                     StripRow(spec.name, [value], ANOMALOUS_COLOR)],
                    x_label=figure_name.replace("_", " "), title=figure_name, width=360, label_width=110))
            details = record.get("details") or {}
            extra = ("<p class=note>" + escape(", ".join(f"{k}: {v}" for k, v in sorted(details.items())))
                     + "</p>") if details else ""
            status = "implant took" if record["passed"] else "IMPLANT FAILED"
            blocks.append(f"<h3>{escape(spec.name)} ({escape(record['family'])}): "
                          f"<span class=\"{'pass' if record['passed'] else 'fail'}\">{escape(status)}</span></h3>"
                          f"<p>{escape(record['summary'])}</p>{extra}"
                          + (f'<div class="plots">{"".join(plots)}</div>' if plots else
                             '<p class="note">This family records no behaviour figures.</p>'))
        table = ("<table><caption>Implant checks: each anomalous model's family figure against the references'"
                 "</caption><thead><tr><th>model</th><th>family</th><th>params</th><th>val acc (refs)</th>"
                 "<th>implant check</th><th>took</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
        return ('<section id="implants"><h2>Implant verification</h2>'
                '<p class="note">A planted defect that did not take is not a counter-audit. Grey: the '
                "references' figures; red: the anomalous model's.</p>" + table + "\n".join(blocks) + "</section>")

    def detection_examples(self) -> str:
        from counteraudit.anomalies.image_sets import DETECTION
        reference = self.references[0]
        per_model = self.table("detection-per-model")
        parts = ['<section id="detection-examples"><h2>Detection examples</h2>',
                 f'<p class="note">For each method and anomalous model: the detection image on which the '
                 f"model's anomaly score is the median of its {len(self.image_sets[DETECTION].images)}, "
                 f"reference {escape(reference)}'s visualization of it and the model's, with their anomaly "
                 "scores A on that image (the reference scored leave-one-out). Abar and margin are the "
                 "model's over all images.</p>"]
        for method in self.methods:
            layer = self.shown_layer(method)
            rows = []
            for spec in self.anomalies:
                scores = self.image_scores(self.detection, method, layer, spec.name)
                position = median_image(scores)
                if position is None:
                    continue
                reference_score = self.image_scores(self.detection, method, layer, reference).get(position)
                verdict = per_model[(per_model["method"] == method) & (per_model["model"] == spec.name)]
                summary = ""
                if not verdict.empty:
                    v = verdict.iloc[0]
                    summary = (f"<br>Abar {fmt(v['abar'])}, margin {fmt(v['margin'])}<br>"
                               + ('<span class="fail">detected</span>' if is_detected(v["detected"])
                                  else "not detected"))
                reference_figure = self.figure(
                    self.visualization(method, reference, DETECTION, position),
                    f"{method} {reference} image {position}", f"{escape(reference)}<br>A = {fmt(reference_score)}")
                model_figure = self.figure(
                    self.visualization(method, spec.name, DETECTION, position),
                    f"{method} {spec.name} image {position}",
                    f"<b>{escape(spec.name)}</b><br>A = {fmt(scores.get(position))}")
                rows.append(f"<tr><th>{escape(spec.name)}<br><small>{escape(spec.family)}</small>{summary}</th>"
                            f"<td>{self.input_figure(DETECTION, position, 'input')}</td>"
                            f"<td>{reference_figure}</td><td>{model_figure}</td></tr>")
            title = method + (f" (layer {layer})" if layer else "")
            parts.append(f"<h3>{escape(title)}</h3><table class=\"examples\"><thead><tr><th>model</th><th>input</th>"
                         f"<th>reference</th><th>anomalous model</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
        return "\n".join(parts) + "</section>"

    def example_positions(self, spec) -> tuple[list[int], list[int]]:
        """The first ``examples`` normal (detection-set) and abnormal positions of one model."""
        frame = self.localization
        rows = frame[(frame["model"] == spec.name) & (frame["method"] == self.methods[0])]
        normal = sorted(set(rows.loc[~rows["abnormal"].astype(bool), "image"].astype(int)))[:self.examples]
        abnormal = sorted(set(rows.loc[rows["abnormal"].astype(bool), "image"].astype(int)))[:self.examples]
        return normal, abnormal

    def localization_examples(self) -> str:
        from counteraudit.anomalies.image_sets import DETECTION, abnormal_set_name
        if not self.localizable:
            return ""
        reference = self.references[0]
        parts = ['<section id="localization-examples"><h2>Localization examples</h2>',
                 f'<p class="note">As in the paper\'s Figures 2-4: for each localizable model, its first '
                 f"{self.examples} normal and first {self.examples} abnormal input(s) (the same for every "
                 f"method), explained by reference {escape(reference)} and by the anomalous model, with the "
                 "model's anomaly score A on each. Localization works when A is higher on the abnormal "
                 "inputs.</p>"]
        for spec in self.localizable:
            normal, abnormal = self.example_positions(spec)
            abnormal_set = abnormal_set_name(spec)
            columns = [(DETECTION, p, False) for p in normal] + [(abnormal_set, p, True) for p in abnormal]
            head = "".join(f'<th colspan="2">{self.input_figure(s, p, "abnormal input" if a else "normal input")}</th>'
                           for s, p, a in columns)
            rows = []
            for method in self.methods:
                layer = self.shown_layer(method)
                cells = []
                for set_name, position, is_abnormal in columns:
                    score = self.image_scores(self.localization, method, layer, spec.name,
                                              abnormal=is_abnormal).get(position)
                    kind = "abnormal" if is_abnormal else "normal"
                    cells.append("<td>" + self.figure(
                        self.visualization(method, reference, set_name, position),
                        f"{method} {reference} {set_name} image {position}", escape(reference)) + "</td>")
                    cells.append("<td>" + self.figure(
                        self.visualization(method, spec.name, set_name, position),
                        f"{method} {spec.name} {set_name} image {position}",
                        f"<b>{escape(spec.name)}</b><br>A = {fmt(score)} ({kind})") + "</td>")
                label = escape(method) + (f"<br><small>layer {escape(layer)}</small>" if layer else "")
                rows.append(f"<tr><th>{label}</th>{''.join(cells)}</tr>")
            parts.append(f"<h3>{escape(spec.name)} ({escape(spec.family)})</h3>"
                         f'<table class="examples"><thead><tr><th>method</th>{head}</tr></thead>'
                         f"<tbody>{''.join(rows)}</tbody></table>")
        return "\n".join(parts) + "</section>"

    def distributions(self) -> str:
        from counteraudit.evaluate.reporting.svg import ANOMALOUS_COLOR, MISSED_COLOR, REFERENCE_COLOR, StripRow, strip_plot
        per_model = self.table("detection-per-model")
        plots = []
        for method in self.methods:
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
                                       ANOMALOUS_COLOR if detected else MISSED_COLOR,
                                       [f"{record['model']} ({record['family']}): Abar {record['abar']:.4g}, "
                                        f"margin {fmt(record['margin'])}, {'detected' if detected else 'not detected'}"]))
            threshold = references["abar"].max() if not references.empty else None
            plots.append(strip_plot(strips, x_label="Abar (mean anomaly score)", threshold=threshold,
                                    threshold_label="max reference Abar", title=method))
        return ('<section id="distributions"><h2>Score distributions</h2>'
                f'<p class="note">Per method: each model\'s mean anomaly score Abar over the detection images '
                f"({self.distance_name}; layered methods: mean over layers). Grey: references (each scored "
                "leave-one-out); red: detected anomalous model; blue: missed. Dashed: the highest reference "
                'Abar, the detection threshold. Hover a point for its value.</p><div class="plots">'
                + "".join(plots) + "</div></section>")

    def roc_section(self) -> str:
        from sklearn.metrics import roc_curve

        from counteraudit.evaluate.reporting.svg import ANOMALOUS_COLOR, MISSED_COLOR, StripRow, roc_plot, strip_plot
        if not self.localizable:
            return ""
        per_model = self.table("localization-per-model")
        # the per-image overall score, as localization_table ranks it (layers averaged)
        overall = (self.localization.groupby(["method", "model", "image", "abnormal"], sort=False)
                   .agg(score=("score", "mean")).reset_index())
        parts = ['<section id="roc"><h2>ROC curves</h2>',
                 '<p class="note">Per localizable model and method: the per-image anomaly scores of its normal '
                 "(blue) and abnormal (red) inputs, and the ROC curve of abnormal vs normal (sklearn's "
                 "roc_curve; layered methods: the score averaged over layers). The dashed diagonal is "
                 "chance.</p>"]
        for spec in self.localizable:
            plots = []
            for method in self.methods:
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


if __name__ == "__main__":
    run_cli(main, get_args_parser())
