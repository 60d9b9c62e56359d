"""Suites and registries: the shipped suites parse, bad names list the valid ones."""
import subprocess
import sys
from pathlib import Path

import pytest

from train.architectures import ARCHITECTURES, layer_name, resolve_layer, build_model
from train.registry import Registry
from train.suite import available_suites, load_suite
from tests.conftest import write_suite

REPO = Path(__file__).resolve().parents[1]


def test_shipped_suites():
    assert {"demo", "paper", "quick"} <= set(available_suites())
    demo = load_suite("demo")
    assert demo.world["name"] == "synthetic" and len(demo.references) >= 5
    paper = load_suite("paper")
    assert paper.world["name"] == "imagenet" and paper.architecture == "resnet50"
    assert len(paper.references) == 12
    assert (paper.recipe.epochs, paper.recipe.batch_size, paper.recipe.lr, paper.recipe.momentum,
            paper.recipe.weight_decay, paper.recipe.lr_step_epochs) == (90, 300, 0.1, 0.9, 1e-4, 30)
    keys = {spec.key for spec in paper.models}
    assert len(keys) == len(paper.models), "every model has its own artifact folder"


def test_unknown_names_list_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="shipped suites: .*demo"):
        load_suite("demoo")
    with pytest.raises(ValueError, match="its models are: reference-00"):
        load_suite("demo").model("reference-99")
    bad = write_suite(tmp_path / "bad.toml", architecture="resnet5")
    with pytest.raises(ValueError, match="valid architecture names: resnet50, small_resnet"):
        load_suite(bad)
    typo = write_suite(tmp_path / "typo.toml", body="[[anomalies]]\nname='x'\nfamily='backdor'\n")
    with pytest.raises(ValueError, match="unknown anomaly family 'backdor'; valid anomaly family names"):
        load_suite(typo)


def test_registry_refuses_duplicates():
    registry = Registry("thing")
    registry.register("a")(object)
    with pytest.raises(ValueError, match="'a' is already registered"):
        registry.register("a")(int)


def test_layer_addressing_matches_torchvision_names():
    assert layer_name("(2,2,1)") == "layer2.2.conv1"
    assert layer_name("(3,3)") == "layer3.3"
    assert layer_name((4, 2, 3)) == "layer4.2.conv3"
    for name in ARCHITECTURES:
        arch = ARCHITECTURES.get(name)
        model = build_model(name, 10, (0.5,) * 3, (0.25,) * 3)
        for address in (*arch.caricature_layers, arch.gradcam_layer, arch.guided_gradcam_layer):
            resolve_layer(model, address)
    with pytest.raises(ValueError, match="not in this model"):
        resolve_layer(build_model("small_resnet", 10, (0.5,) * 3, (0.25,) * 3), "(3,9,1)")


def test_train_script_errors_are_one_clear_line(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "train" / "train.py"), "--suite", "demo",
                             "--model", "nobody", "--runs-dir", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "error: suite 'demo' has no model 'nobody'" in result.stderr
    assert "Traceback" not in result.stderr
