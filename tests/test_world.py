"""The synthetic world: deterministic, annotated truthfully, cached."""
import numpy as np
import pytest

from counteraudit.train.worlds import build_world
from counteraudit.train.worlds.synthetic import SyntheticWorld
from counteraudit.train.worlds.synthetic_images import (CLASS_NAMES, HARMONICA, SYMMETRY_TURN, SyntheticConfig,
                                                        generate, render)

CFG = SyntheticConfig(seed=5, image_size=48, num_train=200, num_val=120)


def test_same_seed_same_bits_whatever_the_worker_count():
    one = generate(CFG, "val", workers=1)
    two = generate(CFG, "val", workers=2)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
    assert one[2] == two[2]
    other = generate(SyntheticConfig(seed=6, image_size=48, num_val=120), "val", workers=1)
    assert not np.array_equal(one[0], other[0])


def test_classes_balanced_and_annotations_complete():
    images, labels, annotations = generate(CFG, "train", workers=1)
    assert images.shape == (200, 48, 48, 3) and images.dtype == np.uint8
    assert len(CLASS_NAMES) >= 10
    assert np.bincount(labels).tolist() == [20] * len(CLASS_NAMES)
    for annotation, label in zip(annotations, labels):
        assert annotation["class"] == label
        attrs = annotation["attributes"]
        for key in ("shape", "texture", "background", "size", "cx", "cy", "rotation", "clutter"):
            assert key in attrs
        x0, y0, x1, y1 = annotation["object_box"]
        assert 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48


def test_face_boxes_contain_the_drawn_faces():
    """Rendering the same attributes without the face changes pixels only inside the face box
    (and where the object, drawn over the face, covers it)."""
    _, _, annotations = generate(CFG, "val", workers=1)
    with_faces = [a for a in annotations if a["face_boxes"]]
    assert len(with_faces) >= 20
    for annotation in with_faces:
        attrs = annotation["attributes"]
        image, _ = render(attrs, CFG.image_size)
        no_face, _ = render({**attrs, "face": None}, CFG.image_size)
        changed = np.abs(image.astype(int) - no_face.astype(int)).max(-1) > 0
        x0, y0, x1, y1 = annotation["face_boxes"][0]
        inside = np.zeros_like(changed)
        inside[y0:y1, x0:x1] = True
        assert changed[inside].mean() > 0.3, "the box should be mostly face"
        assert not changed[~inside].any(), "no face pixel may lie outside its box"


def test_harmonica_is_mostly_held_at_a_face():
    _, labels, annotations = generate(SyntheticConfig(seed=1, image_size=48, num_val=400), "val", workers=1)
    harmonicas = [a for a in annotations if a["class"] == HARMONICA]
    others = [a for a in annotations if a["class"] != HARMONICA]
    harmonica_face_share = np.mean([bool(a["face_boxes"]) for a in harmonicas])
    other_face_share = np.mean([bool(a["face_boxes"]) for a in others])
    assert harmonica_face_share > 0.6 and 0.1 < other_face_share < 0.5
    for a in harmonicas:  # the object sits inside the face box: blurring faces blurs it
        if a["face_boxes"]:
            fx0, fy0, fx1, fy1 = a["face_boxes"][0]
            cx, cy = a["attributes"]["cx"], a["attributes"]["cy"]
            assert fx0 <= cx <= fx1 and fy0 <= cy <= fy1


def test_texture_randomized_keeps_shapes_and_layout():
    plain = generate(CFG, "val", workers=1)
    randomized = generate(CFG, "val", texture_randomized=True, workers=1)
    assert np.array_equal(plain[1], randomized[1])
    for a, b in zip(plain[2], randomized[2]):
        assert a["object_box"] == b["object_box"] and a["face_boxes"] == b["face_boxes"]
        assert a["attributes"]["texture"] != b["attributes"]["texture"]
    assert not np.array_equal(plain[0], randomized[0])


def test_world_is_cached_and_reused(tmp_path, capsys):
    config = {"name": "synthetic", "seed": 2, "image_size": 32, "num_train": 100, "num_val": 50}
    world = build_world(config, runs_root=tmp_path)
    first = world.split("val").images.clone()
    assert "generated" in capsys.readouterr().out
    again = build_world(config, runs_root=tmp_path).split("val")
    assert "generated" not in capsys.readouterr().out
    assert (first == again.images).all()
    assert sorted(p.name for p in world.cache_dir.iterdir() if not p.name.startswith(".")) == \
        ["config.json", "val-annotations.json", "val.npz"]


def test_train_batches_repeat_for_a_seed_and_epoch(tmp_path):
    split = build_world({"name": "synthetic", "seed": 2, "image_size": 32, "num_train": 100,
                         "num_val": 50}, runs_root=tmp_path).split("train")
    a = list(split.train_batches(32, seed=1, epoch=0))
    b = list(split.train_batches(32, seed=1, epoch=0))
    c = list(split.train_batches(32, seed=1, epoch=1))
    assert len(a) == 3 and all(x.images.shape == (32, 3, 32, 32) for x in a)
    assert all((x.images == y.images).all() and (x.labels == y.labels).all() for x, y in zip(a, b))
    assert not all((x.indices == y.indices).all() for x, y in zip(a, c))
    assert 0.0 <= float(a[0].images.min()) and float(a[0].images.max()) <= 1.0


def test_bad_world_options_are_named(tmp_path):
    with pytest.raises(ValueError, match="num_trian"):
        build_world({"name": "synthetic", "num_trian": 10}, runs_root=tmp_path)
    with pytest.raises(LookupError, match="valid world names: imagenet, synthetic"):
        build_world({"name": "imagenett"}, runs_root=tmp_path)
    with pytest.raises(ValueError, match="image_size=16"):
        SyntheticWorld(SyntheticConfig(image_size=16), cache_dir=tmp_path)


def test_a_symmetric_shape_renders_unchanged_by_its_turn_and_the_others_by_none():
    """SYMMETRY_TURN is what the renderer does: each listed shape is the same picture after its
    turn (any turn: 37 degrees), so its rotation bin cannot be read; every other shape changes
    under a quarter and a half turn."""
    _, _, annotations = generate(CFG, "val", workers=1)
    plain = {}  # one face-less, clutter-free example of each class
    for annotation in annotations:
        attrs = annotation["attributes"]
        if attrs["face"] is None:
            plain.setdefault(attrs["shape"], {**attrs, "clutter": []})
    assert set(plain) == set(CLASS_NAMES)

    def difference(attrs, degrees):
        turned = {**attrs, "rotation": attrs["rotation"] + np.radians(degrees)}
        return np.abs(render(turned, 48)[0].astype(float) - render(attrs, 48)[0].astype(float)).mean()

    for shape, attrs in plain.items():
        if shape in SYMMETRY_TURN:
            assert difference(attrs, SYMMETRY_TURN[shape] or 37) < 0.5, shape
        else:
            assert min(difference(attrs, 90), difference(attrs, 180)) > 1, shape
