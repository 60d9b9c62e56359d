"""The one writer and reader of keyed artifacts: a payload file and, beside it, a JSON marker that
records the artifact's key and the payload's SHA-256.

Every kind of stored artifact (a model's weights, an image set, a visualization, findings, an
exhaustive reference, a score table) follows one protocol, written here once:

- writing: the marker is removed first (from then on the artifact reads as missing), the payload
  is written atomically, and the marker is written last, so its presence marks completion: a run
  killed in between leaves no marker, and the artifact is recomputed;
- reading: the artifact is there only if its marker is readable JSON, records the key asked for,
  and the payload's SHA-256 equals the one the marker records. A payload that does not match
  (truncated, overwritten) is set aside and its marker removed, so it is recomputed; a marker
  that is not JSON is set aside (``read_marker``).

What differs between kinds is data, given to ``KeyedArtifact``: the two file names, the marker's
field names for the key and the digest, and how messages name the two files. The marker is
written by ``atomic_write_json`` (sorted keys, two-space indent), so its bytes depend only on its
fields.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from counteraudit.train.core.artifacts import (atomic_write_json, file_sha256, inside_runs, intact, marker_says,
                                               read_marker)


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
        """The marker's fields as they are (its payload unchecked), or None: no marker, or not a
        JSON object (one that is not JSON is set aside)."""
        record = read_marker(self.marker_path(directory), self.marker_what)
        return record if isinstance(record, dict) else None

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
        wrote, takes its payload as it is."""
        record = self.read_marker(directory)
        if record is None or (key is not None and record.get(self.key_field) != as_stored(key)):
            return None
        if intact(self.payload_path(directory), record.get(self.digest_field), self.what):
            return record
        self.marker_path(directory).unlink(missing_ok=True)  # the payload is gone: unfinished
        return None

    def marks(self, key: Any) -> Callable[[Path], bool]:
        """Whether a folder's marker records ``key``: the ``is_own`` test of ``link_into_store``,
        which adopts an older layout's folder only when it holds this very artifact."""
        return marker_says(self.marker, self.key_field, as_stored(key))

    def is_stored(self, directory: str | os.PathLike, key: Any = None) -> bool:
        return self.find(directory, key) is not None
