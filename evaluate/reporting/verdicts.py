"""The report's verdicts section: what the run found under the powered test (Table 1 with rates,
exact intervals and coloured verdicts, one sentence per family), each method's power, and the
null tests' calibration on the checking held-out references."""
from __future__ import annotations

from html import escape

from counteraudit.evaluate.reporting.html import html_table, verdict_class
from counteraudit.evaluate.scoring.stability import OUTLYING_DISTANCE
from counteraudit.evaluate.scoring.verdicts import findings

SECTION_ID = "verdicts"
TITLE = "Verdicts (null p-values)"


def verdict_section(report) -> str:
    """The section, or "" when the suite asked for no null p-values."""
    if report.optional_table("detection-verdicts") is None:
        return ""
    alpha, power = report.suite.evaluate.alpha, report.suite.evaluate.power
    where = f"{report.distance_name}; {len(report.references)} references"
    families = report.table("detection-families")
    plan = report.table("detection-power")
    calibration = report.table("detection-calibration")
    per_model = report.table("detection-verdicts-per-model")
    k = int(plan["k"].iloc[0]) if len(plan) else 0
    test = plan["test"].iloc[0] if "test" in plan and len(plan) else "null"
    sentences = "".join(f"<li>{escape(line)}</li>" for line in findings(families))
    parts = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>',
             f"<p><b>What this run found</b> (each family's verdict per method):</p><ul>{sentences}</ul>",
             html_table(report.table("detection-verdicts"), cell_class=verdict_class, caption=(
                 f"Table 1 with verdicts under the {test} test: detection rate over each "
                 f"family's models, exact 95% interval, verdict, and the paper's rule over the "
                 f"same models ({where})")),
             *([html_table(report.table("detection-verdicts-configurations"),
                           cell_class=verdict_class,
                           caption=f"The same per configuration, its replicates only ({where})")]
               if len(report.table("detection-verdicts-configurations"))
               > len(report.table("detection-verdicts")) else []),
             f'<p class="note">A model is <b>detected</b> when its p-value against {k} held-out '
             f"clean models (Benjamini-Hochberg adjusted over the table's cells) is at most "
             f"{alpha}; <b>not detected</b> when it lies significantly below the Abar the method "
             f"detects with probability {power} (its power level, below); <b>inconclusive</b> "
             f"otherwise. A family is detected when its rate's interval starts above {alpha}, not "
             f"detected (missed with power) when most of its models are not detected and the "
             f"interval ends below {power}, inconclusive otherwise (undecidable at this scale). "
             "Models whose implant failed are left out. A verdict marked <b>fragile</b> changes "
             "when one model is left out (each fitting null in turn, and each replicate of a "
             "configuration); the long table's flipped_by names it.</p>",
             html_table(plan, caption=(
                 f"Each method's null population (log Abar of the fitting held-out references) "
                 f"and power: power_level is the Abar detected with probability {power}, "
                 f"power_level_margin the same over the references' highest Abar ({where})"))]
    if len(calibration):
        parts.append(html_table(calibration, caption=(
            f"Calibration: clean held-out models tested against nulls they were not fitted to "
            f"(halves: checking against fitting, and swapped; leave-one-out: each against all "
            f"the others); the share with p <= {alpha} is the test's false-positive rate, exact "
            f"95% interval; ks_p tests the p-values against uniform ({where})")))
    outlying = report.optional_table("detection-outlying-nulls")
    if outlying is not None:
        far = outlying[outlying["outlying_in"] != ""]
        parts.append(html_table(far, caption=(
            f"Held-out clean models more than {OUTLYING_DISTANCE} robust SDs of log Abar from "
            f"the others (Huber's fit of the rest), with their validation accuracy and the family "
            f"verdicts leaving them out of the fit flips ({where})"))
            if len(far) else
            f'<p class="note">No held-out clean model lies more than {OUTLYING_DISTANCE} robust '
            "SDs of log Abar from the others for any method.</p>")
    parts.append("<details><summary>Per-model verdicts (every test's p-value)</summary>"
                 + html_table(per_model, cell_class=verdict_class,
                              caption=f"Per-model verdicts ({where})") + "</details>")
    return "\n".join(parts) + "</section>"
