"""Where a run's numbers were computed: the numeric mode, instruction set, CPU and library
versions of the scoring process and of the models' training (each model's metrics.json), so a
table read beside another says whether their bits can agree (train/README.md, "Portable
numerics")."""
from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from counteraudit.train.core import numerics

FACTS = ("mode", "instruction_set", "cpu", "torch", "numpy")
PROVENANCE = "provenance"  # the table's file name


def provenance_table(models: int, metrics: Iterable[dict[str, Any]] = ()) -> pd.DataFrame:
    """One row for this (scoring) process of ``models`` models, then one per distinct way the
    trained ones were made (``metrics``: their metrics.json), with how many: stage, models,
    mode, instruction_set, cpu, torch, numpy. A model trained before numerics were recorded
    counts as "unrecorded"."""
    here = numerics.record()
    rows = [{"stage": "scoring", "models": models, **{f: here.get(f) for f in FACTS}}]
    made: dict[tuple, int] = {}
    for record in metrics:
        facts = tuple(str((record.get("numerics") or {}).get(f, "unrecorded")) for f in FACTS)
        made[facts] = made.get(facts, 0) + 1
    rows += [{"stage": "training", "models": count, **dict(zip(FACTS, facts))}
             for facts, count in made.items()]
    return pd.DataFrame(rows, columns=["stage", "models", *FACTS])
