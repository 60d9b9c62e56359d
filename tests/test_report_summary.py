"""The report's opening summary and its colours, checked on tables built here: every sentence is
generated from the tables (a method that detects a family is named as detecting it, a control that
misses it as missing it), Table 1 and Table 2 cells get the verdict colour their value calls for, a
dict is shown as a table, and the discovery notes say when a statistic saturates or a suite has
no slice to rank."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from counteraudit.anomalies.base import FAMILIES
from counteraudit.evaluate.discovery.tables import discovery_notes
from counteraudit.evaluate.reporting.html import (STYLE, VERDICTS, auroc_class, call_class, fraction_class,
                                                  html_table, legend, margin_class, mapping_table,
                                                  verdict_class, versus_class)
from counteraudit.evaluate.reporting.summary import (VERDICT_MARKS, localization_sentences, marked,
                                                     summary_sentences)
from counteraudit.evaluate.reporting.svg import StripRow, strip_plot, text_width
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.evaluate.scoring.detection import NO_LAYER, NULL_FAMILY, margin_text, paper_rule_caution
from counteraudit.evaluate.scoring.localization import (LOCALIZED, WITHIN_CHANCE, localization_call, table2,
                                                        table2_bands)
from counteraudit.evaluate.scoring.verdicts import FINDING_WORDS, family_verdict

TABLE1 = pd.DataFrame({
    "family": ["backdoor", "blurred_faces", "randomized_smoothing", NULL_FAMILY],
    "n_models": [2, 1, 1, 4],
    "gradcam": [0.5, 0.0, 1.0, 0.25],
    "guided_gradcam": [1.0, 1.0, 1.0, 0.0],
    "outputs_only": [0.0, 0.0, 1.0, 0.0]})
LOCALIZATION = pd.DataFrame({
    "method": ["gradcam", "guided_gradcam", "outputs_only", "gradcam", "guided_gradcam", "outputs_only"],
    "model": ["backdoor-a"] * 3 + ["blurred"] * 3,
    "auroc": [0.91, 0.65, 0.96, 0.55, 0.62, 0.80],
    "chance_low": [0.37] * 6, "chance_high": [0.63] * 6})  # p = 40 a side
REFERENCES = 4
CAUTION = ("the paper's rule, not a statistical verdict: a method that sees nothing flags 1 model "
           "in 5")
VERSUS = pd.DataFrame({
    "method": ["gradcam", "guided_gradcam", "gradcam", "guided_gradcam"],
    "model": ["backdoor-a", "backdoor-a", "blurred", "blurred"],
    "delta_auroc": [-0.05, -0.31, 0.25, -0.18],
    "verdict": ["same", "less", "adds", "less"]})


def test_summary_sentences_are_read_off_the_tables():
    topics = summary_sentences(TABLE1, LOCALIZATION, VERSUS, n_references=REFERENCES)
    assert topics == {
        "Detection (Table 1, the paper's rule)": [
            f"backdoor (2 models): detected by guided_gradcam (2/2; {CAUTION}); partly by "
            "gradcam (1/2); the outputs-only control detects 0/2.",
            f"blurred_faces (1 model): detected by guided_gradcam only ({CAUTION}); missed by "
            "gradcam; the outputs-only control misses it.",
            f"randomized_smoothing (1 model): detected by both explanation methods ({CAUTION}); "
            "the outputs-only control detects it too."],
        "Localization (Table 2)": [
            "backdoor-a: localized by 1 of 2 methods (AUROC \u2265 0.7 and above the model's "
            "chance band): gradcam 0.91; the outputs-only control: 0.96.",
            "blurred: localized by no method (AUROC \u2265 0.7 and above the model's chance band); "
            "the best, guided_gradcam, reaches 0.62; the outputs-only control: 0.80."],
        "Beyond the outputs": [
            f"Detection beyond the outputs ({CAUTION}): backdoor (gradcam 1/2, guided_gradcam "
            "2/2; the control 0/2); blurred_faces (guided_gradcam 1/1; the control 0/1).",
            "Localization beyond the outputs (AUROC gained over the control): blurred (gradcam "
            "+0.25); of the other pairs, 1 localize no better and 2 worse than the outputs alone "
            "(paired bootstrap 95% interval of the AUROC difference)."]}
    # the held-out references' row is a false-positive rate, not a defect: never summarised
    assert not any(NULL_FAMILY in line for lines in topics.values() for line in lines)
    # a control that detects everything leaves nothing beyond it; no localizable model: no topic
    control_everywhere = TABLE1.assign(outputs_only=[1.0, 1.0, 1.0, 0.0])
    assert summary_sentences(control_everywhere, n_references=REFERENCES)["Beyond the outputs"] == [
        f"Detection beyond the outputs ({CAUTION}): no explanation method detects any family "
        "more often than the outputs-only control."]
    assert "Localization (Table 2)" not in summary_sentences(control_everywhere,
                                                             n_references=REFERENCES)


def test_table_cells_get_their_verdict_colour_and_dicts_become_tables():
    html = html_table(TABLE1, cell_class=fraction_class,
                      class_columns=["gradcam", "guided_gradcam", "outputs_only"])
    cells = re.findall(r"<td([^>]*)>([^<]*)</td>", html)
    row = cells[:5]  # backdoor: n_models 2 is a count, not a verdict: no colour
    # Table 1 counts by the paper's rule: every model flagged is the rule's colour, not a
    # statistical verdict's; none flagged claims nothing (no power behind it): no colour
    assert row == [("", "backdoor"), (' class="num"', "2"), (' class="num v-partial"', "0.500"),
                   (' class="num v-paper-rule"', "1.000"), (' class="num"', "0.000")]
    bands = pd.DataFrame({"method": "m", "model": "x", "chance_low": [0.34], "chance_high": [0.66]})
    classify = auroc_class(0.7, bands)
    assert [classify({"method": "m"}, "x", v) for v in (0.91, 0.68, 0.5, 0.2, np.nan, "x")] == [
        "v-localized", "v-above-chance", "v-within-chance", "v-below-chance", None, None]
    assert classify({"method": "other"}, "x", 0.91) is None  # a cell without a band
    assert [versus_class(c) for c in ("+0.25 [+0.10, +0.40] adds", "-0.1 [-0.3, 0.1] same",
                                      "-0.3 [-0.5, -0.1] less", "n/a")] == [
        "v-adds", "v-same", "v-less", None]
    details = mapping_table({"most_affected_class": "harmonica",
                             "drops": {"arrow": -0.0068965517, "harmonica": 0.1974683544}},
                            key="detail", value="value")
    assert "{" not in details and "'" not in details  # no Python repr left
    assert "<td>harmonica</td><td class=\"num\">0.197</td>" in details
    assert "<caption>drops</caption>" in details


def test_strip_plot_widens_its_label_column_for_a_long_label():
    row = StripRow("smoothing-sigma0.5", [0.4], "#000")
    svg = strip_plot([row], x_label="x", label_width=110, width=360)
    width, label_x = (float(v) for v in re.search(
        r'<svg width="(\d+)".*?<text x="(\d+)" y="[\d.]+" text-anchor="end">', svg).groups())
    assert label_x >= text_width("smoothing-sigma0.5") and width > 360


def test_discovery_notes_mark_saturated_statistics_and_a_suite_without_slices():
    detections = pd.DataFrame({
        "auditor": ["twise", "twise", "error_ratio"], "model": ["m1", "m2", "m1"],
        "role": "anomalous", "max_reference": [0.999, 0.999, 2.0], "margin": [1.001, 0.9, 3.0],
        "detected": [True, False, True], "saturated": [True, True, False]})
    recovery = pd.DataFrame({"auditor": "twise", "model": ["m1", "m2"],
                             "family": ["backdoor", "spurious"],
                             "status": ["not expressible", "not expressible"]})
    saturated, no_slice = discovery_notes(detections, recovery, "quick")
    assert saturated.startswith("SATURATED: twise's statistic is at most 1") and "error_ratio" not in saturated
    assert "m1 yes at margin 1.001" in saturated and "m2 no at margin 0.900" in saturated
    assert no_slice.startswith("The quick suite has no localizable model") and "backdoor" in no_slice
    ranked = recovery.assign(status=["ranked", "not expressible"])
    assert discovery_notes(detections.assign(saturated=False), ranked, "demo") == []
    assert to_markdown(pd.DataFrame()) == "(empty table)\n"


def test_discovery_notes_name_an_auditor_that_flags_clean_checking_models_beyond_its_level():
    detections = pd.DataFrame({"auditor": ["twise"], "model": ["m1"], "role": "anomalous",
                               "max_reference": [2.0], "margin": [1.5], "detected": [True],
                               "saturated": [False]})
    recovery = pd.DataFrame({"auditor": "twise", "model": ["m1"], "family": ["planted_slice"],
                             "status": ["ranked"]})
    calibration = calibration_frame_rows([("surrogate_search", 4, 4, 0), ("twise", 4, 1, 0),
                                          ("error_ratio", 8, 1, 3)])
    notes = discovery_notes(detections, recovery, "slices", calibration)
    assert len(notes) == 2, notes  # 4 of 4 at nominal 1/6; 3 of 8 significant at nominal 0.05
    assert notes[0].startswith("MISCALIBRATED: surrogate_search flags 4 of 4 clean checking models "
                               "by Table 3's rule (above every reference), nominal 0.167, 95% "
                               "interval 0.51-1.00")
    assert notes[1].startswith("MISCALIBRATED: error_ratio flags 3 of 8 clean checking models by a "
                               "significant finding, nominal 0.050")
    # 1 of 4 (twise) is within its interval; the fitting half is never judged here
    assert not any("twise" in note for note in notes)
    fitting = calibration.assign(design="fitting half")
    assert discovery_notes(detections, recovery, "slices", fitting) == []


def calibration_frame_rows(rows: list[tuple[str, int, int, int]]) -> pd.DataFrame:
    """discovery-calibration's checking-half rows: (auditor, models, Table 3 flags, significant)."""
    out = []
    for auditor, n, flagged, significant in rows:
        row = {"auditor": auditor, "design": "checking half", "held_out": n,
               "table3_false_positives": flagged, "table3_nominal": 1 / 6,
               "any_significant": significant, "any_significant_nominal": 0.05}
        for test, hits in (("table3", flagged), ("any_significant", significant)):
            low, high = proportion_confint(hits, n, alpha=0.05, method="wilson")
            row.update({f"{test}_low": low, f"{test}_high": high})
        out.append(row)
    return pd.DataFrame(out)


def test_sanity_check_families_name_the_methods_that_miss_them():
    """A method that misses a model which learnt nothing does not depend on the model: the
    summary names it, for the families the registry marks as sanity checks."""
    table1 = pd.DataFrame({"family": ["cascading_randomization", "permuted_labels", "backdoor"],
                           "n_models": [2, 1, 1], "saliency": [1.0, 1.0, 0.0],
                           "random_map": [0.5, 0.0, 0.0], "outputs_only": [1.0, 1.0, 0.0]})
    sanity = [name for name in FAMILIES.names() if FAMILIES.get(name).sanity_check]
    assert sorted(sanity) == ["cascading_randomization", "permuted_labels"]
    topics = summary_sentences(table1, sanity_families=sanity, n_references=REFERENCES)
    assert topics["Sanity checks (Adebayo et al. 2018)"] == [
        "cascading_randomization: missed by random_map, which therefore do not depend on the model "
        "enough to tell it from one that learnt nothing.",
        "permuted_labels: missed by random_map, which therefore do not depend on the model enough "
        "to tell it from one that learnt nothing."]
    assert "Sanity checks (Adebayo et al. 2018)" not in summary_sentences(
        table1, n_references=REFERENCES)


def test_printed_margins_are_coloured_by_their_verdict():
    """The report's margin table holds margin_text's strings: the colour follows the verdict,
    also where the digits alone cannot show it."""
    for margin, detected in [(1.0004, True), (0.9996, False), (1.0, True), (1.0, False), (1.3, True)]:
        assert margin_class(margin_text(margin, detected)) == (
            "v-paper-rule" if detected else None)
    assert margin_class(margin_text(float("nan"), False)) is None


# The quick suite's shape: 3 references, one model per family, the paper's rule only
QUICK_TABLE1 = pd.DataFrame({
    "family": ["randomized_smoothing", "backdoor", "spurious"], "n_models": [1, 1, 1],
    "guided_backprop": [1.0, 0.0, 1.0], "integrated_gradients": [1.0, 0.0, 0.0],
    "gradcam": [1.0, 0.0, 0.0], "guided_gradcam": [1.0, 0.0, 1.0], "caricature": [0.0, 0.0, 0.0],
    "outputs_only": [1.0, 0.0, 0.0]})


def test_without_null_models_every_detection_says_it_is_the_papers_rule_with_its_n():
    """A method that sees nothing flags 1 model in n+1: with the quick suite's 3 references, 1 in
    4. Every sentence that says a method or the control detects carries that caution, with the
    suite's own n."""
    for references in (3, 11):
        topics = summary_sentences(QUICK_TABLE1, n_references=references)
        lines = [line for lines in topics.values() for line in lines]
        claims = [line for line in lines if re.search(r"\bdetect(ed|s|ion)?\b", line, re.I)]
        assert len(claims) == 3  # two families detected, and detection beyond the outputs
        caution = paper_rule_caution(references)
        assert caution.endswith(f"flags 1 model in {references + 1}")
        for line in claims:
            assert caution in line, line
        # the caution sits beside the claim, before anything the sentence goes on to say
        smoothing = next(line for line in lines if line.startswith("randomized_smoothing"))
        assert smoothing.index(caution) < smoothing.index("missed by")
        # a family no one detects claims nothing: no caution
        assert next(line for line in lines if line.startswith("backdoor")) == (
            "backdoor (1 model): missed by every explanation method; the outputs-only control "
            "misses it.")


def test_an_auroc_above_the_papers_mark_but_within_its_models_chance_band_is_not_localized():
    """guided backprop's 0.74 on the quick backdoor, whose chance band is [0.24, 0.75] (p = 10 a
    side), cannot be told from chance: not localized, said with its band. The same 0.74 on a
    model with p = 40's narrower band is localized: each cell reads its own model's band, in
    the sentences and in Table 2's colours."""
    assert localization_call(0.74, 0.24, 0.75) == WITHIN_CHANCE
    assert localization_call(0.74, 0.37, 0.63) == LOCALIZED
    per_model = pd.DataFrame({
        "method": ["guided_backprop", "gradcam", "guided_backprop", "gradcam"],
        "model": ["backdoor-small", "backdoor-small", "backdoor-large", "backdoor-large"],
        "auroc": [0.74, 0.94, 0.74, 0.55],
        "chance_low": [0.24, 0.24, 0.37, 0.37], "chance_high": [0.75, 0.75, 0.63, 0.63]})
    small, large = localization_sentences(per_model)
    assert small == ("backdoor-small: localized by 1 of 2 methods (AUROC \u2265 0.7 and above the "
                     "model's chance band): gradcam 0.94; not localized: guided_backprop 0.74, "
                     "within its chance band [0.24, 0.75].")
    assert large.startswith("backdoor-large: localized by 1 of 2 methods") and \
        "guided_backprop 0.74" in large and "within" not in large
    # Table 2's cells: each model's own band, not one band (the median) for every column
    wide = table2(per_model.assign(layer=NO_LAYER))
    html = html_table(wide, cell_class_at=auroc_class(
        0.7, table2_bands(per_model, per_model.iloc[:0].assign(layer=NO_LAYER))),
        class_columns=["backdoor-small", "backdoor-large"])
    assert list(wide.columns) == ["method", "backdoor-small", "backdoor-large"]
    assert list(wide["method"]) == ["guided_backprop", "gradcam"]
    cells = re.findall(r'<td class="num ([^"]+)">([^<]+)</td>', html)  # row by row
    assert cells == [("v-within-chance", "0.740"), ("v-localized", "0.740"),
                     ("v-localized", "0.940"), ("v-within-chance", "0.550")]


def _failure_colours() -> set[str]:
    """The colours the style sheet gives a run's failures (.fail, .warn)."""
    return set(re.findall(r"\.(?:fail|warn) \{[^}]*color: (#\w+)", STYLE))


def _style_of(name: str) -> str:
    """Every declaration of the style sheet's rules that name class ``name``."""
    return " ".join(body for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", STYLE)
                    if re.search(rf"\.{name}\b", selectors))


def test_a_detected_cell_is_coloured_by_its_verdict_never_as_a_failure():
    failures = _failure_colours()
    assert failures  # the sheet still marks failures in red
    detected = {
        "Table 1": fraction_class(1.0), "margin": margin_class(margin_text(1.2, True)),
        "verdict": verdict_class("0.80 [0.44, 0.97] detected (paper 0.60)"),
        "Table 2": call_class(localization_call(0.9, 0.37, 0.63))}
    assert detected == {"Table 1": "v-paper-rule", "margin": "v-paper-rule",
                        "verdict": "v-detected", "Table 2": "v-localized"}
    for where, name in detected.items():
        assert name not in ("fail", "warn"), where
        style = _style_of(name)
        assert style and not any(colour in style for colour in failures), (where, style)
    # every verdict colour has its legend text, and none is a failure's colour
    for name in VERDICTS:
        assert _style_of(name) and not any(c in _style_of(name) for c in failures), name
    assert 'class="v-paper-rule"' in legend("v-paper-rule")


def _families(counts: dict[tuple[str, str], tuple[int, int, int]], test: str = "huber",
              alpha: float = 0.05, power: float = 0.8) -> pd.DataFrame:
    """The family verdicts table for (family, method) -> (detected, not detected, models), the
    rate's interval and verdict by the verdict rule itself."""
    rows = []
    for (family, method), (found, missed, models) in counts.items():
        low, high, verdict = family_verdict(found, missed, models, alpha=alpha, power=power)
        rows.append({"family": family, "method": method, "n_models": models, "rate": found / models,
                     "ci_low": low, "ci_high": high, "verdict": verdict, "test": test,
                     "paper_rate": 1.0, "fragile": False})
    return pd.DataFrame(rows)


VERDICT_FAMILIES = _families({
    ("spurious", "gradcam"): (8, 0, 10), ("spurious", "guided_backprop"): (0, 2, 10),
    ("spurious", "outputs_only"): (10, 0, 10),
    ("blurred_faces", "gradcam"): (0, 4, 5), ("blurred_faces", "guided_backprop"): (3, 0, 5),
    ("blurred_faces", "outputs_only"): (1, 0, 5)})


def test_with_null_models_the_detection_sentences_follow_the_verdicts_and_name_the_test():
    """Table 1 by the paper's rule says guided_backprop detects every family; the verdicts say
    otherwise, and the summary follows the verdicts: each method named under its own verdict,
    with its rate and interval, the test named, no paper's-rule caution."""
    table1 = pd.DataFrame({"family": ["spurious", "blurred_faces"], "n_models": [10, 5],
                           "gradcam": [1.0, 0.0], "guided_backprop": [1.0, 1.0],
                           "outputs_only": [1.0, 0.2]})
    topics = summary_sentences(table1, n_references=12, families=VERDICT_FAMILIES)
    assert "Detection (verdicts of the huber test)" in topics
    assert "Detection (Table 1, the paper's rule)" not in topics
    lines = topics["Detection (verdicts of the huber test)"]
    assert [line.split(" (")[0] for line in lines] == ["spurious", "blurred_faces"]
    words = {"detected": "detected by", "not detected": "missed with power by",
             "inconclusive": "undecidable at this scale for"}
    for line, (family, rows) in zip(lines, VERDICT_FAMILIES.groupby("family", sort=False)):
        assert paper_rule_caution(12) not in line
        for row in rows.itertuples(index=False):
            rate = f"{row.rate:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}]"
            said = f"{row.method} {rate}"
            if row.method == "outputs_only":
                assert f"the outputs-only control: {FINDING_WORDS[row.verdict]} {rate}" in line
            else:  # the method sits in its verdict's clause
                clause = next(part for part in line.split("; ") if said in part)
                assert words[row.verdict] in clause, (line, row)
    # guided_backprop detects spurious by the paper's rule (1.0) but its verdict is no detection
    spurious = lines[0]
    assert "detected by gradcam" in spurious and "detected by guided_backprop" not in spurious
    assert topics["Beyond the outputs"] == [
        "Detection beyond the outputs (verdicts of the huber test): blurred_faces "
        f"(guided_backprop {VERDICT_FAMILIES.iloc[4]['rate']:.2f} "
        f"[{VERDICT_FAMILIES.iloc[4]['ci_low']:.2f}, {VERDICT_FAMILIES.iloc[4]['ci_high']:.2f}]; "
        "the control undecidable at this scale)."]
    # in the report, each verdict's words carry its colour
    html = marked(spurious, VERDICT_MARKS)
    assert '<span class="v-detected">detected by</span> gradcam' in html
    assert '<span class="v-inconclusive">undecidable at this scale for</span>' in html
    assert 'control: <span class="v-detected">detected</span> 1.00' in html
