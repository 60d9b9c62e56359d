"""Portable numerics: the kernels' caps reach every process, native results are keyed apart, and
a process whose libraries loaded too early starts again rather than compute other bits."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, write_suite

from counteraudit.slurm.executor_config import ExecutorConfig
from counteraudit.slurm.request_checks import sbatch_parameters
from counteraudit.train.core import numerics

SHOW = ("import counteraudit.train, json, os, torch; "
        "print(json.dumps({'env': {k: os.environ.get(k) for k in %r}, "
        "'aten': torch.backends.cpu.get_cpu_capability()}))")
CAPPED = (*numerics.PORTABLE_ENVIRONMENT, *numerics.NUMPY_ENVIRONMENT)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if k not in CAPPED and k not in (numerics.ENV_VAR, numerics.RESTARTED_VAR)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**environment, **env}, timeout=300)


def _show(**env: str) -> dict:
    result = _python(SHOW % (CAPPED,), **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_portable_is_the_default_and_caps_every_library_before_torch_runs():
    shown = _show()
    assert shown["env"] == {**numerics.PORTABLE_ENVIRONMENT, **numerics.NUMPY_ENVIRONMENT}
    assert shown["aten"] == "AVX2"  # the portable kernels, whatever this CPU has beyond them


def test_a_child_process_inherits_the_mode():
    code = ("import counteraudit.train, subprocess, sys; "
            "print(subprocess.run([sys.executable, '-c', %r], capture_output=True, text=True).stdout)"
            % (SHOW % (CAPPED,)))
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["env"]["ATEN_CPU_CAPABILITY"] == "avx2"


def test_native_leaves_torch_uncapped_and_keeps_numpy_capped():
    shown = _show(**{numerics.ENV_VAR: "native"})
    assert all(shown["env"][name] is None for name in numerics.PORTABLE_ENVIRONMENT)
    assert all(shown["env"][name] == value for name, value in numerics.NUMPY_ENVIRONMENT.items())


def test_an_unknown_mode_is_one_clear_error(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "train/train.py"), "--quick", "--dry-run",
                             "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True,
                            env={**os.environ, numerics.ENV_VAR: "fast"}, timeout=300)
    assert result.returncode == 2
    assert "$COUNTERAUDIT_NUMERICS='fast' is not a numeric mode; use one of: portable, native" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_native_model_is_keyed_apart_and_never_reused_by_a_portable_run(tmp_path):
    """Train a model natively, then ask a portable run what it would train: the same model, since
    the native one's key names its instruction set."""
    suite = write_suite(tmp_path / "tiny.toml", references=2, epochs=1)
    runs = tmp_path / "runs"

    def train(*extra: str) -> str:
        result = subprocess.run([sys.executable, str(REPO / "train/train.py"), "--suite", str(suite),
                                 "--runs-dir", str(runs), "--model", "reference-00", "--no-progress", *extra],
                                capture_output=True, text=True, timeout=600,
                                env={**os.environ, "COUNTERAUDIT_CPU_PROBE": "off"})
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return result.stdout

    train("--numerics", "native")
    native_models = sorted((runs / "store" / "models").iterdir())
    assert len(native_models) == 1
    metrics = json.loads((native_models[0] / "metrics.json").read_text())
    assert metrics["numerics"]["mode"] == "native"
    assert metrics["numerics"]["instruction_set"] == numerics.instruction_set()
    assert "reference-00" in train("--dry-run")  # portable: nothing stored under its key yet
    train()
    models = sorted((runs / "store" / "models").iterdir())
    assert len(models) == 2
    portable = next(m for m in models if m not in native_models)
    assert json.loads((portable / "metrics.json").read_text())["numerics"]["mode"] == "portable"


def test_slurm_jobs_get_the_mode_as_export_lines():
    numerics.configure()
    setup = sbatch_parameters(ExecutorConfig(executor="slurm"), "train", [])["setup"]
    assert f"export {numerics.ENV_VAR}=portable" in setup
    assert "export MKL_CBWR=COMPATIBLE" in setup
    assert "export NPY_DISABLE_CPU_FEATURES='X86_V4 AVX512F AVX512CD AVX512_SKX AVX512_CLX " \
           "AVX512_CNL AVX512_ICL AVX512_SPR'" in setup


def test_numpy_loaded_uncapped_is_refused_in_portable_mode(monkeypatch):
    monkeypatch.setattr(numerics, "numpy_uses_avx512", lambda: True)
    with pytest.raises(numerics.NumericsError, match="NumPy was loaded before counteraudit set the numeric mode"):
        numerics.check_in_effect()


def test_a_command_whose_numpy_loaded_too_early_starts_again_once(tmp_path):
    """As where a .pth file imports NumPy before anything: the command starts again with the caps
    in its environment from the start, and runs once."""
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent("""
        import os
        capped_at_start = "NPY_DISABLE_CPU_FEATURES" in os.environ
        import argparse
        import numpy  # noqa: F401  (loaded before counteraudit)
        from counteraudit.train.core import numerics
        from counteraudit.train.core.command_line import run_cli
        numerics.numpy_uses_avx512 = lambda: not capped_at_start  # as on an AVX-512 CPU
        run_cli(lambda args: print("ran, capped:", capped_at_start), argparse.ArgumentParser())
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in os.environ.items() if k not in CAPPED})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ran, capped: True"]
    assert "starting the command again" in result.stderr


def _runnable_modules() -> list[Path]:
    """Every module of the project that runs as a command (an ``if __name__ == "__main__"``)."""
    folders = ("anomalies", "evaluate", "explain", "slurm", "train")
    return sorted(path for folder in folders for path in (REPO / folder).rglob("*.py")
                  if '__name__ == "__main__"' in path.read_text())


def _first_outside_import(path: Path) -> str | None:
    """The first module-level import of something outside Python's standard library."""
    for node in ast.parse(path.read_text()).body:
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        outside = [name for name in names if name.split(".")[0] not in sys.stdlib_module_names
                   and name != "__future__"]
        if outside:
            return outside[0]
    return None


@pytest.mark.parametrize("path", _runnable_modules(), ids=lambda path: str(path.relative_to(REPO)))
def test_every_command_sets_the_numeric_mode_before_numpy_or_torch_loads(path):
    """Its first import beyond the standard library is counteraudit.train (which sets the mode),
    so the command runs once, not started again on every AVX-512 machine with a warning (NumPy
    would otherwise load its AVX-512 loops, as run_cli then finds)."""
    first = _first_outside_import(path)
    assert first is None or first == "counteraudit.train" or first.startswith("counteraudit.train."), (
        f"{path.relative_to(REPO)} imports {first} first; put `import counteraudit.train  # noqa: "
        "E402, F401, I001` above its other imports, as evaluate/benchmarks/cli_help.py does")
