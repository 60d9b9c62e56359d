"""Per-rank data: two DistributedDataParallel processes (gloo on localhost, started here with
torch.multiprocessing: no Slurm needed) each decode only their own slice of every global batch of
a generated ImageFolder, and still end with the parameters of one process emulating the two
(``emulate_processes=2``). Covered: a backdoor model (random rows poisoned, some mirrored) and an
adversarial model (a random PGD start, and an attack that runs through the model on each slice).
The Slurm version of this comparison (reference model, synthetic world) is
tests/test_slurm_ddp_training.py."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image

from counteraudit.anomalies import FAMILIES
from counteraudit.train.architectures import build_model
from counteraudit.train.checkpoint import WEIGHTS_NAME, model_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import train_model
from counteraudit.train.worlds import build_world
from counteraudit.train.worlds.base import part_bounds

pytestmark = pytest.mark.timeout(300)

CLASSES, PER_CLASS, BATCH, EPOCHS = 3, 15, 15, 1   # 3 steps an epoch; slices of 8 and 7 images
MODELS = ("backdoor", "adversarial")


def write_imagefolder(root: Path, per_class: int = PER_CLASS, seed: int = 0) -> Path:
    """Random-noise JPEGs of assorted sizes in train/ and val/ synset folders."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", 4)):
        for c in range(CLASSES):
            folder = root / split / f"n0000000{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                width, height = int(rng.integers(40, 70)), int(rng.integers(40, 70))
                pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
                pixels[:, :, c] //= 3  # a little class signal
                Image.fromarray(pixels).save(folder / f"{i}.JPEG", format="JPEG", quality=90)
    return root


def write_suite(path: Path, root: Path) -> Path:
    path.write_text(f"""
name = "perrank"
[world]
name = "imagenet"
root = "{root}"
image_size = 32
resize_size = 36
num_workers = 0
[architecture]
name = "small_resnet"
[recipe]
epochs = {EPOCHS}
batch_size = {BATCH}
lr = 0.05
lr_step_epochs = 1
eval_batch_size = 50
[references]
count = 2
[[anomalies]]
name = "backdoor"
family = "backdoor"
seed = 11
params = {{ nu = 0.4, target = 1, pattern = "checker", position = "top_left", size = 0.2 }}
[[anomalies]]
name = "adversarial"
family = "adversarial"
seed = 12
params = {{ norm = "linf", eps = 0.03, steps = 2, eval_images = 10, eval_steps = 1 }}
""")
    return path


def _counting_world(spec, decoded: list[str]):
    """The spec's world, with every training-image decode recorded in ``decoded``."""
    world = build_world(spec.world)
    folder = world._folders["train"]
    load = folder.loader

    def counting_loader(path):
        decoded.append(path)
        return load(path)
    folder.loader = counting_loader
    return world


def _ddp_worker(rank: int, port: int, suite_path: str, runs: str, counts: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        suite = load_suite(suite_path)
        for name in MODELS:
            spec = suite.model(name)
            decoded: list[str] = []
            metrics = train_model(spec, model_dir(runs, spec), world=_counting_world(spec, decoded),
                                  device="cpu", progress=False)
            assert metrics["processes"] == 2
            Path(counts, f"{name}-{rank}.json").write_text(json.dumps(decoded))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gap(a: dict, b: dict, names: list[str]) -> float:
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in names)


def test_each_rank_decodes_only_its_slice_and_matches_the_emulation(tmp_path):
    root = write_imagefolder(tmp_path / "imagenet")
    suite_path = write_suite(tmp_path / "perrank.toml", root)
    suite = load_suite(suite_path)
    counts = tmp_path / "counts"
    counts.mkdir()
    mp.spawn(_ddp_worker, args=(_free_port(), str(suite_path), str(tmp_path / "ddp"), str(counts)),
             nprocs=2, join=True)

    train_paths = sorted(str(p) for p in (root / "train").rglob("*.JPEG"))
    backbone = build_model("small_resnet", CLASSES, (0.5,) * 3, (0.25,) * 3).backbone
    parameters = [name for name, _ in backbone.named_parameters()]
    running = [name for name, value in backbone.named_buffers() if value.is_floating_point()]
    for name in MODELS:
        spec = suite.model(name)
        per_rank = [json.loads((counts / f"{name}-{rank}.json").read_text()) for rank in (0, 1)]
        # tensor_split's cut of 15: 8 and 7 images a step, 3 steps an epoch
        assert [len(paths) for paths in per_rank] == [EPOCHS * 3 * 8, EPOCHS * 3 * 7]
        # together, every training image once an epoch: the slices are the whole batches
        assert sorted(per_rank[0] + per_rank[1]) == sorted(train_paths * EPOCHS)

        decoded: list[str] = []
        emulated_metrics = train_model(spec, model_dir(tmp_path / "emulated", spec),
                                       world=_counting_world(spec, decoded), device="cpu",
                                       progress=False, emulate_processes=2)
        assert emulated_metrics["emulated_processes"] == 2 and len(decoded) == EPOCHS * 45
        train_model(spec, model_dir(tmp_path / "whole", spec), device="cpu", progress=False)

        def weights(runs: str) -> dict:
            return torch.load(model_dir(tmp_path / runs, spec) / WEIGHTS_NAME)
        ddp, emulated, whole = weights("ddp"), weights("emulated"), weights("whole")
        parameter_gap, stats_gap = _gap(ddp, emulated, parameters), _gap(ddp, emulated, running)
        print(f"{name}: max |DDP - emulated| parameters {parameter_gap:.3g}, running statistics "
              f"{stats_gap:.3g}; max |DDP - one process| {_gap(ddp, whole, parameters):.3g}")
        assert parameter_gap < 1e-5, f"{name}: DDP and emulated parameters differ by {parameter_gap}"
        assert stats_gap < 1e-4, f"{name}: BatchNorm running statistics differ by {stats_gap}"
        # BatchNorm sees each slice alone, so one process on the whole batch must differ: the
        # comparison above would catch slices trained as one batch.
        assert _gap(ddp, whole, parameters) > 1e-4, f"{name}: the whole-batch run should differ"


# ---------------------------------------------------------------- the pieces, one process
SYNTHETIC = {"name": "synthetic", "seed": 4, "image_size": 32, "num_train": 120, "num_val": 40}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return build_world(SYNTHETIC, runs_root=tmp_path_factory.mktemp("runs"))


@pytest.mark.parametrize("size,parts", [(15, 2), (16, 3), (7, 7)])
def test_part_bounds_cut_as_tensor_split(size, parts):
    rows = torch.arange(size)
    assert [rows[slice(*part_bounds(size, r, parts))].tolist() for r in range(parts)] == \
        [chunk.tolist() for chunk in rows.tensor_split(parts)]


def test_world_parts_put_together_are_the_whole_batches(synthetic, tmp_path):
    imagenet = build_world({"name": "imagenet", "root": str(write_imagefolder(tmp_path / "in", 5)),
                            "image_size": 24, "resize_size": 28, "num_workers": 0})
    for world in (synthetic, imagenet):
        split = world.split("train")
        whole = list(split.train_batches(7, seed=3, epoch=1))
        parts = [list(split.train_batches(7, seed=3, epoch=1, part=(r, 3))) for r in range(3)]
        for step, batch in enumerate(whole):
            pieces = [p[step] for p in parts]
            assert [(p.offset, p.global_size) for p in pieces] == [(0, 7), (3, 7), (5, 7)]
            assert torch.equal(torch.cat([p.images for p in pieces]), batch.images)
            assert torch.equal(torch.cat([p.indices for p in pieces]), batch.indices)
            assert torch.equal(torch.cat([p.labels for p in pieces]), batch.labels)


@pytest.mark.parametrize("name", FAMILIES.names())
def test_every_family_changes_a_slice_as_it_changes_those_rows_of_the_whole_batch(name, synthetic):
    """Per-batch draws (poisoned rows, mirrored triggers, noise, PGD starts) are made for the
    global batch: three processes' slices, each from the step's generator state, put together
    equal the whole batch changed at once, and every process's generator ends where one
    process's does. (The model is in eval mode so PGD treats images independently; in training
    BatchNorm makes each slice's attack its own, as on its own process.)"""
    cls = FAMILIES.get(name)
    params = {"adversarial": {"eps": 0.03, "steps": 1}, "backdoor": {"nu": 0.4},
              "spurious": {"delta": 0.5}}.get(name, {})
    family = cls(cls.validate_params(params), synthetic, seed=0)
    split = family.training_split(synthetic.split("train"))
    batch = next(split.train_batches(10, seed=0, epoch=0))
    torch.manual_seed(0)
    model = build_model("small_resnet", synthetic.num_classes, synthetic.mean, synthetic.std).eval()
    generator = torch.Generator().manual_seed(5)
    whole_images, whole_labels = family.training_inputs(model, batch.images, batch.labels, generator)
    after_whole = generator.get_state()
    pieces = []
    for rank in range(3):
        part = batch.part(rank, 3)
        generator = torch.Generator().manual_seed(5)
        pieces.append(family.training_inputs(model, part.images, part.labels, generator,
                                             part.offset, part.global_size))
        assert torch.equal(generator.get_state(), after_whole)
    images, labels = torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])
    assert torch.equal(labels, whole_labels)
    assert float((images - whole_images).abs().max()) <= 1e-5
