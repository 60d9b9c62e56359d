"""The attack of adversarial training runs under the training's autocast (bf16 on a CPU when the
recipe sets cpu_bf16, as on CUDA), and the bf16 attack is as strong as the fp32 one."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from counteraudit.anomalies import FAMILIES
from counteraudit.evaluate.benchmarks.attack import attack, get_args_parser, main
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import train_model
from counteraudit.train.training_parts import new_model
from counteraudit.train.worlds import build_world
from tests.conftest import write_suite

pytestmark = pytest.mark.timeout(300)

WORLD = {"name": "synthetic", "seed": 3, "image_size": 32, "num_train": 192, "num_val": 100}
ADVERSARIAL = """
[[anomalies]]
name = "adversarial"
family = "adversarial"
params = { eps = 0.0314, steps = 2, eval_steps = 4, eval_images = 100 }
"""


def _conv_output_dtypes(run) -> list[torch.dtype]:
    """The dtype of every convolution's output while ``run()`` runs (any model)."""
    dtypes = []

    def record(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            dtypes.append(output.dtype)
    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        run()
    finally:
        handle.remove()
    return dtypes


def test_pgd_passes_of_adversarial_training_run_in_bf16_when_the_recipe_does(tmp_path):
    suite = load_suite(write_suite(tmp_path / "adv.toml", body=ADVERSARIAL, references=2, epochs=1,
                                   world=WORLD))
    spec = suite.model("adversarial")
    spec = replace(spec, recipe=replace(spec.recipe, cpu_bf16=True))
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in new_model(spec, _world(tmp_path)).modules())
    dtypes = _conv_output_dtypes(lambda: train_model(spec, model_dir(tmp_path / "runs", spec),
                                                     progress=False, runs_root=tmp_path / "runs",
                                                     world=_world(tmp_path)))
    steps = 192 // 64
    # every step: 2 PGD passes and the training pass, each through every convolution, in bf16
    # (the attack outside the autocast would leave 2/3 of them in float32); then the fp32 eval
    assert dtypes.count(torch.bfloat16) == steps * (2 + 1) * convs
    assert set(dtypes[steps * 3 * convs:]) == {torch.float32}


def _world(tmp_path):
    return build_world(WORLD, runs_root=tmp_path / "runs")


def test_bf16_attack_raises_the_loss_as_much_as_fp32(tmp_path):
    """The attack in bf16 autocast raises the model's (fp32) loss as much as the fp32 attack, with
    the same eps, steps and random start. (Accuracy on a trained demo model: train/README.md's figures
    from evaluate/benchmarks/attack.py; a model trained in a test's seconds is too near chance.)"""
    world = _world(tmp_path)
    suite = load_suite(write_suite(tmp_path / "att.toml", body=ADVERSARIAL, references=2, world=WORLD))
    spec = suite.model("adversarial")
    family = FAMILIES.get("adversarial")(spec.params, world, spec.seed)
    model = new_model(spec, world).eval()
    val = world.split("val")
    images, labels = val.load(range(40)), torch.as_tensor(val.labels[:40])

    def loss(x):
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(model(x), labels))
    clean = loss(images)
    for steps in (2, 4):
        fp32 = loss(attack(model, family, images, labels, steps, bf16=False))
        bf16 = loss(attack(model, family, images, labels, steps, bf16=True))
        print(f"{steps} steps: loss clean {clean:.4f}, fp32 attack {fp32:.4f}, bf16 attack {bf16:.4f}")
        assert fp32 > clean and bf16 - clean >= 0.9 * (fp32 - clean)


def test_benchmark_script_refuses_a_suite_without_an_adversarial_model(tmp_path):
    path = write_suite(tmp_path / "plain.toml", references=2, world=WORLD)
    args = get_args_parser().parse_args(["--suite", str(path), "--runs-dir", str(tmp_path / "r"),
                                         "--model", "reference-00"])
    with pytest.raises(ValueError, match="no adversarial model"):
        main(args)
