"""From stored visualizations to score tables, and the end-to-end run the main job makes.

Scores are one tidy table per (distance, method, image set):
``runs/<suite>/scores/<distance>/<method>/<image set>.csv`` with columns distance, method, layer,
image_set, model, image, score, numerator, spread, n_references, is_reference, flag. Beside it a
``.json`` holds the keys of the visualizations it came from and the table's SHA-256; a table is
recomputed only when one of them changed, or when the table does not match its digest (set
aside, with its path said). Each visualization goes through the distance's backbone once; every distance
between two visualizations is computed from those cached features.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pandas as pd

from counteraudit.anomalies.image_sets import (DEFAULT_LOCALIZATION_IMAGES, DETECTION, abnormal_set_name,
                                               localizable, normal_positions, set_sizes)
from counteraudit.evaluate.scoring.baseline import (BASELINE, delta_table, detection_margin_ratios,
                                                    fraction_intervals, fraction_table,
                                                    localization_versus_baseline, null_rate_table)
from counteraudit.evaluate.scoring.detection import NO_LAYER, NULL_FAMILY, detection_table, null_rates, table1
from counteraudit.evaluate.scoring.distances import build_distance, resolve_distance_name
from counteraudit.evaluate.scoring.localization import localization_table, paper_layout, table2
from counteraudit.evaluate.scoring.scores import anomaly_scores
from counteraudit.explain.stage import (add_chunk_images_arg, explain_suite, explained_images_line,
                                        load_image_sets, load_results, result_dir, suite_methods)
from counteraudit.explain.store import stored_key
from counteraudit.slurm.executor import add_executor_args
from counteraudit.train.core.artifacts import atomic_write_text, stable_hash
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.stage import (StagePlan, add_common_args, executor_config, plan_stage, run_stage,
                                           stage_item)
from counteraudit.train.core.suite import PAPER_REFERENCES, Suite, load_suite
from counteraudit.train.core.suite_schema import MIN_SCORED_REFERENCES, SuiteFileError
from counteraudit.train.train import train_and_check
from counteraudit.train.worlds import build_world

SCORES = "scores"
TABLES = "tables"


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
    table = pd.read_csv(table_path, keep_default_na=False, na_values=[""], dtype={"layer": str})
    return table.fillna({"layer": NO_LAYER})


def score_set(suite: Suite, distance, distance_name: str, method: str, image_set: str,
              models: list[str], runs_root=None) -> pd.DataFrame:
    """Anomaly scores of ``models`` (references are scored leave-one-out) on one image set."""
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


def score_one(item: dict[str, Any]) -> pd.DataFrame:
    """Work item of the score stage: one table (distance, method, image set); picklable, so a
    Slurm job runs it too."""
    return score_set(load_suite(item["suite"]), _distance(item["distance"], item["weights_dir"]),
                     item["distance"], item["method"], item["image_set"], item["models"],
                     item["runs_dir"])


# A score table by what it scores: (method, image set, models).
TableId = tuple[str, str, tuple[str, ...]]


def score_tables(suite: Suite, distance, distance_name: str,
                 tables: list[tuple[str, str, list[str]]], runs_root=None,
                 args: argparse.Namespace | None = None) -> list[pd.DataFrame]:
    """``score_set`` of each (method, image set, models) of ``tables``, in order. The missing
    tables are the work items of the "score" stage (``_score_missing``)."""
    wanted: list[TableId] = [(method, image_set, tuple(models))
                             for method, image_set, models in tables]
    where = {table: score_table_key(suite, distance_name, table[0], table[1], list(table[2]),
                                    runs_root) for table in wanted}
    plan = plan_stage(wanted, lambda table: _is_scored(*where[table]))
    computed = {}
    if plan.missing:  # scoring runs inside other stages' commands: silent when all are stored
        computed = _score_missing(suite, distance, distance_name, plan, runs_root, args)
        if computed is None:  # a dry run
            return []
    scored = []
    for table in wanted:
        if table not in plan.missing:  # checked above: read back as made
            scored.append(read_score_table(where[table][0]))
        elif table in computed:
            scored.append(computed[table])  # made just now
        else:  # the same set asked with other models after a computed one: score it here
            scored.append(score_set(suite, distance, distance_name, table[0], table[1],
                                    list(table[2]), runs_root))
    return scored


def _score_missing(suite: Suite, distance, distance_name: str, plan: StagePlan[TableId], runs_root,
                   args: argparse.Namespace | None) -> dict[TableId, pd.DataFrame] | None:
    """The missing tables as work items of the "score" stage, one per (method, image set) (the
    first models asked), run by ``slurm.executor.run_items`` with the executor options of
    ``args`` over the suite's [slurm] table (``args`` None: the suite's table alone): on Slurm one
    job per table, each building the distance (``args.weights_dir``) once; locally in this
    process, one after the other, with ``distance``. None on a dry run."""
    config = executor_config(suite, args or argparse.Namespace(runs_dir=runs_root), "score")
    weights_dir = getattr(args, "weights_dir", None)
    weights_dir = str(Path(weights_dir).resolve()) if weights_dir else None
    if config.executor == "local":
        # Cheap work on tables already in memory: no worker processes to start and no
        # second distance to build.
        config = config.with_changes(local_jobs=1)
        _DISTANCES[(distance_name, weights_dir)] = distance

    def to_items(missing: list[TableId]) -> list[dict[str, Any]]:
        first_models: dict[tuple[str, str], tuple[str, ...]] = {}
        for method, image_set, models in missing:
            first_models.setdefault((method, image_set), models)
        return [stage_item(suite, runs_root, distance=distance_name, weights_dir=weights_dir,
                           method=method, image_set=image_set, models=list(models))
                for (method, image_set), models in first_models.items()]
    outcome = run_stage("score", score_one, plan, config, to_items=to_items,
                        item_name=lambda item: f"{item['method']}/{item['image_set']}")
    if outcome.dry_run:
        return None
    return {(item["method"], item["image_set"], tuple(item["models"])): table
            for item, table in zip(outcome.items, outcome.results, strict=True)}


def detection_scores(suite: Suite, distance, distance_name: str, methods: list[str],
                     runs_root=None, args: argparse.Namespace | None = None) -> pd.DataFrame:
    """Every model's scores on the detection set, per method (missing tables: ``score_tables``)."""
    models = [s.name for s in suite.models]
    return pd.concat(score_tables(suite, distance, distance_name,
                                  [(method, DETECTION, models) for method in methods], runs_root,
                                  args), ignore_index=True)


def localization_scores(suite: Suite, distance, distance_name: str, methods: list[str],
                        runs_root=None, args: argparse.Namespace | None = None) -> pd.DataFrame:
    """For each localizable anomaly: its scores on its abnormal set (abnormal = True) and on the
    detection images that count as normal for it (abnormal = False)."""
    world = build_world(suite.world, runs_root=runs_root)
    image_sets = load_image_sets(suite, runs_root, world)
    models = [s.name for s in suite.models]
    wanted = [(method, DETECTION, models) for method in methods]
    wanted += [(method, abnormal_set_name(spec), [spec.name])
               for method in methods for spec in localizable(suite)]
    scored = {(method, image_set): table for (method, image_set, _), table
              in zip(wanted, score_tables(suite, distance, distance_name, wanted, runs_root, args))}
    frames = []
    for method in methods:
        detection = scored[(method, DETECTION)]
        for spec in localizable(suite):
            normal = normal_positions(suite, spec, world, image_sets[DETECTION])
            rows = detection[(detection["model"] == spec.name) & detection["image"].isin(normal)]
            abnormal = scored[(method, abnormal_set_name(spec))]
            frames += [rows.assign(abnormal=False), abnormal.assign(abnormal=True)]
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------- the end-to-end run
def pipeline_parser(prog: str, add_help: bool = True) -> argparse.ArgumentParser:
    """The options detect.py, localize.py and report.py share: suite, upstream stages, executor."""
    parser = argparse.ArgumentParser(prog, add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_args(parser)
    add_pipeline_args(parser)
    add_executor_args(parser)
    return parser


def add_pipeline_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--quick", action="store_true",
                        help="run the small 'quick' suite instead (a smoke test in a few minutes)")
    parser.add_argument("--distance", default=None,
                        help="lpips-alex (the paper's; default when its backbone weights are "
                             "available), lpips-vgg, lpips-squeeze; weight-free: l2 (the default "
                             "offline, said in every table), ssim")
    parser.add_argument("--weights-dir", default=None,
                        help="folder holding torchvision's ImageNet backbone weights for LPIPS "
                             "(e.g. alexnet-owt-7be5be79.pth); also searched: $TORCH_HOME/hub/checkpoints")
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="only this explanation method (repeatable)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    add_chunk_images_arg(parser)  # the explain stage's work items
    return parser


def prepare(args: argparse.Namespace) -> tuple[Suite, list[str], Any, str, str | None]:
    """Everything upstream of scoring that is missing: world, training, implant checks,
    image sets, visualizations. Returns (suite, methods, distance, its name, fallback note);
    the distance is built first, so missing LPIPS weights fail before any work."""
    if args.quick and args.suite not in ("demo", "quick"):
        raise ValueError(f"--quick runs the 'quick' suite; drop --suite {args.suite} or --quick")
    suite = load_suite("quick" if args.quick else args.suite)
    check_scorable(suite)
    distance_name, note = resolve_distance_name(args.distance, weights_dir=args.weights_dir)
    distance = build_distance(distance_name, weights_dir=args.weights_dir)
    methods = suite_methods(suite, args.method)
    started = time.perf_counter()
    _stage(f"1/3 training {len(suite.models)} models of suite {suite.name!r} (skips trained ones)")
    train_and_check(suite, suite.models, args)
    print(f"training and implant checks: {time.perf_counter() - started:.0f}s")
    _stage(f"2/3 explaining with {', '.join(methods)}")
    started = time.perf_counter()
    counts = explain_suite(suite, args, methods=methods)
    print(f"{counts['computed']} visualization set(s) computed, {counts['stored']} already stored, "
          f"in {time.perf_counter() - started:.0f}s; {explained_images_line(counts)}")
    _stage(f"3/3 scoring with {distance_name}" + (f" ({note})" if note else ""))
    return suite, methods, distance, distance_name, note


def check_scorable(suite: Suite) -> None:
    """Fail before training when the score stage could not use the suite's references."""
    if len(suite.references) < MIN_SCORED_REFERENCES:
        raise SuiteFileError(
            f"suite file {suite.path}: [references] count = {len(suite.references)} is too few to "
            f"score: each reference is scored against the others with it left out, so at least "
            f"{MIN_SCORED_REFERENCES} are needed; set count = {MIN_SCORED_REFERENCES} or more (the "
            "paper: 12, the demo: 5). Nothing was run.")


def _stage(text: str) -> None:
    print(f"\n== {text}", flush=True)


def detection_tables(suite: Suite, scores: pd.DataFrame, distance_name: str) -> dict[str, pd.DataFrame]:
    """Table 1 (families in registry order, stark first), the per-model detection table and the
    per-layer rows of layered methods, keyed by the file names ``write_tables`` gives them."""
    references = [s.name for s in suite.references]
    families, order = suite.table_rows()  # a family, or a row of one (adversarial_linf)
    nulls = [s.name for s in suite.held_out]
    per_model = detection_table(scores, references, families=families, null_models=nulls)
    per_layer = detection_table(scores, references, families=families, per_layer=True,
                                null_models=nulls)
    per_layer = per_layer[per_layer["layer"] != NO_LAYER]
    summary = table1(per_model, family_order=order)
    tables = {}
    if nulls:  # Table 1's last row: how often the rule flags a normal model
        rates = null_rates(per_model, len(references))
        tables[f"detection-null-{distance_name}"] = null_rate_table(rates)
        row = {"family": NULL_FAMILY, "n_models": len(nulls),
               **dict(zip(rates["method"], rates["false_positive_rate"]))}
        summary = pd.concat([summary, pd.DataFrame([row])], ignore_index=True)
    tables = {f"detection-{distance_name}": summary, **tables,
              f"detection-per-model-{distance_name}": per_model,
              f"detection-per-layer-{distance_name}": per_layer,
              f"detection-intervals-{distance_name}": fraction_table(fraction_intervals(per_model),
                                                                     order)}
    if BASELINE in set(per_model["method"]) and len(set(per_model["method"])) > 1:
        tables[f"detection-vs-outputs-{distance_name}"] = detection_margin_ratios(per_model)
    return tables


def localization_tables(scores: pd.DataFrame, distance_name: str) -> dict[str, pd.DataFrame]:
    """Table 2 (Caricatures per layer, then their layer average), the per-model localization table
    (AUROC, bootstrap interval, chance band) and the per-layer rows of layered methods, keyed by the
    file names ``write_tables`` gives them."""
    per_model = localization_table(scores)
    per_layer = localization_table(scores, per_layer=True)
    per_layer = per_layer[per_layer["layer"] != NO_LAYER]
    # the paper's layout: Caricatures one row per layer, their layer average an extra row
    tables = {f"localization-{distance_name}": table2(paper_layout(per_model, per_layer)),
              f"localization-per-model-{distance_name}": per_model,
              f"localization-per-layer-{distance_name}": per_layer}
    if BASELINE in set(scores["method"]) and len(set(scores["method"])) > 1:
        versus = localization_versus_baseline(scores)
        tables[f"localization-vs-outputs-per-model-{distance_name}"] = versus
        tables[f"localization-vs-outputs-{distance_name}"] = delta_table(versus)
    return tables


def describe_distance(distance_name: str, note: str | None) -> str:
    return f"distance: {distance_name}" + (f" -- {note}" if note else "")


def localization_power_note(suite: Suite) -> str | None:
    """Why a suite with fewer references or images than the paper localizes less sharply, or None."""
    references, (_, p) = len(suite.references), set_sizes(suite)
    if references >= PAPER_REFERENCES and p >= DEFAULT_LOCALIZATION_IMAGES:
        return None
    return (f"This suite uses {references} references and p = {p} images per set (the paper: "
            f"{PAPER_REFERENCES} and {DEFAULT_LOCALIZATION_IMAGES}). The anomaly score divides by "
            f"the references' spread on each image, here estimated from "
            f"{references * (references - 1) // 2} pairs: with fewer references that estimate is "
            "noisier, which pulls AUROCs towards 0.5, and with fewer images each AUROC varies more "
            "from one draw of images to the next.")
