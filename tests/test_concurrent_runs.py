"""Two runs at once over one runs folder make each artifact once: the second one to need it waits
for the first (saying so), then reads what the first made. Each test holds the artifact's lock
itself while both runs start, so that both are certain to be waiting for it when it lets go."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from counteraudit.anomalies.image_sets import DETECTION
from counteraudit.explain.stage import (load_image_sets, result_lock, stored_result_dir)
from counteraudit.explain.store import result_key
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds import build_world
from counteraudit.explain.settings import method_specs
from tests.conftest import REPO, TINY_WORLD


def start(log: Path, *arguments) -> subprocess.Popen:
    with open(log, "w") as output:
        return subprocess.Popen([sys.executable, *map(str, arguments)], cwd=REPO, stdout=output,
                                stderr=subprocess.STDOUT)


def wait_until_all_say(runs: list[subprocess.Popen], logs: list[Path], text: str,
                       timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(text in log.read_text() for log in logs):
        ended = [log.read_text() for run, log in zip(runs, logs) if run.poll() is not None]
        assert not ended and time.monotonic() < deadline, f"not every run says {text!r}: {ended}"
        time.sleep(0.1)


def finish(runs: list[subprocess.Popen], logs: list[Path]) -> str:
    for run in runs:
        run.wait(timeout=600)
    both = "\n".join(log.read_text() for log in logs)
    assert [run.returncode for run in runs] == [0, 0], both[-4000:]
    return both


def test_two_runs_that_need_one_world_generate_it_once(tmp_path):
    config, runs = dict(TINY_WORLD), tmp_path / "runs"
    world = build_world(config, runs_root=runs)
    prepare = ("import json, sys; from counteraudit.train.worlds import build_world; "
               "build_world(json.loads(sys.argv[1]), runs_root=sys.argv[2]).prepare()")
    logs = [tmp_path / f"run-{n}.log" for n in range(2)]
    with world.generation_lock("train"):
        processes = [start(log, "-c", prepare, json.dumps(config), runs) for log in logs]
        wait_until_all_say(processes, logs, "another process is generating the synthetic world's train split")
    both = finish(processes, logs)
    assert both.count("[world] generated") == 2, both  # once per split: train and val
    assert both.count(f"generated {config['num_train']} synthetic train images") == 1, both
    assert both.count(f"generated {config['num_val']} synthetic val images") == 1, both
    for split in ("train", "val"):  # and both runs read the same images
        assert (world.cache_dir / f"{split}.npz").is_file()


def result_folders(suite_path: Path, runs: Path) -> list[Path]:
    """The store folders of every (method, model) result on the detection set."""
    suite = load_suite(suite_path)
    detection = load_image_sets(suite, runs)[DETECTION]
    folders = []
    for spec_of_method in method_specs(suite).values():
        method = spec_of_method.build()
        for spec in suite.models:
            key = result_key(method.describe(spec.architecture, spec_of_method.batch_size),
                             spec.key, detection.id)
            folders.append(stored_result_dir(runs, key))
    return folders


def test_two_runs_that_need_one_visualization_set_explain_it_once(trained_pair, tmp_path):
    suite_path, trained = trained_pair
    runs = Path(shutil.copytree(trained, tmp_path / "runs", symlinks=True))
    folders = result_folders(suite_path, runs)
    assert len(folders) == 4  # 2 methods x 2 references, each on the detection set
    logs = [tmp_path / f"run-{n}.log" for n in range(2)]
    with ExitStack() as held:
        for folder in folders:
            held.enter_context(result_lock(folder, "a test's"))
        processes = [start(log, REPO / "explain/run.py", "--suite", suite_path, "--runs-dir", runs,
                           "--no-progress", "--jobs", "1") for log in logs]
        wait_until_all_say(processes, logs, "another process is explaining")
    both = finish(processes, logs)
    computed = [int(n) for n in re.findall(r"pair: (\d+) visualization set\(s\) computed", both)]
    assert len(computed) == 2 and sum(computed) == len(folders), both  # each set once, in all
    print(f"visualization sets computed by each run: {computed}")
    for folder in folders:
        assert (folder / "params.json").is_file()
