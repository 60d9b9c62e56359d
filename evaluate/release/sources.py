"""Where a release is read from: a folder, a ``.tar`` archive, or a Hugging Face Hub repository
pinned to a commit. Each opens as a local folder to verify (verify.py) before anything is
imported.

- A ``.tar`` is unpacked into a temporary folder outside the runs folder, and only after every
  entry was checked: a regular file or folder whose name is a plain relative path. A link, a
  device, an absolute name or a ``..`` stops it before a byte is unpacked.
- A Hub repository goes through ``huggingface_hub.snapshot_download`` (its cache, its offline
  mode: ``HF_HUB_OFFLINE=1`` reads the cache and never the network), pinned to a 40-digit commit:
  a branch or tag can move, a commit cannot. The cache's snapshot links into its ``blobs``
  folder; those links, and only those, are followed.
"""
from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from counteraudit.evaluate.release.manifest import path_problem
from counteraudit.train.core.size_bounds import RELEASE_BYTES, RELEASE_FILE_BYTES

HUB_PREFIX = "hf://"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class ReleaseError(ValueError):
    """A release refused before anything of it was imported; the message names the source, the
    file and the fix, and says that nothing was written."""


@dataclass(frozen=True)
class OpenedRelease:
    """A release as a local folder; ``links_within``: the folder its links may resolve into (a Hub
    cache's repository folder), None where no link is allowed."""
    source: str
    folder: Path
    links_within: Path | None = None
    ignored: frozenset[str] = frozenset()  # files the source itself adds (the Hub's .gitattributes)


def refused(source: str, problem: str) -> ReleaseError:
    return ReleaseError(f"population import refused: {source}: {problem}. Nothing was written.")


def _unpack_tar(path: Path, into: Path) -> None:
    """Every entry checked first, then the regular files written under ``into``."""
    try:
        with tarfile.open(path, "r:*") as archive:
            members = archive.getmembers()
            for member in members:
                problem = path_problem(member.name.removeprefix("./"))
                if member.isdir() and member.name in (".", "./"):
                    continue
                if problem:
                    raise refused(str(path), f"archive entry {member.name!r} {problem}")
                if not (member.isfile() or member.isdir()):
                    kind = "a link" if (member.issym() or member.islnk()) else "not a regular file"
                    raise refused(str(path), f"archive entry {member.name!r} is {kind}; a release "
                                             "holds regular files only")
            sizes = [member.size for member in members if member.isfile()]
            if max(sizes, default=0) > RELEASE_FILE_BYTES or sum(sizes) > RELEASE_BYTES:
                raise refused(str(path), f"its files hold {sum(sizes)} bytes, the largest "
                                         f"{max(sizes, default=0)}: more than a release may "
                                         f"({RELEASE_FILE_BYTES} a file, {RELEASE_BYTES} in all)")
            for member in members:
                if not member.isfile():
                    continue
                target = into / member.name.removeprefix("./")
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.extractfile(member) as data, open(target, "wb") as out:
                    shutil.copyfileobj(data, out)
    except tarfile.TarError as error:
        raise refused(str(path), f"not a readable tar archive ({error})") from None


def _hub_snapshot(repo_id: str, revision: str | None, cache_dir: str | None) -> OpenedRelease:
    source = f"{HUB_PREFIX}{repo_id}"
    if not REPO_ID.match(repo_id):
        raise refused(source, "is not a Hub repository id (owner/name)")
    if revision is None or not COMMIT.match(revision):
        raise refused(source, f"--revision {revision!r} is not a commit: pin the release to the "
                              "40-hex-digit commit it was published at (a branch or tag can move)")
    try:
        folder = Path(snapshot_download(repo_id=repo_id, revision=revision, cache_dir=cache_dir))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as error:
        raise refused(f"{source}@{revision}", f"the Hub snapshot could not be read ({error}); "
                                              "offline (HF_HUB_OFFLINE=1), it must be in the "
                                              "cache (--hub-cache)") from None
    # <cache>/models--owner--name/snapshots/<commit>: its links lead into the repository's blobs
    return OpenedRelease(f"{source}@{revision}", folder, links_within=folder.parents[1],
                         ignored=frozenset({".gitattributes"}))


@contextmanager
def opened_release(source: str, revision: str | None = None,
                   hub_cache: str | None = None) -> Iterator[OpenedRelease]:
    """The release at ``source`` as a local folder, for as long as the context lasts."""
    if source.startswith(HUB_PREFIX):
        yield _hub_snapshot(source.removeprefix(HUB_PREFIX), revision, hub_cache)
        return
    path = Path(source)
    if path.is_dir():
        yield OpenedRelease(source, path)
    elif path.is_file() and tarfile.is_tarfile(path):
        with tempfile.TemporaryDirectory(prefix="counteraudit-release-") as unpacked:
            _unpack_tar(path, Path(unpacked))
            yield OpenedRelease(source, Path(unpacked))
    elif path.exists():
        raise refused(source, "is neither a folder nor a tar archive")
    else:
        raise refused(source, f"no such folder or archive (a Hub repository is given as "
                              f"{HUB_PREFIX}owner/name --revision COMMIT)")
