"""Suites: one TOML file names the world, architecture, recipe, references and anomalous models.

A suite expands into ``ModelSpec``s. A spec holds everything that determines a checkpoint, and its
hash names the model's artifact folder, so changing a recipe or a parameter never reuses a stale
checkpoint. Shipped suites live in ``train/suites/``; ``--suite`` also takes a path to a file.

A suite may start from another: ``extends = "demo"`` (a shipped suite's name, or a path relative to
the extending file) takes every table of that suite, and the extending file's tables override it
key by key (a nested table merges; a value or an array, ``[[anomalies]]`` included, replaces). The
name is never inherited: it is the file's own ``name`` or its file name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counteraudit.train.core.artifacts import (
    OWN_FOLDERS,
    atomic_write_text,
    inside_runs,
    runs_dir,
)
from counteraudit.train.core.model_spec import (
    HELD_OUT,
    REFERENCE,
    ModelSpec,
    Sweep,
    _expand_sweep,
    _replicates,
    safe_name,
)
from counteraudit.train.core.paths import redacted
from counteraudit.train.core.recipe import Recipe, recipe_problems
from counteraudit.train.core.registries import (
    ARCHITECTURES,
    FAMILIES,
    WORLDS,
)
from counteraudit.train.core.suite_checks import (
    _entry_problems,
    _plugin_problems,
    _recipe_and_world_problems,
    _size_problems,
    _world_problems,
    image_folder_problems,
    null_problems,
)
from counteraudit.train.core.suite_files import _overridden, _read_table, _suite_path, toml_text
from counteraudit.train.core.suite_schema import (
    ReferencesTable,
    SuiteFileError,
    SuiteTable,
    check_table,
    raise_problems,
)


@dataclass
class Suite:
    name: str
    path: Path
    world: dict[str, Any]
    architecture: str
    recipe: Recipe
    references: list[ModelSpec]
    anomalies: list[ModelSpec]
    tables: dict[str, Any]          # the other tables ([explain], [evaluate], [slurm], ...)
    # Null models: more seeds trained exactly like the references and scored as if anomalous
    # against them ([references] held_out = k), so a method's detection rule shows how often it
    # flags a normal model. Same keys as references of those seeds: shared through the store.
    held_out: list[ModelSpec] = field(default_factory=list)
    sweeps: list[Sweep] = field(default_factory=list)  # their models are among ``anomalies``
    held_out_check: int = 0  # the last held_out models check the null p-values ([references])

    @property
    def models(self) -> list[ModelSpec]:
        return self.references + self.held_out + self.anomalies

    @property
    def null_fit(self) -> list[ModelSpec]:
        """The held-out references that fit the null p-values (all but the checking ones)."""
        return self.held_out[:len(self.held_out) - self.held_out_check]

    @property
    def null_check(self) -> list[ModelSpec]:
        """The held-out references, disjoint from ``null_fit``, that check their calibration."""
        return self.held_out[len(self.held_out) - self.held_out_check:]

    def model(self, name: str) -> ModelSpec:
        for spec in self.models:
            if spec.name == name:
                return spec
        raise ValueError(f"suite {self.name!r} has no model {name!r}; its models are: "
                         f"{', '.join(s.name for s in self.models)}")

    def table_rows(self) -> tuple[dict[str, str], list[str]]:
        """({anomalous model: its Table 1 row}, the rows in order): rows of stark families first,
        then by family in registry order, then in the suite's order."""
        rows = {spec.name: spec.table_row for spec in self.anomalies}
        family_rank = {name: rank for rank, name in enumerate(FAMILIES.names())}
        first = {}
        for position, spec in enumerate(self.anomalies):
            first.setdefault(spec.table_row, (not FAMILIES.get(spec.family).stark,
                                              family_rank[spec.family], position))
        return rows, sorted(first, key=first.__getitem__)

    def root(self, runs_root: str | Path | None = None) -> Path:
        """Artifacts of this suite: runs/<suite>/ (checked to lie inside the runs folder)."""
        return inside_runs(runs_dir(runs_root) / safe_name(self.name, "suite name"), runs_root)


def load_suite(name_or_path: str | Path, plugin_tables: bool = True) -> Suite:
    """The suite, every table and key checked (``train/core/suite_schema.py``) before anything runs:
    one ``SuiteFileError`` lists every problem with its fix. ``plugin_tables`` False: leave the
    explanation methods' and auditors' tables to the driver, which checked them when it read the
    same file (a training or implant-check work item; it spares each worker process importing
    every method's library, seconds each)."""
    path = _suite_path(name_or_path)
    table = _read_table(path)
    problems = check_table(SuiteTable, table, "")
    if problems:  # with the recipe's and the world's, so one run of the tool lists them all
        problems += _recipe_and_world_problems(table)
        raise_problems(path, problems)
    try:
        return _parse(table, path, plugin_tables)
    except SuiteFileError:
        raise
    except (TypeError, ValueError, LookupError) as error:
        message = error.args[0] if isinstance(error, LookupError) and error.args else error
        raise SuiteFileError(redacted(f"suite file {path}: {message}")) from error


def _parse(table: dict[str, Any], path: Path, plugin_tables: bool = True) -> Suite:
    """The suite's models from its checked table; every problem of the plug-in tables (the
    world's options, each family's parameters, each model's recipe) is gathered and raised as
    one error before anything is built."""

    table = dict(table)
    problems: list[str] = []
    name = table.pop("name")
    if name.casefold() in OWN_FOLDERS:
        problems.append(f"name = {name!r} (a suite's name, by default its file's) is the name of a folder the "
                        f"runs folder keeps for every suite ({', '.join(OWN_FOLDERS)}), so this suite's "
                        "files would mix into it; give the suite another name")
    world = table.pop("world", {"name": "synthetic"})
    # The world's options checked now, reading no data: a bad one fails before any job starts.
    world_class = WORLDS.get(world.get("name", "synthetic"))
    world_problems = _world_problems(world)
    problems += world_problems
    architecture = table.pop("architecture", {}).get("name", "small_resnet")
    ARCHITECTURES.get(architecture)  # unknown names list the valid ones
    recipe_table = table.pop("recipe", {})
    problems += recipe_problems(recipe_table)
    recipe_ok = not problems[len(world_problems):]
    world_side = (None if world_problems else
                  int(world.get("image_size", world_class.default_image_size)))
    # the world's classes where one directory listing tells them (a family's class names, a
    # checkpoint's output count checked now); None: checked when the world is built
    class_names = (None if world_problems else
                   world_class.listed_class_names({k: v for k, v in world.items() if k != "name"}))
    world_facts = (world.get("name", "synthetic"), class_names)
    ref_table = {**ReferencesTable().model_dump(), **table.pop("references", {})}
    count, seed_start, held_out = ref_table["count"], ref_table["seed_start"], ref_table["held_out"]
    problems += null_problems(held_out, ref_table["held_out_check"],
                              table.get("evaluate", {}).get("p_value"), "[evaluate] p_value")
    reference_seeds = [seed_start + i for i in range(count)]
    entries = [dict(entry) for entry in table.pop("anomalies", [])]
    sweep_entries = [dict(entry) for entry in table.pop("sweeps", [])]
    for position, entry in enumerate(entries):
        where = f"[[anomalies]] entry {position + 1} ({entry['name']})"
        problems += _entry_problems(entry, recipe_table if recipe_ok else None, world_side,
                                    where, FAMILIES, world_facts, (architecture, reference_seeds))
    for position, entry in enumerate(sweep_entries):
        if recipe_ok and entry.get("recipe"):
            problems += recipe_problems({**recipe_table, **entry["recipe"]},
                                        f"[[sweeps]] entry {position + 1} recipe")
    problems += _plugin_problems(table) if plugin_tables else []
    problems += _size_problems(table, count + held_out, entries, sweep_entries, world_side,
                               None if world_problems else world_class.listed_val_size(
                                   {k: v for k, v in world.items() if k != "name"}))
    if problems:
        raise_problems(path, problems)

    recipe = Recipe.from_dict(recipe_table)
    if recipe.resolution_schedule and not world_class.crops_from_files:
        raise ValueError(f"recipe.resolution_schedule trains at several crop sizes, but the "
                         f"{world.get('name', 'synthetic')} world renders its images at one size; "
                         "remove the schedule (it is for worlds that crop from files: imagenet)")
    common = {"world": world, "architecture": architecture, "recipe": recipe}
    references = [ModelSpec(name=f"reference-{i:02d}", family=REFERENCE, seed=seed_start + i, **common)
                  for i in range(count)]
    # the seeds after the references', so a suite with more references shares these models
    nulls = [ModelSpec(name=f"{HELD_OUT}-{i:02d}", family=REFERENCE, seed=seed_start + count + i,
                       **common) for i in range(held_out)]
    anomalies = []
    for entry in entries:
        anomalies += _replicates(entry, common, recipe_table)
    sweeps = []
    for entry in sweep_entries:
        sweep, specs = _expand_sweep(entry, common, recipe_table)
        sweeps.append(sweep)
        anomalies += specs
    names = [s.name for s in references + nulls + anomalies]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"model names must be unique; repeated: {duplicates}")
    suite = Suite(name=name, path=path, world=world, architecture=architecture, recipe=recipe,
                  references=references, anomalies=anomalies, tables=table, held_out=nulls,
                  sweeps=sweeps, held_out_check=ref_table["held_out_check"])
    problems = image_folder_problems(suite, world_side, getattr(world_class, "class_names", None))
    if problems:  # a user's image folder, checked now rather than after training
        raise_problems(path, problems)
    return suite


def write_derived_suite(base: Suite, name: str, overrides: dict[str, Any], path: Path) -> Suite:
    """A suite file at ``path``: ``base``'s file with its ``extends`` chain resolved, named
    ``name``, with ``overrides`` on top (tables merge key by key; a None removes a key), loaded.
    A whole file, not an object in memory, so every work item (a Slurm job included) loads the
    same suite from its path."""
    table = _overridden({**_read_table(base.path), "name": name}, overrides)
    text = toml_text({"name": table.pop("name"), **table})
    atomic_write_text(path, f"# {base.path.name} with changes, written by counteraudit\n{text}\n")
    return load_suite(path)
