"""Budgeted failure search (selection functions, surrogate_search, its exhaustive reference) and
caption_lift. Toy objectives where the search itself is tested; a tiny world where the auditors
are, with a model whose failures are planted (it fails exactly on one slice)."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import torch
from statsmodels.stats.multitest import multipletests

from counteraudit.evaluate.discovery.auditors import BudgetError, build_auditor
from counteraudit.evaluate.discovery.auditors.base import conditions_key
from counteraudit.evaluate.discovery.auditors.caption_lift import (benjamini_hochberg, description_tests,
                                                                   recurring_descriptions)
from counteraudit.evaluate.discovery.budget_curves import lookup_curves
from counteraudit.evaluate.discovery.covering_arrays import covering_array
from counteraudit.evaluate.discovery.exhaustive import _one_search, evaluate_every_subdomain
from counteraudit.evaluate.discovery.selection import (SELECTIONS, BayesianRidgeSelection,
                                                       BudgetBelowInitial, LassoBootstrapSelection,
                                                       Subdomains, search, surrogate_spearman)
from counteraudit.train.core.registry import UnknownNameError
from counteraudit.train.worlds import synthetic_factors
from counteraudit.train.worlds.synthetic import SyntheticConfig, SyntheticWorld
from counteraudit.train.worlds.synthetic_images import InMemorySplit

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


UNSEEN_GRID = {"class": [str(k) for k in range(10)], "face": ["present", "absent"],
               "size": ["s", "m", "l"]}   # 60 subdomains


def unseen_class_objective():
    """Failure rates with effects of face = absent and size = l, and class 9 far the worst."""
    subdomains = Subdomains(UNSEEN_GRID)
    rates = 0.05 + 0.05 * np.random.default_rng(0).random(len(subdomains))
    for i, row in enumerate(subdomains.rows):
        rates[i] += (0.2 * (row["face"] == "absent") + 0.1 * (row["size"] == "l")
                     + 0.6 * (row["class"] == "9"))
    return subdomains, rates


def test_bo_surrogate_is_more_uncertain_on_a_class_it_has_not_seen():
    subdomains, rates = unseen_class_objective()
    classes = np.array([row["class"] for row in subdomains.rows])
    seen = np.flatnonzero(classes != "9")[::2]   # every class but 9, each face and size
    unseen, twin = np.flatnonzero(classes == "9"), np.flatnonzero(classes == "0")  # same order
    features, rng = subdomains.onehot, np.random.default_rng(0)
    candidates = features[np.concatenate([unseen, twin])]
    _, std = BayesianRidgeSelection(subdomains, 0).surrogate(features[seen], rates[seen],
                                                             candidates, rng)
    assert (std[:len(unseen)] > std[len(unseen):]).all()  # each against its class-0 twin
    # the seed's bootstrap of Lassos: an unseen level's coefficient is 0 in every Lasso, so the
    # class adds no spread (what kept bo_lasso_bootstrap from exploring it)
    _, lasso_std = LassoBootstrapSelection(subdomains, 0).surrogate(features[seen], rates[seen],
                                                                    candidates, rng)
    assert (lasso_std[:len(unseen)] <= lasso_std[len(unseen):] + 1e-12).all()


def test_bo_explores_an_unseen_worst_class_within_a_few_steps():
    subdomains, rates = unseen_class_objective()
    in_class_9 = {i for i, row in enumerate(subdomains.rows) if row["class"] == "9"}
    seeds = [s for s in range(12)   # searches whose 10 random subdomains miss class 9
             if not in_class_9 & set(search(subdomains, lambda i: rates[i], "random", 10,
                                            s).evaluated)][:5]
    assert len(seeds) == 5
    for seed in seeds:
        bo = search(subdomains, lambda i: rates[i], "bo", 15, seed).evaluated[10:]
        assert in_class_9 & set(bo), f"seed {seed}: bo did not try class 9 in 5 steps"
        lasso = search(subdomains, lambda i: rates[i], "bo_lasso_bootstrap", 15, seed).evaluated
        assert not in_class_9 & set(lasso), f"seed {seed}: the Lasso found it (test too easy)"


def test_surrogate_spearman_is_measured_on_the_subdomains_not_evaluated():
    subdomains, rates = unseen_class_objective()
    evaluated = list(range(0, 60, 3))
    truth = rates.copy()
    # scrambling the evaluated subdomains' true scores (not the ones fitted) changes nothing
    truth[evaluated] = truth[evaluated][::-1]
    for surrogate in ("lasso", "bayesian_ridge"):
        held_out = surrogate_spearman(surrogate, subdomains, evaluated, list(rates[evaluated]),
                                      rates)
        assert held_out == surrogate_spearman(surrogate, subdomains, evaluated,
                                              list(rates[evaluated]), truth)
        assert 0.5 < held_out <= 1


def test_nwise_starts_with_the_rows_of_a_pairwise_covering_array():
    subdomains, rates = toy_objective()
    rows = covering_array(TOY_GRID, 2, seed=3)
    state = search(subdomains, lambda i: rates[i], "nwise", 10 + len(rows), seed=3)
    covered = {json.dumps(subdomains.rows[i], sort_keys=True) for i in state.evaluated}
    assert all(json.dumps(r, sort_keys=True) in covered for r in rows)


def test_unknown_selection_function_lists_the_valid_ones():
    with pytest.raises(UnknownNameError,
                       match="'annealing'.*bo, bo_lasso_bootstrap, genetic, nwise, random"):
        build_auditor("surrogate_search", {"selection": "annealing"})
    subdomains, rates = toy_objective()
    with pytest.raises(UnknownNameError, match="bo, bo_lasso_bootstrap, genetic, nwise, random"):
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
    # numpy: torch's per-image round costs milliseconds on a busy 2-core machine
    return np.rint(image.numpy() * 255).astype(np.uint8).tobytes()


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
                              "captioner": "partial", "described_factors": ("face", "size"),
                              "min_recurrence": 2}, 140, 180)):
        auditor = build_auditor(name, params)
        big = auditor.run(model, recording, large, seed=2)
        direct = build_auditor(name, params).run(model, recording, small, seed=2)
        within = auditor.findings_within(big, small, recording, 2)
        dump = lambda fs: sorted(json.dumps(f.to_dict(), sort_keys=True) for f in fs)  # noqa
        assert dump(within) == dump(direct.findings), name


class NoiseWorld:
    """A world whose factors do nothing: 2x2-pixel images with the class index in the first
    pixel and the factors drawn uniformly (those the conditions fix, fixed), seeded by the
    conditions and seed like a real world's generator."""
    class_names = ["a", "b", "c", "d"]
    num_classes = 4
    grid = {"class": class_names, "f": ["0", "1", "2"], "g": ["0", "1", "2"], "h": ["0", "1"]}

    def factors(self):
        return {k: list(v) for k, v in self.grid.items()}

    def feasible(self, conditions):
        return True

    def generate(self, conditions, n, seed):
        rng = np.random.default_rng([seed, zlib.crc32(conditions_key(conditions).encode())])
        annotations = [{"factors": {k: conditions.get(k, str(rng.choice(v)))
                                    for k, v in self.grid.items()}} for _ in range(n)]
        labels = np.array([self.class_names.index(a["factors"]["class"]) for a in annotations])
        images = rng.integers(0, 256, (n, 2, 2, 3), dtype=np.uint8)
        images[:, 0, 0, 0] = labels
        return InMemorySplit(images, labels, annotations, hflip=False)


class UniformErrors(torch.nn.Module):
    """Reads the class from the first pixel and errs on a fraction ``error_rate`` of images of
    every class, toward a uniformly drawn other class, whatever the factors (seeded): noise."""

    def __init__(self, num_classes: int, error_rate: float, seed: int):
        super().__init__()
        self.num_classes, self.error_rate = num_classes, error_rate
        self.generator = torch.Generator().manual_seed(seed)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # predict() reads the device from it

    def forward(self, images):
        labels = images[:, 0, 0, 0].mul(255).round().long()
        wrong = torch.rand(len(images), generator=self.generator) < self.error_rate
        shift = torch.randint(1, self.num_classes, (len(images),), generator=self.generator)
        predicted = torch.where(wrong, (labels + shift) % self.num_classes, labels)
        return torch.nn.functional.one_hot(predicted, self.num_classes).float() * 10


def test_caption_lift_eq1_and_eq2_equal_hand_computed_values():
    base = np.array([0, 0, 0, 0, 1, 1, 2, 0, 0, 0])   # class 0: 3 failures in 10, 2 toward class 1
    described = np.array([1, 1, 1, 2, 0])            # 4 failures in 5, 3 toward class 1
    eq1, eq2 = description_tests({"class": "a", "face": "x"}, described, base, 0, {1: "b"})
    assert (eq1["objective"], eq2["objective"]) == ("lift", "target_lift:b")
    assert (eq1["failures"], eq1["n"], eq1["baseline_failures"], eq1["baseline_n"]) == (4, 5, 3, 10)
    assert (eq2["failures"], eq2["baseline_failures"]) == (3, 2)
    # the paper's ratios: Eq. 1 (4/5) / (3/10), Eq. 2 (3/5) / (2/10)
    assert eq1["raw_lift"] == pytest.approx(8 / 3) and eq2["raw_lift"] == pytest.approx(3.0)
    # the statistic adds half a count to each cell: (4.5/6) / (3.5/11) and (3.5/6) / (2.5/11)
    assert eq1["lift"] == pytest.approx(4.5 / 6 / (3.5 / 11))
    assert eq2["lift"] == pytest.approx(3.5 / 6 / (2.5 / 11))
    # Fisher, one-sided: P(X >= 4), X hypergeometric (15 images, 7 failures, 5 drawn)
    assert eq1["p_value"] == pytest.approx((35 * 8 + 21) / 3003)
    # ... and P(X >= 3) with 5 images toward class 1 of 15, 5 drawn
    assert eq2["p_value"] == pytest.approx((10 * 45 + 5 * 10 + 1) / 3003)
    assert eq1["interval"][0] <= eq1["lift"] <= eq1["interval"][1]
    # a baseline without a failure toward the target: the plain ratio is infinite, ours finite
    _, toward_2 = description_tests({"class": "a"}, np.array([2, 0]), np.zeros(10, int), 0, {2: "c"})
    assert toward_2["raw_lift"] is None and toward_2["lift"] == pytest.approx(1.5 / 3 / (0.5 / 11))


CAPTION_PARAMS = {"images_per_class": 24, "images_per_description": 16, "min_recurrence": 2}


def test_caption_lift_finds_the_planted_slice_on_fresh_images(world):
    model, recording = planted(world, PLANTED)
    result = build_auditor("caption_lift", CAPTION_PARAMS).run(model, recording, 240 + 5 * 16,
                                                               seed=0)
    captioner = result.notes["captioner"]  # by default: every factor, no wrong sentence
    assert captioner["factors"] == [f for f in world.factors() if f != "class"]
    assert captioner["wrong_sentences"] == 0 and captioner["sentences"] > 0
    main = [f for f in result.findings if f.objective == "lift"]
    assert main == sorted(main, key=lambda f: -f.statistic)
    described = [f for f in main if f.conditions == PLANTED]
    assert described and described[0].statistic > 1 and described[0].low > 1
    toward = [f for f in result.findings if f.objective == "target_lift:square"]  # disk -> next
    assert PLANTED in [f.conditions for f in toward]
    assert all(f.conditions["class"] == "disk" for f in result.findings)
    assert all(f.low <= f.statistic <= f.high for f in result.findings)
    tested = {(conditions_key(t["conditions"]), t["objective"]): t for t in result.notes["tested"]}
    planted_test = tested[(conditions_key(PLANTED), "lift")]
    assert planted_test["failures"] == planted_test["n"] == 16  # every image of the slice fails
    # the descriptions' images are fresh: none is one of the baseline images they came from
    baseline = {_key(image) for s in result.subgroups if len(s.conditions) == 1
                for image in world.generate(s.conditions, s.n, s.seed).load(range(s.n))}
    fresh = [_key(image) for s in result.subgroups if len(s.conditions) > 1
             for image in world.generate(s.conditions, s.n, s.seed).load(range(s.n))]
    assert fresh and not baseline.intersection(fresh)
    # reevaluated, the same model gives its own statistics; a healthy one no lift at the slice
    again = build_auditor("caption_lift", CAPTION_PARAMS).reevaluate(model, recording, result)
    assert [(f.conditions, f.objective, f.statistic) for f in again] == \
        [(f.conditions, f.objective, f.statistic) for f in result.findings]
    healthy, recording = planted(world, None)
    other = build_auditor("caption_lift", CAPTION_PARAMS).reevaluate(healthy, recording, result)
    assert [f.objective for f in other] == [f.objective for f in result.findings]
    # no failure anywhere: (0.5 / 17) / (0.5 / 25), the half counts over 16 and 24 images
    assert all(f.statistic == pytest.approx(25 / 17) for f in other)


NOISE_PARAMS = {"images_per_class": 100, "images_per_description": 60, "descriptions": 40}


def test_caption_lift_flags_nothing_on_a_model_that_errs_uniformly():
    """FDR control: a model wrong on 30% of every class, whatever the image shows. Some raw
    p-values fall below the level (without BH they would be findings); BH keeps none."""
    noise, small_p = NoiseWorld(), 0
    for seed in range(3):
        result = build_auditor("caption_lift", NOISE_PARAMS).run(
            UniformErrors(4, 0.3, seed), noise, 400 + 40 * 60, seed=seed)
        assert result.findings == [], seed
        assert len(result.notes["tested"]) >= 40  # descriptions of the noise were tested
        small_p += sum(t["p_value"] < 0.05 for t in result.notes["tested"])
    assert small_p >= 1


def test_caption_lift_refuses_a_captioner_it_cannot_run(world):
    with pytest.raises(ValueError, match="captioner='partial' needs described_factors"):
        build_auditor("caption_lift", {"captioner": "partial"})
    with pytest.raises(ValueError, match="captioner='poet'; valid: all, partial"):
        build_auditor("caption_lift", {"captioner": "poet"})
    with pytest.raises(ValueError, match="caption_noise=1.0 must be in \\[0, 1\\)"):
        build_auditor("caption_lift", {"caption_noise": 1.0})
    model, recording = planted(world, PLANTED)
    auditor = build_auditor("caption_lift", {"captioner": "partial", "described_factors": ["hat"]})
    with pytest.raises(ValueError, match="'hat'.*besides the class: colour, texture"):
        auditor.run(model, recording, 1000, seed=0)
    assert model.seen == {}  # refused before any image was generated


def test_a_noisy_partial_captioner_is_declared_and_still_finds_the_slice(world):
    model, recording = planted(world, PLANTED)
    params = {**CAPTION_PARAMS, "captioner": "partial", "described_factors": ["face", "size"],
              "caption_noise": 0.2}
    result = build_auditor("caption_lift", params).run(model, recording, 240 + 5 * 16, seed=0)
    captioner = result.notes["captioner"]
    assert (captioner["kind"], captioner["factors"], captioner["noise"]) == \
        ("partial", ["face", "size"], 0.2)
    # about a fifth of the sentences name a wrong value (binomial: 3 sd either side)
    sentences = captioner["sentences"]
    assert sentences > 0 and abs(captioner["wrong_sentences"] - 0.2 * sentences) <= \
        3 * (0.16 * sentences) ** 0.5
    # the greedy caption follows the majority: a fifth of wrong sentences leave the slice found
    assert PLANTED in [f.conditions for f in result.findings if f.objective == "lift"]


def test_surrogate_search_rescores_its_own_subdomains_on_another_model(world):
    model, recording = planted(world, PLANTED)
    auditor = build_auditor("surrogate_search", SMALL_SEARCH)
    assert auditor.adaptive  # the subdomains searched depend on the model
    result = auditor.run(model, recording, 20 * 6, seed=4)  # it finds the slice (test above)
    dump = lambda fs: sorted(json.dumps(f.to_dict(), sort_keys=True) for f in fs)  # noqa: E731
    # the same model on the recorded subdomains and images: the same findings
    assert dump(auditor.reevaluate(model, recording, result)) == dump(result.findings)
    # a healthy model on this model's subdomains: the same conditions, no failure
    healthy, healthy_world = planted(world, None)
    rescored = auditor.reevaluate(healthy, healthy_world, result)
    assert [f.conditions for f in rescored] == [s.conditions for s in result.subgroups]
    assert all(f.statistic == 0 for f in rescored) and result.findings[0].statistic > 0
