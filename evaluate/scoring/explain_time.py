"""What each method's explanations cost: one row per method, from the ``timing`` every computed
result records where it ran (explain/store.py), summed over the suite's (model, image set)
results.

- ``results``: the suite's results of the method; ``timed_results``: those with a recorded cost
  (a result stored by a version before timings, or made only of rows another stored result
  held, has none, and is left out of the sums rather than counted as free);
- ``images``: images explained in the timed results (rows taken from a stored result of the same
  draw are not counted: they cost nothing here);
- ``seconds`` (wall) and ``cpu_seconds`` (the worker process's, every thread), and
  ``cpu_seconds_per_image``. Results computed for another suite and reused here keep the cost of
  their first run, on whichever machine computed them: compare methods only within a run made on
  one machine (``explain/README.md`` holds a per-image benchmark on one CPU).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from counteraudit.explain.stage import result_dir, sets_for
from counteraudit.explain.store import stored_timing, total_timing
from counteraudit.train.core.suite import Suite

EXPLAIN_TIME = "explain-time"  # the table's file name
EXPLAIN_TIME_CAPTION = (
    "What each method's explanations cost, as recorded where each result was computed: wall and "
    "CPU seconds summed over the suite's results (timed_results of results; rows reused from a "
    "stored result of the same draw cost nothing and are not counted in images)")
COLUMNS = ["method", "results", "timed_results", "images", "seconds", "cpu_seconds",
           "cpu_seconds_per_image"]


def explain_time_table(suite: Suite, methods: Sequence[str], runs_root=None) -> pd.DataFrame:
    """One row per method (``COLUMNS``), in the order of ``methods``."""
    root = Path(suite.root(runs_root))
    rows = []
    for method in methods:
        timings = [stored_timing(result_dir(root, method, spec.name, image_set))
                   for spec in suite.models for image_set in sets_for(suite, spec, method)]
        total = total_timing(timings) or {"seconds": np.nan, "cpu_seconds": np.nan, "images": 0}
        images = int(total["images"])
        rows.append({"method": method, "results": len(timings),
                     "timed_results": sum(t is not None for t in timings), "images": images,
                     "seconds": total["seconds"], "cpu_seconds": total["cpu_seconds"],
                     "cpu_seconds_per_image": total["cpu_seconds"] / images if images else np.nan})
    return pd.DataFrame(rows, columns=COLUMNS)
