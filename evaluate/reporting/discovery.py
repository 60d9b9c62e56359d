"""The report's failure-discovery section: Tables 3 and 4, and each model's top subgroups per
auditor with example images (generated for the subgroup by the world's generator; on a world
without one, val images that have the subgroup's factor values)."""
from __future__ import annotations

from html import escape
from typing import Any, Callable

import numpy as np
import pandas as pd

from counteraudit.evaluate.discovery.auditors import AUDITORS, ranked
from counteraudit.evaluate.discovery.tables import discovery_notes
from counteraudit.evaluate.reporting.search import search_section

TOP_SUBGROUPS = 3
EXAMPLES_PER_SUBGROUP = 4
EXAMPLE_SEED = 0
# Tables shown only where the suite has what they need (slice models with arities and strengths;
# held-out references).
OPTIONAL_TABLES = (
    ("discovery-recovery-rates", "Recovery rates: share of models whose planted slice ranks "
                                 "first (top1) and in the first five (top5), 95% Wilson "
                                 "intervals, by auditor, slice arity and strength"),
    ("discovery-recovery-by-arity", "Recovery rates by auditor and slice arity, strengths "
                                    "pooled: n_slices distinct slices (a slice's strengths are "
                                    "not independent), outside = models that took but lie "
                                    "outside the auditor's factors"),
    ("discovery-detection-relations", "Table 3's detections by what the top finding has to do "
                                      "with the planted slice: in it, sharing a factor with it, "
                                      "unrelated, or no slice to relate to"),
    ("discovery-calibration", "False-positive rates on the held-out references (null models "
                              "judged as anomalous ones) per half, each beside its nominal "
                              "level, with the baseline its relative scores were measured "
                              "against and their degrees of freedom"),
)
# Table 3's per-model rows as the report shows them (the verdict and what the top finding is)
PER_MODEL_COLUMNS = ("auditor", "family", "model", "statistic", "excess", "p_value", "detected",
                     "top_finding", "top_finding_relation")


def per_model_detections(detections: pd.DataFrame) -> pd.DataFrame:
    """Table 3's rows for the judged models (anomalous and held-out), with the top finding and
    its relation to the planted slice: a detection through something else shows as such."""
    judged = detections[detections["role"] != "reference"]
    return judged[[c for c in PER_MODEL_COLUMNS if c in judged.columns]].reset_index(drop=True)


def example_images(world, conditions: dict[str, str], count: int) -> np.ndarray:
    """uint8 (n, H, W, 3) images of a subgroup."""
    if world.has_generator:
        images = world.generate(conditions, count, EXAMPLE_SEED)
        return images.images.numpy() if hasattr(images.images, "numpy") else images.images
    val = world.split("val")
    chosen = []
    for i in range(len(val)):
        values = world.image_factors(val, i)
        if values and all(values.get(k) == v for k, v in conditions.items()):
            chosen.append(i)
            if len(chosen) == count:
                break
    if not chosen:
        return np.zeros((0, 1, 1, 3), np.uint8)
    loaded = val.load(chosen).permute(0, 2, 3, 1).mul(255).round().clamp(0, 255)
    return loaded.to(dtype=__import__("torch").uint8).numpy()


def discovery_section(results: dict[tuple[str, str], Any], tables: dict[str, pd.DataFrame], world,
                      figure: Callable[[np.ndarray, str, str], str],
                      html_table: Callable[..., str], suite_name: str | None = None) -> str:
    """HTML of the section; ``figure(image, alt, caption)`` and ``html_table`` are the report's."""
    parts = ['<section id="discovery"><h2>Failure discovery (Tables 3 and 4)</h2>',
             html_table(tables["discovery-detection"],
                        caption="Table 3: fraction of each family's models whose auditor's top "
                                "finding is above every reference's"),
             "<details><summary>Table 3 per model: the top finding and whether it involves the "
             "planted slice's factors</summary>"
             + html_table(per_model_detections(tables["discovery-detection-per-model"]),
                          caption="Per-model detection (anomalous and held-out models)")
             + "</details>",
             html_table(tables["discovery-recovery"], float_format="{:.2f}",
                        caption="Table 4: rank of the planted slice (1 = top) in the anomalous "
                                "model's findings and in each reference's, precision@k"),
             *(html_table(tables[name], float_format="{:.2f}", caption=caption)
               for name, caption in OPTIONAL_TABLES if len(tables.get(name, ()))),
             *(f'<p class="warn">{escape(note)}</p>' for note in discovery_notes(
                 tables["discovery-detection-per-model"], tables["discovery-recovery"], suite_name,
                 tables.get("discovery-calibration"))),
             '<p class="note">Top subgroups of each model per auditor (worst first), with '
             f"{EXAMPLES_PER_SUBGROUP} example images of each.</p>"]
    models = list(dict.fromkeys(model for _, model in results))
    auditors = sorted({auditor for auditor, _ in results})
    for model in models:
        parts.append(f"<h3>{escape(model)}</h3>")
        for auditor in auditors:
            objective = AUDITORS.get(auditor).objective
            top = ranked(results[(auditor, model)].findings, objective)[:TOP_SUBGROUPS]
            rows = []
            for position, finding in enumerate(top, start=1):
                images = example_images(world, finding.conditions, EXAMPLES_PER_SUBGROUP)
                figures = "".join(figure(image, f"{model} {auditor} #{position} example {k}",
                                         f"#{position} ex. {k + 1}")
                                  for k, image in enumerate(images))
                rows.append(f"<tr><td>{position}</td><td>{escape(finding.label())}</td>"
                            f'<td class="num">{finding.statistic:.3f} [{finding.low:.3f}, '
                            f"{finding.high:.3f}]</td><td>{figures}</td></tr>")
            parts.append('<div class="table-wrap"><table>'
                         f"<caption>{escape(auditor)} ({escape(objective)})</caption>"
                         "<tr><th>rank</th><th>subgroup</th><th>statistic [95%]</th>"
                         "<th>examples</th></tr>" + "".join(rows) + "</table></div>")
    parts.append(search_section(tables, html_table))
    parts.append("</section>")
    return "\n".join(parts)
