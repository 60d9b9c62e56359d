"""A user's folder of images in place of a seeded image set: the suite's ``[image_sets]`` table.

The original code scored fixed, published PNG sets (``images/detection/imagenet/`` of m = 50, and
per anomaly ``images/localization/<anomaly>/normal/`` and ``.../abnormal/`` of p = 40, each read as
``0.png`` .. ``<n-1>.png``). ``[image_sets]`` maps a set's name to such a folder:

    [image_sets]
    detection = "${PAPER_IMAGES}/detection/imagenet"
    backdoor-nu0.05-abnormal = "${PAPER_IMAGES}/localization/backdoor_nu0.05/abnormal"
    backdoor-nu0.05-normal = "${PAPER_IMAGES}/localization/backdoor_nu0.05/normal"

Names: ``detection``, and per localizable model ``<model>-abnormal`` and ``<model>-normal`` (the
original's separate normal folder; without it the model's normal images are, as for a seeded
set, the first p detection images its family counts as normal).

A folder holds PNG or JPEG files (unlabelled), or class subfolders named by the class index
(``0/``, ``3/``, ... as the world numbers its classes), whose files are labelled with it. Labels
are needed only where something reads them: a method with ``explained_class = "label"`` (every
folder set), and a folder detection set from which a family that picks its normal images by class
(backdoor, missing class) takes them. Files are read in natural file-name order (digit runs as
numbers: ``2.png`` before ``10.png``, the original's index order), the first ``count`` of them
(the set's m or p) used, each converted to RGB uint8, never resized: an image of another size is
an error naming both sizes, as the original loaded its 224-px PNGs as they were.

When the suite is read, each of those files is decoded whole (train/core/image_files.py): a
decompression bomb, a corrupt or truncated file, a mode that has no 8-bit RGB reading is one line
naming the file, all of them in one error, before any training. The check's verdict is kept per
file (path, size, modification time) for the life of the process; it decodes no more than the
set's own read does (the set's count of images of the world's size).

Paths go through ``${VAR}`` expansion; the tool only reads these folders. A set's id is the hash
of its pixels and labels (not of the path): a renamed folder is the same set, a changed pixel a
new one.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from counteraudit.train.core.image_files import ImageFileError, open_rgb
from counteraudit.train.core.paths import expand_path

DETECTION = "detection"
ABNORMAL_SUFFIX = "-abnormal"
NORMAL_SUFFIX = "-normal"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
UNLABELLED = -1  # the label of an image of an unlabelled folder
# (path, size, mtime) of a file -> its decoded (width, height), or what stops it being decoded
_DECODED: dict[tuple[str, int, int], tuple[int, int] | str] = {}


def abnormal_name(model: str) -> str:
    return f"{model}{ABNORMAL_SUFFIX}"


def normal_name(model: str) -> str:
    return f"{model}{NORMAL_SUFFIX}"


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name)]


@dataclass(frozen=True)
class ImageFolder:
    """The image files of a folder, in the order they are read, and their labels (None:
    unlabelled)."""
    folder: Path
    files: tuple[Path, ...]
    labels: tuple[int, ...] | None

    @classmethod
    def read(cls, path: str, what: str) -> "ImageFolder":
        """The folder ``path`` (``${VAR}`` expanded) listed; a ValueError naming ``what`` (e.g.
        "[image_sets] detection") when it is missing or mixes files and class subfolders."""
        folder = Path(expand_path(path, what))
        if not folder.is_dir():
            raise ValueError(f"{what} = {path!r}: no folder {folder}; give a folder of PNG/JPEG "
                             "images (or of class subfolders 0/, 1/, ... holding them)")
        files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
        subfolders = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
        if files and subfolders:
            raise ValueError(f"{what}: {folder} holds both images and subfolders "
                             f"({subfolders[0].name}/); put every image in a class subfolder "
                             "(labelled) or none (unlabelled)")
        if not subfolders:
            return cls(folder, tuple(sorted(files, key=lambda p: _natural_key(p.name))), None)
        not_classes = sorted(p.name for p in subfolders if not p.name.isdigit())
        if not_classes:
            raise ValueError(f"{what}: subfolders of {folder} are class indices (0/, 1/, ...), "
                             f"not {', '.join(not_classes)}/; rename each to its class's index")
        labelled = sorted(((p, int(sub.name)) for sub in subfolders for p in sub.iterdir()
                           if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
                          key=lambda pair: (_natural_key(pair[0].name), pair[1]))
        return cls(folder, tuple(p for p, _ in labelled), tuple(label for _, label in labelled))

    def problems(self, what: str, count: int, side: int | None, needs_labels: str | None = None,
                 num_classes: int | None = None, count_key: str = "the set's count") -> list[str]:
        """What stops the first ``count`` images (``count_key``: the suite key that sets it) from
        being a set of ``side``-px images (None: the world's side is unknown), reading only the
        files, each decoded whole (``decoded_size``): every file that cannot be is one line.
        ``needs_labels``: why labels are needed (None: they are not)."""
        problems = []
        if len(self.files) < count:
            problems.append(f"{what}: {self.folder} holds {len(self.files)} image(s), the set needs "
                            f"{count} ({count_key} = {count}); add images to the folder, or lower "
                            f"{count_key}")
        if needs_labels and self.labels is None:
            problems.append(f"{what}: {self.folder} has no labels, and {needs_labels}; label its "
                            "images: one subfolder per class, named by the class index (0/, 1/, ...)")
        if self.labels is not None and num_classes is not None:
            wrong = sorted({label for label in self.labels[:count] if label >= num_classes})
            if wrong:
                problems.append(f"{what}: class subfolder(s) {wrong} of {self.folder} name no class "
                                f"of the world's {num_classes} (0 to {num_classes - 1})")
        sized = False
        for path in self.files[:count]:
            size = decoded_size(path)
            if isinstance(size, str):
                problems.append(f"{what}: {size}")
            elif side is not None and size != (side, side) and not sized:
                problems.append(f"{what}: {path} is {size[0]}x{size[1]} px, the world's images are "
                                f"{side}x{side}; resize the folder's images to {side}x{side} (they "
                                "are used as they are, as the original used its 224-px PNGs)")
                sized = True  # one wrong size says it: the others are likely the same
        return problems

    def load(self, what: str, count: int, side: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``count`` images, uint8 (count, side, side, 3) RGB, and their labels
        (``UNLABELLED`` each when the folder has none)."""
        problems = self.problems(what, count, side)
        if problems:
            raise ValueError("; ".join(problems))
        images = [np.asarray(open_rgb(path), dtype=np.uint8) for path in self.files[:count]]
        labels = self.labels[:count] if self.labels is not None else [UNLABELLED] * count
        return np.stack(images), np.asarray(labels, dtype=np.int64)


def decoded_size(path: Path) -> tuple[int, int] | str:
    """(width, height) of the file decoded whole as 8-bit RGB (``open_rgb``), or what stops it
    (a sentence naming the file); kept per (path, size, modification time)."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _DECODED:
        try:
            _DECODED[memo] = open_rgb(path).size
        except ImageFileError as error:
            _DECODED[memo] = str(error)
    return _DECODED[memo]


def content_digest(images: np.ndarray, labels: np.ndarray) -> str:
    """SHA-256 of a set's pixels (in order) and labels: what it is, wherever its files lie."""
    digest = hashlib.sha256()
    for array in (np.ascontiguousarray(images, dtype=np.uint8), np.asarray(labels, dtype=np.int64)):
        digest.update(repr(array.shape).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
