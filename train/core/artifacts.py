"""Atomic artifact writes, locks on the making of an artifact, seeds and the run-folder layout.

Every write goes to a temporary file in the destination folder and is renamed into place, so a
killed process never leaves a half-written file that a later run would take for a finished one.
"""
from __future__ import annotations

import errno
import functools
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

DEFAULT_RUNS_DIR = "runs"


class RunsFolderError(ValueError):
    """A path the tool would write outside its runs folder, or a folder in its way that it did
    not create: the tool stops rather than write there, move or delete it."""


def runs_dir(explicit: str | os.PathLike | None = None) -> Path:
    """Root of all artifacts: --runs-dir, else $COUNTERAUDIT_RUNS, else ./runs."""
    root = Path(explicit or os.environ.get("COUNTERAUDIT_RUNS") or DEFAULT_RUNS_DIR)
    if root.exists() and not root.is_dir():
        source = ("--runs-dir" if explicit else "$COUNTERAUDIT_RUNS"
                  if os.environ.get("COUNTERAUDIT_RUNS") else "the default runs folder")
        raise RunsFolderError(f"{source} {root} is a file, not a folder; give a folder for the "
                              "artifacts (it is made if missing), e.g. --runs-dir runs")
    return root


# ---------------------------------------------------------------- the runs folder's bound
# Every path the tool writes, and every artifact it reads, under its runs folder goes through
# ``inside_runs``: resolved (symbolic links and '..' followed), it must lie inside the resolved
# runs folder. A shared runs folder may hold a stranger's links (at runs/worlds, a suite's tables,
# a model's lock file, anywhere); a link that leads out is refused before anything is written
# through it or read from it. The writers below (``_atomic``, ``make_folder``, ``artifact_lock``,
# ``set_aside``) check every destination themselves, so the ~50 places that build paths pass no
# root: each command sets its process's runs folder once (``runs_folder_bound``, in
# ``stage.run_cli``) and ``stage.run_stage`` carries it into the processes and Slurm jobs that run
# its work items (``bound_to_runs_folder``). Outside a command (a library call, a test writing to
# a folder of its own) no runs folder is set and writers take paths as given.
_RUNS_FOLDER: list[Path] = []  # the runs folder of this process's command, absolute; [] outside one


@contextmanager
def runs_folder_bound(runs_root: str | os.PathLike | None) -> Iterator[Path]:
    """Within the block, every write and artifact read of this process must lie in the runs
    folder ``runs_root`` (``runs_dir`` picks it: --runs-dir, $COUNTERAUDIT_RUNS, ./runs)."""
    _RUNS_FOLDER.append(Path(os.path.abspath(runs_dir(runs_root))))
    try:
        yield _RUNS_FOLDER[-1]
    finally:
        _RUNS_FOLDER.pop()


def _bound_call(runs_root: Path, function: Callable[[Any], Any], item: Any) -> Any:
    with runs_folder_bound(runs_root):
        return function(item)


def bound_to_runs_folder(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``function``, carrying this process's runs folder to wherever it is called (a worker
    process, a Slurm job: picklable when ``function`` is); itself when none is set."""
    return functools.partial(_bound_call, _RUNS_FOLDER[-1], function) if _RUNS_FOLDER else function


def _escaping_link(path: Path, folder: Path, resolved_folder: Path) -> Path | None:
    """The first symbolic link on ``path``, below ``folder``, that leads outside it."""
    absolute = Path(os.path.abspath(path))
    for step in [*reversed(absolute.parents), absolute]:
        if step.is_relative_to(folder) and step != folder and step.is_symlink() and \
                not step.resolve().is_relative_to(resolved_folder):
            return step
    return None


def inside_runs(path: str | os.PathLike, runs_root: str | os.PathLike | None = None, *,
                reading: bool = False) -> Path:
    """``path`` if it lies inside the runs folder once resolved (symbolic links and '..'
    followed); else a RunsFolderError naming the path, where it leads and what to do.

    The runs folder: ``runs_root`` (``runs_dir``) if given, else the one this process's command
    set (``runs_folder_bound``); none: ``path`` is taken as given. ``reading``: a path that is
    not in the runs folder by name (a user's image folder, a checkpoint) may be read anywhere;
    one in it by name must not lead out of it (a stranger's link must not make the tool read
    their file as its artifact)."""
    path = Path(path)
    if runs_root is not None:
        folder = Path(os.path.abspath(runs_dir(runs_root)))
    elif _RUNS_FOLDER:
        folder = _RUNS_FOLDER[-1]
    else:
        return path
    resolved_folder, resolved = folder.resolve(), path.resolve()
    if resolved.is_relative_to(resolved_folder):
        return path
    absolute = Path(os.path.abspath(path))
    if reading and not (absolute.is_relative_to(folder) or absolute.is_relative_to(resolved_folder)):
        return path
    link = _escaping_link(path, folder, resolved_folder)
    through = f", through the symbolic link {link} -> {os.readlink(link)}" if link else ""
    fix = (f"remove the link ({link}) or use another --runs-dir" if link else
           "check the names in the suite file and any symbolic links in the runs folder")
    raise RunsFolderError(
        f"{path} resolves to {resolved}, outside the runs folder {resolved_folder}{through}; "
        f"counteraudit {'reads' if reading else 'writes'} only inside it, and nothing was "
        f"{'read' if reading else 'written'} there: {fix}")


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
