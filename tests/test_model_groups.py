"""Explaining k models in grouped passes (explain/model_groups.py, [explain] model_group): every
method that allows it gives each model its solo attributions up to float rounding and the same
rendered images; a member's bits do not depend on its companions or its place; the explain stage
keys grouped results apart, joins models into groups, stores each model's result, and gives a
chunked run, a Slurm run and two runs at once the bits of one local run."""
from __future__ import annotations

import json
import re
import shutil
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch

import counteraudit.train.core.stage as stage_skeleton
from counteraudit.explain.base import METHODS, build_method
from counteraudit.explain.model_groups import MODEL_GROUP, grouping_problem, run_models
from counteraudit.explain.method_choice import run_methods
from counteraudit.explain.run import explain_overrides, get_args_parser
from counteraudit.explain.settings import method_specs
from counteraudit.evaluate.pipeline import scoring_suite
from counteraudit.evaluate.pipeline_options import pipeline_parser
from counteraudit.explain.stage import (explain_suite, load_image_sets, result_dir, result_lock,
                                        sets_for, stage_description, stored_result_dir)
from counteraudit.explain.store import ARRAYS_FILE, PARAMS_FILE, result_key
from counteraudit.train.architectures import build_model
from counteraudit.train.core.stage import run_options
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from tests.conftest import REPO, trained_suite, write_suite
from tests.test_concurrent_runs import finish, start, wait_until_all_say

GROUPED = [name for name in METHODS.names() if METHODS.get(name).groups_models]
CLASSES, SIDE = 10, 32
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


def models(count: int, output_classes=None) -> list[torch.nn.Module]:
    """Small ResNets of distinct random weights, BatchNorm statistics included."""
    made = []
    for seed in range(count):
        torch.manual_seed(seed)
        model = build_model("small_resnet", CLASSES, MEAN, STD, output_classes)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)
        made.append(model.eval())
    return made


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand(5, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(3))


def test_the_methods_that_group_models_are_the_gradient_methods():
    assert set(GROUPED) == {"guided_backprop", "integrated_gradients", "saliency",
                            "input_x_gradient", "deconvolution"}


@pytest.mark.parametrize("name, params", [
    *[(name, {}) for name in GROUPED],
    ("integrated_gradients", {"gradient_space": "normalized", "baseline": "normalized_zero",
                              "n_steps": 6}),
    ("guided_backprop", {"gradient_space": "normalized"})])
def test_a_grouped_pass_gives_each_model_its_solo_explanation(name, params, images):
    """Three models in groups of 4 (the group filled up with a copy): each model's targets are
    its own, its attributions its solo ones to float rounding, its rendered images the same;
    and its bits are the same with other companions, at another place in the group."""
    params = {"n_steps": 6, **params} if name == "integrated_gradients" else params
    method = build_method(name, params)
    trio = models(3)
    solo = [method.run(model, images, batch_size=2) for model in trio]
    grouped = run_models(method, trio, images, group_size=4, batch_size=2)
    for alone, together in zip(solo, grouped):
        assert np.array_equal(alone.targets, together.targets)
        scale = np.abs(alone.raw).max()
        assert scale > 0
        assert np.abs(alone.raw - together.raw).max() <= 1e-5 * scale
        levels = np.abs(alone.images.astype(int) - together.images.astype(int))
        assert levels.max() <= 1 and (levels > 0).mean() < 1e-3
        assert together.params == {**alone.params, MODEL_GROUP: 4}
    reordered = run_models(method, [trio[2], models(4)[3], trio[0]], images, group_size=4,
                           batch_size=2)
    assert np.array_equal(reordered[0].raw, grouped[2].raw)
    assert np.array_equal(reordered[2].raw, grouped[0].raw)
    assert np.array_equal(reordered[0].images, grouped[2].images)


def test_grouping_needs_a_method_that_allows_it_and_models_that_can_share_a_network(images):
    gradcam = build_method("gradcam")
    with pytest.raises(ValueError, match="cannot explain models in groups"):
        run_models(gradcam, models(2), images, group_size=2)
    method = build_method("saliency")
    missing = models(1, output_classes=range(1, CLASSES))
    assert grouping_problem(models(2)) is None
    assert "output classes" in grouping_problem(models(1) + missing)
    with pytest.raises(ValueError, match="output classes"):
        run_models(method, models(1) + missing, images, group_size=2)
    with pytest.raises(ValueError, match="3 models for groups of 2"):
        run_models(method, models(3), images, group_size=2)
    # models without some output classes group among themselves, each as it is alone
    twins = [missing[0], models(2, output_classes=range(1, CLASSES))[1]]
    grouped = run_models(method, twins, images, group_size=2)
    for model, together in zip(twins, grouped):
        alone = method.run(model, images)
        assert np.array_equal(alone.targets, together.targets)
        assert np.abs(alone.raw - together.raw).max() <= 1e-5 * np.abs(alone.raw).max()


# ------------------------------------------------------------------ the explain stage
BODY = """
[explain]
methods = ["guided_backprop", "integrated_gradients", "gradcam"]
batch_sizes = { guided_backprop = 3, integrated_gradients = 3 }
model_group = 2

[methods.integrated_gradients]
n_steps = 4

[evaluate]
detection_images = 8
localization_images = 4
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """3 tiny references, trained, with their image sets: (suite file with model_group = 2,
    runs root)."""
    base = tmp_path_factory.mktemp("groups")
    return trained_suite(write_suite(base / "groups.toml", body=BODY, references=3, epochs=1),
                         base / "trained")


def explain(suite_path: Path, runs: Path, *options, models=None) -> dict:
    args = get_args_parser().parse_args(["--suite", str(suite_path), "--runs-dir", str(runs),
                                         "--no-progress", "--jobs", "1", *map(str, options)])
    suite = explain_overrides(load_suite(suite_path), args)
    methods = method_specs(suite, run_methods(args.method, not args.no_control)) if args.method else None
    return explain_suite(suite, run_options(args), methods=methods, models=models)


def submitted_items(monkeypatch) -> list[str]:
    names: list[str] = []
    real = stage_skeleton.run_items

    def recording(fn, items, config, stage_name, *, item_name, **options):
        names.extend(item_name(item) for item in items)
        return real(fn, items, config, stage_name, item_name=item_name, **options)
    monkeypatch.setattr(stage_skeleton, "run_items", recording)
    return names


def stored(suite_path: Path, runs: Path, method: str, model: str) -> tuple[dict, dict]:
    """(params.json, arrays) of a model's stored result on each of its image sets."""
    suite = load_suite(suite_path)
    params, arrays = {}, {}
    for set_name in sets_for(suite, suite.model(model)):
        folder = result_dir(suite.root(runs), method, model, set_name)
        params[set_name] = json.loads((folder / PARAMS_FILE).read_text())
        with np.load(folder / ARRAYS_FILE) as loaded:
            arrays[set_name] = {key: loaded[key] for key in loaded.files}
    return params, arrays


def assert_same_arrays(suite_path: Path, want: Path, got: Path, method: str, models) -> None:
    """Each model's stored arrays of ``method`` in runs folder ``got`` are ``want``'s, bit for bit."""
    for model in models:
        wanted, found = stored(suite_path, want, method, model)[1], stored(suite_path, got, method, model)[1]
        for set_name, arrays in wanted.items():
            for name, array in arrays.items():
                assert np.array_equal(found[set_name][name], array), (model, set_name, name)


@pytest.fixture(scope="module")
def grouped_run(trained, tmp_path_factory) -> Path:
    suite_path, runs = trained
    runs = Path(shutil.copytree(runs, tmp_path_factory.mktemp("grouped") / "runs", symlinks=True))
    done = explain(suite_path, runs)
    assert (done["computed"], done["stored"]) == (9, 0)
    assert done["explained_images"] == 9 * 8
    return runs


def test_the_stage_explains_models_in_groups_and_keys_their_results_apart(trained, grouped_run,
                                                                          tmp_path, monkeypatch):
    suite_path, _ = trained
    solo_suite = write_suite(tmp_path / "groups.toml", body=BODY.replace("model_group = 2", ""),
                             references=3, epochs=1)
    runs = Path(shutil.copytree(grouped_run, tmp_path / "runs", symlinks=True))
    names = submitted_items(monkeypatch)
    done = explain(solo_suite, runs)
    # gradcam's results are shared (it runs alone either way); the two gradient methods' are
    # keyed by their model group, so the solo suite computes its own, and keeps the grouped ones
    assert (done["computed"], done["stored"]) == (6, 3)
    assert sorted(names) == sorted(f"reference-0{i}/{method}" for i in range(3)
                                   for method in ("guided_backprop", "integrated_gradients"))
    for method in ("guided_backprop", "integrated_gradients", "gradcam"):
        for model in ("reference-00", "reference-01", "reference-02"):
            params, arrays = stored(suite_path, grouped_run, method, model)
            solo_params, solo_arrays = stored(solo_suite, runs, method, model)
            for set_name in params:
                group = params[set_name]["key"].get(MODEL_GROUP)
                assert group == (None if method == "gradcam" else 2)
                assert MODEL_GROUP not in solo_params[set_name]["key"]
                assert np.array_equal(arrays[set_name]["targets"], solo_arrays[set_name]["targets"])
                assert np.array_equal(arrays[set_name]["images"], solo_arrays[set_name]["images"])
                raw, solo_raw = arrays[set_name].get("raw"), solo_arrays[set_name].get("raw")
                if method != "gradcam":  # stored as float16: equal to its rounding
                    assert np.abs(raw.astype(np.float32) - solo_raw).max() \
                        <= 1e-3 * np.abs(solo_raw).max()
    # the grouped results are still stored: the grouped suite computes nothing
    again = explain(suite_path, runs)
    assert (again["computed"], again["stored"]) == (0, 9)


def test_grouped_items_join_models_and_a_model_alone_gets_its_bits_in_any_group(
        trained, grouped_run, tmp_path, monkeypatch):
    suite_path, runs = trained
    names = submitted_items(monkeypatch)
    alone = Path(shutil.copytree(runs, tmp_path / "alone", symlinks=True))
    done = explain(suite_path, alone, models=["reference-01"])
    assert (done["computed"], done["stored"]) == (3, 0)
    assert sorted(names) == ["reference-01/gradcam", "reference-01/guided_backprop",
                             "reference-01/integrated_gradients"]
    names.clear()
    chunked = Path(shutil.copytree(runs, tmp_path / "chunked", symlinks=True))
    done = explain(suite_path, chunked, "--chunk-images", 3)
    assert done["computed"] == 9
    assert "reference-00+1/guided_backprop/detection/0-3" in names
    assert "reference-02/guided_backprop/detection/6-8" in names
    assert not any(name.startswith("reference-00+1/gradcam") for name in names)
    for method in ("guided_backprop", "integrated_gradients", "gradcam"):
        for model in ("reference-00", "reference-01", "reference-02"):
            params, arrays = stored(suite_path, grouped_run, method, model)
            for other in [chunked] + ([alone] if model == "reference-01" else []):
                other_params, other_arrays = stored(suite_path, other, method, model)
                for set_name in params:
                    assert other_params[set_name]["key"] == params[set_name]["key"]
                    for name, array in arrays[set_name].items():
                        assert np.array_equal(other_arrays[set_name][name], array), (other, name)


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_grouped_chunked_items_on_slurm_store_the_local_runs_bits(trained, grouped_run, tmp_path,
                                                                  monkeypatch):
    """Each part of an image set is one grouped item of both models, run as a Slurm array task;
    the gathered results are the unchunked local run's bits."""
    suite_path, runs = trained
    runs = Path(shutil.copytree(runs, tmp_path / "runs", symlinks=True))
    names = submitted_items(monkeypatch)
    done = explain(suite_path, runs, "--executor", "slurm", "--cpus-per-task", 1, "--time", 10,
                   "--log-dir", tmp_path / "logs", "--method", "guided_backprop", "--no-control",
                   "--chunk-images", 4, models=["reference-00", "reference-01"])
    assert done["computed"] == 2
    # parts are whole batches (3 images): 4 becomes 6
    assert sorted(names) == ["reference-00+1/guided_backprop/detection/0-6",
                             "reference-00+1/guided_backprop/detection/6-8"]
    assert_same_arrays(suite_path, grouped_run, runs, "guided_backprop",
                       ("reference-00", "reference-01"))


def test_two_grouped_runs_at_once_over_overlapping_groups_explain_each_model_once(
        trained, grouped_run, tmp_path):
    """Run A groups reference-00 with -01 (then -02 alone), run B -01 with -02; both start while
    every result's lock is held, so both wait; then each result is computed once, by one of them,
    with the bits it has in any group."""
    suite_path, runs = trained
    runs = Path(shutil.copytree(runs, tmp_path / "runs", symlinks=True))
    suite = load_suite(suite_path)
    models = ("reference-00", "reference-01", "reference-02")
    method, image_sets = method_specs(suite)["guided_backprop"], load_image_sets(suite, runs)
    description = stage_description(suite, method.build(), "small_resnet", method.batch_size)
    folders = [stored_result_dir(runs, result_key(description, suite.model(model).key,
                                                  image_sets[set_name].id))
               for model in models for set_name in sets_for(suite, suite.model(model))]
    common = (REPO / "explain/run.py", "--suite", suite_path, "--runs-dir", runs, "--no-progress",
              "--jobs", "1", "--method", "guided_backprop", "--no-control")
    logs = [tmp_path / f"run-{n}.log" for n in range(2)]
    with ExitStack() as held:
        for folder in folders:
            held.enter_context(result_lock(folder, "a test's"))
        processes = [start(logs[0], *common),
                     start(logs[1], *common, "--model", "reference-01", "--model", "reference-02")]
        wait_until_all_say(processes, logs, "another process is explaining")
    both = finish(processes, logs)
    computed = [int(n) for n in re.findall(r": (\d+) visualization set\(s\) computed", both)]
    assert len(computed) == 2 and sum(computed) == len(folders), both
    print(f"visualization sets computed by each run: {computed}")
    assert_same_arrays(suite_path, grouped_run, runs, "guided_backprop", models)


def test_a_grouped_suite_with_more_images_explains_only_the_images_it_adds(trained, grouped_run,
                                                                            tmp_path):
    """m = 8 explained in groups, then m = 11: each model takes the stored rows of its first full
    batches and the group explains the rest, bit for bit as m = 11 from scratch."""
    longer = write_suite(tmp_path / "groups.toml",
                         body=BODY.replace("detection_images = 8", "detection_images = 11"),
                         references=3, epochs=1)
    scratch = Path(shutil.copytree(trained[1], tmp_path / "scratch", symlinks=True))
    assert explain(longer, scratch)["reused_images"] == 0
    runs = Path(shutil.copytree(grouped_run, tmp_path / "runs", symlinks=True))
    done = explain(longer, runs)
    # guided backprop and integrated gradients (batches of 3) take rows 0-6 of m = 8
    assert done["reused_images"] == 3 * (6 + 6)
    for method in ("guided_backprop", "integrated_gradients", "gradcam"):
        for model in ("reference-00", "reference-01", "reference-02"):
            params, arrays = stored(longer, scratch, method, model)
            other_params, other_arrays = stored(longer, runs, method, model)
            for set_name in params:
                assert other_params[set_name]["key"] == params[set_name]["key"]
                for name, array in arrays[set_name].items():
                    assert np.array_equal(other_arrays[set_name][name], array), (method, name)


def test_a_model_group_out_of_bounds_is_refused_when_the_suite_is_read(tmp_path):
    path = write_suite(tmp_path / "zero.toml", body=BODY.replace("model_group = 2", "model_group = 0"))
    with pytest.raises(SuiteFileError, match="model_group"):
        load_suite(path)


@pytest.mark.parametrize("parse", ["explain", "detect"])
def test_model_group_from_the_command_line_over_the_suite(tmp_path, parse):
    path = write_suite(tmp_path / "groups.toml", body=BODY)

    def group(*argv) -> int:
        if parse == "explain":
            args = get_args_parser().parse_args(["--suite", str(path), *argv])
            return explain_overrides(load_suite(path), args).explain.model_group
        args = pipeline_parser("detect").parse_args(["--suite", str(path), *argv])
        return scoring_suite(args.suite, model_group=args.model_group).explain.model_group
    assert group() == 2 and group("--model-group", "4") == 4
    with pytest.raises(SuiteFileError, match=r"model_group \(from --model-group\)"):
        group("--model-group", "0")
