"""What a stored payload must hold before anything reads it: an ``.npz`` of plain arrays (never
Python objects, which only unpickling could read) with the arrays a kind needs, or a JSON object
with the fields it needs.

A check returns the problem in words (None: none), for ``KeyedArtifact``'s ``check`` and for
``read_npz``: the file is then set aside and recomputed. Checking an ``.npz`` reads each array's
header only (name, dtype, shape), not its data: a file whose digest matched is read whole later.
"""
from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from counteraudit.train.core.artifacts import read_marker, set_aside

# (shape, dtype) of each array of an .npz, by name
Layout = dict[str, tuple[tuple[int, ...], np.dtype]]
_READ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zipfile.LargeZipFile)


class PayloadProblem(ValueError):
    """A payload that is not what its kind writes; the message says how."""


def npz_layout(path: str | os.PathLike) -> Layout:
    """Each array's shape and dtype, from its header; a PayloadProblem if the file is not an
    ``.npz`` (truncated, another format) or an array holds Python objects."""
    layout: Layout = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(member)
                if dtype.hasobject:
                    raise PayloadProblem(f"array {name!r} holds Python objects (dtype {dtype}), "
                                         "which counteraudit never writes and does not unpickle")
                layout[name] = (shape, dtype)
    except PayloadProblem:
        raise
    except _READ_ERRORS as error:
        raise PayloadProblem(f"not a readable .npz ({type(error).__name__}: {error})") from None
    return layout


def npz_arrays(length_of: str | None = None, aligned: bool = True,
               **ndims: int | tuple[int, ...]) -> Callable[[Path, Mapping[str, Any]], str | None]:
    """A check that the ``.npz`` holds plain arrays, among them each named one with its number
    of dimensions (``images=4``, or one of several: ``images=(4, 5)``); ``aligned``: all of one
    length along the first, the length of the marker's list ``length_of`` where given."""
    def problem(path: Path, record: Mapping[str, Any]) -> str | None:
        try:
            layout = npz_layout(path)
        except PayloadProblem as error:
            return str(error)
        for name, ndim in ndims.items():
            if name not in layout:
                return f"no array {name!r} (it holds {', '.join(sorted(layout)) or 'none'})"
            allowed = ndim if isinstance(ndim, tuple) else (ndim,)
            if len(layout[name][0]) not in allowed:
                return (f"array {name!r} has shape {layout[name][0]}, not "
                        f"{' or '.join(map(str, allowed))} dimensions")
        if not aligned:
            return None
        lengths = {layout[name][0][0] for name in ndims}
        if len(lengths) > 1:
            return f"arrays {', '.join(ndims)} differ in length ({sorted(lengths)})"
        if length_of is not None and lengths != {len(record[length_of])}:
            return (f"{', '.join(ndims)} hold(s) {lengths.pop()} rows where the marker's "
                    f"{length_of} lists {len(record[length_of])}")
        return None
    return problem


def json_fields(**types: type | tuple[type, ...]) -> Callable[[Path, Mapping[str, Any]], str | None]:
    """A check that the JSON payload is an object holding each named field with its type."""
    def problem(path: Path, record: Mapping[str, Any]) -> str | None:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            return f"not valid JSON ({error})"
        return fields_problem(data, types)
    return problem


def fields_problem(data: Any, types: Mapping[str, type | tuple[type, ...]]) -> str | None:
    """What keeps ``data`` from being a JSON object with each field of ``types`` of its type."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for name, kind in types.items():
        if name not in data:
            return f"no field {name!r}"
        if not isinstance(data[name], kind):
            expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            return f"field {name!r} is {shown(data[name])}, not a {expected}"
    return None


def read_json_object(path: str | os.PathLike, what: str,
                     **types: type | tuple[type, ...]) -> dict[str, Any] | None:
    """A JSON cache that no digest marks (``read_marker``): the object, or None when it is
    missing, not JSON, or not an object with each field of ``types`` (set aside, named)."""
    record = read_marker(path, what)
    if record is None:
        return None
    problem = fields_problem(record, types)
    if problem is not None:
        set_aside(path, problem, what)
        return None
    return record


def shown(value: Any) -> str:
    text = json.dumps(value)
    return f"the {type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def read_npz(path: str | os.PathLike, what: str) -> dict[str, np.ndarray] | None:
    """Every array of an ``.npz`` that no marker records a digest of (a cache that is rebuilt
    when missing), or None: a file that cannot be read as plain arrays is set aside, named."""
    try:
        npz_layout(path)
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except PayloadProblem as error:
        set_aside(path, str(error), what)
    except _READ_ERRORS as error:
        set_aside(path, f"not a readable .npz ({type(error).__name__}: {error})", what)
    return None
