"""The main job end to end on a tiny suite: training, implant checks, image sets, explanations,
scores, Table 1 and Table 2, and a rerun that does no work."""
import subprocess
import sys

import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from counteraudit.evaluate import detect
from tests.conftest import ONE_PROCESS, REPO, run_in_process  # the finished_run fixture is in conftest.py
from tests.conftest import write_suite


def test_detect_prints_and_saves_table1(finished_run):
    suite, runs, out = finished_run
    assert "Table 1" in out and "distance: l2" in out
    # no null models: right under Table 1, its detections are said to be the paper's rule, with
    # the chance a method that sees nothing has against this suite's 3 references
    caution = ("Every detection in Table 1 is the paper's rule, not a statistical verdict: a "
               "method that sees nothing flags 1 model in 4")
    assert caution in out
    table1_at = out.index("Table 1 -- ")
    assert table1_at < out.index(caution) < out.index("Per model: margin")
    tables = runs / "e2e" / "tables"
    for ext in ("md", "csv", "tex"):
        assert (tables / f"detection-l2.{ext}").is_file()
    table1 = pd.read_csv(tables / "detection-l2.csv")
    assert set(table1["family"]) == {"backdoor", "randomized_smoothing"}
    assert {"guided_backprop", "outputs_only"} <= set(table1.columns)
    per_model = pd.read_csv(tables / "detection-per-model-l2.csv")
    assert len(per_model) == 2 * 5  # 2 methods x (3 references + 2 anomalies)
    # Table 1 re-derived from the per-model margins: detected means strictly above every
    # reference (margin > 1), and a family's cell is the fraction of its models detected
    anomalous = per_model[per_model["role"] == "anomalous"]
    assert (anomalous["detected"].astype(bool) == (anomalous["margin"] > 1)).all()
    for method in ("guided_backprop", "outputs_only"):
        rows = anomalous[anomalous["method"] == method]
        expected = rows.groupby("family")["detected"].apply(lambda d: d.astype(bool).mean())
        got = table1.set_index("family")[method]
        pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False)
    assert (runs / "e2e" / "image_sets" / "detection" / "index.json").is_file()
    assert len(list((runs / "e2e" / "image_sets" / "detection" / "png").glob("*.png"))) == 8
    implants = list((runs / "store" / "models").glob("*/implant-*.json"))
    assert len(implants) == 2


def test_rerun_does_no_work_and_localize_gives_table2(finished_run):
    suite, runs, _ = finished_run
    # in this process: finished_run starts localize.py as a command
    out = run_in_process("evaluate/localize.py", "--suite", suite, "--runs-dir", runs, "--distance",
                         "l2", "--no-progress", *ONE_PROCESS)
    assert "0 visualization set(s) computed" in out and "Table 2" in out
    # fewer references and images than the paper: the table says what that does to AUROCs
    assert "uses 3 references and p = 4 images per set (the paper: 12 and 40)" in out
    table = pd.read_csv(runs / "e2e" / "tables" / "localization-per-model-l2.csv")
    assert set(table["model"]) == {"backdoor"}  # the only localizable anomaly
    # each AUROC re-computed with scikit-learn from the stored per-image scores it came from
    scores = runs / "e2e" / "scores" / "l2"
    for _, row in table.iterrows():
        normal = pd.read_csv(scores / row["method"] / "detection.csv")
        abnormal = pd.read_csv(scores / row["method"] / "backdoor-abnormal.csv")
        normal = normal[normal["model"] == row["model"]]["score"].to_numpy()[:4]
        abnormal = abnormal[abnormal["model"] == row["model"]]["score"].to_numpy()
        labels = [1] * len(abnormal) + [0] * len(normal)
        assert row["auroc"] == pytest.approx(roc_auc_score(labels, [*abnormal, *normal]))
    assert (table["n_abnormal"] == 4).all() and (table["n_normal"] == 4).all()


def test_a_method_run_writes_its_tables_beside_the_suites(finished_run, capsys):
    """detect --method X (e.g. a newly added method) scores X alone: its one-column tables go to
    tables/method-X/, and every table of the suite's own run stays byte for byte as it was."""
    suite, runs, _ = finished_run
    tables = runs / "e2e" / "tables"
    before = {path: path.read_bytes() for path in tables.rglob("*") if path.is_file()}
    assert tables / "detection-l2.csv" in before
    args = detect.get_args_parser().parse_args(["--suite", str(suite), "--runs-dir", str(runs),
                                                "--distance", "l2", "--no-progress",
                                                "--method", "outputs_only"])
    detect.main(args)
    assert f"tables: {tables / 'method-outputs_only'}/" in capsys.readouterr().out
    after = {path: path.read_bytes() for path in tables.rglob("*") if path.is_file()}
    assert {path: after[path] for path in before} == before
    table1 = pd.read_csv(tables / "method-outputs_only" / "detection-l2.csv")
    assert "outputs_only" in table1.columns and "guided_backprop" not in table1.columns
    assert "guided_backprop" in pd.read_csv(tables / "detection-l2.csv").columns


def test_reference_count_recomputes_table2_at_the_full_reference_set(finished_run):
    suite, runs, _ = finished_run
    run_in_process("evaluate/localize.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
                   "--no-progress", *ONE_PROCESS)
    out = run_in_process("evaluate/reference_count.py", "--suite", suite, "--runs-dir", runs,
                         "--subsets", "3")
    assert "n=2 |" in out and "n=3 |" in out
    table2 = pd.read_csv(runs / "e2e" / "tables" / "localization-per-model-l2.csv")
    for _, row in table2.iterrows():  # with all 3 references it is Table 2's own AUROC
        line = next(text for text in out.splitlines()
                    if f"| {row['model']} " in text and f" {row['method']} " in text)
        assert line.rstrip(" |").split("|")[-1].strip() == f"{row['auroc']:.2f}", line


def test_unavailable_lpips_is_an_error_not_a_substitution(finished_run, tmp_path):
    suite, runs, _ = finished_run
    result = subprocess.run([sys.executable, str(REPO / "evaluate/detect.py"), "--suite", str(suite),
                             "--runs-dir", str(runs), "--distance", "lpips-alex",
                             "--weights-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=600,
                            env={"TORCH_HOME": str(tmp_path / "hub"), "PATH": "/usr/bin:/bin"})
    assert result.returncode != 0
    assert "alexnet-owt-7be5be79.pth" in result.stderr


def test_explain_stage_trains_the_models_it_needs_first(tmp_path):
    """explain/run.py on a suite nothing of which is trained: the training stage (and the implant
    checks the image sets need) runs first instead of the explain items failing."""
    body = """
[[anomalies]]
name = "backdoor"
family = "backdoor"
params = { nu = 0.3, size = 0.2 }

[explain]
methods = ["outputs_only"]

[evaluate]
detection_images = 4
localization_images = 2
"""
    suite = write_suite(tmp_path / "fresh.toml", body=body, references=3, epochs=1)
    runs = tmp_path / "runs"
    out = run_in_process("explain/run.py", "--suite", suite, "--runs-dir", runs, "--no-progress", *ONE_PROCESS)
    assert "Implant checks" in out
    assert "8 visualization set(s) computed" in out  # 4 models on detection + 4 on the abnormal set
    assert len(list((runs / "fresh" / "models").glob("*/metrics.json"))) == 4
