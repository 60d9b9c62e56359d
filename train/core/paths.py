"""Paths a suite file gives (a dataset's root, a user's image folder): ``${VAR}`` expanded, an
unset variable an error that says which to export.

Expansion stays because one suite file serves every cluster through it (the paper suite's
``root = "${IMAGENET_ROOT}"``). But a suite file may come from a stranger, and naming a variable
that holds a secret must not get the secret printed: every value expanded is remembered, and
``redacted`` puts ``${NAME}`` back in its place in any message the tool shows (``run_cli``, a
suite's error), so an error says the path as the suite wrote it.
"""
from __future__ import annotations

import os
import re

_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
# A shorter value ("/", "1") would be replaced all through a message; no secret is that short.
_SHORTEST_REDACTED = 4
_EXPANDED: dict[str, str] = {}  # an expanded value -> "${NAME}"


def expand_path(value: str, what: str) -> str:
    for braced, bare in _VARIABLE.findall(str(value)):
        name = braced or bare
        if len(os.environ.get(name, "")) >= _SHORTEST_REDACTED:
            _EXPANDED[os.environ[name]] = f"${{{name}}}"
    expanded = os.path.expandvars(str(value))
    if "$" in expanded:
        raise ValueError(f"{what} {value!r} uses an unset environment variable; export it "
                         "(e.g. IMAGENET_ROOT=/datasets/imagenet)")
    return expanded


def redacted(text: str) -> str:
    """``text`` with the value of every environment variable a suite's path expanded replaced by
    the variable's name, ``${NAME}`` (the longest value first)."""
    for value in sorted(_EXPANDED, key=len, reverse=True):
        text = text.replace(value, _EXPANDED[value])
    return text
