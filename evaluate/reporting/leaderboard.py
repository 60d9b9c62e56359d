"""The leaderboard: records (evaluate/records) as one ranked table per population, in Markdown and
as a static HTML page.

Ranking (``RANKING``): families detected (the family verdict "detected"), then localizable
configurations localized above chance (the mean AUROC above its chance band), then fewer families
"not detected" (missed with power); ties share a rank. The controls (``zoo.CONTROLS``) and
model-blind methods are listed after the ranked rows, unranked. Records of different populations,
distances or verdict settings are never mixed in one table: each such group is a table of its
own, with the population id, suite, test, alpha, code versions and hardware said under it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from typing import Sequence

import pandas as pd

from counteraudit.evaluate.records.schema import FamilyResult, LocalizationResult, Record
from counteraudit.evaluate.reporting.html import STYLE, html_table, legend, verdict_class
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.evaluate.scoring.verdicts import DETECTED, NOT_DETECTED
from counteraudit.evaluate.scoring.zoo import CONTROLS

RANKING = ("Ranked by the families detected (family verdict \"detected\": the exact 95% interval "
           "of the detection rate lies above alpha), then the configurations localized above "
           "chance (mean AUROC over the replicates above the upper end of its chance band), then "
           "the fewest families \"not detected\" (missed with power); ties share a rank. The "
           "controls and model-blind methods are shown below the ranked methods, unranked.")
CONTROL, MODEL_BLIND = "control", "model-blind"
NO_RECORDS = "No records yet: `counteraudit record` writes them (evaluate/README.md)."
ABOVE_CHANCE = "above chance"
# What a Markdown renderer would read as markup in free text (a CPU's name, a commit): HTML, code,
# emphasis (an underscore inside a word is none), a link's or image's "](" (to_markdown escapes a
# table's cell edge, "|").
MARKDOWN_SPECIAL = re.compile(r"[\\`*<>#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\](?=[(\[:])|!(?=\[)")


@dataclass(frozen=True)
class Board:
    """One table: the records of one population under one distance and verdict setting."""
    suite: str
    population_id: str
    distance: str
    test: str
    alpha: float
    power: float
    records: tuple[Record, ...]


def boards(records: Sequence[Record]) -> list[Board]:
    """The records grouped into tables: one per (suite, population, distance, test, alpha,
    power), in that order of keys."""
    groups: dict[tuple, list[Record]] = {}
    for record in records:
        key = (record.population.suite, record.population.population_id, record.distance,
               record.verdicts.test, record.verdicts.alpha, record.verdicts.power)
        groups.setdefault(key, []).append(record)
    return [Board(*key, records=tuple(group)) for key, group in sorted(groups.items())]


def is_ranked(record: Record) -> bool:
    return record.method.name not in CONTROLS and not record.model_blind


def ranking_key(record: Record) -> tuple[int, int, int]:
    """(families detected, configurations localized above chance, families not detected): more,
    more, fewer is better."""
    detected = sum(f.verdict == DETECTED for f in record.families)
    localized = sum(c.above_chance for c in record.localization)
    missed = sum(f.verdict == NOT_DETECTED for f in record.families)
    return detected, localized, missed


def _order(key: tuple[int, int, int]) -> tuple[int, int, int]:
    return -key[0], -key[1], key[2]


def family_cell(result: FamilyResult | None) -> str:
    if result is None:
        return "not in the record"
    if result.n_models == 0:
        return f"no model (implant failed x{result.n_implant_failed})"
    return (f"{result.rate:.2f} [{result.ci_low:.2f}, {result.ci_high:.2f}] {result.verdict}"
            + (", fragile" if result.fragile else ""))


def localization_cell(result: LocalizationResult | None) -> str:
    if result is None:
        return "not in the record"
    if result.mean_auroc is None:
        return result.reason.split(":")[0]
    said = ABOVE_CHANCE if result.above_chance else "within chance"
    return (f"{result.mean_auroc:.2f} [{result.ci_low:.2f}, {result.ci_high:.2f}] {said} "
            f"(band {result.chance_low:.2f}-{result.chance_high:.2f})")


def _labels(records: Sequence[Record]) -> list[str]:
    """Each record's row label: the method's name, with its parameters' digest where two records
    of the table share a name."""
    names = [record.method.name for record in records]
    return [name if names.count(name) == 1 else
            f"{name} ({record.method.parameters_sha256[:8]})"
            for name, record in zip(names, records)]


def measured_configurations(records: Sequence[Record]) -> list[str]:
    """The localizable configurations some record of the table has an AUROC for: a column each
    (one where no record has one would repeat the same reason on every row; the notes say it)."""
    return list(dict.fromkeys(c.configuration for r in records for c in r.localization
                              if c.mean_auroc is not None))


def unmeasured_note(records: Sequence[Record]) -> str | None:
    """What the notes say of the configurations no record has an AUROC for, and why."""
    measured = set(measured_configurations(records))
    missing = {c.configuration: c.reason for r in records for c in r.localization
               if c.configuration not in measured}
    if not missing:
        return None
    reasons = sorted(set(missing.values()))
    return (f"No AUROC for {', '.join(missing)}: " + "; ".join(reasons) + ".")


def board_table(board: Board) -> pd.DataFrame:
    """The board's rows: rank (or "control", "model-blind"), method, the three ranking counts, a
    cell per family ("0.80 [0.44, 0.97] detected") and per localizable configuration ("AUROC
    0.74 [0.61, 0.86] above chance (band 0.38-0.62)"), and the explanations' CPU seconds."""
    records = list(board.records)
    families = list(dict.fromkeys(f.family for r in records for f in r.families))
    located = measured_configurations(records)
    keys = {id(r): ranking_key(r) for r in records}
    ranked = sorted((r for r in records if is_ranked(r)),
                    key=lambda r: (_order(keys[id(r)]), r.method.name))
    unranked = sorted((r for r in records if not is_ranked(r)),
                      key=lambda r: (r.model_blind, r.method.name))
    ordered = ranked + unranked
    rows = []
    for record, label in zip(ordered, _labels(ordered)):
        key = keys[id(record)]
        rank = (str(1 + sum(_order(keys[id(other)]) < _order(key) for other in ranked))
                if is_ranked(record) else MODEL_BLIND if record.model_blind else CONTROL)
        by_family = {f.family: f for f in record.families}
        by_configuration = {c.configuration: c for c in record.localization}
        cpu = record.cost.cpu_seconds
        rows.append({"rank": rank, "method": label, "detected": key[0], "localized": key[1],
                     "not detected": key[2],
                     **{family: (MODEL_BLIND if record.model_blind else
                                 family_cell(by_family.get(family))) for family in families},
                     **{f"AUROC {c}": localization_cell(by_configuration.get(c)) for c in located},
                     "explain CPU s": "not recorded" if cpu is None else f"{cpu:.0f}"})
    return pd.DataFrame(rows)


def board_notes(board: Board) -> list[str]:
    """What the table was computed on, said under it (free text as the records hold it)."""
    records = board.records
    first = records[0].population
    codes = sorted({f"{r.code.version} (commit {r.code.commit})" for r in records})
    modes = sorted({f"{r.numerics.mode} ({r.numerics.key})" for r in records})
    machines = sorted({r.hardware.cpu + (f" with {', '.join(r.hardware.cpu_flags)}"
                                         if r.hardware.cpu_flags else "")
                       + (f", GPU {r.hardware.gpu}" if r.hardware.gpu else "") for r in records})
    return [f"Population {board.population_id} (suite {board.suite}: {first.n_references} "
            f"references, {first.n_null_fit} held-out clean models fitting the null, "
            f"{first.n_null_check} checking it).",
            f"Verdicts: the {board.test} test at alpha = {board.alpha}, power = {board.power}; "
            f"distance {board.distance}. Each cell: the detection rate over the family's models "
            "with its exact 95% interval and verdict; AUROC cells: the mean over the "
            "configuration's replicates with its 95% interval and the band it falls in by chance.",
            *([note] if (note := unmeasured_note(records)) else []),
            f"Code: {'; '.join(codes)}. Numeric mode: {'; '.join(modes)}.",
            f"Hardware (where each record was written): {'; '.join(machines)}."]


def markdown_text(text: str) -> str:
    """Free text, escaped so a Markdown renderer shows it as written."""
    return MARKDOWN_SPECIAL.sub(lambda match: "\\" + match.group(0), text)


def markdown_table(table: pd.DataFrame) -> pd.DataFrame:
    """Every cell and header of ``table`` as escaped Markdown text."""
    escaped = table.map(lambda value: markdown_text(str(value)))
    escaped.columns = [markdown_text(str(column)) for column in table.columns]
    return escaped


def leaderboard_markdown(records: Sequence[Record]) -> str:
    """The leaderboard as Markdown: per board a heading, the table and its notes."""
    if not records:
        return f"{NO_RECORDS}\n"
    parts = [f"{RANKING}\n"]
    for board in boards(records):
        parts += [f"#### Suite {markdown_text(board.suite)}, population "
                  f"{board.population_id[:12]}\n",
                  to_markdown(markdown_table(board_table(board))),
                  *(f"- {markdown_text(line)}" for line in board_notes(board)), ""]
    return "\n".join(parts)


def cell_class(value) -> str | None:
    """A verdict's colour for family cells, localization's for AUROC cells."""
    if isinstance(value, str) and ABOVE_CHANCE in value:
        return "v-localized"
    if isinstance(value, str) and "within chance" in value:
        return "v-inconclusive"
    return verdict_class(value.removesuffix(", fragile") if isinstance(value, str) else value)


# A cell keeps its interval on one line (the table scrolls sideways instead); a phone wraps cells
# to a narrower table; a 64-digit population id breaks anywhere rather than widen the page.
PAGE_STYLE = STYLE + """
td { white-space: nowrap; } .note, li, h2 { overflow-wrap: anywhere; }
@media (max-width: 600px) { td { white-space: normal; } td:not(.num) { min-width: 6em; } }
"""


def leaderboard_html(records: Sequence[Record]) -> str:
    """The leaderboard as one static, self-contained page: no script, no external resource, every
    text escaped; each table scrolls sideways on a narrow screen."""
    body = []
    if not records:
        body.append(f'<p class="note">{escape(NO_RECORDS)}</p>')
    for board in boards(records):
        table = board_table(board)
        families = [c for c in table.columns if c not in ("rank", "method", "detected",
                                                          "localized", "not detected",
                                                          "explain CPU s")]
        body += [f"<h2>Suite {escape(board.suite)}, population "
                 f"<code>{escape(board.population_id[:12])}</code></h2>",
                 html_table(table, cell_class=cell_class, class_columns=families),
                 "<ul class=\"note\">" + "".join(f"<li>{escape(line)}</li>"
                                                  for line in board_notes(board)) + "</ul>"]
    colours = legend(("v-detected", "detected / localized above chance"),
                     ("v-not-detected", "not detected (missed with power)"),
                     ("v-inconclusive", "inconclusive / within chance"))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<title>counteraudit leaderboard</title>"
            f"<style>{PAGE_STYLE}</style></head><body>"
            "<h1>counteraudit leaderboard</h1>"
            f"<p class=\"note\">{escape(RANKING)}</p>{colours}{''.join(body)}</body></html>\n")
