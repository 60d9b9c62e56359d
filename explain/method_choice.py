"""What the ``--method`` option of the commands that explain chooses (explain/run.py declares it):
which methods to run, their parameters (``--method NAME:key=value,key=value``), the outputs-only
control brought along, and the suite with those parameters merged in once
(``with_method_parameters``)."""
from __future__ import annotations

from typing import Any

from counteraudit.explain.base import METHODS
from counteraudit.explain.shared_settings import SHARED_SETTINGS, inheritance_line, inherited_table
from counteraudit.train.core.explain_options import CONTROL_METHOD
from counteraudit.train.core.params import params_problems
from counteraudit.train.core.suite import Suite



def run_methods(chosen: list[str] | None, control: bool = True) -> list[str] | None:
    """The methods a run explains with: those --method ``chosen``, with the outputs-only control
    added unless ``control`` is False (--no-control) or it is chosen; None (no --method): the
    suite's."""
    if not chosen:
        return None
    return [*chosen, *([CONTROL_METHOD] if control and CONTROL_METHOD not in chosen else [])]


def with_method_parameters(suite: Suite, names: list[str] | None,
                           given: dict[str, tuple[str, dict[str, Any]]]) -> Suite:
    """The suite with --method's parameters (``given``: a method's name -> the option's text and
    its table) merged into its [methods] tables, once, each checked by the method's own
    ``Params`` (one error naming the option, the key and the valid keys, before any work), and a
    line printed for each method of the run (``names``; None: the suite's) that takes the suite's
    shared settings (``shared_settings.py``), whose tables are written out, so they come from
    the suite file's methods alone."""
    names = names or suite.explain.methods or METHODS.names()
    problems = []
    for name, (text, table) in given.items():
        params_class = METHODS.get(name).Params  # an unknown name lists the registered ones
        keys = ", ".join(params_class.__dataclass_fields__) or "none (it has no parameters)"
        problems += [problem if "valid" in problem else f"{problem}; the keys of {name}: {keys}"
                     for problem in params_problems(params_class, table, f"--method {text!r}:")]
    if problems:
        raise ValueError("; ".join(problems))
    for name in names:
        if name not in suite.method_tables:
            line = inheritance_line(suite.method_tables, name, suite.path)
            if line:
                replaced = "; the values --method gives go over these" if name in given else ""
                print(f"{line}{replaced}", flush=True)
    tables = {name: _with_given(suite, name, table) for name, (_, table) in given.items()}
    tables.update({name: inherited_table(suite.method_tables, name) for name in names
                   if name not in suite.method_tables and name not in tables})
    tables = {name: table for name, table in tables.items() if table}
    if not tables:
        return suite
    configured = suite.with_settings(methods=tables)
    for name, (text, _) in given.items():
        try:
            METHODS.get(name)(configured.method_tables[name])  # a renderer's options, say
        except (ValueError, LookupError) as error:
            message = error.args[0] if error.args else error
            raise ValueError(f"--method {text!r}: {message}") from None
    return configured


def _with_given(suite: Suite, name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The method's table from the suite file (or the shared settings it takes) with the command
    line's values on top. A renderer given replaces the options of the one it replaces (they
    belong to that renderer): it draws with its own default options unless given some."""
    own = suite.method_tables.get(name)
    base = dict(own if own is not None else inherited_table(suite.method_tables, name))
    for leading, *belonging in SHARED_SETTINGS:
        if leading in given:
            for field in belonging:
                base.pop(field, None)
    return {**base, **given}
