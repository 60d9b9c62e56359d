"""Render result tables as Markdown (for the terminal and READMEs), CSV and LaTeX; write them atomically.

Self-contained renderers (pandas' ``to_markdown`` needs the optional ``tabulate``, and its LaTeX
output changes between versions), so a table looks the same on every machine.
"""
from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.stage import tables_dir
from counteraudit.train.core.artifacts import atomic_write_text

FORMATS = ("md", "csv", "tex")
LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _flat(frame: pd.DataFrame) -> pd.DataFrame:
    """Named or non-default indexes become ordinary columns, so nothing is dropped when rendering."""
    if not isinstance(frame.index, pd.RangeIndex) or any(name is not None for name in frame.index.names):
        frame = frame.reset_index()
    if isinstance(frame.columns, pd.MultiIndex):
        frame = frame.copy()
        frame.columns = [" ".join(str(p) for p in parts if str(p)) for parts in frame.columns]
    return frame


def format_cell(value, float_format: str = "{:.3f}", missing: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return missing
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return float_format.format(float(value))
    return str(value)


def _cells(frame: pd.DataFrame, float_format: str, missing: str) -> tuple[list[str], list[list[str]]]:
    frame = _flat(frame)
    header = [str(c) for c in frame.columns]
    body = [[format_cell(v, float_format, missing) for v in row] for row in frame.itertuples(index=False)]
    return header, body


def to_markdown(frame: pd.DataFrame, float_format: str = "{:.3f}", missing: str = "") -> str:
    """A Markdown table; a frame without columns (nothing measured) reads "(empty table)"."""
    header, body = _cells(frame, float_format, missing)
    if not header:  # not "|  |": say it
        return "(empty table)\n"
    escape = lambda text: text.replace("|", r"\|")  # noqa: E731 - a pipe would split the cell
    widths = [max([len(escape(h))] + [len(escape(r[k])) for r in body]) for k, h in enumerate(header)]
    numeric = [all(_looks_numeric(r[k]) for r in body) and bool(body) for k in range(len(header))]
    line = lambda cells: "| " + " | ".join(  # noqa: E731
        escape(c).rjust(w) if num else escape(c).ljust(w) for c, w, num in zip(cells, widths, numeric)) + " |"
    rule = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in body)]) + "\n"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return text == ""


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def to_latex(frame: pd.DataFrame, float_format: str = "{:.3f}", missing: str = "--",
             caption: str | None = None, label: str | None = None) -> str:
    """A booktabs ``tabular`` (in a ``table`` float when a caption or label is given)."""
    header, body = _cells(frame, float_format, missing)
    align = "".join("r" if body and all(_looks_numeric(r[k]) or r[k] == missing for r in body) else "l"
                    for k in range(len(header)))
    lines = [rf"\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(latex_escape(h) for h in header) + r" \\", r"\midrule",
             *(" & ".join(latex_escape(c) for c in row) + r" \\" for row in body),
             r"\bottomrule", r"\end{tabular}"]
    if caption or label:
        lines = [r"\begin{table}[t]", r"\centering", *lines,
                 *([rf"\caption{{{latex_escape(caption)}}}"] if caption else []),
                 *([rf"\label{{{label}}}"] if label else []), r"\end{table}"]
    return "\n".join(lines) + "\n"


def to_csv(frame: pd.DataFrame) -> str:
    return _flat(frame).to_csv(index=False)  # full precision: CSV is for machines


def write_table(frame: pd.DataFrame, path_stem: str | Path, formats: Sequence[str] = FORMATS, *,
                float_format: str = "{:.3f}", caption: str | None = None,
                label: str | None = None) -> list[Path]:
    """Write ``<path_stem>.md/.csv/.tex`` atomically; returns the paths written."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown table formats {unknown}; choose from {list(FORMATS)}")
    stem = Path(path_stem)
    if stem.suffix in {f".{f}" for f in FORMATS}:
        stem = stem.with_suffix("")  # accept "table1.md" as well as "table1"
    renderers = {"md": lambda: to_markdown(frame, float_format),
                 "csv": lambda: to_csv(frame),
                 "tex": lambda: to_latex(frame, float_format, caption=caption, label=label)}
    return [atomic_write_text(stem.with_name(f"{stem.name}.{fmt}"), renderers[fmt]()) for fmt in formats]


def write_tables(suite, tables: dict[str, pd.DataFrame], runs_root=None,
                 only_methods: list[str] | None = None,
                 parameters: Mapping[str, tuple[str, dict[str, Any]]] | None = None) -> list[Path]:
    """Every table of a stage under <runs>/<suite>/tables/<name>.{md,csv,tex}; with
    ``only_methods`` (a run's --method) under tables/method-<names>/ (``tables_dir``), never over
    the suite's own."""
    written = []
    for name, frame in tables.items():
        written += write_table(frame, tables_dir(suite, runs_root, only_methods, parameters) / name)
    return written
