"""The interface every world (synthetic, ImageNet) offers the rest of the benchmark.

A world has a train and a val split. A split yields training batches (augmented, shuffled from a
seed) and loads evaluation images (deterministic). Images are float tensors in [0, 1], NCHW; the
model normalises them (train/architectures.py). Per-image annotations (class, object box, face
boxes, generating attributes) travel with the split so anomaly families can build their data
changes and their abnormal input sets.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from counteraudit.train.core.registries import WORLDS
from counteraudit.train.core.params import params_problems

# (x0, y0, x1, y1) in pixels of the evaluation image, x1/y1 exclusive.
Box = tuple[int, int, int, int]


@dataclass
class Batch:
    images: torch.Tensor    # (N, 3, H, W) float32 in [0, 1]
    labels: torch.Tensor    # (N,) int64
    indices: torch.Tensor   # (N,) int64, positions in the split (to look up annotations)
    # Where these rows sit in the global batch they are a slice of (a DDP process's part): rows
    # offset .. offset + N of global_size. Anomaly families draw their per-batch randomness for
    # the global batch and keep these rows, so N processes see what one process would.
    offset: int = 0
    global_size: int | None = None  # None: the batch is whole

    def __post_init__(self):
        if self.global_size is None:
            self.global_size = len(self.labels)

    def part(self, rank: int, parts: int) -> "Batch":
        """Rows of this batch that process ``rank`` of ``parts`` trains on (``part_bounds``)."""
        start, stop = part_bounds(len(self.labels), rank, parts)
        return Batch(self.images[start:stop], self.labels[start:stop], self.indices[start:stop],
                     self.offset + start, self.global_size)


def part_bounds(size: int, rank: int, parts: int) -> tuple[int, int]:
    """Rows [start, stop) of a batch of ``size`` that process ``rank`` of ``parts`` takes: the
    same cut as ``torch.tensor_split`` (the first size % parts parts get one row more)."""
    if not 0 <= rank < parts:
        raise ValueError(f"rank {rank} is not a process of a {parts}-process run")
    base, extra = divmod(size, parts)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class Split(ABC):
    """One split of a world's images."""

    @property
    @abstractmethod
    def labels(self) -> np.ndarray: ...

    @abstractmethod
    def annotation(self, index: int) -> dict[str, Any]:
        """class, object_box, face_boxes (list of Box) and, where known, generating attributes."""

    @abstractmethod
    def load(self, indices: Sequence[int]) -> torch.Tensor:
        """Evaluation images (deterministic transform), (N, 3, H, W) float in [0, 1]."""

    @abstractmethod
    def train_batches(self, batch_size: int, seed: int, epoch: int, drop_last: bool = True,
                      part: tuple[int, int] = (0, 1),
                      image_size: int | None = None) -> Iterator[Batch]:
        """One epoch of shuffled, augmented batches; the same (seed, epoch) gives the same batches.

        ``part=(rank, parts)``: only process ``rank``'s rows of every batch (``Batch.part``), and
        only those images are loaded; each image's augmentation depends on the image, not on
        which process loads it, so the parts put together are the whole batches.
        ``image_size``: the side of this epoch's training crops (a recipe's resolution schedule);
        None: the world's own. Worlds whose images have one fixed size refuse any other."""

    @abstractmethod
    def subset(self, indices: Sequence[int]) -> "Split":
        """The same split restricted to some images (e.g. a class removed)."""

    def __len__(self) -> int:
        return len(self.labels)

    def eval_batches(self, batch_size: int, indices: Sequence[int] | None = None) -> Iterator[Batch]:
        order = np.arange(len(self)) if indices is None else np.asarray(indices)
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            yield Batch(self.load(chunk), torch.as_tensor(self.labels[chunk], dtype=torch.long),
                        torch.as_tensor(chunk, dtype=torch.long))

    def face_indices(self) -> np.ndarray:
        return np.array([i for i in range(len(self)) if self.annotation(i)["face_boxes"]], dtype=np.int64)


class World(ABC):
    name: str
    # Whether training crops are cut from files of any size (so the crop side can change by
    # epoch: a recipe's resolution schedule), rather than rendered at one size.
    crops_from_files: bool = False
    class_names: list[str]
    image_size: int
    # The image side when a suite's [world] table gives none (checked when a suite loads).
    default_image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @abstractmethod
    def split(self, name: str) -> Split:
        """'train' or 'val'."""

    # The dataclass of the world's [world] options (without ``name``): its fields are the valid
    # keys, and their annotations carry each key's type and range.
    config_class: type | None = None

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> list[str]:
        """What is wrong with a suite's [world] table (without ``name``), reading no data: a suite
        is checked when it loads, before any job starts."""
        if cls.config_class is None:
            return []
        return params_problems(cls.config_class, config, "[world]")

    @classmethod
    def listed_class_names(cls, config: dict[str, Any]) -> list[str] | None:
        """The class names a suite's [world] table (without ``name``) gives this world, found
        cheaply (no images read), to check a suite's class names and checkpoints before any job;
        None where they cannot be known without building the world (then checked when it is)."""
        names = getattr(cls, "class_names", None)
        return list(names) if names is not None else None

    @classmethod
    def listed_val_size(cls, config: dict[str, Any]) -> int | None:
        """How many validation images (the pool image sets are drawn from) a suite's [world] table
        (without ``name``) gives this world, found without reading data; None where that needs
        the data (then checked when a set is drawn)."""
        return None

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """Raise ValueError for unknown or invalid options (``config_problems``)."""
        problems = cls.config_problems(config)
        if problems:
            raise ValueError("; ".join(problems))

    def prepare(self) -> "World":
        """Make whatever later processes will read (e.g. generate and cache images)."""
        return self

    def describe(self) -> dict[str, Any]:
        return {"world": self.name, "classes": self.num_classes, "image_size": self.image_size}

    # ---- factors, for failure-discovery auditors (evaluate/discovery/auditors/)
    def factors(self) -> dict[str, list[str]]:
        """The world's named factors and their finite values, {factor: [value, ...]}."""
        raise NotImplementedError(f"the {self.name} world declares no factors")

    def image_factors(self, split: Split, index: int) -> dict[str, str] | None:
        """The factor values of one image of a split (None: the image is not annotated)."""
        raise NotImplementedError(f"the {self.name} world declares no factors")

    has_generator = False  # True: ``generate`` makes images for any feasible conditions

    def feasible(self, conditions: dict[str, str]) -> bool:
        """Whether some image of the world can satisfy the conditions (default: any can)."""
        return True

    def constraint_groups(self) -> list[list[str]]:
        """Groups of factors whose joint values ``feasible`` restricts beyond their pairs (a
        covering array checks these groups as well as every pair)."""
        return []

    def generate(self, conditions: dict[str, str], n: int, seed: int) -> Split:
        """n images whose factors satisfy ``conditions`` ({factor: value}), the other factors
        drawn from the world's own distribution; deterministic in (conditions, n, seed)."""
        raise NotImplementedError(
            f"the {self.name} world has no image generator, so it cannot generate images for "
            f"{conditions}; use an auditor that works on its annotated validation images instead "
            "(one whose needs_generator is False: discover.py --help lists them)")


def build_world(config: dict[str, Any], runs_root=None) -> World:
    """A world from a suite's [world] table: ``name`` picks the registered class, the rest are its
    keyword arguments (unknown keys are an error that lists the accepted ones)."""
    config = dict(config)
    name = config.pop("name", "synthetic")
    cls = WORLDS.get(name)
    return cls.from_config(config, runs_root=runs_root)
