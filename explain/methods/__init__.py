"""One module per explanation method; ``METHODS`` (explain/base.py) imports them all on its first
lookup (see explain/README.md, "Add an explanation method"). Modules whose name starts with ``_``
are skipped."""
