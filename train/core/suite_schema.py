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

import json
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.paths import redacted
from counteraudit.train.core.registry import nearest

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


# ---------------------------------------------------------------- checking a table
def check_table(schema: type[BaseModel], table: Any, where: str) -> list[str]:
    """The problems of ``table`` under ``schema``, each one line naming ``where`` and the key."""
    return validated_table(schema, table, where)[1]


def validated_table(schema: type[BaseModel], table: Any,
                    where: str) -> tuple[BaseModel | None, list[str]]:
    """``table`` validated under ``schema`` (None where it has problems) and its problems, each
    one line naming ``where`` and the key."""
    try:
        return schema.model_validate_json(json.dumps(table, default=str)), []
    except ValidationError as error:
        problems: dict[tuple, list[dict[str, Any]]] = {}
        for problem in error.errors():  # one line per key, whichever union members it failed
            loc = _real_loc(table, problem["loc"], problem["type"] == "missing")
            problems.setdefault(loc, []).append(problem)
        # a union member that failed at a table's own level ("must be a list") is noise beside
        # the member that matched the table's shape and failed at one of its keys
        deepest = [loc for loc in problems
                   if not any(other[:len(loc)] == loc and other != loc for other in problems)]
        return None, [_describe({**problems[loc][0], "loc": loc, "alternatives": problems[loc]},
                                schema, table, where) for loc in deepest]


def _real_loc(table: Any, loc: tuple, missing: bool) -> tuple:
    """``loc`` without the tags pydantic adds for union members ('int', 'str'): only the parts
    that index into the file's data (and, for a ``missing`` key, the key that is absent)."""
    real, node = [], table
    for position, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif missing and position == len(loc) - 1 and isinstance(node, dict):
            pass
        else:
            continue
        real.append(part)
    return tuple(real)


def problem_lines(problems: list[str]) -> str:
    """'N problems; nothing was run:' and one indented line per problem."""
    lines = "\n".join(f"  - {problem}" for problem in problems)
    count = "a problem" if len(problems) == 1 else f"{len(problems)} problems"
    return f"{count}; nothing was run:\n{lines}"


def raise_problems(path, problems: list[str]) -> typing.NoReturn:
    raise SuiteFileError(redacted(f"suite file {path} has {problem_lines(problems)}"))


# ---------------------------------------------------------------- messages
_EXPECTED = {
    "int_type": "a whole number", "int_from_float": "a whole number", "float_type": "a number",
    "bool_type": "true or false", "string_type": "a string in quotes", "list_type": "a list [...]",
    "dict_type": "a table", "model_type": "a table", "dataclass_type": "a table",
    "tuple_type": "a list [...]", "model_attributes_type": "a table", "none_required": "absent",
}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}


def _location(where: str, loc: tuple) -> str:
    """('anomalies', 2, 'seed') -> '[[anomalies]] entry 3, seed'; ('recipe', 'epochs') ->
    '[recipe] epochs'; within ``where`` (a table's own header) the key alone."""
    parts, text = list(loc), where
    while parts:
        part = parts.pop(0)
        if isinstance(part, int):
            text = f"{text} entry {part + 1}" if text else f"entry {part + 1}"
        elif not text:
            is_array = parts and isinstance(parts[0], int)
            text = f"[[{part}]]" if is_array else f"[{part}]" if parts else str(part)
        else:
            text = f"{text}, {part}" if text.endswith(tuple("0123456789")) else f"{text} {part}"
    return text


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, default=str)
        return text if len(text) <= 60 else text[:57] + "..."
    return repr(value)


def _field_info(schema: type[BaseModel], loc: tuple):
    """The pydantic FieldInfo at ``loc`` (None where the path leaves declared fields)."""
    model, info = schema, None
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = model.model_fields.get(part)
        if info is None:
            return None
        model = _nested_model(info.annotation)
    return info


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The table model inside an annotation (``X``, ``list[X]``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        inner = _nested_model(argument)
        if inner is not None:
            return inner
    return None


def _siblings(schema: type[BaseModel], loc: tuple) -> list[str]:
    """The valid keys of the table that holds ``loc``'s last key."""
    parent = loc[:-1]
    while parent and isinstance(parent[-1], int):
        parent = parent[:-1]
    if not parent:
        return list(schema.model_fields)
    info = _field_info(schema, parent)
    model = _nested_model(info.annotation) if info is not None else None
    return list(model.model_fields) if model is not None else []


def _why(info, sign: str) -> str:
    """The reason for an upper bound (``size_bounds.py``), where the key has one (on the key
    itself, or on its items: ``dict[str, Annotated[int, Field(le=...)]]``)."""
    reason = _bound_reason(info.json_schema_extra, info.annotation) if info is not None else None
    return f" ({reason})" if sign in ("<=", "<") and reason else ""


def _bound_reason(extra: Any, annotation: Any) -> str | None:
    if isinstance(extra, dict) and bounds.BOUND_REASON in extra:
        return extra[bounds.BOUND_REASON]
    for part in getattr(annotation, "__metadata__", ()):  # Annotated[X, Field(...)]
        reason = _bound_reason(getattr(part, "json_schema_extra", None), None)
        if reason:
            return reason
    for argument in typing.get_args(annotation):
        reason = _bound_reason(None, argument)
        if reason:
            return reason
    return None


def _describe(problem: dict[str, Any], schema: type[BaseModel], table: Any, where: str) -> str:
    loc = tuple(part for part in problem["loc"]
                if not (isinstance(part, str) and part.startswith(("function-", "json-"))))
    kind, key = problem["type"], _location(where, loc)
    if kind == "extra_forbidden":
        valid = [key for key in _siblings(schema, loc) if key != "name" or len(loc) > 1]
        name = loc[-1]
        is_table = isinstance(problem.get("input"), dict) and not where and len(loc) == 1
        what = f"unknown table [{name}]" if is_table else f"{key}: unknown key"
        if not valid:
            return f"{what}: none is valid (it takes no parameters)"
        return (f"{what}{nearest(name, valid)}; valid {'tables' if is_table else 'keys'}: "
                f"{', '.join(valid)}")
    if kind == "missing":
        info = _field_info(schema, loc)
        meaning = f" ({info.description})" if info is not None and info.description else ""
        return f"{key} is missing; add it{meaning}"
    value = problem.get("input")
    info = _field_info(schema, loc)
    meaning = f"; {loc[-1]}: {info.description}" if info is not None and info.description else ""
    if kind in _BOUNDS:
        sign, bound = _BOUNDS[kind][0], problem["ctx"][_BOUNDS[kind][1]]
        return f"{key} = {_value_text(value)} must be {sign} {bound}{_why(info, sign)}{meaning}"
    if kind == "literal_error":
        annotation = info.annotation if info is not None else None
        valid = (", ".join(map(repr, typing.get_args(annotation)))
                 if typing.get_origin(annotation) is Literal else problem["ctx"]["expected"])
        return f"{key} = {_value_text(value)} is not one of the valid values {valid}{meaning}"
    if kind == "finite_number":
        return (f"{key} = {_value_text(value)} must be a finite number (inf and nan are never a "
                f"setting){meaning}")
    if kind == "string_pattern_mismatch" or (kind == "string_too_long"
                                               and info is not None and "name" in str(loc[-1])):
        return f"{key} = {_value_text(value)} is not {SAFE_NAME_RULE}"
    if kind == "too_short":
        return (f"{key} = {_value_text(value)} must hold at least {problem['ctx']['min_length']} "
                f"items{meaning}")
    if kind == "too_long":
        return (f"{key} = {_value_text(value)} must hold at most {problem['ctx']['max_length']} "
                f"items{_why(info, '<=')}{meaning}")
    expected = " or ".join(dict.fromkeys(_EXPECTED.get(p["type"], p["msg"].lower())
                                         for p in problem.get("alternatives", [problem])))
    given = type(value).__name__
    given = {"str": "a string", "int": "a whole number", "float": "a number with a fraction",
             "bool": "true or false", "list": "a list", "dict": "a table"}.get(given, given)
    return f"{key} = {_value_text(value)} must be {expected}, not {given}{meaning}"
