"""Atomic artifact writes, locks on the making of an artifact, seeds and the run-folder layout.

Every write goes to a temporary file in the destination folder and is renamed into place, so a
killed process never leaves a half-written file that a later run would take for a finished one.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from counteraudit.slurm.executor_config import DEFAULT_LOG_DIR
from counteraudit.train.core.runs_folder import RunsFolderError, inside_runs, runs_dir

def make_folder(path: str | os.PathLike) -> Path:
    """``path`` made (with its parents) once ``inside_runs`` allows it: how every folder the tool
    creates in its runs folder is made, so that no link on the way makes it elsewhere."""
    path = inside_runs(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic(path: Path, write: Callable[[io.BufferedWriter], None], chosen_by_user: bool) -> Path:
    """``write`` into a temporary file beside ``path``, renamed into place; ``path`` must lie in
    the runs folder (``inside_runs``) unless ``chosen_by_user`` (an output path given on the
    command line, e.g. report.py --output: written where the user asked)."""
    path = Path(path)
    if not chosen_by_user:
        inside_runs(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it owner-only; give it a normal file's mode
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        # "[Errno 28] No space left on device" names no file: name the one being written (torch.save
        # reports a failed write as a RuntimeError raised while handling the OSError)
        failed = error if isinstance(error, OSError) else error.__context__
        if isinstance(error, Exception) and isinstance(failed, OSError) and \
                failed.errno is not None and failed.filename is None:
            raise OSError(failed.errno, failed.strerror, str(path)) from error
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes, chosen_by_user: bool = False) -> Path:
    return _atomic(Path(path), lambda h: h.write(data), chosen_by_user)


def atomic_write_text(path: str | os.PathLike, text: str, chosen_by_user: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), chosen_by_user)


def atomic_write_json(path: str | os.PathLike, obj: Any, chosen_by_user: bool = False) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n",
                             chosen_by_user)


def atomic_torch_save(path: str | os.PathLike, obj: Any, chosen_by_user: bool = False) -> Path:
    return _atomic(Path(path), lambda h: torch.save(obj, h), chosen_by_user)


def atomic_save_npz(path: str | os.PathLike, **arrays: np.ndarray) -> Path:
    return _atomic(Path(path), lambda h: np.savez(h, **arrays), False)


@contextmanager
def artifact_lock(directory: str | os.PathLike, name: str, stage: str, what: str) -> Iterator[None]:
    """Held while this process makes one artifact, so that two runs that need it at once (two
    suites, two users, two shells on one runs folder) make it once: the second waits here,
    saying so, then must check again whether the artifact is there before making it.

    The lock is ``directory/name``, an advisory lock (flock) that the OS releases when the
    process ends, so a killed run never blocks others; the file stays (removing it would race
    with a process that just opened it). Where several processes make one artifact together
    (the ranks of one distributed training run), they must not take it: they would wait on each
    other. ``what`` completes "another process is ..." in the message."""
    import fcntl  # noqa: PLC0415  (POSIX only: imported here so that reading artifacts works everywhere)
    path = inside_runs(make_folder(directory) / name)
    try:  # O_NOFOLLOW: a link planted as the lock file (even a dangling one) is never followed
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o666)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise RunsFolderError(f"{path} is a symbolic link (to {os.readlink(path)}), where counteraudit "
                              "keeps a lock file of its own; it never opens a lock through a link: "
                              "remove the link") from None
    with os.fdopen(descriptor, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[{stage}] another process is {what}; waiting for it", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def lock_beside(directory: str | os.PathLike, stage: str, what: str) -> AbstractContextManager[None]:
    """``artifact_lock`` on a hidden file next to the artifact's folder (``.<folder>.lock``): the
    folder itself holds only the artifact's files."""
    directory = Path(directory)
    return artifact_lock(directory.parent, f".{directory.name}.lock", stage, what)


def find_or_make(find: Callable[[], Any], make: Callable[[], Any],
                 lock: AbstractContextManager[None]) -> Any:
    """``find()`` (the finished artifact, None while there is none), else ``make()`` under
    ``lock`` (``artifact_lock``), unless the process this one waited for made it meanwhile."""
    found = find()
    if found is not None:
        return found
    with lock:
        found = find()
        return found if found is not None else make()


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(inside_runs(path, reading=True).read_text())


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def stable_hash(obj: Any, length: int = 10) -> str:
    """Hash of a JSON-able object that does not depend on dict order or the Python process."""
    text = json.dumps(obj, sort_keys=True, default=_json_default, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any parts (base seed, purpose, epoch, ...), stable across processes."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------- the store
# Models, implant records, image sets and visualizations are stored once, under
# <runs root>/store/, in folders named by the key of what determines them; every suite that needs
# one finds it there. A suite's own folder (<runs root>/<suite>/) holds its tables and report, and
# links named for people (models/<name>-<key>, visualizations/<method>/<model>/<set>) that point
# into the store.
STORE = "store"
WORLDS_FOLDER = "worlds"  # <runs root>/worlds/: the worlds' generated caches
SLURM_LOGS = DEFAULT_LOG_DIR.name  # <runs root>/<suite>/slurm-logs/, and ./runs/slurm-logs/ by default
# The folders the tool keeps at the top of a runs folder, beside the suites' folders: no suite
# may be named like one (its files would mix into them).
OWN_FOLDERS = (STORE, WORLDS_FOLDER, SLURM_LOGS)


def store_dir(runs_root: str | os.PathLike | None = None) -> Path:
    """The one store of a runs root: <runs root>/store/."""
    return inside_runs(runs_dir(runs_root) / STORE, runs_root)


def marker_says(marker: str, field: str, expected: Any) -> Callable[[Path], bool]:
    """Whether a folder is one counteraudit wrote: its JSON ``marker`` file records ``field`` =
    ``expected`` (a model's key, an image set's id, a visualization's key)."""
    def is_own(folder: Path) -> bool:
        try:
            recorded = read_json(folder / marker)
        except (OSError, ValueError):
            return False
        return isinstance(recorded, dict) and recorded.get(field) == expected
    is_own.marker = f"{marker} with {field} {expected!r}"  # type: ignore[attr-defined]
    return is_own


def link_into_store(link: str | os.PathLike, target: str | os.PathLike,
                    runs_root: str | os.PathLike | None, is_own: Callable[[Path], bool]) -> Path:
    """Make ``link`` a relative symlink to ``target`` (a store folder), atomically; both must lie
    inside the runs folder.

    A real folder at ``link`` is what an older counteraudit wrote there (before the store), if
    ``is_own`` says so (``marker_says``: its marker file records the same key): if the store has
    no ``target`` yet, the folder is moved there (adopted: nothing is recomputed); otherwise it
    duplicates ``target`` and is removed. Anything else in the way (a folder that is not one of
    its own, a file) stops the run with a RunsFolderError, untouched."""
    link, target = Path(link), Path(target)
    inside_runs(link.parent, runs_root)
    inside_runs(target, runs_root)
    make_folder(link.parent)
    relative = os.path.relpath(target, link.parent)
    if link.is_symlink():  # replacing a link never touches what it points to
        if os.readlink(link) == relative:
            return link
    elif link.exists():
        if not link.is_dir() or not is_own(link):
            marker = getattr(is_own, "marker", "its marker file")
            raise RunsFolderError(
                f"{link} is in the way of a link into the store, and it is not a folder "
                f"counteraudit wrote (no {marker}); nothing was changed: move it out of the "
                "runs folder, or use another --runs-dir")
        if target.exists():
            shutil.rmtree(link)
        else:
            make_folder(target.parent)
            os.replace(link, target)
    tmp = link.parent / f".{link.name}.{os.getpid()}.link"
    tmp.unlink(missing_ok=True)
    os.symlink(relative, tmp)
    os.replace(tmp, link)
    return link


# ---------------------------------------------------------------- content hashes
# Every stored artifact's marker file records the SHA-256 of the data it marks as finished; a
# file that does not match (truncated, overwritten, bit rot) is moved aside and recomputed.
_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> digest: hash once


def file_sha256(path: str | os.PathLike) -> str:
    path = inside_runs(path, reading=True)
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[memo] = digest.hexdigest()
    return _DIGESTS[memo]


def set_aside(path: str | os.PathLike, problem: str, what: str = "stored artifact") -> Path | None:
    """Move a corrupt file out of the way (``<name>.corrupt``, kept for a person to look at) and
    say which file and why, so the caller recomputes it; nothing else is touched."""
    path = inside_runs(path)
    if not path.exists():
        return None
    aside = path.with_name(path.name + ".corrupt")
    os.replace(path, aside)
    print(f"counteraudit: {what} {path} is corrupt ({problem}); moved aside to {aside.name} and "
          "recomputing it", file=sys.stderr, flush=True)
    return aside


def intact(path: str | os.PathLike, expected_sha256: str | None, what: str = "stored artifact") -> bool:
    """Whether ``path`` exists and matches its recorded digest (None: recorded by an older version,
    taken as it is). A mismatch is set aside (``set_aside``) and reads as missing."""
    path = inside_runs(path, reading=True)
    if not path.is_file():
        return False
    if expected_sha256 is None:
        return True
    actual = file_sha256(path)
    if actual == expected_sha256:
        return True
    set_aside(path, f"SHA-256 {actual[:12]}... where {str(expected_sha256)[:12]}... was recorded; "
                    f"{path.stat().st_size} bytes", what)
    return False


def read_marker(path: str | os.PathLike, what: str = "stored artifact") -> Any | None:
    """A JSON marker file (metrics.json, params.json, index.json, ...), or None if it is missing or
    unreadable (a corrupt one is set aside)."""
    path = inside_runs(path, reading=True)
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        set_aside(path, f"not valid JSON: {error}", what)
        return None
