"""Model specs: everything that determines a checkpoint (its hash names the model's folder), and
how an [[anomalies]] entry or a [[sweeps]] entry expands into them."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from counteraudit.train.core import numerics
from counteraudit.train.core.artifacts import derive_seed, stable_hash
from counteraudit.train.core.plugin_files import plugin_digest
from counteraudit.train.core.recipe import Recipe
from counteraudit.train.core.registries import ARCHITECTURES, FAMILIES, WORLDS, strength_families
from counteraudit.train.core.suite_schema import SAFE_NAME_LENGTH, SAFE_NAME_PATTERN, SAFE_NAME_RULE

REFERENCE = "reference"
HELD_OUT = "held-out"  # name prefix of the null models ([references] held_out)
PAPER_REFERENCES = 12  # the paper's n = 12 reference models


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
                "params": self.weight_params, "checkpoint": self.checkpoint, **numerics.key_tag(),
                **self.plugin_file_digests()}

    def plugin_file_digests(self) -> dict[str, str]:
        """The SHA-256 of each plug-in file (--plugins, a suite's plugins) that defines this
        model's family, architecture or world: editing the file trains anew. Empty for shipped
        plug-ins, so their keys are what they always were."""
        entries = {"architecture": ARCHITECTURES.get(self.architecture),
                   "world": WORLDS.get(self.world.get("name", "synthetic"))}
        if not self.is_reference:
            entries["family"] = FAMILIES.get(self.family)
        digests = {f"{kind}_file_sha256": plugin_digest(entry) for kind, entry in entries.items()}
        return {key: digest for key, digest in digests.items() if digest is not None}

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


def safe_name(name: str, what: str) -> str:
    """``name`` if it is one safe path component (``SAFE_NAME_RULE``); else a ValueError."""
    if not (isinstance(name, str) and len(name) <= SAFE_NAME_LENGTH
            and re.fullmatch(SAFE_NAME_PATTERN, name)):
        raise ValueError(f"{what} {name!r} is not {SAFE_NAME_RULE}")
    return name


def expand_sweep(entry: dict[str, Any], common: dict[str, Any],
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


def replicates(entry: dict[str, Any], common: dict[str, Any],
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
