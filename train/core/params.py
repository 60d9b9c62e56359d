"""A plug-in's parameters: one dataclass per plug-in, one parser, one rule for keys that stay stable.

Every plug-in with settings (an explanation method, a renderer, a failure-discovery auditor, an
anomaly family, a world) and the training ``Recipe`` declares them as a frozen dataclass: one field
per key of its suite table, the field's default the key's default. ``parse_params`` turns a suite's
table into an instance, checked by pydantic (v2) in strict mode on the table's values as JSON, as
the suite file's own schema (``suite_schema.py``) is: the type of every key (a whole number stays
whole, ``steps = "512"`` and ``steps = true`` are errors, every float is finite), its range, its
valid values and its upper bound, with one error line per bad key naming ``where`` and the key,
and for an unknown key the nearest valid name and the list of valid ones.

How a field says what it accepts, in its annotation:
- a range: ``Annotated[float, Field(gt=0, le=1)]``;
- a few valid names: ``Literal["top", "label"]``;
- a size's upper bound (``size_bounds.py``, whose reason the error gives):
  ``Annotated[int, at_most(bounds.PASSES)]``, on each item for a table or list of sizes
  (``dict[str, Annotated[int, at_most(bounds.PASSES)]]``).

The parameters are part of the keys of stored results (a model's key, an explanation's, a
discovery's), so the key form of an instance (``key_params``, and ``recorded_params``, its JSON
form) follows two declared rules:
- ``execution_only(default)``: a field that changes how a result is computed but not the result
  (an internal batch size) is never part of a key, so changing it never invalidates a result;
- ``added(default, before=...)``: a field introduced after results were stored is left out of the
  key while it has the value every earlier result was computed with (``before``, by default the
  field's default), so those results keep their keys; any other value is recorded, so results
  under different choices never share a key.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from typing import Any, Mapping

from pydantic import BaseModel, Field, create_model

from counteraudit.train.core.size_bounds import Bound
from counteraudit.train.core.suite_schema import StrictTable
from counteraudit.train.core.table_problems import validated_table

EXECUTION_ONLY = "execution_only"
BEFORE = "value_before_the_field_existed"


@dataclasses.dataclass(frozen=True)
class NoParams:
    """For plug-ins without parameters."""


def at_most(bound: Bound) -> Any:
    """The pydantic constraint of a size: at most ``bound.limit``, the error giving
    ``bound.why``; use in an annotation, ``Annotated[int, at_most(bounds.PASSES)]``."""
    return Field(le=bound.limit, json_schema_extra=bound.extra)


def execution_only(default: Any) -> Any:
    """A dataclass field that does not change the result: never part of a key (module
    docstring)."""
    return dataclasses.field(default=default, metadata={EXECUTION_ONLY: True})


def added(default: Any, before: Any = dataclasses.MISSING) -> Any:
    """A dataclass field added after results were stored (module docstring): left out of the
    key while equal to ``before``, the value those results were computed with (by default
    ``default``)."""
    metadata = {BEFORE: default if before is dataclasses.MISSING else before}
    if isinstance(default, (dict, list, set)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@functools.cache
def params_table(params_class: type,
                 overrides: tuple[tuple[str, Any], ...] = ()) -> type[BaseModel]:
    """The strict table schema of the dataclass ``params_class``: one key per field, with the
    type, ranges and description its annotation carries. ``overrides``: (field, annotation)
    pairs for fields whose table form differs from the dataclass's."""
    hints = typing.get_type_hints(params_class, include_extras=True)
    replaced = dict(overrides)
    definitions = {}
    for field in dataclasses.fields(params_class):
        default = (field.default if field.default is not dataclasses.MISSING
                   else field.default_factory() if field.default_factory is not dataclasses.MISSING
                   else ...)
        definitions[field.name] = (replaced.get(field.name, hints[field.name]), default)
    return create_model(f"{params_class.__name__}Table", __base__=StrictTable, **definitions)


def params_problems(params_class: type, table: Any, where: str,
                    overrides: tuple[tuple[str, Any], ...] = ()) -> list[str]:
    """What is wrong with ``table`` as ``params_class``'s parameters, one line per key."""
    return validated_table(params_table(params_class, overrides), table, where)[1]


def parse_params(params_class: type, table: Mapping[str, Any] | Any | None, where: str,
                 as_written: bool = False) -> Any:
    """An instance of ``params_class``: its defaults, overridden by ``table`` (a suite's table;
    an instance passes as it is, None gives the defaults). Raises ValueError naming ``where``
    and each bad key.

    The values are pydantic's: ``1`` for a float is ``1.0``, a list for a tuple a tuple.
    ``as_written``: the table's values exactly as given (checked all the same), for plug-ins
    whose keys have always held them so (an anomaly family's ``2`` for a float stays ``2``)."""
    if table is None:
        return params_class()
    if isinstance(table, params_class):
        return table
    if not isinstance(table, Mapping):
        raise TypeError(f"{where}: the parameters must be a table (a dict) or a "
                        f"{params_class.__name__}, not {type(table).__name__}")
    validated, problems = validated_table(params_table(params_class), dict(table), where)
    if problems:
        raise ValueError("; ".join(problems))
    if as_written:
        return params_class(**table)
    return params_class(**{key: getattr(validated, key) for key in table})


def key_params(params: Any) -> dict[str, Any]:
    """The fields of a parameters instance that are part of a key (module docstring), as held."""
    return {field.name: copy.deepcopy(getattr(params, field.name))
            for field in dataclasses.fields(params) if _in_key(field, getattr(params, field.name))}


def recorded_params(params: Any) -> dict[str, Any]:
    """``key_params`` JSON-ready (tuples as lists), as results record them."""
    return {name: _jsonable(value) for name, value in key_params(params).items()}


def _in_key(field: dataclasses.Field, value: Any) -> bool:
    if field.metadata.get(EXECUTION_ONLY, False):
        return False
    return not (BEFORE in field.metadata and value == field.metadata[BEFORE])


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
