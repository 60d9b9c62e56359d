"""The suite file's schema: every key of every table fed a wrong type and a wrong range, generated
from the schema itself, gives one clear error naming the key; unknown keys and tables name the
nearest valid one; a bad suite fails before any work, in one message without a traceback."""
from __future__ import annotations

import copy
import typing
from pathlib import Path

import annotated_types
import pytest

from counteraudit.evaluate.detect import get_args_parser, main
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.recipe import Recipe
from counteraudit.evaluate.pipeline import load_checked_suite
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_files import toml_text
from counteraudit.train.core.params import params_table
from counteraudit.train.core.suite_schema import SuiteFileError, SuiteTable
from counteraudit.train.worlds.synthetic import SyntheticConfig


# A small valid suite with one entry of each array, so every key has a place to go wrong.
VALID = {
    "name": "schema",
    "world": {"name": "synthetic", "seed": 3, "image_size": 32, "num_train": 640, "num_val": 160},
    "architecture": {"name": "small_resnet"},
    "recipe": {"epochs": 2, "batch_size": 64, "lr": 0.05, "lr_step_epochs": 1},
    "references": {"count": 3},
    "anomalies": [{"name": "smoothing", "family": "randomized_smoothing",
                   "params": {"sigma": 0.5}, "seed": 7}],
    "sweeps": [{"family": "randomized_smoothing", "name": "smoothing-sigma",
                "values": [0.25, 1.0], "seed": 8}],
    "explain": {"methods": ["guided_backprop", "outputs_only"],
                "batch_sizes": {"guided_backprop": 8}, "chunk_images": 0},
    "evaluate": {"detection_images": 8, "localization_images": 4, "seed": 0},
    "discover": {"auditors": ["error_ratio"], "seed": 0, "budget": {"error_ratio": 100}},
}


def _unwrap(annotation):
    """X from X | None."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, __import__("types").UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _wrong_type(annotation):
    annotation = _unwrap(annotation)
    origin = typing.get_origin(annotation) or annotation
    if origin is typing.Annotated:
        return _wrong_type(typing.get_args(annotation)[0])
    return {int: "five", float: "x", bool: 1, str: 5, list: 5, dict: 5}.get(origin)


def _wrong_range(info):
    """A value just outside the field's bounds (None where it has none)."""
    for bound in info.metadata:
        if isinstance(bound, annotated_types.Ge):
            return bound.ge - 1
        if isinstance(bound, annotated_types.Gt):
            return bound.gt
        if isinstance(bound, annotated_types.Le):
            return bound.le + 1
        if isinstance(bound, annotated_types.MinLen):
            return [0.5] * (bound.min_length - 1)
        if getattr(bound, "pattern", None):
            return "../outside"
    return None


def _cases():
    """(location, key path in the suite table, wrong value) for every key the schema declares."""
    tables = {("recipe",): params_table(Recipe), ("world",): params_table(SyntheticConfig)}
    for name, info in SuiteTable.model_fields.items():
        model = typing.get_args(info.annotation)[0] if typing.get_origin(info.annotation) is list \
            else info.annotation
        if isinstance(model, type) and hasattr(model, "model_fields"):
            prefix = (name, 0) if typing.get_origin(info.annotation) is list else (name,)
            tables[prefix] = model
        else:
            yield f"{name} wrong type", (name,), _wrong_type(info.annotation)
    for prefix, model in tables.items():
        for key, info in model.model_fields.items():
            if prefix == ("recipe",) and key == "resolution_schedule":
                continue  # its own test below (the synthetic world refuses any schedule)
            wrong = _wrong_type(info.annotation)
            if wrong is not None:
                yield f"{'.'.join(map(str, prefix))}.{key} wrong type", (*prefix, key), wrong
            wrong = _wrong_range(info)
            if wrong is not None:
                yield f"{'.'.join(map(str, prefix))}.{key} wrong range", (*prefix, key), wrong
    # the values inside the keyed tables
    yield "explain.batch_sizes value range", ("explain", "batch_sizes", "guided_backprop"), 0
    yield "discover.budget value type", ("discover", "budget", "error_ratio"), 1.5


CASES = list(_cases())


def _write(path: Path, table: dict) -> Path:
    path.write_text(toml_text(table) + "\n")
    return path


def test_the_valid_suite_loads(tmp_path):
    suite = load_suite(_write(tmp_path / "schema.toml", VALID))
    assert [s.name for s in suite.anomalies] == ["smoothing", "smoothing-sigma0.25", "smoothing-sigma1"]


def test_every_key_is_covered_by_a_generated_case():
    keys = {case[1][-1] for case in CASES}
    assert {"count", "held_out", "epochs", "lr", "momentum", "num_train", "image_size",
            "detection_images", "chunk_images", "seed", "name", "values", "cpu_bf16"} <= keys
    assert len(CASES) > 50


@pytest.mark.parametrize("what,where,value", CASES, ids=[c[0] for c in CASES])
def test_a_wrong_value_gives_one_error_naming_its_key(tmp_path, what, where, value):
    table = copy.deepcopy(VALID)
    node = table
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    with pytest.raises(SuiteFileError) as caught:
        load_suite(_write(tmp_path / "bad.toml", table))
    message = str(caught.value)
    assert "bad.toml" in message and "nothing was run" in message
    problems = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1, message
    key = where[-1] if isinstance(where[-1], str) else where[-2]
    assert str(key) in problems[0], message
    table_named = f"[{where[0]}]" in problems[0] or f"[[{where[0]}]]" in problems[0]
    assert table_named or len(where) == 1, message  # a top-level key is named by itself


def test_unknown_keys_and_tables_name_the_nearest(tmp_path):
    table = copy.deepcopy(VALID)
    table["recipe"]["epoch"] = 3
    table["evalute"] = {"detection_images": 3}
    table["methods"] = {"guided_backprob": {"gradient_space": "normalized"}}
    table["references"]["cuont"] = 3
    with pytest.raises(SuiteFileError) as caught:
        load_suite(_write(tmp_path / "typos.toml", table))
    message = str(caught.value)
    assert "3 problems" in message  # the plug-in tables come next, once these are fixed
    assert "[recipe] epoch: unknown key (did you mean 'epochs'?)" in message
    assert "unknown table [evalute] (did you mean 'evaluate'?)" in message
    assert "[references] cuont: unknown key (did you mean 'count'?)" in message
    table.pop("evalute")
    table["recipe"].pop("epoch")
    table["references"].pop("cuont")
    with pytest.raises(SuiteFileError, match=r"unknown method 'guided_backprob' \(did you mean "
                                             r"'guided_backprop'\?\)"):
        load_checked_suite(_write(tmp_path / "typos.toml", table))
    load_suite(_write(tmp_path / "typos.toml", table))  # training's own tables are right


def test_whole_numbers_stay_whole_and_values_are_not_converted(tmp_path):
    table = copy.deepcopy(VALID)
    table["references"]["count"] = 2.9
    with pytest.raises(SuiteFileError, match=r"count = 2.9 must be a whole number"):
        load_suite(_write(tmp_path / "count.toml", table))
    table["references"]["count"] = 3
    table["recipe"]["lr_warmup_epochs"] = 1  # an int for a float key: accepted, kept as written
    suite = load_suite(_write(tmp_path / "count.toml", table))
    assert type(suite.recipe.lr_warmup_epochs) is int  # model keys hash it as written


def test_plugin_tables_are_checked_against_their_registries(tmp_path):
    table = copy.deepcopy(VALID)
    table["explain"]["methods"] = ["guided_backprop", "gradcamm"]
    table["methods"] = {"caricature": {"steps": "12"}}
    table["discover"]["auditors"] = ["nosuch"]
    table["anomalies"][0]["params"] = {"sigma": "0.5"}
    table["slurm"] = {"log_dir": "/tmp/elsewhere", "mem_gb": -1}
    with pytest.raises(SuiteFileError) as caught:
        load_checked_suite(_write(tmp_path / "plugins.toml", table))
    message = str(caught.value)
    assert "(did you mean 'gradcam'?)" in message
    assert "[methods.caricature]" in message and "steps" in message
    assert "unknown auditor 'nosuch'" in message
    assert "[[anomalies]] entry 1 (smoothing) params" in message and "sigma" in message
    assert "[slurm] log_dir" in message and "mem_gb" in message


def test_a_toml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "broken"\n[recipe\nepochs = 3\n')
    with pytest.raises(SuiteFileError, match=r"broken.toml is not valid TOML: .*line 2"):
        load_suite(path)


def _detect_in_process(capsys, *args) -> tuple[int, str, str]:
    """The main job as its script runs it (run_cli: a user's error is one message, exit 2), in
    this process: (exit status, stdout, stderr)."""
    parser = get_args_parser()
    with pytest.raises(SystemExit) as caught:
        run_cli(main, parser, parser.parse_args([str(a) for a in args]))
    out = capsys.readouterr()
    return caught.value.code, out.out, out.err


@pytest.mark.parametrize("change,expected", [
    ({"references": {"count": 2}}, "is too few to score"),
    ({"references": {"count": "five"}}, "count = \"five\" must be a whole number"),
    ({"recipe": {"epochs": "3"}}, "epochs = \"3\" must be a whole number"),
    ({"world": {"num_train": -5}}, "num_train = -5 must be >= 1"),
    ({"world": {"image_size": -3}}, "image_size = -3 must be >= 32"),
    # a table the suite would silently ignore, since its [explain] methods list leaves it out
    ({"methods": {"gradcam": {"aug_smooth": False}}},
     '[methods.gradcam] sets parameters of a method the suite does not run: add "gradcam" to '
     '[explain] methods = ["guided_backprop", "outputs_only"]'),
], ids=["too-few-references", "count-not-a-number", "epochs-a-string", "negative-images",
        "negative-size", "table-of-a-method-not-run"])
def test_bad_input_fails_in_one_message_before_any_work(tmp_path, capsys, change, expected):
    table = copy.deepcopy(VALID)
    table["anomalies"], table["sweeps"] = [], []
    for section, values in change.items():
        table[section] = {**table.get(section, {}), **values}
    suite = _write(tmp_path / "bad.toml", table)
    status, out, err = _detect_in_process(capsys, "--suite", suite, "--runs-dir", tmp_path / "runs",
                                          "--distance", "l2", "--no-progress")
    assert status == 2, out + err
    assert expected in err and "bad.toml" in err
    assert "training" not in out  # nothing started
    assert not (tmp_path / "runs" / "store").exists()


def test_a_runs_dir_that_is_a_file_is_one_message(tmp_path, capsys):
    (tmp_path / "afile").write_text("not a folder")
    status, out, err = _detect_in_process(capsys, "--quick", "--runs-dir", tmp_path / "afile",
                                          "--no-progress")
    assert status == 2 and "is a file, not a folder" in err
    assert "training" not in out  # before the first stage
