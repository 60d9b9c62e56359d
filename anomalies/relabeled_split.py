"""A split whose training batches carry other labels than its images' own (permuted labels,
a planted slice's relabelled images)."""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch

from counteraudit.train.worlds.base import Batch, Split


class RelabeledSplit(Split):
    """A split whose training batches carry other labels (looked up by the image's position);
    images, annotations and augmentation are the inner split's."""

    def __init__(self, inner: Split, labels: np.ndarray):
        if len(labels) != len(inner):
            raise ValueError(f"{len(labels)} labels for a split of {len(inner)} images")
        self.inner = inner
        self._labels = np.asarray(labels, np.int64)
        self._label_tensor = torch.from_numpy(self._labels)

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def annotation(self, index: int) -> dict[str, Any]:
        return self.inner.annotation(index)

    def load(self, indices: Sequence[int]) -> torch.Tensor:
        return self.inner.load(indices)

    def train_batches(self, batch_size: int, seed: int, epoch: int, drop_last: bool = True,
                      part: tuple[int, int] = (0, 1),
                      image_size: int | None = None) -> Iterator[Batch]:
        for batch in self.inner.train_batches(batch_size, seed, epoch, drop_last, part, image_size):
            yield Batch(batch.images, self._label_tensor[batch.indices.long()], batch.indices,
                        batch.offset, batch.global_size)

    def subset(self, indices: Sequence[int]) -> "RelabeledSplit":
        idx = np.asarray(indices, np.int64)
        return RelabeledSplit(self.inner.subset(idx), self._labels[idx])
