"""The protocol settings a method without its own ``[methods.<name>]`` table takes from the suite,
so a method evaluated against the suite's is drawn and differentiated as they are.

The rule (explain/README.md, "Evaluate a new method"): the shared settings are ``gradient_space``,
``aug_smooth_space`` and the pair (``renderer``, ``renderer_options``). A method the suite gives no
table takes each one its ``Params`` has from the suite's methods that have a table, render the
same kind of map (attributions or CAMs) and have that setting too, when they all set it alike;
where they differ, or none has it, the method keeps its own default. A method with its own table
keeps its table (and its defaults for what the table leaves out).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from counteraudit.explain.base import METHODS
from counteraudit.train.core.params import parse_params

# Each group is taken whole: a renderer's options only make sense with that renderer.
SHARED_SETTINGS: tuple[tuple[str, ...], ...] = (
    ("gradient_space",), ("aug_smooth_space",), ("renderer", "renderer_options"))


@dataclass(frozen=True)
class SharedSetting:
    """One group of ``SHARED_SETTINGS`` as the suite's methods of a kind set it: each source
    method's values, in the group's order."""
    fields: tuple[str, ...]
    by_source: dict[str, tuple[Any, ...]]

    @property
    def agreed(self) -> bool:
        return len({json.dumps(values, sort_keys=True, default=str)
                    for values in self.by_source.values()}) == 1

    @property
    def values(self) -> dict[str, Any]:
        """The values the sources agree on (call only when ``agreed``)."""
        return dict(zip(self.fields, next(iter(self.by_source.values()))))


def field_names(params_class: type) -> set[str]:
    return {field.name for field in dataclasses.fields(params_class)}


def shared_settings(tables: Mapping[str, Mapping[str, Any]], name: str) -> list[SharedSetting]:
    """The groups of ``SHARED_SETTINGS`` the method ``name`` has, as the methods with a table in
    ``tables`` (a suite's ``[methods]``) that render its kind of map set them (groups no such
    method has are left out)."""
    method = METHODS.get(name)
    kind = getattr(method, "renders", None)
    if kind is None:  # a method that draws its own images has no renderer or input space
        return []
    own_fields = field_names(method.Params)
    settings = []
    for group in SHARED_SETTINGS:
        if not set(group) <= own_fields:
            continue
        by_source = {}
        for source, table in tables.items():
            source_method = METHODS.get(source)
            if (source == name or getattr(source_method, "renders", None) != kind
                    or not set(group) <= field_names(source_method.Params)):
                continue
            params = parse_params(source_method.Params, table, f"method {source!r}")
            by_source[source] = tuple(getattr(params, field) for field in group)
        if by_source:
            settings.append(SharedSetting(group, by_source))
    return settings


def inherited_table(tables: Mapping[str, Mapping[str, Any]], name: str) -> dict[str, Any]:
    """The table the method ``name`` runs with when ``tables`` has none for it: the shared
    settings the suite's methods of its kind agree on, where they differ from its defaults."""
    defaults = METHODS.get(name).Params()
    return {field: value for setting in shared_settings(tables, name) if setting.agreed
            for field, value in setting.values.items() if value != getattr(defaults, field)}


def inheritance_line(tables: Mapping[str, Mapping[str, Any]], name: str, suite_file: Any) -> str | None:
    """What the method ``name``, which ``suite_file`` gives no table, takes from it and from
    where, and what it keeps because the suite's methods differ; None when nothing applies."""
    defaults = METHODS.get(name).Params()
    taken, sources, kept = [], set(), []
    for setting in shared_settings(tables, name):
        named = ", ".join(f"[methods.{source}]" for source in setting.by_source)
        if not setting.agreed:
            by_values: dict[str, list[str]] = {}
            for source, values in setting.by_source.items():
                by_values.setdefault(_values_text(dict(zip(setting.fields, values))), []).append(source)
            differing = "; ".join(f"{text} in {', '.join(sources)}" for text, sources in by_values.items())
            kept.append(f"its default {' and '.join(setting.fields)} (the suite's methods differ: "
                        f"{differing})")
        elif any(value != getattr(defaults, field) for field, value in setting.values.items()):
            taken.append((_values_text(setting.values), named))
            sources.add(named)
    if not taken and not kept:
        return None
    taken_text = (f"{', '.join(text for text, _ in taken)} (from {sources.pop()})" if len(sources) == 1
                  else "; ".join(f"{text} (from {named})" for text, named in taken))
    parts = ([f"takes {taken_text}"] if taken else []) + ([f"keeps {'; '.join(kept)}"] if kept else [])
    return (f"{name}: no [methods.{name}] table in {suite_file}; of the settings the suite's "
            f"methods of its kind of map share, it {'; '.join(parts)}")


def _values_text(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{field} = {json.dumps(value)}" for field, value in values.items()
                     if value is not None) or "the defaults"
