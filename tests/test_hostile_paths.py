"""A hostile runs folder: a symbolic link planted anywhere in a finished run (the worlds' folder, a
suite's tables, scores, report and Slurm logs, the store's CPU probe and image sets, a model's lock
file, a world's file) that leads outside is refused by every command, with one message naming the
link, and nothing outside the runs folder is read or written. Suites named like the runs folder's
own folders are refused when read."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from conftest import write_suite
from counteraudit.evaluate.detect import get_args_parser as detect_parser
from counteraudit.evaluate.detect import main as detect_main
from counteraudit.evaluate.report import get_args_parser as report_parser
from counteraudit.evaluate.report import main as report_main
from counteraudit.slurm.errors import ItemsFailedError
from counteraudit.slurm.executor_config import ExecutorConfig
from counteraudit.train.core.artifacts import RunsFolderError, artifact_lock, atomic_write_text
from counteraudit.train.core.runs_folder import runs_folder_bound
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.train.core.command_line import run_cli
from counteraudit.train import cpu_probe
from counteraudit.train.core.stage import StageItem, StagePlan, run_stage
from counteraudit.train.train import get_args_parser as train_parser
from counteraudit.train.train import main as train_main
from test_runs_folder_safety import _listing

COMMANDS = {"detect": (detect_parser, detect_main, ["--distance", "l2"]),
            "report": (report_parser, report_main, ["--distance", "l2"]),
            "train": (train_parser, train_main, [])}


def _model(runs: Path) -> Path:
    return sorted((runs / "store" / "models").iterdir())[0]


def _untrained(runs: Path, count: int = 1) -> list[Path]:
    """``count`` stored models made to read as untrained (their marker removed), so that the
    train command makes them again."""
    models = sorted((runs / "store" / "models").iterdir())[:count]
    for model in models:
        (model / "metrics.json").unlink()
    return models


def _replace(path: Path, victim: Path) -> Path:
    """``path`` (a folder or file of the run) replaced by a link to ``victim``."""
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    path.symlink_to(victim)
    return path


def _world_file(runs: Path, victim: Path) -> Path:
    """A world's cached split moved to the victim's folder and linked back: a stranger's file."""
    cached = sorted((runs / "worlds").glob("*/val.npz"))[0]
    shutil.move(cached, victim / "val.npz")
    cached.symlink_to(victim / "val.npz")
    return cached


def _training_lock(runs: Path, victim: Path) -> Path:
    """A dangling link as a model's lock file, pointing at a file the victim does not have yet."""
    lock = _untrained(runs)[0] / "training.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim / "planted.lock")
    return lock


# (where the link is planted, the command that meets it, extra arguments)
PLANTED = {
    "runs/worlds": (lambda runs, suite, victim: _replace(runs / "worlds", victim), "detect", []),
    "suite tables": (lambda runs, suite, victim: _replace(runs / suite / "tables", victim), "detect", []),
    "suite scores": (lambda runs, suite, victim: _replace(runs / suite / "scores", victim), "detect", []),
    "suite report": (lambda runs, suite, victim: _replace(runs / suite / "report", victim), "report", []),
    "suite slurm-logs": (lambda runs, suite, victim: _replace(runs / suite / "slurm-logs", victim),
                         "detect", []),
    "store/cpu-probe": (lambda runs, suite, victim: (_untrained(runs), _replace(
        runs / "store" / "cpu-probe", victim))[1], "train", []),
    "store/image_sets": (lambda runs, suite, victim: _replace(runs / "store" / "image_sets", victim),
                         "detect", []),
    "a world's file": (lambda runs, suite, victim: _world_file(runs, victim), "detect", []),
    "training.lock, dangling": (lambda runs, suite, victim: _training_lock(runs, victim), "train", []),
}


@pytest.fixture
def hostile(finished_run, tmp_path) -> tuple[Path, Path, Path]:
    """(suite file, a copy of the finished run's runs folder, a victim folder beside it)."""
    suite, runs, _ = finished_run
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy, symlinks=True)  # the suite's links into the store are relative
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work\n")
    return suite, copy, victim


@pytest.mark.parametrize("where", list(PLANTED))
def test_a_planted_link_that_leads_outside_is_refused_and_nothing_outside_changes(hostile, capsys, monkeypatch,
                                                                                 where):
    suite, runs, victim = hostile
    if where == "store/cpu-probe":  # the probe writes there only where it is on (conftest turns it off)
        monkeypatch.delenv(cpu_probe.ENV_VAR, raising=False)
    plant, command, extra = PLANTED[where]
    link = plant(runs, load_suite(suite).name, victim)
    before = _listing(victim)
    parser, main, options = COMMANDS[command]
    with pytest.raises(SystemExit) as caught:
        run_cli(main, parser(), parser().parse_args(
            ["--suite", str(suite), "--runs-dir", str(runs), "--no-progress", *options, *extra]))
    message = capsys.readouterr().err
    assert caught.value.code == 2, message
    assert f"outside the runs folder {runs.resolve()}, through the symbolic link {link} -> " in message
    assert f"remove the link ({link})" in message and "Traceback" not in message
    assert _listing(victim) == before  # nothing written there, not even an empty lock file


@dataclasses.dataclass(frozen=True, kw_only=True)
class PathItem(StageItem):
    path: Path


def write_in_worker(item: PathItem) -> None:
    atomic_write_text(item.path, "written by a worker\n")


def test_work_items_in_worker_processes_keep_to_the_commands_runs_folder(tmp_path):
    """A stage's items run in spawned workers (--jobs 2) are checked against the runs folder of
    the command that started them, like the command's own writes."""
    runs, victim = tmp_path / "runs", tmp_path / "victim"
    victim.mkdir()
    (runs / "suite").mkdir(parents=True)
    (runs / "suite" / "tables").symlink_to(victim)
    suite = load_suite("quick")
    with runs_folder_bound(runs), pytest.raises(ItemsFailedError) as caught:
        run_stage("probe", write_in_worker,
                  StagePlan([runs / "suite" / "kept.txt", runs / "suite" / "tables" / "x.txt"]),
                  ExecutorConfig(local_jobs=2), item_name=lambda item: str(item.path),
                  to_items=lambda paths: [PathItem(suite=suite, runs_dir=None, path=path) for path in paths])
    assert caught.value.failed_item_names[0].endswith("x.txt") and len(caught.value.failures) == 1
    assert "outside the runs folder" in caught.value.failures[0].reason
    assert (runs / "suite" / "kept.txt").read_text() == "written by a worker\n"  # the workers ran
    assert _listing(victim) == {}


def test_a_lock_file_that_is_a_link_is_never_opened_through_it(tmp_path):
    """Even a link that stays inside the runs folder: a lock is a plain file the tool makes."""
    runs = tmp_path / "runs"
    (runs / "models").mkdir(parents=True)
    (runs / "notes.txt").write_text("kept\n")
    (runs / "models" / "training.lock").symlink_to(runs / "notes.txt")
    with runs_folder_bound(runs), pytest.raises(RunsFolderError, match="is a symbolic link"):
        with artifact_lock(runs / "models", "training.lock", "train", "training"):
            pass
    assert (runs / "notes.txt").read_text() == "kept\n"


@pytest.mark.parametrize("name", ["store", "worlds", "slurm-logs", "Store"])
def test_a_suite_named_like_the_runs_folders_own_folders_is_refused(tmp_path, capsys, name):
    suite = write_suite(tmp_path / "own.toml")
    suite.write_text(suite.read_text().replace('name = "own"', f'name = "{name}"', 1))
    with pytest.raises(SuiteFileError, match=f"name = '{name}' .* is the name of a folder the runs "
                                             "folder keeps for every suite"):
        load_suite(suite)
    with pytest.raises(SystemExit) as caught:
        run_cli(train_main, train_parser(), train_parser().parse_args(
            ["--suite", str(suite), "--runs-dir", str(tmp_path / "runs"), "--no-progress"]))
    assert caught.value.code == 2 and "give the suite another name" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
