"""evaluate/sensitivity.py: each protocol choice sets only its parameter, the alternatives re-explain
only what they change, verdict changes are marked, and the whole run on a finished suite agrees
with the main job run on the derived suite file. The per-choice tests are generated from the
registry, so a new choice is tested without a new test."""
import dataclasses
import re

import pandas as pd
import pytest

from counteraudit.evaluate.studies.protocol_choices import PROTOCOL_CHOICES
from counteraudit.evaluate.studies.sensitivity import Variant, compare, plan_variants
from counteraudit.explain.base import METHODS
from counteraudit.explain.settings import method_specs, suite_method
from counteraudit.train.core.registry import UnknownNameError
from counteraudit.train.core.suite import load_suite, write_derived_suite
from tests.conftest import ONE_PROCESS, run_in_process

ALL_METHODS = METHODS.names()


def _params(suite, method):
    return suite_method(suite, method).params


@pytest.mark.parametrize("choice_name", PROTOCOL_CHOICES.names())
def test_each_option_sets_its_parameter_on_its_methods_and_nothing_else(choice_name, tmp_path):
    choice = PROTOCOL_CHOICES.get(choice_name)
    base = load_suite("demo")
    applicable = choice.applicable(ALL_METHODS, base)
    assert applicable, f"{choice_name}: no registered method has the parameter {choice.parameter!r}"
    for value in choice.options:
        # every registered method run, so the suite may set any method's parameters
        patch = {**choice.patch(base, ALL_METHODS, value), "explain": {"methods": ALL_METHODS}}
        derived = write_derived_suite(base, f"demo-{choice_name}-{value}", patch,
                                      tmp_path / f"{value}.toml")
        along = choice.along(value, base) if choice.along else {}
        assert derived.models == base.models  # the same trained models, shared by key
        for method in ALL_METHODS:
            before, after = _params(base, method), _params(derived, method)
            if method in applicable:
                assert choice.value_of(derived, method) == value
                if choice.within is not None:  # a renderer option: its other options kept
                    assert {**getattr(before, choice.within), choice.parameter: value} == getattr(
                        after, choice.within)
                    after = dataclasses.replace(after, **{choice.within: getattr(before, choice.within)})
                    assert after == before, f"{choice_name}={value} changed {method}'s other parameters"
                    continue
                default = type(after)()
                for name, setting in along.items():  # set along with the value, or back to the default
                    assert getattr(after, name) == (getattr(default, name) if setting is None else setting)
                after = dataclasses.replace(after, **{name: getattr(before, name)
                                                      for name in (choice.parameter, *along)})
            assert after == before, f"{choice_name}={value} changed {method}'s other parameters"


def test_plan_runs_the_alternatives_only_on_the_methods_they_change(tmp_path):
    suite = load_suite("demo")
    methods = list(method_specs(suite))
    variants, skipped = plan_variants(suite, methods, None, tmp_path)
    assert not skipped  # the demo runs every kind of method
    for choice_name in PROTOCOL_CHOICES.names():
        choice = PROTOCOL_CHOICES.get(choice_name)
        own = choice.current(suite, methods)
        values = [v.value for v in variants if v.choice == choice_name]
        assert own not in values and sorted(values, key=str) == sorted(
            (o for o in choice.options if o != own), key=str)
        for variant in (v for v in variants if v.choice == choice_name):
            # a changed parameter changes the result's key for exactly the methods that have it
            assert variant.methods == choice.applicable(methods, suite)
            assert variant.suite.path.parent == suite.root(tmp_path) / "sensitivity"


def test_unknown_choice_lists_the_valid_ones(tmp_path):
    suite = load_suite("demo")
    with pytest.raises(UnknownNameError, match="ig_baseline") as error:
        plan_variants(suite, list(method_specs(suite)), ["ig-baseline"], tmp_path)
    assert "'ig-baseline'" in str(error.value)


def test_compare_marks_exactly_the_changed_verdicts():
    def detection(margins):
        return pd.DataFrame({"method": "gbp", "model": ["a", "b", "r"], "family": ["x", "x", "reference"],
                             "role": ["anomalous", "anomalous", "reference"],
                             "margin": margins, "detected": [m > 1 for m in margins]})

    def localization(aurocs, verdicts):
        return pd.DataFrame({"method": "gbp", "model": ["a", "b"], "auroc": aurocs,
                             "chance_high": [0.7, 0.7], "verdict": verdicts})

    base = {"detection": detection([1.2, 0.9, 1.0]), "localization": localization([0.9, 0.6], ["adds", "same"])}
    other = {"detection": detection([0.95, 0.8, 1.0]), "localization": localization([0.65, 0.62], ["adds", "less"])}
    det, loc = compare(base, other, Variant("c", "v", None, ["gbp"]))
    assert det.set_index("model")["detection_changed"].to_dict() == {"a": True, "b": False}
    assert loc.set_index("model")["localization_changed"].to_dict() == {"a": True, "b": False}
    assert loc.set_index("model")["versus_outputs_changed"].to_dict() == {"a": False, "b": True}
    assert det.set_index("model")["margin_suite"].to_dict() == {"a": 1.2, "b": 0.9}
    # a method the variant does not change is not compared
    assert compare(base, other, Variant("c", "v", None, ["other"]))[0].empty


def test_sensitivity_on_a_finished_run_agrees_with_the_main_job_on_the_derived_suite(finished_run):
    suite, runs, _ = finished_run
    args = ("--suite", suite, "--runs-dir", runs, "--distance", "l2", "--no-progress", *ONE_PROCESS)
    out = run_in_process("evaluate/sensitivity.py", *args, "--choice", "explained_class")
    assert "explained_class = label: explaining guided_backprop" in out  # outputs-only untouched
    tables = runs / "e2e" / "tables"
    det = pd.read_csv(tables / "sensitivity-detection-l2.csv")
    assert set(det["method"]) == {"guided_backprop"} and set(det["value"]) == {"label"}
    own = pd.read_csv(tables / "detection-per-model-l2.csv").set_index(["method", "model"])
    for _, row in det.iterrows():
        assert row["margin_suite"] == pytest.approx(own.loc[(row["method"], row["model"]), "margin"])
    # the alternative's margins are those of the main job run on the derived suite file
    derived = runs / "e2e" / "sensitivity" / "explained_class-label.toml"
    run_in_process("evaluate/detect.py", "--suite", derived, "--runs-dir", runs, "--distance", "l2",
                   "--no-progress", "--method", "guided_backprop", *ONE_PROCESS)
    direct = pd.read_csv(runs / "e2e-sensitivity-explained_class-label" / "tables" /
                         "method-guided_backprop" / "detection-per-model-l2.csv"
                         ).set_index(["method", "model"])
    for _, row in det.iterrows():
        assert row["margin"] == pytest.approx(direct.loc[(row["method"], row["model"]), "margin"])
    # explaining for the label rather than the top class changes the explained targets, so the
    # visualizations differ, and a rerun computes nothing
    again = run_in_process("evaluate/sensitivity.py", *args, "--choice", "explained_class")
    computed = [int(n) for n in re.findall(r"(\d+) visualization set\(s\) computed", again)]
    assert computed == [0, 0, 0], again  # the suite (prepare, then its tables) and the alternative
    first = [int(n) for n in re.findall(r"(\d+) visualization set\(s\) computed", out)]
    # the alternative: guided backprop's 5 detection sets and 4 abnormal ones (3 references, the backdoor)
    assert first[0] == 0 and first[-1] == 9
