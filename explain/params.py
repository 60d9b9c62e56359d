"""Method parameters: a dataclass of defaults per method, overridden from a suite's table.

A suite file's ``[methods.<name>]`` table arrives here as a dict. Unknown keys are an error that
lists the valid ones (a typo must not silently run the defaults), and values are checked against
the field's type, so ``steps = "512"`` fails at load time instead of deep inside a run.

Fields whose metadata says ``execution_only=True`` (e.g. an internal batch size) change how a
result is computed but not the result, so they are left out of the recorded parameters: changing
them does not invalidate stored results.

Fields made with ``at_most(default, bound)`` are sizes (steps, samples, images) with an upper
bound from ``train/core/size_bounds.py``: a larger value is an error naming the bound and why.
Every float must be finite: inf and nan are never a setting.

Fields made with ``added(default, before=...)`` are parameters introduced after results were
stored: while such a field has the value every earlier result was computed with (``before``), it
is left out of the recorded parameters, so those results keep their keys and stay valid; any other
value is recorded, so results under different choices never share a key.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Mapping

from counteraudit.train.core.size_bounds import Bound

EXECUTION_ONLY = "execution_only"
BEFORE = "value_before_the_field_existed"
CHOICES = "choices"
LIMIT = "limit"


@dataclasses.dataclass(frozen=True)
class NoParams:
    """For methods without parameters."""


def execution_only(default: Any, bound: Bound | None = None) -> Any:
    """A dataclass field that does not change the result (left out of recorded parameters);
    ``bound``: its upper bound, if a size (``at_most``)."""
    return dataclasses.field(default=default, metadata={EXECUTION_ONLY: True,
                                                        **({LIMIT: bound} if bound else {})})


def added(default: Any, before: Any = dataclasses.MISSING,
          choices: tuple[str, ...] | None = None, bound: Bound | None = None) -> Any:
    """A field added after results were stored (module docstring); ``before``: the value those
    results were computed with (default: ``default``); ``choices``: its valid values, if a few
    names (any other is an error that lists them); ``bound``: its upper bound, if a size."""
    metadata = {BEFORE: default if before is dataclasses.MISSING else before}
    if choices is not None:
        metadata[CHOICES] = tuple(choices)
    if bound is not None:
        metadata[LIMIT] = bound
    return dataclasses.field(default=default, metadata=metadata)


def at_most(default: Any, bound: Bound) -> Any:
    """A size field (an int, or a table or list of them) whose every value is at most
    ``bound.limit`` (module docstring)."""
    return dataclasses.field(default=default, metadata={LIMIT: bound})


def _check_limit(key: str, value: Any, bound: Bound, where: str) -> None:
    values = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else [value]
    largest = max((v for v in values if isinstance(v, (int, float))), default=None)
    if largest is not None and largest > bound.limit:
        raise ValueError(f"{where}: {key} = {value!r} must be <= {bound.limit} ({bound.why})")


def check_choice(key: str, value: Any, choices: tuple[str, ...], where: str) -> None:
    """One clear error for a value that must be one of a few names."""
    if value not in choices:
        raise ValueError(f"{where}: {key} = {value!r} is not one of the valid values "
                         f"{', '.join(map(repr, choices))}")


def _check_type(key: str, value: Any, annotation: Any) -> Any:
    """``value`` converted to ``annotation`` where that is lossless (int -> float, list -> tuple)."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):  # Optional[X] and X | None
        for option in typing.get_args(annotation):
            try:
                return _check_type(key, value, option)
            except TypeError:
                continue
        raise TypeError(f"parameter {key!r}={value!r} matches none of {annotation}")
    if annotation is type(None):
        if value is None:
            return None
        raise TypeError(f"parameter {key!r}={value!r} is not None")
    if origin is dict or annotation is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"parameter {key!r}={value!r} must be a table (mapping)")
        args = typing.get_args(annotation)
        item_type = args[1] if len(args) == 2 else Any
        return {str(k): _check_type(f"{key}[{k!r}]", v, item_type) for k, v in value.items()}
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"parameter {key!r}={value!r} must be a list")
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        item_type = args[0] if args else Any
        items = [_check_type(f"{key}[{i}]", v, item_type) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ValueError(f"parameter {key!r}={value!r} must be a finite number (inf and nan "
                                 "are never a setting)")
            return float(value)
        raise TypeError(f"parameter {key!r}={value!r} must be a number")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError(f"parameter {key!r}={value!r} must be an integer")
    if isinstance(annotation, type) and not isinstance(value, annotation):
        raise TypeError(f"parameter {key!r}={value!r} must be of type {annotation.__name__}")
    return value


def parse_params(params_class: type, overrides: Mapping[str, Any] | Any | None,
                 method_name: str = "", kind: str = "method") -> Any:
    """An instance of ``params_class`` from defaults + ``overrides`` (a dict, an instance or None)."""
    if overrides is None:
        return params_class()
    if isinstance(overrides, params_class):
        return overrides
    if not isinstance(overrides, Mapping):
        raise TypeError(f"parameters for {kind} {method_name!r} must be a dict or a "
                        f"{params_class.__name__}, got {type(overrides).__name__}")
    fields = {f.name: f for f in dataclasses.fields(params_class)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {kind} {method_name!r}; valid: "
                         f"{sorted(fields) or f'(none: this {kind} takes no parameters)'}")
    hints = typing.get_type_hints(params_class)
    values = {key: _check_type(key, value, hints.get(key, Any)) for key, value in overrides.items()}
    for key, value in values.items():
        choices = fields[key].metadata.get(CHOICES)
        if choices is not None:
            check_choice(key, value, choices, f"{kind} {method_name!r}")
        bound = fields[key].metadata.get(LIMIT)
        if bound is not None:
            _check_limit(key, value, bound, f"{kind} {method_name!r}")
    return params_class(**values)


def recorded_params(params: Any) -> dict[str, Any]:
    """The parameters that determine the result (execution-only fields left out), JSON-ready."""
    return {f.name: _jsonable(getattr(params, f.name)) for f in dataclasses.fields(params)
            if not f.metadata.get(EXECUTION_ONLY, False)
            and not (BEFORE in f.metadata and getattr(params, f.name) == f.metadata[BEFORE])}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
