"""Build the leaderboard from a folder of records: a Markdown table and a static HTML page.

    counteraudit leaderboard evaluate/leaderboard/records \
        --markdown evaluate/leaderboard/LEADERBOARD.md --html evaluate/leaderboard/index.html \
        --guide evaluate/README.md

Every record is validated first (evaluate/records/schema.py: its schema, its file name against its
id, its population against the known ones); one that fails stops the command with one error
naming the file and the key, before anything is written. One row per method, ranked by the
families it detects, then the configurations it localizes above chance, then the fewest families
it misses with power; the controls and model-blind methods are shown beside them, unranked; one
table per population. Without --markdown or --html the Markdown is printed.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
from pathlib import Path

from counteraudit.evaluate.records.populations_file import KNOWN_POPULATIONS
from counteraudit.train.core.command_line import ScriptHelpFormatter, run_cli

GUIDE_START, GUIDE_END = "<!-- leaderboard:start -->", "<!-- leaderboard:end -->"


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit leaderboard", add_help=add_help,
                                     formatter_class=ScriptHelpFormatter)
    parser.add_argument("records", metavar="RECORDS_DIR",
                        help="the folder of records (<id>.json, as counteraudit record writes them)")
    parser.add_argument("--markdown", default=None, metavar="FILE",
                        help="write the Markdown table here (e.g. evaluate/leaderboard/LEADERBOARD.md)")
    parser.add_argument("--html", default=None, metavar="FILE",
                        help="write the static HTML page here (e.g. evaluate/leaderboard/index.html)")
    parser.add_argument("--guide", default=None, metavar="FILE",
                        help=f"replace the block between {GUIDE_START} and {GUIDE_END} of this "
                             "Markdown guide with the table (e.g. evaluate/README.md)")
    parser.add_argument("--populations", default=None, metavar="TOML",
                        help=f"the known populations (default: {KNOWN_POPULATIONS.name} of "
                             "evaluate/records)")
    return parser


def with_block(text: str, block: str, where: str) -> str:
    """``text`` with the part between the leaderboard markers replaced by ``block``."""
    if text.count(GUIDE_START) != 1 or text.count(GUIDE_END) != 1 or \
            text.index(GUIDE_START) > text.index(GUIDE_END):
        raise ValueError(f"{where}: needs one {GUIDE_START} line, then one {GUIDE_END} line, where "
                         "the leaderboard goes")
    head, rest = text.split(GUIDE_START)
    return f"{head}{GUIDE_START}\n{block}{GUIDE_END}{rest.split(GUIDE_END, 1)[1]}"


def guide_block(text: str) -> str:
    """What the guide's leaderboard block holds (between the marker lines)."""
    return text.split(GUIDE_START + "\n", 1)[1].split(GUIDE_END, 1)[0]


def main(args: argparse.Namespace) -> str:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.evaluate.records.store import read_records
    from counteraudit.evaluate.reporting.leaderboard import leaderboard_html, leaderboard_markdown
    from counteraudit.train.core.artifacts import atomic_write_text

    records = read_records(args.records, known_path=args.populations)  # all checked first
    markdown = leaderboard_markdown(records)
    if args.guide:
        guide = Path(args.guide)
        updated = with_block(guide.read_text(encoding="utf-8"), markdown, str(guide))
    if args.markdown:
        atomic_write_text(args.markdown, markdown, chosen_by_user=True)
    if args.html:
        atomic_write_text(args.html, leaderboard_html(records), chosen_by_user=True)
    if args.guide:
        atomic_write_text(guide, updated, chosen_by_user=True)
    if not (args.markdown or args.html or args.guide):
        print(markdown, end="")
    else:
        print(f"leaderboard of {len(records)} record(s): "
              + ", ".join(p for p in (args.markdown, args.html, args.guide) if p))
    return markdown


if __name__ == "__main__":
    run_cli(main, get_args_parser())
