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

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from counteraudit.train.core.artifacts import OWN_FOLDERS, atomic_write_text, inside_runs, runs_dir
from counteraudit.train.core.model_spec import (HELD_OUT, REFERENCE, ModelSpec, Sweep, expand_sweep, replicates,
                                                safe_name)
from counteraudit.train.core.paths import redacted
from counteraudit.train.core.plugin_files import PluginFile, command_line_plugin_files, load_plugin_file
from counteraudit.train.core.recipe import Recipe, recipe_problems
from counteraudit.train.core.registries import ARCHITECTURES, FAMILIES, WORLDS
from counteraudit.train.core.image_folders import DETECTION, ImageFolder, abnormal_name, normal_name
from counteraudit.train.core.registry import nearest
from counteraudit.train.core.suite_checks import (entry_problems, held_out_problems, recipe_and_world_problems,
                                                  size_problems, slurm_problems, world_problems)
from counteraudit.train.core.suite_files import overridden, read_table, suite_path, toml_text
from counteraudit.train.core.suite_schema import (DiscoverTable, EvaluateTable, ExplainTable, SuiteFileError,
                                                  SuiteTable)
from counteraudit.train.core.table_problems import problem_lines, raise_problems, validated_table


@dataclass
class Suite:
    name: str
    path: Path
    world: dict[str, Any]
    architecture: str
    recipe: Recipe
    references: list[ModelSpec]
    anomalies: list[ModelSpec]
    # The validated file (every table typed, defaults applied by the schema): the stages read
    # their sections through the properties below (suite.evaluate.distance, suite.explain.methods).
    settings: SuiteTable
    # Null models: more seeds trained exactly like the references and scored as if anomalous
    # against them ([references] held_out = k), so a method's detection rule shows how often it
    # flags a normal model. Same keys as references of those seeds: shared through the store.
    held_out: list[ModelSpec] = field(default_factory=list)
    sweeps: list[Sweep] = field(default_factory=list)  # their models are among ``anomalies``
    held_out_check: int = 0  # the last held_out models check the null p-values ([references])
    # The plug-in files in effect (the command line's --plugins, the file's ``plugins``): a work
    # item carries them to its worker, which loads them before anything else (StageItem).
    plugin_files: tuple[PluginFile, ...] = ()

    @property
    def evaluate(self) -> EvaluateTable:
        return self.settings.evaluate

    @property
    def explain(self) -> ExplainTable:
        return self.settings.explain

    @property
    def discover(self) -> DiscoverTable:
        return self.settings.discover

    @property
    def image_sets(self) -> dict[str, str]:
        """[image_sets]: a set's name -> the folder of images that replaces its seeded draw."""
        return self.settings.image_sets

    @property
    def slurm(self) -> dict[str, Any]:
        """[slurm]: executor options (checked against the executor's own schema when loaded)."""
        return self.settings.slurm

    @property
    def method_tables(self) -> dict[str, dict[str, Any]]:
        """[methods.<name>]: each method's parameters as written; the explain layer parses them
        into the method's own typed parameters (explain/settings.py)."""
        return self.settings.methods

    @property
    def auditor_tables(self) -> dict[str, dict[str, Any]]:
        """[auditors.<name>]: each auditor's parameters as written (parsed by the discovery layer)."""
        return self.settings.auditors

    def with_settings(self, where: dict[str, str] | None = None, **sections: dict[str, Any]) -> "Suite":
        """This suite with some keys of its sections replaced (``evaluate={"distance": "ssim"}``;
        a None value leaves the key as the file has it), checked by the same schema as the file.
        The entry scripts merge the command line's overrides here, once; ``where``: the option
        that gave each key (``{"distance": "--distance"}``), named in an error."""
        updates = {}
        for section, values in sections.items():
            given = {key: value for key, value in values.items() if value is not None}
            if given:
                current = getattr(self.settings, section)  # a table of keys, or of tables ([methods])
                written = (current.model_dump(exclude_unset=True) if isinstance(current, BaseModel)
                           else dict(current))
                updates[section] = {**written, **given}
        if not updates:
            return self
        settings, problems = validated_table(SuiteTable, {**self.settings.model_dump(exclude_unset=True),
                                                          **updates}, "")
        if problems:
            for key, option in (where or {}).items():
                problems = [problem.replace(f"] {key} =", f"] {key} (from {option}) =", 1)
                            for problem in problems]
            raise SuiteFileError(redacted(f"suite file {self.path} with the command line's options "
                                          f"has {problem_lines(problems)}"))
        return dataclasses.replace(self, settings=settings)

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


def load_suite(name_or_path: str | Path,
               plugin_problems: Callable[[SuiteTable], list[str]] | None = None,
               plugins: tuple[PluginFile, ...] = ()) -> Suite:
    """The suite, every table and key checked (``train/core/suite_schema.py``) before anything runs:
    one ``SuiteFileError`` lists every problem with its fix. The plug-in tables of the layers above
    training (explanation methods, auditors, the distance, the null test) are checked by the entry
    scripts, which own those layers: they pass ``plugin_problems`` (``evaluate/pipeline.py``,
    ``explain/settings.py``), whose problems join the others in the one error.
    Plug-in files are loaded first, so the tables of their plug-ins check like shipped ones: the
    command line's (``command_line_plugins``), ``plugins`` (files already loaded, e.g. a derived
    suite's base's) and the file's own ``plugins``."""
    path = suite_path(name_or_path)
    table = read_table(path)  # its plugins entries checked: inside the suite file's folder
    settings, problems = validated_table(SuiteTable, table, "")
    if problems:  # with the recipe's and the world's, so one run of the tool lists them all
        problems += recipe_and_world_problems(table)
        raise_problems(path, problems)
    own = tuple(load_plugin_file(file) for file in settings.plugins)
    plugin_files = tuple(dict.fromkeys([*command_line_plugin_files(), *plugins, *own]))
    try:
        return dataclasses.replace(_parse(table, settings, path, plugin_problems),
                                   plugin_files=plugin_files)
    except SuiteFileError:
        raise
    except (TypeError, ValueError, LookupError) as error:
        message = error.args[0] if isinstance(error, LookupError) and error.args else error
        raise SuiteFileError(redacted(f"suite file {path}: {message}")) from error


def _parse(table: dict[str, Any], settings: SuiteTable, path: Path,
           plugin_problems: Callable[[SuiteTable], list[str]] | None) -> Suite:
    """The suite's models from its checked table. The world, the recipe and the entries' params
    are read as written (they are parts of model keys, where ``2`` and ``2.0`` differ); every
    problem of them is gathered and raised as one error before anything is built."""
    world = table.get("world", {"name": "synthetic"})
    world_class = WORLDS.get(world.get("name", "synthetic"))
    recipe_table = table.get("recipe", {})
    problems, world_side = _table_problems(table, settings, world, world_class)
    problems += plugin_problems(settings) if plugin_problems is not None else []
    if problems:
        raise_problems(path, problems)
    recipe = Recipe.from_dict(recipe_table)
    if recipe.resolution_schedule and not world_class.crops_from_files:
        raise ValueError(f"recipe.resolution_schedule trains at several crop sizes, but the "
                         f"{world.get('name', 'synthetic')} world renders its images at one size; "
                         "remove the schedule (it is for worlds that crop from files: imagenet)")
    common = {"world": world, "architecture": settings.architecture.name, "recipe": recipe}
    references, held_out = settings.references, settings.references.held_out
    first = references.seed_start
    reference_specs = [ModelSpec(name=f"reference-{i:02d}", family=REFERENCE, seed=first + i, **common)
                       for i in range(references.count)]
    # the seeds after the references', so a suite with more references shares these models
    nulls = [ModelSpec(name=f"{HELD_OUT}-{i:02d}", family=REFERENCE, seed=first + references.count + i,
                       **common) for i in range(held_out)]
    anomalies = [spec for entry in table.get("anomalies", [])
                 for spec in replicates(entry, common, recipe_table)]
    sweeps = []
    for entry in table.get("sweeps", []):
        sweep, specs = expand_sweep(entry, common, recipe_table)
        sweeps.append(sweep)
        anomalies += specs
    names = [s.name for s in reference_specs + nulls + anomalies]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"model names must be unique; repeated: {duplicates}")
    suite = Suite(name=settings.name, path=path, world=world, architecture=settings.architecture.name,
                  recipe=recipe, references=reference_specs, anomalies=anomalies, settings=settings,
                  held_out=nulls, sweeps=sweeps, held_out_check=references.held_out_check)
    problems = image_folder_problems(suite, world_side, getattr(world_class, "class_names", None))
    if problems:  # a user's image folder, checked now rather than after training
        raise_problems(path, problems)
    return suite


def _table_problems(table: dict[str, Any], settings: SuiteTable, world: dict[str, Any],
                    world_class: type) -> tuple[list[str], int | None]:
    """Every problem of the world's options, the recipe, each entry (its family's parameters,
    its cue against the images) and the sizes together; and the world's image side (None where
    its options are wrong)."""
    problems: list[str] = []
    if settings.name.casefold() in OWN_FOLDERS:
        problems.append(f"name = {settings.name!r} (a suite's name, by default its file's) is the name "
                        f"of a folder the runs folder keeps for every suite ({', '.join(OWN_FOLDERS)}), "
                        "so this suite's files would mix into it; give the suite another name")
    options = {k: v for k, v in world.items() if k != "name"}
    world_errors = world_problems(world)  # reading no data: a bad option fails before any job
    problems += world_errors
    architecture = settings.architecture.name
    ARCHITECTURES.get(architecture)  # unknown names list the valid ones
    recipe_table = table.get("recipe", {})
    problems += recipe_problems(recipe_table)
    recipe_ok = not problems[len(world_errors):]
    world_side = None if world_errors else int(world.get("image_size", world_class.default_image_size))
    # the world's classes where one directory listing tells them (a family's class names, a
    # checkpoint's output count checked now); None: checked when the world is built
    class_names = None if world_errors else world_class.listed_class_names(options)
    references = settings.references
    problems += held_out_problems(references.held_out, references.held_out_check)
    problems += slurm_problems(settings.slurm)
    reference_seeds = [references.seed_start + i for i in range(references.count)]
    for position, entry in enumerate(table.get("anomalies", [])):
        where = f"[[anomalies]] entry {position + 1} ({entry['name']})"
        problems += entry_problems(entry, recipe_table if recipe_ok else None, world_side, where, FAMILIES,
                                   (world.get("name", "synthetic"), class_names),
                                   (architecture, reference_seeds))
    for position, entry in enumerate(table.get("sweeps", [])):
        if recipe_ok and entry.get("recipe"):
            problems += recipe_problems({**recipe_table, **entry["recipe"]},
                                        f"[[sweeps]] entry {position + 1} recipe")
    problems += size_problems(settings, table.get("anomalies", []), table.get("sweeps", []), world_side,
                              None if world_errors else world_class.listed_val_size(options))
    return problems, world_side


def image_folder_problems(suite: Suite, side: int | None, class_names: list[str] | None) -> list[str]:
    """What is wrong with the suite's [image_sets] folders (train/core/image_folders.py): a name
    that is no set of the suite, a missing folder, too few images, images of another size than
    the world's ``side``, labels missing where they are read or naming no class."""
    folders = suite.image_sets
    if not folders:
        return []
    localizable = [spec for spec in suite.anomalies if FAMILIES.get(spec.family).localizable]
    valid = [DETECTION, *(name for spec in localizable
                          for name in (abnormal_name(spec.name), normal_name(spec.name)))]
    counts = {name: (suite.evaluate.detection_images if name == DETECTION
                     else suite.evaluate.localization_images) for name in valid}
    # a method's explained_class is a plug-in parameter, as written (the explain layer parses it)
    by_label = sorted(name for name, params in suite.method_tables.items()
                      if params.get("explained_class") == "label"
                      and name in (suite.explain.methods or [name]))
    by_class = [spec.name for spec in localizable if normal_name(spec.name) not in folders
                and _picks_normal_images_by_class(FAMILIES.get(spec.family))]
    problems = []
    for name, path in folders.items():
        what = f"[image_sets] {name}"
        if name not in valid:
            problems.append(f"{what}: no image set of suite {suite.name!r} is named so{nearest(name, valid)}; "
                            f"its sets: {', '.join(valid)}")
            continue
        needs_labels = (f"[methods.{by_label[0]}] explained_class = \"label\" explains each image's "
                        "label" if by_label else
                        f"{', '.join(by_class)} pick(s) its normal images from it by class (or give "
                        f"[image_sets] {normal_name(by_class[0])} = a folder of its normal images)"
                        if name == DETECTION and by_class else None)
        try:
            folder = ImageFolder.read(path, what)
        except ValueError as error:
            problems.append(str(error))
            continue
        problems += folder.problems(what, counts[name], side, needs_labels,
                                    len(class_names) if class_names else None,
                                    "[evaluate] " + ("detection_images" if name == DETECTION
                                                     else "localization_images"))
    return problems


def _picks_normal_images_by_class(family: type) -> bool:
    """Whether a family narrows the normal images to some classes (overrides ``normal_pool``,
    e.g. backdoor: not the target class), so a folder's images need labels to be picked."""
    defining = next(cls for cls in family.__mro__ if "normal_pool" in vars(cls))
    return defining.__mro__[1:] != (object,)  # not the base family's "every image"


def write_derived_suite(base: Suite, name: str, overrides: dict[str, Any], path: Path) -> Suite:
    """A suite file at ``path``: ``base``'s file with its ``extends`` chain resolved, named
    ``name``, with ``overrides`` on top (tables merge key by key; a None removes a key), loaded.
    A whole file, not an object in memory, so every work item (a Slurm job included) loads the
    same suite from its path."""
    table = overridden({**read_table(base.path), "name": name}, overrides)
    table.pop("plugins", None)  # absolute paths by now, which a suite file may not name: carried
    text = toml_text({"name": table.pop("name"), **table})
    atomic_write_text(path, f"# {base.path.name} with changes, written by counteraudit\n{text}\n")
    return load_suite(path, plugins=base.plugin_files)
