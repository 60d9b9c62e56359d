"""One registry per plug-in kind (worlds, architectures, anomaly families, methods, distances).

Modelled on torchvision's ``register_model``: registering a name twice raises, and looking up an
unknown name lists the valid ones, so a typo in a suite file fails with the fix in the message.
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")


def nearest(name: object, valid: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest valid name, or ''."""
    match = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


class UnknownNameError(LookupError):
    """A name that is not in a registry; the message lists the valid names."""


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind  # e.g. "world", used in error messages
        self._entries: dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            key = name or getattr(obj, "name", None) or obj.__name__  # type: ignore[attr-defined]
            if key in self._entries:
                raise ValueError(f"{self.kind} {key!r} is already registered "
                                 f"(by {self._entries[key]!r}); pick another name")
            self._entries[key] = obj
            return obj
        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(f"unknown {self.kind} {name!r}{nearest(name, self._entries)}; "
                                   f"valid {self.kind} names: "
                                   f"{', '.join(sorted(self._entries)) or '(none registered)'}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
