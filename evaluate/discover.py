"""Counter-audit failure-discovery auditors: does each registered auditor find the planted
defects? (Tables 3 and 4; the auditors are listed at the end of --help)

    python evaluate/discover.py                  # the demo suite: every auditor on every model
    python evaluate/discover.py --quick          # the small 'quick' suite (a smoke test)
    python evaluate/discover.py --auditor twise --executor slurm --partition cpu

Runs whatever is missing (training with implant checks, then each model's auditors; findings are
stored once in runs/store/findings/), then prints Table 3 (auditors x families: the fraction of
each family's models detected by Table 1's rule, on the auditor's top finding) and Table 4 (the
rank of each anomalous model's planted slice, against its rank for every reference, and
precision@k), saved as .md/.csv/.tex under runs/<suite>/tables/.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    # Run as a file: the code is imported as counteraudit.* (pip install -e .); this folder's
    # modules must not shadow other packages of the same name.
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import time

from counteraudit.evaluate.discovery.auditor_registry import AUDITORS
from counteraudit.slurm.executor_config import add_executor_args
from counteraudit.train.core.command_line import ScriptHelpFormatter, add_common_args, run_cli
from counteraudit.train.core.suite_schema import DISCOVER_SCORES


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    # The auditors are listed from their source (AUDITORS.summaries): the help imports none.
    auditors = AUDITORS.summaries()
    parser = argparse.ArgumentParser("counteraudit discover", add_help=add_help,
                                     formatter_class=ScriptHelpFormatter, epilog=auditors_epilog(auditors))
    add_common_args(parser)
    parser.add_argument("--auditor", action="append", default=None, metavar="NAME",
                        help="only this auditor (repeatable); default: the suite's [discover] "
                             f"auditors, else every registered one ({', '.join(auditors)})")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N (default: cuda if available); the demo's "
                             "small models run as fast on 2 CPU cores")
    parser.add_argument("--score", choices=DISCOVER_SCORES, default=None,
                        help="how subgroups are ranked (default: the suite's [discover] score, "
                             "else relative): relative (recommended) scores each against the "
                             "references on the same images; absolute ranks by the statistic "
                             "alone, as the auditors' source papers did")
    add_executor_args(parser)
    return parser


def auditors_epilog(auditors: dict[str, str]) -> str:
    """The registered auditors, one line each: the first line of its module's docstring."""
    return ("auditors (every registered one runs, unless --auditor or [discover] auditors "
            "narrows them):\n" + "\n".join(f"  {name}: {summary}" for name, summary in auditors.items()))


def main(args: argparse.Namespace) -> dict:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.evaluate.discovery.reference_evaluations import (adaptive_results, check_relative,
                                                                       evaluate_references, scored_findings)
    from counteraudit.evaluate.discovery.stage import discover_score, discover_suite, suite_auditors
    from counteraudit.evaluate.discovery.tables import (CHECKING_HALF, baseline_text, discovery_notes,
                                                       discovery_tables)
    from counteraudit.evaluate.pipeline import load_checked_suite
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables
    from counteraudit.train.checked_training import train_and_check
    from counteraudit.train.core.stage import run_options
    from counteraudit.train.worlds import build_world

    suite = load_checked_suite(args.suite).with_settings({"score": "--score"}, discover={"score": args.score})
    options = run_options(args)
    runs_root = options.runs_dir
    suite_auditors(suite, args.auditor)  # an unknown --auditor fails here, not after training
    score = discover_score(suite)
    check_relative(suite, score)  # ... and a relative score without references
    train_and_check(suite, suite.models, options)
    started = time.perf_counter()
    counts = discover_suite(suite, options, auditors=args.auditor)  # a dry run prints its plan
    if options.dry_run:
        return {}
    world = build_world(suite.world, runs_root=runs_root)
    evaluated = (evaluate_references(suite, options, adaptive_results(suite, runs_root, args.auditor, world))
                 if score == "relative" else 0)
    print(f"\n{counts['computed']} auditor result(s) computed, {counts['stored']} already stored, "
          f"{evaluated} reference evaluation(s) of adaptive auditors' subgroups computed, in "
          f"{time.perf_counter() - started:.0f}s")
    results = scored_findings(suite, runs_root, args.auditor, world, score)
    references = [s.name for s in suite.references]
    tables = discovery_tables(suite, results, world, runs_root, score)
    detections = tables["discovery-detection-per-model"]
    write_tables(suite, tables, runs_root)
    baseline = baseline_text(len(references), len(suite.null_fit), CHECKING_HALF)
    scale = (f"relative score: the model's statistic minus the mean of the baseline ({baseline}) "
             "on the same images, over their spread, each baseline model left out of its own"
             if score == "relative" else "absolute statistic, as the auditors' source papers ranked")
    print(f"\nTable 3 -- fraction of each family's models detected by each auditor (its top "
          f"finding above every reference's; {suite.name} suite, {len(references)} references; "
          f"{scale})\n")
    print(to_markdown(tables["discovery-detection"]))
    anomalous = detections[detections["role"] != "reference"]
    print("\nPer model: statistic = top finding's strength, margin = statistic / max over "
          "references, p = rank p-value, saturated = the references' statistic is at its "
          "ceiling (the verdict says nothing), top_finding_relation = what the top finding has "
          "to do with the planted slice\n")
    print(to_markdown(anomalous[["auditor", "family", "model", "statistic", "excess", "margin",
                                 "p_value", "detected", "saturated", "top_finding",
                                 "top_finding_relation"]]
                      .reset_index(drop=True), float_format="{:.3f}"))
    if len(tables["discovery-detection-relations"]):
        print("\nTable 3's detections by what the top finding has to do with the planted slice "
              "(in it, sharing a factor with it, unrelated, or no slice to relate to)\n")
        print(to_markdown(tables["discovery-detection-relations"]))
    calibration = tables["discovery-calibration"]
    print(f"\nFalse-positive rates on {len(suite.held_out)} held-out references (null models "
          f"judged as anomalous ones) per half: checking ({len(suite.null_check)}, never in the "
          f"baseline) and fitting ({len(suite.null_fit)}, each left out of its own); each beside "
          "its nominal level\n")
    print(to_markdown(calibration, float_format="{:.3f}") if len(calibration) else
          f"(none: the {suite.name} suite has no held-out references; [references] held_out = 8 "
          "or more gives them)")
    print("\nTable 4 -- rank of the planted slice in each anomalous model's findings (1 = top), "
          "its ranks for the references, and precision@k\n")
    print(to_markdown(tables["discovery-recovery"], float_format="{:.2f}"))
    if len(tables["discovery-recovery-rates"]):
        print("\nRecovery rates -- share of models whose planted slice ranks first (top1) and in "
              "the first five (top5), 95% Wilson intervals, by auditor, slice arity and strength\n")
        print(to_markdown(tables["discovery-recovery-rates"], float_format="{:.2f}"))
        print("\nRecovery rates by arity, both strengths pooled (n_slices: distinct slices; "
              "outside: models that took but lie outside the auditor's factors)\n")
        print(to_markdown(tables["discovery-recovery-by-arity"], float_format="{:.2f}"))
    for note in discovery_notes(detections, tables["discovery-recovery"], suite.name,
                                tables["discovery-calibration"]):
        print(f"\n{note}")
    if len(tables["discovery-false-positives"]):
        print("\nReferences with any significant finding (the false-positive rate of auditors "
              "that keep only significant findings)\n")
        print(to_markdown(tables["discovery-false-positives"], float_format="{:.2f}"))
    tables.update(search_tables(suite, results, world, runs_root, options.device))
    print(f"\ntables: {suite.root(runs_root) / 'tables'}/")
    return tables


def search_tables(suite, results, world, runs_root, device) -> dict:
    """The search study's tables (selection functions, budget curves, images to rank the planted
    slice), written and printed; {} where the suite's world has no exhaustive references."""
    from counteraudit.evaluate.discovery.equal_budgets import equal_budget_table, selections_over_models
    from counteraudit.evaluate.discovery.search_study import search_study
    from counteraudit.evaluate.discovery.stage import discover_seed
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables

    study = search_study(suite, results, world, runs_root, discover_seed(suite), device)
    if not study:
        return {}
    tables = {}
    write_tables(suite, study["tables"], runs_root)
    tables.update(study["tables"])
    print("\nSelection functions compared by lookup in the exhaustive references (10 search "
          "seeds): coverage of the 10% worst subdomains (mean, sd over seeds), mean accuracy "
          "of the explored subdomains, each surrogate's Spearman correlation on the subdomains "
          "NOT explored (held out), by share explored\n")
    print(to_markdown(study["tables"]["search-selection-comparison"], float_format="{:.3f}"))
    overview = {"search-selections-over-models": selections_over_models(
        study["tables"]["search-selection-comparison"])}
    write_tables(suite, overview, runs_root)
    tables.update(overview)
    print("\nThe same over models: each model's coverage (mean over seeds), averaged over the "
          "models, sd over models\n")
    print(to_markdown(overview["search-selections-over-models"], float_format="{:.2f}"))
    print("\nBudget curves -- images each auditor needs to rank the planted slice first "
          "(top 1) and in the top 3, at every larger budget of the curve (mean over the seeds "
          "that reach it; "
          "surrogate_search: 10 seeds by lookup, the others: the discover seed)\n")
    curves = study["tables"].get("search-budget-curves", ())
    if len(curves):
        equal = {f"search-equal-budgets-top{k}": equal_budget_table(curves, within=k)
                 for k in (1, 5)}
        write_tables(suite, equal, runs_root)
        tables.update(equal)
        print("\nAt equal image budgets -- share of localizable models whose planted slice is "
              "first (top 1) once each auditor has spent that many images, 95% interval over "
              "models\n")
        print(to_markdown(equal["search-equal-budgets-top1"], float_format="{:.2f}"))
    needed = study["tables"]["search-images-to-rank"]
    print(to_markdown(needed, float_format="{:.0f}") if len(needed) else
          f"(none: the {suite.name} suite has no localizable anomalous model, so no auditor "
          "has a planted slice to rank)")
    return tables


if __name__ == "__main__":
    run_cli(main, get_args_parser())
