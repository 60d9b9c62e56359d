"""What is wrong with a suite's tables beyond their schema: how the world, the recipe, each
[[anomalies]] entry, the image folders and the sizes fit together. Each function returns a list of
problems (one line each, naming the table, the key and the fix); ``load_suite`` raises them all at
once."""
from __future__ import annotations

from typing import Any

from counteraudit.slurm.errors import ExecutorConfigError
from counteraudit.slurm.executor_config import executor_config_from
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.image_folders import ABNORMAL_SUFFIX, DETECTION
from counteraudit.train.core.published_recipes import checkpoint_recipe_problems
from counteraudit.train.core.recipe import resolution_segments, recipe_problems
from counteraudit.train.core.registries import WORLDS
from counteraudit.train.core.registry import UnknownNameError
from counteraudit.train.core.suite_schema import SuiteTable
from counteraudit.train.core.weights import check_external_checkpoint


def world_problems(world: dict[str, Any]) -> list[str]:
    """What is wrong with the [world] table's options, reading no data (an unknown world: the
    registry's error, raised)."""
    world_class = WORLDS.get(world.get("name", "synthetic"))
    return world_class.config_problems({k: v for k, v in world.items() if k != "name"})


def recipe_and_world_problems(table: dict[str, Any]) -> list[str]:
    problems = []
    if isinstance(table.get("recipe", {}), dict):
        problems += recipe_problems(table.get("recipe", {}))
    world = table.get("world", {})
    if isinstance(world, dict) and world.get("name", "synthetic") in WORLDS:
        problems += world_problems(world)
    return problems


def size_problems(settings: SuiteTable, entries: list[dict[str, Any]], sweep_entries: list[dict[str, Any]],
                  side: int | None, val_size: int | None) -> list[str]:
    """Sizes that pass their own bounds but not together (``size_bounds.py``): the suite's models
    in all, each image set in memory at the world's ``side``, and each set against the
    ``val_size`` images it is drawn from (None: unknown until the world is built)."""
    references = settings.references
    models = (references.count + references.held_out + sum(int(entry.get("replicates", 1)) for entry in entries)
              + sum(len(entry["values"]) for entry in sweep_entries))
    problems = [bounds.model_count_problem(models)]
    sizes = {key: getattr(settings.evaluate, key) for key in ("detection_images", "localization_images")}
    folders = settings.image_sets
    for key, count in sizes.items():
        if side is not None:
            problems.append(bounds.image_set_memory_problem(f"[evaluate] {key}", count, side))
    # The detection set is a draw from the val split; an abnormal set, from a family's part of
    # it, never more than the split (it may hold fewer: a planted slice has what the world has).
    pools = {"detection_images": DETECTION not in folders,
             "localization_images": not any(name.endswith(ABNORMAL_SUFFIX) for name in folders)}
    for key in (key for key, drawn in pools.items() if drawn and val_size is not None):
        problems.append(bounds.pool_problem(f"[evaluate] {key}", sizes[key], val_size,
                                            "validation images of the world ([world] num_val)"))
    return [problem for problem in problems if problem]


def held_out_problems(held_out: int, held_out_check: int) -> list[str]:
    """The checking held-out models are some of the held-out ones."""
    if held_out_check <= held_out:
        return []
    return [f"[references] held_out_check = {held_out_check} exceeds held_out = {held_out}: the "
            f"checking models are some of the held-out ones; set held_out_check = {held_out // 2} "
            "(half) or raise held_out"]


def named_problems(names, registry, where: str) -> list[str]:
    """The registry's own message (with the nearest valid name) for each unknown name."""
    problems = []
    for name in names:
        try:
            registry.get(name)
        except UnknownNameError as error:
            problems.append(f"{where}: {error.args[0]}")
    return problems


def entry_problems(entry: dict[str, Any], recipe_table: dict[str, Any] | None,
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
        return named_problems([entry["family"]], families, f"{where} family")
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
        schedule = resolution_segments(entry_recipe.get("resolution_schedule", ()))
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


def slurm_problems(slurm: dict[str, Any]) -> list[str]:
    """The [slurm] table and each [slurm.<stage>] table, checked by the executor's own parser."""
    problems = []
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


def built_problems(tables: dict[str, dict[str, Any]], registry, header: str) -> list[str]:
    """Each ``[header.<name>]`` table against the registry, and the plug-in built from its
    parameters."""
    problems = named_problems(tables, registry, f"[{header}.<name>]")
    for name, params in tables.items():
        if name in registry:
            try:
                registry.get(name)(params)
            except (TypeError, ValueError, LookupError) as error:
                message = error.args[0] if isinstance(error, LookupError) and error.args else error
                problems.append(f"[{header}.{name}] {message}")
    return problems
