"""Model-blind methods: explanations that are the same for every model, flagged instead of ranked.

The rule, stated here once: a method is model-blind on a score table when every one of its
scores is flagged ``zero_reference_spread``. Why that is the test: an anomaly score divides by the
references' mean pairwise distance on the image (a reference's own score, leave-one-out, by the
pairs without it); distances are never negative, so a mean of 0 means every pair in it is at
distance 0, and with 3 references or more every pair lies in some reference's leave-one-out set.
Flagged on every image, the references' maps are identical everywhere: the method's maps do not
depend on the model (an edge detector, a map drawn from the image alone), every score is 0 / 0,
and every Abar is undefined. Table 1 would read 0 for it ("missed"), the zoo would rank it and
McNemar would compare detections that do not exist; so Tables 1 and 2, the report and the zoo
summary say "model-blind" in words and leave it out of rankings, comparisons and "missed by"
lines. A method whose references agree on some images only still has scores on the others and is
treated as usual.
"""
from __future__ import annotations

from typing import Mapping

import pandas as pd

from counteraudit.evaluate.scoring.detection import check_columns
from counteraudit.evaluate.scoring.scores import FLAG_ZERO_REFERENCE_SPREAD

MODEL_BLIND = "model-blind"  # what a blind method's cells read in Tables 1 and 2
COLUMNS = ["method", "n_reference_pairs", "n_images", "n_scores", "n_zero_spread", "model_blind"]
IMAGE_KEYS = ("image_set", "layer", "image")  # what tells two scored images apart


def model_blind_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Per method of an anomaly-score table (``scores.anomaly_scores`` with a ``method`` column):
    n_reference_pairs (among all the references), n_images, n_scores, n_zero_spread (scores flagged
    ``zero_reference_spread``) and model_blind (every score so flagged: the module's rule). A
    table without flags (one built by hand) holds no evidence of blindness: nothing is blind."""
    check_columns(scores, ["method"], "scores")
    rows = []
    for method, group in scores.groupby("method", sort=False):
        # a reference is scored against the n - 1 others: the full set is one larger
        n_references = (int((group["n_references"] + group["is_reference"].astype(int)).max())
                        if {"n_references", "is_reference"} <= set(group.columns) else 0)
        zero_spread = (int((group["flag"] == FLAG_ZERO_REFERENCE_SPREAD).sum())
                       if "flag" in group.columns else 0)
        rows.append({"method": method, "n_reference_pairs": n_references * (n_references - 1) // 2,
                     "n_images": len(group[[k for k in IMAGE_KEYS if k in group]].drop_duplicates()),
                     "n_scores": len(group), "n_zero_spread": zero_spread,
                     "model_blind": len(group) > 0 and zero_spread == len(group)})
    return pd.DataFrame(rows, columns=COLUMNS)


def blind_methods(table: pd.DataFrame | None, consequence: str) -> dict[str, str]:
    """Model-blind method -> the sentence that says so, ending with ``consequence`` (what the
    table cannot do with it); empty for None (a run without the table)."""
    if table is None:
        return {}
    return {row.method: (f"{row.method}: model-blind \u2014 its maps are the same for every model "
                         f"(all {row.n_reference_pairs} reference pairs at distance 0 on all "
                         f"{row.n_images} images); {consequence}")
            for row in table.itertuples(index=False) if bool(row.model_blind)}


DETECTION_CONSEQUENCE = "no detection is possible, so it is not ranked"
LOCALIZATION_CONSEQUENCE = ("every anomaly score is 0 / 0, so it has no AUROC: whatever its maps "
                            "show of the input, this score cannot measure it")


def detection_blind(tables: Mapping[str, pd.DataFrame], distance_name: str) -> dict[str, str]:
    """The model-blind methods of a run's detection tables, with their sentences."""
    return blind_methods(tables.get(f"detection-model-blind-{distance_name}"),
                         DETECTION_CONSEQUENCE)


def localization_blind(tables: Mapping[str, pd.DataFrame], distance_name: str) -> dict[str, str]:
    """The model-blind methods of a run's localization tables, with their sentences."""
    return blind_methods(tables.get(f"localization-model-blind-{distance_name}"),
                         LOCALIZATION_CONSEQUENCE)


def mark_columns(table: pd.DataFrame, methods) -> pd.DataFrame:
    """Table 1's form (a column per method): the blind methods' cells read ``MODEL_BLIND``."""
    blind = [m for m in methods if m in table.columns]
    if not blind:
        return table
    table = table.astype({m: object for m in blind})
    table.loc[:, blind] = MODEL_BLIND
    return table


def mark_rows(table: pd.DataFrame, methods, key: str = "method") -> pd.DataFrame:
    """Table 2's form (a row per method): every other cell of a blind method's row reads
    ``MODEL_BLIND``."""
    rows = table[key].isin(list(methods))
    if not rows.any():
        return table
    cells = [c for c in table.columns if c != key]
    table = table.astype({c: object for c in cells})
    table.loc[rows, cells] = MODEL_BLIND
    return table
