"""The composition root's check of a suite's plug-in tables: the tables of the layers above
training (explanation methods, failure-discovery auditors, the image distance, the null test),
each checked against its registry and parsed, so a typo fails before any model is trained.

``train/core`` reads a suite without these layers (it knows worlds, architectures, recipes and the
anomaly families a model trains with); every entry script (train.py, explain/run.py and the
evaluate scripts) calls ``load_checked_suite``. The layers are reached through their registries
(train/core/registries.py), which import a kind's plug-ins by name on first lookup: train.py sits
below explain and evaluate in the layer contract, yet must refuse a bad [methods.X] table before
hours of training.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from counteraudit.train.core.registries import AUDITORS, DISTANCES, METHODS, NULL_TESTS
from counteraudit.train.core.suite import Suite, load_suite
from counteraudit.train.core.suite_checks import named_problems
from counteraudit.train.core.suite_schema import MIN_NULL_MODELS, ReferencesTable, SuiteTable


def load_checked_suite(name_or_path: str | Path) -> Suite:
    """``load_suite`` with every plug-in table checked too: one ``SuiteFileError`` lists the
    problems of the whole file."""
    return load_suite(name_or_path, plugin_problems)


def plugin_problems(settings: SuiteTable) -> list[str]:
    """What is wrong with the tables of plug-ins above training. A registry imports its plug-ins
    (and their libraries: seconds) on its first lookup, so only a suite that names a method or an
    auditor pays for it."""
    explain, discover = settings.explain, settings.discover
    problems = named_problems(explain.methods or [], METHODS, "[explain] methods")
    problems += named_problems(explain.batch_sizes, METHODS, "[explain] batch_sizes")
    problems += built_problems(settings.methods, METHODS, "methods")
    problems += unrun_method_problems(explain.methods, settings.methods)
    problems += named_problems(discover.auditors or [], AUDITORS, "[discover] auditors")
    problems += named_problems(discover.budget, AUDITORS, "[discover] budget")
    problems += built_problems(settings.auditors, AUDITORS, "auditors")
    problems += named_problems([settings.evaluate.distance], DISTANCES, "[evaluate] distance")
    problems += null_test_problems(settings.references, settings.evaluate.p_value, "[evaluate] p_value")
    return problems


def built_problems(tables: dict[str, dict[str, Any]], registry, header: str) -> list[str]:
    """Each ``[header.<name>]`` table against the registry, and the plug-in built from its
    parameters."""
    problems = named_problems(tables, registry, f"[{header}.<name>]")
    for name, params in tables.items():
        if name in registry:
            try:
                registry.get(name)(params)
            except (TypeError, ValueError, LookupError) as error:
                message = error.args[0] if isinstance(error, LookupError) and error.args else error
                problems.append(f"[{header}.{name}] {message}")
    return problems


def unrun_method_problems(run: list[str] | None, tables: dict[str, Any]) -> list[str]:
    """A ``[methods.<name>]`` table for a method the ``[explain] methods`` list leaves out would be
    silently ignored (a user who adds a method's table expects it to run): an error naming the list
    to add it to. Without a list the suite runs every registered method, so every table is used."""
    if run is None:
        return []
    listed = ", ".join(f'"{name}"' for name in run)
    return [f"[methods.{name}] sets parameters of a method the suite does not run: add \"{name}\" "
            f"to [explain] methods = [{listed}] (or remove the table)"
            for name in tables if name not in run]


def null_test_problems(references: ReferencesTable, p_value: str | None, asked_by: str) -> list[str]:
    """What stops the null p-values (``p_value``, asked for by ``asked_by``: a suite key or a
    command-line option) from being computed: an unknown test, or fewer held-out references left
    to fit it than the test needs (``MIN_NULL_MODELS``, or its ``min_nulls``)."""
    if p_value is None:
        return []
    problems = named_problems([p_value], NULL_TESTS, f"{asked_by} = {p_value!r}")
    needed = MIN_NULL_MODELS if problems else NULL_TESTS.get(p_value).nulls_needed()
    held_out, checking = references.held_out, references.held_out_check
    fitting = held_out - checking
    if fitting < needed:
        problems.append(
            f"{asked_by} = {p_value!r} fits each method's null distribution to the held-out "
            f"references and needs at least {needed} of them; [references] held_out = "
            f"{held_out} with held_out_check = {checking} leaves {fitting}: set "
            f"[references] held_out = {needed + checking} or more (40 with "
            "held_out_check = 20 fits on 20 and checks the calibration on the other 20)")
    return problems
