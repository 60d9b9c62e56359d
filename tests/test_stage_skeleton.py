"""The stage skeleton (train/core/stage.py): a stage runs only the items whose artifacts are
missing, most expensive first, a rerun runs none, and a dry run runs none but says what it would
run. The toy stage stores one file per item, as every stage stores its artifacts."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from counteraudit.slurm.executor import ExecutorConfig
from counteraudit.train.core.stage import StageItem, StageOutcome, plan_stage, run_stage
from counteraudit.train.core.suite import load_suite

COSTS = {"small": 1.0, "large": 3.0, "medium": 2.0}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyItem(StageItem):
    name: str
    path: str


def make_artifact(item: ToyItem) -> dict:
    """Work function of the toy stage (module level: picklable, as Slurm needs)."""
    Path(item.path).write_text(json.dumps({"name": item.name}))
    pools = {pool["user_api"]: pool["num_threads"] for pool in threadpool_info()}
    return {"computed": 1, "name": item.name, "threads": torch.get_num_threads(),
            "blas": pools["blas"], "openmp": pools.get("openmp")}


def run_toy_stage(folder: Path, dry_run: bool = False, jobs: int = 1, suite=None) -> StageOutcome:
    suite = suite or load_suite("quick")
    names = list(COSTS)
    plan = plan_stage(names, lambda name: (folder / f"{name}.json").exists(), cost=COSTS.get)
    return run_stage("toy", make_artifact, plan, ExecutorConfig(local_jobs=jobs, dry_run=dry_run),
                     to_items=lambda missing: [ToyItem(suite=suite, runs_dir=None, name=name,
                                                       path=str(folder / f"{name}.json"))
                                               for name in missing],
                     item_name=lambda item: item.name,
                     describe=lambda missing: f"[dry-run] toy: {len(missing)} to make")


def test_a_stage_runs_only_what_is_missing_longest_first(tmp_path):
    (tmp_path / "medium.json").write_text("{}")  # stored by an earlier run
    outcome = run_toy_stage(tmp_path)
    assert [item.name for item in outcome.items] == ["large", "small"]
    assert [result["name"] for result in outcome.results] == ["large", "small"]
    assert outcome.total("computed") == 2 and outcome.stored == 1 and not outcome.dry_run
    assert (tmp_path / "medium.json").read_text() == "{}"  # not computed again
    assert json.loads((tmp_path / "small.json").read_text()) == {"name": "small"}


def test_a_rerun_runs_nothing_and_says_so(tmp_path, capsys):
    run_toy_stage(tmp_path)
    stamps = {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
    capsys.readouterr()
    again = run_toy_stage(tmp_path)
    assert again.items == [] and again.results == [] and again.stored == 3
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()} == stamps
    assert "[toy] nothing to do" in capsys.readouterr().err


def test_a_dry_run_runs_nothing_and_says_what_it_would_run(tmp_path, capsys):
    (tmp_path / "small.json").write_text("{}")
    outcome = run_toy_stage(tmp_path, dry_run=True)
    assert outcome.dry_run and outcome.results == [] and outcome.total("computed") == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["small.json"]
    printed = capsys.readouterr().out
    assert printed.index("[dry-run] toy: 2 to make") < printed.index("would run 2 items locally")
    assert "    large\n    medium\n" in printed  # longest first


@pytest.mark.parametrize(("jobs", "cpu_threads"), [(1, 1), (1, 2), (2, 2)])
def test_every_item_computes_on_its_suites_threads_not_the_machines(tmp_path, jobs, cpu_threads):
    """A model's logits on 3 CPU threads were not those on 1, 2 or 8, and scikit-learn's PCA and
    2-means others on 1 and 2: an item runs torch, BLAS and OpenMP on the suite's
    recipe.cpu_threads whatever the driver, the worker or the Slurm allocation has, and the
    driver's own counts are back afterwards."""
    quick = load_suite("quick")
    suite = dataclasses.replace(quick, recipe=dataclasses.replace(quick.recipe, cpu_threads=cpu_threads))
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with threadpool_limits(limits=3, user_api="blas"):
            outcome = run_toy_stage(tmp_path, jobs=jobs, suite=suite)
            assert torch.get_num_threads() == 3
            assert {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"} == {3}
    finally:
        torch.set_num_threads(before)
    for result in outcome.results:
        assert (result["threads"], result["blas"]) == (cpu_threads, cpu_threads)
        assert result["openmp"] in (None, cpu_threads)
