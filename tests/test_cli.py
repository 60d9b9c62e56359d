"""One command-line convention for every `counteraudit` subcommand (each default said once,
--quick, a mistake shown with the subcommand's own usage, a dry run that reads the store), and the
distance fixed by the suite: the same tables online and offline, nothing downloaded unasked."""
import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
import torch

from counteraudit.evaluate.cli import STAGE_SCRIPTS, _build_parsers, main
from counteraudit.evaluate.discovery.auditors import AUDITORS
from counteraudit.evaluate.discovery.relative import SCORES
from counteraudit.evaluate.pipeline_options import pipeline_parser
from counteraudit.evaluate.pipeline import prepare
from counteraudit.evaluate.scoring.detection import margin_text
from counteraudit.evaluate.scoring.distances import MissingBackboneWeightsError
from counteraudit.evaluate.scoring.tables import chance_band_note
from counteraudit.explain.settings import method_specs
from counteraudit.explain.stage import explain_suite
from counteraudit.train.core.stage import RunOptions
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.module_sources import declared_plugins
from counteraudit.train.core.registry import entry_summary
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.evaluate.pipeline import load_checked_suite
from tests.conftest import REPO, write_suite


def option_entries(help_text: str) -> list[str]:
    """Each option's entry of a --help: its flags and its help text, one string each."""
    return re.split(r"\n(?=  -)", help_text.split("\noptions:\n", 1)[1])


# Subcommands that read no suite (the leaderboard reads a folder of records): no --quick.
READS_NO_SUITE = {"leaderboard"}


def test_every_subcommand_says_each_default_once_and_takes_quick():
    _, subcommands = _build_parsers()
    assert set(subcommands) == set(STAGE_SCRIPTS)
    for name, parser in subcommands.items():
        shown = parser.format_help()
        assert shown.startswith(f"usage: counteraudit {name} "), name
        assert ("--quick" in shown) == (name not in READS_NO_SUITE), name
        for entry in option_entries(shown):
            said = " ".join(entry.split())
            assert said.count("default:") <= 1, (name, said)  # was "(default: 60) (default: None)"
            assert "(default: None)" not in said and "(default: False)" not in said, (name, said)
    assert "--seed SEED seed of the subset draws (default: 0)" in " ".join(
        subcommands["reference-count"].format_help().split())  # a default of 0 is still said


# The positional arguments a subcommand requires (what it acts on), given so the flag is the error.
REQUIRED_ARGUMENTS = {"population": ["import", "release.tar"], "record": ["--out", "records"],
                      "leaderboard": ["records"]}


@pytest.mark.parametrize("name", list(STAGE_SCRIPTS))
def test_a_bad_flag_shows_the_subcommands_usage(name, capsys):
    quick = [] if name in READS_NO_SUITE else ["--quick"]
    with pytest.raises(SystemExit) as exited:
        main([name, *REQUIRED_ARGUMENTS.get(name, []), *quick, "--no-such-flag"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"usage: counteraudit {name} "), error
    assert f"counteraudit {name}: error: unrecognized arguments: --no-such-flag" in error


def test_quick_conflicts_with_another_suite_in_the_subcommands_words(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["reference-count", "--quick", "--suite", "paper"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(
        "counteraudit reference-count: error: --quick runs the 'quick' suite; drop --suite paper")


def test_help_texts_say_what_the_commands_do_and_where_they_write():
    _, subcommands = _build_parsers()
    discover = " ".join(subcommands["discover"].format_help().split())
    for auditor in AUDITORS.names():  # from the registry: a new auditor is listed without a line here
        assert f"{auditor}:" in discover, auditor
    # The help reads the auditors' source (none imported) and says what their modules say
    declared = declared_plugins(AUDITORS.plugins)
    assert declared == {name: entry_summary(AUDITORS.get(name)) for name in AUDITORS.shipped_names()}
    for auditor, summary in declared.items():
        assert f"{auditor}: {summary}" in discover and summary, auditor
    assert f"{{{','.join(SCORES)}}}" in discover  # --score offers the scores discovery ranks by
    explain = " ".join(subcommands["explain"].format_help().split())
    assert "<runs-dir>/store/visualizations/<method>/<key hash>/" in explain
    assert "linked from <runs-dir>/<suite>/visualizations/" in explain


# What a --help must not load: the libraries of the stages (a --help answers in a fraction of a
# second without them; `import torch` alone takes 1-2 s on a 2-core CPU).
HEAVY_LIBRARIES = {"torch", "torchvision", "captum", "scipy", "sklearn", "pandas"}


def modules_imported(argv: list[str]) -> set[str]:
    """The modules a run of ``python <argv>`` imports, from Python's import-time log; it must exit 0."""
    run = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, (argv, run.stderr[-2000:])
    return {line.split("|")[-1].strip() for line in run.stderr.splitlines()
            if line.startswith("import time:")}


def test_the_commands_help_loads_no_stage():
    imported = modules_imported(["-m", "counteraudit.evaluate.cli", "--help"])
    assert "counteraudit.train.core.command_line" in imported  # (the log is read)
    assert not imported & HEAVY_LIBRARIES, imported & HEAVY_LIBRARIES
    assert not imported & set(STAGE_SCRIPTS.values()), imported & set(STAGE_SCRIPTS.values())


@pytest.mark.parametrize("form", ["counteraudit", "script"])
@pytest.mark.parametrize("name", list(STAGE_SCRIPTS))
def test_a_subcommands_help_loads_only_its_own_script(name, form):
    """`counteraudit NAME --help` imports NAME's script and no other; neither it nor `python
    <script> --help` loads torch & co (discover lists its auditors from their source)."""
    script = STAGE_SCRIPTS[name].removeprefix("counteraudit.").replace(".", "/") + ".py"
    argv = ["-m", "counteraudit.evaluate.cli", name, "--help"] if form == "counteraudit" else [script, "--help"]
    imported = modules_imported(argv)
    others = set(STAGE_SCRIPTS.values()) - {STAGE_SCRIPTS[name]}
    assert not imported & others, imported & others
    assert not imported & HEAVY_LIBRARIES, (form, name, imported & HEAVY_LIBRARIES)


def test_printed_margins_never_contradict_the_verdict():
    assert margin_text(1.0004, True) == "1.0004"  # "1.00" hid a detection
    assert margin_text(0.9996, False) == "0.9996"  # and "1.00" a miss
    assert margin_text(1.234, True) == "1.23" and margin_text(0.5, False) == "0.50"
    assert margin_text(1.0, False) == "1.00"  # a tie is no detection, and reads as one
    # Abar above by less than a float's last digit of the ratio: the verdict is written out
    assert margin_text(1.0, True) == "1.00 (detected)"
    for margin in [0.99949, 0.9995, 0.99999, 1.000001, 1.00499, 1.005]:
        text = margin_text(margin, margin > 1)
        assert (float(text.split()[0]) > 1) == (margin > 1) or "detected" in text, (margin, text)


def test_the_chance_band_sentence_is_true_at_every_band():
    narrow = pd.DataFrame({"chance_low": [0.37, 0.36], "chance_high": [0.63, 0.64]})
    wide = pd.DataFrame({"chance_low": [0.24], "chance_high": [0.76]})
    assert "localizes only above 0.64; the paper's mark of success, 0.7, lies above the band" \
        in chance_band_note(narrow)
    said = chance_band_note(wide)
    assert "inside [0.24, 0.76]" in said and "0.7, lies inside the band" in said
    assert "counts as success" not in said


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """An empty torch hub cache, and any download attempt recorded and refused."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    tried = []

    def refuse(url, *args, **kwargs):
        tried.append(url)
        raise OSError("no network")
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    return tried


def dry_run_args(*argv: str) -> argparse.Namespace:
    return pipeline_parser("test").parse_args([*argv, "--dry-run", "--no-progress"])


def test_the_demo_scores_with_its_declared_distance_and_downloads_nothing(no_network, tmp_path,
                                                                          capfd):
    """The README's `python evaluate/detect.py`, as a dry run on an empty runs folder: the demo's
    own distance (l2, the same on every machine), said once where it comes from; no download
    tried, no download line printed."""
    runs = tmp_path / "runs"
    run = prepare(dry_run_args("--runs-dir", str(runs)))
    name, source = run.distance.name, run.source
    printed = "".join(capfd.readouterr())
    assert (name, source) == ("l2", "the suite's [evaluate] distance")
    assert printed.count("scoring with distance l2 (the suite's [evaluate] distance)") == 1
    assert "Download" not in printed and no_network == []
    assert not runs.exists()  # a dry run writes nothing
    # every shipped suite but the paper's declares a distance that needs no weights
    for suite in ["demo", "demo-full", "dose", "quick", "replicated"]:
        assert load_suite(suite).evaluate.distance in ("l2", "ssim"), suite
    assert load_suite("paper").evaluate.distance == "lpips-alex"


def test_a_suite_that_declares_lpips_fails_with_the_fix_before_any_work(no_network, tmp_path):
    suite = write_suite(tmp_path / "lpips.toml", body='[evaluate]\ndistance = "lpips-alex"\n')
    runs = tmp_path / "runs"
    with pytest.raises(MissingBackboneWeightsError) as caught:
        prepare(dry_run_args("--suite", str(suite), "--runs-dir", str(runs)))
    said = str(caught.value)
    assert said.startswith(f"suite file {suite}: [evaluate] distance = 'lpips-alex': ")
    assert "--download-weights" in said and "alexnet-owt-7be5be79.pth" in said
    assert no_network == [] and not runs.exists()
    # --distance overrides the suite's; --download-weights is what tries the network
    assert prepare(dry_run_args("--suite", str(suite), "--runs-dir", str(runs),
                                "--distance", "ssim")).distance.name == "ssim"
    with pytest.raises(MissingBackboneWeightsError, match="download failed"):
        prepare(dry_run_args("--suite", str(suite), "--runs-dir", str(runs),
                             "--download-weights"))
    assert no_network == ["https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"]


def test_an_unknown_distance_in_a_suite_is_one_error_naming_the_key(tmp_path):
    suite = write_suite(tmp_path / "typo.toml", body='[evaluate]\ndistance = "lpips-alexnet"\n')
    with pytest.raises(SuiteFileError, match=r"\[evaluate\] distance.*lpips-alex"):
        load_checked_suite(suite)


def test_a_dry_run_says_what_is_stored_and_plans_only_the_rest(finished_run, tmp_path, capsys):
    """On the finished end-to-end run (2 methods x 9 visualization sets, all stored): nothing to
    compute; with a method never run added, exactly its 5 (model, method) items. Nothing is
    written."""
    suite_file, runs, _ = finished_run
    suite = load_suite(suite_file)
    before = sorted(str(path) for path in runs.rglob("*"))
    options = RunOptions(runs_dir=str(runs), executor={"dry_run": True})
    counts = explain_suite(suite, options)
    printed = capsys.readouterr().out
    assert counts["stored"] == 18
    assert "18 visualization set(s) already stored (not computed again), 0 work item(s)" in printed
    explain_suite(suite, options, methods=method_specs(suite, ["guided_backprop", "outputs_only", "gradcam"]))
    printed = capsys.readouterr().out
    assert "18 visualization set(s) already stored (not computed again), 5 work item(s)" in printed
    assert "would run 5 items" in printed and "reference-00/guided_backprop" not in printed
    assert sorted(str(path) for path in runs.rglob("*")) == before
    # a suite whose image sets are not made yet: every result counts as missing, and says why
    copy = shutil.copy(suite_file, tmp_path / "e2e.toml")
    explain_suite(load_suite(copy), replace(options, runs_dir=str(tmp_path)))
    printed = capsys.readouterr().out
    assert "0 visualization set(s) already stored" in printed
    assert "2 image set(s) not made yet" in printed
