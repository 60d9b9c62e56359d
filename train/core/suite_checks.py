"""What is wrong with a suite's tables beyond their schema: how the world, the recipe, each
[[anomalies]] entry, the image folders and the sizes fit together. Each function returns a list of
problems (one line each, naming the table, the key and the fix); ``load_suite`` raises them all at
once."""
from __future__ import annotations

from typing import Any

from counteraudit.slurm.errors import ExecutorConfigError
from counteraudit.slurm.executor_config import executor_config_from
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.image_folders import ABNORMAL_SUFFIX, DETECTION, ImageFolder, abnormal_name, normal_name
from counteraudit.train.core.published_recipes import checkpoint_recipe_problems
from counteraudit.train.core.recipe import _resolution_segments, recipe_problems
from counteraudit.train.core.registries import (
    AUDITORS,
    DISTANCES,
    FAMILIES,
    METHODS,
    NULL_TESTS,
    WORLDS,
)
from counteraudit.train.core.registry import UnknownNameError, nearest
from counteraudit.train.core.suite_schema import (
    MIN_NULL_MODELS,
    EvaluateTable,
)
from counteraudit.train.core.weights import check_external_checkpoint


def _world_problems(world: dict[str, Any]) -> list[str]:
    """What is wrong with the [world] table's options, reading no data (an unknown world: the
    registry's error, raised)."""
    world_class = WORLDS.get(world.get("name", "synthetic"))
    return world_class.config_problems({k: v for k, v in world.items() if k != "name"})


def _recipe_and_world_problems(table: dict[str, Any]) -> list[str]:
    problems = []
    if isinstance(table.get("recipe", {}), dict):
        problems += recipe_problems(table.get("recipe", {}))
    world = table.get("world", {})
    if isinstance(world, dict) and world.get("name", "synthetic") in WORLDS:
        problems += _world_problems(world)
    return problems



def _size_problems(table: dict[str, Any], references: int, entries: list[dict[str, Any]],
                   sweep_entries: list[dict[str, Any]], side: int | None,
                   val_size: int | None) -> list[str]:
    """Sizes that pass their own bounds but not together (``size_bounds.py``): the suite's models
    in all, each image set in memory at the world's ``side``, and each set against the
    ``val_size`` images it is drawn from (None: unknown until the world is built)."""
    models = (references + sum(int(entry.get("replicates", 1)) for entry in entries)
              + sum(len(entry["values"]) for entry in sweep_entries))
    problems = [bounds.model_count_problem(models)]
    evaluate = {**EvaluateTable().model_dump(), **table.get("evaluate", {})}
    folders = table.get("image_sets", {})
    for key in ("detection_images", "localization_images"):
        if side is not None:
            problems.append(bounds.image_set_memory_problem(f"[evaluate] {key}", evaluate[key], side))
    # The detection set is a draw from the val split; an abnormal set, from a family's part of
    # it, never more than the split (it may hold fewer: a planted slice has what the world has).
    pools = {"detection_images": DETECTION not in folders,
             "localization_images": not any(name.endswith(ABNORMAL_SUFFIX) for name in folders)}
    for key in (key for key, drawn in pools.items() if drawn and val_size is not None):
        problems.append(bounds.pool_problem(f"[evaluate] {key}", evaluate[key], val_size,
                                            "validation images of the world ([world] num_val)"))
    return [problem for problem in problems if problem]


def image_folder_problems(suite, side: int | None, class_names: list[str] | None) -> list[str]:
    """What is wrong with the suite's [image_sets] folders (train/core/image_folders.py): a name
    that is no set of the suite, a missing folder, too few images, images of another size than
    the world's ``side``, labels missing where they are read or naming no class."""
    folders = suite.tables.get("image_sets", {})
    if not folders:
        return []
    localizable = [spec for spec in suite.anomalies if FAMILIES.get(spec.family).localizable]
    valid = [DETECTION, *(name for spec in localizable
                          for name in (abnormal_name(spec.name), normal_name(spec.name)))]
    evaluate = {**EvaluateTable().model_dump(), **suite.tables.get("evaluate", {})}
    counts = {name: evaluate["detection_images" if name == DETECTION else "localization_images"]
              for name in valid}
    explain = suite.tables.get("explain", {})
    by_label = sorted(name for name, params in suite.tables.get("methods", {}).items()
                      if params.get("explained_class") == "label"
                      and name in (explain.get("methods") or [name]))
    by_class = [spec.name for spec in localizable if normal_name(spec.name) not in folders
                and _picks_normal_images_by_class(FAMILIES.get(spec.family))]
    problems = []
    for name, path in folders.items():
        what = f"[image_sets] {name}"
        if name not in valid:
            problems.append(f"{what}: no image set of suite {suite.name!r} is named so{nearest(name, valid)}; "
                            f"its sets: {', '.join(valid)}")
            continue
        needs_labels = (f"[methods.{by_label[0]}] explained_class = \"label\" explains each image's "
                        "label" if by_label else
                        f"{', '.join(by_class)} pick(s) its normal images from it by class (or give "
                        f"[image_sets] {normal_name(by_class[0])} = a folder of its normal images)"
                        if name == DETECTION and by_class else None)
        try:
            folder = ImageFolder.read(path, what)
        except ValueError as error:
            problems.append(str(error))
            continue
        problems += folder.problems(what, counts[name], side, needs_labels,
                                    len(class_names) if class_names else None,
                                    "[evaluate] " + ("detection_images" if name == DETECTION
                                                     else "localization_images"))
    return problems


def _picks_normal_images_by_class(family: type) -> bool:
    """Whether a family narrows the normal images to some classes (overrides ``normal_pool``,
    e.g. backdoor: not the target class), so a folder's images need labels to be picked."""
    defining = next(cls for cls in family.__mro__ if "normal_pool" in vars(cls))
    return defining.__mro__[1:] != (object,)  # not the base family's "every image"


def null_problems(held_out: int, held_out_check: int, p_value: str | None,
                  asked_by: str) -> list[str]:
    """What stops the null p-values (``p_value``, asked for by ``asked_by``: a suite key or a
    command-line option) from being computed: an unknown test, or fewer held-out references left
    to fit it than the test needs (``MIN_NULL_MODELS``, or its ``min_nulls``)."""
    problems = []
    if held_out_check > held_out:
        problems.append(f"[references] held_out_check = {held_out_check} exceeds held_out = "
                        f"{held_out}: the checking models are some of the held-out ones; set "
                        f"held_out_check = {held_out // 2} (half) or raise held_out")
    if p_value is None:
        return problems
    named = _named_problems([p_value], NULL_TESTS, f"{asked_by} = {p_value!r}")
    problems += named
    needed = MIN_NULL_MODELS if named else NULL_TESTS.get(p_value).nulls_needed()
    fitting = held_out - held_out_check
    if fitting < needed:
        problems.append(
            f"{asked_by} = {p_value!r} fits each method's null distribution to the held-out "
            f"references and needs at least {needed} of them; [references] held_out = "
            f"{held_out} with held_out_check = {held_out_check} leaves {fitting}: set "
            f"[references] held_out = {needed + held_out_check} or more (40 with "
            "held_out_check = 20 fits on 20 and checks the calibration on the other 20)")
    return problems


def _named_problems(names, registry, where: str) -> list[str]:
    """The registry's own message (with the nearest valid name) for each unknown name."""
    problems = []
    for name in names:
        try:
            registry.get(name)
        except UnknownNameError as error:
            problems.append(f"{where}: {error.args[0]}")
    return problems


def _built_problems(tables: dict[str, dict[str, Any]], registry, header: str) -> list[str]:
    """Each ``[header.<name>]`` table against the registry, and the plug-in built from its
    parameters."""
    problems = _named_problems(tables, registry, f"[{header}.<name>]")
    for name, params in tables.items():
        if name in registry:
            try:
                registry.get(name)(params)
            except (TypeError, ValueError, LookupError) as error:
                message = error.args[0] if isinstance(error, LookupError) and error.args else error
                problems.append(f"[{header}.{name}] {message}")
    return problems


def _unrun_method_problems(run: list[str] | None, tables: dict[str, Any]) -> list[str]:
    """A ``[methods.<name>]`` table for a method the ``[explain] methods`` list leaves out would be
    silently ignored (a user who adds a method's table expects it to run): an error naming the list
    to add it to. Without a list the suite runs every registered method, so every table is used."""
    if run is None:
        return []
    listed = ", ".join(f'"{name}"' for name in run)
    return [f"[methods.{name}] sets parameters of a method the suite does not run: add \"{name}\" "
            f"to [explain] methods = [{listed}] (or remove the table)"
            for name in tables if name not in run]


def _plugin_problems(tables: dict[str, Any]) -> list[str]:
    """The tables of plug-ins (explanation methods, auditors, the executor) checked against their
    registries and built, so a typo fails before training rather than after it."""
    explain, discover = tables.get("explain", {}), tables.get("discover", {})
    # A registry imports its plug-ins (and their libraries: seconds) on its first lookup, so only
    # a suite that names a method or an auditor pays for it.
    problems = _named_problems(explain.get("methods") or [], METHODS, "[explain] methods")
    problems += _named_problems(explain.get("batch_sizes", {}), METHODS, "[explain] batch_sizes")
    problems += _built_problems(tables.get("methods", {}), METHODS, "methods")
    problems += _unrun_method_problems(explain.get("methods"), tables.get("methods", {}))
    problems += _named_problems(discover.get("auditors") or [], AUDITORS, "[discover] auditors")
    problems += _named_problems(discover.get("budget", {}), AUDITORS, "[discover] budget")
    problems += _built_problems(tables.get("auditors", {}), AUDITORS, "auditors")
    distance = tables.get("evaluate", {}).get("distance")
    problems += _named_problems([distance] if distance else [], DISTANCES, "[evaluate] distance")
    slurm = tables.get("slurm", {})
    if "log_dir" in slurm or any(isinstance(v, dict) and "log_dir" in v for v in slurm.values()):
        problems.append("[slurm] log_dir: a suite file cannot choose where logs are written (they "
                        "go under the runs folder); remove it, and give --log-dir on the command "
                        "line if you want them elsewhere")
    for stage in [None, *(k for k, v in slurm.items() if isinstance(v, dict) and k != "slurm_extra")]:
        try:
            executor_config_from(None, slurm, stage_name=stage)
        except (ExecutorConfigError, TypeError, ValueError) as error:
            problems.append(f"[slurm{'.' + stage if stage else ''}] {error}")
    return problems


def _entry_problems(entry: dict[str, Any], recipe_table: dict[str, Any] | None,
                    world_side: int | None, where: str, families,
                    world_facts: tuple[str, list[str] | None] = ("synthetic", None),
                    suite_facts: tuple[str, list[int]] | None = None) -> list[str]:
    """What is wrong with one [[anomalies]] entry: its family's parameters, its recipe (None: the
    suite's is wrong, said already), whether its cue fits the images and training crops and its
    parameters the world (``world_facts``: its name and class names, None where unknown) and the
    suite (``suite_facts``: its architecture and its references' seeds), and its
    external checkpoint (its output count too, where the class names are known) and that
    checkpoint's declared recipe."""
    if entry["family"] not in families:
        return _named_problems([entry["family"]], families, f"{where} family")
    family = families.get(entry["family"])
    entry_recipe = {**(recipe_table or {}), **entry.get("recipe", {})}
    problems = (recipe_problems(entry_recipe, f"{where} recipe")
                if recipe_table is not None and entry.get("recipe") else [])
    try:
        params = family.validate_params(dict(entry.get("params", {})))
    except (TypeError, ValueError) as error:
        return problems + [f"{where} params: {error}"]
    # a trigger or watermark that does not fit the images or a training crop fails now
    if world_side is not None and recipe_table is not None and not problems:
        schedule = _resolution_segments(entry_recipe.get("resolution_schedule", ()))
        for side in sorted({world_side, *(size for _, size in schedule)}):
            try:
                family.check_image_size(params, side, side)
            except ValueError as error:
                problems.append(f"{where}: {error}")
    world_name, class_names = world_facts
    try:
        family.check_world(params, world_name, class_names)
    except ValueError as error:
        problems.append(f"{where} params: {error}")
    if suite_facts is not None:
        try:
            family.check_suite(params, *suite_facts)
        except ValueError as error:
            problems.append(f"{where} params: {error}")
    if entry.get("checkpoint") is not None:
        outputs = family.output_count(params, len(class_names)) if class_names else None
        try:
            check_external_checkpoint(entry["checkpoint"], outputs)
        except (OSError, ValueError) as error:
            problems.append(f"{where} checkpoint: {error}")
    problems += checkpoint_recipe_problems(entry.get("checkpoint_recipe"), entry.get("checkpoint"),
                                           entry["family"], params, where)
    return problems
