"""The report's opening summary and its colours, checked on tables built here: every sentence is
generated from the tables (a method that detects a family is named as detecting it, a control that
misses it as missing it), Table 1 and Table 2 cells get the verdict colour their value calls for, a
dict is shown as a table, and the discovery notes say when a statistic saturates or a suite has
no slice to rank."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from counteraudit.anomalies.base import FAMILIES
from counteraudit.evaluate.discovery.tables import discovery_notes
from counteraudit.evaluate.reporting.html import (auroc_class, fraction_class, html_table, margin_class, mapping_table,
                                                  versus_class)
from counteraudit.evaluate.reporting.summary import summary_sentences
from counteraudit.evaluate.reporting.svg import StripRow, strip_plot, text_width
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.evaluate.scoring.detection import NULL_FAMILY, margin_text

TABLE1 = pd.DataFrame({
    "family": ["backdoor", "blurred_faces", "randomized_smoothing", NULL_FAMILY],
    "n_models": [2, 1, 1, 4],
    "gradcam": [0.5, 0.0, 1.0, 0.25],
    "guided_gradcam": [1.0, 1.0, 1.0, 0.0],
    "outputs_only": [0.0, 0.0, 1.0, 0.0]})
LOCALIZATION = pd.DataFrame({
    "method": ["gradcam", "guided_gradcam", "outputs_only", "gradcam", "guided_gradcam", "outputs_only"],
    "model": ["backdoor-a"] * 3 + ["blurred"] * 3,
    "auroc": [0.91, 0.65, 0.96, 0.55, 0.62, 0.80]})
VERSUS = pd.DataFrame({
    "method": ["gradcam", "guided_gradcam", "gradcam", "guided_gradcam"],
    "model": ["backdoor-a", "backdoor-a", "blurred", "blurred"],
    "delta_auroc": [-0.05, -0.31, 0.25, -0.18],
    "verdict": ["same", "less", "adds", "less"]})


def test_summary_sentences_are_read_off_the_tables():
    topics = summary_sentences(TABLE1, LOCALIZATION, VERSUS)
    assert topics == {
        "Detection (Table 1)": [
            "backdoor (2 models): detected by guided_gradcam (2/2); partly by gradcam (1/2); "
            "the outputs-only control detects 0/2.",
            "blurred_faces (1 model): detected by guided_gradcam only; missed by gradcam; "
            "the outputs-only control misses it.",
            "randomized_smoothing (1 model): detected by both explanation methods; "
            "the outputs-only control detects it too."],
        "Localization (Table 2)": [
            "backdoor-a: localized by 1 of 2 methods (AUROC \u2265 0.7): gradcam 0.91; "
            "the outputs-only control: 0.96.",
            "blurred: localized by no method (AUROC \u2265 0.7); the best, guided_gradcam, "
            "reaches 0.62; the outputs-only control: 0.80."],
        "Beyond the outputs": [
            "Detection beyond the outputs: backdoor (gradcam 1/2, guided_gradcam 2/2; the control "
            "0/2); blurred_faces (guided_gradcam 1/1; the control 0/1).",
            "Localization beyond the outputs (AUROC gained over the control): blurred (gradcam "
            "+0.25); of the other pairs, 1 localize no better and 2 worse than the outputs alone "
            "(paired bootstrap 95% interval of the AUROC difference)."]}
    # the held-out references' row is a false-positive rate, not a defect: never summarised
    assert not any(NULL_FAMILY in line for lines in topics.values() for line in lines)
    # a control that detects everything leaves nothing beyond it; no localizable model: no topic
    control_everywhere = TABLE1.assign(outputs_only=[1.0, 1.0, 1.0, 0.0])
    assert summary_sentences(control_everywhere)["Beyond the outputs"] == [
        "Detection beyond the outputs: no explanation method detects any family more often "
        "than the outputs-only control."]
    assert "Localization (Table 2)" not in summary_sentences(control_everywhere)


def test_table_cells_get_their_verdict_colour_and_dicts_become_tables():
    html = html_table(TABLE1, cell_class=fraction_class,
                      class_columns=["gradcam", "guided_gradcam", "outputs_only"])
    cells = re.findall(r"<td([^>]*)>([^<]*)</td>", html)
    row = cells[:5]  # backdoor: n_models 2 is a count, not a verdict: no colour
    assert row == [("", "backdoor"), (' class="num"', "2"), (' class="num v-partial"', "0.500"),
                   (' class="num v-detected"', "1.000"), (' class="num v-not-detected"', "0.000")]
    classify = auroc_class(0.7, chance_high=0.66)
    assert [classify(v) for v in (0.91, 0.68, 0.5, np.nan, "x")] == [
        "v-localized", "v-above-chance", "v-not-localized", None, None]
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


def test_sanity_check_families_name_the_methods_that_miss_them():
    """A method that misses a model which learnt nothing does not depend on the model: the
    summary names it, for the families the registry marks as sanity checks."""
    table1 = pd.DataFrame({"family": ["cascading_randomization", "permuted_labels", "backdoor"],
                           "n_models": [2, 1, 1], "saliency": [1.0, 1.0, 0.0],
                           "random_map": [0.5, 0.0, 0.0], "outputs_only": [1.0, 1.0, 0.0]})
    sanity = [name for name in FAMILIES.names() if FAMILIES.get(name).sanity_check]
    assert sorted(sanity) == ["cascading_randomization", "permuted_labels"]
    topics = summary_sentences(table1, sanity_families=sanity)
    assert topics["Sanity checks (Adebayo et al. 2018)"] == [
        "cascading_randomization: missed by random_map, which therefore do not depend on the model "
        "enough to tell it from one that learnt nothing.",
        "permuted_labels: missed by random_map, which therefore do not depend on the model enough "
        "to tell it from one that learnt nothing."]
    assert "Sanity checks (Adebayo et al. 2018)" not in summary_sentences(table1)


def test_printed_margins_are_coloured_by_their_verdict():
    """The report's margin table holds margin_text's strings: the colour follows the verdict,
    also where the digits alone cannot show it."""
    for margin, detected in [(1.0004, True), (0.9996, False), (1.0, True), (1.0, False), (1.3, True)]:
        assert margin_class(margin_text(margin, detected)) == (
            "v-detected" if detected else "v-not-detected")
    assert margin_class(margin_text(float("nan"), False)) is None
