"""The planted-slice family relabels (or removes) exactly its seeded share of the slice's training
images and nothing else, nested across strengths; a bad slice is one clear error naming the valid
factors or values; the slices suite is the demo plus held-out models and 72 planted slices."""
import numpy as np
import pytest

from conftest import write_suite
from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.base import Verdict
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.train.train import get_args_parser, main
from counteraudit.train.worlds import build_world

WORLD = {"name": "synthetic", "seed": 4, "image_size": 32, "num_train": 300, "num_val": 200}
GREY = {"colour": "grey"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(WORLD, runs_root=tmp_path_factory.mktemp("runs"))


def planted(world, **params):
    cls = FAMILIES.get("planted_slice")
    return cls(cls.validate_params(params), world, seed=3)


def grey_positions(world, split) -> np.ndarray:
    return np.array([i for i in range(len(split)) if world.image_factors(split, i)["colour"] == "grey"])


def test_relabels_exactly_the_seeded_share_of_the_slice_with_other_classes(world):
    train = world.split("train")
    inside = grey_positions(world, train)
    assert len(inside) >= 20
    relabeled = {s: planted(world, slice=GREY, strength=s).training_split(train).labels
                 for s in (0.5, 1.0)}
    changed = {s: np.flatnonzero(labels != train.labels) for s, labels in relabeled.items()}
    assert len(changed[0.5]) == round(0.5 * len(inside)) and np.array_equal(changed[1.0], inside)
    assert set(changed[0.5]) < set(changed[1.0])  # nested: a larger strength, a superset
    shared = changed[0.5]
    assert np.array_equal(relabeled[0.5][shared], relabeled[1.0][shared])  # the same new classes
    # one shift for the whole slice: every relabelled image's class moved by the same offset
    shifts = np.unique((relabeled[1.0][inside] - train.labels[inside]) % world.num_classes)
    assert len(shifts) == 1 and shifts[0] != 0
    again = planted(world, slice=GREY, strength=0.5).training_split(train).labels
    assert np.array_equal(again, relabeled[0.5])  # seeded
    # relabel_uniform: each image its own other class, drawn among several
    uniform = planted(world, slice=GREY, strength=1.0, mechanism="relabel_uniform")
    moved = (uniform.training_split(train).labels[inside] - train.labels[inside]) % world.num_classes
    assert 0 not in moved and len(np.unique(moved)) > 3
    # relabel_one: one class for the whole slice, whatever each image's own (a slice spanning
    # several classes gets no per-class exceptions); the images the shift chooses, and seeded
    stripes = {"texture": "stripes"}
    assert len(np.unique(train.labels[planted(world, slice=stripes).in_slice(train)])) > 1
    for strength in (0.5, 1.0):
        one = planted(world, slice=stripes, strength=strength, mechanism="relabel_one")
        chosen, targets = one.affected(train)
        shift = planted(world, slice=stripes, strength=strength).affected(train)[0]
        assert np.array_equal(chosen, shift) and len(np.unique(targets)) == 1
        labels = one.training_split(train).labels
        assert np.array_equal(labels[chosen], targets)
        assert np.array_equal(np.delete(labels, chosen), np.delete(train.labels, chosen))
    # never the slice's own class (the plain draw, rng.integers(C), collides at one of these seeds)
    square = {"class": "square"}
    for seed in range(40):
        cls = FAMILIES.get("planted_slice")
        one = cls(cls.validate_params({"slice": square, "mechanism": "relabel_one"}), world, seed)
        chosen, targets = one.affected(train)
        assert (targets != train.labels[chosen]).all(), seed


def test_repeat_shows_each_affected_image_that_many_times_with_its_new_label(world):
    train = world.split("train")
    once = planted(world, slice=GREY, strength=0.5).training_split(train)
    thrice = planted(world, slice=GREY, strength=0.5, repeat=3).training_split(train)
    affected = np.flatnonzero(once.labels != train.labels)
    assert len(thrice) == len(train) + 2 * len(affected)
    # the first len(train) positions are the split as repeat = 1 gives it, image for image
    assert np.array_equal(thrice.labels[:len(train)], once.labels)
    assert np.array_equal(thrice.load(np.arange(len(train))), train.load(np.arange(len(train))))
    # the extra positions are the affected images, twice each, with their new classes only
    extra = np.arange(len(train), len(thrice))
    images, originals = thrice.load(extra), train.load(affected)
    matches = [int(np.flatnonzero([(images[i] == original).all() for original in originals])[0])
               for i in range(len(extra))]
    assert sorted(matches) == sorted(list(range(len(affected))) * 2)
    assert np.array_equal(thrice.labels[extra], once.labels[affected][matches])
    assert not np.any(thrice.labels[extra] == train.labels[affected][matches])


def test_contrast_repeats_the_near_misses_with_their_own_labels(world):
    train = world.split("train")
    first = world.image_factors(train, 0)
    pair = {"colour": first["colour"], "size": first["size"]}
    family = planted(world, slice=pair, repeat=3, contrast=True)
    met = np.array([sum(world.image_factors(train, i)[f] == v for f, v in pair.items())
                    for i in range(len(train))])
    near, affected = np.flatnonzero(met == 1), family.affected(train)[0]
    assert len(near) > 0 and np.array_equal(family.near_misses(train), near)
    shown = family.training_split(train)
    assert len(shown) == len(train) + 2 * (len(affected) + len(near))
    # the near misses' repeats carry their true classes: only the whole conjunction is shifted
    labels = shown.labels[len(train):]
    true_near = np.tile(np.concatenate([np.full(len(affected), -1), train.labels[near]]), 2)
    assert np.array_equal(labels[true_near >= 0], true_near[true_near >= 0])
    with pytest.raises(ValueError, match="a slice of one factor has no near misses"):
        planted(world, slice=GREY, repeat=2, contrast=True)
    with pytest.raises(ValueError, match="contrast = true with repeat = 1"):
        planted(world, slice=pair, contrast=True)


def test_repeat_one_keeps_the_key_and_bad_repeats_are_one_error(world):
    cls = FAMILIES.get("planted_slice")
    assert cls.validate_params({"slice": GREY}) == cls.validate_params({"slice": GREY, "repeat": 1})
    assert "repeat" not in cls.validate_params({"slice": GREY})  # models trained before it keep their keys
    assert cls.validate_params({"slice": GREY, "repeat": 4})["repeat"] == 4
    for bad, message in ((0, "repeat=0 must be a whole number >= 1"), (-1, "repeat=-1 must be"),
                         (2.5, "repeat = 2.5 must be a whole number"),
                         (True, "repeat = true must be a whole number")):
        with pytest.raises(ValueError, match=message):
            cls.validate_params({"slice": GREY, "repeat": bad})
    with pytest.raises(ValueError, match="nothing to repeat"):
        cls.validate_params({"slice": GREY, "repeat": 2, "mechanism": "remove"})


def test_a_slice_the_training_flip_changes_is_refused(world):
    with pytest.raises(ValueError, match="position = 'left' changes under the training's random "
                                         "left-right flip.*position centre, top or bottom"):
        planted(world, slice={"class": "disk", "position": "left"})
    planted(world, slice={"position": "top"})  # kept by the flip


def test_a_rotation_the_image_cannot_show_is_refused(world):
    for unreadable in ({"rotation": "180deg"}, {"colour": "green", "rotation": "0deg"},
                       {"class": "square", "rotation": "180deg"}):
        with pytest.raises(ValueError, match=r"rotation = '\w+' cannot be seen on a disk, ring, "
                                             r"square, cross, star, harmonica.*fix class to one of "
                                             r"triangle, crescent, heart, arrow"):
            planted(world, slice=unreadable)
    planted(world, slice={"class": "heart", "rotation": "180deg"})  # a heart shows its rotation


def test_remove_drops_the_share_and_the_pools_split_val_at_the_slice(world):
    train, val = world.split("train"), world.split("val")
    inside = grey_positions(world, train)
    family = planted(world, slice=GREY, strength=0.5, mechanism="remove")
    kept = family.training_split(train)
    assert len(kept) == len(train) - round(0.5 * len(inside))
    assert len(grey_positions(world, kept)) == len(inside) - round(0.5 * len(inside))
    abnormal, normal = family.abnormal_pool(val), family.normal_pool(val)
    assert np.array_equal(abnormal, grey_positions(world, val))
    assert np.array_equal(np.sort(np.concatenate([abnormal, normal])), np.arange(len(val)))
    assert family.planted_slice() == {"colour": "grey"}


def test_the_implant_took_only_when_the_slice_fails_and_the_rest_holds(world):
    family = planted(world, slice=GREY)
    refs = [{"slice_accuracy": 0.8, "off_slice_accuracy": 0.8}] * 2
    verdict = family.judge({"slice_accuracy": 0.1, "off_slice_accuracy": 0.78}, refs)
    assert isinstance(verdict, Verdict) and verdict.passed
    assert not family.judge({"slice_accuracy": 0.6, "off_slice_accuracy": 0.8}, refs).passed
    assert not family.judge({"slice_accuracy": 0.1, "off_slice_accuracy": 0.7}, refs).passed


@pytest.mark.parametrize("slice_,message", [
    ({"color": "grey"}, "unknown factor 'color'; this world's factors: class, colour, texture"),
    ({"colour": "pink"}, "unknown value 'pink' of factor 'colour'; valid values: red, yellow"),
    ({}, "names 0 factors; a slice names 1 to 3 of the world's 9 factors"),
    ({"colour": "grey", "size": "small", "face": "present", "clutter": 1}, "names 4 factors; a slice names 1 to 3"),
])
def test_a_bad_slice_is_one_error_when_the_suite_loads(tmp_path, slice_, message):
    table = ", ".join(f'{k} = "{v}"' for k, v in slice_.items())
    suite = write_suite(tmp_path / "bad.toml", f'[[anomalies]]\nname = "s"\nfamily = "planted_slice"\n'
                                               f'params = {{ slice = {{ {table} }} }}\n')
    with pytest.raises(SuiteFileError, match=r"\[\[anomalies\]\] entry 1 \(s\) params: planted_slice "
                                             r"params slice") as error:
        load_suite(suite)
    assert message in str(error.value)


def test_errors_known_only_when_the_world_is_built(world):
    # stars are never grey in the synthetic world: no val image, nothing to check the implant on
    with pytest.raises(ValueError, match=r"slice = \{'class': 'star', 'colour': 'grey'\}: no val image"):
        planted(world, slice={"class": "star", "colour": "grey"})
    # clutter's bound is the [world]'s clutter_max (2 here), not known when a suite loads
    with pytest.raises(ValueError, match="unknown value '7' of factor 'clutter'; valid values: 0, 1, 2"):
        planted(world, slice={"clutter": 7})
    with pytest.raises(ValueError, match="needs a world whose training images carry their factors"):
        FAMILIES.get("planted_slice").check_world({"slice": GREY}, "imagenet", None)


def test_a_slice_without_val_images_fails_before_any_model_trains(tmp_path):
    suite = write_suite(tmp_path / "empty.toml", '[[anomalies]]\nname = "s"\nfamily = "planted_slice"\n'
                                                 'params = { slice = { class = "star", colour = "grey" } }\n')
    runs = tmp_path / "runs"
    args = get_args_parser().parse_args(["--suite", str(suite), "--runs-dir", str(runs),
                                         "--no-progress", "--jobs", "1"])
    with pytest.raises(ValueError, match="no val image of the world is in this slice"):
        main(args)
    assert not list(runs.glob("store/models/*")), "nothing was trained"


def test_the_slices_suite_is_the_demo_with_held_out_models_and_72_planted_slices():
    demo, slices = load_suite("demo"), load_suite("slices")
    assert [s.key for s in slices.references] == [s.key for s in demo.references]
    assert [s.key for s in slices.anomalies[:len(demo.anomalies)]] == [s.key for s in demo.anomalies]
    assert len(slices.held_out) == 8
    planted_models = [s for s in slices.anomalies if s.family == "planted_slice"]
    assert len(planted_models) == 72
    assert {s.params["strength"] for s in planted_models} == {0.75, 1.0}
    # one seed per slice, shared by its two strengths (so they nest); 8, 12 and 16 per arity
    by_slice = {}
    for spec in planted_models:
        by_slice.setdefault(tuple(spec.params["slice"].items()), set()).add(spec.seed)
    assert len(by_slice) == 36 and all(len(seeds) == 1 for seeds in by_slice.values())
    assert sorted(len(conditions) for conditions in by_slice) == [1] * 8 + [2] * 12 + [3] * 16
    # arity 1 with the family's defaults; conjunctions relabelled to one class, shown 4 times
    for spec in planted_models:
        conjunction = len(spec.params["slice"]) > 1
        assert spec.params["mechanism"] == ("relabel_one" if conjunction else "relabel")
        # repeat and contrast are stored only where they are not the defaults (keys unchanged)
        assert spec.params.get("repeat", 1) == (4 if conjunction else 1)
        assert not spec.params.get("contrast", False)
