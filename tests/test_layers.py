"""The code's shape is checked, not hoped for: the import contract (import-linter, contracts in
pyproject.toml's [tool.importlinter]) and the lint rules (ruff, [tool.ruff]) hold on the tree, and
each catches the violation it exists for."""
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

from tests.conftest import REPO

CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
LAYERS = next(contract["layers"] for contract in CONFIG["contracts"] if contract["type"] == "layers")


def tool(name: str) -> str:
    """The console script installed beside this interpreter (the project's [test] extra)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else shutil.which(name) or pytest.fail(
        f"{name} is not installed: pip install -e '.[test]'")


def test_the_import_contract_holds():
    result = subprocess.run([tool("lint-imports")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " 0 broken" in result.stdout


def test_the_layer_contract_refuses_an_explain_module_importing_evaluate():
    graph = grimp.build_graph(*CONFIG["root_packages"], include_external_packages=False)
    assert not graph.find_illegal_dependencies_for_layers(layers=LAYERS)
    graph.add_import(importer="counteraudit.explain.base", imported="counteraudit.evaluate.scoring.scores")
    illegal = graph.find_illegal_dependencies_for_layers(layers=LAYERS)
    assert [(d.importer, d.imported) for d in illegal] == [("counteraudit.explain", "counteraudit.evaluate")]


def test_the_layers_are_the_pipelines_order():
    assert LAYERS == ["counteraudit.evaluate", "counteraudit.explain", "counteraudit.anomalies",
                      "counteraudit.train", "counteraudit.slurm"]


def test_ruff_passes_on_the_tree():
    result = subprocess.run([tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize("source, rule", [
    ("import os\n", "F401"),                                         # an unused import
    ("def f():\n    import os\n    return os.sep\n", "PLC0415"),     # an import that is not at the top
])
def test_ruff_refuses(tmp_path, source, rule):
    module = tmp_path / "module.py"
    module.write_text(source)
    result = subprocess.run([tool("ruff"), "check", "--config", str(REPO / "pyproject.toml"), str(module)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and rule in result.stdout, result.stdout + result.stderr
