"""Training: seeded to the bit, resumable to the bit, external checkpoints, clear errors."""
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from counteraudit.train.architectures import build_model
from counteraudit.train.checkpoint import CHECKPOINT_NAME, METRICS_NAME, WEIGHTS_NAME
from counteraudit.train.core.recipe import Recipe
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import load_trained_model, train_model
from counteraudit.train.training_parts import warmup_lr
from counteraudit.train.worlds import build_world
from tests.conftest import write_suite

REPO = Path(__file__).resolve().parents[1]


def _weights(directory):
    return torch.load(Path(directory) / WEIGHTS_NAME)


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def suite_and_world(tiny_suite, runs):
    suite = load_suite(tiny_suite)
    return suite, build_world(suite.world, runs_root=runs)


@pytest.fixture(scope="module")
def trained_reference(tmp_path_factory) -> tuple[Path, dict]:
    """(folder, metrics) of the tiny suite's reference-00 (the spec the tests below train)
    trained once for this file, in a world of its own: the tests compare their trainings'
    weights with these instead of training the same model again. Copy it before changing it."""
    base = tmp_path_factory.mktemp("reference")
    suite = load_suite(write_suite(base / "tiny.toml"))
    world = build_world(suite.world, runs_root=base / "runs")
    metrics = train_model(suite.references[0], base / "reference-00", world=world, progress=False)
    return base / "reference-00", metrics


def test_same_seed_same_weights_different_seed_different(suite_and_world, trained_reference,
                                                         tmp_path):
    suite, world = suite_and_world
    spec = suite.references[0]
    trained, first = trained_reference
    train_model(spec, tmp_path / "b", world=world, progress=False)
    assert _same(_weights(trained), _weights(tmp_path / "b"))
    train_model(suite.references[1], tmp_path / "c", world=world, progress=False)
    assert not _same(_weights(trained), _weights(tmp_path / "c"))
    for key in ("val_accuracy", "train_seconds", "images_per_second", "history"):
        assert key in first
    assert len(first["history"]) == suite.recipe.epochs


def test_cpu_bf16_recipe_is_seeded_to_the_bit_and_is_its_own_model(suite_and_world, tmp_path):
    """recipe.cpu_bf16 (the demo's): bf16 autocast on the CPU, same seed same bits; a different
    recipe, so a different model key and other weights than fp32 training. One epoch each: a CPU
    without native bf16 emulates it, about 12 times slower than fp32."""
    suite, world = suite_and_world
    fp32 = suite.references[0]
    assert replace(fp32, recipe=replace(fp32.recipe, cpu_bf16=True)).key != fp32.key
    fp32 = replace(fp32, recipe=replace(fp32.recipe, epochs=1))
    bf16 = replace(fp32, recipe=replace(fp32.recipe, cpu_bf16=True))
    for folder, spec in (("a", bf16), ("b", bf16), ("fp32", fp32)):
        train_model(spec, tmp_path / folder, world=world, progress=False)
    assert _same(_weights(tmp_path / "a"), _weights(tmp_path / "b"))
    assert not _same(_weights(tmp_path / "a"), _weights(tmp_path / "fp32"))


def test_interrupted_run_resumes_to_the_same_bits(suite_and_world, trained_reference, tmp_path):
    suite, world = suite_and_world
    spec = suite.references[0]
    partial = train_model(spec, tmp_path / "resumed", world=world, progress=False, stop_after_epoch=1)
    assert partial == {"interrupted_after_epoch": 1}
    assert (tmp_path / "resumed" / CHECKPOINT_NAME).exists()
    assert not (tmp_path / "resumed" / METRICS_NAME).exists()
    state = torch.load(tmp_path / "resumed" / CHECKPOINT_NAME, weights_only=False)
    assert {"model", "optimizer", "scheduler", "epoch", "torch_rng"} <= set(state)
    resumed = train_model(spec, tmp_path / "resumed", world=world, progress=False)
    assert _same(_weights(trained_reference[0]), _weights(tmp_path / "resumed"))
    assert len(resumed["history"]) == suite.recipe.epochs


def test_lr_warmup_across_an_epoch_boundary_resumes_to_the_same_bits(suite_and_world,
                                                                     trained_reference, tmp_path):
    suite, world = suite_and_world
    base = suite.references[0]
    spec = replace(base, recipe=replace(base.recipe, lr_warmup_epochs=1.5))
    straight = train_model(spec, tmp_path / "straight", world=world, progress=False)
    train_model(spec, tmp_path / "resumed", world=world, progress=False, stop_after_epoch=1)
    train_model(spec, tmp_path / "resumed", world=world, progress=False)
    assert _same(_weights(tmp_path / "straight"), _weights(tmp_path / "resumed"))
    assert len(straight["history"]) == spec.recipe.epochs
    # base's recipe, no warmup: other weights
    assert not _same(_weights(tmp_path / "straight"), _weights(trained_reference[0]))


def test_warmup_ramps_the_step_schedule_from_the_step_number_alone():
    """lr/15, 2*lr/15, ... up to the step schedule's lr at step 15 (1.5 epochs of 10 steps), then
    the step schedule: the same value for a step however the run got there (resumed or not)."""
    recipe = Recipe(lr=0.3, lr_gamma=0.5, lr_step_epochs=2)
    assert warmup_lr(recipe, epoch=0, step=0, steps_per_epoch=10, warmup_steps=15) == pytest.approx(0.3 / 15)
    assert warmup_lr(recipe, epoch=0, step=9, steps_per_epoch=10, warmup_steps=15) == pytest.approx(0.3 * 10 / 15)
    assert warmup_lr(recipe, epoch=1, step=4, steps_per_epoch=10, warmup_steps=15) == 0.3
    assert warmup_lr(recipe, epoch=1, step=9, steps_per_epoch=10, warmup_steps=15) == 0.3
    assert warmup_lr(recipe, epoch=2, step=0, steps_per_epoch=10, warmup_steps=15) == 0.3 * 0.5
    # a warmup longer than the first decay ramps the decayed rate
    assert warmup_lr(recipe, epoch=2, step=0, steps_per_epoch=10, warmup_steps=42) == \
        pytest.approx(0.3 * 0.5 * 21 / 42)


def test_killed_process_resumes_from_its_last_checkpoint(tiny_suite, runs, trained_reference,
                                                         tmp_path):
    """A real interruption: the training process is killed after its first checkpoint."""
    script = ("from counteraudit.train.core.suite import load_suite\n"
              "from counteraudit.train.trainer import train_model\n"
              f"suite = load_suite({str(tiny_suite)!r})\n"
              f"train_model(suite.references[0], {str(tmp_path / 'killed')!r}, progress=False,"
              f" runs_root={str(runs)!r}, stop_after_epoch=1)\n"
              "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert result.returncode == -9
    suite = load_suite(tiny_suite)
    train_model(suite.references[0], tmp_path / "killed", progress=False, runs_root=runs)
    assert _same(_weights(tmp_path / "killed"), _weights(trained_reference[0]))


def test_rerun_does_no_work(suite_and_world, trained_reference, tmp_path):
    suite, world = suite_and_world
    spec = suite.references[0]
    shutil.copytree(trained_reference[0], tmp_path / "m")  # a finished training of spec
    stamp = (tmp_path / "m" / WEIGHTS_NAME).stat().st_mtime_ns
    train_model(spec, tmp_path / "m", world=world, progress=False)
    assert (tmp_path / "m" / WEIGHTS_NAME).stat().st_mtime_ns == stamp


@pytest.mark.parametrize("prefix", ["", "module.", "model.", "module.model."])
def test_external_checkpoint_in_any_common_layout(suite_and_world, trained_reference, tmp_path,
                                                  prefix):
    suite, world = suite_and_world
    spec = suite.references[0]
    weights = _weights(trained_reference[0])
    path = tmp_path / "external.pth"
    torch.save({"state_dict": {prefix + k: v for k, v in weights.items()}, "epoch": 3}, path)
    external = replace(spec, name="external", checkpoint=str(path))
    metrics = train_model(external, tmp_path / "ext", world=world, progress=False)
    assert metrics["source"] == "external"
    assert _same(_weights(tmp_path / "ext"), weights)
    model = load_trained_model(tmp_path / "ext", external, world)
    assert model(world.split("val").load([0, 1])).shape == (2, world.num_classes)


def test_external_checkpoint_with_wrong_class_count(suite_and_world, tmp_path):
    suite, world = suite_and_world
    other = build_model("small_resnet", 7, world.mean, world.std)
    torch.save(other.backbone.state_dict(), tmp_path / "seven.pth")
    spec = replace(suite.references[0], checkpoint=str(tmp_path / "seven.pth"))
    with pytest.raises(ValueError, match="7 outputs .fc.weight. but this suite.s model has 10"):
        train_model(spec, tmp_path / "x", world=world, progress=False)
    spec = replace(suite.references[0], checkpoint=str(tmp_path / "absent.pth"))
    with pytest.raises(FileNotFoundError, match="absent.pth"):
        train_model(spec, tmp_path / "y", world=world, progress=False)
