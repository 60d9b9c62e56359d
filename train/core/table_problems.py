"""A table checked against its schema: one line per problem, naming the file's table and key, the
value given, what it must be, the key's meaning and, for an unknown key, the nearest valid name
(the schemas: train/core/suite_schema.py)."""
from __future__ import annotations

import json
import typing
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.paths import redacted
from counteraudit.train.core.registry import nearest
from counteraudit.train.core.suite_schema import SAFE_NAME_RULE, SuiteFileError


# ---------------------------------------------------------------- checking a table
def check_table(schema: type[BaseModel], table: Any, where: str) -> list[str]:
    """The problems of ``table`` under ``schema``, each one line naming ``where`` and the key."""
    return validated_table(schema, table, where)[1]


def validated_table(schema: type[BaseModel], table: Any,
                    where: str) -> tuple[BaseModel | None, list[str]]:
    """``table`` validated under ``schema`` (None where it has problems) and its problems, each
    one line naming ``where`` and the key."""
    try:
        return schema.model_validate_json(json.dumps(table, default=str)), []
    except ValidationError as error:
        problems: dict[tuple, list[dict[str, Any]]] = {}
        for problem in error.errors():  # one line per key, whichever union members it failed
            loc = _real_loc(table, problem["loc"], problem["type"] == "missing")
            problems.setdefault(loc, []).append(problem)
        # a union member that failed at a table's own level ("must be a list") is noise beside
        # the member that matched the table's shape and failed at one of its keys
        deepest = [loc for loc in problems
                   if not any(other[:len(loc)] == loc and other != loc for other in problems)]
        return None, [_describe({**problems[loc][0], "loc": loc, "alternatives": problems[loc]},
                                schema, table, where) for loc in deepest]


def _real_loc(table: Any, loc: tuple, missing: bool) -> tuple:
    """``loc`` without the tags pydantic adds for union members ('int', 'str'): only the parts
    that index into the file's data (and, for a ``missing`` key, the key that is absent)."""
    real, node = [], table
    for position, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif missing and position == len(loc) - 1 and isinstance(node, dict):
            pass
        else:
            continue
        real.append(part)
    return tuple(real)


def problem_lines(problems: list[str]) -> str:
    """'N problems; nothing was run:' and one indented line per problem."""
    lines = "\n".join(f"  - {problem}" for problem in problems)
    count = "a problem" if len(problems) == 1 else f"{len(problems)} problems"
    return f"{count}; nothing was run:\n{lines}"


def raise_problems(path, problems: list[str]) -> typing.NoReturn:
    raise SuiteFileError(redacted(f"suite file {path} has {problem_lines(problems)}"))


# ---------------------------------------------------------------- messages
_EXPECTED = {
    "int_type": "a whole number", "int_from_float": "a whole number", "float_type": "a number",
    "bool_type": "true or false", "string_type": "a string in quotes", "list_type": "a list [...]",
    "dict_type": "a table", "model_type": "a table", "dataclass_type": "a table",
    "tuple_type": "a list [...]", "model_attributes_type": "a table", "none_required": "absent",
}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}


def _location(where: str, loc: tuple) -> str:
    """('anomalies', 2, 'seed') -> '[[anomalies]] entry 3, seed'; ('recipe', 'epochs') ->
    '[recipe] epochs'; within ``where`` (a table's own header) the key alone."""
    parts, text = list(loc), where
    while parts:
        part = parts.pop(0)
        if isinstance(part, int):
            text = f"{text} entry {part + 1}" if text else f"entry {part + 1}"
        elif not text:
            is_array = parts and isinstance(parts[0], int)
            text = f"[[{part}]]" if is_array else f"[{part}]" if parts else str(part)
        else:
            text = f"{text}, {part}" if text.endswith(tuple("0123456789")) else f"{text} {part}"
    return text


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, default=str)
        return text if len(text) <= 60 else text[:57] + "..."
    return repr(value)


def _field_info(schema: type[BaseModel], loc: tuple):
    """The pydantic FieldInfo at ``loc`` (None where the path leaves declared fields)."""
    model, info = schema, None
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = model.model_fields.get(part)
        if info is None:
            return None
        model = _nested_model(info.annotation)
    return info


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The table model inside an annotation (``X``, ``list[X]``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        inner = _nested_model(argument)
        if inner is not None:
            return inner
    return None


def _siblings(schema: type[BaseModel], loc: tuple) -> list[str]:
    """The valid keys of the table that holds ``loc``'s last key."""
    parent = loc[:-1]
    while parent and isinstance(parent[-1], int):
        parent = parent[:-1]
    if not parent:
        return list(schema.model_fields)
    info = _field_info(schema, parent)
    model = _nested_model(info.annotation) if info is not None else None
    return list(model.model_fields) if model is not None else []


def _why(info, sign: str) -> str:
    """The reason for an upper bound (``size_bounds.py``), where the key has one (on the key
    itself, or on its items: ``dict[str, Annotated[int, Field(le=...)]]``)."""
    reason = _bound_reason(info.json_schema_extra, info.annotation) if info is not None else None
    return f" ({reason})" if sign in ("<=", "<") and reason else ""


def _bound_reason(extra: Any, annotation: Any) -> str | None:
    if isinstance(extra, dict) and bounds.BOUND_REASON in extra:
        return extra[bounds.BOUND_REASON]
    for part in getattr(annotation, "__metadata__", ()):  # Annotated[X, Field(...)]
        reason = _bound_reason(getattr(part, "json_schema_extra", None), None)
        if reason:
            return reason
    for argument in typing.get_args(annotation):
        reason = _bound_reason(None, argument)
        if reason:
            return reason
    return None


def _describe(problem: dict[str, Any], schema: type[BaseModel], table: Any, where: str) -> str:
    loc = tuple(part for part in problem["loc"]
                if not (isinstance(part, str) and part.startswith(("function-", "json-"))))
    kind, key = problem["type"], _location(where, loc)
    if kind == "extra_forbidden":
        valid = [key for key in _siblings(schema, loc) if key != "name" or len(loc) > 1]
        name = loc[-1]
        is_table = isinstance(problem.get("input"), dict) and not where and len(loc) == 1
        what = f"unknown table [{name}]" if is_table else f"{key}: unknown key"
        if not valid:
            return f"{what}: none is valid (it takes no parameters)"
        return (f"{what}{nearest(name, valid)}; valid {'tables' if is_table else 'keys'}: "
                f"{', '.join(valid)}")
    if kind == "missing":
        info = _field_info(schema, loc)
        meaning = f" ({info.description})" if info is not None and info.description else ""
        return f"{key} is missing; add it{meaning}"
    value = problem.get("input")
    info = _field_info(schema, loc)
    meaning = f"; {loc[-1]}: {info.description}" if info is not None and info.description else ""
    if kind in _BOUNDS:
        sign, bound = _BOUNDS[kind][0], problem["ctx"][_BOUNDS[kind][1]]
        return f"{key} = {_value_text(value)} must be {sign} {bound}{_why(info, sign)}{meaning}"
    if kind == "literal_error":
        annotation = info.annotation if info is not None else None
        valid = (", ".join(map(repr, typing.get_args(annotation)))
                 if typing.get_origin(annotation) is Literal else problem["ctx"]["expected"])
        return f"{key} = {_value_text(value)} is not one of the valid values {valid}{meaning}"
    if kind == "finite_number":
        return (f"{key} = {_value_text(value)} must be a finite number (inf and nan are never a "
                f"setting){meaning}")
    if kind == "string_pattern_mismatch" or (kind == "string_too_long"
                                               and info is not None and "name" in str(loc[-1])):
        return f"{key} = {_value_text(value)} is not {SAFE_NAME_RULE}"
    if kind == "too_short":
        return (f"{key} = {_value_text(value)} must hold at least {problem['ctx']['min_length']} "
                f"items{meaning}")
    if kind == "too_long":
        return (f"{key} = {_value_text(value)} must hold at most {problem['ctx']['max_length']} "
                f"items{_why(info, '<=')}{meaning}")
    expected = " or ".join(dict.fromkeys(_EXPECTED.get(p["type"], p["msg"].lower())
                                         for p in problem.get("alternatives", [problem])))
    given = type(value).__name__
    given = {"str": "a string", "int": "a whole number", "float": "a number with a fraction",
             "bool": "true or false", "list": "a list", "dict": "a table"}.get(given, given)
    return f"{key} = {_value_text(value)} must be {expected}, not {given}{meaning}"
