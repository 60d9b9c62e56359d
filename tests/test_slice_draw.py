"""The slices suite's draw rule: a candidate has 20 to 300 val images (and, when asked, enough
training images), no flip-variant value, no rotation the image cannot show and no redundant
condition; the draw is seeded, one count or one per arity, and arity 1 comes first."""
import itertools

import numpy as np
import pytest

from counteraudit.anomalies.slice_draw import candidates, draw, factor_rows, interleaved
from counteraudit.train.core.suite import load_suite

FACTORS = ["class", "colour", "position", "size"]


def rows() -> list[dict[str, str]]:
    """1,200 images: colour follows class (class a is always red), position and size vary
    freely; 100 of each combination of class, position and size."""
    made = []
    for cls, position, size in itertools.product("abc", ["top", "left", "centre", "bottom"],
                                                 ["small", "large"]):
        colour = {"a": "red", "b": "blue", "c": "green"}[cls]
        made += [{"class": cls, "colour": colour, "position": position, "size": size}] * 50
    return made


def test_candidates_keep_the_bounds_and_leave_out_flip_variant_and_redundant_conditions():
    data = rows()
    ones = candidates(data, FACTORS, 1)
    # 400 images per class or colour, 300 per position, 600 per size: only positions fit, less left
    assert ones == [(("position", "bottom"),), (("position", "centre"),), (("position", "top"),)]
    twos = candidates(data, FACTORS, 2)
    # a class with a position or a size: 100 or 200 images; never a position left
    assert (("class", "a"), ("position", "top")) in twos
    assert (("class", "a"), ("size", "small")) in twos
    assert not any(value == "left" for key in twos for _, value in key)
    # colour with a size is as good a slice as class with a size: both kept
    assert (("colour", "red"), ("size", "small")) in twos
    threes = candidates(data, FACTORS, 3)
    assert (("class", "a"), ("position", "top"), ("size", "small")) in threes
    assert all(len(key) == 3 for key in threes)
    # {class a, colour red, position top} has the 100 images {class a, position top} has
    assert not any(dict(key).keys() >= {"class", "colour"} for key in threes)
    assert len(threes) == 2 * 3 * 3 * 2  # a class or its colour, with a position and a size


def test_a_rotation_is_a_candidate_only_on_a_class_whose_rotation_shows():
    # 1,200 images: a heart and a square (rotationally symmetric) in two rotations, two sizes
    data = [{"class": cls, "rotation": rotation, "size": size}
            for cls, rotation, size in itertools.product(["heart", "square"], ["0deg", "180deg"],
                                                         ["small", "large"])] * 150
    factors = ["class", "rotation", "size"]
    # 600 images per rotation alone is too many anyway; with a size, 300: fits, but unreadable
    twos = candidates(data, factors, 2)
    assert (("class", "heart"), ("rotation", "180deg")) in twos
    assert (("class", "square"), ("rotation", "180deg")) not in twos
    assert (("rotation", "180deg"), ("size", "small")) not in twos
    assert (("class", "square"), ("size", "small")) in twos  # the square is fine without rotation
    threes = candidates(data, factors, 3)
    assert threes == [(("class", "heart"), ("rotation", r), ("size", s))
                      for r in ("0deg", "180deg") for s in ("large", "small")]


def test_the_draw_is_seeded_arity_by_arity_and_refuses_more_than_there_are():
    data = rows()
    first = list(draw(data, FACTORS, 2, seed=31))
    assert first == list(draw(data, FACTORS, 2, seed=31))
    assert [arity for arity, _ in first] == [1, 1, 2, 2, 3, 3]
    assert first != list(draw(data, FACTORS, 2, seed=32))
    pool = candidates(data, FACTORS, 1)
    rng = np.random.default_rng(31)
    assert [key for arity, key in first if arity == 1] == [pool[i] for i in rng.choice(len(pool), 2, replace=False)]
    with pytest.raises(ValueError, match="only 3 candidate slices of arity 1"):
        list(draw(data, FACTORS, 4, seed=31))


def test_a_training_image_bound_leaves_out_the_slices_with_fewer_and_keeps_the_rest():
    val = rows()
    # the training split: as many images of each class and size, but class c only 10 times small
    train = [row for row in rows() if not (row["class"] == "c" and row["size"] == "small")]
    train += [{"class": "c", "colour": "green", "position": "top", "size": "small"}] * 10
    unbounded = candidates(val, FACTORS, 2)
    bounded = candidates(val, FACTORS, 2, train_rows=train, min_train_images=50)
    # {class c, size small} has 200 val images but 10 training images: out; so has its colour.
    # {class c, position bottom} keeps its 50 large training images: exactly the bound, in
    assert (("class", "c"), ("size", "small")) in unbounded
    assert set(unbounded) - set(bounded) == {(("class", "c"), ("size", "small")),
                                             (("colour", "green"), ("size", "small"))}
    assert (("class", "c"), ("position", "bottom")) in bounded
    # no bound without training rows asked for: the val images decide alone
    assert candidates(val, FACTORS, 2, train_rows=train) == unbounded


def test_the_draw_takes_one_count_per_arity_and_keeps_every_entry_when_they_differ():
    data = rows()
    drawn = list(draw(data, FACTORS, [2, 3, 4], seed=31))
    assert [arity for arity, _ in drawn] == [1, 1, 2, 2, 2, 3, 3, 3, 3]
    # the first arity's draw is the one a single count makes: the rng is used arity by arity
    assert drawn[:2] == list(draw(data, FACTORS, 2, seed=31))[:2]
    with pytest.raises(ValueError, match="one count or one per arity"):
        list(draw(data, FACTORS, [2, 3], seed=31))
    assert interleaved([["a1", "a2"], ["b1", "b2", "b3"], ["c1"]]) == ["a1", "b1", "c1", "a2", "b2", "b3"]


def test_a_draw_excluding_the_slices_drawn_before_never_draws_them_again():
    data = rows()
    first = [key for _, key in draw(data, FACTORS, [0, 0, 10], seed=31)]
    # the same slices written in another order of their conditions are the same slices
    written = [tuple(reversed(key)) for key in first]
    more = [key for _, key in draw(data, FACTORS, [0, 0, 10], seed=32, exclude=written)]
    assert len(more) == 10 and not set(more) & set(first)
    pool = candidates(data, FACTORS, 3)
    with pytest.raises(ValueError, match=f"only {len(pool) - 10} candidate slices of arity 3"):
        list(draw(data, FACTORS, [0, 0, len(pool)], seed=32, exclude=written))


def test_the_slices_suites_entries_are_the_two_draws_the_file_names(tmp_path):
    """slices.toml's planted slices and seeds are its two commands' output: seed 31's 8, 12 and
    12 per arity, then seed 32's 4 more of arity 3 from the candidates the first left."""
    factors, val, train = factor_rows("demo", tmp_path / "runs")
    first = list(draw(val, factors, [8, 12, 12], seed=31, train_rows=train, min_train_images=150))
    more = list(draw(val, factors, [0, 0, 4], seed=32, train_rows=train, min_train_images=150,
                     exclude=[drawn for _, drawn in first]))
    expected = {frozenset(drawn): 3100 + index for index, (_, drawn) in enumerate(first)}
    expected |= {frozenset(drawn): 3132 + index for index, (_, drawn) in enumerate(more)}
    planted = {}  # a suite stores a slice's conditions sorted by factor name
    for spec in load_suite("slices").anomalies:
        if spec.family == "planted_slice":
            planted.setdefault(frozenset(spec.params["slice"].items()), set()).add(spec.seed)
    assert planted == {drawn: {seed} for drawn, seed in expected.items()}
