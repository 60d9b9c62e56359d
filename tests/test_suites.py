"""Suites and registries: the shipped suites parse, bad names list the valid ones."""
import subprocess

import pytest
import torch

from counteraudit.explain.settings import method_specs
from counteraudit.train.architectures import ARCHITECTURES, build_model, layer_name, resolve_layer
from counteraudit.train.core.suite import load_suite
from counteraudit.evaluate.pipeline import load_checked_suite
from counteraudit.train.core.suite_files import available_suites
from counteraudit.train.train import get_args_parser, main
from tests.conftest import command_in_process, run_in_process, without_imagenet, write_suite


def test_shipped_suites():
    assert {"demo", "demo-full", "paper", "quick"} <= set(available_suites())
    demo = load_suite("demo")
    assert demo.world["name"] == "synthetic" and len(demo.references) >= 5
    paper = load_suite("paper")
    assert paper.world["name"] == "imagenet" and paper.architecture == "resnet50"
    assert len(paper.references) == 12
    assert (paper.recipe.epochs, paper.recipe.batch_size, paper.recipe.lr, paper.recipe.momentum,
            paper.recipe.weight_decay, paper.recipe.lr_step_epochs) == (90, 300, 0.1, 0.9, 1e-4, 30)
    keys = {spec.key for spec in paper.models}
    assert len(keys) == len(paper.models), "every model has its own artifact folder"



@pytest.mark.parametrize("name", available_suites())
def test_every_shipped_suites_method_tables_build(name):
    """Each shipped suite's [methods.*] tables are valid (params, choices, renderers): a typo in
    one would otherwise surface only in a user's run."""
    suite = load_checked_suite(name)  # every plug-in table built, as an entry script does
    assert set(method_specs(suite)) == set(suite.explain.methods or method_specs(suite))

def test_demo_full_is_the_demo_at_the_papers_counts():
    demo, full = load_suite("demo"), load_suite("demo-full")
    assert full.name == "demo-full" and len(full.references) == 12
    assert full.evaluate.model_dump(exclude_unset=True) == {"detection_images": 50, "localization_images": 40,
                                       "distance": "l2"}  # the demo's distance, inherited
    # Everything else is the demo's: the same models (same artifact keys) and method settings.
    assert [s.key for s in full.models[:5]] == [s.key for s in demo.references]
    assert [s.key for s in full.anomalies] == [s.key for s in demo.anomalies]
    assert full.method_tables == demo.method_tables
    assert full.explain.model_dump(exclude_unset=True) == demo.explain.model_dump(exclude_unset=True)


def test_extends_merges_tables_replaces_arrays_and_refuses_cycles(tmp_path):
    base = write_suite(tmp_path / "base.toml", body="[[anomalies]]\nname='b'\nfamily='backdoor'\n"
                       "[evaluate]\ndetection_images = 8\nlocalization_images = 4\n")
    child = tmp_path / "sub" / "child.toml"
    child.parent.mkdir()
    child.write_text('extends = "../base.toml"\n[evaluate]\nlocalization_images = 6\n'
                     '[[anomalies]]\nname = "s"\nfamily = "spurious"\n')
    parent, suite = load_suite(base), load_suite(child)
    assert suite.name == "child", "the name is never inherited"
    assert suite.evaluate.model_dump(exclude_unset=True) == {"detection_images": 8, "localization_images": 6}
    assert [s.name for s in suite.anomalies] == ["s"], "an array replaces the base's"
    assert suite.world == parent.world and suite.recipe == parent.recipe
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ValueError, match="extend each other in a cycle"):
        load_suite(tmp_path / "a.toml")
    (tmp_path / "lost.toml").write_text('extends = "demoo"\n')
    with pytest.raises(ValueError, match="unknown suite 'demoo'.*shipped suites: .*demo"):
        load_suite(tmp_path / "lost.toml")


def test_an_anomalys_default_seed_follows_its_name_not_its_position(tmp_path):
    one = "[[anomalies]]\nname='b'\nfamily='backdoor'\n"
    two = "[[anomalies]]\nname='s'\nfamily='spurious'\n" + one
    first = load_suite(write_suite(tmp_path / "one.toml", body=one)).model("b")
    second = load_suite(write_suite(tmp_path / "two.toml", body=two)).model("b")
    assert first.seed == second.seed and first.key == second.key, \
        "inserting an entry before a model must not retrain it"


def test_unknown_names_list_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="shipped suites: .*demo"):
        load_suite("demoo")
    with pytest.raises(ValueError, match="its models are: reference-00"):
        load_suite("demo").model("reference-99")
    bad = write_suite(tmp_path / "bad.toml", architecture="resnet5")
    with pytest.raises(ValueError, match="valid architecture names: resnet50, small_resnet"):
        load_suite(bad)
    typo = write_suite(tmp_path / "typo.toml", body="[[anomalies]]\nname='x'\nfamily='backdor'\n")
    with pytest.raises(ValueError, match=r"unknown anomaly family 'backdor' \(did you mean 'backdoor'\?\); "
                                         "valid anomaly family names"):
        load_suite(typo)


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
    result = command_in_process("train/train.py", "--suite", "demo", "--model", "nobody",
                                "--runs-dir", tmp_path)
    assert result.returncode == 2
    assert "error: suite 'demo' has no model 'nobody'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_paper_suite_dry_run_on_slurm_lists_the_36_trainings_with_the_papers_recipe(tmp_path,
                                                                                   monkeypatch):
    """`train.py --suite paper --executor slurm --dry-run` without ImageNet: the 36 training jobs
    (12 references + 24 anomalies), the recipe and the resources, and nothing submitted. The
    local test cluster has no GPUs: the plan is still printed, with the error a real run gives.
    The suite asks for one GPU per model; --gpus-per-node 8 shows the DDP plan of a multi-GPU run."""
    without_imagenet(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    out = run_in_process("train/train.py", "--suite", "paper", "--executor", "slurm",
                         "--partition", "debug", "--dry-run", "--gpus-per-node", "8",
                         "--mem-gb", "400", "--runs-dir", runs)
    paper = load_suite("paper")
    listed = out.split("\n  items:\n", 1)[1].split("\n  nothing was run")[0].split()
    assert len(listed) == 36 and set(listed) == {spec.name for spec in paper.models}
    assert "36 models to train (12 references, 24 anomalies)" in out
    assert "would submit 1 Slurm job array of 36 jobs" in out
    assert ("recipe: SGD, 90 epochs, batch 300, lr 0.1 x0.1 every 30 epochs, momentum 0.9, "
            "weight decay 0.0001") in out
    assert ("own recipe (batch_size 512): adversarial-l2-0.01, adversarial-l2-0.1, adversarial-l2-1, "
            "adversarial-l2-5") in out
    assert "1 node(s) x 8 task(s) = 8 process(es), 8 GPU(s) per node; DistributedDataParallel" in out
    assert "partition=debug nodes=1 tasks_per_node=8 gpus_per_node=8 cpus_per_task=10 mem=400GB" in out
    assert "WARNING: without --dry-run this would fail: --gpus-per-node 8" in out  # a CPU-only cluster
    assert not runs.exists()  # no logs, no checkpoints, no world
    queued = subprocess.run(["squeue", "-h", "--states=all", "-o", "%o"], capture_output=True,
                            text=True, check=True).stdout
    assert str(tmp_path) not in queued


def test_paper_suite_local_dry_run_prints_the_plan_even_without_the_gpus_it_asks_for(tmp_path, capsys,
                                                                                    monkeypatch):
    """A dry run only prints: on a machine without the GPU the suite asks for it shows the plan
    and, under it, the error a real run would give, instead of failing."""
    monkeypatch.delenv("IMAGENET_ROOT", raising=False)
    args = get_args_parser().parse_args(["--suite", "paper", "--dry-run", "--runs-dir", str(tmp_path)])
    assert main(args) == []
    out = capsys.readouterr().out
    assert "36 models to train (12 references, 24 anomalies)" in out
    assert "would run 36 items locally" in out
    if not torch.cuda.is_available():
        assert "WARNING: without --dry-run this would fail: --gpus-per-node 1 asks for GPUs" in out
    assert list(tmp_path.iterdir()) == []
