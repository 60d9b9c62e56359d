"""The README's table of what the demo finds: rendered by evaluate/reporting/readme_table.py from a
run's Tables 1 and 2, and the README holds exactly what it renders from the demo run's tables
stored in tests/data/demo_tables/ (copied from runs/demo/tables/ of the run the README names).

What this cannot check: that a demo run of today's code gives those stored tables (that takes a
whole demo run). After a new demo run, copy its two files there and paste the command's output."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from counteraudit.evaluate.reporting.readme_table import findings_table, findings_table_from, main
from counteraudit.train.core.suite import load_suite

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "tests" / "data" / "demo_tables"
START, END = "<!-- demo-findings:", "<!-- end demo-findings -->"


def readme_table() -> str:
    text = (REPO / "README.md").read_text()
    assert START in text and END in text, f"README.md has no table between {START!r} and {END!r}"
    return text.split(START, 1)[1].split("\n", 1)[1].split(END, 1)[0].strip()


def test_a_cell_says_detected_and_the_auroc_where_the_model_localizes():
    detection = pd.DataFrame({
        "method": ["gbp", "gbp", "gbp", "car", "car", "car"],
        "model": ["reference-00", "backdoor", "smooth"] * 2,
        "role": ["reference", "anomalous", "anomalous"] * 2,
        "detected": [None, True, False, None, False, True]})
    localization = pd.DataFrame({"method": ["gbp", "car (1,1)", "car layer average"],
                                 "backdoor": [0.875, 0.2, 0.3]})
    lines = findings_table(detection, localization).splitlines()
    assert [cell.strip() for cell in lines[0].strip("|").split("|")] == ["model", "gbp", "car"]
    assert [cell.strip() for cell in lines[2].strip("|").split("|")] == ["backdoor", "yes (0.88)", "no (0.30)"]
    assert [cell.strip() for cell in lines[3].strip("|").split("|")] == ["smooth", "no", "yes"]
    assert len(lines) == 4  # header, rule, one row per anomalous model: no reference row


def test_the_readme_table_is_rendered_from_the_stored_demo_tables(tmp_path, capsys):
    expected = findings_table_from(STORED)
    assert readme_table() == expected.strip(), (
        "README.md's demo table differs from what evaluate/reporting/readme_table.py renders from "
        f"{STORED}; paste the output of: python -m counteraudit.evaluate.reporting.readme_table")
    # one row per anomalous model of the demo suite, in its order: these are the demo's tables
    rows = [re.match(r"\|\s*(\S+)", line).group(1) for line in expected.splitlines()[2:]]
    assert rows == [spec.name for spec in load_suite("demo").anomalies]
    # the command reads a runs folder's <suite>/tables/
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "tables").symlink_to(STORED)
    main(argparse.Namespace(suite="demo", runs_dir=tmp_path, distance="l2"))
    assert capsys.readouterr().out.strip() == expected.strip()
