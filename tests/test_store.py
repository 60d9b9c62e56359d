"""The store shared by every suite: a model, image set or visualization is made once, whichever
suite needs it; a corrupt artifact is named, set aside and recomputed alone; two runs that need
the same model at once train it once; an older runs folder is adopted, not recomputed."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from counteraudit.evaluate.scoring.explain_time import EXPLAIN_TIME

from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.suite import load_suite
from tests.conftest import ONE_PROCESS, REPO, in_process, write_suite


def files(runs: Path) -> dict[str, tuple[int, int]]:
    """Every real file under ``runs`` (links are not followed: the store holds the files) with its
    size and modification time, but the tables, which every run writes anew."""
    found = {}
    for folder, _, names in os.walk(runs):
        for name in names:
            path = Path(folder) / name
            if path.is_symlink() or "tables" in path.relative_to(runs).parts:
                continue
            stat = path.stat()
            found[str(path.relative_to(runs))] = (stat.st_size, stat.st_mtime_ns)
    return found


def changed(before: dict, after: dict) -> set[str]:
    return {path for path in after if before.get(path) != after[path]}


def tables(runs: Path, suite: str) -> dict[str, str]:
    """The suite's tables but explain-time, which records what the results cost: a recomputed
    result's cost is measured anew."""
    return {p.name: p.read_text() for p in sorted((runs / suite / "tables").glob("*.csv"))
            if p.stem != EXPLAIN_TIME}


def detect(suite, runs) -> subprocess.CompletedProcess:
    """detect.py in this process (the session's finished_run starts it as a command)."""
    return in_process("evaluate/detect.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
               "--no-progress", *ONE_PROCESS)


@pytest.fixture
def e2e(finished_run):
    """The session's finished end-to-end run (conftest.py): each test copies it before changing
    anything, so one training and explaining serves the pipeline, report and store tests."""
    suite, runs, _ = finished_run
    return suite, runs


def test_a_suite_finds_what_another_computed(e2e, tmp_path):
    """A second suite with one more reference trains only that reference and explains only the
    sets the first did not: its new reference's and the abnormal set (judged anew: it depends on
    nothing shared), never the shared models' detection sets."""
    suite, runs = e2e
    runs = Path(shutil.copytree(runs, tmp_path / "runs", symlinks=True))
    bigger = tmp_path / "bigger.toml"
    bigger.write_text(f'extends = "{suite}"\n[references]\ncount = 4\n')
    before = files(runs)
    out = detect(bigger, runs).stdout
    new_models = {Path(p).parts[2] for p in changed(before, files(runs))
                  if p.startswith("store/models/") and p.endswith("weights.pth")}
    assert new_models == {load_suite(bigger).model("reference-03").key}
    # detect.py explains the detection sets: 2 methods x the new reference's; the 5 shared
    # models' 2 x 5 are stored
    assert "2 visualization set(s) computed, 10 already stored" in out
    assert (runs / "bigger" / "models").is_dir() and (runs / "bigger" / "tables").is_dir()


@pytest.mark.parametrize("victim", ["weights", "visualization", "score table"])
def test_a_corrupt_artifact_is_named_and_recomputed_alone(e2e, tmp_path, victim):
    suite, runs = e2e
    runs = Path(shutil.copytree(runs, tmp_path / "runs", symlinks=True))
    expected = tables(runs, "e2e")
    spec = load_suite(suite).model("reference-01")
    if victim == "weights":
        path = model_dir(runs, spec) / "weights.pth"
    elif victim == "visualization":
        path = (runs / "e2e" / "visualizations" / "guided_backprop" / "reference-01" / "detection"
                / "explanation.npz").resolve()
    else:
        path = runs / "e2e" / "scores" / "l2" / "guided_backprop" / "detection.csv"
    path.write_bytes(path.read_bytes()[:1000])  # truncated, as a full disk or a killed copy leaves it
    before = files(runs)
    result = detect(suite, runs)
    assert f"{path} is corrupt" in result.stderr
    assert (path.parent / (path.name + ".corrupt")).is_file()  # kept for a person to look at
    redone = {str(Path(p).parent) for p in changed(before, files(runs))}
    assert redone == {str(path.parent.relative_to(runs))}, redone  # that artifact's folder only
    assert tables(runs, "e2e") == expected
    assert "is corrupt" not in detect(suite, runs).stderr  # repaired: a rerun finds it whole


def test_two_runs_that_need_one_model_train_it_once(tmp_path):
    """Two processes, two suites, the same two references, started together."""
    first = write_suite(tmp_path / "first.toml", references=2, epochs=1)
    second = tmp_path / "second.toml"
    second.write_text(f'extends = "{first}"\n')
    runs = tmp_path / "runs"
    processes = [subprocess.Popen([sys.executable, str(REPO / "train/train.py"), "--suite", str(s),
                                   "--runs-dir", str(runs), "--no-progress", "--jobs", "1"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for s in (first, second)]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    both = "\n".join(outputs)
    for name in ("reference-00", "reference-01"):
        assert both.count(f"[train] {name} epoch 1/1") == 1, both  # trained by one of them
    suite = load_suite(first)
    for spec in suite.models:
        folder = model_dir(runs, spec)
        assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("implant")) == \
            ["checkpoint.pth", "metrics.json", "spec.json", "training.lock", "weights.pth"]
    # and each suite reads it under its own name
    assert (runs / "second" / "models" / f"reference-00-{suite.references[0].key}" /
            "weights.pth").is_file()


def test_an_older_runs_folder_is_adopted_not_recomputed(e2e, tmp_path):
    """Before the store, a model lived in runs/<suite>/models/<name>-<key>/ and a visualization in
    runs/<suite>/visualizations/<method>/<model>/<set>/: a rerun moves them into the store."""
    suite, runs = e2e
    runs = Path(shutil.copytree(runs, tmp_path / "runs", symlinks=True))
    for link in [*(runs / "e2e" / "models").iterdir(),
                 *(runs / "e2e" / "visualizations").glob("*/*/*")]:
        target = link.resolve()
        link.unlink()
        shutil.move(target, link)  # the old layout: real folders in the suite's folder
    shutil.rmtree(runs / "store" / "models")
    shutil.rmtree(runs / "store" / "visualizations")
    out = detect(suite, runs).stdout
    assert "0 visualization set(s) computed" in out
    assert "epoch 1/" not in out  # nothing retrained
    assert all(link.is_symlink() for link in (runs / "e2e" / "models").iterdir())
    assert len(list((runs / "store" / "models").iterdir())) == 5
