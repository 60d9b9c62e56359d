"""The record of one result: one explanation method on one population, as a versioned schema.

A record says which method (its name, the parameters it ran with and their digest, the plug-in
file that defined it), on which population (the suite, and the id of its release: the SHA-256 of
the manifest.json ``counteraudit population export`` writes), with which distance, numeric mode,
code and hardware, found what: per family the detection rate with its exact interval and verdict
under the suite's null test, per localizable configuration the mean AUROC with its interval and
chance band, the paired differences of detection rates with the controls, and what its
explanations cost.

One format per version, named in the record's ``schema`` field as torchvision's ``WeightsEnum``
names its weights: ``RecordV1`` reads ``counteraudit.record/1``. A reader takes any version
through ``RECORD_SCHEMAS`` (``validate_record``) and refuses one it does not know instead of
guessing; a new version is a new class beside the old, never a change to it.

A record does not depend on which other methods ran beside it: its per-model verdicts are
computed on the detection table restricted to its own method (the fitting nulls are that method's
rows too), so the Benjamini-Hochberg adjustment runs over its own anomalous models only, not over
the models x methods cells of the run's Table 1 (``verdicts.model_verdicts``). Its verdicts can
therefore differ from the run's Table 1 with verdicts where that table adjusts over many methods.
"""
from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from counteraudit.evaluate.scoring.distances import DISTANCES
from counteraudit.evaluate.scoring.null_tests.base import NULL_TESTS
from counteraudit.evaluate.scoring.verdicts import VERDICTS

SCHEMA_V1 = "counteraudit.record/1"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
NUMERIC_MODES = ("portable", "native", "gpu")  # numerics.record()'s "mode"

Digest = Annotated[str, Field(pattern=SHA256_PATTERN)]
Name = Annotated[str, Field(min_length=1, max_length=200)]
Count = Annotated[int, Field(ge=0)]
Rate = Annotated[float, Field(ge=0.0, le=1.0)]
Difference = Annotated[float, Field(ge=-1.0, le=1.0)]
Probability = Annotated[float, Field(gt=0.0, lt=1.0)]
Seconds = Annotated[float, Field(ge=0.0)]


class RecordError(ValueError):
    """A record that cannot be read or does not validate: the message names the file, the key
    and the fix."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def canonical_json(data: Any) -> str:
    """The form a digest is taken of: sorted keys, no spaces, no NaN."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def sha256_of(data: Any) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def _ordered(low: float | None, value: float | None, high: float | None, what: str) -> None:
    if None not in (low, value, high) and not low <= value <= high:
        raise ValueError(f"{what}: the interval [{low}, {high}] must hold the value {value}")


class Method(Strict):
    name: Name
    parameters: dict[str, JsonValue]  # its [methods.<name>] table with the defaults filled in
    parameters_sha256: Digest         # sha256_of(parameters)
    plugin_sha256: Digest | None      # the plug-in file that defined it; None: a shipped method

    @model_validator(mode="after")
    def _digest_matches(self) -> Method:
        if sha256_of(self.parameters) != self.parameters_sha256:
            raise ValueError("parameters_sha256 is not the SHA-256 of parameters' canonical JSON")
        return self


class Population(Strict):
    suite: Name
    population_id: Digest  # the SHA-256 of the release's manifest.json
    n_references: Count
    n_null_fit: Annotated[int, Field(ge=1)]
    n_null_check: Count


class Numerics(Strict):
    mode: Literal[NUMERIC_MODES]
    key: Name  # numerics.key_tag(): "portable-v1", "native-avx2"


class Code(Strict):
    version: Name
    commit: Name  # a git commit ("+dirty" where files differed), or "unknown"


class Hardware(Strict):
    cpu: Name
    cpu_flags: list[Name]  # the vector extensions the CPU has (avx, avx2, fma, avx512*)
    gpu: Name | None


class Verdicts(Strict):
    test: Name  # a registered null test (null_tests)
    alpha: Probability
    power: Probability

    @model_validator(mode="after")
    def _registered(self) -> Verdicts:
        if self.test not in NULL_TESTS.names():
            raise ValueError(f"test {self.test!r} is not a registered null test "
                             f"({', '.join(NULL_TESTS.names())})")
        return self


class FamilyResult(Strict):
    family: Name
    n_models: Count  # the models whose implant took
    n_detected: Count
    n_not_detected: Count
    n_inconclusive: Count
    n_implant_failed: Count
    rate: Rate | None  # None: no model's implant took
    ci_low: Rate | None
    ci_high: Rate | None
    verdict: Literal[VERDICTS]
    paper_rate: Rate | None
    fragile: bool  # one model left out flips the verdict

    @model_validator(mode="after")
    def _consistent(self) -> FamilyResult:
        if self.n_detected + self.n_not_detected + self.n_inconclusive != self.n_models:
            raise ValueError("n_detected + n_not_detected + n_inconclusive must equal n_models")
        values = (self.rate, self.ci_low, self.ci_high, self.paper_rate)
        if (self.n_models == 0) != all(v is None for v in values):
            raise ValueError("rate, ci_low, ci_high and paper_rate are null exactly when n_models "
                             "is 0")
        if self.n_models and any(v is None for v in values):
            raise ValueError("rate, ci_low, ci_high and paper_rate must all be given")
        _ordered(self.ci_low, self.rate, self.ci_high, "rate")
        return self


class LocalizationResult(Strict):
    family: Name
    configuration: Name
    n_models: Count
    mean_auroc: Rate | None  # None: no scores, with the reason
    ci_low: Rate | None
    ci_high: Rate | None
    chance_low: Rate | None
    chance_high: Rate | None
    reason: Name | None

    @model_validator(mode="after")
    def _measured_or_said(self) -> LocalizationResult:
        values = (self.mean_auroc, self.ci_low, self.ci_high, self.chance_low, self.chance_high)
        if all(v is None for v in values) == (self.reason is None):
            raise ValueError("either mean_auroc, ci_low, ci_high, chance_low and chance_high are "
                             "given, or none is and reason says why")
        if any(v is None for v in values) and self.reason is None:
            raise ValueError("mean_auroc, ci_low, ci_high, chance_low and chance_high must all be "
                             "given")
        _ordered(self.ci_low, self.mean_auroc, self.ci_high, "mean_auroc")
        _ordered(self.chance_low, self.chance_low, self.chance_high, "chance band")
        return self

    @property
    def above_chance(self) -> bool:
        return self.mean_auroc is not None and self.mean_auroc > self.chance_high


class Comparison(Strict):
    against: Name  # a control
    family: Name
    rate_difference: Difference  # this method's detection rate minus the control's
    ci_low: Difference
    ci_high: Difference
    p_holm: Rate  # Holm-adjusted over the record's comparisons

    @model_validator(mode="after")
    def _ordered_interval(self) -> Comparison:
        _ordered(self.ci_low, self.rate_difference, self.ci_high, "rate_difference")
        return self


class Cost(Strict):
    results: Count
    timed_results: Count
    images: Count
    seconds: Seconds | None  # None: no result recorded its cost
    cpu_seconds: Seconds | None


class RecordV1(Strict):
    schema_: Literal["counteraudit.record/1"] = Field(alias="schema")
    method: Method
    population: Population
    distance: Name
    numerics: Numerics
    code: Code
    hardware: Hardware
    verdicts: Verdicts
    model_blind: bool  # maps the same for every model: no verdicts (families empty)
    families: list[FamilyResult]
    localization: list[LocalizationResult]
    comparisons: list[Comparison]
    cost: Cost

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> RecordV1:
        if self.distance not in DISTANCES.names():
            raise ValueError(f"distance {self.distance!r} is not a registered distance "
                             f"({', '.join(DISTANCES.names())})")
        for rows, key in ((self.families, "family"),
                          (self.localization, "configuration")):
            names = [getattr(row, key) for row in rows]
            if len(set(names)) != len(names):
                raise ValueError(f"a {key} is listed twice")
        if self.model_blind and self.families:
            raise ValueError("a model-blind method has no verdicts: families must be empty")
        return self

    def data(self) -> dict[str, Any]:
        """The record as JSON data, by its keys (``schema`` included)."""
        return self.model_dump(mode="json", by_alias=True)


Record = RecordV1
# schema name -> its class: how a reader takes any version
RECORD_SCHEMAS: dict[str, type[RecordV1]] = {SCHEMA_V1: RecordV1}


def error_line(error: ValidationError) -> str:
    """The first problem of a failed validation, as "key.path: what is wrong"."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(the record)"
    given = first.get("input")
    shown = "" if isinstance(given, (dict, list)) else f" (given: {given!r})"
    more = len(error.errors()) - 1
    return (f"{key}: {first['msg']}{shown}" + (f"; and {more} more problem(s)" if more else ""))


def validate_record(data: Any, where: str) -> Record:
    """A record's data (parsed JSON) validated by the schema its ``schema`` names; one
    ``RecordError`` naming ``where`` (the file) and the key otherwise."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: a record is a JSON object, not {type(data).__name__}")
    name = data.get("schema")
    if name not in RECORD_SCHEMAS:
        raise RecordError(f"{where}: schema = {name!r} is not a record schema this version reads "
                          f"({', '.join(RECORD_SCHEMAS)}); write it with counteraudit record")
    try:
        return RECORD_SCHEMAS[name].model_validate(data)
    except ValidationError as error:
        raise RecordError(f"{where}: {error_line(error)}; fix that key (the schema: "
                          "evaluate/records/schema.py) or write the record again with "
                          "counteraudit record") from None
