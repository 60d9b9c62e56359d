"""The stage scripts, by the name of their ``counteraudit`` subcommand (evaluate/cli.py): named by
module, as strings, so that listing them imports none (the --help benchmark times them)."""

# subcommand -> the module of its stage script (get_args_parser + main)
STAGE_SCRIPTS = {
    "train": "counteraudit.train.train",
    "explain": "counteraudit.explain.run",
    "detect": "counteraudit.evaluate.detect",
    "localize": "counteraudit.evaluate.localize",
    "compare": "counteraudit.evaluate.compare",
    "report": "counteraudit.evaluate.report",
    "reference-count": "counteraudit.evaluate.reference_count",
    "dose": "counteraudit.evaluate.dose",
    "discover": "counteraudit.evaluate.discover",
    "sensitivity": "counteraudit.evaluate.sensitivity",
    "reproducibility": "counteraudit.evaluate.reproducibility",
    "population": "counteraudit.evaluate.population",
    "record": "counteraudit.evaluate.record",
    "leaderboard": "counteraudit.evaluate.leaderboard",
}
