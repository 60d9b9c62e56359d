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

import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from counteraudit.slurm.errors import ExecutorConfigError
from counteraudit.slurm.executor_config import executor_config_from
from counteraudit.train.core import numerics
from counteraudit.train.core.artifacts import (OWN_FOLDERS, atomic_write_text, derive_seed, inside_runs,
                                               runs_dir, stable_hash)
from counteraudit.train.core.registries import (ARCHITECTURES, AUDITORS, DISTANCES, FAMILIES, METHODS,
                                                NULL_TESTS, WORLDS, strength_families)
from counteraudit.train.core.image_folders import (ABNORMAL_SUFFIX, DETECTION, ImageFolder, abnormal_name,
                                                   normal_name)
from counteraudit.train.core.paths import redacted
from counteraudit.train.core.registry import UnknownNameError, nearest
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.suite_schema import (MIN_NULL_MODELS, SAFE_NAME_LENGTH, SAFE_NAME_PATTERN,
                                                  SAFE_NAME_RULE, EvaluateTable,
                                                  ReferencesTable, ScheduleSegment, SuiteFileError,
                                                  SuiteTable, check_table, dataclass_table, raise_problems)
from counteraudit.train.core.published_recipes import checkpoint_recipe_problems
from counteraudit.train.core.weights import check_external_checkpoint

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"  # train/suites/, beside core/
REFERENCE = "reference"
HELD_OUT = "held-out"  # name prefix of the null models ([references] held_out)
PAPER_REFERENCES = 12  # SPEC: n = 12 reference models


@dataclass(frozen=True)
class Recipe:
    """SGD with step decay. Defaults: the paper's (torchvision's ResNet-50 recipe, batch 300)."""
    epochs: Annotated[int, Field(ge=1, le=bounds.EPOCHS.limit, json_schema_extra=bounds.EPOCHS.extra,
                                 description="training epochs (the paper: 90)")] = 90
    batch_size: Annotated[int, Field(ge=1, le=bounds.BATCH.limit, json_schema_extra=bounds.BATCH.extra,
                                     description="images per step (the paper: 300)")] = 300
    lr: Annotated[float, Field(gt=0, description="the initial learning rate (the paper: 0.1)")] = 0.1
    momentum: Annotated[float, Field(ge=0, lt=1, description="SGD momentum (the paper: 0.9)")] = 0.9
    weight_decay: Annotated[float, Field(ge=0, description="the paper: 1e-4")] = 1e-4
    # multiply the learning rate by lr_gamma every this many epochs
    lr_step_epochs: Annotated[int, Field(ge=1, le=bounds.EPOCHS.limit, json_schema_extra=bounds.EPOCHS.extra,
                                         description="epochs between learning-rate decays (the paper: 30)")] = 30
    lr_gamma: Annotated[float, Field(gt=0, le=1, description="the decay factor (the paper: 0.1)")] = 0.1
    # Linear learning-rate warmup over this many epochs (fractions allowed), from lr/steps to lr,
    # as torchvision's reference recipe offers (--lr-warmup-epochs). 0: none (the paper's recipe).
    # Short CPU schedules need it: without it some seeds stall in their first epoch at lr 0.1.
    lr_warmup_epochs: Annotated[float, Field(ge=0, description=(
        "epochs of linear warmup, at most epochs (0: none, the paper's)"))] = 0.0
    eval_batch_size: Annotated[int, Field(ge=1, le=bounds.BATCH.limit, json_schema_extra=bounds.BATCH.extra,
                                          description="images per evaluation batch")] = 100
    # Intra-op threads for CPU training. Part of the recipe because some CPU kernels reduce in a
    # thread-dependent order, so the thread count changes the weights' bits: fixing it makes the
    # same seed give the same weights on any machine and executor. Parallelism comes from
    # training several models at once (--jobs, Slurm arrays). Ignored on GPUs.
    cpu_threads: Annotated[int, Field(ge=1, le=bounds.THREADS.limit, json_schema_extra=bounds.THREADS.extra,
                                      description="threads per CPU training (1)")] = 1
    # bfloat16 autocast for CPU training, as the recipe always does on GPUs: 1.8x the fp32
    # throughput of the small ResNet on a CPU with native bf16 (AVX512-BF16 or AMX, e.g. AMD Zen 4,
    # Intel Sapphire Rapids); older CPUs emulate it, so leave it off there. Changes the weights.
    cpu_bf16: Annotated[bool, Field(description="bfloat16 autocast on CPUs (false)")] = False
    # Progressive resizing: the side of the training crops, epoch by epoch, as segments in order,
    # [{ epochs = 12, size = 160 }, { epochs = 4, size = 192 }] (FFCV's ResNet-50 schedules:
    # 160 px for the first 75% of the epochs, then 192). The segments must cover every epoch.
    # Empty: every epoch at the world's image_size. Evaluation keeps the world's sizes.
    resolution_schedule: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_dict(cls, table: dict[str, Any], where: str = "[recipe]") -> "Recipe":
        """A recipe from a suite's ``[recipe]`` table (every key checked by the schema, values
        kept exactly as written: they are part of model keys)."""
        problems = recipe_problems(table, where)
        if problems:
            raise ValueError("; ".join(problems))
        table = dict(table)
        if "resolution_schedule" in table:
            table["resolution_schedule"] = _resolution_segments(table["resolution_schedule"])
        return cls(**table)

    def crop_size(self, epoch: int) -> int | None:
        """The training crop side of ``epoch`` (0-based) under the resolution schedule; None
        without one (the world's image_size). A function of the epoch alone, so a run resumed
        mid-schedule trains each epoch at the size the uninterrupted run did."""
        end = 0
        for epochs, size in self.resolution_schedule:
            end += epochs
            if epoch < end:
                return size
        return None

    def identity(self) -> dict[str, Any]:
        """The recipe's part of a model's key. Fields added after models were trained are left
        out at their default, so those models keep their keys."""
        table = asdict(self)
        for name in _KEY_OMITS_DEFAULT:
            if table[name] == getattr(Recipe, name):
                del table[name]
        return table


# Recipe fields newer than the first trained models: absent from a key when at their default.
_KEY_OMITS_DEFAULT = ("resolution_schedule",)


def _resolution_segments(value: Any) -> tuple[tuple[int, int], ...]:
    """[{ epochs, size }, ...] (a suite file) or [(epochs, size), ...] (a Recipe's own) ->
    ((epochs, size), ...); the schema has checked every number."""
    return tuple((int(s["epochs"]), int(s["size"])) if isinstance(s, dict) else (int(s[0]), int(s[1]))
                 for s in value)


# The recipe's file form: resolution_schedule is written as a list of { epochs, size } tables.
_RECIPE_FILE_FORM = (("resolution_schedule", list[ScheduleSegment | tuple[int, int]]),)


def recipe_problems(table: dict[str, Any], where: str = "[recipe]") -> list[str]:
    """What is wrong with a recipe table (every key's type and range, and how they fit)."""
    problems = check_table(dataclass_table(Recipe, _RECIPE_FILE_FORM), table, where)
    if problems:
        return problems
    epochs = table.get("epochs", Recipe.epochs)
    if table.get("lr_warmup_epochs", 0) > epochs:
        problems.append(f"{where} lr_warmup_epochs = {table['lr_warmup_epochs']!r} must be at most "
                        f"epochs = {epochs} (0: no warmup)")
    schedule = _resolution_segments(table.get("resolution_schedule", ()))
    covered = sum(segment_epochs for segment_epochs, _ in schedule)
    if schedule and covered != epochs:
        problems.append(
            f"{where} resolution_schedule covers {covered} epochs but epochs = {epochs}; make its "
            f"segments' epochs add up to {epochs} (e.g. [{{ epochs = {epochs - epochs // 4}, "
            f"size = 160 }}, {{ epochs = {epochs // 4}, size = 192 }}])")
    return problems


@dataclass(frozen=True)
class ModelSpec:
    name: str                       # stable, human-readable: reference-03, backdoor-nu0.10, ...
    family: str                     # "reference" or a registered anomaly family
    seed: int
    world: dict[str, Any]
    architecture: str
    recipe: Recipe
    params: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None   # an external checkpoint to load instead of training
    # Table 1's row for this model (an entry's ``row``; default: its family). The paper splits a
    # family into rows (adversarial_linf, adversarial_l2). A label, not part of the key.
    row: str | None = None
    # The [[anomalies]] entry this model replicates (its ``name``) and which replicate it is
    # (0, 1, ...); None for a model of an entry with one replicate. Labels, not part of the key:
    # replicates differ only in their seed.
    configuration: str | None = None
    replicate: int | None = None
    # The published recipe a loaded checkpoint was trained with (train/core/published_recipes.py;
    # None: not declared, or trained here). A label, not part of the key: it describes the file.
    checkpoint_recipe: str | None = None

    @property
    def is_reference(self) -> bool:
        return self.family == REFERENCE

    @property
    def table_row(self) -> str:
        return self.row or self.family

    @property
    def configuration_name(self) -> str:
        """The configuration this model is one seed of: its entry's name (its own name when the
        entry has one replicate)."""
        return self.configuration or self.name

    def identity(self) -> dict[str, Any]:
        """Everything that determines the weights (the name does not), with the numeric mode that
        computes them (numerics.key_tag: portable, or native to an instruction set)."""
        return {"family": self.family, "seed": self.seed, "world": self.world,
                "architecture": self.architecture,
                "architecture_version": ARCHITECTURES.get(self.architecture).version,
                "recipe": self.recipe.identity(),
                "params": self.weight_params, "checkpoint": self.checkpoint, **numerics.key_tag()}

    @property
    def weight_params(self) -> dict[str, Any]:
        """The parameters that shape the weights: ``params`` less the family's ``key_excludes``
        (what only decides which images are evaluated)."""
        if self.is_reference:
            return self.params
        excluded = FAMILIES.get(self.family).key_excludes
        return {name: value for name, value in self.params.items() if name not in excluded}

    @property
    def key(self) -> str:
        return stable_hash(self.identity())

    def to_dict(self) -> dict[str, Any]:
        recipe = {"checkpoint_recipe": self.checkpoint_recipe} if self.checkpoint_recipe else {}
        return {"name": self.name, "key": self.key, **self.identity(), **recipe}


@dataclass(frozen=True)
class Sweep:
    """A dose-response sweep ([[sweeps]]): ``models[i]`` was trained with ``parameter = values[i]``."""
    name: str
    family: str
    parameter: str
    values: tuple[float, ...]
    models: tuple[str, ...]


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


def safe_name(name: str, what: str) -> str:
    """``name`` if it is one safe path component (``SAFE_NAME_RULE``); else a ValueError."""
    if not (isinstance(name, str) and len(name) <= SAFE_NAME_LENGTH
            and re.fullmatch(SAFE_NAME_PATTERN, name)):
        raise ValueError(f"{what} {name!r} is not {SAFE_NAME_RULE}")
    return name


def available_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def _suite_path(name_or_path: str | Path, relative_to: Path | None = None) -> Path:
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = SUITES_DIR / f"{name_or_path}.toml"
    elif relative_to is not None and not path.is_absolute():
        path = relative_to / path
    if not path.is_file():
        raise ValueError(f"unknown suite {str(name_or_path)!r}: no file {path}; shipped suites: "
                         f"{', '.join(available_suites())} (or pass a path to a .toml file)")
    return path


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` on top: nested tables merge, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


# A suite extends a few others (the shipped ones: at most 2 deep) and nests tables a few levels
# (5 in the shipped ones: an [[anomalies]] entry's params' tables); far deeper is a crafted file,
# refused before Python's recursion limit (1,000 frames) turns it into a traceback.
MAX_EXTENDS_DEPTH = 32
MAX_NESTING_DEPTH = 32


def _read_table(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The suite file's table with its ``extends`` chain resolved; ``name`` is never inherited.
    ``chain``: the files that extend this one, the first file first."""
    table = _read_file(path)
    table.setdefault("name", path.stem)
    base_name = table.pop("extends", None)
    if base_name is None:
        return table
    where = f"suite file {path}: extends = {json.dumps(base_name, default=str)}"
    if not isinstance(base_name, str):
        raise SuiteFileError(f"{where} must be a suite name or a path to a .toml file")
    chain = (*chain, path.resolve())
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise SuiteFileError(f"{where}: {chain[0]} extends a chain of more than {MAX_EXTENDS_DEPTH} "
                             "suite files; at most that many may extend each other (the shipped "
                             "suites use 2): copy the tables you need into fewer files")
    try:
        base_path = _suite_path(base_name, path.parent)
    except ValueError as error:
        raise SuiteFileError(f"{where}: {error}") from None
    if base_path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, base_path.resolve()))
        raise SuiteFileError(f"{where}: suite files extend each other in a cycle: {cycle}; remove "
                             "one extends")
    base = _read_table(base_path, chain)
    base.pop("name")
    return _merged(base, table)


def _read_file(path: Path) -> dict[str, Any]:
    """One suite file's TOML table: one SuiteFileError naming the file when it cannot be read,
    is not UTF-8, is not TOML or nests deeper than ``MAX_NESTING_DEPTH``."""
    fix = "fix that line (https://toml.io: key = value, [table], [[array of tables]])"
    try:
        data = path.read_bytes()
        table = tomllib.loads(data.decode("utf-8"))
    except OSError as error:
        raise SuiteFileError(f"suite file {path} cannot be read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise SuiteFileError(f"suite file {path} is not UTF-8 text: byte 0x{data[error.start]:02x} at "
                             f"offset {error.start} (line {line}) {error.reason}; save the file as "
                             "UTF-8") from None
    except tomllib.TOMLDecodeError as error:
        raise SuiteFileError(f"suite file {path} is not valid TOML: {error}; {fix}") from None
    except RecursionError:
        table = None
    if table is None or _nesting_depth(table) > MAX_NESTING_DEPTH:
        raise SuiteFileError(f"suite file {path} nests tables or arrays more than {MAX_NESTING_DEPTH} "
                             "levels deep; the shipped suites nest at most 5 (an [[anomalies]] entry's "
                             "params' tables): flatten it")
    return table


def _nesting_depth(value: Any) -> int:
    """How many tables and arrays ``value`` nests (0: a plain value), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


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


def _world_problems(world: dict[str, Any]) -> list[str]:
    """What is wrong with the [world] table's options, reading no data (an unknown world: the
    registry's error, raised)."""
    world_class = WORLDS.get(world.get("name", "synthetic"))
    return world_class.config_problems({k: v for k, v in world.items() if k != "name"})


def _recipe_and_world_problems(table: dict[str, Any]) -> list[str]:
    problems = []
    if isinstance(table.get("recipe", {}), dict):
        problems += recipe_problems(table.get("recipe", {}))
    world = table.get("world", {})
    if isinstance(world, dict) and world.get("name", "synthetic") in WORLDS:
        problems += _world_problems(world)
    return problems


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


def _size_problems(table: dict[str, Any], references: int, entries: list[dict[str, Any]],
                   sweep_entries: list[dict[str, Any]], side: int | None,
                   val_size: int | None) -> list[str]:
    """Sizes that pass their own bounds but not together (``size_bounds.py``): the suite's models
    in all, each image set in memory at the world's ``side``, and each set against the
    ``val_size`` images it is drawn from (None: unknown until the world is built)."""
    models = (references + sum(int(entry.get("replicates", 1)) for entry in entries)
              + sum(len(entry["values"]) for entry in sweep_entries))
    problems = [bounds.model_count_problem(models)]
    evaluate = {**EvaluateTable().model_dump(), **table.get("evaluate", {})}
    folders = table.get("image_sets", {})
    for key in ("detection_images", "localization_images"):
        if side is not None:
            problems.append(bounds.image_set_memory_problem(f"[evaluate] {key}", evaluate[key], side))
    # The detection set is a draw from the val split; an abnormal set, from a family's part of
    # it, never more than the split (it may hold fewer: a planted slice has what the world has).
    pools = {"detection_images": DETECTION not in folders,
             "localization_images": not any(name.endswith(ABNORMAL_SUFFIX) for name in folders)}
    for key in (key for key, drawn in pools.items() if drawn and val_size is not None):
        problems.append(bounds.pool_problem(f"[evaluate] {key}", evaluate[key], val_size,
                                            "validation images of the world ([world] num_val)"))
    return [problem for problem in problems if problem]


def image_folder_problems(suite: Suite, side: int | None, class_names: list[str] | None) -> list[str]:
    """What is wrong with the suite's [image_sets] folders (train/core/image_folders.py): a name
    that is no set of the suite, a missing folder, too few images, images of another size than
    the world's ``side``, labels missing where they are read or naming no class."""
    folders = suite.tables.get("image_sets", {})
    if not folders:
        return []
    localizable = [spec for spec in suite.anomalies if FAMILIES.get(spec.family).localizable]
    valid = [DETECTION, *(name for spec in localizable
                          for name in (abnormal_name(spec.name), normal_name(spec.name)))]
    evaluate = {**EvaluateTable().model_dump(), **suite.tables.get("evaluate", {})}
    counts = {name: evaluate["detection_images" if name == DETECTION else "localization_images"]
              for name in valid}
    explain = suite.tables.get("explain", {})
    by_label = sorted(name for name, params in suite.tables.get("methods", {}).items()
                      if params.get("explained_class") == "label"
                      and name in (explain.get("methods") or [name]))
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


def null_problems(held_out: int, held_out_check: int, p_value: str | None,
                  asked_by: str) -> list[str]:
    """What stops the null p-values (``p_value``, asked for by ``asked_by``: a suite key or a
    command-line option) from being computed: an unknown test, or fewer held-out references left
    to fit it than the test needs (``MIN_NULL_MODELS``, or its ``min_nulls``)."""
    problems = []
    if held_out_check > held_out:
        problems.append(f"[references] held_out_check = {held_out_check} exceeds held_out = "
                        f"{held_out}: the checking models are some of the held-out ones; set "
                        f"held_out_check = {held_out // 2} (half) or raise held_out")
    if p_value is None:
        return problems
    named = _named_problems([p_value], NULL_TESTS, f"{asked_by} = {p_value!r}")
    problems += named
    needed = MIN_NULL_MODELS if named else NULL_TESTS.get(p_value).nulls_needed()
    fitting = held_out - held_out_check
    if fitting < needed:
        problems.append(
            f"{asked_by} = {p_value!r} fits each method's null distribution to the held-out "
            f"references and needs at least {needed} of them; [references] held_out = "
            f"{held_out} with held_out_check = {held_out_check} leaves {fitting}: set "
            f"[references] held_out = {needed + held_out_check} or more (40 with "
            "held_out_check = 20 fits on 20 and checks the calibration on the other 20)")
    return problems


def _named_problems(names, registry, where: str) -> list[str]:
    """The registry's own message (with the nearest valid name) for each unknown name."""
    problems = []
    for name in names:
        try:
            registry.get(name)
        except UnknownNameError as error:
            problems.append(f"{where}: {error.args[0]}")
    return problems


def _built_problems(tables: dict[str, dict[str, Any]], registry, header: str) -> list[str]:
    """Each ``[header.<name>]`` table against the registry, and the plug-in built from its
    parameters."""
    problems = _named_problems(tables, registry, f"[{header}.<name>]")
    for name, params in tables.items():
        if name in registry:
            try:
                registry.get(name)(params)
            except (TypeError, ValueError, LookupError) as error:
                message = error.args[0] if isinstance(error, LookupError) and error.args else error
                problems.append(f"[{header}.{name}] {message}")
    return problems


def _unrun_method_problems(run: list[str] | None, tables: dict[str, Any]) -> list[str]:
    """A ``[methods.<name>]`` table for a method the ``[explain] methods`` list leaves out would be
    silently ignored (a user who adds a method's table expects it to run): an error naming the list
    to add it to. Without a list the suite runs every registered method, so every table is used."""
    if run is None:
        return []
    listed = ", ".join(f'"{name}"' for name in run)
    return [f"[methods.{name}] sets parameters of a method the suite does not run: add \"{name}\" "
            f"to [explain] methods = [{listed}] (or remove the table)"
            for name in tables if name not in run]


def _plugin_problems(tables: dict[str, Any]) -> list[str]:
    """The tables of plug-ins (explanation methods, auditors, the executor) checked against their
    registries and built, so a typo fails before training rather than after it."""
    explain, discover = tables.get("explain", {}), tables.get("discover", {})
    # A registry imports its plug-ins (and their libraries: seconds) on its first lookup, so only
    # a suite that names a method or an auditor pays for it.
    problems = _named_problems(explain.get("methods") or [], METHODS, "[explain] methods")
    problems += _named_problems(explain.get("batch_sizes", {}), METHODS, "[explain] batch_sizes")
    problems += _built_problems(tables.get("methods", {}), METHODS, "methods")
    problems += _unrun_method_problems(explain.get("methods"), tables.get("methods", {}))
    problems += _named_problems(discover.get("auditors") or [], AUDITORS, "[discover] auditors")
    problems += _named_problems(discover.get("budget", {}), AUDITORS, "[discover] budget")
    problems += _built_problems(tables.get("auditors", {}), AUDITORS, "auditors")
    distance = tables.get("evaluate", {}).get("distance")
    problems += _named_problems([distance] if distance else [], DISTANCES, "[evaluate] distance")
    slurm = tables.get("slurm", {})
    if "log_dir" in slurm or any(isinstance(v, dict) and "log_dir" in v for v in slurm.values()):
        problems.append("[slurm] log_dir: a suite file cannot choose where logs are written (they "
                        "go under the runs folder); remove it, and give --log-dir on the command "
                        "line if you want them elsewhere")
    for stage in [None, *(k for k, v in slurm.items() if isinstance(v, dict) and k != "slurm_extra")]:
        try:
            executor_config_from(None, slurm, stage_name=stage)
        except (ExecutorConfigError, TypeError, ValueError) as error:
            problems.append(f"[slurm{'.' + stage if stage else ''}] {error}")
    return problems


def _entry_problems(entry: dict[str, Any], recipe_table: dict[str, Any] | None,
                    world_side: int | None, where: str, families,
                    world_facts: tuple[str, list[str] | None] = ("synthetic", None),
                    suite_facts: tuple[str, list[int]] | None = None) -> list[str]:
    """What is wrong with one [[anomalies]] entry: its family's parameters, its recipe (None: the
    suite's is wrong, said already), whether its cue fits the images and training crops and its
    parameters the world (``world_facts``: its name and class names, None where unknown) and the
    suite (``suite_facts``: its architecture and its references' seeds), and its
    external checkpoint (its output count too, where the class names are known) and that
    checkpoint's declared recipe."""
    if entry["family"] not in families:
        return _named_problems([entry["family"]], families, f"{where} family")
    family = families.get(entry["family"])
    entry_recipe = {**(recipe_table or {}), **entry.get("recipe", {})}
    problems = (recipe_problems(entry_recipe, f"{where} recipe")
                if recipe_table is not None and entry.get("recipe") else [])
    try:
        params = family.validate_params(dict(entry.get("params", {})))
    except (TypeError, ValueError) as error:
        return problems + [f"{where} params: {error}"]
    # a trigger or watermark that does not fit the images or a training crop fails now
    if world_side is not None and recipe_table is not None and not problems:
        schedule = _resolution_segments(entry_recipe.get("resolution_schedule", ()))
        for side in sorted({world_side, *(size for _, size in schedule)}):
            try:
                family.check_image_size(params, side, side)
            except ValueError as error:
                problems.append(f"{where}: {error}")
    world_name, class_names = world_facts
    try:
        family.check_world(params, world_name, class_names)
    except ValueError as error:
        problems.append(f"{where} params: {error}")
    if suite_facts is not None:
        try:
            family.check_suite(params, *suite_facts)
        except ValueError as error:
            problems.append(f"{where} params: {error}")
    if entry.get("checkpoint") is not None:
        outputs = family.output_count(params, len(class_names)) if class_names else None
        try:
            check_external_checkpoint(entry["checkpoint"], outputs)
        except (OSError, ValueError) as error:
            problems.append(f"{where} checkpoint: {error}")
    problems += checkpoint_recipe_problems(entry.get("checkpoint_recipe"), entry.get("checkpoint"),
                                           entry["family"], params, where)
    return problems


def _expand_sweep(entry: dict[str, Any], common: dict[str, Any],
                  recipe_table: dict[str, Any]) -> tuple[Sweep, list[ModelSpec]]:
    """One [[sweeps]] entry -> its Sweep and its models: the base params with the family's
    strength parameter set to each value, one seed and one recipe for all of them."""
    family = FAMILIES.get(entry["family"])
    with_strength = strength_families()
    if family.strength is None:
        raise ValueError(f"sweeps: family {family.name!r} has no strength parameter to sweep; "
                         "families with one (family: parameter): "
                         f"{', '.join(f'{k}: {v}' for k, v in with_strength.items())}")
    parameter, values = family.strength, entry["values"]
    if len(set(values)) != len(values):
        raise ValueError(f"sweeps: {family.name} values={values!r} repeat a value; give each once")
    base = dict(entry.get("params", {}))
    if parameter in base:
        raise ValueError(f"sweeps: {family.name} params set {parameter}={base[parameter]!r}, the "
                         f"swept parameter; remove it from params (values = {values} sets it)")
    prefix = entry.get("name", f"{family.name}-{parameter}")
    # One seed for the whole sweep (by default from its name prefix): the models differ only in
    # the swept value, so a change along the curve is the strength's, not a new seed's.
    seed = int(entry.get("seed", default_anomaly_seed(prefix)))
    sweep_recipe = Recipe.from_dict({**recipe_table, **entry.get("recipe", {})})
    specs = [ModelSpec(name=safe_name(f"{prefix}{value:g}", f"[[sweeps]] {prefix} model name"),
                       family=family.name, seed=seed,
                       params=family.validate_params({**base, parameter: value}),
                       **{**common, "recipe": sweep_recipe}) for value in values]
    return Sweep(name=prefix, family=family.name, parameter=parameter,
                 values=tuple(float(v) for v in values),
                 models=tuple(s.name for s in specs)), specs


def replicate_seed(seed: int, replicate: int) -> int:
    """Replicate ``replicate``'s seed in a configuration whose first model has ``seed``: the
    first keeps it (so the one-model entry's weights are shared through the store), the others
    are derived from it, never ``seed + i``, which another entry's seed may already be."""
    return seed if replicate == 0 else derive_seed("replicate", seed, replicate) % 1_000_000_000


def _replicates(entry: dict[str, Any], common: dict[str, Any],
                recipe_table: dict[str, Any]) -> list[ModelSpec]:
    """An [[anomalies]] entry's models: one named as the entry, or with ``replicates = k`` k
    models <name>-r0 .. <name>-r<k-1> that differ only in their seed."""
    family = FAMILIES.get(entry["family"])
    count = int(entry.get("replicates", 1))
    seed = int(entry.get("seed", default_anomaly_seed(entry["name"])))
    shared = dict(family=entry["family"], params=family.validate_params(dict(entry.get("params", {}))),
                  checkpoint=entry.get("checkpoint"), row=entry.get("row"),
                  checkpoint_recipe=entry.get("checkpoint_recipe"),
                  **{**common, "recipe": Recipe.from_dict({**recipe_table, **entry.get("recipe", {})})})
    if count == 1:
        return [ModelSpec(name=entry["name"], seed=seed, **shared)]
    if entry.get("checkpoint") is not None:
        raise ValueError(f"[[anomalies]] {entry['name']}: replicates = {count} with a checkpoint "
                         f"would load the same weights {count} times; give replicates = 1, or one "
                         "entry per checkpoint")
    return [ModelSpec(name=safe_name(f"{entry['name']}-r{i}", "a replicate's model name"),
                      seed=replicate_seed(seed, i), configuration=entry["name"], replicate=i,
                      **shared) for i in range(count)]


def default_anomaly_seed(name: str) -> int:
    """An anomalous model's seed when its entry gives none: from its name, not its position, so
    adding, removing or reordering entries never changes (and retrains) the other models."""
    return derive_seed("anomaly", name) % 1_000_000_000


def toml_text(table: dict[str, Any], prefix: str = "") -> str:
    """A suite table as TOML: values first (a table inside an array as an inline table), then
    each nested table under its header. Strings are JSON-quoted, which TOML reads the same."""
    lines = [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in table.items()
             if not isinstance(v, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            header = f"{prefix}.{json.dumps(str(key))}" if prefix else json.dumps(str(key))
            lines += ["", f"[{header}]", toml_text(value, header)]
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) to a suite file")


def _overridden(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``_merged``, where a None in ``overrides`` removes the key (TOML has no null)."""
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):  # a new table too: its None values are removed keys
            out[key] = _overridden(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


def write_derived_suite(base: Suite, name: str, overrides: dict[str, Any], path: Path) -> Suite:
    """A suite file at ``path``: ``base``'s file with its ``extends`` chain resolved, named
    ``name``, with ``overrides`` on top (tables merge key by key; a None removes a key), loaded.
    A whole file, not an object in memory, so every work item (a Slurm job included) loads the
    same suite from its path."""
    table = _overridden({**_read_table(base.path), "name": name}, overrides)
    text = toml_text({"name": table.pop("name"), **table})
    atomic_write_text(path, f"# {base.path.name} with changes, written by counteraudit\n{text}\n")
    return load_suite(path)
