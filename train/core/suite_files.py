"""Suite files: finding one by name or path, reading it (UTF-8 TOML, bounded nesting), resolving
its ``extends`` chain, and writing a suite table back as TOML."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from counteraudit.train.core.plugin_files import inherited_plugins, suite_plugin_paths
from counteraudit.train.core.suite_schema import SuiteFileError

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"  # train/suites/, beside core/


def available_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def suite_path(name_or_path: str | Path, relative_to: Path | None = None) -> Path:
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = SUITES_DIR / f"{name_or_path}.toml"
    elif relative_to is not None and not path.is_absolute():
        path = relative_to / path
    if not path.is_file():
        raise ValueError(f"unknown suite {str(name_or_path)!r}: no file {path}; shipped suites: "
                         f"{', '.join(available_suites())} (or pass a path to a .toml file)")
    return path


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` on top: nested tables merge, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


# A suite extends a few others (the shipped ones: at most 2 deep) and nests tables a few levels
# (5 in the shipped ones: an [[anomalies]] entry's params' tables); far deeper is a crafted file,
# refused before Python's recursion limit (1,000 frames) turns it into a traceback.
MAX_EXTENDS_DEPTH = 32
MAX_NESTING_DEPTH = 32


def read_table(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The suite file's table with its ``extends`` chain resolved; ``name`` is never inherited.
    ``chain``: the files that extend this one, the first file first."""
    table = _read_file(path)
    table.setdefault("name", path.stem)
    if "plugins" in table:  # each file's entries from its own folder, checked before any work
        table["plugins"] = suite_plugin_paths(table["plugins"], path)
    base_name = table.pop("extends", None)
    if base_name is None:
        return table
    where = f"suite file {path}: extends = {json.dumps(base_name, default=str)}"
    if not isinstance(base_name, str):
        raise SuiteFileError(f"{where} must be a suite name or a path to a .toml file")
    chain = (*chain, path.resolve())
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise SuiteFileError(f"{where}: {chain[0]} extends a chain of more than {MAX_EXTENDS_DEPTH} "
                             "suite files; at most that many may extend each other (the shipped "
                             "suites use 2): copy the tables you need into fewer files")
    try:
        base_path = suite_path(base_name, path.parent)
    except ValueError as error:
        raise SuiteFileError(f"{where}: {error}") from None
    if base_path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, base_path.resolve()))
        raise SuiteFileError(f"{where}: suite files extend each other in a cycle: {cycle}; remove "
                             "one extends")
    base = read_table(base_path, chain)
    base.pop("name")
    base = _without_unlisted_method_tables(base, table)
    _check_inherited_method_tables(base, table, path, base_path)
    merged = _merged(base, table)
    if "plugins" in base or "plugins" in table:
        merged["plugins"] = inherited_plugins(base.get("plugins", []), table.get("plugins", []))
    return merged


def _run_methods(table: dict[str, Any]) -> list[Any] | None:
    """The ``[explain] methods`` list a suite table sets, or None."""
    explain = table.get("explain")
    methods = explain.get("methods") if isinstance(explain, dict) else None
    return methods if isinstance(methods, list) else None


def _without_unlisted_method_tables(base: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """``base`` without its ``[methods.<name>]`` tables for the methods that the extending
    ``table``'s own ``[explain] methods`` list leaves out: a shorter list runs fewer of the base's
    methods, and their tables, which the extending file does not hold, go with them."""
    run, tables = _run_methods(table), base.get("methods")
    if run is None or not isinstance(tables, dict):
        return base
    return {**base, "methods": {name: params for name, params in tables.items() if name in run}}


def _check_inherited_method_tables(base: dict[str, Any], table: dict[str, Any], path: Path,
                                   base_path: Path) -> None:
    """A ``[methods.<name>]`` table ``table`` inherits for a method the resolved ``[explain]
    methods`` list leaves out is an error naming the file that holds it (``base_path`` or a file
    it extends), not the extending one, where the user would look for it in vain."""
    run = _run_methods(table) or _run_methods(base)
    tables, own = base.get("methods"), table.get("methods")
    if run is None or not isinstance(tables, dict):
        return
    own = own if isinstance(own, dict) else {}
    unlisted = [name for name in tables if name not in run and name not in own]
    if unlisted:
        listed = ", ".join(json.dumps(name, default=str) for name in run)
        raise SuiteFileError(
            f"suite file {path} extends {base_path}, where (or in a file it extends) "
            + "; ".join(f"[methods.{name}]" for name in unlisted)
            + f" sets parameters of a method the suite does not run ([explain] methods = [{listed}]): "
            f"add {' and '.join(json.dumps(name) for name in unlisted)} to [explain] methods in "
            f"{path}, or remove the table from {base_path}")


def _read_file(path: Path) -> dict[str, Any]:
    """One suite file's TOML table: one SuiteFileError naming the file when it cannot be read,
    is not UTF-8, is not TOML or nests deeper than ``MAX_NESTING_DEPTH``."""
    fix = "fix that line (https://toml.io: key = value, [table], [[array of tables]])"
    try:
        data = path.read_bytes()
        table = tomllib.loads(data.decode("utf-8"))
    except OSError as error:
        raise SuiteFileError(f"suite file {path} cannot be read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise SuiteFileError(f"suite file {path} is not UTF-8 text: byte 0x{data[error.start]:02x} at "
                             f"offset {error.start} (line {line}) {error.reason}; save the file as "
                             "UTF-8") from None
    except tomllib.TOMLDecodeError as error:
        raise SuiteFileError(f"suite file {path} is not valid TOML: {error}; {fix}") from None
    except RecursionError:
        table = None
    if table is None or _nesting_depth(table) > MAX_NESTING_DEPTH:
        raise SuiteFileError(f"suite file {path} nests tables or arrays more than {MAX_NESTING_DEPTH} "
                             "levels deep; the shipped suites nest at most 5 (an [[anomalies]] entry's "
                             "params' tables): flatten it")
    return table


def _nesting_depth(value: Any) -> int:
    """How many tables and arrays ``value`` nests (0: a plain value), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def toml_text(table: dict[str, Any], prefix: str = "") -> str:
    """A suite table as TOML: values first (a table inside an array as an inline table), then
    each nested table under its header. Strings are JSON-quoted, which TOML reads the same."""
    lines = [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in table.items()
             if not isinstance(v, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            header = f"{prefix}.{json.dumps(str(key))}" if prefix else json.dumps(str(key))
            lines += ["", f"[{header}]", toml_text(value, header)]
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) to a suite file")


def overridden(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``_merged``, where a None in ``overrides`` removes the key (TOML has no null)."""
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):  # a new table too: its None values are removed keys
            out[key] = overridden(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out
