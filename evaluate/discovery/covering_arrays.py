"""t-wise covering arrays of a factor grid (covertable), under a world's feasibility, cached per
world: the subgroups twise evaluates, and the first rows of the nwise selection function."""
from __future__ import annotations

import itertools
from pathlib import Path

from covertable import Controller

from counteraudit.train.core.artifacts import atomic_write_json, read_marker, stable_hash


def covering_array(grid: dict[str, list[str]], t: int, seed: int, feasible=None,
                   groups: list[list[str]] = ()) -> list[dict[str, str]]:
    """Rows (one value per factor) such that every feasible combination of t values appears in
    at least one; covertable with its hash sorter salted by ``seed`` (deterministic).
    ``feasible`` (conditions -> bool), when given, constrains each of ``groups`` (factors the
    world restricts jointly, ``World.constraint_groups``) and every pair inside a group (pairs
    prune partial rows early); with no groups, every pair of factors. Checking only where the
    world restricts keeps covertable fast: about 10 s for the synthetic world's full grid."""
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
    rows = Controller({f: list(v) for f, v in grid.items()}, strength=t, salt=str(seed),
                      constraints=constraints).make()
    return [{f: row[f] for f in grid} for row in rows]


def cached_covering_array(world, grid: dict[str, list[str]], t: int, seed: int):
    """``covering_array`` under the world's feasibility, stored in its cache folder (the same
    array serves every model: building one under constraints takes seconds to a minute)."""
    folder = getattr(world, "cache_dir", None)
    key = stable_hash({"grid": grid, "t": t, "seed": seed,
                       "world": world.describe() if folder is None else str(folder),
                       "version": getattr(world, "factors_version", 1)}, length=16)
    path = Path(folder) / "covering-arrays" / f"{key}.json" if folder else None
    stored = read_marker(path, "covering array") if path else None
    if stored is not None:
        return stored
    rows = covering_array(grid, t, seed, world.feasible, world.constraint_groups())
    if path:
        atomic_write_json(path, rows)
    return rows


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
