"""The ImageNet world on a tiny ImageFolder tree generated here (no ImageNet needed)."""
import json

import numpy as np
import pytest
from PIL import Image

from counteraudit.train.worlds import build_world

SYNSETS = ["n01440764", "n02102040", "n02979186"]


@pytest.fixture
def imagefolder(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "imagenet"
    for split, count in (("train", 4), ("val", 2)):
        for synset in SYNSETS:
            folder = root / split / synset
            folder.mkdir(parents=True)
            for i in range(count):
                size = (int(rng.integers(60, 90)), int(rng.integers(60, 90)))
                Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
                    folder / f"{split}_{synset}_{i}.JPEG", format="JPEG")
    (tmp_path / "synsets.txt").write_text("\n".join(
        f"{s} {name}, other" for s, name in zip(SYNSETS, ["tench", "English springer", "cassette player"])))
    # one face in the first val image of the second class: 80x60 box at the image's top left
    first = sorted((root / "val" / SYNSETS[1]).iterdir())[0]
    (tmp_path / "faces.json").write_text(json.dumps(
        {f"val/{SYNSETS[1]}/{first.name}": [[0, 0, 20, 15]]}))
    return tmp_path


def _world(base, **extra):
    return build_world({"name": "imagenet", "root": str(base / "imagenet"), "image_size": 32,
                        "resize_size": 40, "num_workers": 0, **extra})


def test_classes_labels_and_eval_transform(imagefolder):
    world = _world(imagefolder, class_names_file=str(imagefolder / "synsets.txt"))
    assert world.class_names == ["tench", "English springer", "cassette player"]
    val = world.split("val")
    assert len(val) == 6 and val.labels.tolist() == [0, 0, 1, 1, 2, 2]
    images = val.load([0, 3])
    assert images.shape == (2, 3, 32, 32) and 0 <= float(images.min()) <= float(images.max()) <= 1
    assert (val.load([3]) == images[1:]).all()  # eval transform is deterministic


def test_train_batches_are_seeded_and_cropped(imagefolder):
    train = _world(imagefolder).split("train")
    a = list(train.train_batches(4, seed=0, epoch=0))
    b = list(train.train_batches(4, seed=0, epoch=0))
    assert len(a) == 3 and a[0].images.shape == (4, 3, 32, 32)
    assert all((x.images == y.images).all() and (x.indices == y.indices).all() for x, y in zip(a, b))


def test_face_boxes_follow_the_eval_transform(imagefolder):
    world = _world(imagefolder, face_annotations=str(imagefolder / "faces.json"))
    val = world.split("val")
    faces = val.face_indices().tolist()
    assert faces == [2]
    annotation = val.annotation(2)
    assert annotation["face_boxes_original"] == [[0, 0, 20, 15]]
    with Image.open(imagefolder / "imagenet" / annotation["path"]) as image:
        width, height = image.size
    scale = 40 / min(width, height)
    left, top = (round(width * scale) - 32) / 2, (round(height * scale) - 32) / 2
    x0, y0, x1, y1 = annotation["face_boxes"][0]
    assert x0 == max(0, int(np.floor(-left))) and x1 == int(np.ceil(20 * scale - left))
    assert y0 == max(0, int(np.floor(-top))) and y1 == int(np.ceil(15 * scale - top))


def test_missing_root_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        build_world({"name": "imagenet", "root": str(tmp_path / "nowhere")})
    with pytest.raises(ValueError, match="needs root"):
        build_world({"name": "imagenet"})


def test_bad_face_file_is_reported(imagefolder):
    (imagefolder / "bad.json").write_text(json.dumps({"val/x.JPEG": [[5, 5, 2, 2]]}))
    with pytest.raises(ValueError, match=r"\[5, 5, 2, 2\]"):
        _world(imagefolder, face_annotations=str(imagefolder / "bad.json"))
