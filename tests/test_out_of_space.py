"""A full disk stops a stage: once a write finds no space left, no further item is computed
(each would only fail at its own write), one message says where, how much is free and about how
much the rest needs, what was stored is kept, and a rerun after freeing space does only the rest.
The disk is not filled: the writes fail as a full disk makes them fail (OSError ENOSPC)."""
from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import counteraudit.explain.stage as explain_pipeline
from counteraudit.explain.run import get_args_parser
from counteraudit.explain.stage import explain_suite
from counteraudit.explain.store import ARRAYS_FILE
from counteraudit.slurm.errors import OutOfSpaceError
from counteraudit.slurm.executor import ExecutorConfig, run_items
from counteraudit.train.core.artifacts import store_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.stage import train_models
from counteraudit.train.train import get_args_parser as train_args
from counteraudit.train.core.stage import run_options
from tests.conftest import write_suite

NO_SPACE = os.strerror(errno.ENOSPC)


def explain(suite_path: Path, runs: Path) -> dict:
    args = get_args_parser().parse_args(["--suite", str(suite_path), "--runs-dir", str(runs),
                                         "--no-progress", "--jobs", "1"])
    return explain_suite(load_suite(suite_path), run_options(args))


def stored_results(runs: Path) -> dict[Path, int]:
    """Every stored visualization's arrays, with their size."""
    return {path: path.stat().st_size
            for path in (store_dir(runs) / "visualizations").glob(f"*/*/{ARRAYS_FILE}")}


def test_a_full_disk_stops_the_explain_stage_and_says_what_it_needs(trained_pair, tmp_path,
                                                                     monkeypatch):
    suite_path, trained = trained_pair
    runs = Path(shutil.copytree(trained, tmp_path / "runs", symlinks=True))
    started: list[str] = []
    explain_one = explain_pipeline.explain_one

    def recording(item):
        started.append(item.name)
        return explain_one(item)
    monkeypatch.setattr(explain_pipeline, "explain_one", recording)
    savez, writes = np.savez, []

    def disk_full_after_two_writes(file, **arrays):
        writes.append(file)
        if len(writes) > 2:
            file.write(b"PK\x03\x04")  # a first block, as a real write gets before the disk is full
            raise OSError(errno.ENOSPC, NO_SPACE)
        return savez(file, **arrays)
    monkeypatch.setattr(np, "savez", disk_full_after_two_writes)

    with pytest.raises(OutOfSpaceError) as raised:
        explain(suite_path, runs)
    message = str(raised.value)
    print(message)
    # 4 items, one (model, method) each: two stored, the third found no space, the fourth never ran
    assert len(started) == 3 and len(writes) == 3, started
    assert len(stored_results(runs)) == 2
    assert not list((store_dir(runs) / "visualizations").rglob("*.tmp"))  # no half-written file
    folder = Path(raised.value.path).parent
    assert message.startswith(f"stage 'explain' stopped: no space left on device writing {folder}")
    assert f"free in {folder}; the 2 unfinished item(s) need about " in message
    assert "the 2 finished item(s) are stored and are not computed again" in message
    assert message.count("\n") == 2  # one message, no traceback

    monkeypatch.setattr(np, "savez", savez)  # space freed: the rerun does only the rest
    before = stored_results(runs)
    assert explain(suite_path, runs)["computed"] == 2
    rest = sum(size for path, size in stored_results(runs).items() if path not in before)
    # estimated from the stored results of the other method (larger: it stores raw attributions)
    assert rest <= raised.value.needed_bytes <= 4 * rest, (raised.value.needed_bytes, rest)


def write_unless_the_disk_is_full(item: tuple[str, int]) -> int:
    """A work item that marks when it starts; item 1 finds the disk full, the others finish a
    second after item 1 started: timed from their own start, item 0 could finish first on a
    loaded machine, whose second worker can take longer than that to start."""
    folder, number = item
    (Path(folder) / f"started-{number}").touch()
    if number == 1:
        raise OSError(errno.ENOSPC, NO_SPACE, str(Path(folder) / "result-1.npz"))
    deadline = time.monotonic() + 120
    while not (Path(folder) / "started-1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    return number


def test_worker_processes_start_no_item_after_the_disk_is_full(tmp_path):
    items = [(str(tmp_path), number) for number in range(8)]
    with pytest.raises(OutOfSpaceError) as raised:
        run_items(write_unless_the_disk_is_full, items, ExecutorConfig(local_jobs=2), "fill",
                  space_needed=lambda unfinished: 1000 * len(unfinished))
    started = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("started-*"))
    assert 1 in started and set(started) <= {0, 1}, started  # items queued to the workers too
    error = raised.value
    assert set(error.results_by_index) <= {0} and error.failed_item_names == [str(items[1])]
    assert error.needed_bytes == 1000 * error.unfinished_count
    assert f"writing {tmp_path / 'result-1.npz'}" in str(error)


def test_a_full_disk_stops_the_training_stage(tmp_path, monkeypatch):
    suite = load_suite(write_suite(tmp_path / "two.toml", references=2, epochs=1))
    runs = tmp_path / "runs"
    saves = []

    def disk_full(obj, file, *args, **kwargs):  # as torch.save reports a failed write
        saves.append(file)
        try:
            raise OSError(errno.ENOSPC, NO_SPACE)
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")
    monkeypatch.setattr(torch, "save", disk_full)
    args = train_args().parse_args(["--suite", str(suite.path), "--runs-dir", str(runs),
                                     "--no-progress", "--jobs", "1"])
    with pytest.raises(OutOfSpaceError) as raised:
        train_models(suite, suite.models, run_options(args))
    assert len(saves) == 1  # the first model's first checkpoint; the second model never started
    assert f"writing {store_dir(runs) / 'models'}" in str(raised.value)
    assert "the 2 unfinished item(s) need more (no estimate)" in str(raised.value)
