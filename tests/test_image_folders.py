"""A user's folder of images replaces a seeded image set ([image_sets], train/core/image_folders.py):
the stage's sets hold exactly its pixels, its id is the hash of its content, and a bad folder is
refused when the suite is read, naming the folder or file and the fix."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from conftest import write_suite
from counteraudit.anomalies.image_sets import DETECTION, detection_set, normal_images, set_sources
from counteraudit.evaluate.reporting.page import Report
from counteraudit.explain.stage import load_image_sets, sets_for
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.train.worlds import build_world

SIDE = 32  # the tests' world
WORLD = {"name": "synthetic", "seed": 3, "image_size": SIDE, "num_train": 16, "num_val": 32}
SIZES = "[evaluate]\ndetection_images = 8\nlocalization_images = 4\n"
# a family that picks its normal images by class (not the removed one): it needs labels
MISSING = '[[anomalies]]\nname = "mc"\nfamily = "missing_class"\nparams = { class_id = 0 }\n'
# one that takes any image as normal: it does not
BACKDOOR = '[[anomalies]]\nname = "bd"\nfamily = "backdoor"\nparams = { nu = 0.3, size = 0.2 }\n'


def write_pngs(folder: Path, count: int, side: int = SIDE, seed: int = 0,
               labels: list[int] | None = None) -> np.ndarray:
    """``count`` random RGB PNGs named 0.png, 1.png, ... (the original's names), in class
    subfolders when ``labels`` are given; returns their pixels in index order."""
    pixels = np.random.default_rng(seed).integers(0, 256, (count, side, side, 3), dtype=np.uint8)
    for i, image in enumerate(pixels):
        path = folder / (str(labels[i]) if labels else "") / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path)
    return pixels


def suite_with(tmp_path: Path, image_sets: dict[str, Path], body: str = "", name: str = "folders") -> Path:
    table = "[image_sets]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in image_sets.items())
    return write_suite(tmp_path / f"{name}.toml", body=body + SIZES + table, world=WORLD)


def test_a_folder_replaces_the_detection_set_pixel_for_pixel(tmp_path, runs):
    pixels = write_pngs(tmp_path / "detection", 10)  # 10 files; m = 8: the first 8, 0.png .. 7.png
    suite = load_suite(suite_with(tmp_path, {DETECTION: tmp_path / "detection"}))
    image_set = load_image_sets(suite, runs)[DETECTION]  # what the explain stage's items read
    assert np.array_equal(image_set.images, pixels[:8])  # natural order: 2.png before 10.png
    assert image_set.tensor().shape == (8, 3, SIDE, SIDE)
    assert (image_set.labels == -1).all()  # unlabelled, and nothing here reads labels
    index = json.loads((runs / "folders" / "image_sets" / DETECTION / "index.json").read_text())
    assert index["folder"] == str(tmp_path / "detection") and index["recipe"]["source"] == "folder"
    assert index["files"] == [f"{i}.png" for i in range(8)]
    report = Report(suite=suite, methods=[], distance_name="l2", source="the suite's [evaluate] distance",
                    detection=pd.DataFrame(columns=["model", "method", "image", "score"]),
                    localization=None, tables={}, implants={}, image_sets={DETECTION: image_set})
    assert f"detection: folder {tmp_path / 'detection'}." in report.header()
    drawn = load_suite(write_suite(tmp_path / "drawn.toml", body=BACKDOOR + SIZES, world=WORLD))
    assert set_sources(drawn) == "detection, bd-abnormal: seeded draw (seed 0)"


def test_the_id_is_the_content_not_the_path(tmp_path, runs, monkeypatch):
    world = build_world(WORLD, runs_root=runs)
    write_pngs(tmp_path / "a", 8)
    monkeypatch.setenv("IMAGES", str(tmp_path))  # paths go through ${VAR} expansion
    first = detection_set(load_suite(suite_with(tmp_path, {DETECTION: "${IMAGES}/a"})), world, runs / "s")
    shutil.copytree(tmp_path / "a", tmp_path / "renamed")
    renamed = detection_set(load_suite(suite_with(tmp_path, {DETECTION: tmp_path / "renamed"})),
                            world, runs / "s")
    assert renamed.id == first.id
    image = np.asarray(Image.open(tmp_path / "renamed" / "5.png")).copy()
    image[0, 0, 0] ^= 1  # one bit of one pixel
    Image.fromarray(image).save(tmp_path / "renamed" / "5.png")
    changed = detection_set(load_suite(suite_with(tmp_path, {DETECTION: tmp_path / "renamed"})),
                            world, runs / "s")
    assert changed.id != first.id and changed.images[5, 0, 0, 0] != first.images[5, 0, 0, 0]


def test_labelled_folders_and_a_normal_folder_pick_each_models_normal_images(tmp_path, runs):
    labels = [0, 1, 0, 2, 3, 0, 1, 2]  # class 0 removed: the normal images are the others
    write_pngs(tmp_path / "detection", 8, labels=labels)
    suite = load_suite(suite_with(tmp_path, {DETECTION: tmp_path / "detection"}, MISSING + BACKDOOR))
    world = build_world(WORLD, runs_root=runs)
    sets = {DETECTION: detection_set(suite, world, runs / "s")}
    assert sets[DETECTION].labels.tolist() == labels
    name, positions = normal_images(suite, suite.model("mc"), world, sets)
    assert name == DETECTION and positions.tolist() == [1, 3, 4, 6]
    assert normal_images(suite, suite.model("bd"), world, sets)[1].tolist() == [0, 1, 2, 3]
    write_pngs(tmp_path / "unlabelled", 8)  # labels are asked only where they are read
    load_suite(suite_with(tmp_path, {DETECTION: tmp_path / "unlabelled"}, BACKDOOR))
    # the original's layout: the model's own normal folder, explained by it and the references
    write_pngs(tmp_path / "normal", 4, seed=1)
    suite = load_suite(suite_with(tmp_path, {DETECTION: tmp_path / "unlabelled",
                                             "mc-normal": tmp_path / "normal"}, MISSING))
    assert sets_for(suite, suite.model("mc")) == [DETECTION, "mc-abnormal", "mc-normal"]
    assert sets_for(suite, suite.model("reference-00")) == [DETECTION, "mc-abnormal", "mc-normal"]
    name, positions = normal_images(suite, suite.model("mc"), world, sets)
    assert name == "mc-normal" and positions.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("case", ["too-few", "wrong-size", "missing", "unknown-name", "needs-labels"])
def test_a_bad_folder_is_refused_when_the_suite_is_read(tmp_path, case):
    folder = tmp_path / "images"
    write_pngs(folder, 5 if case == "too-few" else 8, side=24 if case == "wrong-size" else SIDE)
    image_sets = {"missing": {DETECTION: tmp_path / "nowhere"},
                  "unknown-name": {"mc-abnormall": folder}}.get(case, {DETECTION: folder})
    body = MISSING if case in ("unknown-name", "needs-labels") else ""
    with pytest.raises(SuiteFileError) as caught:
        load_suite(suite_with(tmp_path, image_sets, body))
    message = str(caught.value)
    expected = {"too-few": [f"{folder} holds 5 image(s), the set needs 8", "detection_images"],
                "wrong-size": [str(folder / "0.png"), "24x24 px", f"{SIDE}x{SIDE}"],
                "missing": [f"no folder {tmp_path / 'nowhere'}"],
                "unknown-name": ["[image_sets] mc-abnormall", "did you mean 'mc-abnormal'",
                                 "detection, mc-abnormal, mc-normal"],
                "needs-labels": ["has no labels", "mc pick(s) its normal images from it by class",
                                 "[image_sets] mc-normal", "named by the class index"]}[case]
    for text in expected:
        assert text in message, message
