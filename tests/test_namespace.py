"""One import namespace and one command: with packages named `evaluate` and `train` ahead on the
path (Hugging Face's `evaluate` is in many ML environments), every counteraudit module still
imports, and the stage scripts and the `counteraudit` command still run, from any folder."""
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.evaluate.cli import STAGE_SCRIPTS as COMMANDS, get_args_parser
from tests.conftest import REPO, script_module, write_suite
from tests.test_cli import REQUIRED_ARGUMENTS

# every subcommand's script file: counteraudit.evaluate.detect -> evaluate/detect.py
STAGE_SCRIPTS = [module.removeprefix("counteraudit.").replace(".", "/") + ".py"
                 for module in COMMANDS.values()]
# every benchmark script, from the folder's listing: a new one is covered without a line here
BENCHMARK_SCRIPTS = sorted(path.relative_to(REPO).as_posix()
                           for path in (REPO / "evaluate" / "benchmarks").glob("*.py")
                           if path.name != "__init__.py")


def impostor_environment(folder: Path) -> dict[str, str]:
    """An environment whose path starts with impostor `evaluate`, `train`, `explain`, `slurm` and
    `anomalies` packages (in ``folder``) that fail loudly when imported."""
    impostors = folder / "impostors"
    for name in ("evaluate", "train", "explain", "slurm", "anomalies"):
        (impostors / name).mkdir(parents=True)
        (impostors / name / "__init__.py").write_text(
            f"raise ImportError('the impostor package {name!r} was imported')\n")
    return {**os.environ, "PYTHONPATH": str(impostors)}


@pytest.fixture
def shadowed(tmp_path) -> dict[str, str]:
    return impostor_environment(tmp_path)


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


# Scripts run as `python <script> <args>` would run them (argv, sys.path[0] the script's folder,
# __main__), all in one interpreter: one import of torch instead of one per script. Takes a JSON
# list of argument lists (the script first); prints, as JSON on its last line, each run's exit
# status, stdout and stderr, in order.
RUN_SCRIPTS = """
import contextlib, io, json, os, runpy, sys
runs = []
for argv in json.loads(sys.argv[1]):
    saved_path, saved_argv = list(sys.path), sys.argv
    sys.path[0], sys.argv = os.path.dirname(argv[0]), argv
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as exit:
            code = exit.code or 0
    sys.path[:], sys.argv = saved_path, saved_argv
    runs.append({"code": code, "out": out.getvalue(), "err": err.getvalue()})
    impostors = {"evaluate", "train", "explain", "slurm", "anomalies"} & set(sys.modules)
    assert not impostors, (argv, impostors)
print(json.dumps(runs))
"""
# A benchmark run whose mistake the script must report as run_cli does (one line, status 2).
BAD_BENCHMARK_RUN = ["evaluate/benchmarks/decode.py", "--images", "0"]


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory) -> dict[tuple[str, ...], dict]:
    """Every stage and benchmark script's --help, and BAD_BENCHMARK_RUN, from another folder with
    impostor packages ahead on the path: {(script, *args): {"code", "out", "err"}}."""
    folder = tmp_path_factory.mktemp("scripts")
    argvs = [[script, "--help"] for script in STAGE_SCRIPTS + BENCHMARK_SCRIPTS]
    argvs.append(BAD_BENCHMARK_RUN)
    shown = python(RUN_SCRIPTS, json.dumps([[str(REPO / argv[0]), *argv[1:]] for argv in argvs]),
                   env=impostor_environment(folder), cwd=folder)
    runs = json.loads(shown.stdout.strip().splitlines()[-1])
    return {tuple(argv): run for argv, run in zip(argvs, runs)}


def test_stage_scripts_and_the_command_run_from_another_folder(script_runs, shadowed, tmp_path):
    for script in STAGE_SCRIPTS:
        shown = script_runs[script, "--help"]
        # each script's own options; the leaderboard reads a folder of records, not a suite
        expected = "RECORDS_DIR" if script == "evaluate/leaderboard.py" else "--suite"
        assert shown["code"] == 0 and expected in shown["out"], (script, shown)
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
    parser = get_args_parser()
    for name, module_name in COMMANDS.items():
        own = importlib.import_module(module_name).get_args_parser(add_help=False)
        required = REQUIRED_ARGUMENTS.get(name, [])
        sub = parser.parse_args([name, *required])
        assert {k: v for k, v in vars(sub).items() if k != "command"} == vars(own.parse_args(required))
    command = shutil.which("counteraudit", path=str(Path(sys.executable).parent))
    bad = subprocess.run([command, "detect", "--suite", "no-such-suite"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("counteraudit detect: error: unknown suite 'no-such-suite'")


def test_every_benchmark_script_keeps_the_convention_and_runs_from_another_folder(script_runs):
    """Each benchmark script: its docstring, with a command, as its --help; get_args_parser
    (add_help); main(args); run as a file from any folder; a user's mistake one line and exit
    status 2 (run_cli)."""
    assert len(BENCHMARK_SCRIPTS) >= 5, BENCHMARK_SCRIPTS
    for script in BENCHMARK_SCRIPTS:
        shown = script_runs[script, "--help"]
        assert shown["code"] == 0, (script, shown)
        usage = shown["out"].splitlines()[0]
        assert re.match(r"usage: counteraudit [\w ]+ benchmark \[-h\]", usage), (script, usage)
        module = script_module(script)
        assert module.__doc__.strip().splitlines()[0] in shown["out"], script
        assert f"python {script}" in module.__doc__, f"{script}: its docstring shows no command"
        assert module.get_args_parser(add_help=False).add_help is False, script
        assert callable(module.main), script
    bad = script_runs[tuple(BAD_BENCHMARK_RUN)]
    assert bad["code"] == 2 and bad["err"].startswith(
        "counteraudit decoding benchmark: error: --images 0"), bad


def test_benchmark_parser_names_the_benchmark_and_shows_its_docstring_and_defaults():
    docstring = """Time one thing.

    python evaluate/benchmarks/thing.py --rounds 3
    """
    parser = benchmark_parser("thing", docstring)
    parser.add_argument("--rounds", type=int, default=5, help="rounds (5: steady)")
    shown = parser.format_help()
    assert shown.startswith("usage: counteraudit thing benchmark [-h] [--rounds ROUNDS]")
    assert "    python evaluate/benchmarks/thing.py --rounds 3" in shown  # as written
    assert "rounds (5: steady) (default: 5)" in shown
    assert benchmark_parser("thing", docstring, add_help=False).format_help().find("-h") == -1


def test_every_package_folder_is_listed_for_the_wheel():
    """setuptools ships only the packages pyproject.toml lists: an editable install finds an
    unlisted subpackage through its parent's folder, a wheel does not (null_tests was missed so)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name: Path(folder) for name, folder in config["package-dir"].items()}
    on_disk = set()
    for name, folder in folders.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            on_disk.add(".".join([name, *relative.parts]))
    assert on_disk - set(config["packages"]) == set()
