"""The explain stage split into (model, method, image set, image range) items: the gathered parts
are bit for bit what an unchunked run stores, a rerun after a partial failure submits only the
missing part, and on the local Slurm cluster chunked explanations and the score stage give the
local results."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import counteraudit.explain.stage as explain_pipeline
import counteraudit.train.core.stage as stage_skeleton
from counteraudit.anomalies.image_sets import detection_set
from counteraudit.evaluate.pipeline_options import pipeline_parser
from counteraudit.evaluate.scoring.distances import build_distance
from counteraudit.evaluate.scoring.stage import SCORES, detection_scores
from counteraudit.explain.base import build_method
from counteraudit.explain.run import get_args_parser
from counteraudit.explain.stage import (chunk_images, explain_suite, image_ranges, load_results, part_size,
                                        result_dir, sets_for)
from counteraudit.evaluate.scoring.explain_time import explain_time_table
from counteraudit.explain.store import ARRAYS_FILE, PARAMS_FILE, PARTS_DIR, TIMING
from counteraudit.slurm.errors import ItemsFailedError
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import load_trained_model
from counteraudit.train.worlds import build_world
from counteraudit.explain.run import explain_overrides
from counteraudit.explain.settings import method_specs, suite_method
from counteraudit.train.core.stage import run_options
from counteraudit.train.core.suite_schema import SuiteFileError
from tests.conftest import trained_suite, write_suite

METHODS = ["guided_backprop", "caricature"]
# 8 detection images; guided backprop in batches of 3, Caricatures (whose results depend on which
# images share a batch) in batches of 2, with 2 steps on 2 layers: seconds on a CPU.
BODY = """
[explain]
methods = ["guided_backprop", "caricature"]
batch_sizes = { guided_backprop = 3, caricature = 2 }

[methods.caricature]
steps = 2
layers = ["(2,1,1)", "(3,1)"]

[evaluate]
detection_images = 8
localization_images = 4
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A suite of 3 tiny references, trained, with its image sets: (suite file, runs root)."""
    base = tmp_path_factory.mktemp("chunks")
    return trained_suite(write_suite(base / "chunks.toml", body=BODY, references=3, epochs=1),
                         base / "trained")


def copy_of(trained_runs: Path, destination: Path) -> Path:
    shutil.copytree(trained_runs, destination)
    return destination


def explain(suite_path: Path, runs: Path, *options, methods=None, models=None) -> dict:
    args = get_args_parser().parse_args(["--suite", str(suite_path), "--runs-dir", str(runs),
                                         "--no-progress", "--jobs", "1", *map(str, options)])
    suite = explain_overrides(load_suite(suite_path), args)  # as explain/run.py merges --chunk-images
    return explain_suite(suite, run_options(args), methods=method_specs(suite, methods) if methods else None,
                         models=models)


@pytest.fixture(scope="module")
def unchunked(trained, tmp_path_factory) -> Path:
    """The runs root of an ordinary (unchunked) explain run of both methods."""
    suite_path, runs = trained
    runs = copy_of(runs, tmp_path_factory.mktemp("unchunked") / "runs")
    done = explain(suite_path, runs)
    assert sets(done) == {"computed": 6, "stored": 0, "parts": 0}
    assert done["explained_images"] == 6 * 8 and done["reused_images"] == 0
    return runs


def test_each_result_records_what_computing_it_cost(trained, unchunked):
    """The explain-time table sums every result's recorded cost: each model's 8 images, wall and
    CPU seconds; results stored without a timing (an older version's) are counted apart."""
    suite = load_suite(trained[0])
    times = explain_time_table(suite, METHODS, unchunked).set_index("method")
    assert times["images"].to_dict() == {"guided_backprop": 3 * 8, "caricature": 3 * 8}
    assert (times["results"] == 3).all() and (times["timed_results"] == 3).all()
    assert (times["seconds"] > 0).all() and (times["cpu_seconds"] > 0).all()
    # each method's row sums its own results' recorded costs (a timing, not a speed: no ordering
    # of the methods is asserted, which the machine's load would decide)
    for method in METHODS:
        recorded = [json.loads(path.read_text())[TIMING]
                    for path in (unchunked / "store" / "visualizations" / method).glob(f"*/{PARAMS_FILE}")]
        assert len(recorded) == 3
        assert times.loc[method, "cpu_seconds"] == pytest.approx(sum(t["cpu_seconds"] for t in recorded))
        assert times.loc[method, "seconds"] == pytest.approx(sum(t["seconds"] for t in recorded))
    assert times["cpu_seconds_per_image"].tolist() == pytest.approx(
        (times["cpu_seconds"] / times["images"]).tolist())


def sets(done: dict) -> dict:
    """The counts of results (not images) of an explain run."""
    return {key: done[key] for key in ("computed", "stored", "parts")}


def without_timing(params_file: Path) -> dict:
    """params.json but its ``timing``, which records what this run's computing cost."""
    params = json.loads(params_file.read_text())
    params.pop(TIMING, None)
    return params


def assert_same_results(suite_path: Path, expected_runs: Path, runs: Path, methods=METHODS,
                        models=None) -> None:
    """Same files, same params.json (but the timing), bit-identical arrays (same dtypes), no
    parts left."""
    suite = load_suite(suite_path)
    specs = [suite.model(m) for m in models] if models else suite.models
    for method in methods:
        for spec in specs:
            for set_name in sets_for(suite, spec):
                want = result_dir(suite.root(expected_runs), method, spec.name, set_name)
                got = result_dir(suite.root(runs), method, spec.name, set_name)
                assert sorted(p.name for p in got.iterdir()) == [ARRAYS_FILE, PARAMS_FILE], got
                assert without_timing(got / PARAMS_FILE) == without_timing(want / PARAMS_FILE)
                with np.load(want / ARRAYS_FILE) as a, np.load(got / ARRAYS_FILE) as b:
                    assert sorted(a.files) == sorted(b.files)
                    for name in a.files:
                        assert a[name].dtype == b[name].dtype, (got, name)
                        assert np.array_equal(a[name], b[name]), f"{got}: {name} differs"


def test_chunk_size_from_the_command_line_over_the_suite(tmp_path):
    suite = load_suite(write_suite(tmp_path / "chunked.toml", body="[explain]\nchunk_images = 16\n"))
    parse = get_args_parser().parse_args

    def chunk(suite, argv):
        return chunk_images(explain_overrides(suite, parse(argv)))
    assert chunk(suite, []) == 16
    assert chunk(suite, ["--chunk-images", "4"]) == 4
    assert chunk(suite, ["--chunk-images", "0"]) is None  # 0: no chunking
    assert chunk(load_suite(write_suite(tmp_path / "plain.toml")), []) is None
    with pytest.raises(SuiteFileError, match=r"\[explain\] chunk_images \(from --chunk-images\) = -2 must be >= 0"):
        chunk(suite, ["--chunk-images", "-2"])


def test_part_ranges_start_at_multiples_of_the_batch_size():
    caricature = build_method("caricature")
    assert part_size(caricature, 2, 3) == 4 and part_size(caricature, 2, 4) == 4
    assert part_size(caricature, None, 3) == caricature.default_batch_size
    assert part_size(build_method("guided_backprop"), 3, 3) == 3
    assert image_ranges(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert image_ranges(8, None) == [(0, 8)]


def test_chunked_run_stores_the_unchunked_results_bit_for_bit(trained, unchunked, tmp_path, capsys,
                                                              monkeypatch):
    suite_path, trained_runs = trained
    runs = copy_of(trained_runs, tmp_path / "runs")
    submitted = spy_on_items(monkeypatch)
    done = explain(suite_path, runs, "--chunk-images", 3)
    # guided backprop in parts 0-3, 3-6, 6-8; Caricatures' 3 rounded up to 4 (its batch is 2)
    assert sorted(n for n in submitted if n.startswith("reference-00/")) == [
        "reference-00/caricature/detection/0-4", "reference-00/caricature/detection/4-8",
        "reference-00/guided_backprop/detection/0-3", "reference-00/guided_backprop/detection/3-6",
        "reference-00/guided_backprop/detection/6-8"]
    assert sets(done) == {"computed": 6, "stored": 0, "parts": 15}
    assert "chunk_images=3 rounded up to a multiple of its batch size 2" in capsys.readouterr().err
    assert_same_results(suite_path, unchunked, runs)

    submitted.clear()
    assert sets(explain(suite_path, runs, "--chunk-images", 3)) == \
        {"computed": 0, "stored": 6, "parts": 0}
    assert submitted == []  # a rerun submits nothing


def spy_on_items(monkeypatch) -> list[str]:
    """Names of the items every run_items call of this test is given (every stage runs its
    items through the stage skeleton's one call)."""
    names: list[str] = []
    run_items = stage_skeleton.run_items

    def recording(fn, items, config, stage_name, *, item_name, **options):
        items = list(items)
        names.extend(item_name(item) for item in items)
        return run_items(fn, items, config, stage_name, item_name=item_name, **options)

    monkeypatch.setattr(stage_skeleton, "run_items", recording)
    return names


def test_a_rerun_after_a_failed_part_submits_only_that_part(trained, unchunked, tmp_path,
                                                            monkeypatch):
    suite_path, trained_runs = trained
    runs = copy_of(trained_runs, tmp_path / "runs")
    suite = load_suite(suite_path)
    explain_part = explain_pipeline.explain_part

    def broken(item):
        if (item.model, item.start) == ("reference-01", 3):
            raise RuntimeError("this part breaks")
        return explain_part(item)
    monkeypatch.setattr(explain_pipeline, "explain_part", broken)
    with pytest.raises(ItemsFailedError) as raised:
        explain(suite_path, runs, "--chunk-images", 3, methods=["guided_backprop"])
    assert raised.value.failed_item_names == ["reference-01/guided_backprop/detection/3-6"]
    # the other models' parts were gathered; the broken model's other parts wait for the rerun
    failed = result_dir(suite.root(runs), "guided_backprop", "reference-01", "detection")
    assert not (failed / PARAMS_FILE).exists()
    assert sorted(p.name for p in (failed / PARTS_DIR).iterdir()) == ["0-3", "6-8"]
    assert (result_dir(suite.root(runs), "guided_backprop", "reference-02", "detection")
            / PARAMS_FILE).exists()

    monkeypatch.setattr(explain_pipeline, "explain_part", explain_part)
    submitted = spy_on_items(monkeypatch)
    done = explain(suite_path, runs, "--chunk-images", 3, methods=["guided_backprop"])
    assert submitted == ["reference-01/guided_backprop/detection/3-6"]
    assert sets(done) == {"computed": 1, "stored": 2, "parts": 1}
    assert_same_results(suite_path, unchunked, runs, methods=["guided_backprop"])


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_chunked_explanations_on_slurm_equal_the_local_run(trained, unchunked, tmp_path,
                                                          monkeypatch):
    suite_path, trained_runs = trained
    runs = copy_of(trained_runs, tmp_path / "runs")
    submitted = spy_on_items(monkeypatch)
    done = explain(suite_path, runs, "--chunk-images", 4, "--executor", "slurm",
                   "--cpus-per-task", 1, "--time", 10, "--log-dir", tmp_path / "logs",
                   models=["reference-00"])
    # guided backprop's 4 rounded up to 6 (its batch is 3); Caricatures in parts of 4
    assert sorted(submitted) == [
        "reference-00/caricature/detection/0-4", "reference-00/caricature/detection/4-8",
        "reference-00/guided_backprop/detection/0-6", "reference-00/guided_backprop/detection/6-8"]
    assert sets(done) == {"computed": 2, "stored": 0, "parts": 4}
    assert len({p.name.split("_")[0] for p in (tmp_path / "logs" / "explain").glob("*_log.out")}) == 1
    assert_same_results(suite_path, unchunked, runs, models=["reference-00"])


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_scoring_on_slurm_writes_the_local_tables(trained, unchunked, tmp_path, monkeypatch):
    suite_path, _ = trained
    suite = load_suite(suite_path)
    distance = build_distance("ssim")
    local, on_slurm = (copy_of(unchunked, tmp_path / name) for name in ("local", "slurm"))
    expected = detection_scores(suite, distance, METHODS, local)

    args = pipeline_parser("test").parse_args([
        "--suite", str(suite_path), "--runs-dir", str(on_slurm), "--distance", "ssim",
        "--executor", "slurm", "--cpus-per-task", "1", "--time", "10",
        "--log-dir", str(tmp_path / "logs")])
    submitted = spy_on_items(monkeypatch)
    scores = detection_scores(suite, distance, METHODS, on_slurm, run_options(args))
    assert sorted(submitted) == ["caricature/detection", "guided_backprop/detection"]
    assert list((tmp_path / "logs" / "score").glob("*_log.out"))
    pd.testing.assert_frame_equal(scores, expected, check_exact=True)
    for method in METHODS:
        for suffix in (".csv", ".json"):
            name = Path(SCORES) / "ssim" / method / f"detection{suffix}"
            assert (suite.root(on_slurm) / name).read_bytes() == (suite.root(local) / name).read_bytes()

    submitted.clear()  # a rerun reads the stored tables back as they were made, and submits nothing
    pd.testing.assert_frame_equal(detection_scores(suite, distance, METHODS, on_slurm, run_options(args)),
                                  expected, check_exact=True)
    assert submitted == []


# ---- sets of one draw with other counts share their images' explanations (explain/stage.py)

def longer_suite(tmp_path: Path, detection_images: int) -> Path:
    """The chunks suite with another m: the same nested draw of detection images, cut elsewhere."""
    body = BODY.replace("detection_images = 8", f"detection_images = {detection_images}")
    return write_suite(tmp_path / f"m{detection_images}.toml", body=body, references=3, epochs=1)


@pytest.fixture(scope="module")
def longer_from_scratch(trained, tmp_path_factory) -> tuple[Path, Path]:
    """(suite with m = 11, runs root where it was explained from scratch)."""
    base = tmp_path_factory.mktemp("longer")
    suite_path = longer_suite(base, 11)
    runs = copy_of(trained[1], base / "runs")
    done = explain(suite_path, runs)
    assert done["explained_images"] == 6 * 11 and done["reused_images"] == 0
    return suite_path, runs


def test_a_smaller_count_draws_a_prefix_of_a_larger_one(trained, tmp_path):
    suite = load_suite(trained[0])
    world = build_world(suite.world, runs_root=trained[1])
    small = detection_set(suite, world, tmp_path / "sets")
    large = detection_set(load_suite(longer_suite(tmp_path, 11)), world, tmp_path / "sets")
    assert small.id != large.id and small.lineage == large.lineage
    assert np.array_equal(large.val_indices[:8], small.val_indices)
    assert np.array_equal(large.images[:8], small.images)
    assert len(set(large.val_indices.tolist())) == 11  # without replacement


@pytest.mark.parametrize("chunk", [None, 3])
def test_a_suite_with_more_images_explains_only_the_images_it_adds(trained, unchunked,
                                                                   longer_from_scratch, tmp_path,
                                                                   monkeypatch, chunk):
    """m = 8 explained, then m = 11 on the same runs root: only the new images (and the partial
    last batch, whose images share it with others) are explained, and the results are bit for
    bit those of m = 11 explained from scratch."""
    longer, scratch = longer_from_scratch
    runs = copy_of(unchunked, tmp_path / "runs")
    longer = Path(shutil.copy(longer, tmp_path / longer.name))
    submitted = spy_on_items(monkeypatch)
    done = explain(longer, runs, *(["--chunk-images", chunk] if chunk else []))
    # 3 models; guided backprop (batch 3) takes rows 0-6 of m = 8 and computes 6-11, Caricatures
    # (batch 2) take rows 0-8 and compute 8-11
    assert done["reused_images"] == 3 * (6 + 8)
    assert done["explained_images"] == 3 * (5 + 3)
    if chunk:  # the parts the stored rows cover are not submitted
        assert sorted(n for n in submitted if n.startswith("reference-00/")) == [
            "reference-00/caricature/detection/8-11",
            "reference-00/guided_backprop/detection/6-9",
            "reference-00/guided_backprop/detection/9-11"]
    assert_same_results(longer, scratch, runs)
    # each result's recorded cost counts the images computed for it, not the stored rows
    times = explain_time_table(load_suite(longer), METHODS, runs).set_index("method")
    assert times["images"].to_dict() == {"guided_backprop": 3 * 5, "caricature": 3 * 3}
    assert (times["timed_results"] == 3).all() and (times["cpu_seconds"] > 0).all()
    # and the smaller set after the larger: its rows are all in the larger one's batches but the
    # last of guided backprop's, which shares its batch with other images there
    runs = copy_of(scratch, tmp_path / "smaller-after-larger")
    done = explain(trained[0], runs)
    assert done["reused_images"] == 3 * (6 + 8) and done["explained_images"] == 3 * 2
    assert_same_results(trained[0], unchunked, runs)


def test_a_stored_result_of_another_draw_is_not_reused(trained, unchunked, tmp_path):
    """Another image seed draws other images: nothing is shared, however the counts compare."""
    runs = copy_of(unchunked, tmp_path / "runs")
    body = BODY + "seed = 7\n"  # inside [evaluate]
    other = write_suite(tmp_path / "other.toml", body=body, references=3, epochs=1)
    done = explain(other, runs)
    assert done["reused_images"] == 0 and done["explained_images"] == 6 * 8


def test_the_stage_gives_per_model_noise_each_models_key_and_label_targets_the_labels(
        trained, tmp_path):
    """The explain stage passes each model's key (Caricatures' per-model noise) and the image
    set's labels (explained_class = "label"; chunked items call the same ``_Work.run_from``): it
    stores what a direct run with that key and those labels gives."""
    suite_path, trained_runs = trained
    body = BODY.replace("[methods.caricature]", '[methods.gradcam]\nexplained_class = "label"\n'
                        'aug_smooth = false\n\n[methods.caricature]\nnoise = "per_model"')
    body = body.replace('methods = ["guided_backprop", "caricature"]',
                        'methods = ["gradcam", "caricature"]')
    per_model = write_suite(tmp_path / "per_model.toml", body=body, references=3, epochs=1)
    runs = copy_of(trained_runs, tmp_path / "runs")
    explain(per_model, runs)
    suite = load_suite(per_model)
    names = [spec.name for spec in suite.references]
    caricatures = load_results(suite, "caricature", names, "detection", runs)
    gradcams = load_results(suite, "gradcam", names, "detection", runs)
    image_set = explain_pipeline.load_image_sets(suite, runs)["detection"]
    np.testing.assert_array_equal(gradcams[names[0]].targets, image_set.labels)
    spec = suite.model(names[1])
    model = load_trained_model(model_dir(runs, spec), spec, build_world(suite.world, runs), "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.recipe.cpu_threads)  # as the stage (explain/stage.py)
    try:
        direct = suite_method(suite, "caricature").run(model, image_set.tensor(), batch_size=2,
                                                       model_id=spec.key)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(direct.images, caricatures[names[1]].images)
    assert not np.array_equal(caricatures[names[0]].images[:, :2],
                              caricatures[names[1]].images[:, :2])
