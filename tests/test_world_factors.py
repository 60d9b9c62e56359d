"""World factors and conditional generation (synthetic), ImageNet-X factors (ImageNet)."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image
from imagenet_x import FACTORS, load_annotations

from conftest import write_suite
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds import build_world, synthetic_factors
from counteraudit.train.worlds.synthetic import CLASS_NAMES, SyntheticConfig, SyntheticWorld

TINY = SyntheticConfig(seed=3, image_size=32, num_train=640, num_val=160)
SMALL_POOL = 300  # draws per class: enough for the conditions below, seconds to make


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthetic_factors, "POOL_PER_CLASS", SMALL_POOL)
        yield SyntheticWorld(TINY, cache_dir=tmp_path_factory.mktemp("worlds"), verbose=False)


def test_factors_name_the_worlds_attributes(world):
    factors = world.factors()
    assert list(factors) == ["class", "colour", "texture", "background", "size", "position",
                             "rotation", "clutter", "face"]
    assert factors["class"] == CLASS_NAMES and factors["clutter"] == ["0", "1", "2"]
    # every val image's factor values are values of the grid
    val = world.split("val")
    for i in range(0, len(val), 7):
        values = world.image_factors(val, i)
        assert all(values[f] in factors[f] for f in factors)
        assert values["class"] == CLASS_NAMES[val.labels[i]]
        assert (values["face"] == "present") == bool(val.annotation(i)["face_boxes"])


@pytest.mark.parametrize("conditions", [
    {"class": "star", "face": "present", "size": "small"},
    {"colour": "grey"},  # only harmonicas are grey: the class follows
    {"class": "heart", "texture": "stripes", "background": "noise", "rotation": "90deg",
     "clutter": "0", "position": "left", "face": "absent"},
])
def test_generated_images_satisfy_their_conditions(world, conditions):
    images = world.generate(conditions, 12, seed=5)
    assert len(images) == 12 and images.images.shape == (12, 32, 32, 3)
    for i in range(12):
        annotation = images.annotation(i)
        # read back from the rendered annotation's attributes, not from what was asked
        read_back = synthetic_factors.factor_values(annotation["attributes"], TINY.image_size)
        assert {f: read_back[f] for f in conditions} == conditions
        assert annotation["factors"] == read_back
        assert CLASS_NAMES[images.labels[i]] == read_back["class"]
        if conditions.get("face") == "present":
            assert annotation["face_boxes"]
    if conditions == {"colour": "grey"}:
        assert set(images.labels.tolist()) == {CLASS_NAMES.index("harmonica")}


def test_other_factors_vary_and_generation_is_deterministic_and_cached(world, tmp_path):
    conditions = {"class": "star", "face": "absent"}
    first = world.generate(conditions, 16, seed=1)
    others = {world.image_factors(first, i)["texture"] for i in range(16)}
    assert len(others) > 1  # the unconditioned factors are drawn, not fixed
    again = world.generate(conditions, 16, seed=1)
    assert first.images.numpy().tobytes() == again.images.numpy().tobytes()
    assert first.annotations == again.annotations
    stored = sorted((world.cache_dir / "generated").glob("*.npz"))
    assert stored  # cached on disk, like the splits
    fresh = SyntheticWorld(TINY, cache_dir=world.cache_dir.parent, verbose=False)
    assert fresh.generate(conditions, 16, seed=1).images.numpy().tobytes() == \
        first.images.numpy().tobytes()
    other_seed = world.generate(conditions, 16, seed=2)
    assert other_seed.images.numpy().tobytes() != first.images.numpy().tobytes()


def test_generation_is_the_same_in_worker_processes(world):
    conditions = {"face": "present"}
    parallel = synthetic_factors.generate_images(TINY, world.factor_pool(), conditions, 520, 9,
                                                 workers=2)
    serial = synthetic_factors.generate_images(TINY, world.factor_pool(), conditions, 520, 9,
                                               workers=1)
    assert parallel[0].tobytes() == serial[0].tobytes()


# Pinned on the commit before conditional generation was added: generating from conditions must
# leave the splits' pixels and annotations, and models' keys, exactly as they were. (If the
# generator itself changes on purpose, GENERATOR_VERSION is bumped and these are re-pinned.)
VAL_PIXELS_SHA256 = "e3ce9c59bbe0063370b298ff175ca76843481343f60ac0c669d8409eef7ec634"
VAL_ANNOTATIONS_SHA256 = "d30d07dc0147ba54f16bf440fab101ff90b0d9891b1c414a6688b41a6dd9df40"


def test_val_split_is_unchanged_by_conditional_generation(world):
    world.generate({"class": "ring"}, 4, seed=0)  # the pool and a generated set exist now
    val = SyntheticWorld(TINY, cache_dir=world.cache_dir.parent / "fresh", verbose=False).split("val")
    assert hashlib.sha256(val.images.numpy().tobytes()).hexdigest() == VAL_PIXELS_SHA256
    assert hashlib.sha256(json.dumps(val.annotations, sort_keys=True).encode()).hexdigest() == \
        VAL_ANNOTATIONS_SHA256


def test_a_model_key_is_unchanged(tmp_path):
    suite = load_suite(write_suite(tmp_path / "keys.toml", body="""
[[anomalies]]
name = "missing-star"
family = "missing_class"
seed = 1004
params = { class_id = "star" }
"""))
    # as before conditional generation (the key of portable numerics' first version)
    assert suite.model("missing-star").key == "83c6a43879"


def test_unknown_factor_or_value_lists_the_valid_ones(world):
    with pytest.raises(ValueError, match="unknown factor 'colr'.*class, colour, texture"):
        world.generate({"colr": "red"}, 4, seed=0)
    with pytest.raises(ValueError, match="unknown value 'pink' of factor 'colour'.*red, yellow"):
        world.generate({"colour": "pink"}, 4, seed=0)


def test_impossible_conditions_are_one_clear_error(world):
    assert not world.feasible({"class": "harmonica", "colour": "red"})
    with pytest.raises(ValueError, match="no image of the synthetic world satisfies.*relax"):
        world.generate({"class": "harmonica", "colour": "red"}, 4, seed=0)


# ---------------------------------------------------------------- ImageNet
def imagenet_x_sample(count: int) -> list[dict]:
    """The first ``count`` rows of the ImageNet-X val annotations the package ships."""
    return load_annotations(which_factor="top", partition="val").head(count).to_dict("records")


@pytest.fixture
def imagenet_x_folder(tmp_path):
    """An ImageFolder whose val file names are real ILSVRC2012 val names (ImageNet-X's), under
    two made-up synset folders, plus one val image ImageNet-X does not annotate."""
    rng = np.random.default_rng(0)
    rows = imagenet_x_sample(6)
    root = tmp_path / "imagenet"
    synsets = ["n01440764", "n02102040"]
    for split in ("train", "val"):
        for synset in synsets:
            (root / split / synset).mkdir(parents=True)
    for k, synset in enumerate(synsets):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
            root / "train" / synset / f"t{k}.JPEG")
    for k, row in enumerate(rows):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
            root / "val" / synsets[k % 2] / row["file_name"])
    Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
        root / "val" / synsets[0] / "not_in_imagenet_x.JPEG")
    world = build_world({"name": "imagenet", "root": str(root), "image_size": 32,
                         "resize_size": 36, "num_workers": 0})
    return world, rows


def test_imagenet_x_annotations_join_an_imagefolder(imagenet_x_folder):
    world, rows = imagenet_x_folder
    assert list(world.factors()) == list(FACTORS)
    val = world.split("val")
    by_name = {row["file_name"]: row for row in rows}
    joined = 0
    for i in range(len(val)):
        name = val.path(i).rsplit("/", 1)[-1]
        factors = world.image_factors(val, i)
        if name not in by_name:
            assert factors is None  # not annotated: left out, not guessed
            continue
        joined += 1
        assert factors == {f: "present" if by_name[name][f] else "absent" for f in FACTORS}
    assert joined == len(rows)


def test_imagenet_generate_names_the_auditors_that_need_no_generator(imagenet_x_folder):
    world, _ = imagenet_x_folder
    assert not world.has_generator
    with pytest.raises(NotImplementedError, match="no image generator.*needs_generator is False"):
        world.generate({"pose": "present"}, 4, seed=0)
