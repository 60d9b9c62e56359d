"""The suite file's schema: every table and key, its type and its range, checked when a suite is read.

A suite file may come from a stranger, and a typo must not silently run a default or fail after
an hour of training. So before any work, ``load_suite`` (train/core/suite.py) checks the whole
file (its ``extends`` chain resolved) against ``SuiteTable`` and raises one ``SuiteFileError``
listing every problem: the table and key, the value given, what it must be, the key's meaning
and recommended value, and for an unknown key or table the nearest valid name.

Validation is pydantic's (v2), in strict mode on the file's values as JSON: its strict JSON mode
has exactly TOML's types (``count = 2.9`` and ``epochs = "3"`` are errors, ``lr = 1`` is a
number), it reports every error with its location, and the ranges and explanations live beside
each key (``Field(ge=..., description=...)``). The validated ``SuiteTable`` is kept: the stages
read its typed sections. The tables that become parts of model keys (the world, the recipe, an
entry's params) are kept as written, where ``2`` and ``2.0`` hash differently; the dataclasses
that hold them carry their own ranges (``train/core/params.py`` turns one into a table schema).
"""
from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from counteraudit.train.core import size_bounds as bounds

# A name that becomes one path component (a suite's folder, a model's link, an image set's):
# letters, digits, '.', '_', '-', starting with a letter or digit (so never '..' or a hidden file).
SAFE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SAFE_NAME_LENGTH = 100
SafeName = Annotated[str, StringConstraints(pattern=SAFE_NAME_PATTERN, max_length=SAFE_NAME_LENGTH)]
SAFE_NAME_RULE = (f"a single folder name of at most {SAFE_NAME_LENGTH} letters, digits, '.', '_' "
                  "or '-', starting with a letter or digit (no '/', no '..')")


class SuiteFileError(ValueError):
    """A suite file that cannot be run as written; the message names the file, each key and its fix."""


class StrictTable(BaseModel):
    # allow_inf_nan: inf and nan are never a setting (an lr of inf trains a NaN model)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ReferencesTable(StrictTable):
    count: int = Field(5, ge=2, le=bounds.MODELS.limit, json_schema_extra=bounds.MODELS.extra,
                       description=(
        "reference models to train: the anomaly score's spread needs a pair, and scoring (each "
        "reference against the others, left out in turn) needs 3 (the paper: 12, the demo: 5)"))
    seed_start: int = Field(0, ge=0, description="the first reference's seed; the others follow")
    held_out: int = Field(0, ge=0, le=bounds.MODELS.limit, json_schema_extra=bounds.MODELS.extra,
                          description=(
        "more seeds trained like the references and scored as null models (8 or more make the "
        "false-positive rate worth reading; 0: none); with 2 or more they are the null "
        "population that gives each model a p-value ([evaluate] p_value)"))
    held_out_check: int = Field(0, ge=0, le=bounds.MODELS.limit,
                                json_schema_extra=bounds.MODELS.extra, description=(
        "how many of the held_out models (the last ones) check the null p-values' calibration "
        "instead of fitting them: 0 (none) or about half of held_out (the replicated suite: 10 "
        "of 20)"))


# The fewest references the score stage can use: it scores each reference against the others
# with that one left out (evaluate/scoring/scores.py), and the spread needs a pair.
MIN_SCORED_REFERENCES = 3
# The fewest held-out references that fit a null p-value: the Student-t fit needs a spread.
MIN_NULL_MODELS = 2


# A suite that names no distance scores with one every machine has, offline too.
DEFAULT_SUITE_DISTANCE = "l2"


# The paper's image counts: m detection images per model, p abnormal images per localizable model.
PAPER_DETECTION_IMAGES = 50
PAPER_LOCALIZATION_IMAGES = 40


class EvaluateTable(StrictTable):
    detection_images: int = Field(PAPER_DETECTION_IMAGES, ge=2, le=bounds.SET_IMAGES.limit,
                                  json_schema_extra=bounds.SET_IMAGES.extra,
                                  description="m, images explained per model for detection (the paper: 50)")
    localization_images: int = Field(PAPER_LOCALIZATION_IMAGES, ge=2, le=bounds.SET_IMAGES.limit,
                                     json_schema_extra=bounds.SET_IMAGES.extra,
                                     description="p, abnormal images per localizable model (the paper: 40)")
    seed: int = Field(0, ge=0, description="seed of the image sets' draw")
    distance: str = Field(DEFAULT_SUITE_DISTANCE, description=(
        "the image distance d(z, z') of the anomaly score, a registered distance: l2 (weight-free, "
        "the same on every machine: the demo's), ssim, lpips-alex (the paper's), lpips-vgg, "
        "lpips-squeeze (LPIPS needs torchvision's backbone weights: --download-weights fetches "
        "them once); the command line's --distance overrides it"))
    p_value: str | None = Field(None, description=(
        "the test that turns a model's Abar into a p-value against the null population of "
        "held-out references, a registered test (evaluate/scoring/null_tests/: huber, the "
        "recommended one, fits a robust location and scale to log Abar that one outlying null "
        "cannot move); absent: the paper's rule alone"))
    alpha: float = Field(0.05, gt=0, lt=1, description=(
        "the false-discovery rate at which a table's p-values are called detected (0.05)"))
    power: float = Field(0.8, gt=0, lt=1, description=(
        "the power a method must have before a miss counts as 'not detected' rather than "
        "'inconclusive' (0.8)"))


class ExplainTable(StrictTable):
    methods: list[str] | None = Field(None, description="explanation methods to run (default: "
                                                         "every registered method)")
    batch_sizes: dict[str, Annotated[int, Field(ge=1, le=bounds.BATCH.limit)]] = Field(
        default_factory=dict, json_schema_extra=bounds.BATCH.extra,
        description="images per batch, by method (default: the method's)")
    chunk_images: int | None = Field(None, ge=0, le=bounds.SET_IMAGES.limit,
                                     json_schema_extra=bounds.SET_IMAGES.extra, description=(
        "images per work item of the explain stage (0 or absent: one item per model and method; "
        "16 is a good start on Slurm)"))
    model_group: int = Field(1, ge=1, le=bounds.GROUP.limit,
                             json_schema_extra=bounds.GROUP.extra, description=(
        "models of one architecture explained in one grouped pass by the methods that allow it "
        "(explain/model_groups.py; 1: each model alone); grouped results are keyed apart"))


# How discovered subgroups are ranked (evaluate/discovery/relative.py); `discover --score` offers these.
DiscoverScore = Literal["relative", "absolute"]
DISCOVER_SCORES = typing.get_args(DiscoverScore)


class DiscoverTable(StrictTable):
    auditors: list[str] | None = Field(None, description="failure-discovery auditors to run "
                                                          "(default: every registered auditor)")
    seed: int = Field(0, ge=0, description="seed of the auditors' searches")
    budget: dict[str, Annotated[int, Field(ge=1, le=bounds.DISCOVERY_IMAGES.limit)]] = Field(
        default_factory=dict, json_schema_extra=bounds.DISCOVERY_IMAGES.extra,
        description="images each auditor may generate, by auditor")
    score: DiscoverScore = Field("relative", description=(
        "how subgroups are ranked: relative (recommended: the model's statistic against the "
        "references' on the same images, each reference left out of its own baseline) or "
        "absolute (the statistic alone, as the auditors' source papers ranked)"))


class ArchitectureTable(StrictTable):
    name: str = Field("small_resnet", description="a registered architecture")


class ScheduleSegment(StrictTable):
    epochs: int = Field(ge=1, le=bounds.EPOCHS.limit, json_schema_extra=bounds.EPOCHS.extra,
                        description="epochs trained at this crop size")
    size: int = Field(ge=1, le=bounds.IMAGE_SIDE.limit, json_schema_extra=bounds.IMAGE_SIDE.extra,
                      description="the training crop's side in pixels")


class AnomalyEntry(StrictTable):
    name: SafeName = Field(description=f"the model's name, {SAFE_NAME_RULE}")
    family: str = Field(description="a registered anomaly family")
    params: dict[str, Any] = Field(default_factory=dict, description="the family's parameters")
    seed: int | None = Field(None, ge=0, description="training seed (default: from the name)")
    checkpoint: str | None = Field(None, description=(
        "a weights-only .pth file to load instead of training (train/convert_checkpoint.py "
        "converts a full pickle you trust)"))
    checkpoint_recipe: str | None = Field(None, description=(
        "the published recipe the checkpoint was trained with (train/core/published_recipes.py, "
        "e.g. \"cohen2019-sigma0.50\"): recorded with the model and said in dry runs and reports"))
    recipe: dict[str, Any] = Field(default_factory=dict, description="keys of [recipe] to "
                                                                      "override for this model")
    row: str | None = Field(None, description="its Table 1 row (default: its family)")
    replicates: int = Field(1, ge=1, le=bounds.MODELS.limit, json_schema_extra=bounds.MODELS.extra,
                            description=(
        "models of this configuration that differ only in their seed, named <name>-r0, -r1, ...: "
        "Table 1 then reads a detection rate with an exact interval (1: one model, named <name>; "
        "5 or more to tell a family's rate from chance)"))


class SweepEntry(StrictTable):
    family: str = Field(description="a registered anomaly family with a strength parameter")
    values: list[float] = Field(min_length=2, max_length=bounds.MODELS.limit,
                                json_schema_extra=bounds.MODELS.extra,
                                description="2 or more strengths, one model each")
    params: dict[str, Any] = Field(default_factory=dict, description="the family's other "
                                                                      "parameters")
    seed: int | None = Field(None, ge=0, description="one seed for the whole sweep (default: "
                                                     "from its name)")
    recipe: dict[str, Any] = Field(default_factory=dict, description="keys of [recipe] to "
                                                                      "override for the sweep")
    name: SafeName | None = Field(None, description=f"the models' name prefix, {SAFE_NAME_RULE}")


class SuiteTable(StrictTable):
    """A whole suite file. Plug-in tables (a world's options, a method's, an auditor's, a family's
    parameters) are checked against their registries by ``train.suite`` once this passes."""
    name: SafeName = Field(description=f"the suite's name and folder, {SAFE_NAME_RULE}")
    plugins: list[str] = Field(default_factory=list, max_length=bounds.MODELS.limit, description=(
        "plug-in files to load first: .py files inside the suite file's folder, named relative "
        "to it (an extending suite adds its own to its base's; explain/README.md)"))
    world: dict[str, Any] = Field(default_factory=dict, description="the world and its options")
    architecture: ArchitectureTable = Field(default_factory=ArchitectureTable)
    recipe: dict[str, Any] = Field(default_factory=dict, description="the training recipe")
    references: ReferencesTable = Field(default_factory=ReferencesTable)
    anomalies: list[AnomalyEntry] = Field(default_factory=list, max_length=bounds.MODELS.limit,
                                          json_schema_extra=bounds.MODELS.extra)
    sweeps: list[SweepEntry] = Field(default_factory=list, max_length=bounds.MODELS.limit,
                                     json_schema_extra=bounds.MODELS.extra)
    explain: ExplainTable = Field(default_factory=ExplainTable)
    methods: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "[methods.<name>]: a method's parameters"))
    evaluate: EvaluateTable = Field(default_factory=EvaluateTable)
    image_sets: dict[SafeName, str] = Field(default_factory=dict, description=(
        "[image_sets]: a set's name (detection, <model>-abnormal, <model>-normal) -> a folder of "
        "PNG/JPEG images (or of class-index subfolders 0/, 1/, ...) that replaces its seeded draw, "
        "e.g. the original's published images (train/core/image_folders.py)"))
    discover: DiscoverTable = Field(default_factory=DiscoverTable)
    auditors: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "[auditors.<name>]: an auditor's parameters"))
    slurm: dict[str, Any] = Field(default_factory=dict, description="executor options "
                                                                    "(slurm/README.md)")
