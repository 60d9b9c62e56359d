"""One module per explanation method; ``explain/__init__.py`` imports them all (see explain/README.md,
"Add an explanation method"). Modules whose name starts with ``_`` are skipped."""
