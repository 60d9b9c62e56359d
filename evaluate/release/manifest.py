"""The manifest of a population release: what it holds and the SHA-256 of every file.

One format, versioned like torchvision's ``WeightsEnum``: ``format_version`` is bumped when the
layout changes, and an importer refuses a version it does not know instead of guessing. The
manifest's own SHA-256 names the release (``population id``): a user who pins it, or a Hub
revision, pins every byte of the population.

Layout of a release folder (or of a ``.tar`` of it, or of a Hugging Face Hub repository):

    manifest.json                       this file
    README.md                           the model card (Hugging Face Hub's layout: YAML metadata)
    suite/<file>.toml                   the suite file and the files it extends, as they were
    models/<key>/spec.json              what determines the weights (its key is their hash)
    models/<key>/weights.safetensors    the weights (tensors only: nothing to unpickle)
    models/<key>/metrics.json           accuracy, timing, numerics of the training run
    models/<key>/implant-<refs>.json    the implant check against the suite's references
    models/<key>/implant-figures/*.json the references' cached implant figures
    image_sets/<id>/{images.npz,index.json,png/*.png}   the image sets explained
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from counteraudit.train.core.size_bounds import MODELS, RELEASE_FILE_BYTES

FORMAT = "counteraudit-population"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
CARD_NAME = "README.md"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
KEY_PATTERN = r"^[0-9a-f]{10}$"
# What a release may hold, by suffix: data formats that load without unpickling. Anything else is
# refused; these by name, as files that unpickle when read.
ALLOWED_SUFFIXES = (".json", ".safetensors", ".npz", ".png", ".md", ".toml")
PICKLE_SUFFIXES = (".pth", ".pt", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib", ".npy")
# A path inside a release: relative, "/"-separated, each part a plain name.
PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]{0,127}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FileEntry(Strict):
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0, le=RELEASE_FILE_BYTES)


class ModelEntry(Strict):
    name: str
    key: str = Field(pattern=KEY_PATTERN)
    role: Literal["reference", "held-out", "anomalous"]
    family: str
    val_accuracy: float


class ImageSetEntry(Strict):
    name: str
    id: str = Field(pattern=KEY_PATTERN)


class WorldEntry(Strict):
    definition: dict            # the suite's [world] table
    data: dict[str, FileEntry]  # the world's generated files where the exporter had them


class Manifest(Strict):
    format: Literal["counteraudit-population"]
    format_version: int
    suite: str
    suite_file: str                     # suite/<file>.toml: the file the models are named by
    counteraudit: dict[str, str]        # the code that made it: version, git commit
    numerics: dict[str, str]            # the key tag every model's key carries
    world: WorldEntry
    models: list[ModelEntry] = Field(max_length=MODELS.limit)
    image_sets: list[ImageSetEntry]
    files: dict[str, FileEntry]         # every file but manifest.json, by release path


def path_problem(path: str) -> str | None:
    """What is wrong with a release path, or None: it must be relative, "/"-separated, and each
    part a plain name (no "..", no hidden files, no drive or absolute root)."""
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or "\\" in path:
        return "is not a relative path inside the release"
    bad = [part for part in parts if not PART.match(part)]
    if bad:
        return f"has the part {bad[0]!r}, which is not a plain name (it could leave the runs folder)"
    return None


def type_problem(path: str) -> str | None:
    """What is wrong with a file's type, or None: pickles are refused by name, and so is every
    suffix a release does not hold."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        return (f"is a {suffix} file, which loads by unpickling (it could run code); a release "
                "holds weights as .safetensors")
    if suffix not in ALLOWED_SUFFIXES:
        return f"has the suffix {suffix or '(none)'!r}; a release holds only {', '.join(ALLOWED_SUFFIXES)} files"
    return None
