"""Plug-ins from a file outside the package (train/core/plugin_files.py): a method in a file of its
own registers through --plugins and through a suite's ``plugins``, explains in worker processes
(real spawned interpreters) that load the same file, and keys its results by the file's digest;
a suite may name only files inside its own folder; a worker refuses a file changed since the run
was planned; the generated method tests run on the file, the shipped ones stay green beside it.

A plug-in stays registered in the process that loads one, so every test that registers a method
runs it in a subprocess."""
from __future__ import annotations

import hashlib
import json
import operator
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from counteraudit.explain.settings import method_problems
from counteraudit.slurm.errors import ItemsFailedError
from counteraudit.slurm.executor import run_items
from counteraudit.slurm.executor_config import ExecutorConfig
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.train.stage import TrainItem
from tests.conftest import PAIR_BODY, REPO, guide_example, write_suite

GUIDE = REPO / "explain" / "README.md"
SECTION = "## Your own method, in a file of your own"
METHOD = "my_input_x_gradient"  # the guide's example's name
# A plug-in file that registers nothing: loading it in this test process changes no registry.
HARMLESS = "FACTOR = 2  # a plug-in file's module-level code runs when it is loaded\n"


def guide_method_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my_method.py"
    path.write_text(guide_example(GUIDE, SECTION))
    return path


def run(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_the_generated_method_tests_run_on_the_guides_file_and_the_shipped_ones_stay_green(tmp_path):
    plugin = guide_method_file(tmp_path / "mine")
    shipped = ["test_the_table_lists_every_registered_method_with_its_parameters",
               "test_the_guide_holds_the_generated_table_with_a_row_for_every_method",
               "test_zoo_suite_runs_every_registered_method_on_the_demos_models"]
    done = run("-m", "pytest", "tests/test_explain_methods.py", "tests/test_method_table.py",
               "tests/test_zoo_summary.py", "--plugins", plugin, "-p", "no:cacheprovider",
               "-n", "0", "-v", "-k", " or ".join([METHOD, *shipped]))  # one process: its -v lines
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(f"[{METHOD}] PASSED") == 4, done.stdout[-3000:]  # every method's checks
    for name in shipped:
        assert f"{name} PASSED" in done.stdout, done.stdout[-3000:]


def plugged_suite(folder: Path, plugins_line: str = 'plugins = ["my_method.py"]\n') -> Path:
    """The trained pair's suite (same models, same keys) explaining with the guide's method."""
    folder.mkdir(parents=True, exist_ok=True)
    path = write_suite(folder / "plugged.toml", references=2, epochs=1,
                       body=PAIR_BODY.replace('["guided_backprop", "outputs_only"]', f'["{METHOD}"]')
                       + f"\n[methods.{METHOD}]\nscale = 2.0\n")
    path.write_text(plugins_line + path.read_text())  # a top-level key: before the first table
    return path


def test_a_method_from_a_file_explains_in_workers_and_its_key_holds_the_files_digest(
        trained_pair, tmp_path):
    """Through the suite's plugins: computed by two spawned workers, keyed by the digest. Then
    through --plugins, on a suite without them, with one byte more in the file: the same
    [methods.<name>] table checks, and nothing stored is taken for its results."""
    _, pair_runs = trained_pair
    runs = tmp_path / "runs"
    shutil.copytree(pair_runs, runs)
    plugin = guide_method_file(tmp_path / "suite")
    suite = plugged_suite(tmp_path / "suite")
    done = run("explain/run.py", "--suite", suite, "--runs-dir", runs, "--jobs", "2", "--no-progress")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    digest = hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert (f"plug-in file {plugin.resolve()} (sha256 {digest[:12]}) registered method {METHOD}"
            in done.stdout)
    assert "2 items, 2 at a time" in done.stderr  # two spawned workers, each loading the file
    assert "2 visualization set(s) computed" in done.stdout, done.stdout
    keys = [json.loads(path.read_text())["key"]
            for path in (runs / "store" / "visualizations" / METHOD).glob("*/params.json")]
    assert len(keys) == 2
    assert all(key["method_file_sha256"] == digest and key["method_params"] == {"scale": 2.0}
               for key in keys), keys

    plain = plugged_suite(tmp_path / "plain", plugins_line="")  # the same suite, no plugins key
    with pytest.raises(SuiteFileError, match=f"unknown method {METHOD!r}"):
        load_suite(plain, method_problems)  # (refused before anything is loaded here)
    plugin.write_text(plugin.read_text() + "\n")
    planned = run("explain/run.py", "--suite", plain, "--runs-dir", runs, "--dry-run",
                  "--plugins", plugin)
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-3000:]
    changed = hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert f"(sha256 {changed[:12]}) registered method {METHOD}" in planned.stdout, planned.stdout
    assert "0 visualization set(s) already stored" in planned.stdout, planned.stdout


@pytest.mark.parametrize("entry", ["../outside.py", "{outside}", "inside/../../outside.py",
                                   "notes.txt", "missing.py", "link.py"])
def test_a_suites_plugins_stay_inside_its_folder(tmp_path, entry):
    outside = tmp_path / "outside.py"
    ran = tmp_path / "ran"
    outside.write_text(f"open({str(ran)!r}, 'w').close()\n")
    folder = tmp_path / "suite"
    (folder / "inside").mkdir(parents=True)
    (folder / "notes.txt").write_text(HARMLESS)
    (folder / "link.py").symlink_to(outside)  # a link out of the folder is outside it too
    entry = entry.format(outside=outside)
    suite = write_suite(folder / "stranger.toml")
    suite.write_text(f"plugins = {json.dumps([entry])}\n" + suite.read_text())
    with pytest.raises(SuiteFileError) as refused:
        load_suite(suite)
    message = str(refused.value)
    assert str(suite) in message and "plugins = " in message and repr(entry) in message, message
    assert "relative to the suite file's folder" in message and "--plugins PATH" in message
    assert not ran.exists()


def test_an_extending_suite_adds_its_plugins_to_its_bases(tmp_path):
    (tmp_path / "base").mkdir()
    base = write_suite(tmp_path / "base" / "base.toml")
    (tmp_path / "base" / "shared.py").write_text(HARMLESS)
    base.write_text('plugins = ["shared.py"]\n' + base.read_text())
    child = tmp_path / "child" / "child.toml"
    child.parent.mkdir()
    (child.parent / "own.py").write_text(HARMLESS + "# the child's\n")
    child.write_text('extends = "../base/base.toml"\nplugins = ["own.py"]\n')
    suite = load_suite(child)
    assert [Path(plugin.path) for plugin in suite.plugin_files] == [
        (tmp_path / "base" / "shared.py").resolve(), (child.parent / "own.py").resolve()]
    assert suite.plugin_files[0].sha256 == hashlib.sha256(HARMLESS.encode()).hexdigest()


def planned_items(folder: Path, runs: Path) -> tuple[Path, list[TrainItem]]:
    """Two work items of a suite whose plugins name a (harmless) file, planned here: (the file,
    the items)."""
    folder.mkdir()
    plugin = folder / "helpers.py"
    plugin.write_text(HARMLESS)
    path = write_suite(folder / "planned.toml")
    path.write_text('plugins = ["helpers.py"]\n' + path.read_text())
    suite = load_suite(path)
    return plugin, [TrainItem(suite=suite, runs_dir=str(runs), model=spec.name)
                    for spec in suite.references[:2]]


def refusal(error: BaseException) -> str:
    """An ItemsFailedError's message and its items' reasons and tracebacks."""
    return str(error) + "".join(failure.details + failure.reason
                                for failure in getattr(error, "failures", []))


def test_a_worker_refuses_a_plugin_file_changed_after_planning(tmp_path):
    plugin, items = planned_items(tmp_path / "suite", tmp_path / "runs")
    plugin.write_text(HARMLESS.replace("2", "3"))
    with pytest.raises(ItemsFailedError) as refused:  # two spawned workers: fresh interpreters
        run_items(operator.attrgetter("model"), items, ExecutorConfig(local_jobs=2), "plugins")
    message = refusal(refused.value)
    assert f"plug-in file {plugin.resolve()} changed after this run was planned" in message, message
    assert len(refused.value.failures) == 2


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_a_slurm_job_loads_the_plugin_file_and_refuses_it_changed(tmp_path):
    plugin, items = planned_items(tmp_path / "suite", tmp_path / "runs")
    config = ExecutorConfig(executor="slurm", log_dir=tmp_path / "logs", time_minutes=5)
    stage = f"plugins-{tmp_path.name[-12:]}"
    assert run_items(operator.attrgetter("model"), items, config, stage) == ["reference-00", "reference-01"]
    plugin.write_text(HARMLESS.replace("2", "3"))
    with pytest.raises(ItemsFailedError) as refused:
        run_items(operator.attrgetter("model"), items, config, stage + "-changed")
    assert f"plug-in file {plugin.resolve()} changed after this run was planned" in refusal(refused.value)

FAMILY_FILE = '''"""A backdoor of one's own: the shipped family under another name."""
from counteraudit.anomalies.base import FAMILIES
from counteraudit.anomalies.families.backdoor import Backdoor


@FAMILIES.register
class MyBackdoor(Backdoor):
    name = "my_backdoor"
'''
# In a subprocess: the suite's model keys with the family's file as it is, then with one byte
# more (its first registration removed, as a fresh process would not have it).
FAMILY_KEYS = '''
import json, sys
from pathlib import Path
from counteraudit.train.core.registries import FAMILIES
from counteraudit.train.core.suite import load_suite
suite_file, family_file = Path(sys.argv[1]), Path(sys.argv[2])
keys = []
for _ in range(2):
    suite = load_suite(suite_file)
    spec = suite.model("mine")
    keys.append({"key": spec.key, "digest": spec.identity().get("family_file_sha256"),
                 "reference": suite.references[0].key})
    FAMILIES._entries.pop("my_backdoor")
    family_file.write_text(family_file.read_text() + "\\n")
print(json.dumps(keys))
'''


def test_a_family_from_a_file_keys_its_models_by_the_files_digest(tmp_path):
    family_file = tmp_path / "my_family.py"
    family_file.write_text(FAMILY_FILE)
    suite = write_suite(tmp_path / "mine.toml", body='''
[[anomalies]]
name = "mine"
family = "my_backdoor"
params = { nu = 0.3, size = 0.2 }
''')
    suite.write_text('plugins = ["my_family.py"]\n' + suite.read_text())
    reference_key = load_suite(write_suite(tmp_path / "plain.toml")).references[0].key
    done = run("-c", FAMILY_KEYS, suite, family_file)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, changed = json.loads(done.stdout.splitlines()[-1])
    assert first["digest"] == hashlib.sha256(FAMILY_FILE.encode()).hexdigest()
    assert changed["digest"] == hashlib.sha256((FAMILY_FILE + "\n").encode()).hexdigest()
    assert first["key"] != changed["key"]
    # a reference is no plug-in's: its key is the one a suite without plug-ins gives it
    assert first["reference"] == changed["reference"] == reference_key
