"""Method parameters: a dataclass of defaults per method, overridden from a suite's table.

A suite file's ``[methods.<name>]`` table arrives here as a dict. Unknown keys are an error that
lists the valid ones (a typo must not silently run the defaults), and values are checked against
the field's type, so ``steps = "512"`` fails at load time instead of deep inside a run.

Fields whose metadata says ``execution_only=True`` (e.g. an internal batch size) change how a
result is computed but not the result, so they are left out of the recorded parameters: changing
them does not invalidate stored results.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping

EXECUTION_ONLY = "execution_only"


@dataclasses.dataclass(frozen=True)
class NoParams:
    """For methods without parameters."""


def execution_only(default: Any) -> Any:
    """A dataclass field that does not change the result (left out of recorded parameters)."""
    return dataclasses.field(default=default, metadata={EXECUTION_ONLY: True})


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
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"parameter {key!r}={value!r} must be a list")
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        item_type = args[0] if args else Any
        items = [_check_type(f"{key}[{i}]", v, item_type) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
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
                 method_name: str = "") -> Any:
    """An instance of ``params_class`` from defaults + ``overrides`` (a dict, an instance or None)."""
    if overrides is None:
        return params_class()
    if isinstance(overrides, params_class):
        return overrides
    if not isinstance(overrides, Mapping):
        raise TypeError(f"parameters for method {method_name!r} must be a dict or a "
                        f"{params_class.__name__}, got {type(overrides).__name__}")
    fields = {f.name: f for f in dataclasses.fields(params_class)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for method {method_name!r}; valid: "
                         f"{sorted(fields) or '(none: this method takes no parameters)'}")
    hints = typing.get_type_hints(params_class)
    values = {key: _check_type(key, value, hints.get(key, Any)) for key, value in overrides.items()}
    return params_class(**values)


def recorded_params(params: Any) -> dict[str, Any]:
    """The parameters that determine the result (execution-only fields left out), JSON-ready."""
    return {f.name: _jsonable(getattr(params, f.name)) for f in dataclasses.fields(params)
            if not f.metadata.get(EXECUTION_ONLY, False)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
