"""Helpers the families share: exact per-batch selection, predictions, val subsets."""
from __future__ import annotations

import numpy as np
import torch

# Implant figures are measured on a seeded sample of this many val images: enough to tell a
# defect that took (the thresholds are 10+ points wide) at a fraction of a full pass over ImageNet.
VERIFY_IMAGES = 500


def rows_of(global_draw: torch.Tensor, offset: int, count: int) -> torch.Tensor:
    """The rows a process holds of a draw made for the whole global batch."""
    return global_draw[offset:offset + count]


def positions_in_rows(positions: torch.Tensor, offset: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of ``positions`` that fall in rows offset .. offset + count, those positions made
    local to the rows) for positions drawn in the global batch."""
    inside = (positions >= offset) & (positions < offset + count)
    return inside, positions[inside] - offset


def choose_fraction(batch_size: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Exactly round(fraction * batch_size) positions of a batch, drawn without replacement."""
    count = int(round(fraction * batch_size))
    return torch.randperm(batch_size, generator=generator)[:count]


def select_rows(batch_size: int, fraction: float, selection: str,
                generator: torch.Generator) -> torch.Tensor:
    """The rows of a batch a family changes: ``"random"``, round(fraction * batch_size) rows drawn
    without replacement; ``"first"``, the first floor(fraction * batch_size) rows, as the paper's
    code does (int(fraction * batch_size); the batch is already shuffled). "first" draws nothing."""
    if selection == "first":
        return torch.arange(int(fraction * batch_size))
    return choose_fraction(batch_size, fraction, generator)


# Images per forward pass when measuring: on a CPU, batches of ~100 keep a small model's
# activations in cache (3.7x the throughput of batches of 500 for the 64-px small ResNet).
MEASURE_BATCH = 100


@torch.no_grad()
def predict(model: torch.nn.Module, images: torch.Tensor, device="cpu",
            batch_size: int = MEASURE_BATCH) -> torch.Tensor:
    model.eval()
    return torch.cat([model(images[i:i + batch_size].to(device)).argmax(1).cpu()
                      for i in range(0, len(images), batch_size)])


def accuracy(model, images: torch.Tensor, labels, device="cpu") -> float:
    if len(images) == 0:
        return float("nan")
    return float((predict(model, images, device) == torch.as_tensor(labels)).float().mean())


def verification_indices(val, seed: int = 0, count: int = VERIFY_IMAGES) -> np.ndarray:
    if len(val) <= count:
        return np.arange(len(val))
    return np.sort(np.random.default_rng(seed).choice(len(val), count, replace=False))


def reference_mean(reference_figures: list[dict], key: str) -> float:
    values = [f[key] for f in reference_figures if key in f]
    return float(np.mean(values)) if values else float("nan")


def check_fraction(name: str, value: float, family: str) -> None:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{family}: {name}={value} must be a fraction in [0, 1] of each batch")
