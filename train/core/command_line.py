"""The command line every stage script shares: its --help's format, the suite selection options
(--suite, --quick, --runs-dir, ...), which suite --quick means, and ``run_cli``, which runs a
script's ``main`` with a user's mistake shown as one message.

Building a parser imports nothing heavy (no torch, no plug-in): ``counteraudit <command> --help``
and ``python <script> --help`` print without loading the pipeline (evaluate/cli.py)."""
from __future__ import annotations

import argparse

from pathlib import Path

from counteraudit.slurm.errors import ExecutorError, disk_usage_near, out_of_space, size_text
from counteraudit.train.core import numerics
from counteraudit.train.core.paths import redacted
from counteraudit.train.core.plugin_files import command_line_plugins
from counteraudit.train.core.runs_folder import runs_dir, runs_folder_bound
from counteraudit.train.core.suite_files import available_suites


class ScriptHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A script's --help: its docstring as written (usage lines included), and each option's
    default, said once: appended as "(default: X)" unless the help text speaks of its default
    itself (many say where it comes from: the suite, the machine) or there is none to say (None,
    a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing_to_say = any(action.default is value for value in (None, False, argparse.SUPPRESS))
        if "default" in text.lower() or nothing_to_say or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


QUICK_SUITE = "quick"


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--suite", default="demo",
                        help=f"suite name ({', '.join(available_suites())}) or path to a .toml "
                             "file; 'demo' is the synthetic world and runs on a laptop CPU")
    parser.add_argument("--quick", action="store_true",
                        help=f"the small {QUICK_SUITE!r} suite instead of the demo (a smoke test "
                             "in a few minutes); same as --suite quick")
    parser.add_argument("--runs-dir", default=None,
                        help="root of all artifacts (default: $COUNTERAUDIT_RUNS or ./runs); "
                             "each suite writes under <runs-dir>/<suite>/")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (for logs and CI)")
    parser.add_argument("--numerics", choices=numerics.MODES, default=None,
                        help="portable: the same bits on every x86-64 CPU (its kernels capped at "
                             "AVX2); native: each library's fastest kernels, results this kind of "
                             f"CPU's own, stored apart (default: ${numerics.ENV_VAR}, else "
                             f"{numerics.DEFAULT_MODE})")
    parser.add_argument("--plugins", action="append", default=None, metavar="FILE.py",
                        help="a Python file of your own plug-ins (methods, anomaly families, "
                             "auditors, tests) to load before the suite is read, for this run and "
                             "its workers (repeatable; explain/README.md)")
    return parser


def suite_name(args: argparse.Namespace) -> str:
    """The suite the command line asks for: --suite, or the quick suite with --quick (which
    conflicts with any other --suite than the default)."""
    if not vars(args).get("quick", False):
        return args.suite
    if args.suite not in ("demo", QUICK_SUITE):
        raise ValueError(f"--quick runs the {QUICK_SUITE!r} suite; drop --suite {args.suite} or "
                         "--quick")
    return QUICK_SUITE


# Errors a user causes (bad names, paths, parameters): shown as one line, not a traceback.
USER_ERRORS = (ValueError, LookupError, FileNotFoundError, ExecutorError)


def run_cli(main, parser: argparse.ArgumentParser, args: argparse.Namespace | None = None):
    """``main(args)`` with a user's mistake shown as one message and exit status 2, a full disk
    as one message saying what to free, and Ctrl-C as one line (``args`` None: parsed from the
    command line by ``parser``). Finished work is stored as it goes, so a rerun continues.
    Every write and artifact read of the command stays in its runs folder (``runs_folder_bound``;
    a runs folder that is a file fails first)."""
    args = parser.parse_args() if args is None else args
    given = vars(args)
    try:
        numerics.configure(given.get("numerics"))  # before any kernel runs
        try:
            numerics.check_in_effect()
        except numerics.NumericsError:
            numerics.restart_in_effect()  # replaces this process; returns if it already did once
            raise
        with runs_folder_bound(given.get("runs_dir")), command_line_plugins(given.get("plugins")):
            if "suite" in given:
                args.suite = suite_name(args)  # --quick: every later step reads the quick suite
            return main(args)
    except USER_ERRORS as error:
        message = error.args[0] if isinstance(error, LookupError) and error.args else error
        parser.exit(2, f"{parser.prog}: error: {redacted(str(message))}\n")
    except OSError as error:
        if out_of_space(error) is None:
            raise
        where = Path(error.filename or runs_dir(given.get("runs_dir")))
        usage = disk_usage_near(where.resolve())
        free_text = (f" ({size_text(usage.free)} free of {size_text(usage.total)} there)"
                     if usage else "")
        parser.exit(1, f"{parser.prog}: error: no space left on the device while writing "
                       f"{redacted(str(where))}{free_text}; free some space (or use another --runs-dir) and run "
                       "the same command again: everything finished so far is stored and is not "
                       "computed again\n")
    except KeyboardInterrupt:
        parser.exit(130, f"\n{parser.prog}: interrupted; run the same command again to continue "
                         "(finished work is stored)\n")
