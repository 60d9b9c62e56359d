"""The known populations (populations.toml): which released population a record may name, and how
a run's population id is computed to compare with it."""
from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from counteraudit.evaluate.records.populations_file import KNOWN_POPULATIONS
from counteraudit.evaluate.records.schema import SHA256_PATTERN, RecordError, error_line
from counteraudit.evaluate.release.export import population_id
from counteraudit.train.core.suite import Suite


class ExportedWith(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    version: str
    commit: str


class KnownPopulation(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    population_id: str = Field(pattern=SHA256_PATTERN)
    exported_with: ExportedWith

    def code(self) -> dict[str, str]:
        """The code version as a release's manifest holds it (``release.provenance.code_version``'s
        order: its model card lists the keys in it)."""
        return {"version": self.exported_with.version, "commit": self.exported_with.commit}


def known_populations(path: str | Path | None = None) -> dict[str, KnownPopulation]:
    """Suite name -> its known population, from ``path`` (default: the committed
    populations.toml); one ``RecordError`` naming the file and the key otherwise."""
    path = Path(path) if path is not None else KNOWN_POPULATIONS
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RecordError(f"known populations {path}: cannot be read as TOML: {error}") from None
    known = {}
    for suite, entry in table.items():
        try:
            known[suite] = KnownPopulation.model_validate(entry)
        except ValidationError as error:
            raise RecordError(f"known populations {path}: [{suite}] {error_line(error)}; each "
                              "suite's table holds population_id (64 hex digits) and "
                              "exported_with = { version, commit }") from None
    return known


def run_population_id(suite: Suite, runs_root, known: dict[str, KnownPopulation]) -> str:
    """The id of the population the run trained for ``suite``, as its release would have it: with
    the code version the suite's known release was exported with (this checkout's when the suite
    has none, as an export now would write it)."""
    entry = known.get(suite.name)
    return population_id(suite, runs_root, entry.code() if entry else None)


def check_population(suite: str, population: str, known: dict[str, KnownPopulation],
                     where: str, known_path: str | Path | None = None) -> None:
    """One ``RecordError`` unless ``population`` is the known population of ``suite``."""
    entry = known.get(suite)
    if entry is not None and entry.population_id == population:
        return
    said = (f"the known population of suite {suite!r} is {entry.population_id}" if entry
            else f"suite {suite!r} has no known population")
    raise RecordError(
        f"{where}: population.population_id = {population} matches no known population "
        f"({said}; {known_path or KNOWN_POPULATIONS}). A record is made from a run of a released "
        "population: export it (counteraudit population export), then add its suite, id and "
        "exporting code version to that file")
