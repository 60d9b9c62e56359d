"""The training stage: every model of a suite that is not trained yet, as work items."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from counteraudit.slurm.distributed import cleanup_distributed, init_distributed
from counteraudit.train.checkpoint import (CHECKPOINT_EVERY_EPOCHS, CHECKPOINT_NAME, METRICS_NAME, MODELS,
                                           is_trained, link_suite_models, model_dir, read_metrics)
from counteraudit.train.core.artifacts import stable_hash, store_dir
from counteraudit.train.core.published_recipes import provenance
from counteraudit.train.core.registries import FAMILIES
from counteraudit.train.core.stage import (RunOptions, StageItem, executor_config, plan_stage, resolved_runs_dir,
                                          run_stage)
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.cpu_probe import check_cpu_precision
from counteraudit.train.engines import train_models_together
from counteraudit.train.trainer import train_model
from counteraudit.train.training_parts import build_family
from counteraudit.train.worlds import build_world


@dataclass(frozen=True, kw_only=True)
class TrainItem(StageItem):
    """One model to train, or (``models``) a group of models of one recipe whose engine is grouped
    (``model`` is then the first of them); ``emulate_processes``: train_model's (a test of DDP's
    arithmetic)."""
    model: str
    models: tuple[str, ...] = ()
    device: str | None = None
    progress: bool = True
    emulate_processes: int = 1


def train_one(item: TrainItem) -> dict[str, Any]:
    """One work item of the training stage (picklable, so a Slurm job or a worker runs it too).

    In a Slurm job with several tasks (--gpus-per-node N gives N tasks per node, --nodes M), every
    task runs this: they join one process group (NCCL on GPUs, gloo on CPUs; rendezvous from
    submitit's environment) and train the one model with DistributedDataParallel, one GPU each."""
    if item.models:
        return _train_group(item)
    spec = item.suite.model(item.model)
    directory = model_dir(item.runs_dir, spec)
    device = item.device
    joined_here = not (dist.is_available() and dist.is_initialized())
    context = init_distributed()
    try:
        if context.is_distributed and device != "cpu":
            device = context.device  # this task's own GPU (cuda:LOCAL_RANK), or the CPU
        return train_model(spec, directory, device=device, progress=item.progress,
                           runs_root=item.runs_dir, emulate_processes=item.emulate_processes)
    finally:
        if joined_here:  # leave a process group the caller made to the caller
            cleanup_distributed()


def _train_group(item: TrainItem) -> list[dict[str, Any]]:
    """A group's work item: its models trained together (train_models_together), in this one
    process (a grouped network is not split over processes)."""
    processes = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    if processes > 1:
        raise ValueError(f"the grouped engine trains a group in one process, but this job has "
                         f"{processes}; give the training stage one task per job "
                         "(--gpus-per-node 1, --nodes 1)")
    specs = [item.suite.model(name) for name in item.models]
    return train_models_together(specs, [model_dir(item.runs_dir, spec) for spec in specs],
                                 device=item.device, progress=item.progress,
                                 runs_root=item.runs_dir)


def training_items(specs: list[ModelSpec]) -> list[tuple[ModelSpec, ...]]:
    """The training stage's work items: one per model, except models whose recipe's engine is
    grouped, which come in groups of its group_size by world, architecture and recipe (a
    checkpoint alone). In a group, models of one family and
    parameters sit together, so groups tend to step in lockstep (group_trainer.subgroups splits
    the others). Longest first, as ``specs`` come."""
    items: list[tuple[ModelSpec, ...]] = []
    groups: dict[str, list[ModelSpec]] = {}
    for spec in specs:
        if not _in_groups(spec):
            items.append((spec,))
        else:
            signature = stable_hash({"world": spec.world, "architecture": spec.architecture,
                                     "recipe": spec.recipe.identity()})
            groups.setdefault(signature, []).append(spec)
    for members in groups.values():
        members = sorted(members, key=lambda spec: (spec.family, stable_hash(spec.weight_params)))
        size = members[0].recipe.group_size
        items += [tuple(members[start:start + size]) for start in range(0, len(members), size)]
    return items


def _in_groups(spec: ModelSpec) -> bool:
    """Whether the stage puts this model in a group (known before the world is built; the group
    trains a derived model alone all the same: train_models_together)."""
    return spec.recipe.engine == "grouped" and not spec.checkpoint


def models_space_needed(runs_root, count: int, sample: int = 100) -> int | None:
    """About the bytes ``count`` models still to train will store: each the mean size of (up to
    ``sample``) trained models' folders in the store (weights, last checkpoint, metrics); None
    before any model is trained."""
    sizes = []
    for metrics in sorted((store_dir(runs_root) / MODELS).glob(f"*/{METRICS_NAME}"))[:sample]:
        try:
            sizes.append(sum(path.stat().st_size for path in metrics.parent.iterdir() if path.is_file()))
        except OSError:  # being rewritten
            continue
    return round(sum(sizes) / len(sizes) * count) if sizes else None


def training_cost(spec: ModelSpec) -> float:
    """A model's training time relative to a reference's (its family's estimate)."""
    if spec.checkpoint:
        return 0.0  # loaded, not trained
    if spec.is_reference:
        return 1.0
    return FAMILIES.get(spec.family).relative_training_cost(spec.params)


def _recipe_text(recipe) -> str:
    text = (f"SGD, {recipe.epochs} epochs, batch {recipe.batch_size}, lr {recipe.lr:g} "
            f"x{recipe.lr_gamma:g} every {recipe.lr_step_epochs} epochs, momentum "
            f"{recipe.momentum:g}, weight decay {recipe.weight_decay:g}")
    if recipe.lr_warmup_epochs:
        text += f", warmup {recipe.lr_warmup_epochs:g} epochs"
    if recipe.engine == "grouped":
        text += f", grouped engine ({recipe.group_size} models per network)"
    if recipe.resolution_schedule:
        text += ", training crops " + ", then ".join(
            f"{size} px for {epochs} epochs" for epochs, size in recipe.resolution_schedule)
    return text


def _provenance_text(spec: ModelSpec) -> str:
    """"; loaded: <published recipe>" or "; trained here: <the family's recipe>" ("" where the
    family describes none)."""
    trained_here = FAMILIES.get(spec.family).training_recipe(spec.params)
    text = provenance(spec.checkpoint, spec.checkpoint_recipe, trained_here)
    return f"; {text}" if text else ""


def _describe_anomalies(suite: Suite, todo: list[ModelSpec]) -> list[str]:
    """The anomalous models to train under their Table 1 rows, each with its parameters."""
    rows, order = suite.table_rows()
    names = {spec.name for spec in todo}
    lines = []
    for row in order:
        specs = [s for s in suite.anomalies if s.table_row == row and s.name in names]
        if specs:
            lines.append(f"    Table 1 row {row}:")
            lines += [f"      {spec.name}: " + (", ".join(f"{k} {v}" for k, v in spec.params.items())
                                             or "no parameters") + _provenance_text(spec)
                      for spec in specs]
    return [f"  anomalies ({len(names & set(rows))} to train):"] + lines if lines else []


def describe_training(suite: Suite, specs: list[ModelSpec], todo: list[ModelSpec], config,
                      root: Path) -> str:
    """What a dry run of the training stage prints before the jobs: the models, the recipe, how
    each model's training is split over processes, and where its checkpoints go."""
    references = sum(spec.is_reference for spec in todo)
    root_note = (f" (root {suite.world['root']}; not read by a dry run)" if suite.world.get("root")
                 else "")
    lines = [f"[dry-run] training, suite {suite.name!r}: {len(todo)} models to train "
             f"({references} references, {len(todo) - references} anomalies); "
             f"{len(specs) - len(todo)} of the {len(specs)} selected already trained",
             f"  model: {suite.architecture} on the {suite.world.get('name', 'synthetic')} world"
             f"{root_note}",
             f"  recipe: {_recipe_text(suite.recipe)}"]
    base = asdict(suite.recipe)
    own: dict[str, list[str]] = {}
    for spec in todo:
        changed = {k: v for k, v in asdict(spec.recipe).items() if base[k] != v}
        if changed:
            text = ", ".join(f"{k} {v}" for k, v in changed.items())
            own.setdefault(text, []).append(spec.name)
    for text, names in own.items():
        lines.append(f"  own recipe ({text}): {', '.join(names)}")
    lines += _describe_anomalies(suite, todo)
    groups = [item for item in training_items(todo) if _in_groups(item[0])]
    if groups:
        lines.append(f"  grouped engine: {sum(map(len, groups))} models in {len(groups)} grouped "
                     "network(s), one work item each (train/README.md, \"Training many models at "
                     "once\")")
    if config.executor == "slurm":
        processes = config.nodes * config.effective_tasks_per_node
        devices = (f"{config.gpus_per_node} GPU(s) per node" if config.gpus_per_node
                   else "CPUs only")
        batch = suite.recipe.batch_size
        low, high = batch // processes, -(-batch // processes)
        split = (f"; DistributedDataParallel, each process loads and trains on 1/{processes} of "
                 f"every batch (batch {batch}: {low if low == high else f'{low}-{high}'} images)"
                 if processes > 1 else "")
        lines.append(f"  per model: 1 Slurm job of {config.nodes} node(s) x "
                     f"{config.effective_tasks_per_node} task(s) = {processes} process(es), "
                     f"{devices}{split}")
    lines.append(f"  checkpoint every {CHECKPOINT_EVERY_EPOCHS} epoch(s): "
                 f"{root}/models/<key>/{CHECKPOINT_NAME}; a requeued or rerun job resumes "
                 "from it")
    return "\n".join(lines)


def _item_name(item: TrainItem) -> str:
    return f"{item.model} and {len(item.models) - 1} more (grouped)" if item.models else item.model


def train_models(suite: Suite, specs: list[ModelSpec], options: RunOptions) -> list[dict]:
    """Train what is missing, through the local or Slurm executor; returns every model's metrics."""
    config = executor_config(suite, options, "train")
    runs_root = options.runs_dir
    if not config.dry_run:
        link_suite_models(suite, specs, runs_root)  # first: a model folder already there is adopted
    plan = plan_stage(specs, lambda spec: is_trained(model_dir(runs_root, spec)), cost=training_cost)
    if plan.missing and config.executor == "local" and not config.dry_run:
        world = build_world(suite.world, runs_root=runs_root).prepare()  # once, not per worker
        for spec in plan.missing:  # what only the built world tells (a planted slice without val
            if not spec.is_reference:  # images) fails now, before any model trains
                build_family(spec, world)
        # says so, once, where the suite's fixed precision is much slower on this CPU
        check_cpu_precision(suite, runs_root, options.device)
    # one progress bar per model, unless several train at once (their bars would interleave)
    parallel = config.executor == "slurm" or (config.local_jobs or 1) > 1
    progress = options.progress and not parallel

    def to_items(todo: list[ModelSpec]) -> list[TrainItem]:
        return [TrainItem(suite=suite, runs_dir=resolved_runs_dir(runs_root), model=group[0].name,
                          models=tuple(spec.name for spec in group) if len(group) > 1 else (),
                          device=options.device, progress=progress)
                for group in training_items(todo)]
    run_stage("train", train_one, plan, config, to_items=to_items, item_name=_item_name,
              space_needed=lambda unfinished: models_space_needed(
                  runs_root, sum(len(item.models) or 1 for item in unfinished)),
              describe=lambda todo: describe_training(suite, specs, todo, config, store_dir(runs_root)))
    if config.dry_run:
        return []
    # the suite's own names: another suite may have trained (and named) a shared model
    return [{**read_metrics(model_dir(runs_root, spec)), "name": spec.name} for spec in specs]
