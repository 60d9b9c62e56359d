"""Hostile sizes and hostile suite files: every size has a bound and every float is finite (one
message naming the key, the bound and why), a value the world cannot honour is an error, a
diverging training stores nothing as trained, a deep or long or non-UTF-8 suite file is one
message naming the file, and an environment variable's value never reaches a message. Each case
runs the real command line and checks that nothing was written beside the suite file."""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import pytest
import torch

from conftest import TINY_WORLD, write_suite
from counteraudit.anomalies.image_sets import detection_set
from counteraudit.evaluate import detect
from counteraudit.train import train
from counteraudit.train.checkpoint import CHECKPOINT_NAME, METRICS_NAME, WEIGHTS_NAME
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_files import MAX_EXTENDS_DEPTH, MAX_NESTING_DEPTH
from counteraudit.train.trainer import train_model
from counteraudit.train.worlds import build_world


def _listing(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256 (and every folder, as None)."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            if path.is_file() else None for path in sorted(folder.rglob("*"))}


def _train_cli(suite: Path, runs: Path, capsys, *options: str) -> tuple[int, str]:
    """``python train/train.py --suite <suite> --runs-dir <runs> ...``: its exit status and its
    error output."""
    parser = train.get_args_parser()
    with pytest.raises(SystemExit) as exit_:
        run_cli(train.main, parser, parser.parse_args(
            ["--suite", str(suite), "--runs-dir", str(runs), "--no-progress", *options]))
    return exit_.value.code, capsys.readouterr().err


def _detect_cli(suite: Path, runs: Path, capsys) -> tuple[int, str]:
    """``python evaluate/detect.py --suite <suite> --runs-dir <runs>``: its exit status and its
    error output (the command that checks every table, the plug-ins' too, before any work)."""
    parser = detect.get_args_parser()
    with pytest.raises(SystemExit) as exit_:
        run_cli(detect.main, parser, parser.parse_args(
            ["--suite", str(suite), "--runs-dir", str(runs), "--no-progress"]))
    return exit_.value.code, capsys.readouterr().err


def _refused(tmp_path: Path, text: str, capsys, name: str = "hostile.toml") -> str:
    """The one message the command gives for a suite file of ``text`` (extending the quick
    suite), having written nothing: no runs folder, no other file. The training command checks
    the tables training reads; a method's table is checked by the commands that explain, here
    the detection command."""
    (tmp_path / name).write_text(text)
    before = _listing(tmp_path)
    command = _detect_cli if "[methods." in text else _train_cli
    status, error = command(tmp_path / name, tmp_path / "runs", capsys)
    assert status == 2 and "Traceback" not in error
    assert _listing(tmp_path) == before, "a refused suite wrote something"
    return error


# (table, key, bound or None where a float has no upper bound) of every size a suite sets
SIZES = [
    ("[references]", "count", bounds.MODELS),
    ("[references]", "held_out", bounds.MODELS),
    ("[world]", "num_train", None),  # bounded with num_val and image_size: the split's memory
    ("[world]", "image_size", bounds.IMAGE_SIDE),
    ("[world]", "clutter_max", bounds.CLUTTER),
    ("[recipe]", "epochs", bounds.EPOCHS),
    ("[recipe]", "batch_size", bounds.BATCH),
    ("[recipe]", "eval_batch_size", bounds.BATCH),
    ("[evaluate]", "detection_images", bounds.SET_IMAGES),
    ("[evaluate]", "localization_images", bounds.SET_IMAGES),
    ("[explain]", "chunk_images", bounds.SET_IMAGES),
    ("[methods.caricature]", "steps", bounds.PASSES),
    ("[discover.budget]", "twise", bounds.DISCOVERY_IMAGES),
]
HUGE = 10 ** 12


@pytest.mark.parametrize("table, key, bound", SIZES, ids=[f"{t}{k}" for t, k, _ in SIZES])
def test_a_huge_size_is_refused_naming_the_key_the_bound_and_why(tmp_path, capsys, table, key, bound):
    error = _refused(tmp_path, f'extends = "quick"\n{table}\n{key} = {HUGE}\n', capsys)
    assert f"{key} = {HUGE}" in error
    if bound is not None:
        assert f"must be <= {bound.limit} ({bound.why})" in error
    else:
        assert "lower num_train to at most" in error and "GiB" in error


def test_sizes_each_within_its_bound_but_too_many_models_together_are_refused(tmp_path, capsys):
    error = _refused(tmp_path, 'extends = "quick"\n[references]\ncount = 600\nheld_out = 600\n', capsys)
    assert (f"the suite has 1203 models ([references] count and held_out, each [[anomalies]] entry's "
            f"replicates, each [[sweeps]] value): at most {bounds.MODELS.limit}, as {bounds.MODELS.why}") in error


@pytest.mark.parametrize("table, key", [
    ("[[anomalies]]", "replicates"), ("[methods.feature_synthesis]", "steps")])
def test_a_huge_size_in_an_entry_or_a_method_is_refused(tmp_path, capsys, table, key):
    text = ('[explain]\nmethods = ["feature_synthesis"]\n' f"{table}\n" if "feature" in table else
            f'{table}\nname = "smoothing"\nfamily = "randomized_smoothing"\n')
    error = _refused(tmp_path, f'extends = "quick"\n{text}{key} = {HUGE}\n', capsys)
    bound = bounds.MODELS if key == "replicates" else bounds.PASSES
    assert f"{key} = {HUGE}" in error and str(bound.limit) in error and bound.why in error


FLOATS = [("[recipe]", "lr"), ("[recipe]", "weight_decay"), ("[recipe]", "lr_warmup_epochs"),
          ("[world]", "face_prob"), ("[evaluate]", "alpha"), ("[methods.caricature]", "learning_rate")]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("table, key", FLOATS, ids=[f"{t}{k}" for t, k in FLOATS])
def test_a_non_finite_float_is_refused(tmp_path, capsys, table, key, value):
    error = _refused(tmp_path, f'extends = "quick"\n{table}\n{key} = {value}\n', capsys)
    assert key in error and "finite number" in error


@pytest.mark.parametrize("table, key", [("[references]", "count"), ("[world]", "num_train")])
def test_a_non_finite_whole_number_is_refused(tmp_path, capsys, table, key):
    error = _refused(tmp_path, f'extends = "quick"\n{table}\n{key} = inf\n', capsys)
    assert f"{key} = inf must be a whole number" in error


def test_more_detection_images_than_the_world_holds_is_an_error_not_a_smaller_set(tmp_path, capsys):
    error = _refused(tmp_path, 'extends = "quick"\n[evaluate]\ndetection_images = 1000\n', capsys)
    assert ("[evaluate] detection_images = 1000 images cannot be drawn from the 500 validation "
            "images of the world ([world] num_val)") in error
    error = _refused(tmp_path, 'extends = "quick"\n[evaluate]\ndetection_images = 1000000000\n',
                     capsys, "huge.toml")
    assert f"detection_images = 1000000000 must be <= {bounds.SET_IMAGES.limit}" in error
    error = _refused(tmp_path, 'extends = "quick"\n[evaluate]\nlocalization_images = 501\n',
                     capsys, "abnormal.toml")
    assert ("[evaluate] localization_images = 501 images cannot be drawn from the 500 validation "
            "images") in error


def test_a_set_too_large_for_memory_at_the_worlds_size_is_refused(tmp_path, capsys):
    error = _refused(tmp_path, 'extends = "quick"\n[world]\nimage_size = 512\nnum_train = 100\n'
                               'num_val = 5000\n[evaluate]\ndetection_images = 1000\n', capsys)
    assert ("[evaluate] detection_images = 1000 images of 512 px take 2.9 GiB as float32 (3 x "
            "side^2 x 4 bytes each), more than the 2.0 GiB an image set may take") in error
    assert f"lower it to at most {bounds.IMAGE_SET_MEMORY // (3 * 512 * 512 * 4)}" in error


def test_a_pool_known_only_when_the_world_is_built_is_checked_before_the_draw(tmp_path, runs):
    """A world whose val split is listed only when built (ImageNet's) is checked at the draw;
    the synthetic world's count is changed past the load-time check to reach it."""
    suite = load_suite(write_suite(tmp_path / "pool.toml"))
    suite = suite.with_settings(evaluate={"detection_images": TINY_WORLD["num_val"] + 1})
    world = build_world(suite.world, runs_root=runs)
    with pytest.raises(ValueError, match=r"\[evaluate\] detection_images = 161 images cannot be "
                                         r"drawn from the 160 validation images"):
        detection_set(suite, world, tmp_path / "sets")
    assert not (tmp_path / "sets").exists()


def test_a_toml_file_nested_600_deep_is_one_message(tmp_path, capsys):
    error = _refused(tmp_path, 'extends = "quick"\nx = ' + "[" * 600 + "]" * 600 + "\n", capsys)
    assert (f"suite file {tmp_path / 'hostile.toml'} nests tables or arrays more than "
            f"{MAX_NESTING_DEPTH} levels deep") in error


def test_an_extends_chain_of_1200_files_is_one_message(tmp_path, capsys):
    for index in range(1, 1200):
        (tmp_path / f"chain-{index}.toml").write_text(f'extends = "chain-{index + 1}.toml"\n')
    (tmp_path / "chain-1200.toml").write_text('extends = "quick"\n')
    error = _refused(tmp_path, 'extends = "chain-1.toml"\n', capsys)
    assert (f'suite file {tmp_path / f"chain-{MAX_EXTENDS_DEPTH - 1}.toml"}: extends = '
            f'"chain-{MAX_EXTENDS_DEPTH}.toml": {tmp_path / "hostile.toml"} extends a chain of more '
            f"than {MAX_EXTENDS_DEPTH} suite files") in error


def test_an_extends_error_names_the_extending_file_and_the_key(tmp_path, capsys):
    error = _refused(tmp_path, 'extends = "no-such-suite"\n', capsys)
    assert (f"suite file {tmp_path / 'hostile.toml'}: extends = \"no-such-suite\": unknown suite "
            "'no-such-suite'") in error


def test_a_suite_file_that_is_not_utf8_is_one_message_naming_the_byte(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes('extends = "quick"\n# café\n'.encode("latin-1"))
    before = _listing(tmp_path)
    status, error = _train_cli(path, tmp_path / "runs", capsys)
    assert status == 2 and _listing(tmp_path) == before
    assert (f"suite file {path} is not UTF-8 text: byte 0xe9 at offset 23 (line 2) invalid "
            "continuation byte; save the file as UTF-8") in error


@pytest.mark.parametrize("variable, value", [("HOME", None), ("COUNTERAUDIT_TEST_TOKEN", "s3cr3t-4f9a2b")])
def test_a_path_from_the_environment_is_never_printed_expanded(tmp_path, capsys, monkeypatch,
                                                                variable, value):
    if value is not None:
        monkeypatch.setenv(variable, value)
    error = _refused(tmp_path, f'extends = "quick"\n[image_sets]\ndetection = '
                               f'"${{{variable}}}/no-such-folder"\n', capsys)
    expanded = os.environ[variable]
    assert f"${{{variable}}}/no-such-folder" in error
    assert f"{expanded}/no-such-folder" not in error and (value is None or value not in error)


def test_a_diverging_training_fails_and_stores_nothing_as_trained(tmp_path, capsys):
    """lr = 1e30 makes the loss overflow at the second step: one message naming the model, the
    epoch and step and the cause, and no weights, no marker and no checkpoint to resume from."""
    suite_path = write_suite(tmp_path / "diverge.toml", references=2, epochs=1)
    suite_path.write_text(suite_path.read_text().replace("lr = 0.05", "lr = 1e30"))
    runs = tmp_path / "runs"
    status, error = _train_cli(suite_path, runs, capsys, "--model", "reference-00")
    assert status == 2 and "Traceback" not in error
    assert "model reference-00" in error and "diverged: the training loss is" in error
    assert "at epoch 1/1, step 2/10" in error
    assert "lr = 1e+30, weight_decay = 0.0001" in error and "lower [recipe] lr" in error
    stored = {path.name for path in runs.rglob("*") if path.is_file()}
    assert not stored & {WEIGHTS_NAME, METRICS_NAME, CHECKPOINT_NAME}, stored


def test_a_diverged_checkpoint_is_never_resumed(tmp_path, runs):
    """A checkpoint whose weights hold nan (a diverged run of an older version) is set aside, and
    the training starts over (and diverges again: nothing stored as trained)."""
    suite = load_suite(write_suite(tmp_path / "resume.toml", references=2, epochs=2))
    spec = suite.references[0]
    world = build_world(suite.world, runs_root=runs)
    train_model(spec, tmp_path / "model", world=world, progress=False, stop_after_epoch=1)
    state = torch.load(tmp_path / "model" / CHECKPOINT_NAME, weights_only=True)
    first = next(name for name, value in state["model"].items() if value.is_floating_point())
    state["model"][first].fill_(math.nan)
    torch.save(state, tmp_path / "model" / CHECKPOINT_NAME)
    metrics = train_model(spec, tmp_path / "model", world=world, progress=False)
    assert (tmp_path / "model" / f"{CHECKPOINT_NAME}.corrupt").is_file()
    assert [record["epoch"] for record in metrics["history"]] == [1, 2]  # started over
    assert all(math.isfinite(record["loss"]) for record in metrics["history"])
