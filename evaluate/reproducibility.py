"""Check a finished run against the digests the project publishes: the same bits on every machine.

    counteraudit reproducibility check --quick         # against train/suites/quick.digests.json
    counteraudit reproducibility check --suite demo    # against train/suites/demo.digests.json
    counteraudit reproducibility check --suite replicated  # a run of 4 methods: the file names them
    counteraudit reproducibility write --suite mine --digests mine.digests.json

A digest file holds the SHA-256 of every model's weights, the world's cached images and the
suite's per-model Tables 1 and 2 and per-model verdicts (the files a verdict rests on), with the
machine and numeric mode that made them, the methods when the run had --method, and each model's
key. ``check`` compares a run with it and names each file that differs, with both digests and this
machine's instruction set: in portable numerics (the default) a mismatch is a bug or a change of
the code, never the CPU (train/README.md, "Portable numerics"). A model whose key differs is named
first: the store holds it as another model, and what is drawn from its key (Caricatures' per-model
noise) is drawn again, so its tables may differ with the same weights. CI checks the quick suite's
on whatever CPU runs it, and the tests check that every shipped file's keys are this code's.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counteraudit.train.core.command_line import ScriptHelpFormatter, add_common_args, run_cli

if TYPE_CHECKING:
    from counteraudit.train.core.suite import Suite


DIGESTS_VERSION = 1
PER_MODEL_TABLES = ("detection-per-model", "localization-per-model", "detection-verdicts-per-model")


def run_files(suite: Suite, runs_root: str | Path | None,
              only_methods: list[str] | None = None) -> dict[str, Path]:
    """The files a suite's digests cover, by the name the digest file gives them (the tables of
    a run of ``only_methods``: its --method, when it ran some of the suite's methods)."""
    from counteraudit.evaluate.scoring.stage import tables_dir
    from counteraudit.train.checkpoint import model_dir
    from counteraudit.train.worlds import build_world

    files = {f"weights/{spec.name}": model_dir(runs_root, spec) / "weights.pth" for spec in suite.models}
    world_folder = getattr(build_world(suite.world, runs_root=runs_root), "cache_dir", None)
    if world_folder is not None:
        files.update({f"world/{path.name}": path for path in sorted(Path(world_folder).glob("*.npz"))})
    tables = tables_dir(suite, runs_root, only_methods)
    distance = suite.evaluate.distance
    for name in PER_MODEL_TABLES:  # every distance the run scored with, at least the suite's own
        paths = {tables / f"{name}-{distance}.csv", *tables.glob(f"{name}-*.csv")}
        files.update({f"tables/{path.name}": path for path in sorted(paths)})
    return files


def measure(suite: Suite, runs_root: str | Path | None,
            only_methods: list[str] | None = None) -> dict[str, Any]:
    """The digests of the run's files that exist; every model must be trained (a table that is
    not there yet is left out, and ``check`` names it if the digest file expects it)."""
    from counteraudit.train.core import numerics
    from counteraudit.train.core.artifacts import file_sha256, runs_dir

    files = run_files(suite, runs_root, only_methods)
    untrained = [name for name, path in files.items() if name.startswith("weights/") and not path.is_file()]
    if untrained:
        raise FileNotFoundError(f"the {suite.name} suite's run in {runs_dir(runs_root)} lacks "
                                f"{', '.join(untrained)}; finish it first: python evaluate/localize.py "
                                f"--suite {suite.name} --runs-dir {runs_dir(runs_root)} (it trains, "
                                "explains and writes Tables 1 and 2)")
    facts = numerics.record()
    return {"version": DIGESTS_VERSION, "suite": suite.name,
            **({"methods": list(only_methods)} if only_methods else {}),
            "made_on": {name: facts[name] for name in ("mode", "cpu", "instruction_set", "torch", "numpy")},
            "model_keys": model_keys(suite),
            "sha256": {name: file_sha256(path) for name, path in files.items() if path.is_file()}}


def model_keys(suite: Suite) -> dict[str, str]:
    """Each model's key (its store folder, and the seed of what is drawn per model), by name."""
    return {spec.name: spec.key for spec in suite.models}


def key_differences(expected: dict[str, Any], keys: dict[str, str]) -> list[str]:
    """One line per model whose key is not the digest file's (none for a file without keys)."""
    want_keys = expected.get("model_keys")
    if want_keys is None:
        return []
    lines = []
    for name in sorted(set(want_keys) | set(keys)):
        want, got = want_keys.get(name), keys.get(name)
        if want != got:
            lines.append(f"  model {name}: key {got or '(not in this suite)'}, expected "
                         f"{want or '(not expected)'}: this code keys it otherwise (its recipe, the "
                         "numeric mode or the key's form changed), so the store holds it as another "
                         "model and what is drawn from its key (Caricatures' per-model noise) is "
                         "drawn again; if the change is meant, run the suite again and write the "
                         "digests")
    return lines


def writing_command(name: str, suite: Suite, runs_root: str | Path | None,
                    only_methods: list[str] | None = None) -> str:
    """The command that writes a digested file a run lacks: Table 1's stage for a detection
    table, Table 2's for a localization one, of the digested methods."""
    from counteraudit.train.core.artifacts import runs_dir

    script = "localize.py" if name.startswith("tables/localization") else "detect.py"
    methods = "".join(f" --method {method}" for method in only_methods or [])
    return f"python evaluate/{script} --suite {suite.name} --runs-dir {runs_dir(runs_root)}{methods}"


def differences(expected: dict[str, Any], measured: dict[str, Any],
                missing_hint: Callable[[str], str]) -> list[str]:
    """One line per model whose key differs, then one per file whose digest differs from the
    expected one (or is not expected); a file the run lacks says which command writes it
    (``missing_hint``)."""
    lines = key_differences(expected, measured.get("model_keys", {}))
    for name in sorted(set(expected["sha256"]) | set(measured["sha256"])):
        want, got = expected["sha256"].get(name), measured["sha256"].get(name)
        if want != got:
            lines.append(f"  {name}: SHA-256 {got or f'(not in this run: {missing_hint(name)})'}, "
                         f"expected {want or '(not expected)'}")
    return lines


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit reproducibility", add_help=add_help,
                                     description=__doc__, formatter_class=ScriptHelpFormatter)
    parser.add_argument("action", choices=("check", "write"), nargs="?", default="check",
                        help="check (the default): compare the run with the digest file (exit 1 "
                             "on any difference); write: record the run's digests in it")
    parser.add_argument("--digests", type=Path, default=None,
                        help="the digest file (JSON); default: the one shipped beside the suite's "
                             "file, <suite>.digests.json")
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="the run's tables are those of detect.py/localize.py --method NAME "
                             "(repeatable; default: the digest file's methods, else the suite's)")
    add_common_args(parser)
    return parser


def shipped_digests(suite: Suite) -> Path:
    return suite.path.with_name(f"{suite.path.stem}.digests.json")


def read_digests(path: Path) -> dict[str, Any]:
    """A digest file, from anyone: JSON whose ``model_keys``, where there are some, map names to
    keys (strings both)."""
    try:
        digests = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the digest file {path}: {error}") from None
    keys = digests.get("model_keys") if isinstance(digests, dict) else None
    if keys is not None and not (isinstance(keys, dict)
                                 and all(isinstance(v, str) for v in [*keys, *keys.values()])):
        raise ValueError(f"the digest file {path}, key 'model_keys', must map model names to "
                         f"keys (strings), got {keys!r}; write the file again with: counteraudit "
                         "reproducibility write")
    return digests


def chosen_methods(given: list[str] | None, expected: dict[str, Any],
                   digests: Path) -> list[str] | None:
    """The methods whose tables the run's digests cover: --method, else the digest file's
    ``methods`` (a file from anyone: registered method names only, so none becomes a path)."""
    from counteraudit.explain.base import METHODS

    methods = given or expected.get("methods")
    where = "--method" if given else f"the digest file {digests}, key 'methods'"
    if methods is None:
        return None
    if not (isinstance(methods, list) and methods and all(isinstance(m, str) for m in methods)):
        raise ValueError(f"{where} must be a list of method names, got {methods!r}; write the "
                         "file again with: counteraudit reproducibility write --method NAME ...")
    unknown = sorted(set(methods) - set(METHODS.names()))
    if unknown:
        raise ValueError(f"{where} names methods that are not registered: {unknown}; the "
                         f"registered ones: {', '.join(METHODS.names())}")
    return methods


def main(args: argparse.Namespace) -> None:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.train.core.artifacts import atomic_write_json
    from counteraudit.train.core.suite import load_suite

    suite = load_suite(args.suite)
    args.digests = args.digests or shipped_digests(suite)
    if args.action == "check" and not args.digests.is_file():
        raise FileNotFoundError(f"no digest file {args.digests} for the {suite.name} suite; give one "
                                "with --digests, or write one with: counteraudit reproducibility write")
    expected = read_digests(args.digests) if args.action == "check" else {}
    methods = chosen_methods(args.method, expected, args.digests)
    try:
        measured = measure(suite, args.runs_dir, methods)
    except FileNotFoundError as error:
        rekeyed = key_differences(expected, model_keys(suite)) if args.action == "check" else []
        if not rekeyed:
            raise
        raise FileNotFoundError("\n".join([f"{error}; the digest file {args.digests} keys "
                                           f"{len(rekeyed)} models otherwise:", *rekeyed])) from None
    if args.action == "write":
        atomic_write_json(args.digests, measured, chosen_by_user=True)
        print(f"wrote the digests of {len(measured['sha256'])} files of the {suite.name} suite to {args.digests}")
        return
    machine = measured["made_on"]
    lines = differences(expected, measured,
                        lambda name: writing_command(name, suite, args.runs_dir, methods))
    if lines:
        made = expected.get("made_on", {})
        keys = len(key_differences(expected, measured["model_keys"]))
        print(f"{len(lines) - keys} of {len(expected['sha256'])} files"
              f"{f' and {keys} model keys' if keys else ''} of the {suite.name} suite differ from "
              f"{args.digests} (made on {made.get('cpu')}, {made.get('instruction_set')}, "
              f"{made.get('mode')} numerics, torch {made.get('torch')}); this machine: {machine['cpu']}, "
              f"{machine['instruction_set']}, {machine['mode']} numerics, torch {machine['torch']}:",
              file=sys.stderr)
        print("\n".join(lines), file=sys.stderr)
        sys.exit(1)  # the script and `counteraudit reproducibility` alike: CI's check fails
    print(f"all {len(measured['sha256'])} files of the {suite.name} suite match {args.digests} "
          f"({machine['cpu']}, {machine['instruction_set']}, {machine['mode']} numerics)")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
