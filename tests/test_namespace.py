"""One import namespace and one command: with packages named `evaluate` and `train` ahead on the
path (Hugging Face's `evaluate` is in many ML environments), every counteraudit module still
imports, and the stage scripts and the `counteraudit` command still run, from any folder."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write_suite

from counteraudit.evaluate.cli import STAGE_SCRIPTS as COMMANDS

# every subcommand's script file: counteraudit.evaluate.detect -> evaluate/detect.py
STAGE_SCRIPTS = [module.removeprefix("counteraudit.").replace(".", "/") + ".py"
                 for module in COMMANDS.values()]


@pytest.fixture
def shadowed(tmp_path) -> dict[str, str]:
    """An environment whose path starts with impostor `evaluate`, `train`, `explain`, `slurm` and
    `anomalies` packages that fail loudly when imported."""
    impostors = tmp_path / "impostors"
    for name in ("evaluate", "train", "explain", "slurm", "anomalies"):
        (impostors / name).mkdir(parents=True)
        (impostors / name / "__init__.py").write_text(
            f"raise ImportError('the impostor package {name!r} was imported')\n")
    return {**os.environ, "PYTHONPATH": str(impostors)}


def python(code_or_script, *args, env, cwd) -> subprocess.CompletedProcess:
    command = [sys.executable, *([code_or_script] if str(code_or_script).endswith(".py")
                                 else ["-c", code_or_script]), *map(str, args)]
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def test_every_module_imports_under_its_own_namespace(shadowed, tmp_path):
    code = """
import importlib, pkgutil, sys
import counteraudit.train, counteraudit.anomalies, counteraudit.explain, counteraudit.evaluate
import counteraudit.slurm
names = []
for package in ("train", "anomalies", "explain", "evaluate", "slurm"):
    module = importlib.import_module(f"counteraudit.{package}")
    for info in pkgutil.walk_packages(module.__path__, prefix=f"counteraudit.{package}."):
        importlib.import_module(info.name)
        names.append(info.name)
assert not {"evaluate", "train", "explain", "slurm", "anomalies"} & set(sys.modules), sorted(sys.modules)
print(len(names))
"""
    imported = int(python(code, env=shadowed, cwd=tmp_path).stdout.strip())
    assert imported >= 60  # every module of the five packages (about 70 today)


# Every stage script's --help, each run as `python <script>` would run it (argv, sys.path[0] its
# folder, __main__), in one interpreter: one import of torch instead of one per script. The real
# run of train.py below is a separate `python train/train.py` process.
HELP_OF_EVERY_SCRIPT = """
import contextlib, io, os, runpy, sys
scripts = sys.argv[1:]
for script in scripts:
    saved_path, saved_argv = list(sys.path), sys.argv
    sys.path[0], sys.argv = os.path.dirname(script), [script, "--help"]
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit:
            assert exit.code in (0, None), (script, exit.code)
    sys.path[:], sys.argv = saved_path, saved_argv
    assert "--suite" in shown.getvalue(), (script, shown.getvalue())
    impostors = {"evaluate", "train", "explain", "slurm", "anomalies"} & set(sys.modules)
    assert not impostors, (script, impostors)
print(len(scripts))
"""


def test_stage_scripts_and_the_command_run_from_another_folder(shadowed, tmp_path):
    shown = python(HELP_OF_EVERY_SCRIPT, *(REPO / script for script in STAGE_SCRIPTS),
                   env=shadowed, cwd=tmp_path)
    assert shown.stdout.strip() == str(len(STAGE_SCRIPTS))
    command = shutil.which("counteraudit", path=str(Path(sys.executable).parent))
    assert command, "the counteraudit console script is not installed beside this python"
    listed = subprocess.run([command, "--help"], env=shadowed, cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    for name in COMMANDS:
        assert re.search(rf"\n    {name}\s", listed.stdout), (name, listed.stdout)
    # a real run of a stage script, and of the same stage through the command
    suite = write_suite(tmp_path / "tiny.toml", references=2, epochs=1)
    out = python(str(REPO / "train/train.py"), "--suite", suite, "--runs-dir", tmp_path / "runs",
                 "--no-progress", env=shadowed, cwd=tmp_path).stdout
    assert "2 model(s) ready" in out
    again = subprocess.run([command, "train", "--suite", suite, "--runs-dir", tmp_path / "runs",
                            "--no-progress"], env=shadowed, cwd=tmp_path, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "2 model(s) ready" in again.stdout  # trained by the first
    assert "epoch 1/1" not in again.stdout


def test_the_command_uses_the_scripts_parsers_and_reports_errors_as_they_do(tmp_path):
    from counteraudit.evaluate.cli import get_args_parser
    import importlib
    parser = get_args_parser()
    for name, module_name in COMMANDS.items():
        own = importlib.import_module(module_name).get_args_parser(add_help=False)
        sub = parser.parse_args([name])
        assert {k: v for k, v in vars(sub).items() if k != "command"} == vars(own.parse_args([]))
    command = shutil.which("counteraudit", path=str(Path(sys.executable).parent))
    bad = subprocess.run([command, "detect", "--suite", "no-such-suite"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("counteraudit detect: error: unknown suite 'no-such-suite'")
