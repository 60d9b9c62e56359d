"""The table of explanation methods (evaluate/benchmarks/methods.py) is generated from the registry:
every shipped method has a row with each of its parameters and their defaults, and
explain/README.md holds that table, a row per shipped method with the generated cells (only
the timing columns, measured on one machine, are not compared). A user's plug-in file's methods
(--plugins) are not the guide's to list: the checks pass with one loaded."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from counteraudit.evaluate.benchmarks.methods import COLUMNS, markdown_table, method_facts
from counteraudit.explain.base import METHODS

GUIDE = Path(__file__).resolve().parents[1] / "explain" / "README.md"


def table_rows(markdown: str) -> dict[str, list[str]]:
    """The cells of every row of the Markdown tables whose first cell is a `name`, by name."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_table_lists_every_registered_method_with_its_parameters():
    rows = table_rows(markdown_table([method_facts(name) for name in METHODS.shipped_names()]))
    assert sorted(rows) == sorted(METHODS.shipped_names())
    for name in METHODS.shipped_names():
        method, (_, parameters, renders, batch_invariant) = METHODS.get(name), rows[name]
        for field in dataclasses.fields(method.Params):
            assert f"`{field.name}" in parameters, (name, field.name, parameters)
        assert renders == getattr(method, "renders", "images")
        assert batch_invariant == ("yes" if method.batch_invariant else "no")
    assert "`steps = 512`" in rows["caricature"][1]  # a default, as a suite file writes it
    assert '`gradient_space = "pixels"`' in rows["guided_backprop"][1]


def test_the_guide_holds_the_generated_table_with_a_row_for_every_method():
    in_guide = table_rows(GUIDE.read_text())
    missing = sorted(set(METHODS.shipped_names()) - set(in_guide))
    assert not missing, (f"explain/README.md's table of methods has no row for {missing}: paste "
                         "the table `python evaluate/benchmarks/methods.py` prints")
    for name in METHODS.shipped_names():
        generated = [method_facts(name)[column] for column in COLUMNS]
        assert in_guide[name][:len(COLUMNS)] == generated, (
            f"explain/README.md's row for {name!r} differs from the registry's: paste the table "
            "`python evaluate/benchmarks/methods.py` prints")
