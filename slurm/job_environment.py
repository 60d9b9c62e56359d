"""Environment variables that every Slurm job gets as ``export`` lines of its batch script.

A job's processes must compute as the submitting one does (the numeric mode, which a library
reads from the environment before it runs a kernel), also on a cluster whose sbatch passes no
environment on (``--export=NONE``, or SBATCH_EXPORT=NONE set by the site). Whoever owns such a
variable names it here with ``carry``; its value is quoted for the shell.
"""
from __future__ import annotations

import os
import shlex

_CARRIED: list[str] = []


def carry(*names: str) -> None:
    _CARRIED.extend(name for name in names if name not in _CARRIED)


def carried() -> tuple[str, ...]:
    """The names ``carry`` was given."""
    return tuple(_CARRIED)


def export_lines() -> list[str]:
    """One ``export NAME='value'`` line per carried variable set in this process."""
    return [f"export {name}={shlex.quote(os.environ[name])}" for name in _CARRIED
            if name in os.environ and name.isidentifier()]
