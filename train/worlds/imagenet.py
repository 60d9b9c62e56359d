"""The ImageNet world: a standard ImageFolder tree, with the usual transforms and optional faces.

Layout expected under ``root``::

    root/train/<synset>/<image>.JPEG      training images, one folder per class
    root/val/<synset>/<image>.JPEG        validation images, same folders

Class order is the sorted synset folder names (torchvision's ImageFolder), so class index 414 is
the 415th synset: with the full 1000-class tree that is ImageNet's usual numbering (414 backpack).

Optional ``class_names_file``: one line per synset, ``n02769748 backpack, back pack, ...``
(ImageNet's LOC_synset_mapping.txt); the first name after the id becomes the class name.

Optional ``face_annotations`` (JSON), face boxes in pixels of the *original* image, keyed by the
image's path relative to ``root``::

    {"val/n03494278/ILSVRC2012_val_00001234.JPEG": [[x0, y0, x1, y1], ...], ...}

Images absent from the file have no faces. (Yang et al.'s face-obfuscation annotations convert to
this with a few lines; see train/README.md.) Boxes are mapped through the evaluation transform (resize 256,
centre crop 224) by ``annotation()``; the original boxes are kept under ``face_boxes_original``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from pydantic import Field
from torchvision import transforms as T
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import find_classes

from counteraudit.slurm.worker_pool import end_with_parent
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.paths import expand_path
from counteraudit.train.worlds import decoding
from counteraudit.train.worlds.base import WORLDS, Batch, Split, World, part_bounds

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageNetConfig:
    """The imagenet world's [world] options; each annotation carries its range (checked when a
    suite is read, train/core/suite_schema.py)."""
    root: Annotated[str, Field(description=(
        "a folder with train/ and val/ of synset folders (e.g. \"${IMAGENET_ROOT}\")"))] = ""
    # crop size (train: random-resized crop; eval: centre crop)
    image_size: Annotated[int, Field(ge=1, le=bounds.IMAGE_SIDE.limit, json_schema_extra=bounds.IMAGE_SIDE.extra,
                                     description="crop side in pixels (the paper: 224)")] = 224
    # eval: shorter side resized to this before the centre crop
    resize_size: Annotated[int, Field(ge=1, le=bounds.IMAGE_SIDE.limit, json_schema_extra=bounds.IMAGE_SIDE.extra,
                                      description=(
        "evaluation: the shorter side before the centre crop (the paper: 256)"))] = 256
    class_names_file: str | None = None
    face_annotations: str | None = None
    num_workers: Annotated[int, Field(ge=0, le=bounds.LOADER_PROCESSES.limit,
                                      json_schema_extra=bounds.LOADER_PROCESSES.extra, description=(
        "data-loading processes for training (8)"))] = 8
    # How training JPEGs become crops (train/worlds/decoding.py): "pil" (the default, torchvision's
    # reference recipe), "tensor" (torchvision.io + transforms.v2: faster per core), "nvjpeg"
    # (batches decoded on the GPU; the CPU's "tensor" where CUDA is absent). Changes the training
    # pixels by rounding, so a suite that sets it gets different model keys.
    decode: str = "pil"


def _eval_transform(cfg: ImageNetConfig):
    return T.Compose([T.Resize(cfg.resize_size), T.CenterCrop(cfg.image_size), T.ToTensor()])


class _Indexed(torch.utils.data.Dataset):
    """(crop, label, index) from an ImageFolder, decoded by one of the decoding paths, with an
    optional PIL-level change first (blurring faces must happen in original pixel coordinates,
    before cropping). The nvjpeg path returns (file bytes, crop plan) instead of the crop."""

    def __init__(self, folder, positions: np.ndarray, size: int,
                 pil_transform: Callable[[Image.Image, int], Image.Image] | None,
                 augment_seed: int, decode: str = "pil"):
        self.folder, self.positions, self.size = folder, positions, size
        self.pil_transform, self.augment_seed, self.decode = pil_transform, augment_seed, decode

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i: int):
        position = int(self.positions[i])
        path, label = self.folder.samples[position]
        if self.decode == "nvjpeg":
            image = decoding.read_bytes(path)
            height, width = decoding.image_size_from_header(path)
        elif self.decode == "tensor":
            image = decoding.read_rgb(path)
            if self.pil_transform is not None:
                image = decoding.from_pil(self.pil_transform(decoding.to_pil(image), i))
        else:
            image = self.folder.loader(path)
            if self.pil_transform is not None:
                image = self.pil_transform(image, i)
        # Each sample's crop and flip from (seed, epoch, index): the same batches whatever the
        # number of loader workers or processes, and the global RNG is left alone.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.augment_seed, i))
            if self.decode == "nvjpeg":
                return image, decoding.crop_plan(height, width), label, i
            if self.decode == "tensor":
                return decoding.tensor_crop(image, self.size), label, i
            return decoding.pil_crop(image, self.size), label, i


def _collate_files(samples):
    """nvjpeg batches: file bytes differ in length, so they stay a list."""
    files, plans, labels, indices = zip(*samples)
    return list(files), list(plans), torch.as_tensor(labels), torch.as_tensor(indices)


class ImageFolderSplit(Split):
    def __init__(self, world: "ImageNetWorld", folder, name: str, positions: np.ndarray | None = None,
                 pil_transform: Callable[[Image.Image, int], Image.Image] | None = None):
        self.world, self.folder, self.name = world, folder, name
        self.positions = np.arange(len(folder.samples)) if positions is None else np.asarray(positions)
        self.pil_transform = pil_transform
        self._labels = np.array([folder.targets[p] for p in self.positions], np.int64)

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def path(self, index: int) -> str:
        return self.folder.samples[int(self.positions[index])][0]

    def annotation(self, index: int) -> dict[str, Any]:
        path = self.path(index)
        relative = os.path.relpath(path, self.world.root).replace(os.sep, "/")
        original = self.world.faces.get(relative, [])
        boxes = []
        if original:
            height, width = decoding.image_size_from_header(path)  # reads the header only
            boxes = [box for box in (self.world.eval_box(b, width, height) for b in original) if box]
        return {"class": int(self._labels[index]), "object_box": None, "face_boxes": boxes,
                "face_boxes_original": original, "path": relative}

    def load(self, indices: Sequence[int]) -> torch.Tensor:
        transform = _eval_transform(self.world.config)
        images = []
        for i in indices:
            image = self.folder.loader(self.path(int(i)))
            if self.pil_transform is not None:
                image = self.pil_transform(image, int(i))
            images.append(transform(image))
        return torch.stack(images)

    def train_batches(self, batch_size: int, seed: int, epoch: int, drop_last: bool = True,
                      part: tuple[int, int] = (0, 1),
                      image_size: int | None = None) -> Iterator[Batch]:
        """``image_size``: this epoch's crop side (progressive resizing); default the world's."""
        generator = torch.Generator().manual_seed(derive_seed(seed, "batches", epoch))
        order = torch.randperm(len(self), generator=generator).tolist()
        stop = len(order) - (len(order) % batch_size if drop_last else 0)
        # (offset, global size, this process's images) of every batch: a DDP process decodes
        # only its own rows (each image's crop and flip come from its index, not its loader).
        rows = []
        for start in range(0, stop, batch_size):
            whole = order[start:start + batch_size]
            first, last = part_bounds(len(whole), *part)
            rows.append((first, len(whole), whole[first:last]))
        decode = decoding.effective_decode(self.world.config.decode, self.pil_transform)
        crop = image_size or self.world.config.image_size
        dataset = _Indexed(self.folder, self.positions, crop, self.pil_transform,
                           augment_seed=derive_seed(seed, "augment", epoch), decode=decode)
        loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=[chosen for _, _, chosen in rows],
            num_workers=self.world.config.num_workers, pin_memory=torch.cuda.is_available(),
            worker_init_fn=partial(end_with_parent, os.getpid()),  # at once, not after a batch
            **({"collate_fn": _collate_files} if decode == "nvjpeg" else {}))
        for (first, size, _), loaded in zip(rows, loader):
            if decode == "nvjpeg":
                files, plans, labels, indices = loaded
                images = decoding.decode_batch(files, plans, crop, decoding.batch_device())
            else:
                images, labels, indices = loaded
            yield Batch(images, labels, indices, offset=first, global_size=size)

    def subset(self, indices: Sequence[int]) -> "ImageFolderSplit":
        return ImageFolderSplit(self.world, self.folder, self.name,
                                self.positions[np.asarray(indices, np.int64)], self.pil_transform)

    def with_pil_transform(self, fn: Callable[[Image.Image, int], Image.Image]) -> "ImageFolderSplit":
        """Same images, changed at load time before cropping (fn gets the image and its index)."""
        return ImageFolderSplit(self.world, self.folder, self.name, self.positions, fn)


def named_classes(synsets: Sequence[str], names_file: str | None) -> list[str]:
    """Each synset's class name: the first name after its id in ``names_file`` (ImageNet's
    LOC_synset_mapping.txt), else the synset id itself."""
    if not names_file:
        return list(synsets)
    mapping = {}
    for line in Path(names_file).read_text().splitlines():
        if line.strip():
            synset, _, names = line.strip().partition(" ")
            mapping[synset] = names.split(",")[0].strip() or synset
    return [mapping.get(s, s) for s in synsets]


@WORLDS.register
class ImageNetWorld(World):
    name = "imagenet"
    config_class = ImageNetConfig
    crops_from_files = True
    default_image_size = ImageNetConfig.image_size
    mean, std = IMAGENET_MEAN, IMAGENET_STD

    def __init__(self, config: ImageNetConfig):
        if not config.root:
            raise ValueError("the imagenet world needs root = '/path/to/imagenet' (a folder with "
                             "train/ and val/ of synset folders) in the suite's [world] table")
        decoding.check_decode(config.decode)
        self.config = config
        self.root = Path(config.root).expanduser()
        for split in ("train", "val"):
            if not (self.root / split).is_dir():
                raise FileNotFoundError(f"ImageNet root {self.root} has no {split}/ folder; expected "
                                        f"{self.root}/train/<synset>/*.JPEG and {self.root}/val/<synset>/*.JPEG")
        self._folders = {s: ImageFolder(str(self.root / s), loader=decoding.load_rgb)
                         for s in ("train", "val")}
        train_classes, val_classes = self._folders["train"].classes, self._folders["val"].classes
        if train_classes != val_classes:
            missing = sorted(set(train_classes) ^ set(val_classes))
            raise ValueError(f"ImageNet root {self.root}: train/ and val/ have different class "
                             f"folders (differing: {missing[:5]}); both need the same synsets")
        self.synsets = train_classes
        self.class_names = self._read_class_names(config.class_names_file)
        self.image_size = config.image_size
        self.faces = self._read_faces(config.face_annotations)
        self._splits: dict[str, ImageFolderSplit] = {}

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> list[str]:
        problems = super().config_problems(config)
        try:
            decoding.check_decode(config.get("decode", ImageNetConfig.decode))
        except ValueError as error:
            problems.append(f"[world] {error}")
        return problems

    @classmethod
    def from_config(cls, config: dict[str, Any], runs_root=None) -> "ImageNetWorld":
        cls.check_config(config)
        config = dict(config)
        # Suites name paths through environment variables so one file serves every cluster.
        for key in ("root", "face_annotations", "class_names_file"):
            if config.get(key):
                config[key] = expand_path(config[key], f"imagenet {key}")
        return cls(ImageNetConfig(**config))

    def _read_class_names(self, path: str | None) -> list[str]:
        return named_classes(self.synsets, path)

    @classmethod
    def listed_class_names(cls, config: dict[str, Any]) -> list[str] | None:
        """The class names from root/train's folder names (one directory listing) and the
        class_names_file; None where root or its train/ is not readable here (a login node
        without the data, an unset variable): checked when the world is built."""
        try:
            root = Path(expand_path(config.get("root", ""), "imagenet root")).expanduser()
            names_file = config.get("class_names_file")
            names_file = expand_path(names_file, "imagenet class_names_file") if names_file else None
            return named_classes(find_classes(str(root / "train"))[0], names_file)
        except (OSError, ValueError):
            return None

    def _read_faces(self, path: str | None) -> dict[str, list[list[int]]]:
        if not path:
            return {}
        if not Path(path).is_file():
            raise FileNotFoundError(f"face annotation file {path} does not exist (see the format "
                                    "in train/worlds/imagenet.py or train/README.md)")
        faces = json.loads(Path(path).read_text())
        for key, boxes in faces.items():
            for box in boxes:
                if len(box) != 4 or box[2] <= box[0] or box[3] <= box[1]:
                    raise ValueError(f"face annotation {key}: box {box} is not [x0, y0, x1, y1] "
                                     "with x1 > x0 and y1 > y0")
        return faces

    def eval_box(self, box: Sequence[float], width: int, height: int) -> tuple[int, int, int, int] | None:
        """A box in original pixels -> pixels of the evaluation image (resize + centre crop)."""
        scale = self.config.resize_size / min(width, height)
        crop = self.config.image_size
        left = (round(width * scale) - crop) / 2
        top = (round(height * scale) - crop) / 2
        x0, y0 = box[0] * scale - left, box[1] * scale - top
        x1, y1 = box[2] * scale - left, box[3] * scale - top
        x0, y0, x1, y1 = (int(np.clip(v, 0, crop)) for v in (np.floor(x0), np.floor(y0),
                                                             np.ceil(x1), np.ceil(y1)))
        return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None

    # ---- factors: ImageNet-X's 16, from the annotations the imagenet-x package ships
    IMAGENET_X_ANNOTATIONS = "top"  # the package's default: each image's most salient factors

    def factors(self) -> dict[str, list[str]]:
        # Here, not at the top: imagenet_x loads pandas and scipy.stats (1.5 s on a slow core),
        # and every process that lists the worlds imports this module.
        from imagenet_x import FACTORS  # noqa: PLC0415
        return {factor: ["present", "absent"] for factor in FACTORS}

    def imagenet_x_annotations(self) -> dict[str, dict[str, int]]:
        """val file name (ILSVRC2012_val_00000001.JPEG) -> {factor: 0 or 1}, as
        ``imagenet_x.load_annotations`` reads them (prototype images left out, as it does)."""
        if getattr(self, "_imagenet_x", None) is None:
            from imagenet_x import FACTORS, load_annotations  # noqa: PLC0415  (as in factors)
            table = load_annotations(which_factor=self.IMAGENET_X_ANNOTATIONS,
                                     partition="val").set_index("file_name")
            self._imagenet_x = table[FACTORS].to_dict("index")
            self._imagenet_x_metaclass = table["metaclass"].to_dict()
        return self._imagenet_x

    def image_metaclass(self, split: Split, index: int) -> str | None:
        """ImageNet-X's metaclass of a val image (one of the package's 16 ``METACLASSES`` or
        "other", as ``load_annotations`` maps its class), joined by file name like its factors:
        the groups of ImageNet-X's per-metaclass error ratios (error_ratio's breakdown)."""
        self.imagenet_x_annotations()
        return self._imagenet_x_metaclass.get(os.path.basename(split.path(index)))

    def image_factors(self, split: Split, index: int) -> dict[str, str] | None:
        """ImageNet-X's factors of a val image, joined by file name (None: not annotated)."""
        flags = self.imagenet_x_annotations().get(os.path.basename(split.path(index)))
        if flags is None:
            return None
        return {factor: "present" if flag else "absent" for factor, flag in flags.items()}

    def split(self, name: str) -> ImageFolderSplit:
        if name not in self._folders:
            raise ValueError(f"unknown split {name!r}; valid: train, val")
        if name not in self._splits:
            self._splits[name] = ImageFolderSplit(self, self._folders[name], name)
        return self._splits[name]
