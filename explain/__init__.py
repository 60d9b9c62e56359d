"""Explanation methods: models x images -> rendered visualizations (uint8 images).

Each method is one file in ``explain/methods/``, registered in ``METHODS`` (explain/base.py, with
``build_method`` and the bases a method derives from), which imports them all on first lookup:
adding a method is one new file there. This package's ``__init__`` imports nothing: the entry
script's parser (explain/run.py) answers --help without loading torch (evaluate/cli.py).
"""
