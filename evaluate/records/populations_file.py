"""Where the known populations are listed (suite name -> population_id and exported_with): apart
from populations.py, so that the record and leaderboard commands' --help loads nothing to name it."""
from pathlib import Path

KNOWN_POPULATIONS = Path(__file__).with_name("populations.toml")
