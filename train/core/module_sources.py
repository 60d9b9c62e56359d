"""Modules read as source, without running them or their package's ``__init__``: what a --help says
about code it must not load, whose libraries (torch) take seconds to import. The command's list
of stage scripts reads each script's docstring (evaluate/cli.py); a registry lists the plug-ins
its package declares, each with the first line of its module's docstring (``Registry.summaries``,
train/core/registry.py).
"""
from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import pkgutil
import sys
from pathlib import Path


def unimported_spec(module_name: str) -> importlib.machinery.ModuleSpec:
    """The spec of ``module_name`` (its file; a package's folders too), found without running it
    nor its own package's ``__init__``: that package is located, not imported (only those above
    it are). A module already imported gives its own spec (a package's folders as it has them)."""
    loaded = sys.modules.get(module_name)
    if loaded is not None and getattr(loaded, "__spec__", None) is not None:
        return loaded.__spec__
    package, _, leaf = module_name.rpartition(".")
    if not package:
        return importlib.util.find_spec(module_name)
    locations = importlib.util.find_spec(package).submodule_search_locations
    return importlib.machinery.PathFinder.find_spec(leaf, locations)


def source_tree(spec: importlib.machinery.ModuleSpec) -> ast.Module | None:
    """A module's parsed source; None where it has no Python source file (a compiled module)."""
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"))


def module_docstring(module_name: str) -> str:
    """A module's docstring, read from its source, as written."""
    tree = source_tree(unimported_spec(module_name))
    return (ast.get_docstring(tree, clean=False) if tree is not None else None) or ""


def first_line(docstring: str | None) -> str:
    """The first line of a docstring: what a list of plug-ins says of each."""
    return (docstring or "").strip().split("\n")[0]


def public_modules(locations: list[str]) -> list[pkgutil.ModuleInfo]:
    """The modules of a package's folders that hold plug-ins: every one whose name does not start
    with "_"."""
    return [info for info in pkgutil.iter_modules(locations) if not info.name.startswith("_")]


def declared_plugins(plugins: str) -> dict[str, str] | None:
    """name -> the first line of its module's docstring, for each plug-in that ``plugins`` (a
    package's modules, or one module) registers, read from their source. A plug-in is read where
    it is a class decorated ``@<REGISTRY>.register`` that sets a literal ``name = "..."``; None
    when a module registers in another way (``REGISTRY.register(entry)``, a name computed or
    inherited) or has no source: then only importing the modules tells."""
    spec = unimported_spec(plugins)
    if spec is None:
        return None
    specs = ([spec] if spec.submodule_search_locations is None else
             [info.module_finder.find_spec(info.name) for info in public_modules(spec.submodule_search_locations)])
    declared = {}
    for module_spec in specs:
        tree = source_tree(module_spec)
        names = registered_names(tree) if tree is not None else None
        if names is None:
            return None
        declared.update(dict.fromkeys(names, first_line(ast.get_docstring(tree))))
    return declared


def registered_names(tree: ast.Module) -> list[str] | None:
    """The names of the classes a module registers with ``@<REGISTRY>.register``; None where it
    registers anything in a way its source does not say by name."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_register(node.func):
            return None  # REGISTRY.register(entry): an instance, named when it runs
        if isinstance(node, ast.ClassDef) and any(map(_is_register, node.decorator_list)):
            name = _literal_name(node)
            if name is None:
                return None
            names.append(name)
    return names


def _is_register(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "register"


def _literal_name(node: ast.ClassDef) -> str | None:
    """A class's ``name = "..."`` (or ``name: str = "..."``), where its body sets it to a string."""
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "name":
            return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
    return None
