"""The explanation methods a suite runs, each with its parameters parsed once into the method's
own typed ``Params``: what the explain stage and its work items carry.

The path of a value set in a suite's ``[methods.<name>]`` table: ``method_specs`` builds the
method from the table (for a method the suite gives no table: from the settings the suite's
methods of its kind share, ``shared_settings.py``); ``ExplanationMethod.__init__`` parses it
with ``parse_params`` into the method's ``Params`` dataclass (types, ranges, choices, unknown
keys), and ``method_specs`` keeps the typed parameters in a ``MethodSpec``; a work item carries
the spec, ``MethodSpec.build`` makes the method from them, and ``attribute`` reads
``self.params``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from counteraudit.explain.base import METHODS, ExplanationMethod
from counteraudit.explain.shared_settings import inherited_table
from counteraudit.train.core.suite import Suite
from counteraudit.train.core.suite_checks import built_problems, named_problems
from counteraudit.train.core.suite_schema import SuiteTable


@dataclass(frozen=True)
class MethodSpec:
    """One method as the suite runs it: its name, its typed parameters (its ``Params``, from
    ``[methods.<name>]`` with the defaults filled in) and its batch size (``[explain]
    batch_sizes``; None: the method's own)."""
    name: str
    params: Any
    batch_size: int | None = None

    def build(self) -> ExplanationMethod:
        return METHODS.get(self.name)(self.params)

    @property
    def model_level(self) -> bool:
        """Whether the method explains models rather than images (``model_level``)."""
        return METHODS.get(self.name).model_level


def method_specs(suite: Suite, only: list[str] | None = None) -> dict[str, MethodSpec]:
    """The methods a suite explains with (``only``: a subset, --method), in order, each parsed
    from its ``[methods.<name>]`` table (``method_table``): an unknown method, parameter, choice
    or renderer fails here, when the command starts, with the valid names, and not after the
    models are trained."""
    names = only or suite.explain.methods or METHODS.names()
    return {name: MethodSpec(name, METHODS.get(name)(method_table(suite, name)).params,
                             suite.explain.batch_sizes.get(name)) for name in names}


def method_table(suite: Suite, name: str) -> dict[str, Any]:
    """The parameters the method ``name`` runs with in ``suite``: its own [methods.<name>] table,
    or, without one, the settings the suite's methods of its kind share (``inherited_table``)."""
    own = suite.method_tables.get(name)
    return own if own is not None else inherited_table(suite.method_tables, name)


def suite_method(suite: Suite, name: str) -> ExplanationMethod:
    """The method ``name`` built as ``suite`` sets it (its ``[methods.<name>]`` parameters)."""
    return method_specs(suite, [name])[name].build()


def method_problems(settings: SuiteTable) -> list[str]:
    """What is wrong with a suite's tables of explanation methods: an unknown name in [explain]
    methods or batch_sizes, a [methods.<name>] table the method refuses, or one for a method the
    suite does not run. The entry scripts that explain pass it to ``load_suite``, so these join
    the file's other problems in one error, before any model is trained."""
    explain = settings.explain
    problems = named_problems(explain.methods or [], METHODS, "[explain] methods")
    problems += named_problems(explain.batch_sizes, METHODS, "[explain] batch_sizes")
    problems += built_problems(settings.methods, METHODS, "methods")
    return problems + unrun_method_problems(explain.methods, settings.methods)


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
