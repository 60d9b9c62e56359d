"""The digest check that CI runs on every machine: a finished run matches the digests it wrote,
and any changed file is named with both digests and this machine's instruction set."""
from __future__ import annotations

import contextlib
import io
import json
import shutil

from conftest import ONE_PROCESS, REPO, command_in_process, run_in_process

import pytest

from counteraudit.evaluate import cli
from counteraudit.evaluate.reproducibility import (chosen_methods, differences, get_args_parser,
                                                 key_differences, measure, model_keys, read_digests,
                                                 run_files, writing_command)
from counteraudit.evaluate.reproducibility import main as reproducibility_main
from counteraudit.evaluate.scoring.stage import tables_dir
from counteraudit.train.core import numerics
from counteraudit.train.core.suite import load_suite


def test_a_run_matches_its_own_digests_and_a_changed_table_is_named(finished_run, tmp_path):
    suite, runs, _ = finished_run
    digests = tmp_path / "digests.json"
    # Table 2 too (detect.py writes Table 1 only); other tests of the shared run may have already
    run_in_process("evaluate/localize.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
                   "--no-progress", *ONE_PROCESS)
    run_in_process("evaluate/reproducibility.py", "write", "--digests", digests, "--suite", suite, "--runs-dir", runs)
    written = json.loads(digests.read_text())
    names = set(written["sha256"])
    assert {"weights/reference-00", "tables/detection-per-model-l2.csv",
            "tables/localization-per-model-l2.csv"} <= names
    assert any(name.startswith("world/") for name in names)
    assert written["made_on"]["mode"] == "portable"
    assert written["model_keys"] == model_keys(load_suite(suite))
    ok = run_in_process("evaluate/reproducibility.py", "check", "--digests", digests, "--suite", suite,
                        "--runs-dir", runs)
    assert f"all {len(names)} files of the e2e suite match" in ok

    # A copy of the run with one byte of a table changed: the check fails and says where.
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy, symlinks=True)
    table = copy / "e2e" / "tables" / "detection-per-model-l2.csv"
    text = table.read_text()
    table.write_text(text.replace("0", "1", 1))
    result = command_in_process("evaluate/reproducibility.py", "check", "--digests", digests,
                                "--suite", suite, "--runs-dir", copy)
    assert result.returncode == 1
    assert "1 of" in result.stderr and "tables/detection-per-model-l2.csv: SHA-256 " in result.stderr
    assert f"expected {written['sha256']['tables/detection-per-model-l2.csv']}" in result.stderr
    assert numerics.instruction_set() in result.stderr
    # the command's form exits as the script does: CI's `counteraudit reproducibility check` fails
    with contextlib.redirect_stderr(io.StringIO()) as said, pytest.raises(SystemExit) as exited:
        cli.main(["reproducibility", "check", "--digests", str(digests), "--suite", str(suite),
                  "--runs-dir", str(copy)])
    assert exited.value.code == 1 and "tables/detection-per-model-l2.csv: SHA-256 " in said.getvalue()


def test_a_run_of_some_methods_is_digested_from_its_own_tables(finished_run):
    """detect.py --method writes its tables apart (tables/method-<names>/); the digests of such a
    run read those, and the file records the methods so that check finds them again."""
    suite_path, runs, _ = finished_run
    suite = load_suite(suite_path)
    files = run_files(suite, runs, ["gradcam", "outputs_only"])
    tables = {path.parent for name, path in files.items() if name.startswith("tables/")}
    assert tables == {tables_dir(suite, runs, ["gradcam", "outputs_only"])}
    assert tables != {tables_dir(suite, runs)}
    assert "methods" not in measure(suite, runs)
    assert measure(suite, runs, ["gradcam"])["methods"] == ["gradcam"]


@pytest.mark.parametrize("methods", [["../../outside"], "gradcam", [], [3]])
def test_a_digest_files_methods_must_be_registered_names(methods, tmp_path):
    """A digest file may come from anyone: its methods name table folders, so anything but a
    list of registered method names is one clear error naming the file and the key."""
    digests = tmp_path / "theirs.digests.json"
    with pytest.raises(ValueError, match=r"theirs\.digests\.json, key 'methods'"):
        chosen_methods(None, {"methods": methods}, digests)
    assert chosen_methods(None, {"methods": ["gradcam"]}, digests) == ["gradcam"]
    assert chosen_methods(["outputs_only"], {"methods": methods}, digests) == ["outputs_only"]
    assert chosen_methods(None, {}, digests) is None


def test_a_table_the_run_lacks_is_named_with_the_command_that_writes_it(tmp_path):
    """A digest file of a --method run covers that run's tables: the check that finds one missing
    says which stage writes it and with which methods, not just 'run localize.py'."""
    suite = load_suite("quick")
    expected = {"sha256": {"tables/detection-per-model-l2.csv": "a" * 64,
                           "tables/localization-per-model-l2.csv": "b" * 64,
                           "weights/reference-00": "c" * 64}}
    measured = {"sha256": {"weights/reference-00": "c" * 64}}
    lines = differences(expected, measured,
                        lambda name: writing_command(name, suite, tmp_path, ["gradcam", "outputs_only"]))
    methods = "--method gradcam --method outputs_only"
    assert lines == [
        f"  tables/detection-per-model-l2.csv: SHA-256 (not in this run: python evaluate/detect.py "
        f"--suite quick --runs-dir {tmp_path} {methods}), expected {'a' * 64}",
        f"  tables/localization-per-model-l2.csv: SHA-256 (not in this run: python "
        f"evaluate/localize.py --suite quick --runs-dir {tmp_path} {methods}), expected {'b' * 64}"]


@pytest.mark.parametrize("digests", sorted((REPO / "train" / "suites").glob("*.digests.json")),
                         ids=lambda path: path.name)
def test_every_shipped_digest_file_keys_its_models_as_this_code_does(digests):
    """A change of a model's key (its recipe, the numeric tag, the key's form) makes it another
    model and redraws what is seeded from the key (Caricatures' per-model noise), so the shipped
    tables would no longer be this code's: the change fails here, not in a user's check."""
    suite = load_suite(digests.name.removesuffix(".digests.json"))
    expected = read_digests(digests)
    assert set(expected["model_keys"]) == {spec.name for spec in suite.models}
    assert key_differences(expected, model_keys(suite)) == []


def test_a_changed_model_key_is_named_before_the_files(tmp_path):
    """The key lines come first and say why the tables may differ with the same weights; a run
    whose weights are not where this code keys them says that the digest file keys them otherwise."""
    suite = load_suite("quick")
    keys = model_keys(suite)
    expected = {"model_keys": {**keys, "reference-00": "0" * 10}, "sha256": {"weights/reference-00": "c" * 64}}
    measured = {"model_keys": keys, "sha256": {"weights/reference-00": "d" * 64}}
    lines = differences(expected, measured, lambda name: "")
    assert len(lines) == 2
    assert lines[0].startswith(f"  model reference-00: key {keys['reference-00']}, expected {'0' * 10}: ")
    assert "Caricatures' per-model noise" in lines[0]
    assert lines[1].startswith("  weights/reference-00: SHA-256 " + "d" * 64)
    assert differences({"sha256": {}}, {"model_keys": keys, "sha256": {}}, lambda name: "") == []

    digests = tmp_path / "quick.digests.json"
    digests.write_text(json.dumps(expected))
    with pytest.raises(FileNotFoundError, match=r"(?s)lacks weights/reference-00.*keys 1 models otherwise:\n"
                                                r"  model reference-00: key "):
        reproducibility_main(get_args_parser().parse_args(
            ["check", "--suite", "quick", "--digests", str(digests), "--runs-dir", str(tmp_path / "runs")]))


@pytest.mark.parametrize("keys", [["reference-00"], {"reference-00": 3}, {"reference-00": None}])
def test_a_digest_files_model_keys_must_map_names_to_strings(keys, tmp_path):
    digests = tmp_path / "theirs.digests.json"
    digests.write_text(json.dumps({"sha256": {}, "model_keys": keys}))
    with pytest.raises(ValueError, match=r"theirs\.digests\.json, key 'model_keys'"):
        read_digests(digests)
