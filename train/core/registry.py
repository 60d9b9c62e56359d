"""One registry per plug-in kind (worlds, architectures, anomaly families, methods, distances, ...).

Modelled on torchvision's ``register_model``: registering a name twice raises, and looking up an
unknown name lists the valid ones, so a typo in a suite file fails with the fix in the message.

A registry names the package (or module) its plug-ins live in, as a string, and imports it on
first lookup (``import_plugins``). So a registry is complete whenever it is read, nothing imports
a kind's plug-ins (and their libraries) until they are needed, and a lower layer can look up the
plug-ins of a higher one without importing it (train/core/registries.py). What a --help lists of
them, ``summaries``, is read from their source while they are not imported
(train/core/module_sources.py), so listing them loads none of their libraries.
"""
from __future__ import annotations

import difflib
import importlib
import sys
import threading
import weakref
from typing import ClassVar, Generic, Iterable, Iterator, TypeVar

from counteraudit.train.core.module_sources import declared_plugins, first_line, public_modules

T = TypeVar("T")

SHIPPED_PREFIX = "counteraudit."  # the package's own modules (a plug-in file's: counteraudit_plugins.)


def nearest(name: object, valid: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest valid name, or ''."""
    match = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def import_plugins(package: str) -> list[str]:
    """Import ``package`` and, when it is a package, every public module in it (names not starting
    with "_"), so each registers its plug-ins. Idempotent: imported modules are not run again.
    Returns the names of the modules imported."""
    module = importlib.import_module(package)
    if not hasattr(module, "__path__"):  # a module, not a package: its plug-ins are in it
        return [package]
    names = [f"{package}.{info.name}" for info in public_modules(module.__path__)]
    for name in names:
        importlib.import_module(name)
    return names


def entry_summary(entry: object) -> str:
    """The first line of the docstring of the module that defines a registered entry."""
    module = sys.modules.get(getattr(entry, "__module__", None))
    return first_line(getattr(module, "__doc__", None))


class UnknownNameError(LookupError):
    """A name that is not in a registry; the message lists the valid names."""


class Registry(Generic[T]):
    """Plug-ins of one kind by name. ``plugins``: the dotted package or module whose import
    registers them (None: entries are registered by whoever imports this registry)."""

    # Every registry, so a plug-in file can say what it registered (train/core/plugin_files.py).
    _all: ClassVar[weakref.WeakSet] = weakref.WeakSet()

    def __init__(self, kind: str, plugins: str | None = None):
        self.kind = kind  # e.g. "world", used in error messages
        self.plugins = plugins
        self._entries: dict[str, T] = {}
        self._pending = plugins is not None  # plug-ins not imported yet
        self._importing = False
        # Re-entrant: a plug-in module that reads its own registry while the plug-ins are being
        # imported sees the entries so far instead of importing them again; another thread waits.
        self._lock = threading.RLock()
        Registry._all.add(self)

    @classmethod
    def instances(cls) -> list["Registry"]:
        return sorted(cls._all, key=lambda registry: registry.kind)

    def loaded_entries(self) -> dict[str, T]:
        """The entries registered so far, without importing the plug-ins."""
        return dict(self._entries)

    def register(self, entry: T) -> T:
        """Add ``entry`` (a class or an instance) under its ``name`` attribute; returns it, so a
        class can be registered with ``@REGISTRY.register``."""
        key = getattr(entry, "name", None)
        if not isinstance(key, str) or not key:
            raise ValueError(f"{entry!r} must set a `name` (a non-empty string) to be registered "
                             f"as a {self.kind}")
        if key in self._entries:
            raise ValueError(f"{self.kind} {key!r} is already registered "
                             f"(by {self._entries[key]!r}); pick another name")
        self._entries[key] = entry
        return entry

    def _complete(self) -> dict[str, T]:
        """The entries, after importing the plug-ins on the first call."""
        if self._pending:
            with self._lock:
                if self._pending and not self._importing:
                    self._importing = True
                    try:
                        import_plugins(self.plugins)
                        self._pending = False
                    finally:  # a failed import is tried again on the next lookup
                        self._importing = False
        return self._entries

    def get(self, name: str) -> T:
        entries = self._complete()
        try:
            return entries[name]
        except KeyError:
            raise UnknownNameError(f"unknown {self.kind} {name!r}{nearest(name, entries)}; "
                                   f"valid {self.kind} names: "
                                   f"{', '.join(sorted(entries)) or '(none registered)'}") from None

    def names(self) -> list[str]:
        return sorted(self._complete())

    def shipped_names(self) -> list[str]:
        """The names of the plug-ins that ship with the package (defined in a ``counteraudit.``
        module): those its guides and shipped suites list, never a user's plug-in file's."""
        return [name for name, entry in sorted(self._complete().items())
                if getattr(entry, "__module__", "").startswith(SHIPPED_PREFIX)]

    def summaries(self) -> dict[str, str]:
        """name -> the first line of its module's docstring, by name: what a --help lists. Until
        the plug-ins are imported, those of the package are read from their source (a --help must
        not load their libraries), beside the entries registered so far (a plug-in file's); the
        plug-ins are imported where their source does not say (``declared_plugins``)."""
        declared = declared_plugins(self.plugins) if self._pending else None
        entries = self._complete() if declared is None else self.loaded_entries()
        said = {**(declared or {}), **{name: entry_summary(entry) for name, entry in entries.items()}}
        return dict(sorted(said.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._complete()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._complete())
