"""What every stage script shares once its command line is parsed (the options, and one way to show
a user's mistake: command_line.py): how it runs (``RunOptions``), the models it selects, the
executor a stage's work items run on, and the stage skeleton itself.

The skeleton, in two steps (the stage may prepare in between, once it knows what is missing):

    plan = plan_stage(candidates, is_stored, cost=...)  # what is missing, longest first
    outcome = run_stage("name", work, plan, config, to_items=..., item_name=...)

``run_stage`` turns the missing candidates into picklable work items, runs them through
``slurm.executor.run_items`` (locally or on Slurm; "nothing to do" when there are none, the plan
on a dry run) and returns a ``StageOutcome``: the items, their results and how many candidates
were stored before.
"""
from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from counteraudit.slurm.executor import default_local_jobs, executor_config_from, executor_options, run_items
from counteraudit.slurm.stage_run import default_item_name
from counteraudit.train.core.artifacts import SLURM_LOGS, inside_runs
from counteraudit.train.core.runs_folder import bound_to_runs_folder
from counteraudit.train.core.plugin_files import sealed_item
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.core.threads import compute_threads


@dataclass(frozen=True)
class RunOptions:
    """How (not what) a command runs, from its command line: the runs folder, the device, the
    executor's options over the suite's [slurm] table, where LPIPS finds its backbone weights.
    The entry script builds it once (``run_options``) and hands it down; what to compute comes
    from the typed suite (``Suite.with_settings`` takes the command line's overrides of it)."""
    runs_dir: str | None = None
    device: str | None = None
    executor: dict[str, Any] = field(default_factory=dict)  # executor_options(args)
    progress: bool = True
    weights_dir: str | None = None
    download_weights: bool = False

    @property
    def dry_run(self) -> bool:
        return bool(self.executor.get("dry_run", False))


def run_options(args: argparse.Namespace) -> RunOptions:
    """The ``RunOptions`` of a parsed command line: this module adds the common options, the
    executor's module its own (``executor_options``), the scoring scripts the device and the
    distance's weights; an option a script does not take keeps its default."""
    given = vars(args)
    return RunOptions(runs_dir=given.get("runs_dir"), device=given.get("device"),
                      executor=executor_options(args), progress=not given.get("no_progress", False),
                      weights_dir=given.get("weights_dir"),
                      download_weights=bool(given.get("download_weights", False)))


def selected_models(suite: Suite, names: list[str] | None) -> list[ModelSpec]:
    """The models named (--model), or all of the suite's."""
    return [suite.model(n) for n in names] if names else suite.models


def executor_config(suite: Suite, options: RunOptions, stage: str):
    """The stage's executor: command line over the suite's [slurm] table; Slurm logs default to
    <runs>/<suite>/slurm-logs/<stage>/."""
    config = executor_config_from(options.executor, suite.slurm, stage_name=stage)
    if config.local_jobs is None:
        config = config.with_changes(local_jobs=default_local_jobs())
    if config.log_dir is None:  # (a --log-dir given on the command line is used as given)
        config = config.with_changes(log_dir=suite.root(options.runs_dir).resolve() / SLURM_LOGS)
        inside_runs(config.log_dir / stage, options.runs_dir)
    return config


Candidate = TypeVar("Candidate")


@dataclass(frozen=True)
class StagePlan(Generic[Candidate]):
    """What a stage has left to do: the candidates whose artifacts are missing, most expensive
    first, and how many were stored already."""
    missing: list[Candidate] = field(default_factory=list)
    stored: int = 0


@dataclass(frozen=True)
class StageOutcome:
    """A stage's run: its work items, their results in item order ([] on a dry run), and how many
    candidates were stored before it."""
    items: list[Any]
    results: list[Any]
    stored: int
    dry_run: bool

    def total(self, count: str) -> int:
        """The sum of one count over the results (work functions that return counts)."""
        return sum(result[count] for result in self.results)


def longest_first(candidates: Iterable[Candidate],
                  cost: Callable[[Candidate], float] | None = None) -> list[Candidate]:
    """``candidates`` by decreasing ``cost`` (ties keep their order), so local workers end
    together instead of one starting the longest item last; unchanged without ``cost``."""
    candidates = list(candidates)
    return sorted(candidates, key=lambda candidate: -cost(candidate)) if cost else candidates


def plan_stage(candidates: Iterable[Candidate], is_stored: Callable[[Candidate], bool],
               cost: Callable[[Candidate], float] | None = None) -> StagePlan[Candidate]:
    """The candidates whose artifact ``is_stored`` says is missing (longest first by ``cost``),
    and how many are stored."""
    candidates = list(candidates)
    missing = [candidate for candidate in candidates if not is_stored(candidate)]
    return StagePlan(longest_first(missing, cost), len(candidates) - len(missing))


def run_stage(name: str, work: Callable[[Any], Any], plan: StagePlan, config, *,
              to_items: Callable[[list], list] = list,
              item_name: Callable[[Any], str] = default_item_name,
              space_needed: Callable[[list[Any]], int | None] | None = None,
              describe: Callable[[list], str] | None = None) -> StageOutcome:
    """``work`` on the work items ``to_items`` makes of the plan's missing candidates (default:
    the candidates themselves), through the stage's executor ``config``; ``work`` and the items
    must be picklable (a Slurm job unpickles them). ``item_name`` names an item in progress lines
    and failures; ``space_needed(unfinished items)`` estimates the bytes they would store, for a
    full disk's message; on a dry run ``describe(missing candidates)`` (default: how many are
    stored, how many missing) is printed before the executor's plan."""
    if config.dry_run:
        print(describe(plan.missing) if describe is not None else
              f"[dry-run] stage '{name}': {plan.stored} already stored (not run again), "
              f"{len(plan.missing)} missing", flush=True)
    items = to_items(plan.missing)
    results = run_items(bound_to_runs_folder(functools.partial(on_suite_threads, work)), items,
                        config, name, item_name=item_name, space_needed=space_needed)
    return StageOutcome(items, results, plan.stored, config.dry_run)


def on_suite_threads(work: Callable[[Any], Any], item: StageItem) -> Any:
    """``work(item)`` on the item's suite's ``recipe.cpu_threads`` CPU threads, torch's and the
    BLAS and OpenMP pools' (the process's counts restored after), not on as many as the worker,
    the driver or the Slurm allocation has: a model's forward pass gave other logits on 3 threads
    than on 1, 2 or 8, and scikit-learn's PCA and 2-means others on 1 and 2 (train/core/threads.py),
    so an implant figure, a discovery finding or a detector's score would depend on the machine's
    cores and the --jobs given. Training and explanations then set their model's own torch count
    (train/trainer.py, explain/stage.py)."""
    with compute_threads(item.suite.recipe.cpu_threads):
        return work(item)


def resolved_runs_dir(runs_root) -> str | None:
    """The runs folder as a work item carries it: absolute, since a Slurm job or a worker may
    start elsewhere; None: the default."""
    return str(Path(runs_root).resolve()) if runs_root else None


@dataclass(frozen=True, kw_only=True)
class StageItem:
    """What every work item carries: the suite (typed, resolved by the entry script: a worker
    never reads the file again) and the runs folder (absolute: a Slurm job may start elsewhere).
    A stage's items subclass it with their own fields."""
    suite: Suite
    runs_dir: str | None

    def __reduce_ex__(self, protocol):
        # A worker (a fresh interpreter) loads the suite's plug-in files, checked against their
        # digests, before it unpickles the rest of the item, which may hold their classes.
        if self.suite.plugin_files:
            return sealed_item(self, self.suite.plugin_files, protocol)
        return super().__reduce_ex__(protocol)
