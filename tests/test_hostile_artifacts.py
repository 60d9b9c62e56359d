"""Every artifact the tool reads back is verified one way (train/core/keyed_store.py,
train/core/payloads.py): a marker of any shape, a truncated or pickled .npz in the world's cache,
an image set, a visualization, findings: each is named, set aside and recomputed, with no
traceback and nothing outside its folder touched. And a user's image folder is decoded whole when
the suite is read (train/core/image_files.py): a bomb, a corrupt and a truncated file are one line
each in one error, and a 16-bit PNG is read with its samples scaled to 8 bits, not clipped white."""
from __future__ import annotations

import argparse
import hashlib
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import write_suite
from counteraudit.anomalies.image_sets import IMAGE_SET, detection_set
from counteraudit.evaluate.discovery.covering_arrays import cached_covering_array, cached_feasible_tuples
from counteraudit.evaluate.discovery.stage import FINDINGS_STORE
from counteraudit.explain.base import Explanation
from counteraudit.explain.store import VISUALIZATION, is_stored, load_explanation, save_explanation
from counteraudit.train.checkpoint import TRAINED_MODEL, is_trained, save_trained_model
from counteraudit.train.core.artifacts import atomic_write_json, file_sha256
from counteraudit.train.core.image_folders import DETECTION
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.train.worlds import build_world, decoding
from counteraudit.train.worlds.synthetic_images import cached_images

SIDE = 32
WORLD = {"name": "synthetic", "seed": 3, "image_size": SIDE, "num_train": 16, "num_val": 24}
SIZES = "[evaluate]\ndetection_images = 8\nlocalization_images = 4\n"


def listing(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256 (what must not change)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def object_npz(path: Path, **arrays) -> None:
    """A planted .npz holding a Python object (only unpickling reads it)."""
    np.savez(path, **arrays, planted=np.array([{"runs": "code"}], dtype=object))


def rerecord(marker: Path, field: str, payload: Path) -> None:
    """The marker's digest made to match a planted payload: only the content check is left."""
    record = json.loads(marker.read_text())
    record[field] = file_sha256(payload)
    atomic_write_json(marker, record)


# ---------------------------------------------------------------- markers of any shape
CRAFTED = {"digest-a-number": lambda r: {**r, "weights_sha256": 5},
           "digest-not-hex": lambda r: {**r, "weights_sha256": "x" * 64},
           "digest-null": lambda r: {**r, "weights_sha256": None},
           "a-list": lambda r: [r],
           "a-string": lambda r: "metrics",
           "no-accuracy": lambda r: {k: v for k, v in r.items() if k != "val_accuracy"},
           "key-a-dict": lambda r: {**r, "key": {"a": 1}}}


@pytest.mark.parametrize("craft", CRAFTED)
def test_a_crafted_model_marker_is_set_aside_before_anything_moves(tmp_path, capsys, craft):
    directory = tmp_path / "models" / "k"
    save_trained_model(directory, torch.nn.Linear(2, 2),
                       {"key": "k", "name": "m", "family": "reference", "val_accuracy": 0.5})
    weights = (directory / "weights.pth").read_bytes()
    marker = TRAINED_MODEL.marker_path(directory)
    marker.write_text(json.dumps(CRAFTED[craft](json.loads(marker.read_text()))))
    assert not is_trained(directory)  # no TypeError: read as not trained, so it is trained again
    message = capsys.readouterr().err
    assert f"model metrics {marker} is corrupt" in message and "moved aside to metrics.json.corrupt" \
        in message, message
    assert (directory / "weights.pth").read_bytes() == weights  # the weights were not touched
    assert sorted(p.name for p in directory.iterdir()) == ["metrics.json.corrupt", "weights.pth"]


# ---------------------------------------------------------------- the world's cache
def test_a_truncated_world_cache_is_named_set_aside_and_generated_again(tmp_path, capsys):
    runs = tmp_path / "runs"
    world = build_world(WORLD, runs_root=runs)
    before = world.split("val").images.numpy().copy()
    arrays = world.cache_dir / "val.npz"
    good = arrays.read_bytes()
    arrays.write_bytes(good[:len(good) // 2])
    capsys.readouterr()
    again = build_world(WORLD, runs_root=runs).split("val")
    message = capsys.readouterr()
    assert f"world images {arrays} is corrupt (SHA-256" in message.err and "recomputing" in message.err
    assert "generated" in message.out
    assert arrays.read_bytes() == good and np.array_equal(again.images.numpy(), before)
    assert (world.cache_dir / "val.npz.corrupt").stat().st_size == len(good) // 2


@pytest.mark.parametrize("planted", ["objects", "marker-digest-a-number", "old-annotations-list"])
def test_a_planted_world_cache_is_generated_again(tmp_path, capsys, planted):
    runs = tmp_path / "runs"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("untouched\n")
    before_outside = listing(outside)
    world = build_world(WORLD, runs_root=runs)
    first = world.split("val")
    images, labels = first.images.numpy().copy(), first.labels.copy()
    store = cached_images("val")
    arrays, marker = store.payload_path(world.cache_dir), store.marker_path(world.cache_dir)
    good = arrays.read_bytes()
    if planted == "objects":
        object_npz(arrays, images=images, labels=labels)
        rerecord(marker, store.digest_field, arrays)
    elif planted == "marker-digest-a-number":
        rerecord(marker, store.digest_field, arrays)
        record = json.loads(marker.read_text())
        atomic_write_json(marker, {**record, store.digest_field: 7})
    else:
        atomic_write_json(marker, first.annotations)
    capsys.readouterr()
    again = build_world(WORLD, runs_root=runs).split("val")
    message = capsys.readouterr().err
    corrupt = {"objects": f"world images {arrays} is corrupt (array 'planted' holds Python objects",
               "marker-digest-a-number": f"world annotations {marker} is corrupt (field "
                                         "'arrays_sha256' is the int 7, not a SHA-256",
               "old-annotations-list": f"world annotations {marker} is corrupt (a JSON list, "
                                       "not an object)"}[planted]
    assert corrupt in message, message
    assert np.array_equal(again.images.numpy(), images) and arrays.read_bytes() == good
    assert listing(outside) == before_outside


# ---------------------------------------------------------------- image sets, visualizations, findings
def test_an_image_set_holding_objects_is_made_again(tmp_path, capsys):
    runs = tmp_path / "runs"
    suite = load_suite(write_suite(tmp_path / "sets.toml", body=SIZES, world=WORLD))
    world = build_world(WORLD, runs_root=runs)
    first = detection_set(suite, world, runs / "sets")
    folder = runs / "sets" / first.id
    object_npz(IMAGE_SET.payload_path(folder), images=first.images)
    rerecord(IMAGE_SET.marker_path(folder), IMAGE_SET.digest_field, IMAGE_SET.payload_path(folder))
    capsys.readouterr()
    again = detection_set(suite, world, runs / "sets")
    assert f"{IMAGE_SET.payload_path(folder)} is corrupt (array 'planted' holds Python objects" \
        in capsys.readouterr().err
    assert np.array_equal(again.images, first.images)
    assert IMAGE_SET.find(folder, first.id) is not None  # stored anew, and read from then on


def _explanation() -> Explanation:
    rng = np.random.default_rng(0)
    return Explanation(images=rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8),
                       targets=np.arange(3), params={"method": "m"},
                       raw=rng.random((3, 8, 8)).astype(np.float32))


@pytest.mark.parametrize("planted", ["objects", "truncated", "no-targets"])
def test_a_planted_visualization_is_not_stored(tmp_path, capsys, planted):
    directory = tmp_path / "vis"
    explanation = _explanation()
    params = save_explanation(directory, explanation, "model", "set")
    payload = VISUALIZATION.payload_path(directory)
    if planted == "objects":
        object_npz(payload, images=explanation.images, targets=explanation.targets)
    elif planted == "truncated":
        payload.write_bytes(payload.read_bytes()[:100])
    else:
        np.savez(payload, images=explanation.images)
    rerecord(VISUALIZATION.marker_path(directory), VISUALIZATION.digest_field, payload)
    capsys.readouterr()
    assert not is_stored(directory, params["key"])
    expected = {"objects": "array 'planted' holds Python objects",
                "truncated": "not a readable .npz (BadZipFile",
                "no-targets": "no array 'targets' (it holds images)"}[planted]
    assert f"visualization {payload} is corrupt ({expected}" in capsys.readouterr().err
    assert not VISUALIZATION.marker_path(directory).exists()  # unfinished: the explain stage redoes it
    with pytest.raises(FileNotFoundError, match="no finished explanation"):
        load_explanation(directory)
    save_explanation(directory, explanation, "model", "set")
    assert np.array_equal(load_explanation(directory).images, explanation.images)


def test_findings_that_are_not_what_the_stage_writes_are_not_stored(tmp_path, capsys):
    key = {"auditor": "a", "model_id": "m"}
    FINDINGS_STORE.save(tmp_path, key, lambda path: atomic_write_json(path, ["not", "findings"]))
    assert not FINDINGS_STORE.is_stored(tmp_path, key)
    assert "findings.json" in capsys.readouterr().err
    FINDINGS_STORE.save(tmp_path, key, lambda path: atomic_write_json(
        path, {"findings": [], "images_used": 3, "notes": {}, "subgroups": []}))
    assert FINDINGS_STORE.is_stored(tmp_path, key)


@pytest.mark.parametrize("crafted", [{"rows": 5, "complete": True}, {"rows": []}, "rows", 3.5])
def test_a_crafted_cache_of_the_discovery_stage_is_built_again(tmp_path, capsys, crafted):
    grid = {"a": ["0", "1"], "b": ["x", "y"], "c": ["p", "q"]}
    world = argparse.Namespace(cache_dir=tmp_path, feasible=lambda combo: True, constraint_groups=list)
    rows = cached_covering_array(world, grid, 2, 0)
    count = cached_feasible_tuples(world, grid, 2, {})
    for cache in sorted((tmp_path / "covering-arrays").glob("*.json")):
        cache.write_text(json.dumps(crafted))
    capsys.readouterr()
    assert cached_covering_array(world, grid, 2, 0) == rows
    assert cached_feasible_tuples(world, grid, 2, {}) == count
    message = capsys.readouterr().err
    assert message.count("is corrupt") == 2 and "covering array" in message and \
        "feasible t-tuple count" in message, message


# ---------------------------------------------------------------- user image folders
def png_bomb(path: Path, side: int = 30000) -> None:
    """A real decompression bomb: a ``side`` x ``side`` 1-bit PNG of zeros, about 100 KB."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    row = b"\x00" * (1 + side // 8)
    compress = zlib.compressobj(9)
    data = b"".join(compress.compress(row) for _ in range(side)) + compress.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def test_bad_files_in_an_image_folder_are_each_named_when_the_suite_is_read(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    png_bomb(folder / "1.png")
    (folder / "2.png").write_bytes((folder / "0.png").read_bytes()[:40] + b"\x00" * 200)  # corrupt
    (folder / "3.png").unlink()
    Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(folder / "3.jpg")
    jpeg = (folder / "3.jpg").read_bytes()
    (folder / "3.jpg").write_bytes(jpeg[:len(jpeg) // 2])  # truncated
    suite = write_suite(tmp_path / "folders.toml", world=WORLD,
                        body=f'{SIZES}[image_sets]\n{DETECTION} = "{folder}"\n')
    before = listing(tmp_path)
    with pytest.raises(SuiteFileError) as caught:
        load_suite(suite)
    lines = str(caught.value).splitlines()
    named = {name: [line for line in lines if str(folder / name) in line]
             for name in ("1.png", "2.png", "3.jpg")}
    assert all(len(found) == 1 for found in named.values()), lines
    assert "30000x30000 px" in named["1.png"][0] or "decompression bomb" in named["1.png"][0]
    assert "cannot be decoded" in named["2.png"][0]
    assert "cannot be decoded" in named["3.jpg"][0] and "Truncated File Read" in named["3.jpg"][0]
    assert not [line for line in lines if str(folder / "0.png") in line]
    assert listing(tmp_path) == before


def test_a_16_bit_png_is_scaled_to_8_bits_on_every_path(tmp_path, runs):
    folder = tmp_path / "images"
    folder.mkdir()
    samples = (np.arange(SIDE * SIDE, dtype=np.uint32).reshape(SIDE, SIDE) * 64).astype(np.uint16)
    samples[0, :4] = [0, 128, 257 * 200, 65535]
    for i in range(8):
        Image.fromarray(samples).save(folder / f"{i}.png")
    assert Image.open(folder / "0.png").mode == "I;16"
    expected = np.round(samples / 257).astype(np.uint8)
    assert expected[0, :4].tolist() == [0, 0, 200, 255]
    suite = load_suite(write_suite(tmp_path / "deep.toml", world=WORLD,
                                   body=f'{SIZES}[image_sets]\n{DETECTION} = "{folder}"\n'))
    image_set = detection_set(suite, build_world(WORLD, runs_root=runs), runs / "s")
    assert np.array_equal(image_set.images[0], np.repeat(expected[..., None], 3, axis=2))
    # the ImageNet world's decoders read it the same: PIL (loader) and torchvision.io (tensor)
    pil = np.asarray(decoding.load_rgb(str(folder / "0.png")))
    tensor = decoding.read_rgb(str(folder / "0.png")).permute(1, 2, 0).numpy()
    assert np.array_equal(pil, image_set.images[0]) and np.array_equal(tensor, pil)


def test_a_per_layer_visualization_passes_the_check(tmp_path, capsys):
    rng = np.random.default_rng(1)
    per_layer = Explanation(images=rng.integers(0, 256, (2, 3, 8, 8, 3), dtype=np.uint8),
                            targets=np.arange(3), params={"method": "m"}, layers=("a", "b"))
    params = save_explanation(tmp_path, per_layer, "model", "set")
    assert is_stored(tmp_path, params["key"]) and not capsys.readouterr().err
    assert load_explanation(tmp_path).layers == ("a", "b")
