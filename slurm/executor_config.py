"""How a stage's work items are run: locally or on Slurm, and with which resources.

Values come from three places, later ones winning:
  1. defaults (below),
  2. the suite file's [slurm] table, and its per-stage sub-table ([slurm.train], ...),
  3. the command line (add_executor_args).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from counteraudit.slurm.errors import ExecutorConfigError
from counteraudit.slurm.sbatch_options import FEATURES, NAME, NAMES, SLURM_EXTRA_OPTIONS, option_name, option_problem

EXECUTORS = ("local", "slurm")
DEFAULT_LOG_DIR = Path("runs") / "slurm-logs"


@dataclass(frozen=True)
class ExecutorConfig:
    executor: str = "local"  # "local": in this process, in order; "slurm": a submitit job array
    partition: str | None = None  # None: the cluster's default partition
    gpus_per_node: int = 0
    nodes: int = 1
    # One process per GPU is the usual DDP layout, so None means max(1, gpus_per_node).
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    time_minutes: int = 60
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    # Any other sbatch option, e.g. {"reservation": "ours", "exclusive": True}.
    slurm_extra: dict[str, str | bool] = field(default_factory=dict)
    array_parallelism: int = 64  # at most this many array tasks run at once
    # Local executor: items run in this many processes at once, the CPU threads split between
    # them (small models train faster side by side, one thread each, than one after another on
    # all cores). None: one at a time in this process; the stage scripts pick one per core.
    local_jobs: int | None = None
    # submitit requeues a checkpointable job that hits its time limit at most this many times
    # (preemptions are always requeued).
    max_timeout_requeues: int = 3
    dry_run: bool = False
    # submitit's files go to <log_dir>/<stage>/; None: runs/slurm-logs, or whatever the stage
    # runner picks (e.g. the suite's artifact root) with config.with_changes(log_dir=...).
    log_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ExecutorConfigError(
                f"executor {self.executor!r} is unknown; use one of: {', '.join(EXECUTORS)} (--executor)"
            )
        for name, (least, most) in _WHOLE_NUMBER_RANGES.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                raise ExecutorConfigError(f"{name} ({_flag(name)}) must be a whole number from {least} to {most}, "
                                          f"got {value!r}")
        if self.mem_gb is not None and (
            isinstance(self.mem_gb, bool) or not isinstance(self.mem_gb, (int, float))
            or not MEM_GB_RANGE[0] <= self.mem_gb <= MEM_GB_RANGE[1]  # False for nan too
        ):
            raise ExecutorConfigError(f"mem_gb (--mem-gb) must be a number of GB from {MEM_GB_RANGE[0]} to "
                                      f"{MEM_GB_RANGE[1]} (1 MB to 1 PB per node), got {self.mem_gb!r}")
        for name, (kind, where_listed) in _NAMED_OPTIONS.items():
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or kind.problem(value) is not None):
                raise ExecutorConfigError(f"{name} ({_flag(name)}) must be {kind.what}, got {value!r}; "
                                          f"write it {where_listed}")
        object.__setattr__(self, "slurm_extra", _checked_slurm_extra(self.slurm_extra))
        if self.log_dir is not None:
            object.__setattr__(self, "log_dir", Path(self.log_dir))
            if self.executor == "slurm":
                _check_path_text(self.log_dir, "log_dir (--log-dir)")

    @property
    def effective_tasks_per_node(self) -> int:
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return max(1, self.gpus_per_node)

    def stage_log_folder(self, stage_name: str) -> Path:
        """Absolute folder of one stage's Slurm scripts, pickles and logs (shared with the nodes)."""
        folder = ((self.log_dir or DEFAULT_LOG_DIR) / stage_name).resolve()
        _check_path_text(folder, "the Slurm log folder (--log-dir, or the runs folder it is under)")
        return folder

    def with_changes(self, **changes: Any) -> ExecutorConfig:
        return replace(self, **changes)


# The least and the most each whole-number key may ask: Slurm keeps per-node task and CPU counts
# in 16 bits, MaxArraySize is at most 4000001, and a time limit beyond a year, more GPUs than
# a node holds or more local processes than a machine runs is a typo, not a request.
_WHOLE_NUMBER_RANGES = {
    "gpus_per_node": (0, 1024),
    "nodes": (1, 100_000),
    "tasks_per_node": (1, 65_533),
    "cpus_per_task": (1, 65_533),
    "time_minutes": (1, 525_600),
    "array_parallelism": (1, 4_000_000),
    "local_jobs": (1, 4096),
    "max_timeout_requeues": (0, 1000),
}
# 0.001 GB is sbatch's 1 MB (less would be written as --mem=0, which asks for a whole node).
MEM_GB_RANGE = (0.001, 1_048_576)
# The cluster's names, each checked against what sbatch accepts for it, and where to look one up.
_NAMED_OPTIONS = {
    "partition": (NAMES, "as `sinfo -s` lists it"),
    "account": (NAME, "as `sacctmgr show associations user=$USER` lists it"),
    "qos": (NAME, "as `sacctmgr show qos` lists it"),
    "constraint": (FEATURES, "with the features `sinfo -o %f` lists"),
}


def _checked_slurm_extra(extra: Any) -> dict[str, Any]:
    """slurm_extra with its keys as sbatch spells them ('mail_type' -> 'mail-type'); raises
    unless each key is an option sbatch_options.SLURM_EXTRA_OPTIONS lists and each value one it
    takes."""
    if not isinstance(extra, Mapping):
        raise ExecutorConfigError(f"slurm_extra must be a table of sbatch options (key = value), got {extra!r}")
    checked = {}
    for key, value in extra.items():
        problem = option_problem(key)
        if problem is not None:
            raise ExecutorConfigError(f"slurm_extra (--slurm-extra) key {key!r}: {problem}")
        name = option_name(key)
        problem = SLURM_EXTRA_OPTIONS[name].problem(value)
        if problem is not None:
            raise ExecutorConfigError(f"slurm_extra (--slurm-extra) {name} must be {problem}, got {value!r}")
        checked[name] = value
    return checked


def _check_path_text(path: Path, what: str) -> None:
    """A path goes into the sbatch script too (--output, --error): no line break or other control
    character may end its line."""
    if any(ord(character) < 32 or ord(character) == 127 for character in str(path)):
        raise ExecutorConfigError(f"{what} must be a path without line breaks or other control characters, "
                                  f"got {str(path)!r}")


def _flag(field_name: str) -> str:
    if field_name == "local_jobs":
        return "--jobs"
    return "--time" if field_name == "time_minutes" else "--" + field_name.replace("_", "-")


# Suite-file keys are the field names, except that time is given in minutes as `time`.
_SUITE_KEY_TO_FIELD = {f.name: f.name for f in fields(ExecutorConfig) if f.name != "dry_run"}
_SUITE_KEY_TO_FIELD["time"] = _SUITE_KEY_TO_FIELD.pop("time_minutes")


def _parse_sbatch_option(text: str) -> tuple[str, str | bool]:
    """'reservation=ours' -> ('reservation', 'ours'); a bare 'exclusive' is a flag."""
    key, has_value, value = text.partition("=")
    key = key.strip().lstrip("-")
    if not key:
        raise argparse.ArgumentTypeError(
            f"--slurm-extra {text!r} has no option name; write it as key=value, e.g. --slurm-extra reservation=ours"
        )
    return (key, value.strip()) if has_value else (key, True)


def add_executor_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the executor options. Their defaults are None so that executor_config_from can tell
    an option given on the command line (which wins) from one left to the suite file."""
    group = parser.add_argument_group("execution (local or on Slurm)")
    group.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=None,
        help="local: run the items in this process; slurm: submit a job array (default: local)",
    )
    group.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's default)")
    group.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: 0)")
    group.add_argument("--nodes", type=int, default=None, help="nodes per item (default: 1)")
    group.add_argument(
        "--tasks-per-node", type=int, default=None, help="processes per node; default: one per GPU, at least 1"
    )
    group.add_argument("--cpus-per-task", type=int, default=None, help="CPUs per process")
    group.add_argument("--mem-gb", type=float, default=None, help="memory per node in GB")
    group.add_argument(
        "--time", type=int, default=None, dest="time_minutes", help="time limit per job in minutes (default: 60)"
    )
    group.add_argument("--account", default=None, help="Slurm account to charge")
    group.add_argument("--qos", default=None, help="Slurm quality of service")
    group.add_argument("--constraint", default=None, help="Slurm node features, e.g. 'a100|h100'")
    group.add_argument(
        "--slurm-extra",
        action="append",
        type=_parse_sbatch_option,
        default=None,
        metavar="KEY=VALUE",
        help="any other sbatch option, repeatable (e.g. reservation=ours)",
    )
    group.add_argument(
        "--array-parallelism", type=int, default=None, help="at most this many items run at once (default: 64)"
    )
    group.add_argument(
        "--jobs", type=int, default=None, dest="local_jobs",
        help="local executor: items run at once in separate processes (stage scripts default to one "
        "per CPU core without a GPU, else 1); results do not depend on it",
    )
    group.add_argument(
        "--max-timeout-requeues",
        type=int,
        default=None,
        help="requeues allowed after hitting the time limit (default: 3)",
    )
    group.add_argument(
        "--dry-run", action="store_true", default=None, help="print what would run or be submitted, and do nothing"
    )
    group.add_argument(
        "--log-dir", type=Path, default=None, help=f"Slurm logs go to LOG_DIR/<stage>/ (default: {DEFAULT_LOG_DIR})"
    )
    return parser


def _values_from_suite_table(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    values = {}
    for key, value in table.items():
        if key not in _SUITE_KEY_TO_FIELD:
            raise ExecutorConfigError(
                f"{where} has unknown key {key!r}; valid keys: {', '.join(sorted(_SUITE_KEY_TO_FIELD))} "
                "(sub-tables named after a stage, e.g. [slurm.train], override them for that stage)"
            )
        if key == "slurm_extra" and not isinstance(value, Mapping):
            raise ExecutorConfigError(f"{where}: slurm_extra must be a table of sbatch options (key = value), "
                                      f"e.g. slurm_extra = {{ reservation = \"ours\" }}; got {value!r}")
        values[_SUITE_KEY_TO_FIELD[key]] = value
    return values


def executor_options(args: argparse.Namespace) -> dict[str, Any]:
    """The executor options given on the command line (those ``add_executor_args`` added and the
    user set), for an entry script to pass down as plain values: the namespace stays there."""
    known_fields = {f.name for f in fields(ExecutorConfig)}
    return {name: value for name, value in vars(args).items() if name in known_fields and value is not None}


def executor_config_from(
    overrides: Mapping[str, Any] | None,
    suite_table: Mapping[str, Any] | None = None,
    stage_name: str | None = None,
) -> ExecutorConfig:
    """The executor config for a stage: the command line's options (``executor_options``) over
    the suite's [slurm] table.

    suite_table is the suite file's [slurm] table; a sub-table named after a stage (e.g.
    [slurm.train] with gpus_per_node = 1) applies to that stage only, over the general keys.
    """
    suite_table = dict(suite_table or {})
    stage_tables = {
        key: value for key, value in suite_table.items() if isinstance(value, Mapping) and key != "slurm_extra"
    }
    values = _values_from_suite_table(
        {key: value for key, value in suite_table.items() if key not in stage_tables}, "the suite's [slurm] table"
    )
    for name in stage_tables:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ExecutorConfigError(
                f"the suite's [slurm] table has a sub-table {name!r}: a sub-table is named after a stage "
                "(letters, digits, '_', '-', '.'), e.g. [slurm.train]"
            )
    values_by_stage = {
        name: _values_from_suite_table(table, f"the suite's [slurm.{name}] table")
        for name, table in stage_tables.items()
    }
    if stage_name is not None and stage_name in values_by_stage:
        stage_values = values_by_stage[stage_name]
        extra = {**values.get("slurm_extra", {}), **stage_values.pop("slurm_extra", {})}
        values.update(stage_values)
        if extra:
            values["slurm_extra"] = extra

    if overrides is not None:
        known_fields = {f.name for f in fields(ExecutorConfig)}
        for name, value in overrides.items():
            if name not in known_fields or value is None:
                continue
            if name == "slurm_extra":
                value = {**values.get("slurm_extra", {}), **dict(value)}
            values[name] = value

    if isinstance(values.get("log_dir"), str):
        values["log_dir"] = Path(values["log_dir"])
    if isinstance(values.get("mem_gb"), int):
        values["mem_gb"] = float(values["mem_gb"])
    return ExecutorConfig(**values)
