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

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from counteraudit.train.artifacts import derive_seed, runs_dir, stable_hash

SUITES_DIR = Path(__file__).resolve().parent / "suites"
REFERENCE = "reference"
HELD_OUT = "held-out"  # name prefix of the null models ([references] held_out)
PAPER_REFERENCES = 12  # SPEC: n = 12 reference models


@dataclass(frozen=True)
class Recipe:
    """SGD with step decay. Defaults: the paper's (torchvision's ResNet-50 recipe, batch 300)."""
    epochs: int = 90
    batch_size: int = 300
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lr_step_epochs: int = 30   # multiply the learning rate by lr_gamma every this many epochs
    lr_gamma: float = 0.1
    # Linear learning-rate warmup over this many epochs (fractions allowed), from lr/steps to lr,
    # as torchvision's reference recipe offers (--lr-warmup-epochs). 0: none (the paper's recipe).
    # Short CPU schedules need it: without it some seeds stall in their first epoch at lr 0.1.
    lr_warmup_epochs: float = 0.0
    eval_batch_size: int = 100
    # Intra-op threads for CPU training. Part of the recipe because some CPU kernels reduce in a
    # thread-dependent order, so the thread count changes the weights' bits: fixing it makes the
    # same seed give the same weights on any machine and executor. Parallelism comes from
    # training several models at once (--jobs, Slurm arrays). Ignored on GPUs.
    cpu_threads: int = 1
    # bfloat16 autocast for CPU training, as the recipe always does on GPUs: 1.8x the fp32
    # throughput of the small ResNet on a CPU with native bf16 (AVX512-BF16 or AMX, e.g. AMD Zen 4,
    # Intel Sapphire Rapids); older CPUs emulate it, so leave it off there. Changes the weights.
    cpu_bf16: bool = False
    # Progressive resizing: the side of the training crops, epoch by epoch, as segments in order,
    # [{ epochs = 12, size = 160 }, { epochs = 4, size = 192 }] (FFCV's ResNet-50 schedules:
    # 160 px for the first 75% of the epochs, then 192). The segments must cover every epoch.
    # Empty: every epoch at the world's image_size. Evaluation keeps the world's sizes.
    resolution_schedule: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_dict(cls, table: dict[str, Any]) -> "Recipe":
        _check_keys(table, cls, "recipe")
        table = dict(table)
        if "resolution_schedule" in table:
            table["resolution_schedule"] = _resolution_segments(table["resolution_schedule"])
        recipe = cls(**table)
        covered = sum(epochs for epochs, _ in recipe.resolution_schedule)
        if recipe.resolution_schedule and covered != recipe.epochs:
            raise ValueError(
                f"recipe.resolution_schedule covers {covered} epochs but recipe.epochs = "
                f"{recipe.epochs}; make its segments' epochs add up to {recipe.epochs} (e.g. "
                f"[{{ epochs = {recipe.epochs - recipe.epochs // 4}, size = 160 }}, "
                f"{{ epochs = {recipe.epochs // 4}, size = 192 }}])")
        for name in ("epochs", "batch_size", "lr_step_epochs", "eval_batch_size", "cpu_threads"):
            if getattr(recipe, name) < 1:
                raise ValueError(f"recipe.{name}={getattr(recipe, name)} must be >= 1")
        if not 0 <= recipe.lr_warmup_epochs <= recipe.epochs:
            raise ValueError(f"recipe.lr_warmup_epochs={recipe.lr_warmup_epochs} must be in "
                             f"[0, epochs={recipe.epochs}] (0: no warmup)")
        if recipe.lr <= 0:
            raise ValueError(f"recipe.lr={recipe.lr} must be > 0 (the paper uses 0.1)")
        return recipe

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
    ((epochs, size), ...), every number checked."""
    example = "[{ epochs = 12, size = 160 }, { epochs = 4, size = 192 }]"
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"recipe.resolution_schedule = {value!r} must be a list of segments, "
                         f"e.g. {example}")
    segments = []
    for segment in value:
        if isinstance(segment, dict):
            _check_keys(segment, None, "resolution_schedule segment", valid={"epochs", "size"})
            segment = (segment.get("epochs"), segment.get("size"))
        if (not isinstance(segment, (list, tuple)) or len(segment) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in segment)):
            raise ValueError(f"recipe.resolution_schedule segment {segment!r} must give whole "
                             f"epochs >= 1 and a crop size >= 1 in pixels, e.g. {example}")
        segments.append((int(segment[0]), int(segment[1])))
    return tuple(segments)


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

    @property
    def is_reference(self) -> bool:
        return self.family == REFERENCE

    @property
    def table_row(self) -> str:
        return self.row or self.family

    def identity(self) -> dict[str, Any]:
        """Everything that determines the weights (the name does not)."""
        from counteraudit.train.architectures import ARCHITECTURES
        return {"family": self.family, "seed": self.seed, "world": self.world,
                "architecture": self.architecture,
                "architecture_version": ARCHITECTURES.get(self.architecture).version,
                "recipe": self.recipe.identity(),
                "params": self.params, "checkpoint": self.checkpoint}

    @property
    def key(self) -> str:
        return stable_hash(self.identity())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, **self.identity()}


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

    @property
    def models(self) -> list[ModelSpec]:
        return self.references + self.held_out + self.anomalies

    def model(self, name: str) -> ModelSpec:
        for spec in self.models:
            if spec.name == name:
                return spec
        raise ValueError(f"suite {self.name!r} has no model {name!r}; its models are: "
                         f"{', '.join(s.name for s in self.models)}")

    def table_rows(self) -> tuple[dict[str, str], list[str]]:
        """({anomalous model: its Table 1 row}, the rows in order): rows of stark families first,
        then by family in registry order, then in the suite's order."""
        from counteraudit.anomalies import FAMILIES
        rows = {spec.name: spec.table_row for spec in self.anomalies}
        family_rank = {name: rank for rank, name in enumerate(FAMILIES.names())}
        first = {}
        for position, spec in enumerate(self.anomalies):
            first.setdefault(spec.table_row, (not FAMILIES.get(spec.family).stark,
                                              family_rank[spec.family], position))
        return rows, sorted(first, key=first.__getitem__)

    def root(self, runs_root: str | Path | None = None) -> Path:
        """Artifacts of this suite: runs/<suite>/."""
        return runs_dir(runs_root) / self.name


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


def _read_table(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The suite file's table with its ``extends`` chain resolved; ``name`` is never inherited."""
    if path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path.resolve()))
        raise ValueError(f"suite files extend each other in a cycle: {cycle}")
    with open(path, "rb") as handle:
        table = tomllib.load(handle)
    table.setdefault("name", path.stem)
    base_name = table.pop("extends", None)
    if base_name is None:
        return table
    if not isinstance(base_name, str):
        raise ValueError(f"suite file {path}: extends={base_name!r} must be a suite name or a path")
    base = _read_table(_suite_path(base_name, path.parent), (*chain, path.resolve()))
    base.pop("name")
    return _merged(base, table)


def load_suite(name_or_path: str | Path) -> Suite:
    path = _suite_path(name_or_path)
    table = _read_table(path)
    try:
        return _parse(table, path)
    except (TypeError, ValueError, LookupError) as error:
        raise ValueError(f"suite file {path}: {error}") from error


def _parse(table: dict[str, Any], path: Path) -> Suite:
    from counteraudit.anomalies import FAMILIES  # late: anomalies imports train
    from counteraudit.train.architectures import ARCHITECTURES

    table = dict(table)
    name = table.pop("name", path.stem)
    world = table.pop("world", {"name": "synthetic"})
    from counteraudit.train.worlds import WORLDS
    # The world's options checked now, reading no data: a bad one fails before any job starts.
    world_class = WORLDS.get(world.get("name", "synthetic"))
    world_class.check_config({k: v for k, v in world.items() if k != "name"})
    architecture = table.pop("architecture", {}).get("name", "small_resnet")
    ARCHITECTURES.get(architecture)  # unknown names list the valid ones
    recipe = Recipe.from_dict(table.pop("recipe", {}))
    if recipe.resolution_schedule and not WORLDS.get(world.get("name", "synthetic")).crops_from_files:
        raise ValueError(f"recipe.resolution_schedule trains at several crop sizes, but the "
                         f"{world.get('name', 'synthetic')} world renders its images at one size; "
                         "remove the schedule (it is for worlds that crop from files: imagenet)")
    ref_table = table.pop("references", {})
    _check_keys(ref_table, None, "references", valid={"count", "seed_start", "held_out"})
    count, seed_start = int(ref_table.get("count", 5)), int(ref_table.get("seed_start", 0))
    held_out = ref_table.get("held_out", 0)
    if isinstance(held_out, bool) or not isinstance(held_out, int) or held_out < 0:
        raise ValueError(f"references.held_out={held_out!r} must be a whole number >= 0: how many "
                         "more seeds to train like the references and score as null models "
                         "(8 or more make the false-positive rate worth reading; 0: none)")
    if count < 2:
        raise ValueError(f"references.count={count}: the anomaly score needs at least 2 references "
                         "(3 or more for leave-one-out scoring of references; the paper uses "
                         f"{PAPER_REFERENCES})")
    common = {"world": world, "architecture": architecture, "recipe": recipe}
    references = [ModelSpec(name=f"reference-{i:02d}", family=REFERENCE, seed=seed_start + i, **common)
                  for i in range(count)]
    # the seeds after the references', so a suite with more references shares these models
    nulls = [ModelSpec(name=f"{HELD_OUT}-{i:02d}", family=REFERENCE, seed=seed_start + count + i,
                       **common) for i in range(held_out)]
    anomalies = []
    for entry in table.pop("anomalies", []):
        entry = dict(entry)
        _check_keys(entry, None, "anomalies entry",
                    valid={"name", "family", "params", "seed", "checkpoint", "recipe", "row"})
        if "name" not in entry or "family" not in entry:
            raise ValueError(f"anomalies entry {entry} needs a 'name' and a 'family'")
        family = FAMILIES.get(entry["family"])
        params = family.validate_params(dict(entry.get("params", {})))
        entry_recipe = Recipe.from_dict({**asdict(recipe), **entry.get("recipe", {})})
        # a trigger or watermark that does not fit the images or a training crop fails now
        world_side = int(world.get("image_size", world_class.default_image_size))
        for side in sorted({world_side, *(size for _, size in entry_recipe.resolution_schedule)}):
            family.check_image_size(params, side, side)
        anomalies.append(ModelSpec(name=entry["name"], family=entry["family"], params=params,
                                   seed=int(entry.get("seed", default_anomaly_seed(entry["name"]))),
                                   checkpoint=entry.get("checkpoint"), row=entry.get("row"),
                                   **{**common, "recipe": entry_recipe}))
    sweeps = []
    for entry in table.pop("sweeps", []):
        sweep, specs = _expand_sweep(dict(entry), common, recipe)
        sweeps.append(sweep)
        anomalies += specs
    names = [s.name for s in references + nulls + anomalies]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"model names must be unique; repeated: {duplicates}")
    return Suite(name=name, path=path, world=world, architecture=architecture, recipe=recipe,
                 references=references, anomalies=anomalies, tables=table, held_out=nulls,
                 sweeps=sweeps)


def _expand_sweep(entry: dict[str, Any], common: dict[str, Any],
                  recipe: Recipe) -> tuple[Sweep, list[ModelSpec]]:
    """One [[sweeps]] entry -> its Sweep and its models: the base params with the family's
    strength parameter set to each value, one seed and one recipe for all of them."""
    from counteraudit.anomalies import FAMILIES
    from counteraudit.anomalies.base import strength_families
    _check_keys(entry, None, "sweeps entry",
                valid={"family", "values", "params", "seed", "recipe", "name"})
    if "family" not in entry or "values" not in entry:
        raise ValueError(f"sweeps entry {entry} needs a 'family' and its strength 'values', e.g. "
                         "{ family = \"backdoor\", values = [0.01, 0.05, 0.1] }")
    family = FAMILIES.get(entry["family"])
    with_strength = strength_families()
    if family.strength is None:
        raise ValueError(f"sweeps: family {family.name!r} has no strength parameter to sweep; "
                         "families with one (family: parameter): "
                         f"{', '.join(f'{k}: {v}' for k, v in with_strength.items())}")
    parameter, values = family.strength, entry["values"]
    if (not isinstance(values, list) or len(values) < 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values)):
        raise ValueError(f"sweeps: {family.name} values={values!r} must be a list of 2 or more "
                         f"numbers (its {parameter!r}, the issue's dose-response uses 4 to 6); for "
                         "one model use an [[anomalies]] entry")
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
    sweep_recipe = Recipe.from_dict({**asdict(recipe), **entry.get("recipe", {})})
    specs = [ModelSpec(name=f"{prefix}{value:g}", family=family.name, seed=seed,
                       params=family.validate_params({**base, parameter: value}),
                       **{**common, "recipe": sweep_recipe}) for value in values]
    return Sweep(name=prefix, family=family.name, parameter=parameter,
                 values=tuple(float(v) for v in values),
                 models=tuple(s.name for s in specs)), specs


def default_anomaly_seed(name: str) -> int:
    """An anomalous model's seed when its entry gives none: from its name, not its position, so
    adding, removing or reordering entries never changes (and retrains) the other models."""
    return derive_seed("anomaly", name) % 1_000_000_000


def _check_keys(table: dict[str, Any], cls: type | None, what: str, valid: set[str] | None = None):
    valid = valid if valid is not None else {f.name for f in fields(cls)}
    unknown = set(table) - valid
    if unknown:
        raise ValueError(f"unknown {what} option(s) {sorted(unknown)}; valid: {sorted(valid)}")


def toml_text(table: dict[str, Any], prefix: str = "") -> str:
    """A suite table as TOML: values first (a table inside an array as an inline table), then
    each nested table under its header. Strings are JSON-quoted, which TOML reads the same."""
    import json
    lines = [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in table.items()
             if not isinstance(v, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            header = f"{prefix}.{json.dumps(str(key))}" if prefix else json.dumps(str(key))
            lines += ["", f"[{header}]", toml_text(value, header)]
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    import json
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
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _overridden(out[key], value)
        else:
            out[key] = value
    return out


def write_derived_suite(base: Suite, name: str, overrides: dict[str, Any], path: Path) -> Suite:
    """A suite file at ``path``: ``base``'s file with its ``extends`` chain resolved, named
    ``name``, with ``overrides`` on top (tables merge key by key; a None removes a key), loaded.
    A whole file, not an object in memory, so every work item (a Slurm job included) loads the
    same suite from its path."""
    from counteraudit.train.artifacts import atomic_write_text
    table = _overridden({**_read_table(base.path), "name": name}, overrides)
    text = toml_text({"name": table.pop("name"), **table})
    atomic_write_text(path, f"# {base.path.name} with changes, written by counteraudit\n{text}\n")
    return load_suite(path)
