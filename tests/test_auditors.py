"""Failure-discovery auditors. The generic tests run for every registered auditor (with its
``test_params``), so adding an auditor needs no new test file."""
from __future__ import annotations

import argparse
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from imagenet_x import FACTORS, compute_factor_accuracies, error_ratio, load_annotations

from conftest import write_suite
from counteraudit.evaluate import discover
from counteraudit.evaluate.discovery.auditors import AUDITORS, BudgetError, build_auditor
from counteraudit.evaluate.discovery.auditors.base import median_interval
from counteraudit.evaluate.discovery.auditors.error_ratio import (error_ratios, group_error_ratios,
                                                                   one_hot)
from counteraudit.evaluate.discovery.covering_arrays import (cached_covering_array, covering_array,
                                                             covering_rows, uncovered)
from counteraudit.evaluate.discovery.selection import SELECTIONS
from counteraudit.evaluate.discovery.stage import FINDINGS, PARAMS_FILE, discover_suite
from counteraudit.evaluate.report import stored_discovery
from counteraudit.evaluate.reporting.discovery import (EXAMPLES_PER_SUBGROUP, TOP_SUBGROUPS,
                                                       discovery_section, example_images)
from counteraudit.evaluate.reporting.html import html_table
from counteraudit.train import train
from counteraudit.train.architectures import build_model
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds import build_world, synthetic_factors
from counteraudit.train.worlds.synthetic import SyntheticConfig, SyntheticWorld
from counteraudit.train.core.stage import RunOptions
from tests.test_world_factors import imagenet_x_sample

TINY = SyntheticConfig(seed=3, image_size=32, num_train=640, num_val=160)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthetic_factors, "POOL_PER_CLASS", 300)
        yield SyntheticWorld(TINY, cache_dir=tmp_path_factory.mktemp("worlds"), verbose=False)


@pytest.fixture(scope="module")
def model(world):
    torch.manual_seed(0)  # untrained, but a real classifier of the world's classes
    return build_model("small_resnet", world.num_classes, world.mean, world.std).eval()


# ---------------------------------------------------------------- covering arrays
SMALL_GRID = {"a": ["1", "2", "3"], "b": ["x", "y"], "c": ["p", "q", "r"], "d": ["u", "v"]}


def brute_force_missing(rows, grid, t, allowed=lambda combo: True):
    missing = []
    for names in itertools.combinations(grid, t):
        for values in itertools.product(*(grid[n] for n in names)):
            combo = dict(zip(names, values))
            if allowed(combo) and not any(all(r[n] == v for n, v in combo.items()) for r in rows):
                missing.append(combo)
    return missing


@pytest.mark.parametrize("t", [2, 3])
def test_covering_array_holds_every_t_tuple(t):
    rows = covering_array(SMALL_GRID, t, seed=0)
    assert brute_force_missing(rows, SMALL_GRID, t) == []
    assert len(rows) < np.prod([len(v) for v in SMALL_GRID.values()])  # fewer than exhaustive
    assert all(set(r) == set(SMALL_GRID) for r in rows)


def test_a_covering_array_prefix_is_the_whole_arrays_first_rows(tmp_path):
    def feasible(combo):
        return not (combo.get("a") == "1" and combo.get("b") == "x")
    whole = covering_array(SMALL_GRID, 3, seed=0, feasible=feasible)
    assert covering_rows(SMALL_GRID, 3, 0, feasible, limit=4) == (whole[:4], False)
    assert covering_rows(SMALL_GRID, 3, 0, feasible, limit=len(whole) + 1) == (whole, True)
    world = argparse.Namespace(cache_dir=tmp_path, feasible=feasible, constraint_groups=list)
    assert cached_covering_array(world, SMALL_GRID, 3, 0, limit=4) == whole[:4]  # stored: 4
    assert cached_covering_array(world, SMALL_GRID, 3, 0) == whole  # longer: built again


def test_covering_array_leaves_out_infeasible_combinations():
    def feasible(combo):
        return not (combo.get("a") == "1" and combo.get("b") == "x")
    rows = covering_array(SMALL_GRID, 2, seed=0, feasible=feasible)
    assert all(feasible(r) for r in rows)
    assert brute_force_missing(rows, SMALL_GRID, 2, feasible) == []


def test_t_larger_than_the_number_of_factors_is_refused(world, model):
    auditor = build_auditor("twise", {"t": 4, "factors": ["class", "face", "size"],
                                      "design": "joint"})
    with pytest.raises(ValueError, match="t=4 is larger than the number of factors \\(3"):
        auditor.run(model, world, 1000, seed=0)
    # promptattack fixes the class: t counts the other factors
    auditor = build_auditor("twise", {"t": 3, "factors": ["class", "face", "size"]})
    with pytest.raises(ValueError, match="t=3 is larger than the number of factors besides the "
                                         "class \\(2: face, size\\)"):
        auditor.run(model, world, 1000, seed=0)
    with pytest.raises(ValueError, match="design='pairwise'; valid: promptattack, joint"):
        build_auditor("twise", {"design": "pairwise"})


def test_twise_unknown_factor_lists_the_valid_ones(world, model):
    with pytest.raises(ValueError, match="unknown factor 'shade'.*class, colour"):
        build_auditor("twise", {"factors": ["shade"]}).run(model, world, 100, seed=0)


def test_exhaustive_mode_evaluates_every_feasible_subgroup(world, model):
    auditor = build_auditor("twise", {"mode": "exhaustive", "factors": ["class", "face"],
                                      "images_per_subgroup": 2})
    result = auditor.run(model, world, auditor.minimum_budget(world), seed=0)
    subgroups = {json.dumps(f.conditions, sort_keys=True) for f in result.findings}
    expected = {json.dumps({"class": c, "face": f}, sort_keys=True)
                for c in world.factors()["class"] for f in ("present", "absent")}
    assert subgroups == expected  # every class shows with and without a face in this world
    covering = build_auditor("twise", {"factors": ["class", "face"], "images_per_subgroup": 2,
                                       "design": "joint", "t": 2})
    # with two factors, t = 2 covering needs every pair: the same subgroups
    assert {json.dumps(r, sort_keys=True) for r in covering.subgroups(world, 0)} == expected


def test_twise_objectives_are_medians_of_the_papers_quantities(world, model):
    auditor = build_auditor("twise", {"factors": ["class", "face"], "images_per_subgroup": 5,
                                      "design": "joint", "t": 2})
    result = auditor.run(model, world, 5, seed=0)  # the first subgroup only
    row = result.findings[0].conditions
    images = world.generate(row, 5, seed=0)
    with torch.no_grad():
        probabilities = torch.softmax(model(images.load(range(5))).float(), 1).double().numpy()
    label = int(images.labels[0])
    error = [f for f in result.findings if f.objective == "systematic_error"][0]
    assert error.statistic == pytest.approx(np.median(1 - probabilities[:, label]))
    target = (label + 1) % world.num_classes
    name = world.class_names[target]
    misclassified = [f for f in result.findings if f.objective == f"misclassification:{name}"][0]
    assert misclassified.statistic == pytest.approx(np.median(probabilities[:, target]))
    assert not [f for f in result.findings
                if f.objective == f"misclassification:{world.class_names[label]}"]


PROMPTATTACK = {"factors": ("class", "face", "size", "clutter"), "t": 2, "images_per_subgroup": 2}


def test_promptattack_design_fixes_the_class_and_covers_every_t_tuple_within_it(world):
    auditor = build_auditor("twise", PROMPTATTACK)
    rows = auditor.subgroups(world, 0)
    others = {f: world.factors()[f] for f in ("face", "size", "clutter")}
    for c in world.class_names:
        mine = [r for r in rows if r["class"] == c]
        assert mine == auditor.class_arrays(world, 0)[c]  # the class fixed in every row
        assert all(world.feasible(r) for r in mine)
        within = lambda combo: world.feasible({**combo, "class": c})  # noqa: E731
        assert uncovered(mine, others, 2, within) == []
    assert len(rows) == sum(len(a) for a in auditor.class_arrays(world, 0).values())


def test_promptattack_prefix_is_round_robin_across_classes(world, model):
    auditor = build_auditor("twise", PROMPTATTACK)
    classes = list(world.class_names)
    assert auditor.minimum_budget(world) == 2 * len(classes)  # one row of every class
    # seed 5: no array stored yet, so the run builds only the rows it needs of each class
    result = auditor.run(model, world, 2 * (len(classes) + 3), seed=5)  # one round and 3 rows
    rows = build_auditor("twise", PROMPTATTACK).subgroups(world, 5)  # the whole design
    arrays = auditor.class_arrays(world, 5)
    assert [r["class"] for r in rows[:2 * len(classes)]] == classes * 2
    assert rows[len(classes) + 3] == arrays[classes[3]][1]  # row 1 of every class after row 0
    evaluated = rows[:len(classes) + 3]
    assert [s.conditions for s in result.subgroups] == evaluated
    coverage = result.notes["t_tuple_coverage"]
    others = {f: world.factors()[f] for f in ("face", "size", "clutter")}
    for c in classes:
        within = lambda combo: world.feasible({**combo, "class": c})  # noqa: E731
        mine = [r for r in evaluated if r["class"] == c]
        total = len(uncovered([], others, 2, within))
        assert coverage[c] == pytest.approx(1 - len(uncovered(mine, others, 2, within)) / total,
                                            abs=1e-6)
    assert coverage[classes[0]] > coverage[classes[-1]] > 0  # two rows against one
    assert auditor.findings_within(result, 2 * len(classes) - 2, world, 5) is None  # < a round
    within_one_round = auditor.findings_within(result, 2 * len(classes), world, 5)
    assert {json.dumps(f.conditions) for f in within_one_round} == {
        json.dumps(r) for r in rows[:len(classes)]}


def test_twise_score_subgroup_is_the_median_statistic():
    auditor = build_auditor("twise")
    auditor.class_names = ["a", "b", "c"]
    probabilities = np.array([[0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1],
                              [0.1, 0.1, 0.8], [0.5, 0.4, 0.1]])
    findings = auditor.score_subgroup({"class": "a"}, probabilities, np.zeros(5, int))
    by_objective = {f.objective: f for f in findings}
    assert set(by_objective) == {"systematic_error", "misclassification:b",
                                 "misclassification:c"}
    assert by_objective["systematic_error"].statistic == pytest.approx(0.5)  # 1 - p: .1 .8 .4 .9 .5
    assert by_objective["misclassification:b"].statistic == pytest.approx(0.3)
    assert by_objective["misclassification:c"].statistic == pytest.approx(0.1)
    assert all(f.n_images == 5 and f.conditions == {"class": "a"} for f in findings)


def test_median_interval_is_the_binomial_order_statistic_interval():
    values = np.arange(16, dtype=float)
    # n = 16: P(B(16, 1/2) <= 3) = 0.0106, so [x_(4), x_(13)] covers the median with 97.9%
    assert median_interval(values) == (3.0, 12.0)
    assert median_interval(np.array([0.2, 0.9])) == (0.2, 0.9)  # too few: the whole range


# ---------------------------------------------------------------- error ratio
def test_error_ratio_equals_a_hand_computed_example():
    correct = np.array([1, 1, 0, 0, 1, 1, 1, 0], bool)
    values = [{"f": "yes" if i in (0, 2, 3, 4) else "no"} for i in range(8)]
    table = error_ratios(correct, one_hot(values, {"f": ["yes", "no"]})).set_index("column")
    # with f: 2 errors in 4 -> 0.5; overall 3 errors in 8 -> 0.375; ratio 0.5 / 0.375
    assert table.loc["f=yes", "error_ratio"] == pytest.approx(4 / 3)
    assert table.loc["f=no", "error_ratio"] == pytest.approx((1 / 4) / (3 / 8))
    assert table.loc["f=yes", "n_images"] == 4 and table.loc["f=yes", "errors"] == 2


def test_per_class_error_ratio_equals_a_hand_computed_example():
    correct = np.array([1, 0, 0, 1, 1, 1, 1, 1, 0, 1], bool)
    values = [{"class": "x" if i < 6 else "y", "f": "yes" if i in (0, 1, 2, 6, 7) else "no"}
              for i in range(10)]
    table = group_error_ratios(correct, one_hot(values, {"f": ["yes", "no"]}),
                               [v["class"] for v in values]).set_index(["group", "column"])
    # class x: 2 errors in 6 (1/3); with f=yes 2 in 3 -> ratio 2; with f=no 0 in 3 -> 0
    assert table.loc[("x", "f=yes"), "error_ratio"] == pytest.approx((2 / 3) / (1 / 3))
    assert table.loc[("x", "f=no"), "error_ratio"] == pytest.approx(0.0)
    # class y: 1 error in 4 (the f=no image 8): f=no 1 in 2 -> 2; f=yes 0 in 2 -> 0
    assert table.loc[("y", "f=no"), "error_ratio"] == pytest.approx((1 / 2) / (1 / 4))
    assert table.loc[("x", "f=yes"), "n_images"] == 3 and table.loc[("y", "f=no"), "errors"] == 1
    # a class without error: ratio undefined (0 / 0), set to 1 with interval [1, 1]
    flawless = np.ones(10, bool)
    auditor = build_auditor("error_ratio", {"min_images": 1})
    findings = auditor.findings(group_error_ratios(flawless, one_hot(values, {"f": ["yes", "no"]}),
                                                   [v["class"] for v in values]), "class")
    assert {(f.statistic, f.low, f.high) for f in findings} == {(1.0, 1.0, 1.0)}
    assert {json.dumps(f.conditions) for f in findings} == {
        json.dumps({"class": c, "f": v}) for c in "xy" for v in ("yes", "no")}


def test_error_ratio_breakdown_ranks_global_and_per_class_findings_together(world, model):
    both = build_auditor("error_ratio").run(model, world, 160, seed=0)
    per_class = [f for f in both.findings if "class" in f.conditions and len(f.conditions) == 2]
    assert per_class and len(per_class) < len(both.findings)
    assert {f.objective for f in both.findings} == {"error_ratio"}
    glob = build_auditor("error_ratio", {"breakdown": "global"}).run(model, world, 160, seed=0)
    assert all(len(f.conditions) == 1 for f in glob.findings)
    assert {json.dumps(f.to_dict()) for f in glob.findings} <= {
        json.dumps(f.to_dict()) for f in both.findings}
    with pytest.raises(ValueError, match="breakdown='metaclass'; valid: global, per_class, both"):
        build_auditor("error_ratio", {"breakdown": "metaclass"})


def test_error_ratio_agrees_with_the_imagenet_x_package():
    annotations = load_annotations(which_factor="top", partition="val").head(3000)
    correct = np.random.default_rng(0).random(len(annotations)) < 0.7
    package = error_ratio(compute_factor_accuracies(
        annotations.assign(model="m", is_correct=correct), FACTORS, "is_correct")).iloc[0]
    values = [{f: "present" if row[f] else "absent" for f in FACTORS}
              for row in annotations.to_dict("records")]
    ours = error_ratios(correct, one_hot(values, {f: ["present", "absent"] for f in FACTORS}))
    ours = ours.set_index("column")["error_ratio"]
    for factor in FACTORS:
        if np.isfinite(package[factor]):
            assert ours[f"{factor}=present"] == pytest.approx(package[factor], rel=1e-12)


def test_error_ratio_runs_on_imagenet_x_annotated_val_images(tmp_path):
    rows = imagenet_x_sample(8)
    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        (root / split / "n01440764").mkdir(parents=True)
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
        root / "train" / "n01440764" / "t.JPEG")
    for row in rows:
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
            root / "val" / "n01440764" / row["file_name"])
    world = build_world({"name": "imagenet", "root": str(root), "image_size": 32,
                         "resize_size": 36, "num_workers": 0})
    torch.manual_seed(0)
    model = build_model("small_resnet", world.num_classes, world.mean, world.std).eval()
    result = build_auditor("error_ratio", {"min_images": 1}).run(model, world, 8, seed=0)
    assert result.images_used == 8
    present = {f: sum(row[f] for row in rows) for f in FACTORS}
    for finding in [f for f in result.findings if "metaclass" not in f.conditions]:
        (factor, value), = finding.conditions.items()
        expected = present[factor] if value == "present" else 8 - present[factor]
        assert finding.n_images == expected
    # the per-metaclass breakdown groups by the package's metaclass of each val image
    metaclasses = {row["metaclass"] for row in rows}
    grouped = [f for f in result.findings if "metaclass" in f.conditions]
    assert grouped and {f.conditions["metaclass"] for f in grouped} <= metaclasses
    for finding in grouped:
        (factor, value), = [(k, v) for k, v in finding.conditions.items() if k != "metaclass"]
        mine = [row for row in rows if row["metaclass"] == finding.conditions["metaclass"]]
        assert finding.n_images == sum(bool(row[factor]) == (value == "present") for row in mine)


# ---------------------------------------------------------------- every registered auditor
def small(name: str):
    return build_auditor(name, AUDITORS.get(name).test_params)


def budget_for(auditor, world) -> int:
    return min(3 * auditor.minimum_budget(world), auditor.default_budget(world))


@pytest.mark.parametrize("name", AUDITORS.names())
def test_rerun_gives_the_same_bits(name, world, model):
    auditor = small(name)
    budget = budget_for(auditor, world)
    first = auditor.run(model, world, budget, seed=7)
    second = small(name).run(model, world, budget, seed=7)
    dump = lambda r: json.dumps([f.to_dict() for f in r.findings])  # noqa: E731
    assert first.findings or auditor.filters_findings and first.notes
    assert dump(first) == dump(second)
    assert json.dumps(first.notes, sort_keys=True) == json.dumps(second.notes, sort_keys=True)
    assert first.images_used == second.images_used


@pytest.mark.parametrize("name", AUDITORS.names())
def test_budget_is_respected_and_too_small_a_budget_names_the_minimum(name, world, model):
    auditor = small(name)
    minimum = auditor.minimum_budget(world)
    budget = budget_for(auditor, world)
    result = auditor.run(model, world, budget, seed=0)
    assert 0 < result.images_used <= budget
    assert all(f.n_images <= budget for f in result.findings)
    with pytest.raises(BudgetError, match=f"the minimum is {minimum} images"):
        auditor.run(model, world, minimum - 1, seed=0)


@pytest.mark.parametrize("name", AUDITORS.names())
def test_findings_are_ranked_worst_first_with_intervals(name, world, model):
    auditor = small(name)
    if auditor.filters_findings:
        pytest.skip(f"{name} keeps only significant findings; its own tests check their ranking "
                    "on a model with a planted failure")
    result = auditor.run(model, world, budget_for(auditor, world), seed=0)
    main = [f for f in result.findings if f.objective == auditor.objective]
    assert main and [f.statistic for f in main] == sorted((f.statistic for f in main), reverse=True)
    assert all(f.low <= f.statistic <= f.high for f in main)
    factors = world.factors()
    assert all(v in factors[k] for f in main for k, v in f.conditions.items())


# ---------------------------------------------------------------- the stage: store and resume
DISCOVER_BODY = """
[[anomalies]]
name = "missing-star"
family = "missing_class"
params = { class_id = "star" }

[auditors.twise]
factors = ["class", "face", "size"]
images_per_subgroup = 4
t = 2

[auditors.surrogate_search]
factors = ["class", "face"]
images_per_subdomain = 4

[auditors.caption_lift]
images_per_class = 6
images_per_description = 4
captioner = "partial"
described_factors = ["face"]
min_recurrence = 2

[discover.budget]
twise = 40
error_ratio = 120
surrogate_search = 48
caption_lift = 76
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny suite (2 references, a missing class) trained for one epoch."""
    base = tmp_path_factory.mktemp("discover")
    suite = write_suite(base / "disc.toml", body=DISCOVER_BODY, references=2, epochs=1)
    runs = base / "runs"
    # in this process (--jobs 1): no interpreter to start, torch to import, per model
    train.main(train.get_args_parser().parse_args(["--suite", str(suite), "--runs-dir", str(runs),
                                                    "--no-progress", "--jobs", "1"]))
    with pytest.MonkeyPatch.context() as patch:  # a small pool: the stage runs in this process
        patch.setattr(synthetic_factors, "POOL_PER_CLASS", 300)
        yield suite, runs


def test_a_killed_run_resumes_and_computes_only_what_is_missing(trained):
    suite_path, runs = trained
    suite = load_suite(suite_path)
    args = RunOptions(runs_dir=str(runs), device="cpu", executor={"local_jobs": 1})
    first = discover_suite(suite, args)
    assert first == {"computed": 3 * len(AUDITORS), "stored": 0}
    results = sorted((runs / "store" / FINDINGS).glob("*/*/findings.json"))
    assert len(results) == 3 * len(AUDITORS)
    stamps = {p: p.stat().st_mtime_ns for p in results}
    # a run killed after writing one model's findings but before its marker
    killed = results[0]
    (killed.parent / PARAMS_FILE).unlink()
    second = discover_suite(suite, args)
    assert second == {"computed": 1, "stored": 3 * len(AUDITORS) - 1}
    assert [p for p in results if p.stat().st_mtime_ns != stamps[p]] == [killed]
    assert discover_suite(suite, args) == {"computed": 0, "stored": 3 * len(AUDITORS)}
    # a corrupt findings file is set aside and recomputed, alone
    results[1].write_text("{}")
    assert discover_suite(suite, args)["computed"] == 1


def test_discover_prints_tables_3_and_4(trained, capsys):
    suite, runs = trained
    discover.main(discover.get_args_parser().parse_args(
        ["--suite", str(suite), "--runs-dir", str(runs), "--no-progress", "--jobs", "1"]))
    out = capsys.readouterr().out
    assert "Table 3" in out and "Table 4" in out and "class=star" in out
    assert "Selection functions compared" in out and "Budget curves" in out
    tables = runs / "disc" / "tables"
    for stem in ("discovery-detection", "discovery-recovery", "discovery-detection-per-model",
                 "search-selection-comparison", "search-selection-curves", "search-budget-curves",
                 "search-images-to-rank"):
        for ext in ("md", "csv", "tex"):
            assert (tables / f"{stem}.{ext}").is_file()
    recovery = pd.read_csv(tables / "discovery-recovery.csv")
    assert set(recovery["auditor"]) == set(AUDITORS.names())
    assert (recovery["planted_slice"] == "class=star").all()
    curves = pd.read_csv(tables / "search-budget-curves.csv")
    assert set(curves["auditor"]) == {"caption_lift", "error_ratio", "twise"} | {
        f"surrogate_search:{s}" for s in SELECTIONS.names()}
    assert set(curves[curves["auditor"] == "surrogate_search:bo"]["seed"]) == set(range(10))


def test_report_section_shows_top_subgroups_with_examples_that_satisfy_them(trained):
    suite_path, runs = trained
    suite = load_suite(suite_path)
    results, tables, world = stored_discovery(suite, runs)  # discover ran in the tests above
    shown = []
    html = discovery_section(results, tables, world,
                             lambda image, alt, caption: shown.append(image) or f"<img alt='{alt}'>",
                             html_table)
    assert "Table 3" in html and "Table 4" in html
    shown_subgroups = sum(min(TOP_SUBGROUPS, len([f for f in r.findings
                                                  if f.objective == AUDITORS.get(a).objective]))
                          for (a, _), r in results.items())
    assert len(shown) == shown_subgroups * EXAMPLES_PER_SUBGROUP
    assert "Budgeted search and budget curves" in html and html.count("<svg") >= 3 * 2
    for (auditor, model), result in results.items():
        top = [f for f in result.findings if f.objective == AUDITORS.get(auditor).objective][:1]
        assert all(f.label() in html.replace("&amp;", "&") for f in top)
    images = world.generate({"class": "star", "face": "present"}, EXAMPLES_PER_SUBGROUP, 0)
    assert (example_images(world, {"class": "star", "face": "present"},
                           EXAMPLES_PER_SUBGROUP) == images.images.numpy()).all()

