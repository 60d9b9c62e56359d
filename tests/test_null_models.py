"""Held-out references as null models ([references] held_out): the suite, the explain plan and
the null row of Table 1 (the detection rule's empirical false-positive rate)."""
import pandas as pd
import pytest

from counteraudit.evaluate.scoring.baseline import null_rate_table
from counteraudit.evaluate.scoring.detection import (NULL_FAMILY, ROLE_NULL, detection_fractions,
                                             detection_table, null_rates)
from counteraudit.explain.stage import sets_for
from counteraudit.train.core.suite import load_suite
from tests.conftest import write_suite

BACKDOOR = """
[[anomalies]]
name = "backdoor"
family = "backdoor"
params = { nu = 0.1, target = 0 }
"""


def suite_with(tmp_path, references: str, name: str = "nulls", body: str = BACKDOOR,
               count: int = 3):
    """A tiny suite of ``count`` references whose [references] table gets ``references`` added."""
    path = write_suite(tmp_path / f"{name}.toml", body=body, references=count)
    path.write_text(path.read_text().replace("[references]\n", f"[references]\n{references}\n"))
    return load_suite(path)


def test_held_out_references_are_the_next_seeds_trained_like_the_references(tmp_path):
    suite = suite_with(tmp_path, "held_out = 2")
    assert [s.name for s in suite.held_out] == ["held-out-00", "held-out-01"]
    assert [s.seed for s in suite.references] == [0, 1, 2]
    assert [s.seed for s in suite.held_out] == [3, 4]
    # trained like references: a suite with 5 references has these very models (one store key)
    more = suite_with(tmp_path, "", name="five", count=5)
    assert [s.key for s in suite.held_out] == [s.key for s in more.references[3:]]
    assert [s.name for s in suite.models] == ["reference-00", "reference-01", "reference-02",
                                              "held-out-00", "held-out-01", "backdoor"]
    # explained on the detection set only, where they are scored
    assert sets_for(suite, suite.model("held-out-00")) == ["detection"]
    assert sets_for(suite, suite.model("reference-00")) == ["detection", "backdoor-abnormal"]
    assert suite_with(tmp_path, "", name="none").held_out == []


@pytest.mark.parametrize("value", ["-1", "2.5", "true", '"8"'])
def test_held_out_that_is_not_a_whole_number_is_one_clear_error(tmp_path, value):
    with pytest.raises(ValueError, match=r"\[references\] held_out = .* must be"):
        suite_with(tmp_path, f"held_out = {value}")


def constructed_scores(abars: dict[str, float]) -> pd.DataFrame:
    """Two images per model whose scores average to the given Abar, for one method."""
    rows = []
    for model, abar in abars.items():
        for image, offset in enumerate((-0.1, 0.1)):
            rows.append({"method": "gradcam", "model": model, "image": image,
                         "score": abar + offset, "flag": "ok"})
    return pd.DataFrame(rows)


def test_the_null_row_counts_the_held_out_models_the_rule_flags():
    references = ["reference-00", "reference-01", "reference-02"]
    nulls = ["held-out-00", "held-out-01", "held-out-02", "held-out-03"]
    scores = constructed_scores({"reference-00": 1.0, "reference-01": 1.3, "reference-02": 1.1,
                                 # two above the highest reference (1.3), one tied (not above)
                                 "held-out-00": 1.4, "held-out-01": 0.9, "held-out-02": 2.0,
                                 "held-out-03": 1.3, "backdoor": 5.0})
    table = detection_table(scores, references, families={"backdoor": "backdoor"},
                            null_models=nulls).set_index("model")
    assert (table.loc[nulls, "role"] == ROLE_NULL).all()
    assert (table.loc[nulls, "family"] == NULL_FAMILY).all()
    assert table.loc[nulls, "detected"].tolist() == [True, False, True, False]
    rates = null_rates(table.reset_index(), len(references)).iloc[0]
    assert (rates["n_null"], rates["n_detected"]) == (4, 2)
    assert rates["false_positive_rate"] == 0.5 and rates["expected_rate"] == 0.25
    # the null models are not a family of Table 1
    assert set(detection_fractions(table.reset_index())["family"]) == {"backdoor"}
    cell = null_rate_table(null_rates(table.reset_index(), len(references)))
    assert cell["false_positive_rate"].tolist() == ["2/4 = 0.50 [0.07, 0.93]"]
