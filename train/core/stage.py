"""What every stage script shares: the suite and model selection arguments, one way to show a
user's mistake, and the executor a stage's work items run on."""
from __future__ import annotations

import argparse
from pathlib import Path

from counteraudit.slurm.errors import ExecutorError, disk_usage_near, out_of_space, size_text
from counteraudit.slurm.executor import default_local_jobs, executor_config_from
from counteraudit.train.core.artifacts import runs_dir
from counteraudit.train.core.suite import ModelSpec, Suite, available_suites, load_suite


class ScriptHelpFormatter(argparse.RawDescriptionHelpFormatter,
                          argparse.ArgumentDefaultsHelpFormatter):
    """A script's --help: its docstring as written (usage lines included), and each option's
    default."""


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--suite", default="demo",
                        help=f"suite name ({', '.join(available_suites())}) or path to a .toml "
                             "file; 'demo' is the synthetic world and runs on a laptop CPU")
    parser.add_argument("--runs-dir", default=None,
                        help="root of all artifacts (default: $COUNTERAUDIT_RUNS or ./runs); "
                             "each suite writes under <runs-dir>/<suite>/")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (for logs and CI)")
    return parser


# Errors a user causes (bad names, paths, parameters): shown as one line, not a traceback.
USER_ERRORS = (ValueError, LookupError, FileNotFoundError, ExecutorError)


def run_cli(main, parser: argparse.ArgumentParser, args: argparse.Namespace | None = None):
    """``main(args)`` with a user's mistake shown as one message and exit status 2, a full disk
    as one message saying what to free, and Ctrl-C as one line (``args`` None: parsed from the
    command line by ``parser``). Finished work is stored as it goes, so a rerun continues."""
    args = parser.parse_args() if args is None else args
    try:
        runs_dir(getattr(args, "runs_dir", None))  # a runs folder that is a file fails first
        return main(args)
    except USER_ERRORS as error:
        message = error.args[0] if isinstance(error, LookupError) and error.args else error
        parser.exit(2, f"{parser.prog}: error: {message}\n")
    except OSError as error:
        if out_of_space(error) is None:
            raise
        where = Path(error.filename or runs_dir(getattr(args, "runs_dir", None)))
        usage = disk_usage_near(where.resolve())
        free_text = (f" ({size_text(usage.free)} free of {size_text(usage.total)} there)"
                     if usage else "")
        parser.exit(1, f"{parser.prog}: error: no space left on the device while writing "
                       f"{where}{free_text}; free some space (or use another --runs-dir) and run "
                       "the same command again: everything finished so far is stored and is not "
                       "computed again\n")
    except KeyboardInterrupt:
        parser.exit(130, f"\n{parser.prog}: interrupted; run the same command again to continue "
                         "(finished work is stored)\n")


def select_models(args: argparse.Namespace) -> tuple[Suite, list[ModelSpec]]:
    suite = load_suite(args.suite)
    names = getattr(args, "model", None)
    specs = [suite.model(n) for n in names] if names else suite.models
    return suite, specs


def executor_config(suite: Suite, args: argparse.Namespace, stage: str):
    """The stage's executor: command line over the suite's [slurm] table; Slurm logs default to
    <runs>/<suite>/slurm-logs/<stage>/."""
    config = executor_config_from(args, suite.tables.get("slurm"), stage_name=stage)
    if config.local_jobs is None:
        config = config.with_changes(local_jobs=default_local_jobs())
    if config.log_dir is None:
        config = config.with_changes(log_dir=suite.root(args.runs_dir).resolve() / "slurm-logs")
    return config
