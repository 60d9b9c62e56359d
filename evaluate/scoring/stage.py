"""The score stage: from stored visualizations to score tables, one per (distance, method, image set).

Scores are one tidy table per (distance, method, image set):
``runs/<suite>/scores/<distance>/<method>/<image set>.csv`` with columns distance, method, layer,
image_set, model, image, score, numerator, spread, n_references, is_reference, flag. Beside it a
``.json`` holds the keys of the visualizations it came from and the table's SHA-256; a table is
recomputed only when one of them changed, or when the table does not match its digest (set
aside, with its path said). Each visualization goes through the distance's backbone once; every distance
between two visualizations is computed from those cached features.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from counteraudit.anomalies.image_sets import DETECTION, abnormal_set_name, localizable, normal_images, normal_set_name
from counteraudit.evaluate.scoring.detection import NO_LAYER
from counteraudit.evaluate.scoring.distances import build_distance
from counteraudit.evaluate.scoring.scores import SCORE_COLUMNS, anomaly_scores
from counteraudit.explain.stage import (detection_set_for, is_model_level, load_image_sets,
                                        load_results, result_dir)
from counteraudit.explain.store import stored_key
from counteraudit.train.core.artifacts import atomic_write_text, inside_runs, stable_hash
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.stage import (RunOptions, StageItem, StagePlan, executor_config, plan_stage,
                                           resolved_runs_dir, run_stage)
from counteraudit.train.core.suite import Suite
from counteraudit.train.worlds import build_world

SCORES = "scores"
TABLES = "tables"


def only_methods_label(only_methods: list[str] | None,
                       parameters: Mapping[str, tuple[str, dict[str, Any]]] | None = None) -> str | None:
    """How the outputs of a run restricted with ``--method`` are named: "method-<a>+<b>" (the
    methods sorted), with "-<hash>" of the parameters ``--method NAME:key=value`` gave
    (``parameters``: a name -> the option's text and its table), so runs of one method with other
    parameters keep their tables apart; None for a run of the suite's own methods."""
    if not only_methods:
        return None
    label = f"method-{'+'.join(sorted(set(only_methods)))}"
    tables = {name: table for name, (_, table) in (parameters or {}).items()}
    return f"{label}-{stable_hash(tables, length=8)}" if tables else label


def tables_dir(suite: Suite, runs_root=None, only_methods: list[str] | None = None,
               parameters: Mapping[str, tuple[str, dict[str, Any]]] | None = None) -> Path:
    """Where a stage's tables go: <runs>/<suite>/tables/, and for a run restricted with
    ``--method`` its own folder in it, tables/method-<a>+<b>/ (``only_methods_label``): its tables
    hold only those methods' columns, so written over the suite's (which the report and the other
    scripts read) they would replace the whole suite's results, and leave its older tables (the
    outputs-only comparisons) beside tables they no longer match."""
    root = suite.root(runs_root) / TABLES
    label = only_methods_label(only_methods, parameters)
    return root / label if label else root


def score_table_key(suite: Suite, distance_name: str, method: str, image_set: str,
                    models: list[str], runs_root=None) -> tuple[Path, dict[str, Any]]:
    """Where one score table goes and the key its ``.json`` must hold; FileNotFoundError when a
    visualization it needs is missing."""
    root = suite.root(runs_root)
    references = [s.name for s in suite.references]
    needed = list(dict.fromkeys([*references, *models]))
    keys = {m: stored_key(result_dir(root, method, m, image_set)) for m in needed}
    missing = [m for m, k in keys.items() if k is None]
    if missing:
        raise FileNotFoundError(f"no {method} visualizations of {missing} on {image_set}; run "
                                f"python explain/run.py --suite {suite.name} --method {method}")
    table_path = root / SCORES / distance_name / method / f"{image_set}.csv"
    return table_path, {"distance": distance_name, "models": models, "references": references,
                        "visualizations": stable_hash(keys)}


def _table_store(table_path: Path) -> KeyedArtifact:
    """One score table, marked by the ``.json`` of the same name beside it."""
    return KeyedArtifact(payload=table_path.name, marker=table_path.with_suffix(".json").name,
                         digest_field="table_sha256", what="score table",
                         marker_what="score table key")


def _is_scored(table_path: Path, key: dict[str, Any]) -> bool:
    return _table_store(table_path).is_stored(table_path.parent, key)


def read_score_table(table_path: Path) -> pd.DataFrame:
    """A stored score table as ``score_set`` made it (the layer of a method without layers is
    "", ``NO_LAYER``, not NaN)."""
    table = pd.read_csv(inside_runs(table_path, reading=True), keep_default_na=False, na_values=[""],
                        dtype={"layer": str})
    return table.fillna({"layer": NO_LAYER})


def score_set(suite: Suite, distance, method: str, image_set: str,
              models: list[str], runs_root=None) -> pd.DataFrame:
    """Anomaly scores of ``models`` (references are scored leave-one-out) on one image set."""
    distance_name = distance.name
    table_path, key = score_table_key(suite, distance_name, method, image_set, models, runs_root)
    if _is_scored(table_path, key):
        return read_score_table(table_path)
    references = key["references"]
    needed = list(dict.fromkeys([*references, *models]))
    results = load_results(suite, method, needed, image_set, runs_root)
    first = results[references[0]]
    layers = list(first.layers) if first.layers is not None else [NO_LAYER]
    frames = []
    for position, layer in enumerate(layers):
        images = {m: (r.images[position] if r.layers is not None else r.images) for m, r in results.items()}
        features = {m: distance.features(images[m]) for m in needed}  # one backbone pass each
        frames.append(anomaly_scores(features, references, distance, models=needed,
                                     labels={"distance": distance_name, "method": method,
                                             "layer": layer, "image_set": image_set}))
    table = pd.concat(frames, ignore_index=True)
    table = table[table["model"].isin(models)].reset_index(drop=True)
    _table_store(table_path).save(table_path.parent, key,
                                  lambda path: atomic_write_text(path, table.to_csv(index=False)))
    return table


# Distances built in this process, by (name, weights folder): a work item of the score stage
# builds its distance once per process (the driver's own, when it runs the items itself).
_DISTANCES: dict[tuple[str, str | None], Any] = {}


def _distance(name: str, weights_dir: str | None):
    if (name, weights_dir) not in _DISTANCES:
        _DISTANCES[(name, weights_dir)] = build_distance(name, weights_dir=weights_dir)
    return _DISTANCES[(name, weights_dir)]


@dataclass(frozen=True, kw_only=True)
class ScoreItem(StageItem):
    """One score table: a distance (by name: a Slurm job builds it once, from ``weights_dir``),
    a method and an image set, for ``models``."""
    distance: str
    weights_dir: str | None
    method: str
    image_set: str
    models: tuple[str, ...]


def score_one(item: ScoreItem) -> pd.DataFrame:
    """Work item of the score stage: one table (distance, method, image set); picklable, so a
    Slurm job runs it too."""
    return score_set(item.suite, _distance(item.distance, item.weights_dir), item.method,
                     item.image_set, list(item.models), item.runs_dir)


# A score table by what it scores: (method, image set, models).
TableId = tuple[str, str, tuple[str, ...]]


def score_tables(suite: Suite, distance,
                 tables: list[tuple[str, str, list[str]]], runs_root=None,
                 options: RunOptions | None = None) -> list[pd.DataFrame]:
    """``score_set`` of each (method, image set, models) of ``tables``, in order. The missing
    tables are the work items of the "score" stage (``_score_missing``)."""
    distance_name = distance.name
    wanted: list[TableId] = [(method, image_set, tuple(models))
                             for method, image_set, models in tables]
    where = {table: score_table_key(suite, distance_name, table[0], table[1], list(table[2]),
                                    runs_root) for table in wanted}
    plan = plan_stage(wanted, lambda table: _is_scored(*where[table]))
    computed = {}
    if plan.missing:  # scoring runs inside other stages' commands: silent when all are stored
        computed = _score_missing(suite, distance, plan, options or RunOptions(runs_dir=runs_root))
        if computed is None:  # a dry run
            return []
    scored = []
    for table in wanted:
        if table not in plan.missing:  # checked above: read back as made
            scored.append(read_score_table(where[table][0]))
        elif table in computed:
            scored.append(computed[table])  # made just now
        else:  # the same set asked with other models after a computed one: score it here
            scored.append(score_set(suite, distance, table[0], table[1],
                                    list(table[2]), runs_root))
    return scored


def _score_missing(suite: Suite, distance, plan: StagePlan[TableId],
                   options: RunOptions) -> dict[TableId, pd.DataFrame] | None:
    """The missing tables as work items of the "score" stage, one per (method, image set) (the
    first models asked), run by ``slurm.executor.run_items`` with the executor options of
    ``options`` over the suite's [slurm] table: on Slurm one job per table, each building the
    distance (from ``options.weights_dir``) once; locally in this process, one after the other,
    with ``distance``. None on a dry run."""
    distance_name = distance.name
    config = executor_config(suite, options, "score")
    weights_dir = str(Path(options.weights_dir).resolve()) if options.weights_dir else None
    if config.executor == "local":
        # Cheap work on tables already in memory: no worker processes to start and no
        # second distance to build.
        config = config.with_changes(local_jobs=1)
        _DISTANCES[(distance_name, weights_dir)] = distance

    def to_items(missing: list[TableId]) -> list[ScoreItem]:
        first_models: dict[tuple[str, str], tuple[str, ...]] = {}
        for method, image_set, models in missing:
            first_models.setdefault((method, image_set), models)
        return [ScoreItem(suite=suite, runs_dir=resolved_runs_dir(options.runs_dir), distance=distance_name,
                          weights_dir=weights_dir, method=method, image_set=image_set, models=models)
                for (method, image_set), models in first_models.items()]
    outcome = run_stage("score", score_one, plan, config, to_items=to_items,
                        item_name=lambda item: f"{item.method}/{item.image_set}")
    if outcome.dry_run:
        return None
    return {(item.method, item.image_set, item.models): table
            for item, table in zip(outcome.items, outcome.results, strict=True)}


def detection_scores(suite: Suite, distance, methods: list[str],
                     runs_root=None, options: RunOptions | None = None) -> pd.DataFrame:
    """Every model's scores on the detection set, per method (missing tables: ``score_tables``);
    a model-level method's on the ``classes`` set, one score per class (``detection_set_for``)."""
    return pd.concat(score_tables(suite, distance, detection_score_tables(suite, methods),
                                  runs_root, options), ignore_index=True)


def model_level_methods(methods: list[str]) -> list[str]:
    """The model-level methods among ``methods`` (Table 2: "not applicable")."""
    return [method for method in methods if is_model_level(method)]


def localized_methods(methods: list[str]) -> list[str]:
    """The methods localization applies to: all but the model-level ones (feature synthesis
    explains the model, not an input; Table 2 marks it "not applicable")."""
    return [method for method in methods if not is_model_level(method)]


def detection_score_tables(suite: Suite, methods: list[str]) -> list[tuple[str, str, list[str]]]:
    """The score tables (method, image set, models) of Table 1: every model on each method's
    detection set (``detection_set_for``)."""
    models = [s.name for s in suite.models]
    return [(method, detection_set_for(method), models) for method in methods]


def localization_score_tables(suite: Suite, methods: list[str]) -> list[tuple[str, str, list[str]]]:
    """The score tables (method, image set, models) of Table 2 for the localizable ``methods``:
    every model on the detection set, each localizable anomaly on its abnormal set and on its own
    normal folder where it has one."""
    models = [s.name for s in suite.models]
    wanted = [(method, DETECTION, models) for method in methods]
    wanted += [(method, abnormal_set_name(spec), [spec.name])
               for method in methods for spec in localizable(suite)]
    wanted += [(method, normal_set_name(suite, spec), [spec.name]) for method in methods
               for spec in localizable(suite) if normal_set_name(suite, spec) != DETECTION]
    return wanted


def unscored_tables(suite: Suite, distance_name: str, tables: list[tuple[str, str, list[str]]],
                    runs_root=None) -> list[str]:
    """"method/image set" of each of ``tables`` the store does not hold scored (its
    visualizations missing, or the table not computed from the ones stored), checked without
    computing anything."""
    missing = []
    for method, image_set, models in tables:
        try:
            stored = _is_scored(*score_table_key(suite, distance_name, method, image_set, models,
                                                 runs_root))
        except FileNotFoundError:
            stored = False
        if not stored:
            missing.append(f"{method}/{image_set}")
    return list(dict.fromkeys(missing))


def localization_scores(suite: Suite, distance, methods: list[str],
                        runs_root=None, options: RunOptions | None = None) -> pd.DataFrame:
    """For each localizable anomaly: its scores on its abnormal set (abnormal = True) and on its
    normal images (abnormal = False): the detection images that count as normal for it, or its
    own normal folder ([image_sets] <model>-normal). Model-level methods are left out
    (``localized_methods``)."""
    methods = localized_methods(methods)
    if not methods:  # model-level methods only: nothing to localize
        return pd.DataFrame(columns=["distance", "method", "layer", "image_set", *SCORE_COLUMNS,
                                     "abnormal"])
    world = build_world(suite.world, runs_root=runs_root)
    image_sets = load_image_sets(suite, runs_root, world)
    wanted = localization_score_tables(suite, methods)
    scored = {(method, image_set): table for (method, image_set, _), table
              in zip(wanted, score_tables(suite, distance, wanted, runs_root, options))}
    frames = []
    for method in methods:
        for spec in localizable(suite):
            normal_set, normal = normal_images(suite, spec, world, image_sets)
            on_normal = scored[(method, normal_set)]
            rows = on_normal[(on_normal["model"] == spec.name) & on_normal["image"].isin(normal)]
            abnormal = scored[(method, abnormal_set_name(spec))]
            frames += [rows.assign(abnormal=False), abnormal.assign(abnormal=True)]
    return pd.concat(frames, ignore_index=True)
