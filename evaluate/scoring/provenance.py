"""Where a run's numbers were computed: the numeric mode, instruction set, CPU and library
versions of the scoring process and of the models' training (each model's metrics.json), so a
table read beside another says whether their bits can agree (train/README.md, "Portable
numerics")."""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from counteraudit.train.checkpoint import is_trained, model_dir, read_metrics
from counteraudit.train.core import numerics
from counteraudit.train.core.suite import ModelSpec

FACTS = ("mode", "instruction_set", "cpu", "torch", "numpy")
PROVENANCE = "provenance"  # the table's file name


def provenance_table(specs: Sequence[ModelSpec], runs_root=None) -> pd.DataFrame:
    """One row for this (scoring) process, then one per distinct way the trained ``specs`` were
    made, with how many models: stage, models, mode, instruction_set, cpu, torch, numpy.
    A model trained before numerics were recorded counts as "unrecorded"."""
    here = numerics.record()
    rows = [{"stage": "scoring", "models": len(specs), **{f: here.get(f) for f in FACTS}}]
    made: dict[tuple, int] = {}
    for spec in specs:
        if is_trained(model_dir(runs_root, spec)):
            record = read_metrics(model_dir(runs_root, spec)).get("numerics") or {}
            facts = tuple(str(record.get(f, "unrecorded")) for f in FACTS)
            made[facts] = made.get(facts, 0) + 1
    rows += [{"stage": "training", "models": count, **dict(zip(FACTS, facts))}
             for facts, count in made.items()]
    return pd.DataFrame(rows, columns=["stage", "models", *FACTS])
