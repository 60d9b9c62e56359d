"""Plug-ins from a file outside the package: ``--plugins my_method.py`` or a suite's
``plugins = ["my_method.py"]``.

A plug-in file is imported as a module of its own, ``counteraudit_plugins.<stem>_<sha8>``, so its
``@METHODS.register`` (``@FAMILIES.register``, ...) decorators register into the same registries a
shipped plug-in module registers into. A loaded file is known by its absolute path and its
SHA-256: the suite carries both (``Suite.plugin_files``), so a work item run by a local worker or
a Slurm job (a fresh interpreter) loads the very file the run was planned with, and refuses one
that changed since (``sealed_item``). The digest also enters the keys of what the file's
plug-ins compute (``plugin_digest``): editing the file never reuses a stale result, while the
shipped plug-ins' keys stay what they were.
"""
from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import json
import pickle
import re
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counteraudit.train.core.registry import Registry
from counteraudit.train.core.table_problems import raise_problems

PLUGIN_PACKAGE = "counteraudit_plugins"


class PluginFileError(ValueError):
    """A plug-in file that cannot be used as given; the message names the file and the fix."""


@dataclass(frozen=True)
class PluginFile:
    """One loaded plug-in file: its absolute path and the SHA-256 of its bytes."""
    path: str
    sha256: str

    @property
    def module_name(self) -> str:
        stem = re.sub(r"\W", "_", Path(self.path).stem) or "plugin"
        return f"{PLUGIN_PACKAGE}.{stem}_{self.sha256[:8]}"


# module name -> the file it was loaded from, in this process
_LOADED: dict[str, PluginFile] = {}
_lock = threading.RLock()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def command_line_plugin(path: str | Path) -> Path:
    """A ``--plugins`` path, the user's own choice: it must exist and be a .py file."""
    given = Path(path).expanduser()
    if given.suffix != ".py":
        raise PluginFileError(f"--plugins {path}: a plug-in file is a Python file ending in .py")
    if not given.is_file():
        raise PluginFileError(f"--plugins {path}: no such file; give the path of your plug-in's "
                              ".py file")
    return given.resolve()


def load_plugin_file(path: str | Path, *, announce: bool = True) -> PluginFile:
    """Import the file at ``path`` (once per content: loading it again is a no-op) so its
    plug-ins register; ``announce``: print one line with its digest and what it registered."""
    path = Path(path).resolve()
    try:
        loaded = PluginFile(str(path), file_sha256(path))
    except OSError as error:
        raise PluginFileError(f"plug-in file {path} cannot be read: {error.strerror}") from None
    with _lock:
        if loaded.module_name in _LOADED:
            return loaded
        _import(loaded)
        _LOADED[loaded.module_name] = loaded
    if announce:
        print(f"plug-in file {loaded.path} (sha256 {loaded.sha256[:12]}) registered "
              f"{', '.join(registered_by(loaded.module_name)) or 'nothing'}", flush=True)
    return loaded


def _import(plugin: PluginFile) -> None:
    """Run the file as the module ``plugin.module_name`` (in sys.modules before it runs, as an
    imported module is: its dataclasses and pickles look it up by name)."""
    if PLUGIN_PACKAGE not in sys.modules:
        package = types.ModuleType(PLUGIN_PACKAGE, "plug-ins loaded from files outside the package")
        package.__path__ = []
        sys.modules[PLUGIN_PACKAGE] = package
    spec = importlib.util.spec_from_file_location(plugin.module_name, plugin.path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[plugin.module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[plugin.module_name]
        raise PluginFileError(f"plug-in file {plugin.path} failed to load: "
                              f"{type(error).__name__}: {error}") from error


def registered_by(module_name: str) -> list[str]:
    """'method my_method', ... : every registry entry defined in the module ``module_name``."""
    return [f"{registry.kind} {name}" for registry in Registry.instances()
            for name, entry in registry.loaded_entries().items()
            if getattr(entry, "__module__", None) == module_name]


def plugin_digest(entry: Any) -> str | None:
    """The SHA-256 of the file that defined ``entry`` (a registered class or instance), or None
    for a shipped plug-in: what a key adds for a plug-in from a file, and only for one."""
    loaded = _LOADED.get(getattr(entry, "__module__", None))
    return loaded.sha256 if loaded is not None else None


def plugin_description(kind: str, entry: Any, params: dict[str, Any]) -> dict[str, Any]:
    """What a plug-in's stored results are keyed by: ``{kind: its name, "version", "params"}``
    (``params`` as ``recorded_params`` gives them), and for a plug-in from a file of the user's
    that file's SHA-256 (``<kind>_file_sha256``): editing the file computes anew."""
    description = {kind: entry.name, "version": entry.version, "params": params}
    digest = plugin_digest(entry)
    if digest is not None:
        description[f"{kind}_file_sha256"] = digest
    return description


def checked_plugin_file(plugin: PluginFile) -> PluginFile:
    """``plugin`` loaded in this process (a worker's, a Slurm job's), after checking that the
    file still has the digest the run was planned with."""
    if plugin.module_name in _LOADED:
        return plugin
    try:
        now = file_sha256(Path(plugin.path))
    except OSError as error:
        raise PluginFileError(f"plug-in file {plugin.path} cannot be read by this worker: "
                              f"{error.strerror}; it must stay where the run was started") from None
    if now != plugin.sha256:
        raise PluginFileError(f"plug-in file {plugin.path} changed after this run was planned "
                              f"(sha256 {plugin.sha256[:12]} then, {now[:12]} now): a worker will "
                              "not run other code than the run was planned with; run the command "
                              "again")
    return load_plugin_file(plugin.path, announce=False)


# ---------------------------------------------------------------- work items
class ItemNotLoaded:
    """A work item whose plug-in files could not be loaded where it runs: any use of it raises
    the reason, so the executor reports it as that item's failure (an error while a worker
    unpickles its item would end the worker, and the whole pool with it)."""

    def __init__(self, reason: str):
        self._reason = reason

    def __getattr__(self, name: str):
        raise PluginFileError(self._reason)


def sealed_item(item: Any, plugin_files: tuple[PluginFile, ...], protocol: int):
    """``__reduce_ex__`` of a work item that needs plug-in files: the files first, then the item
    itself as bytes, unpickled only once the files are loaded (its fields may hold a plug-in's
    own classes: a method's parameters)."""
    values = {name: getattr(item, name) for name in item.__dataclass_fields__}
    return unsealed_item, (plugin_files, type(item), pickle.dumps(values, protocol=max(protocol, 2)))


def unsealed_item(plugin_files: tuple[PluginFile, ...], item_class: type, payload: bytes):
    try:
        for plugin in plugin_files:
            checked_plugin_file(plugin)
        values = pickle.loads(payload)
    except Exception as error:  # reported as the item's failure (ItemNotLoaded)
        return ItemNotLoaded(str(error))
    item = object.__new__(item_class)
    for name, value in values.items():
        object.__setattr__(item, name, value)
    return item


# ---------------------------------------------------------------- where the files come from
# The command line's --plugins files, loaded by the entry script (``run_cli``): every suite the
# command loads carries them.
_command_line: contextvars.ContextVar[tuple[PluginFile, ...]] = contextvars.ContextVar(
    "command_line_plugins", default=())


@contextmanager
def command_line_plugins(paths: list[str] | None) -> Iterator[tuple[PluginFile, ...]]:
    """Load the ``--plugins`` files (each checked: it exists, it is a .py file) for the command
    that runs inside; ``load_suite`` adds them to every suite it loads."""
    loaded = tuple(load_plugin_file(command_line_plugin(path)) for path in paths or [])
    token = _command_line.set(loaded)
    try:
        yield loaded
    finally:
        _command_line.reset(token)


def command_line_plugin_files() -> tuple[PluginFile, ...]:
    return _command_line.get()


SUITE_PLUGINS_FIX = ('list .py files by their path relative to the suite file\'s folder, inside '
                     'it (plugins = ["my_method.py"]); a file of yours elsewhere is given on the '
                     "command line instead: --plugins PATH")


def suite_plugin_paths(entries: Any, suite_file: Path) -> list[str]:
    """A suite file's ``plugins`` entries as absolute paths. The file may come from a stranger,
    and a plug-in is code that runs: only .py files inside the suite file's own folder, named
    relative to it (no absolute path, no '..', no link out of the folder); one SuiteFileError
    (``raise_problems``) names the file, the key and the fix."""
    where = f"plugins = {json.dumps(entries, default=str)}"
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        raise_problems(suite_file, [f"{where} must be a list of paths in quotes; {SUITE_PLUGINS_FIX}"])
    folder = suite_file.parent.resolve()
    paths, problems = [], []
    for entry in entries:
        given = Path(entry)
        resolved = (folder / given).resolve()
        if given.is_absolute() or entry.startswith(("~", "\\")) or given.drive:
            problems.append(f"{entry!r} is an absolute path")
        elif ".." in given.parts or not resolved.is_relative_to(folder):
            problems.append(f"{entry!r} leaves the suite file's folder {folder}")
        elif given.suffix != ".py":
            problems.append(f"{entry!r} is not a .py file")
        elif not resolved.is_file():
            problems.append(f"{entry!r}: no such file in {folder}")
        else:
            paths.append(str(resolved))
    if problems:
        raise_problems(suite_file, [f"{where}: {'; '.join(problems)}; {SUITE_PLUGINS_FIX}"])
    return paths


def inherited_plugins(base: list[str], own: list[str]) -> list[str]:
    """An ``extends`` chain's plug-in files: the base's, then the extending file's (each entry
    already made absolute from its own file's folder), each once."""
    return list(dict.fromkeys([*base, *own]))
