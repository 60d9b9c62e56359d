"""A suite file from a stranger cannot write outside the runs folder, and the tool never moves or
deletes a folder it did not create."""
from __future__ import annotations

import argparse
import errno
import hashlib
from pathlib import Path

import pytest

from conftest import write_suite
from counteraudit.train.core.artifacts import RunsFolderError, atomic_write_json, inside_runs
from counteraudit.train.checkpoint import MODELS, SPEC_NAME, link_suite_models, model_dir
from counteraudit.train.core.command_line import add_common_args, run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.train import get_args_parser as train_args_parser
from counteraudit.train.train import main as train_main


def _listing(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` with its content's hash (folders: 'dir', links: their text)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        relative = str(path.relative_to(folder))
        if path.is_symlink():
            out[relative] = "link:" + str(path.readlink())
        elif path.is_dir():
            out[relative] = "dir"
        else:
            out[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def victim(tmp_path) -> Path:
    """A user's folder beside the runs folder, with a file in it."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work\n")
    return folder


@pytest.mark.parametrize("where,name", [
    ("suite", "ABSOLUTE"), ("suite", "../victim"), ("anomaly", "../../../../../victim"),
    ("anomaly", "../victim"), ("sweep", "../../victim/x"),
], ids=["absolute-suite", "dotdot-suite", "deep-anomaly", "dotdot-anomaly", "sweep-prefix"])
def test_a_name_that_would_reach_outside_is_refused_and_nothing_is_written(tmp_path, victim,
                                                                            capsys, where, name):
    name = str(victim) if name == "ABSOLUTE" else name
    body = {"suite": "",
            "anomaly": f'[[anomalies]]\nname = "{name}"\nfamily = "randomized_smoothing"\n',
            "sweep": f'[[sweeps]]\nname = "{name}"\nfamily = "randomized_smoothing"\n'
                     'values = [0.25, 0.5]\n'}[where]
    suite = write_suite(tmp_path / "stranger.toml", body=body)
    if where == "suite":
        suite.write_text(suite.read_text().replace('name = "stranger"', f'name = "{name}"'))
    before = _listing(tmp_path)
    parser = train_args_parser()  # train.py as its script runs it, in this process
    with pytest.raises(SystemExit) as caught:
        run_cli(train_main, parser, parser.parse_args(
            ["--suite", str(suite), "--runs-dir", str(tmp_path / "runs"), "--no-progress"]))
    assert caught.value.code == 2
    assert "is not a single folder name" in capsys.readouterr().err
    assert _listing(tmp_path) == before  # nothing written anywhere, the victim untouched


def _old_layout_folder(suite, spec, runs: Path, key: str | None) -> Path:
    folder = suite.root(runs) / MODELS / f"{spec.name}-{spec.key}"
    folder.mkdir(parents=True)
    (folder / "weights.pth").write_bytes(b"whatever was there")
    if key is not None:
        atomic_write_json(folder / SPEC_NAME, {"name": spec.name, "key": key})
    return folder


@pytest.mark.parametrize("marker", [None, "someone-elses-key"], ids=["no-marker", "other-key"])
def test_a_folder_counteraudit_did_not_write_is_never_moved_or_deleted(tmp_path, marker):
    runs = tmp_path / "runs"
    suite = load_suite(write_suite(tmp_path / "tiny.toml"))
    spec = suite.references[0]
    folder = _old_layout_folder(suite, spec, runs, marker)
    before = _listing(folder)
    model_dir(runs, spec).mkdir(parents=True)  # the store has it: an own copy would be removed
    with pytest.raises(RunsFolderError, match="not a folder counteraudit wrote"):
        link_suite_models(suite, [spec], runs)
    assert folder.is_dir() and not folder.is_symlink() and _listing(folder) == before


def test_a_file_in_the_way_of_a_link_is_left_alone(tmp_path):
    runs = tmp_path / "runs"
    suite = load_suite(write_suite(tmp_path / "tiny.toml"))
    spec = suite.references[0]
    path = suite.root(runs) / MODELS / f"{spec.name}-{spec.key}"
    path.parent.mkdir(parents=True)
    path.write_text("notes\n")
    with pytest.raises(RunsFolderError):
        link_suite_models(suite, [spec], runs)
    assert path.read_text() == "notes\n"


def test_its_own_old_layout_folder_is_adopted(tmp_path):
    runs = tmp_path / "runs"
    suite = load_suite(write_suite(tmp_path / "tiny.toml"))
    spec = suite.references[0]
    folder = _old_layout_folder(suite, spec, runs, spec.key)
    link_suite_models(suite, [spec], runs)
    assert folder.is_symlink()
    assert (model_dir(runs, spec) / "weights.pth").read_bytes() == b"whatever was there"


def test_a_link_in_the_runs_folder_that_leads_outside_is_refused(tmp_path, victim):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "tiny").symlink_to(victim)  # planted in a shared runs folder
    suite = load_suite(write_suite(tmp_path / "tiny.toml"))
    with pytest.raises(RunsFolderError, match="outside the runs folder"):
        suite.root(runs)
    with pytest.raises(RunsFolderError, match="outside the runs folder"):
        link_suite_models(suite, suite.references, runs)
    assert _listing(victim) == {"thesis.tex": hashlib.sha256(b"years of work\n").hexdigest()}
    assert inside_runs(runs / "store" / "models", runs) == runs / "store" / "models"


def test_a_full_disk_is_one_message_that_says_what_to_do(tmp_path, capsys):
    target = tmp_path / "runs" / "store" / "worlds" / "train.npz"

    def main(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    parser = add_common_args(argparse.ArgumentParser("counteraudit stage"))
    with pytest.raises(SystemExit) as caught:
        run_cli(main, parser, parser.parse_args(["--runs-dir", str(tmp_path / "runs")]))
    assert caught.value.code == 1
    message = capsys.readouterr().err
    assert f"no space left on the device while writing {target}" in message
    assert "GB free of" in message and "run the same command again" in message
    assert "Traceback" not in message


def test_a_runs_folder_marker_is_json_it_can_read(tmp_path):
    """The adoption check reads only JSON: a marker that is not JSON is not ours."""
    runs = tmp_path / "runs"
    suite = load_suite(write_suite(tmp_path / "tiny.toml"))
    spec = suite.references[0]
    folder = _old_layout_folder(suite, spec, runs, None)
    (folder / SPEC_NAME).write_bytes(b"\x80\x04K\x01.")  # a pickle, never unpickled
    before = _listing(folder)
    with pytest.raises(RunsFolderError):
        link_suite_models(suite, [spec], runs)
    assert _listing(folder) == before
