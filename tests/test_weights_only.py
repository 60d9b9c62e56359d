"""Files from a stranger run no code: weights-only checkpoints, world caches that are no pickle.

A suite's ``checkpoint =`` file or a shared runs folder may come from anyone, and unpickling a
crafted file runs whatever its author put in it. Each test plants such a file where counteraudit
reads one and checks that its code never ran, and that the user gets on (a clear error with the
conversion command, or training that starts over).
"""
from __future__ import annotations

import argparse
import pickle
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, write_suite
from counteraudit.train.architectures import build_model
from counteraudit.train.checkpoint import (CHECKPOINT_NAME, WEIGHTS_NAME, load_training_state, model_dir,
                                           save_training_state)
from counteraudit.train.convert_checkpoint import get_args_parser as convert_args_parser
from counteraudit.train.convert_checkpoint import main as convert_main
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.weights import check_external_checkpoint, load_backbone_weights
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.train.trainer import train_model
from counteraudit.train.worlds import build_world, synthetic_factors
from counteraudit.train.worlds.synthetic import SyntheticConfig, SyntheticWorld

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


class RunsCode:
    """Unpickling this calls exec: it writes ``marker``, as a crafted file could do anything."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('code ran')",)


def crafted_checkpoint(path: Path, marker: Path, layout: dict | None = None) -> Path:
    """A .pth with a real state dict and, beside it, an object whose unpickling runs code; checks
    that the payload is live (loading it unsafely does run it), then removes the marker."""
    torch.save({**(layout or {}), "payload": RunsCode(marker)}, path)
    torch.load(path, weights_only=False)
    assert marker.exists(), "the crafted file's code should run when unpickled in full"
    marker.unlink()
    return path


def small_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return build_model("small_resnet", 10, MEAN, STD).backbone.state_dict()


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- external checkpoints
def test_crafted_external_checkpoint_runs_no_code_and_names_the_conversion(tmp_path):
    marker = tmp_path / "marker"
    path = crafted_checkpoint(tmp_path / "downloaded.pth", marker,
                              {"state_dict": small_state_dict()})
    model = build_model("small_resnet", 10, MEAN, STD)
    for load in (lambda: load_backbone_weights(model, path),
                 lambda: check_external_checkpoint(path)):
        with pytest.raises(ValueError) as raised:
            load()
        message = str(raised.value)
        assert not marker.exists()
        assert str(path) in message and "could run code" in message
        assert (f"python train/convert_checkpoint.py {path} {tmp_path / 'downloaded-weights.pth'}"
                in message)
        assert "weights_only" not in message  # not torch's advice to unpickle it after all


def test_crafted_external_checkpoint_in_a_suite_trains_nothing_and_runs_no_code(tmp_path, runs):
    """The suite is refused when it is read (its checkpoint = is checked as weights only), and
    the trainer, given the model anyway, refuses it too."""
    marker = tmp_path / "marker"
    path = crafted_checkpoint(tmp_path / "downloaded.pth", marker,
                              {"state_dict": small_state_dict()})
    entry = """
[[anomalies]]
name = "downloaded"
family = "backdoor"
params = { nu = 0.1 }
checkpoint = "PATH"
"""
    with pytest.raises(SuiteFileError, match=r"(?s)\(downloaded\) checkpoint: .*convert_checkpoint.py"):
        load_suite(write_suite(tmp_path / "ext.toml", references=2, body=entry.replace("PATH", str(path))))
    assert not marker.exists()
    suite = load_suite(write_suite(tmp_path / "ext.toml", references=2,
                                   body=entry.replace("checkpoint", "# checkpoint")))
    spec = replace(suite.model("downloaded"), checkpoint=str(path))
    with pytest.raises(ValueError, match="convert_checkpoint.py"):
        train_model(spec, model_dir(runs, spec), progress=False, runs_root=runs)
    assert not marker.exists()


def test_a_missing_external_checkpoint_fails_when_the_suite_is_read(tmp_path):
    with pytest.raises(SuiteFileError, match=r"checkpoint: .*nowhere.pth does not exist"):
        load_suite(write_suite(tmp_path / "ext.toml", references=2, body=f"""
[[anomalies]]
name = "downloaded"
family = "randomized_smoothing"
checkpoint = "{tmp_path / 'nowhere.pth'}"
"""))


@pytest.mark.parametrize("content", [b"model weights: see README\n",
                                     np.random.default_rng(0).bytes(512), b"",
                                     pickle.dumps({"fc.weight": 1})],
                         ids=["text", "random bytes", "empty", "plain pickle"])
def test_external_checkpoint_that_is_no_checkpoint_is_one_clear_error(tmp_path, content):
    path = tmp_path / "weights.pth"
    path.write_bytes(content)
    model = build_model("small_resnet", 10, MEAN, STD)
    for load in (lambda: load_backbone_weights(model, path),
                 lambda: check_external_checkpoint(path)):
        with pytest.raises(ValueError, match=f"external checkpoint {path}: it is not a PyTorch "
                                             "checkpoint"):
            load()


def test_check_external_checkpoint(tmp_path):
    good = tmp_path / "good.pth"
    torch.save({"model": {f"module.{k}": v for k, v in small_state_dict().items()}}, good)
    assert check_external_checkpoint(good) is None
    torch.save([torch.zeros(3)], tmp_path / "list.pth")
    with pytest.raises(ValueError, match="list.pth holds a list"):
        check_external_checkpoint(tmp_path / "list.pth")
    with pytest.raises(ValueError, match="absent.pth does not exist"):
        check_external_checkpoint(tmp_path / "absent.pth")


def test_conversion_script_makes_a_trusted_pickle_loadable(tmp_path):
    """A published checkpoint with training options pickled beside the weights: refused, then the
    command the error gives converts it, and the result loads into the model, the same weights."""
    weights = small_state_dict(seed=5)
    source = tmp_path / "published model.pth"  # a space: the command quotes it
    torch.save({"state_dict": {f"module.{k}": v for k, v in weights.items()},
                "args": argparse.Namespace(lr=0.1, arch="resnet"), "epoch": 90,
                "best_accuracy": np.float64(0.75)}, source)
    with pytest.raises(ValueError, match="argparse.Namespace") as raised:
        check_external_checkpoint(source)
    command = shlex.split(str(raised.value).splitlines()[-1])
    assert command[:2] == ["python", "train/convert_checkpoint.py"]
    result = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    converted = Path(command[-1])
    assert converted == tmp_path / "published model-weights.pth"
    assert _same(torch.load(converted, weights_only=True), weights)
    check_external_checkpoint(converted)
    model = build_model("small_resnet", 10, MEAN, STD)
    load_backbone_weights(model, converted)
    assert _same(model.backbone.state_dict(), weights)


def test_conversion_script_keeps_the_source(tmp_path, capsys):
    source = tmp_path / "model.pth"
    torch.save({"model": small_state_dict()}, source)
    parser = convert_args_parser()  # the script as it runs, in this process
    with pytest.raises(SystemExit) as caught:
        run_cli(convert_main, parser, parser.parse_args([str(source), str(source)]))
    assert caught.value.code == 2 and "is the source checkpoint" in capsys.readouterr().err
    assert "can run code" in " ".join(parser.format_help().split())


# ---------------------------------------------------------------- the resume checkpoint
@pytest.fixture
def one_epoch(tmp_path, runs):
    suite = load_suite(write_suite(tmp_path / "one.toml", references=2, epochs=1))
    return suite.references[0], build_world(suite.world, runs_root=runs)


def _numpy_training_state(spec) -> dict:
    """A training state as a version that kept numpy's RNG state would have pickled it."""
    return {"spec_key": spec.key, "epoch": 0, "model": small_state_dict(), "optimizer": {},
            "scheduler": {}, "torch_rng": torch.get_rng_state(), "history": [],
            "train_seconds": 1.0, "images_seen": 64, "numpy_rng": np.random.get_state()}


@pytest.mark.parametrize("planted", ["runs code", "numpy objects"])
def test_planted_training_checkpoint_is_set_aside_and_training_starts_over(one_epoch, tmp_path,
                                                                           capfd, planted):
    spec, world = one_epoch
    marker = tmp_path / "marker"
    straight = tmp_path / "straight"
    train_model(spec, straight, world=world, progress=False)
    directory = tmp_path / "planted"
    directory.mkdir()
    if planted == "runs code":
        crafted_checkpoint(directory / CHECKPOINT_NAME, marker, {"spec_key": spec.key})
    else:
        torch.save(_numpy_training_state(spec), directory / CHECKPOINT_NAME)
    capfd.readouterr()
    metrics = train_model(spec, directory, world=world, progress=False)
    said = capfd.readouterr().err
    assert not marker.exists()
    assert (directory / f"{CHECKPOINT_NAME}.corrupt").exists()
    assert "could run code; training starts over from the first epoch" in said
    assert metrics["source"] == "trained" and len(metrics["history"]) == 1
    assert _same(torch.load(directory / WEIGHTS_NAME, weights_only=True),
                 torch.load(straight / WEIGHTS_NAME, weights_only=True))


def test_training_checkpoint_loads_as_weights_only(one_epoch, tmp_path):
    """What the trainer saves reads back under weights_only=True, so resuming never needs more
    (tests/test_training.py checks that a resumed run ends with the same bits)."""
    spec, world = one_epoch
    two = replace(spec, recipe=replace(spec.recipe, epochs=2))
    train_model(two, tmp_path / "m", world=world, progress=False, stop_after_epoch=1)
    state = torch.load(tmp_path / "m" / CHECKPOINT_NAME, weights_only=True)
    assert state["epoch"] == 0 and state["spec_key"] == two.key
    assert load_training_state(tmp_path / "m") is not None


@pytest.mark.parametrize("content", ["text", "no training state"])
def test_unreadable_training_checkpoint_is_set_aside(tmp_path, content):
    path = tmp_path / CHECKPOINT_NAME
    if content == "text":
        path.write_text("not a checkpoint")
    else:
        torch.save({"model": small_state_dict()}, path)
    assert load_training_state(tmp_path) is None
    assert not path.exists() and (tmp_path / f"{CHECKPOINT_NAME}.corrupt").exists()


def test_training_state_that_would_not_load_back_is_not_saved(tmp_path):
    """A value weights_only=True cannot read back (numpy's RNG state, say) fails at once, instead
    of a checkpoint that every resume would set aside."""
    with pytest.raises(TypeError, match=r"state\['numpy_rng'\]\[1\] is a numpy.ndarray"):
        save_training_state(tmp_path, {"epoch": 0, "numpy_rng": np.random.get_state()})
    with pytest.raises(TypeError, match="numpy.float64"):
        save_training_state(tmp_path, {"history": [{"loss": np.float64(0.5)}]})
    assert not (tmp_path / CHECKPOINT_NAME).exists()


# ---------------------------------------------------------------- the factor pool cache
POOL_CONFIG = SyntheticConfig(seed=3, image_size=32, num_train=64, num_val=32)
POOL = 24  # draws per class


def _pool(cache: Path) -> synthetic_factors.FactorPool:
    world = SyntheticWorld(POOL_CONFIG, cache_dir=cache, verbose=False)
    return synthetic_factors.FactorPool(world.config, world.factors(), world.cache_dir, POOL)


def _cached_pool(cache: Path, monkeypatch) -> synthetic_factors.FactorPool:
    """The pool read back from its cache (drawing it again fails the test)."""
    def redraw(self):
        raise AssertionError("the pool was drawn again instead of read from its cache")
    with monkeypatch.context() as patch:
        patch.setattr(synthetic_factors.FactorPool, "_draw", redraw)
        return _pool(cache)


def test_factor_pool_cache_round_trips_exactly(tmp_path, monkeypatch):
    fresh = _pool(tmp_path)
    cached = _cached_pool(tmp_path, monkeypatch)
    assert cached.codes.dtype == fresh.codes.dtype and np.array_equal(cached.codes, fresh.codes)
    # repr: the same values, types (int stays int, float float, None None) and key order
    assert repr(cached.draws) == repr(fresh.draws)
    assert not list(fresh.cache_dir.glob("*.pkl"))


def test_factor_pool_never_reads_a_pickle(tmp_path, monkeypatch):
    """An older version's pickle cache, or one planted in a shared runs folder, is never read."""
    marker = tmp_path / "marker"
    cache = SyntheticWorld(POOL_CONFIG, cache_dir=tmp_path / "worlds", verbose=False).cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    for name in (f"factor-pool-v{synthetic_factors.FACTORS_VERSION}-{POOL}.pkl",
                 f"factor-pool-v{synthetic_factors.FACTORS_VERSION}-{POOL}-draws.pkl"):
        (cache / name).write_bytes(pickle.dumps((np.zeros(1), RunsCode(marker))))
    pool = _pool(tmp_path / "worlds")
    assert not marker.exists()
    assert pool.codes.shape == (10, POOL, len(pool.names))
    reference = _pool(tmp_path / "reference")
    assert repr(pool.draws) == repr(reference.draws)


def test_factor_pool_cache_that_does_not_match_is_drawn_again(tmp_path, monkeypatch):
    fresh = _pool(tmp_path)
    codes_file = next(fresh.cache_dir.glob("factor-pool-*-codes.npz"))
    np.savez(codes_file, codes=np.zeros_like(fresh.codes))  # not the codes the draws record
    again = _pool(tmp_path)
    assert np.array_equal(again.codes, fresh.codes) and repr(again.draws) == repr(fresh.draws)
    assert list(fresh.cache_dir.glob("*.corrupt"))
    _cached_pool(tmp_path, monkeypatch)  # written anew, and read from then on
