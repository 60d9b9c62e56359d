"""Records on disk, content-addressed: a record's id is the SHA-256 of its canonical JSON, and its
file is ``<id>.json``; reading one checks both, the schema and its population."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from counteraudit.evaluate.records.populations import KnownPopulation, check_population, known_populations
from counteraudit.evaluate.records.schema import Record, RecordError, sha256_of, validate_record
from counteraudit.train.core.artifacts import atomic_write_text

SUFFIX = ".json"


def record_id(record: Record) -> str:
    """The SHA-256 of the record's canonical JSON (sorted keys, no spaces; a record holds no id
    of its own)."""
    return sha256_of(record.data())


def record_text(record: Record) -> str:
    """The file's text: the record's JSON, keys sorted, indented, ending in a newline."""
    return json.dumps(record.data(), sort_keys=True, indent=2, ensure_ascii=False,
                      allow_nan=False) + "\n"


def write_record(record: Record, folder: str | Path) -> Path:
    """``<folder>/<id>.json``, written atomically (the same record twice: the same file)."""
    path = Path(folder) / f"{record_id(record)}{SUFFIX}"
    atomic_write_text(path, record_text(record), chosen_by_user=True)
    return path


def read_record(path: str | Path, known: dict[str, KnownPopulation] | None = None,
                known_path: str | Path | None = None) -> Record:
    """The record in ``path``, validated by its schema, its file name checked against its id and
    its population against the known ones (``known``, default the committed ones); one
    ``RecordError`` naming the file and the key otherwise."""
    path = Path(path)
    known = known_populations(known_path) if known is None else known
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RecordError(f"{path}: not a readable JSON record ({error})") from None
    record = validate_record(data, str(path))
    expected = record_id(record)
    if path.name != f"{expected}{SUFFIX}":
        raise RecordError(f"{path}: the file name must be the record's id, {expected}{SUFFIX} (the "
                          "SHA-256 of its canonical JSON): a renamed or edited record is refused; "
                          "write it again with counteraudit record")
    check_population(record.population.suite, record.population.population_id, known, str(path),
                     known_path)
    return record


def read_records(folder: str | Path, known: dict[str, KnownPopulation] | None = None,
                 known_path: str | Path | None = None) -> list[Record]:
    """Every ``*.json`` record in ``folder``, in file-name order (``read_record`` each)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"{folder}: no such folder of records (counteraudit record --out writes "
                          "one)")
    known = known_populations(known_path) if known is None else known
    return [read_record(path, known, known_path) for path in sorted(folder.glob(f"*{SUFFIX}"))]
