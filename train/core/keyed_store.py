"""The one writer and reader of keyed artifacts: a payload file and, beside it, a JSON marker that
records the artifact's key and the payload's SHA-256.

Every kind of stored artifact (a model's weights, an image set, a visualization, findings, an
exhaustive reference, a score table) follows one protocol, written here once:

- writing: the marker is removed first (from then on the artifact reads as missing), the payload
  is written atomically, and the marker is written last, so its presence marks completion: a run
  killed in between leaves no marker, and the artifact is recomputed;
- reading: the artifact is there only if its marker is readable JSON of the kind's shape (an
  object; the digest, if recorded, a SHA-256; each field the kind's readers use, of its type),
  records the key asked for, the payload's SHA-256 equals the one the marker records, and the
  payload holds what the kind writes (``check``: plain arrays, never Python objects;
  train/core/payloads.py). A marker of any other shape is set aside before anything else is
  touched; a payload that fails is set aside and its marker removed: either way it is named and
  recomputed.

What differs between kinds is data, given to ``KeyedArtifact``: the two file names, the marker's
field names for the key and the digest, and how messages name the two files. The marker is
written by ``atomic_write_json`` (sorted keys, two-space indent), so its bytes depend only on its
fields.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from counteraudit.train.core.artifacts import (atomic_write_json, file_sha256, inside_runs, intact, marker_says,
                                               read_marker, set_aside)
from counteraudit.train.core.payloads import fields_problem, shown

SHA256 = re.compile(r"[0-9a-f]{64}")


def as_stored(key: Any) -> Any:
    """A key as a marker stores it: a JSON round trip, so tuples and lists (and int and str dict
    keys) compare equal to what a marker read back holds."""
    return json.loads(json.dumps(key, sort_keys=True))


@dataclass(frozen=True)
class KeyedArtifact:
    """One kind of keyed artifact, stored in a folder as ``payload`` and its ``marker``."""
    payload: str                 # the file name of the artifact itself
    marker: str                  # the file name of its JSON marker, written last
    digest_field: str            # the marker's field holding the payload's SHA-256
    what: str                    # how a message names the payload ("model weights")
    marker_what: str             # how a message names the marker ("model metrics")
    key_field: str = "key"       # the marker's field holding the key
    # the marker's fields that readers use, and their JSON types (a marker without one, or with
    # another type, is set aside as corrupt)
    fields: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)
    # what is wrong with a payload whose digest matched (train/core/payloads.py), given its
    # path and marker; None: nothing to check beyond the digest
    check: Callable[[Path, Mapping[str, Any]], str | None] | None = None

    def payload_path(self, directory: str | os.PathLike) -> Path:
        return Path(directory) / self.payload

    def marker_path(self, directory: str | os.PathLike) -> Path:
        return Path(directory) / self.marker

    def save(self, directory: str | os.PathLike, key: Any, write: Callable[[Path], Path],
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Store one artifact in ``directory``: ``write(path)`` writes the payload at ``path``
        atomically (e.g. ``atomic_save_npz``) and returns where it wrote; then the marker holds
        ``extra`` (fields for people browsing the folder), the key (``as_stored``) and the
        payload's digest. Returns the marker's fields."""
        marker = inside_runs(self.marker_path(directory))
        marker.unlink(missing_ok=True)  # from here until the marker is back, it reads as missing
        written = write(self.payload_path(directory))
        record = {**(extra or {}), self.key_field: as_stored(key),
                  self.digest_field: file_sha256(written)}
        atomic_write_json(marker, record)
        return record

    def read_marker(self, directory: str | os.PathLike) -> dict[str, Any] | None:
        """The marker's fields (its payload unchecked), or None: no marker, or one that is not
        JSON of the kind's shape (``marker_problem``; set aside, named, before anything else is
        read or moved)."""
        path = self.marker_path(directory)
        record = read_marker(path, self.marker_what)
        if record is None:
            return None
        problem = self.marker_problem(record)
        if problem is not None:
            set_aside(path, problem, self.marker_what)
            return None
        return record

    def marker_problem(self, record: Any) -> str | None:
        """What keeps ``record`` from being a marker of this kind: not an object, a digest that is
        not a SHA-256 (64 hex digits), a field its readers use missing or of another type."""
        problem = fields_problem(record, self.fields)
        if problem is not None:
            return problem
        digest = record.get(self.digest_field)
        if self.digest_field in record and not (isinstance(digest, str) and SHA256.fullmatch(digest)):
            return f"field {self.digest_field!r} is {shown(digest)}, not a SHA-256 (64 hex digits)"
        return None

    def require_marker(self, directory: str | os.PathLike, missing: str) -> dict[str, Any]:
        """``read_marker``, or a FileNotFoundError that says ``missing`` (what is not there and
        how to make it) and names the marker file."""
        record = self.read_marker(directory)
        if record is None:
            raise FileNotFoundError(f"{missing} (no readable {self.marker_path(directory)})")
        return record

    def find(self, directory: str | os.PathLike, key: Any = None) -> dict[str, Any] | None:
        """The marker of the finished artifact in ``directory`` whose key is ``key``, or None:
        missing, another key, or a payload that does not match its digest (set aside, and the
        marker removed). ``key`` None: any key (a kind whose folder is named by its key and
        whose older markers were never compared). A marker without a digest, as older versions
        wrote, takes its payload as it is, once ``check`` passes."""
        record = self.read_marker(directory)
        if record is None or (key is not None and record.get(self.key_field) != as_stored(key)):
            return None
        payload = self.payload_path(directory)
        if intact(payload, record.get(self.digest_field), self.what):
            problem = self.check(payload, record) if self.check is not None else None
            if problem is None:
                return record
            set_aside(payload, problem, self.what)
        self.marker_path(directory).unlink(missing_ok=True)  # the payload is gone: unfinished
        return None

    def require(self, directory: str | os.PathLike, missing: str) -> dict[str, Any]:
        """``find`` (any key), or a FileNotFoundError that says ``missing`` and names the files:
        what a reader calls right before reading the payload, so it reads a verified one."""
        record = self.find(directory)
        if record is None:
            raise FileNotFoundError(f"{missing} (no readable {self.marker_path(directory)} with "
                                    f"the {self.payload} it records)")
        return record

    def marks(self, key: Any) -> Callable[[Path], bool]:
        """Whether a folder's marker records ``key``: the ``is_own`` test of ``link_into_store``,
        which adopts an older layout's folder only when it holds this very artifact."""
        return marker_says(self.marker, self.key_field, as_stored(key))

    def is_stored(self, directory: str | os.PathLike, key: Any = None) -> bool:
        return self.find(directory, key) is not None

