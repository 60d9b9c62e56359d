"""t-wise covering arrays of a factor grid (covertable), under a world's feasibility, cached per
world: the subgroups twise evaluates, and the first rows of the nwise selection function."""
from __future__ import annotations

import itertools
from pathlib import Path

from covertable import Controller

from counteraudit.train.core.artifacts import atomic_write_json, read_marker, set_aside, stable_hash
from counteraudit.train.core.payloads import fields_problem, read_json_object


def covering_rows(grid: dict[str, list[str]], t: int, seed: int, feasible=None,
                  groups: list[list[str]] = (), limit: int | None = None):
    """(rows, complete): the first ``limit`` rows (all: None) of ``covering_array``'s array, and
    whether they are all of it. covertable yields rows one at a time, greedily, so a prefix is
    the same rows as the whole array's first ones, and costs far less under constraints (t = 3
    on the synthetic world: about 3 s per class for the first rows, minutes for the long tail
    of rows that each cover a few leftover tuples)."""
    if not 1 <= t <= len(grid):
        raise ValueError(f"twise: t={t} must be between 1 and the number of factors "
                         f"({len(grid)}: {', '.join(grid)})")
    constraints = None
    if feasible is not None:
        def check(names):
            return {"operator": "fn", "requires": list(names),
                    "evaluate": lambda row: feasible({n: row[n] for n in names})}
        groups = [[f for f in group if f in grid] for group in groups] or [list(grid)]
        sets = [list(pair) for group in groups for pair in itertools.combinations(group, 2)]
        sets += [group for group in groups if len(group) > 2]
        constraints = [check(names) for names in sets if len(names) >= 2]
    made = Controller({f: list(v) for f, v in grid.items()}, strength=t, salt=str(seed),
                      constraints=constraints).make_async()
    rows = list(itertools.islice(made, limit)) if limit is not None else list(made)
    complete = limit is None or len(rows) < limit
    return [{f: row[f] for f in grid} for row in rows], complete


def covering_array(grid: dict[str, list[str]], t: int, seed: int, feasible=None,
                   groups: list[list[str]] = ()) -> list[dict[str, str]]:
    """Rows (one value per factor) such that every feasible combination of t values appears in
    at least one; covertable with its hash sorter salted by ``seed`` (deterministic).
    ``feasible`` (conditions -> bool), when given, constrains each of ``groups`` (factors the
    world restricts jointly, ``World.constraint_groups``) and every pair inside a group (pairs
    prune partial rows early); with no groups, every pair of factors. Checking only where the
    world restricts keeps covertable fast: about 10 s for the synthetic world's full grid."""
    return covering_rows(grid, t, seed, feasible, groups)[0]


def _cache_path(world, what: dict) -> Path | None:
    folder = getattr(world, "cache_dir", None)
    key = stable_hash({**what, "world": world.describe() if folder is None else str(folder),
                       "version": getattr(world, "factors_version", 1)}, length=16)
    return Path(folder) / "covering-arrays" / f"{key}.json" if folder else None


def cached_covering_array(world, grid: dict[str, list[str]], t: int, seed: int,
                          limit: int | None = None) -> list[dict[str, str]]:
    """``covering_array`` under the world's feasibility, stored in its cache folder (the same
    array serves every model: building one under constraints takes seconds to minutes); with
    ``limit``, its first ``limit`` rows only (fewer where the array is shorter). The file holds
    the whole array (a list), or a prefix ({"rows": [...], "complete": false}) that a longer
    request replaces."""
    path = _cache_path(world, {"grid": grid, "t": t, "seed": seed})
    stored = read_marker(path, "covering array") if path else None
    if isinstance(stored, list):
        stored = {"rows": stored, "complete": True}
    problem = fields_problem(stored, {"rows": list, "complete": bool}) if stored is not None else None
    if problem is not None:  # another shape than this function writes: set aside, built again
        set_aside(path, problem, "covering array")
        stored = None
    if stored is not None and (stored["complete"] or
                               limit is not None and len(stored["rows"]) >= limit):
        # the file's keys are sorted: each row back in the grid's order
        return [{f: row[f] for f in grid} for row in stored["rows"][:limit]]
    rows, complete = covering_rows(grid, t, seed, world.feasible, world.constraint_groups(),
                                   limit)
    if path:
        atomic_write_json(path, rows if complete else {"rows": rows, "complete": False})
    return rows


def cached_feasible_tuples(world, grid: dict[str, list[str]], t: int, fixed: dict[str, str]) -> int:
    """How many t-tuples of ``grid``'s values the world can produce together with ``fixed``
    (e.g. a class), by asking its feasibility of each (``uncovered`` with no rows); cached."""
    path = _cache_path(world, {"feasible-tuples": grid, "t": t, "fixed": fixed})
    stored = read_json_object(path, "feasible t-tuple count", count=int) if path else None
    if stored is not None:
        return int(stored["count"])
    count = len(uncovered([], grid, t, lambda combo: world.feasible({**combo, **fixed})))
    if path:
        atomic_write_json(path, {"count": count})
    return count


def uncovered(rows: list[dict[str, str]], grid: dict[str, list[str]], t: int,
              feasible=None) -> list[dict[str, str]]:
    """The (feasible) t-tuples of values that no row holds."""
    missing = []
    for names in itertools.combinations(grid, t):
        seen = {tuple(row[n] for n in names) for row in rows}
        for values in itertools.product(*(grid[n] for n in names)):
            if values not in seen:
                combo = dict(zip(names, values))
                if feasible is None or feasible(combo):
                    missing.append(combo)
    return missing
