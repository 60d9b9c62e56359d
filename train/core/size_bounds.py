"""The upper bound of every size a suite file sets, and why each is what it is.

A suite file may come from a stranger, and a size such as ``count = 10**12`` would otherwise pass
the schema and end in a MemoryError, or run until stopped, hours later. Each bound is what the
smallest machine the tool is sized for (24 GiB of memory, 2 CPU cores) and the world can hold,
with headroom, and far above every shipped suite's value (the paper's included). A bound's
reason travels with it: the suite's error names the key, the bound and the reason.

The schema (``suite_schema.py``) and the worlds', recipe's and plug-ins' parameters attach these
with ``le=``; the checks that need several keys at once (a world's images in memory, an image set
in memory, the suite's model count) are the functions below.
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 2 ** 30
MACHINE_MEMORY_GIB = 24  # the machine every bound is sized for (2 CPU cores)


@dataclass(frozen=True)
class Bound:
    """A size's largest value and why."""
    limit: int
    why: str

    @property
    def extra(self) -> dict[str, str]:
        """The pydantic ``json_schema_extra`` that carries the reason to the error message."""
        return {BOUND_REASON: self.why}


BOUND_REASON = "bound_reason"

MODELS = Bound(1_000, (
    "each model is trained and stored: about a minute each at the quick suite's 64 px on 2 CPU "
    "cores, GPU-days each at the paper's 224 px; 1,000 is 13x the largest shipped suite (77)"))
EPOCHS = Bound(1_000, (
    "each epoch passes over the whole training set (hours for ImageNet); 1,000 is 11x the "
    "paper's 90"))
BATCH = Bound(4_096, (
    "a batch and its activations are held in memory: 4,096 images of 224 px are 2.3 GiB of "
    "float32 input alone (3 x side^2 x 4 bytes each), and a ResNet's activations are many times "
    f"that, beyond a {MACHINE_MEMORY_GIB} GiB machine"))
IMAGE_SIDE = Bound(1_024, (
    "one float32 image of side s is 3 x s^2 x 4 bytes: at 1,024 px 12 MiB, 21x the paper's "
    f"224 px, so a training batch of them with its activations exceeds a {MACHINE_MEMORY_GIB} GiB "
    "machine"))
THREADS = Bound(256, "threads of one training; more than the machine's cores only slow it, and "
                     "no machine the tool runs on has 256")
GROUP = Bound(256, (
    "models trained as one grouped network hold their activations in memory together: 256 "
    "small models at batch 64 and 64 px are about 40 GiB of activations, and a ResNet-50 is "
    "many times that"))
LOADER_PROCESSES = Bound(64, (
    "each data-loading process is a Python process with its own copy of the split's file list "
    f"(about 0.25 GiB for ImageNet's): 64 of them take 16 GiB of a {MACHINE_MEMORY_GIB} GiB "
    "machine"))
CLUTTER = Bound(100, "strokes drawn one by one on every image: 100 already cover a 64-px image "
                     "many times over, and each costs rendering time")
SET_IMAGES = Bound(50_000, (
    "a set is drawn from the world's validation images, and no world has more than ImageNet's "
    "50,000"))
PASSES = Bound(100_000, (
    "each is a forward and backward pass of the model per image: at 2.9 ms a step on 2 CPU cores "
    "(the small model at 64 px, measured), 100,000 are 5 minutes per image and model, 98x the "
    "paper's 1,024"))
GRID = Bound(1_024, "cells per side of the image: more than the 1,024 pixels an image's side has "
                    "at most (the bound on image_size) are cells smaller than a pixel")
DISCOVERY_IMAGES = Bound(1_000_000, (
    "images an auditor renders and classifies with every model: at about 1,000 images a second "
    "(the small model at 64 px on 2 CPU cores), 1,000,000 are 17 minutes per model, 300x the "
    "demo's 3,200"))

# A population release comes from a stranger, and the importer unpacks it to disk and reads each
# file whole into memory: each file at most 2 GiB (a model's weights are a few MB, an image set a
# few at most: IMAGE_SET_MEMORY's images as uint8 are a quarter of it), the whole release at most
# MODELS' 1,000 models at 64 MiB each, and its manifest, read before anything is checked, 64 MiB
# (about 300,000 entries: 60x the largest shipped suite's release).
RELEASE_FILE_BYTES = 2 * GIB
RELEASE_BYTES = MODELS.limit * 64 * 2 ** 20
RELEASE_MANIFEST_BYTES = 64 * 2 ** 20

# A world's splits are held in memory as uint8 (3 x side^2 bytes an image) by every training
# process, and --jobs runs several: 4 GiB each leaves a 24 GiB machine room for two jobs, their
# float batches and their models.
WORLD_MEMORY = 4 * GIB
# An image set is loaded whole as float32 (3 x side^2 x 4 bytes an image) to be explained, and
# each per-layer method's explanations are as large again: 2 GiB a set leaves room for them.
IMAGE_SET_MEMORY = 2 * GIB


def _size_text(size: int) -> str:
    return f"{size / GIB:.1f} GiB" if size >= GIB / 10 else f"{size / 2 ** 20:.1f} MiB"


def world_memory_problem(num_train: int, num_val: int, side: int) -> str | None:
    """Why a synthetic world of ``num_train`` + ``num_val`` images of ``side`` px cannot be held
    (None: it can)."""
    per_image = 3 * side * side
    size = (num_train + num_val) * per_image
    if size <= WORLD_MEMORY:
        return None
    fit = WORLD_MEMORY // per_image
    fix = (f"lower num_train to at most {fit - num_val}" if fit > num_val else
           f"lower num_val and num_train (together at most {fit} images fit at this size) or "
           "image_size")
    return (f"[world] num_train = {num_train} and num_val = {num_val} images of image_size = {side} "
            f"px take {_size_text(size)} in memory (3 x side^2 bytes each), more than the "
            f"{_size_text(WORLD_MEMORY)} one training process may hold on a {MACHINE_MEMORY_GIB} "
            f"GiB machine (several run at once with --jobs); {fix}")


def image_set_memory_problem(key: str, count: int, side: int) -> str | None:
    """Why an image set of ``count`` images of ``side`` px (``key``: the suite key that sets the
    count) cannot be explained in memory (None: it can)."""
    per_image = 3 * side * side * 4
    size = count * per_image
    if size <= IMAGE_SET_MEMORY:
        return None
    return (f"{key} = {count} images of {side} px take {_size_text(size)} as float32 (3 x side^2 "
            f"x 4 bytes each), more than the {_size_text(IMAGE_SET_MEMORY)} an image set may take "
            f"on a {MACHINE_MEMORY_GIB} GiB machine (its explanations take as much again); lower "
            f"it to at most {IMAGE_SET_MEMORY // per_image}")


def model_count_problem(count: int) -> str | None:
    """Why a suite of ``count`` models cannot be run (None: it can)."""
    if count <= MODELS.limit:
        return None
    return (f"the suite has {count} models ([references] count and held_out, each [[anomalies]] "
            f"entry's replicates, each [[sweeps]] value): at most {MODELS.limit}, as {MODELS.why}; "
            "lower them")


def pool_problem(key: str, count: int, pool: int, pool_what: str) -> str | None:
    """Why ``count`` images (``key``) cannot be drawn from a pool of ``pool`` (None: they can)."""
    if count <= pool:
        return None
    return (f"{key} = {count} images cannot be drawn from the {pool} {pool_what}: a set never "
            f"repeats an image; lower {key} to at most {pool}")
