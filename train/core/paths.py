"""Paths a suite file gives (a dataset's root, a user's image folder): ``${VAR}`` expanded, an
unset variable an error that says which to export."""
from __future__ import annotations

import os


def expand_path(value: str, what: str) -> str:
    expanded = os.path.expandvars(str(value))
    if "$" in expanded:
        raise ValueError(f"{what} {value!r} uses an unset environment variable; export it "
                         "(e.g. IMAGENET_ROOT=/datasets/imagenet)")
    return expanded
