"""The report as one HTML page: what it shows (a Report of one suite's results), its header, and
the sections in order, each written by its own module in this folder."""
from __future__ import annotations

import shlex
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# the section modules, named apart from the Report fields of the same names
from counteraudit.evaluate.reporting import detection as detection_sections
from counteraudit.evaluate.reporting.page_defaults import DEFAULT_EXAMPLES, DEFAULT_IMAGE_SIDE
from counteraudit.evaluate.reporting import implants as implant_sections
from counteraudit.evaluate.reporting import localization as localization_sections
from counteraudit.evaluate.reporting import summary as summary_sections
from counteraudit.evaluate.reporting import verdicts as verdict_sections
from counteraudit.evaluate.reporting.html import SCRIPT, STYLE, html_table, png_data_uri
from counteraudit.evaluate.reporting.sensitivity import SECTION_ID as SENSITIVITY_ID
from counteraudit.evaluate.reporting.sensitivity import TITLE as SENSITIVITY_TITLE
from counteraudit.anomalies.image_sets import localizable
from counteraudit.evaluate.scoring.detection import with_layer_column
from counteraudit.evaluate.scoring.stage import localized_methods
from counteraudit.explain.stage import detection_set_for, load_results
from counteraudit.evaluate.scoring.detection import NO_LAYER
from counteraudit.anomalies.image_sets import set_sizes, set_sources
from counteraudit.evaluate.reporting.sensitivity import sensitivity_section
from counteraudit.evaluate.reporting.power import power_section
from counteraudit.evaluate.scoring.stage import TABLES
from counteraudit.evaluate.reporting.dose import dose_section
from counteraudit.evaluate.reporting.discovery import discovery_section
from counteraudit.evaluate.reporting.comparison import comparison_entries, comparison_section
from counteraudit.train.core.suite_files import SUITES_DIR



class Report:
    def __init__(self, *, suite, methods: list[str], distance_name: str, source: str,
                 detection: pd.DataFrame, localization: pd.DataFrame | None,
                 tables: dict[str, pd.DataFrame], implants: dict[str, dict | None], image_sets: dict,
                 runs_root=None, examples: int = DEFAULT_EXAMPLES, image_side: int = DEFAULT_IMAGE_SIDE,
                 discovery=None, sensitivity: dict[str, pd.DataFrame] | None = None,
                 comparison=None):
        self.suite, self.methods, self.distance_name, self.source = suite, methods, distance_name, source
        self.detection = with_layer_column(detection)
        self.localization = with_layer_column(localization) if localization is not None else None
        self._tables = tables  # result tables by file name: read through table / optional_table
        self.implants, self.image_sets = implants, image_sets
        self.runs_root, self.examples, self.image_side = runs_root, examples, image_side
        self.references = [s.name for s in suite.references]
        self.anomalies = list(suite.anomalies)
        self.localizable = (list(localizable(suite)) if localization is not None and len(localization)
                            else [])
        self.discovery = discovery  # (findings, tables, world) or None
        self.sensitivity = sensitivity  # evaluate/sensitivity.py's tables, or None
        self.comparison = comparison  # scoring.pair_tables.Comparison (--against), or None
        self._explanations: dict[tuple[str, str, str], Any] = {}
        self.image_count = 0

    @property
    def localized_methods(self) -> list[str]:
        """The methods localization applies to (``scoring.stage.localized_methods``)."""
        return localized_methods(self.methods)

    # ---- data access
    def table(self, name: str) -> pd.DataFrame:
        """The result table ``name`` scored with this report's distance (``<name>-<distance>``)."""
        return self._tables[f"{name}-{self.distance_name}"]

    def optional_table(self, name: str, *, per_distance: bool = True) -> pd.DataFrame | None:
        """``table(name)``, or None where the run did not make that table; ``per_distance=False``
        for a table the distance does not change (its name has no distance suffix)."""
        return self._tables.get(f"{name}-{self.distance_name}" if per_distance else name)

    def explanation(self, method: str, model: str, image_set: str):
        key = (method, model, image_set)
        if key not in self._explanations:
            self._explanations[key] = load_results(self.suite, method, [model], image_set, self.runs_root)[model]
        return self._explanations[key]

    def shown_layer(self, method: str) -> str:
        """The layer whose images the examples show: the first of a layered method, else ''."""
        layers = self.explanation(method, self.references[0], detection_set_for(method)).layers
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
        label = int(image_set.labels[position])  # a folder without labels: -1
        caption = f"{escape(what)}<br>{escape(set_name)} #{position}, class {label if label >= 0 else 'unknown'}"
        return self.figure(image_set.images[position], f"{what}: {set_name} image {position}", caption)

    def command(self, name: str) -> str:
        """The ``counteraudit`` command line that runs stage ``name`` on this report's suite and
        runs folder, for the notes that say how to add a missing section."""
        path = Path(self.suite.path).resolve()
        suite = self.suite.name if path == (SUITES_DIR / f"{self.suite.name}.toml").resolve() \
            else str(path)
        runs = f" --runs-dir {shlex.quote(str(self.runs_root))}" if self.runs_root is not None else ""
        return f"counteraudit {name} --suite {shlex.quote(suite)}{runs}"

    def html(self) -> str:
        sections = [self.header(),
                    verdict_sections.verdict_section(self),
                    comparison_section(self.comparison),
                    detection_sections.detection_section(self),
                    localization_sections.localization_section(self),
                    implant_sections.implant_section(self),
                    detection_sections.detection_examples(self),
                    localization_sections.localization_examples(self),
                    detection_sections.distributions(self),
                    localization_sections.roc_section(self),
                    self.dose_section(), self.power_section(), self.sensitivity_section(),
                    self.discovery_section()]
        title = f"counteraudit report: {self.suite.name}"
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                '<meta name="viewport" content="width=device-width, initial-scale=1">'

                f"<title>{escape(title)}</title>\n<script>{SCRIPT}</script>\n<style>{STYLE}</style></head>\n"
                '<body data-images-loaded="pending" data-errors="pending">\n'
                + "\n".join(s for s in sections if s) + "\n</body></html>\n")

    def header(self) -> str:
        m, p = set_sizes(self.suite)
        failed = [name for name, r in self.implants.items() if r is not None and not r["passed"]]
        unchecked = [name for name, r in self.implants.items() if r is None]
        lines = [f"<h1>{escape(f'counteraudit report: suite {self.suite.name}')}</h1>"]
        if failed:  # before the findings: those models' rows say nothing about the methods
            lines.append(f'<p class="warn">IMPLANT FAILED for {len(failed)} model(s): {escape(", ".join(failed))}. '
                         "Their defect did not take, so they are not counter-audits.</p>")
        if unchecked:
            lines.append(f'<p class="warn">No implant check recorded for: {escape(", ".join(unchecked))}.</p>')
        lines += [summary_sections.summary_section(self),
                 # which distance, and who chose it: context for the numbers, said once
                 '<p id="distance"><b>Distance:</b> ' + escape(self.distance_name)
                 + f' <span class="note">(chosen by {escape(self.source)})</span></p>',
                 f"<p><b>Models:</b> {len(self.suite.models)} ({len(self.references)} references, "
                 f"{len(self.anomalies)} anomalous, {len(self.localizable)} of them localizable). "
                 f"<b>Methods:</b> {escape(', '.join(self.methods))}. <b>Images:</b> m = {m} detection, "
                 f"p = {p} normal + {p} abnormal per localizable model.</p>",
                 self.image_sources(),
                 '<p class="note">Example images of layered methods (Caricatures) show their first layer only, '
                 "with that layer's scores; tables and plots use the overall score (mean over layers).</p>"]
        entries = [(summary_sections.SECTION_ID, "What this run found"),
                   *([(verdict_sections.SECTION_ID, verdict_sections.TITLE)]
                     if self.optional_table("detection-verdicts") is not None else []),
                   *comparison_entries(self.comparison),
                   ("detection", "Detection (Table 1)"), ("localization", "Localization (Table 2)"),
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

    def image_sources(self) -> str:
        """Where each image set comes from: a seeded draw, or the folder [image_sets] names."""
        return f'<p id="image-sources"><b>Image sets:</b> {escape(set_sources(self.suite))}.</p>'

    def sensitivity_section(self) -> str:
        return sensitivity_section(self.sensitivity, html_table, self.command("sensitivity"))

    def power_section(self) -> str:
        return power_section(self.suite.root(self.runs_root) / TABLES, self.distance_name, html_table,
                             self.command("reference-count"))

    def dose_section(self) -> str:
        dose = self.optional_table("dose")
        if dose is None:
            return ""
        return dose_section(dose, self.table("dose-thresholds"), html_table)

    def discovery_section(self) -> str:
        if self.discovery is None:
            return ('<p class="note">No failure-discovery findings for this suite yet: '
                    f"<code>{escape(self.command('discover'))}</code> adds Tables 3 and 4 and "
                    "their section.</p>")
        results, tables, world = self.discovery
        return discovery_section(results, tables, world, self.figure, html_table, self.suite.name)

    def example_positions(self, spec) -> tuple[list[int], list[int]]:
        """The first ``examples`` normal (in its normal set) and abnormal positions of one model."""
        frame = self.localization
        rows = frame[(frame["model"] == spec.name) & (frame["method"] == self.localized_methods[0])]
        normal = sorted(set(rows.loc[~rows["abnormal"].astype(bool), "image"].astype(int)))[:self.examples]
        abnormal = sorted(set(rows.loc[rows["abnormal"].astype(bool), "image"].astype(int)))[:self.examples]
        return normal, abnormal
