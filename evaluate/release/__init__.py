"""Trained populations as releases: export a suite's models with a manifest of digests, verify a
release before anything of it enters the store, and import it (evaluate/population.py)."""
