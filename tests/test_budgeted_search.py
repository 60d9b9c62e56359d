"""Budgeted failure search (selection functions, surrogate_search, its exhaustive reference) and
caption_lift. Toy objectives where the search itself is tested; a tiny world where the auditors
are, with a model whose failures are planted (it fails exactly on one slice)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from statsmodels.stats.multitest import multipletests

from counteraudit.evaluate.discovery.auditors import BudgetError, build_auditor
from counteraudit.evaluate.discovery.auditors.caption_lift import benjamini_hochberg, recurring_descriptions
from counteraudit.evaluate.discovery.budget_curves import lookup_curves
from counteraudit.evaluate.discovery.covering_arrays import covering_array
from counteraudit.evaluate.discovery.exhaustive import _one_search, evaluate_every_subdomain
from counteraudit.evaluate.discovery.selection import SELECTIONS, BudgetBelowInitial, Subdomains, search
from counteraudit.train.core.registry import UnknownNameError
from counteraudit.train.worlds import synthetic_factors
from counteraudit.train.worlds.synthetic import SyntheticConfig, SyntheticWorld

TOY_GRID = {"a": [str(k) for k in range(10)], "b": ["x", "y"], "c": ["s", "m", "l"],
            "d": ["p", "q", "r", "t"]}   # 240 subdomains


def toy_objective(seed: int = 0):
    """Failure rates with additive effects of a = 3, (b, c) = (y, l) and d = t, plus noise: the
    worst subdomain is a=3, b=y, c=l, d=t."""
    subdomains = Subdomains(TOY_GRID)
    rng = np.random.default_rng(seed)
    rates = 0.05 + 0.05 * rng.random(len(subdomains))
    for i, row in enumerate(subdomains.rows):
        rates[i] += (0.4 * (row["a"] == "3") + 0.25 * (row["b"] == "y" and row["c"] == "l")
                     + 0.15 * (row["d"] == "t"))
    return subdomains, rates


@pytest.mark.parametrize("selection", SELECTIONS.names())
def test_each_selection_respects_the_budget_and_never_reevaluates(selection):
    subdomains, rates = toy_objective()
    calls = []
    state = search(subdomains, lambda i: calls.append(i) or rates[i], selection, 37, seed=1)
    assert len(calls) == 37 and len(set(calls)) == 37 and calls == state.evaluated
    # asked for more than the grid holds: every subdomain exactly once
    calls.clear()
    small = Subdomains({"a": ["1", "2", "3"], "b": ["x", "y", "z", "w"]})
    search(small, lambda i: calls.append(i) or 0.0, selection, 50, seed=1)
    assert sorted(calls) == list(range(12))


@pytest.mark.parametrize("selection", SELECTIONS.names())
def test_a_search_rerun_gives_the_same_order_and_another_seed_another(selection):
    subdomains, rates = toy_objective()
    first = search(subdomains, lambda i: rates[i], selection, 40, seed=5)
    second = search(subdomains, lambda i: rates[i], selection, 40, seed=5)
    other = search(subdomains, lambda i: rates[i], selection, 40, seed=6)
    assert first.evaluated == second.evaluated and first.scores == second.scores
    assert first.evaluated != other.evaluated
    # a smaller budget stops the same search earlier (what the budget curves rely on)
    assert search(subdomains, lambda i: rates[i], selection, 25, seed=5).evaluated == \
        first.evaluated[:25]


BO_BUDGET = 40  # subdomains of 240 (random finds one given subdomain in 40 with chance 1/6)


def test_bo_finds_the_planted_worst_subdomain_within_its_budget():
    subdomains, rates = toy_objective()
    worst = int(np.argmax(rates))
    assert subdomains.rows[worst] == {"a": "3", "b": "y", "c": "l", "d": "t"}
    for seed in range(5):
        state = search(subdomains, lambda i: rates[i], "bo", BO_BUDGET, seed=seed)
        assert worst in state.evaluated, f"seed {seed}"
    found_by_random = sum(worst in search(subdomains, lambda i: rates[i], "random", BO_BUDGET,
                                          seed=s).evaluated for s in range(5))
    assert found_by_random < 5  # the budget is tight enough to mean something


def test_nwise_starts_with_the_rows_of_a_pairwise_covering_array():
    subdomains, rates = toy_objective()
    rows = covering_array(TOY_GRID, 2, seed=3)
    state = search(subdomains, lambda i: rates[i], "nwise", 10 + len(rows), seed=3)
    covered = {json.dumps(subdomains.rows[i], sort_keys=True) for i in state.evaluated}
    assert all(json.dumps(r, sort_keys=True) in covered for r in rows)


def test_unknown_selection_function_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match="'annealing'.*bo, genetic, nwise, random"):
        build_auditor("surrogate_search", {"selection": "annealing"})
    subdomains, rates = toy_objective()
    with pytest.raises(UnknownNameError, match="bo, genetic, nwise, random"):
        search(subdomains, lambda i: rates[i], "annealing", 20, seed=0)


def test_a_search_below_the_initial_subdomains_names_the_minimum():
    subdomains, rates = toy_objective()
    with pytest.raises(BudgetBelowInitial, match="the minimum is 10 subdomains"):
        search(subdomains, lambda i: rates[i], "bo", 9, seed=0)


def test_benjamini_hochberg_matches_statsmodels_and_the_step_up_rule():
    p = [0.001, 0.008, 0.039, 0.041, 0.042, 0.060, 0.074, 0.205, 0.212, 0.216]
    # step-up by hand at q = 0.05, m = 10: p_(k) <= k/10 * 0.05 holds for k = 1, 2 (0.008 <=
    # 0.010) and no larger k (0.039 > 0.015, 0.041 > 0.020, 0.042 > 0.025, ...): reject 2
    expected = [True, True] + [False] * 8
    assert benjamini_hochberg(p, 0.05).tolist() == expected
    assert benjamini_hochberg(p, 0.05).tolist() == multipletests(p, 0.05, "fdr_bh")[0].tolist()
    # at q = 0.2 the largest k with p_(k) <= k q / m is 7 (0.074 <= 0.14; then 0.205 > 0.16,
    # 0.212 > 0.18, 0.216 > 0.2)
    assert benjamini_hochberg(p, 0.2).tolist() == [True] * 7 + [False] * 3
    shuffled = np.random.default_rng(0).permutation(10)
    assert benjamini_hochberg([p[i] for i in shuffled], 0.2).tolist() == \
        [i < 7 for i in shuffled]


def test_recurring_descriptions_combine_sentences_and_count_images():
    captions = [{"class": "disk", "face": "present", "size": "small"},
                {"class": "disk", "face": "present", "size": "large"},
                {"class": "star", "face": "present", "size": "small"}]
    found = dict((json.dumps(d, sort_keys=True), c)
                 for d, c in recurring_descriptions(captions, 2, 2))
    assert found == {json.dumps({"class": "disk", "face": "present"}, sort_keys=True): 2}
    assert recurring_descriptions(captions, 1, 1)[0] == ({"class": "disk", "face": "present"}, 2)


# ---------------------------------------------------------------- on a tiny world
TINY = SyntheticConfig(seed=3, image_size=32, num_train=64, num_val=32)
PLANTED = {"class": "disk", "face": "present"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthetic_factors, "POOL_PER_CLASS", 300)
        yield SyntheticWorld(TINY, cache_dir=tmp_path_factory.mktemp("worlds"), verbose=False)


def _key(image: torch.Tensor) -> bytes:
    return image.mul(255).round().to(torch.uint8).numpy().tobytes()


class PlantedModel(torch.nn.Module):
    """Right on every image the world generated, except on the planted slice, where it predicts
    the next class. It knows the images through ``RecordingWorld``."""

    def __init__(self, num_classes: int, fails: dict[str, str] | None):
        super().__init__()
        self.num_classes, self.fails, self.seen = num_classes, fails or {}, {}
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # predict() reads the device from it

    def forward(self, images):
        logits = torch.zeros(len(images), self.num_classes)
        for i, image in enumerate(images):
            label, factors = self.seen[_key(image)]
            wrong = self.fails and all(factors[k] == v for k, v in self.fails.items())
            logits[i, (label + 1) % self.num_classes if wrong else label] = 10.0
        return logits


class RecordingWorld:
    """The world, telling the planted model each generated image's label and factors."""

    def __init__(self, world, model: PlantedModel):
        self._world, self._model = world, model

    def __getattr__(self, name):
        return getattr(self._world, name)

    def generate(self, conditions, n, seed):
        split = self._world.generate(conditions, n, seed)
        for i, image in enumerate(split.load(range(len(split)))):
            self._model.seen[_key(image)] = (int(split.labels[i]),
                                             split.annotation(i)["factors"])
        return split


def planted(world, fails):
    model = PlantedModel(world.num_classes, fails)
    return model, RecordingWorld(world, model)


SMALL_SEARCH = {"factors": ("class", "face", "size"), "images_per_subdomain": 6}


def test_surrogate_search_budget_below_the_initial_subdomains_names_the_minimum(world):
    model, recording = planted(world, PLANTED)
    auditor = build_auditor("surrogate_search", SMALL_SEARCH)
    with pytest.raises(BudgetError, match="the minimum is 60 images"):
        auditor.run(model, recording, 59, seed=0)


def test_surrogate_search_equals_a_lookup_in_its_exhaustive_reference(world):
    model, recording = planted(world, PLANTED)
    auditor = build_auditor("surrogate_search", {**SMALL_SEARCH, "selection": "bo"})
    table = evaluate_every_subdomain(auditor, model, recording)
    rates = {json.dumps(r, sort_keys=True): k / n
             for r, k, n in zip(table["rows"], table["failures"], table["n"])}
    assert {k for k, v in rates.items() if v > 0} == {
        json.dumps({**PLANTED, "size": s}, sort_keys=True) for s in ("small", "medium")}
    live = build_auditor("surrogate_search", {**SMALL_SEARCH, "selection": "bo"}).run(
        model, recording, 20 * 6, seed=4)
    lookup = _one_search((auditor.grid(world), table["rows"], list(rates.values()), [], "bo", 4,
                          20))
    assert lookup["evaluated"] == live.notes["evaluated"]
    for finding in live.findings:
        assert finding.statistic == rates[json.dumps(finding.conditions, sort_keys=True)]
    # the live ranking puts the planted slice first, as the lookup's curve says at 20 subdomains
    assert live.findings[0].covers(PLANTED)
    point = lookup_curves([{**lookup, "selection": "bo", "seed": 4}], table, PLANTED, 6)[-1]
    assert point["images"] == 120 and point["rank"] == 1


def test_findings_within_a_smaller_budget_equal_a_run_with_it(world):
    model, recording = planted(world, PLANTED)
    for name, params, small, large in (
            ("surrogate_search", {**SMALL_SEARCH, "selection": "genetic"}, 90, 150),
            ("twise", {"factors": ("class", "face", "size"), "images_per_subgroup": 4, "t": 2},
             52, 88),
            ("caption_lift", {"images_per_class": 12, "images_per_description": 10,
                              "factors": ("face", "size"), "min_recurrence": 2}, 140, 180)):
        auditor = build_auditor(name, params)
        big = auditor.run(model, recording, large, seed=2)
        direct = build_auditor(name, params).run(model, recording, small, seed=2)
        within = auditor.findings_within(big, small, recording, 2)
        dump = lambda fs: sorted(json.dumps(f.to_dict(), sort_keys=True) for f in fs)  # noqa
        assert dump(within) == dump(direct.findings), name


def test_caption_lift_finds_the_planted_slice_significant_and_nothing_on_a_healthy_model(world):
    params = {"images_per_class": 24, "images_per_description": 16, "factors": ("face", "size"),
              "min_recurrence": 2}
    model, recording = planted(world, PLANTED)
    result = build_auditor("caption_lift", params).run(model, recording, 240 + 5 * 16, seed=0)
    assert result.findings == sorted(result.findings, key=lambda f: -f.statistic)
    described = [f for f in result.findings if f.conditions == PLANTED]
    assert described and described[0].statistic > 1 and described[0].low > 1
    assert all(f.conditions["class"] == "disk" for f in result.findings)
    assert all(f.low <= f.statistic <= f.high for f in result.findings)
    tested = {json.dumps(t["conditions"], sort_keys=True): t for t in result.notes["tested"]}
    planted_test = tested[json.dumps(PLANTED, sort_keys=True)]
    assert planted_test["failures"] == planted_test["n"] == 16  # every image of the slice fails
    healthy, recording = planted(world, None)
    clean = build_auditor("caption_lift", params).run(healthy, recording, 240 + 5 * 16, seed=0)
    assert clean.findings == [] and clean.notes["tested"] == []
