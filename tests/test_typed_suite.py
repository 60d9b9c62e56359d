"""The suite is one typed object, resolved once at the entry point, and the code keeps to it: no
raw reads of a suite's tables, no argparse namespace below the entry scripts, no private names
imported across packages, train/core free of the layers above it, typed work items that carry
the suite (a worker never reads the file again), and train/core's modules small."""
from __future__ import annotations

import ast
import dataclasses
import pickle
import re
from pathlib import Path

import pytest

from counteraudit.evaluate.discovery.reference_evaluations import ReferenceItem, ResultToEvaluate
from counteraudit.evaluate.discovery.stage import DiscoverItem
from counteraudit.evaluate.pipeline import load_checked_suite, scoring_suite
from counteraudit.evaluate.scoring.stage import ScoreItem
from counteraudit.explain.settings import method_specs
from counteraudit.explain.stage import ExplainItem
from counteraudit.train.core.stage import StageItem
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import (PAPER_DETECTION_IMAGES, PAPER_LOCALIZATION_IMAGES,
                                                  SuiteFileError)
from counteraudit.train.implant_checks import VerifyItem
from counteraudit.train.stage import TrainItem
from tests.conftest import write_suite

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("train", "anomalies", "explain", "evaluate", "slurm")
SOURCES = sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))
# The modules that declare command-line options and turn them into typed values: the entry
# scripts (each has a get_args_parser and runs as a script) and the helpers that add options
# shared by several scripts, each reading back only its own.
OPTION_MODULES = {"train/core/stage.py", "train/core/command_line.py", "train/core/explain_options.py",
                  "slurm/executor_config.py", "evaluate/pipeline.py", "evaluate/pipeline_options.py",
                  "evaluate/benchmarks/__init__.py"}


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _is_entry_script(source: str) -> bool:
    return "def get_args_parser" in source and 'if __name__ == "__main__":' in source


def test_a_suite_is_typed_with_the_schemas_defaults_applied_once(tmp_path):
    suite = load_suite(write_suite(tmp_path / "plain.toml", body="[evaluate]\nalpha = 0.1\n"))
    assert not hasattr(suite, "tables")
    assert suite.evaluate.alpha == 0.1  # the file's value, and the schema's defaults for the rest
    assert (suite.evaluate.detection_images, suite.evaluate.localization_images) == (
        PAPER_DETECTION_IMAGES, PAPER_LOCALIZATION_IMAGES)
    assert (suite.evaluate.seed, suite.evaluate.p_value, suite.evaluate.distance) == (0, None, "l2")
    assert suite.discover.score == "relative" and suite.explain.chunk_images is None


def test_command_line_overrides_merge_once_and_are_checked_as_the_files_values(tmp_path):
    path = write_suite(tmp_path / "over.toml")
    suite = load_suite(path)
    changed = suite.with_settings(evaluate={"distance": "ssim", "p_value": None},
                                  explain={"chunk_images": 4})
    assert (changed.evaluate.distance, changed.explain.chunk_images) == ("ssim", 4)
    assert suite.evaluate.distance == "l2" and suite.explain.chunk_images is None  # untouched
    assert changed.evaluate.p_value is None and changed.models == suite.models
    assert suite.with_settings(evaluate={"distance": None}) is suite  # nothing given: the same
    with pytest.raises(SuiteFileError, match=r"\[explain\] chunk_images \(from --chunk-images\) = -1"):
        suite.with_settings({"chunk_images": "--chunk-images"}, explain={"chunk_images": -1})
    # a plug-in name given on the command line is checked as the suite's own would be
    assert scoring_suite(str(path), distance="ssim").evaluate.distance == "ssim"
    with pytest.raises(SuiteFileError, match=r"--distance: unknown distance 'sim'"):
        scoring_suite(str(path), distance="sim")


def test_no_code_reads_a_suite_table_raw():
    raw = [f"{_relative(path)}:{number}" for path in SOURCES
           for number, line in enumerate(path.read_text().splitlines(), 1)
           if re.search(r"\.tables\.get\(|\.tables\[", line)]
    assert raw == []


def test_the_argparse_namespace_stays_in_the_entry_scripts():
    """Only the entry scripts and the option helpers import argparse, and no function elsewhere
    takes a namespace (a parameter called args, or annotated argparse.Namespace)."""
    importers, takers = [], []
    for path in SOURCES:
        source, name = path.read_text(), _relative(path)
        if _is_entry_script(source) or name in OPTION_MODULES:
            continue
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(alias.name == "argparse" for alias in node.names):
                importers.append(name)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for argument in node.args.args + node.args.kwonlyargs:
                    annotation = ast.unparse(argument.annotation) if argument.annotation else ""
                    if argument.arg == "args" or "Namespace" in annotation:
                        takers.append(f"{name}:{node.name}")
    assert importers == [] and takers == []


def test_no_private_name_is_imported_across_packages():
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("counteraudit"):
                found += [f"{_relative(path)}: {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") or (alias.asname or "").startswith("_")]
    assert found == []


def test_train_core_names_no_higher_layer_but_the_anomaly_families():
    """train/core neither imports nor names explain/ or evaluate/; anomalies/ only in the one
    registry training needs from it (an anomaly family changes how a model trains)."""
    higher = re.compile(r"counteraudit\.(explain|evaluate|anomalies)\b")
    named = {f"{_relative(path)}: {match.group(0)}" for path in (REPO / "train" / "core").rglob("*.py")
             for match in higher.finditer(path.read_text())}
    assert named == {"train/core/registries.py: counteraudit.anomalies"}


def test_train_cores_modules_are_small():
    sizes = {_relative(path): len(path.read_text().splitlines())
             for path in (REPO / "train" / "core").glob("*.py")}
    assert max(sizes.values()) <= 400, sizes


ITEMS = [TrainItem, VerifyItem, ExplainItem, ScoreItem, DiscoverItem, ReferenceItem]


@pytest.mark.parametrize("item_type", ITEMS, ids=lambda cls: cls.__name__)
def test_work_items_are_frozen_dataclasses_that_carry_the_suite(item_type):
    assert issubclass(item_type, StageItem) and dataclasses.is_dataclass(item_type)
    assert item_type.__dataclass_params__.frozen
    assert "suite" in {field.name for field in dataclasses.fields(item_type)}


def test_a_work_item_pickles_with_its_typed_suite_and_method(tmp_path):
    """What a Slurm job unpickles: the suite (its overrides included) and the method's typed
    parameters, equal to what the driver resolved; the job reads no suite file."""
    path = write_suite(tmp_path / "item.toml", body='[methods.caricature]\nsteps = 3\n')
    suite = load_checked_suite(path).with_settings(explain={"chunk_images": 4})
    spec = method_specs(suite, ["caricature"])["caricature"]
    item = ExplainItem(suite=suite, runs_dir=str(tmp_path), model="reference-00", method=spec)
    path.unlink()  # a worker never reads the file again
    again = pickle.loads(pickle.dumps(item))
    assert again == item and again.method.params.steps == 3 and again.suite.explain.chunk_images == 4
    result = ResultToEvaluate("error_ratio", str(tmp_path), {"key": 1})
    reference = ReferenceItem(suite=suite, runs_dir=None, reference="reference-00", results=(result,))
    assert pickle.loads(pickle.dumps(reference)) == reference
