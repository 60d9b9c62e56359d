"""The runs folder: where a command's artifacts go (--runs-dir, $COUNTERAUDIT_RUNS, ./runs), and
its bound: no write, and no read of an artifact, outside it, whatever links a shared folder holds.
(The writers that check it are in artifacts.py.)"""
from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

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
# ``command_line.run_cli``) and ``stage.run_stage`` carries it into the processes and Slurm jobs that run
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
