"""The explanation methods a suite runs, each with its parameters parsed once into the method's
own typed ``Params``: what the explain stage and its work items carry.

The path of a value set in a suite's ``[methods.<name>]`` table: ``method_specs`` builds the
method from the table (``ExplanationMethod.__init__`` parses it with ``parse_params`` into the
method's ``Params`` dataclass: types, ranges, choices, unknown keys) and keeps the typed
parameters in a ``MethodSpec``; a work item carries the spec, ``MethodSpec.build`` makes the
method from them, and ``attribute`` reads ``self.params``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from counteraudit.explain.base import METHODS, ExplanationMethod
from counteraudit.train.core.suite import Suite


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
    from its ``[methods.<name>]`` table: an unknown method, parameter, choice or renderer fails
    here, when the command starts, with the valid names, and not after the models are trained."""
    names = only or suite.explain.methods or METHODS.names()
    return {name: MethodSpec(name, METHODS.get(name)(suite.method_tables.get(name)).params,
                             suite.explain.batch_sizes.get(name)) for name in names}


def suite_method(suite: Suite, name: str) -> ExplanationMethod:
    """The method ``name`` built as ``suite`` sets it (its ``[methods.<name>]`` parameters)."""
    return method_specs(suite, [name])[name].build()
