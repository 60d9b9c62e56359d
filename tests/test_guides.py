"""README.md and the folder guides: every code block is checked, every link resolves.

Each fenced block names its language, and each language has one check:
- ``sh``: every command is accounted for. A stage, benchmark or module command (``python
  <script>.py ...``, ``python -m counteraudit...``, ``counteraudit <subcommand> ...``) must parse
  with its script's own ``get_args_parser`` (in this process: a wrong option or a script that moved
  fails here); the long ones are run by CI or by the tests named in ``RUN_BY``. ``python -m pytest``
  must name existing files and markers; ``pip install`` must be what ``.ci/run`` installs;
  ``local_cluster.sh`` must be given a subcommand it has. Any other command fails this test until
  a check for it is added here.
- ``python``: an example, run by the test that ``EXAMPLES`` names for its guide and section.
- ``toml``: a suite fragment, loaded on top of the demo suite (the suite file's whole check).
- ``json``: parsed.
- ``text``: not code (a folder tree, a file layout).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from counteraudit.evaluate import cli
from counteraudit.train.core.suite import load_suite

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
GUIDES = ["README.md", "train/README.md", "anomalies/README.md", "explain/README.md",
          "evaluate/README.md", "evaluate/discovery/README.md", "evaluate/benchmarks/README.md",
          "slurm/README.md"]
# Python examples: (guide, section) -> the test that runs the block as written.
EXAMPLES = {
    ("explain/README.md", "Add an explanation method"): "tests/test_explain_readme.py",
    ("explain/README.md", "Your own method, in a file of your own"): "tests/test_plugins.py",
    ("train/README.md", "Plug-in parameters, and keys that stay stable"):
        "tests/test_params.py::test_the_guides_example_declares_parameters_the_parser_checks",
    ("evaluate/discovery/README.md", "Add a failure-discovery auditor"): "tests/test_discovery_readme.py",
    ("slurm/README.md", "slurm/: run a stage's work items locally or on Slurm"):
        "tests/test_guides.py::test_slurm_guide_example_runs_locally_and_as_a_dry_run",
}
# Commands that a test runs as written (each is also parsed below).
RUN_BY = {
    "python train/train.py --suite paper --executor slurm --partition p --dry-run":
        "tests/test_paper_protocol.py::test_paper_dry_run_on_slurm_without_a_cluster_lists_the_backdoors_and_adversarial_rows",
}
CI = (REPO / ".ci" / "run").read_text()
FENCE = re.compile(r"^```(\S*)\n(.*?)^```$", flags=re.DOTALL | re.MULTILINE)


def blocks():
    """(guide, section heading, language, code) of every fenced block."""
    found = []
    for guide in GUIDES:
        text = (REPO / guide).read_text()
        for match in FENCE.finditer(text):
            headings = re.findall(r"^#+ (.+)$", text[:match.start()], flags=re.MULTILINE)
            found.append((guide, headings[-1] if headings else "", match.group(1), match.group(2)))
    return found


BLOCKS = blocks()


def block_id(block) -> str:
    return f"{block[0]}:{block[1][:30]}:{block[2]}"


def commands(code: str) -> list[str]:
    """A shell block's commands: comments dropped, continuations joined, ``&&`` split."""
    joined = re.sub(r"\\\n", " ", code)
    found = []
    for line in joined.splitlines():
        line = line.split(" # ", 1)[0].strip()
        if line and not line.startswith("#"):
            found += [part.strip() for part in line.split("&&")]
    return found


def script_parser(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]] | None:
    """The parser a stage/benchmark/module command goes through, and its arguments."""
    if words[0] == "counteraudit":
        return cli.get_args_parser(), words[1:]
    if words[0] != "python" or len(words) < 2:
        return None
    if words[1] == "-m" and words[2].startswith("counteraudit."):
        module, arguments = words[2], words[3:]
    elif words[1].endswith(".py"):
        path = REPO / words[1]
        assert path.is_file(), f"{words[1]} does not exist"
        module, arguments = "counteraudit." + ".".join(Path(words[1]).with_suffix("").parts), words[2:]
    else:
        return None
    return importlib.import_module(module).get_args_parser(), arguments


def check_command(command: str) -> None:
    words = shlex.split(command)
    parsed = script_parser(words)
    if parsed is not None:
        parser, arguments = parsed
        try:
            parser.parse_args(arguments)
        except SystemExit:
            pytest.fail(f"{command!r}: its script's argument parser refuses it")
        return
    if words[:3] == ["python", "-m", "pytest"]:
        markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
        names = {marker.split(":")[0] for marker in markers}
        for k, word in enumerate(words[3:], start=3):
            if words[k - 1] == "-m":
                assert word in names, f"{command!r}: no pytest marker {word!r} (markers: {sorted(names)})"
            elif words[k - 1] in ("-k", "--plugins"):  # a test name's part; a user's own file
                continue
            elif not word.startswith("-"):
                assert (REPO / word.split("::")[0]).exists(), f"{command!r}: {word} does not exist"
        return
    if words[:2] == ["pip", "install"]:
        assert words[2:] == ["-e", ".[test]"] and '-e ".[test]"' in CI, \
            f"{command!r} is not what .ci/run installs"
        return
    if words[0] == "export":
        assert all(re.fullmatch(r"[A-Z_]+=\S+", word) for word in words[1:]), command
        return
    script = [w for w in words if w.endswith("local_cluster.sh")]
    if script:
        action = words[words.index(script[0]) + 1]
        assert re.search(rf"^\s*{action}\)", (REPO / "slurm/local_cluster.sh").read_text(), re.MULTILINE), \
            f"{command!r}: local_cluster.sh has no subcommand {action!r}"
        return
    pytest.fail(f"{command!r}: no check for this command; add one to tests/test_guides.py")


def test_readme_is_short_and_every_guide_exists():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the depth goes into a folder guide"
    readme = (REPO / "README.md").read_text()
    for guide in GUIDES[1:]:
        assert (REPO / guide).is_file(), f"{guide} is missing"
        assert f"]({guide})" in readme, f"README.md does not link to {guide}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("guide", GUIDES)
def test_links_resolve(guide):
    text = FENCE.sub("", (REPO / guide).read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / guide).parent / path if path else REPO / guide
        assert file.exists(), f"{guide}: the link {target} points to nothing"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", file.read_text()), flags=re.MULTILINE)
            assert anchor in {slug(h) for h in headings}, f"{guide}: no heading for #{anchor} in {file.name}"


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_code_block_is_checked(block, tmp_path):
    guide, section, language, code = block
    if language == "sh":
        for command in commands(code):
            check_command(command)
    elif language == "python":
        runner = EXAMPLES.get((guide, section))
        assert runner, (f"{guide}, section {section!r}: a python block no test runs; add it to "
                        "EXAMPLES with the test that runs it")
        path, _, name = runner.partition("::")
        source = (REPO / path).read_text()
        assert guide.split("/README.md")[0] in source or guide in source, f"{runner} does not read {guide}"
        assert not name or f"def {name}(" in source, f"{runner} does not exist"
    elif language == "toml":
        check_suite_fragment(code, tmp_path)
    elif language == "json":
        json.loads(code)
    else:
        assert language == "text", f"{guide}, section {section!r}: a ```{language or ''} block; name " \
                                   "its language (sh, python, toml, json, or text for a layout)"


def check_suite_fragment(code: str, folder: Path) -> None:
    """A suite fragment is valid TOML and passes the suite file's check on top of the demo."""
    assert tomllib.loads(code), "an empty TOML block"
    path = folder / "fragment.toml"
    # the demo's own models go where the fragment brings its own (a sweep names models too)
    own_models = "" if "[[anomalies]]" in code else "anomalies = []\n"
    path.write_text(f'extends = "demo"\nname = "fragment"\n{own_models}{code}')
    load_suite(path)


@pytest.mark.parametrize("guide", GUIDES)
def test_cited_tests_exist(guide):
    """``tests/test_x.py::test_name`` (and a following ``::test_other`` of the same file) names a
    test that exists, so a renamed test cannot leave a guide's claim unchecked."""
    text = (REPO / guide).read_text()
    current = None
    for file, name in re.findall(r"(?:tests/)?(test_\w+\.py)|::(test_\w+)", text):
        if file:
            current = REPO / "tests" / file
            assert current.is_file(), f"{guide} cites {file}, which does not exist"
        elif current is not None:
            assert f"def {name}(" in current.read_text(), f"{guide} cites {current.name}::{name}, which does not exist"


def test_commands_run_by_tests_exist_and_are_in_a_guide():
    every = {command for block in BLOCKS if block[2] == "sh" for command in commands(block[3])}
    for command, runner in RUN_BY.items():
        assert command in every, f"RUN_BY names {command!r}, which no guide shows"
        path, _, name = runner.partition("::")
        assert f"def {name}(" in (REPO / path).read_text(), f"{runner} does not exist"


def test_slurm_guide_example_runs_locally_and_as_a_dry_run(monkeypatch):
    (code,) = [block[3] for block in BLOCKS if block[0] == "slurm/README.md" and block[2] == "python"]
    for argv, expected in ((["example"], "[1, 4, 9]"), (["example", "--dry-run"], "nothing was run")):
        monkeypatch.setattr("sys.argv", argv)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "slurm/README.md", "exec"), {"__name__": "slurm_guide_example"})
        assert expected in printed.getvalue(), printed.getvalue()
