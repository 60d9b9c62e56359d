"""Shared fixtures: a tiny synthetic world and a tiny suite, real but seconds to train."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import counteraudit.train  # noqa: F401, I001  (first: the numeric mode, before torch and NumPy load)
import pytest
import torch
from filelock import FileLock

from counteraudit.slurm.cluster import REQUIRE_SLURM_ENV, why_slurm_unavailable
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.plugin_files import command_line_plugin, load_plugin_file
from counteraudit.train.core.runs_folder import runs_folder_bound

# Each test process on its share of the cores (pytest-xdist runs one per worker), at most two
# threads: the small models gain little from more, and the workers would oversubscribe.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, len(os.sched_getaffinity(0)) // WORKERS)))
# Every test trains in a new runs folder, where the trainer's precision probe (train/cpu_probe.py,
# cached per runs folder) would time fp32 and bf16 again: 3 s at 32 px on a CPU that emulates
# bf16, in about 40 tests. Its own tests turn it back on (tests/test_cpu_probe.py, fresh_probe).
os.environ.setdefault("COUNTERAUDIT_CPU_PROBE", "off")
# At most this many pytest-xdist workers for `-n auto`: each loads torch and trains in its own
# processes (about 1.5 GB each), and the test files share a few expensive fixtures.
MAX_WORKERS = 4

TINY_WORLD = {"name": "synthetic", "seed": 3, "image_size": 32, "num_train": 640, "num_val": 160}


def write_suite(path: Path, body: str = "", references: int = 3, epochs: int = 2,
                world: dict | None = None, architecture: str = "small_resnet") -> Path:
    world = world or TINY_WORLD
    world_lines = "\n".join(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
                            for k, v in world.items())
    path.write_text(f"""
name = "{path.stem}"
[world]
{world_lines}
[architecture]
name = "{architecture}"
[recipe]
epochs = {epochs}
batch_size = 64
lr = 0.05
lr_step_epochs = 1
eval_batch_size = 200
[references]
count = {references}
{body}
""")
    return path


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    """An empty artifacts root, also exported as $COUNTERAUDIT_RUNS for scripts."""
    root = tmp_path / "runs"
    monkeypatch.setenv("COUNTERAUDIT_RUNS", str(root))
    return root


@pytest.fixture
def tiny_suite(tmp_path) -> Path:
    return write_suite(tmp_path / "tiny.toml")


REPO = Path(__file__).resolve().parents[1]


def guide_example(guide: Path, section: str) -> str:
    """The first ```python block of ``section`` (a "## ..." heading) of ``guide``, as written: the
    example a guide asks a user to save as a file, which its test then runs."""
    text = guide.read_text()
    assert section in text, f"{guide} has no section {section!r}"
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL)
    assert blocks, f"the section {section!r} of {guide} has no ```python example"
    return blocks[0]
# The end-to-end suite: two anomalies (one localizable), two methods, 8 detection images.
E2E_BODY = """
[[anomalies]]
name = "backdoor"
family = "backdoor"
params = { nu = 0.3, size = 0.2 }

[[anomalies]]
name = "smoothing"
family = "randomized_smoothing"
params = { sigma = 0.5 }

[explain]
methods = ["guided_backprop", "outputs_only"]

[evaluate]
detection_images = 8
localization_images = 4
"""


# Two references, two cheap methods, 8 detection images: four visualization sets, seconds to make.
PAIR_BODY = """
[explain]
methods = ["guided_backprop", "outputs_only"]

[evaluate]
detection_images = 8
localization_images = 4
"""


def trained_suite(suite_path: Path, runs: Path) -> tuple[Path, Path]:
    """Every model of a suite trained (in this process) and its image sets made, nothing
    explained: (suite file, runs root)."""
    # Here, not at the top: every pytest process and every subprocess that imports a test
    # module reads this file, and most never train (ruff's per-file exception, pyproject.toml).
    from counteraudit.explain.stage import load_image_sets
    from counteraudit.train.core.suite import load_suite
    from counteraudit.train.stage import TrainItem, train_one
    suite = load_suite(suite_path)
    for spec in suite.models:
        train_one(TrainItem(suite=suite, runs_dir=str(runs), model=spec.name, progress=False))
    load_image_sets(suite, runs)
    return suite_path, runs


def built_once(tmp_path_factory, name: str, build: Callable[[Path], str]) -> tuple[Path, str]:
    """(folder, text): ``build(folder)``'s folder and what it returned, made once for the whole
    test run. Under pytest-xdist every worker asks: the first builds it under a lock in the
    run's shared temporary folder, the others wait and take it, so a session fixture costs what
    it costs in one process."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        return folder, build(folder)
    folder = tmp_path_factory.getbasetemp().parent / name
    folder.mkdir(exist_ok=True)
    built = folder / ".built"
    with FileLock(folder / ".lock"):
        if not built.exists():
            text = build(folder)
            built.write_text(text)
    return folder, built.read_text()


@pytest.fixture(scope="session")
def trained_pair(tmp_path_factory) -> tuple[Path, Path]:
    """``trained_suite`` of PAIR_BODY's two references. Shared: copy the runs root before
    changing it."""
    def build(base: Path) -> str:
        trained_suite(write_suite(base / "pair.toml", body=PAIR_BODY, references=2, epochs=1),
                      base / "runs")
        return ""
    base, _ = built_once(tmp_path_factory, "pair", build)
    return base / "pair.toml", base / "runs"


# A stage script's items in its own process (--jobs 1): a worker process each stage would start
# costs more than these tiny items (an interpreter, torch and the stages to import); the tests of
# the worker pool ask for workers themselves.
ONE_PROCESS = ("--jobs", "1")


def run_script(script, *args, timeout: float = 600):
    """Run a repository script in a subprocess; asserts it succeeded, returns its stdout."""
    result = subprocess.run([sys.executable, str(REPO / script), *map(str, args)],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def script_module(script) -> ModuleType:
    """The module of a repository script (``evaluate/detect.py``: counteraudit.evaluate.detect)."""
    return importlib.import_module("counteraudit." + str(script).removesuffix(".py").replace("/", "."))


def in_process(script, *args) -> subprocess.CompletedProcess:
    """``script``'s parser and ``main`` run in this process, bound to its runs folder as run_cli
    binds a command (the numeric mode is this process's, set by the first import above), what it
    printed to stdout and stderr kept: for the tests of what a stage computes, not of its
    command line (each entry script keeps tests that start it as a command). Saves the
    interpreter and the imports a subprocess pays for (about 5 s: torch, torchvision with
    torch._dynamo, scipy, captum), most of a small stage's time."""
    module = script_module(script)
    argv = [str(arg) for arg in args]
    parsed = module.get_args_parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    with runs_folder_bound(vars(parsed).get("runs_dir")), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        module.main(parsed)
    return subprocess.CompletedProcess([script, *argv], 0, out.getvalue(), err.getvalue())


def command_in_process(script, *args) -> subprocess.CompletedProcess:
    """``script`` run as its command runs it (``run_cli``: a user's mistake is one message on
    stderr and exit status 2), in this process: for the tests of a command's refusals, which
    come before any work, without the interpreter and imports a subprocess pays for."""
    module = script_module(script)
    argv = [str(arg) for arg in args]
    parser = module.get_args_parser()
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run_cli(module.main, parser, parser.parse_args(argv))
        except SystemExit as exited:
            code = exited.code
    return subprocess.CompletedProcess([script, *argv], code, out.getvalue(), err.getvalue())


def without_imagenet(monkeypatch, folder: Path) -> None:
    """This process as on a machine without ImageNet, working in ``folder``: what a dry run
    there cannot check, its plan says."""
    for name in ("IMAGENET_ROOT", "STYLIZED_IMAGENET_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(folder)


def without_slurm_or_imagenet(monkeypatch, folder: Path) -> None:
    """``without_imagenet``, and without Slurm's tools either (PATH holds only Python's folder)."""
    without_imagenet(monkeypatch, folder)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))


def run_in_process(script, *args) -> str:
    """What ``run_script(script, *args)`` returns (its stdout), from ``in_process``."""
    return in_process(script, *args).stdout


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """(suite file, runs dir, detect.py's stdout) of a finished end-to-end run of E2E_BODY:
    trained, implant-checked, explained, scored (detect.py, then localize.py). Made once per
    session, shared by the tests of the pipeline and of the report."""
    def build(base: Path) -> str:
        suite = write_suite(base / "e2e.toml", body=E2E_BODY, references=3, epochs=2)
        out = run_in_process("evaluate/detect.py", "--suite", suite, "--runs-dir", base / "runs",
                             "--distance", "l2", "--no-progress", *ONE_PROCESS)
        # detect.py explains the detection sets; localize.py the abnormal ones: the run is finished
        run_in_process("evaluate/localize.py", "--suite", suite, "--runs-dir", base / "runs",
                       "--distance", "l2", "--no-progress", *ONE_PROCESS)
        return out
    base, out = built_once(tmp_path_factory, "e2e", build)
    return base / "e2e.toml", base / "runs", out


def with_nulls(suite: Path, runs: Path, folder: Path, name: str, body: str) -> tuple[Path, Path]:
    """(suite file, runs root): ``runs`` copied into ``folder`` and a suite named ``name`` that
    extends ``suite`` with ``body`` (held-out references, replicates): the models both suites
    hold are trained once, in ``runs``."""
    runs = Path(shutil.copytree(runs, folder / "runs", symlinks=True))
    derived = folder / f"{name}.toml"
    derived.write_text(f'extends = "{suite}"\nname = "{name}"\n{body}')
    return derived, runs


# The finished run with two replicates of the smoothing model and 4 held-out references (2 fit,
# 2 check) under the student_t test.
REPLICAS_BODY = """[references]
held_out = 4
held_out_check = 2
[evaluate]
p_value = "student_t"
[[anomalies]]
name = "smoothing"
family = "randomized_smoothing"
replicates = 2
params = { sigma = 0.5 }
"""


@pytest.fixture(scope="session")
def replicas_run(finished_run, tmp_path_factory):
    """(suite file, runs root, detect.py's stdout, names of the models detect.py trained) of
    REPLICAS_BODY on a copy of ``finished_run``, detected (detect.py). Shared: copy the runs root
    before changing it."""
    def build(base: Path) -> str:
        suite, runs, _ = finished_run
        derived, runs = with_nulls(suite, runs, base, "replicas", REPLICAS_BODY)
        before = {p.name for p in (runs / "store" / "models").iterdir()}
        # in this process: finished_run starts detect.py as a command
        out = run_in_process("evaluate/detect.py", "--suite", derived, "--runs-dir", runs,
                             "--distance", "l2", "--no-progress", *ONE_PROCESS)
        trained = sorted({p.name for p in (runs / "store" / "models").iterdir()} - before)
        return json.dumps({"out": out, "trained": trained})
    base, built = built_once(tmp_path_factory, "replicas", build)
    built = json.loads(built)
    return base / "replicas.toml", base / "runs", built["out"], set(built["trained"])


def pytest_addoption(parser):
    parser.addoption("--plugins", action="append", default=[], metavar="FILE.py", dest="plugin_files",
                     help="a plug-in file of your own (explain/README.md), loaded before the tests "
                          "are collected: the tests that run every registered method (family, "
                          "auditor, ...) run on its plug-ins too (repeatable)")


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per core this process may use, at most MAX_WORKERS."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def pytest_configure(config):
    for path in config.getoption("plugin_files"):
        load_plugin_file(command_line_plugin(path))


def pytest_runtest_setup(item):
    """Tests marked slurm skip without a cluster, and fail instead when CI requires one."""
    if item.get_closest_marker("slurm"):
        require_slurm_cluster()


def require_slurm_cluster() -> None:
    """Skip when no cluster answers, but fail when COUNTERAUDIT_REQUIRE_SLURM=1 (CI), so a broken
    cluster in CI can't silently turn the Slurm tests into skips."""
    reason = why_slurm_unavailable()
    if reason is None:
        return
    if os.environ.get(REQUIRE_SLURM_ENV) == "1":
        pytest.fail(f"{REQUIRE_SLURM_ENV}=1 but no Slurm cluster is usable: {reason}", pytrace=False)
    pytest.skip(f"no Slurm cluster: {reason}")
