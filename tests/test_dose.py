"""Dose-response sweeps (issue 17): [[sweeps]] expand into models that differ only in the swept
strength, bad sweeps fail with one clear error, and evaluate/studies/dose_response.py's tables and
thresholds are right on constructed score tables."""
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.base import strength_families
from counteraudit.anomalies.families.missing_class import MissingClass
from counteraudit.evaluate.reporting.dose import dose_section
from counteraudit.evaluate.reporting.html import html_table
from counteraudit.evaluate.studies.dose_response import dose_table, sweep_table, threshold_text, thresholds
from counteraudit.train.core.suite import load_suite
from tests.conftest import write_suite

SWEEPS = """
[[sweeps]]
family = "backdoor"
values = [0.01, 0.05, 0.3]
params = { target = 2, pattern = "square" }

[[sweeps]]
family = "missing_class"
name = "missing-star"
values = [0.5, 1.0]
params = { class_id = "star" }
"""


def differing_paths(a, b, prefix=()):
    """The paths (tuples of keys) at which two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b), key=str)
                for p in differing_paths(a.get(k), b.get(k), (*prefix, k))]
    return [] if a == b else [prefix]


def test_a_sweep_expands_into_models_whose_keys_differ_only_in_the_swept_value(tmp_path):
    suite = load_suite(write_suite(tmp_path / "sweep.toml", SWEEPS))
    backdoor, missing = suite.sweeps
    assert backdoor.parameter == "nu" and backdoor.values == (0.01, 0.05, 0.3)
    assert list(backdoor.models) == ["backdoor-nu0.01", "backdoor-nu0.05", "backdoor-nu0.3"]
    specs = [suite.model(name) for name in backdoor.models]
    assert len({s.key for s in specs}) == 3  # three models, not one stored three times
    for spec, value in zip(specs, backdoor.values):
        assert spec.params["nu"] == value
        assert spec.params["target"] == 2 and spec.params["pattern"] == "square"  # base params
    for other in specs[1:]:
        assert differing_paths(specs[0].identity(), other.identity()) == [("params", "nu")]
    # the whole class (1.0, the default) is left out of the key, so it is the key of the
    # missing_class model every suite trained before the parameter existed
    half, whole = (suite.model(name) for name in missing.models)
    assert differing_paths(half.identity(), whole.identity()) == [("params", "removed_fraction")]
    plain = load_suite(write_suite(tmp_path / "plain.toml", f"""
[[anomalies]]
name = "missing-star"
family = "missing_class"
seed = {whole.seed}
params = {{ class_id = "star" }}
"""))
    assert plain.model("missing-star").key == whole.key


@pytest.mark.parametrize("body, message", [
    ('family = "backdoor"\nvalues = [0.1]', r"values = \[0\.1\] must hold at least 2 items"),
    ('family = "backdoor"\nvalues = 0.1', r"values = 0\.1 must be a list"),
    ('family = "backdoor"\nvalues = [0.1, 0.1]', r"repeat a value"),
    ('family = "backdoor"\nvalues = [0.1, 0.2]\nparams = { nu = 0.3 }', r"set nu=0\.3, the swept"),
    ('family = "backdoor"\nvalues = [0.1, 2.0]', r"nu"),  # a value the family itself rejects
    ('family = "bakdoor"\nvalues = [0.1, 0.2]', r"unknown anomaly family 'bakdoor'.*backdoor"),
])
def test_bad_sweeps_fail_with_one_clear_error(tmp_path, body, message):
    with pytest.raises(ValueError, match=message):
        load_suite(write_suite(tmp_path / "bad.toml", f"[[sweeps]]\n{body}\n"))


def test_a_family_without_a_strength_parameter_cannot_be_swept_and_the_error_lists_those_that_can(tmp_path):
    assert FAMILIES.get("shape_bias").strength is None
    with pytest.raises(ValueError) as error:
        load_suite(write_suite(tmp_path / "bad.toml",
                               '[[sweeps]]\nfamily = "shape_bias"\nvalues = [1, 2]\n'))
    text = str(error.value)
    assert "'shape_bias' has no strength parameter" in text
    for family, parameter in strength_families().items():
        assert f"{family}: {parameter}" in text


@pytest.mark.parametrize("family", [f for f in FAMILIES if FAMILIES.get(f).strength is not None])
def test_every_strength_parameter_is_a_field_of_its_family_params(family):
    cls = FAMILIES.get(family)
    assert cls.strength in cls.Params.__dataclass_fields__


def test_removed_fraction_removes_a_nested_seeded_share_of_the_class():
    labels = np.repeat(np.arange(4), 50)
    split = SimpleNamespace(labels=labels, subset=lambda idx: np.asarray(idx))
    world = SimpleNamespace(class_names=["a", "b", "c", "d"], num_classes=4)
    kept = {f: MissingClass({"class_id": 1, "removed_fraction": f}, world, seed=7).training_split(split)
            for f in (0.5, 0.9, 1.0)}
    for fraction, indices in kept.items():
        assert (labels[indices] == 1).sum() == 50 - round(50 * fraction)
        assert (labels[indices] != 1).sum() == 150  # other classes untouched
    assert set(kept[0.9]) < set(kept[0.5])  # a larger share removes a superset
    whole = MissingClass({"class_id": 1}, world, seed=7).training_split(split)
    assert np.array_equal(whole, np.flatnonzero(labels != 1))  # the old behaviour, exactly
    with pytest.raises(ValueError, match=r"removed_fraction=0 must be in \(0, 1\]"):
        MissingClass.validate_params({"removed_fraction": 0})


# ---------------------------------------------------------------- tables and thresholds
def constructed(margins: dict[str, list[float]], aurocs: dict[str, list[tuple]] | None = None):
    """A two-method sweep over strengths 0.01, 0.1, 0.3 (models m0..m2) with given margins and
    (auroc, low, high) per method; detected = margin > 1."""
    sweep = SimpleNamespace(name="backdoor-nu", family="backdoor", parameter="nu",
                            values=(0.01, 0.1, 0.3), models=("m0", "m1", "m2"))
    detection = pd.DataFrame([{"method": method, "model": f"m{i}", "margin": m,
                               "detected": m > 1} for method, values in margins.items()
                              for i, m in enumerate(values)])
    localization = None if aurocs is None else pd.DataFrame(
        [{"method": method, "model": f"m{i}", "auroc": a, "ci_low": lo, "ci_high": hi}
         for method, values in aurocs.items() for i, (a, lo, hi) in enumerate(values)])
    implants = {f"m{i}": {"passed": rate >= 0.9, "figures": {"attack_success_rate": rate},
                          "reference_figures": [{"attack_success_rate": 0.1},
                                                {"attack_success_rate": 0.2}]}
                for i, rate in enumerate([0.3, 0.95, 1.0])}
    return [sweep], detection, localization, implants


def test_thresholds_name_the_weakest_strength_detected_and_flag_a_non_monotone_curve():
    dose = dose_table(*constructed(
        {"a": [0.9, 1.2, 1.5], "b": [1.1, 0.95, 1.3], "c": [0.5, 0.8, 0.99]},
        {"a": [(0.6, 0.45, 0.75), (0.8, 0.62, 0.9), (0.95, 0.9, 1.0)],
         "b": [(0.5, 0.3, 0.7)] * 3, "c": [(0.7, 0.55, 0.8), (0.5, 0.4, 0.6), (0.9, 0.8, 1)]}))
    limits = thresholds(dose).set_index("method")
    assert limits.loc["a", "detection_threshold"] == 0.1 and limits.loc["a", "detection_monotone"]
    assert limits.loc["b", "detection_threshold"] == 0.01 and not limits.loc["b", "detection_monotone"]
    assert limits.loc["c", "detection_threshold"] == np.inf  # no strength detected
    assert limits.loc["a", "localization_threshold"] == 0.1
    assert limits.loc["b", "localization_threshold"] == np.inf
    assert limits.loc["c", "localization_threshold"] == 0.01
    assert not limits.loc["c", "localization_monotone"]
    assert [threshold_text(limits.loc[m, "detection_threshold"], limits.loc[m, "detection_monotone"])
            for m in "abc"] == ["0.1", "0.01 (not monotone)", "none"]
    # the implant figure is the one the family's verdict reads, beside the references' mean
    row = dose[(dose["model"] == "m1") & (dose["method"] == "a")].iloc[0]
    assert row["implant_figure"] == "attack_success_rate" and row["implant_value"] == 0.95
    assert row["implant_reference"] == pytest.approx(0.15) and row["implant_passed"]
    table = sweep_table(dose, "backdoor-nu")
    assert list(table["nu"]) == ["0.01", "0.1", "0.3"]
    assert list(table["margin b"]) == ["1.10*", "0.95", "1.30*"]
    assert list(table["AUROC a"])[1] == "0.80 [0.62, 0.90]"
    assert list(table["took"]) == ["NO", "yes", "yes"]


def test_a_sweep_without_localization_has_no_localization_threshold_and_a_missing_row_is_named():
    sweeps, detection, _, implants = constructed({"a": [0.9, 1.2, 1.5]})
    limits = thresholds(dose_table(sweeps, detection, None, implants))
    assert np.isnan(limits.loc[0, "localization_threshold"])
    assert threshold_text(limits.loc[0, "localization_threshold"], np.nan) == "n/a"
    with pytest.raises(KeyError, match=r"no row for model 'm2' and method 'a'"):
        dose_table(sweeps, detection[detection["model"] != "m2"], None, implants)


def test_the_report_panel_draws_each_curve_once_per_method():
    dose = dose_table(*constructed({"a": [0.9, 1.2, 1.5], "b": [1.1, 0.95, 1.3]},
                                   {"a": [(0.6, 0.45, 0.75)] * 3, "b": [(0.5, 0.3, 0.7)] * 3}))
    html = dose_section(dose, thresholds(dose), html_table)
    assert html.count("<svg") == 3  # implant figure, margins, AUROCs
    # implant: model + references; margins: a, b; AUROC: a, b (each with its band)
    assert html.count("<polyline") == 6 and html.count("<polygon") == 2
    assert "(log scale)" in html  # 0.01 .. 0.3 spans 30x
    assert re.search(r"<td>b</td><td>0.01 \(not monotone\)</td>", html)
