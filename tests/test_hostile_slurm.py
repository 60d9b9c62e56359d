"""Nothing from a suite file or the command line reaches a shell through Slurm: every [slurm] value
becomes a line `#SBATCH --key=value` of the script submitit writes and bash runs, so a value with
a line break, a quote or a ';' is refused when the suite is read (or the options are parsed), and
every value that is accepted gives a script with one line per option and nothing else."""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
from pathlib import Path

import pytest
import submitit

from counteraudit.slurm.errors import ExecutorConfigError
from counteraudit.slurm.executor_config import add_executor_args
from counteraudit.slurm.executor import ExecutorConfig, executor_config_from, executor_options, submit_items
from counteraudit.slurm.request_checks import sbatch_parameters
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from tests.conftest import write_suite

# What the probe planted: a line break ends the #SBATCH line and bash runs the next one.
INJECTIONS = {
    "newline": "acct\ntouch {marker}\n#",
    "carriage return": "acct\rtouch {marker}\r#",
    "single quote": "acct' ; touch {marker} ; '",
    "double quote": 'acct" ; touch {marker} ; "',
    "semicolon": "acct;touch {marker}",
    "command substitution": "acct$(touch {marker})",
    "backquote": "acct`touch {marker}`",
    "space": "acct touch",
    "tab": "acct\ttouch",
    "nul": "acct\x00touch",
}
# Where a suite file puts a string that reaches an #SBATCH line: (TOML given the value, the
# command-line options given it).
PLACES = {
    "partition": (lambda v: f"partition = {json.dumps(v)}", lambda v: ["--partition", v]),
    "account": (lambda v: f"account = {json.dumps(v)}", lambda v: ["--account", v]),
    "qos": (lambda v: f"qos = {json.dumps(v)}", lambda v: ["--qos", v]),
    "constraint": (lambda v: f"constraint = {json.dumps(v)}", lambda v: ["--constraint", v]),
    "slurm_extra key": (lambda v: f"slurm_extra = {{ {json.dumps(v)} = \"ours\" }}",
                        lambda v: ["--slurm-extra", f"{v}=ours"]),
    "slurm_extra value": (lambda v: f"slurm_extra = {{ reservation = {json.dumps(v)} }}",
                          lambda v: ["--slurm-extra", f"reservation={v}"]),
}
# Values Slurm accepts that submitit must quote, and the options that take them.
TRICKY_SUITE_TABLE = {
    "executor": "slurm",
    "partition": "gpu,long",
    "account": "lab-1.x_y",
    "qos": "high_prio",
    "constraint": "[rack1*2&rack2*4]|(a100&ib)",
    "mem_gb": 15.5,
    "slurm_extra": {"reservation": "ours.2", "comment": "a comment, with spaces", "exclusive": True,
                    "mail_type": "END,FAIL", "mail-user": "me+jobs@example.org", "gres": "gpu:a100:2",
                    "nodelist": "node[1-4,7]", "begin": "now+1hour", "nice": -5, "tmp": "10G"},
}


def listing(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256 (links and folders by what they are)."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file()
            else "folder" for path in sorted(folder.rglob("*"))}


def suite_with_slurm(path: Path, slurm_lines: str) -> Path:
    return write_suite(path, body=f"[slurm]\nexecutor = \"slurm\"\n{slurm_lines}\n")


@pytest.mark.parametrize("injection", INJECTIONS)
@pytest.mark.parametrize("place", PLACES)
def test_a_hostile_slurm_value_is_refused_when_the_suite_is_read(tmp_path, place, injection):
    marker = tmp_path / "PWNED"
    value = INJECTIONS[injection].format(marker=marker)
    if place == "slurm_extra key":
        value = value.replace("acct", "reservation")
    path = suite_with_slurm(tmp_path / "hostile.toml", PLACES[place][0](value))
    before = listing(tmp_path)

    with pytest.raises(SuiteFileError) as raised:
        load_suite(path)

    message = str(raised.value)
    assert message.startswith(f"suite file {path} has a problem; nothing was run:\n  - [slurm] ")
    assert repr(value) in message  # the bad value, escaped: the message itself is one line
    assert len(message.splitlines()) == 2
    if place == "slurm_extra key":
        assert "not an sbatch option slurm_extra takes" in message and "reservation" in message
    else:
        named = ("slurm_extra (--slurm-extra) reservation" if place == "slurm_extra value"
                 else f"{place} (--{place})")
        assert f"[slurm] {named} must be " in message and "line breaks" in message
    assert listing(tmp_path) == before and not marker.exists()


@pytest.mark.parametrize("injection", ["newline", "single quote", "semicolon"])
@pytest.mark.parametrize("place", PLACES)
def test_a_hostile_command_line_option_is_refused_with_its_name(place, injection):
    value = INJECTIONS[injection].format(marker="/tmp/PWNED")
    if place == "slurm_extra key":
        value = value.replace("acct", "reservation")
    args = add_executor_args(argparse.ArgumentParser()).parse_args(PLACES[place][1](value))
    with pytest.raises(ExecutorConfigError) as raised:
        executor_config_from(executor_options(args), None, stage_name="train")
    flag = "--slurm-extra" if place.startswith("slurm_extra") else f"--{place}"
    assert f"({flag})" in str(raised.value) and repr(value) in str(raised.value)


@pytest.mark.parametrize(("line", "message"), [
    ("mem_gb = inf", "mem_gb (--mem-gb) must be a number of GB from 0.001 to 1048576 (1 MB to 1 PB per node), got inf"),
    ("mem_gb = nan", "got nan"),
    ("mem_gb = -inf", "got -inf"),
    ("mem_gb = 1e-9", "got 1e-09"),  # would be written as --mem=0MB: a whole node's memory
    ("time = 1_000_000_000_000", "time_minutes (--time) must be a whole number from 1 to 525600, got 1000000000000"),
    ("cpus_per_task = 100_000", "cpus_per_task (--cpus-per-task) must be a whole number from 1 to 65533"),
    ("slurm_extra = { nice = 1.5 }", "slurm_extra (--slurm-extra) nice must be true, or a whole number"),
    ("slurm_extra = { requeue = false }", "false is not an sbatch value"),
    ("slurm_extra = { output = \"/tmp/x\" }", "key 'output': this tool sets or needs it as it is"),
    ("slurm_extra = { mem = \"4G\" }", "key 'mem': it is set by the key 'mem_gb' (--mem-gb); use that"),
    ("slurm_extra = { reservaton = \"ours\" }", "did you mean 'reservation'?"),
    ("slurm_extra = \"--wrap=id\"", "slurm_extra must be a table of sbatch options"),
    ("[slurm.\"train\\nid\"]\naccount = \"lab\"", "a sub-table 'train\\nid': a sub-table is named after a stage"),
])
def test_absurd_or_unknown_slurm_values_are_refused_when_the_suite_is_read(tmp_path, line, message):
    path = suite_with_slurm(tmp_path / "absurd.toml", line)
    with pytest.raises(SuiteFileError) as raised:
        load_suite(path)
    assert message in str(raised.value)
    assert "Traceback" not in str(raised.value)


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def other_lines(script: str, log_folder: Path) -> list[str]:
    return [line.replace(str(log_folder), "<logs>") for line in script.splitlines()
            if not line.startswith("#SBATCH")]


def assert_one_line_per_option(script: str, plain_script: str, log_folder: Path, plain_log_folder: Path,
                               options: dict[str, object]) -> None:
    """``script`` is ``plain_script`` (the same stage without these options) with one #SBATCH line
    per option added, each read by sbatch's shell-like parsing back as exactly the value given."""
    assert other_lines(script, log_folder) == other_lines(plain_script, plain_log_folder)
    added = sorted(set(sbatch_lines(script)) - set(sbatch_lines(plain_script)))
    assert len(sbatch_lines(script)) == len(sbatch_lines(plain_script)) + len(options), added
    for key, value in options.items():
        expected = f"--{key}" if value is True else f"--{key}={value}"
        assert [shlex.split(line[len("#SBATCH "):]) for line in added].count([expected]) == 1, (key, added)


def script_submitit_writes(config: ExecutorConfig, log_folder: Path) -> str:
    """The sbatch script submitit writes for ``config``'s parameters (the text it hands sbatch)."""
    executor = submitit.SlurmExecutor(folder=log_folder)
    executor.update_parameters(**sbatch_parameters(config, "train", []))
    return executor._make_submission_file_text("python -m job", "uid")


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    """Slurm's commands, standing in for a cluster: sinfo lists two partitions, sbatch saves the
    script it is given and answers with a job id. Returns the folder the scripts are saved in."""
    bin_folder, saved = tmp_path / "bin", tmp_path / "submitted"
    bin_folder.mkdir()
    saved.mkdir()
    commands = {
        "sinfo": 'printf "gpu*|up|gpu:a100:4\\nlong|up|(null)\\n"',
        "scontrol": 'echo "MaxArraySize = 1001"',
        "srun": "exit 1",  # submitit checks that it exists; the jobs never run here
        "sbatch": f'cp "$1" {shlex.quote(str(saved))}/"$(ls {shlex.quote(str(saved))} | wc -l)".sh\n'
                  'echo "Submitted batch job 4242"',
    }
    for name, body in commands.items():
        (bin_folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_folder}:{Path('/usr/bin')}:{Path('/bin')}")
    return saved


def square(number: int) -> int:
    return number * number


def test_the_script_submitted_for_tricky_but_valid_values_has_one_line_per_option(tmp_path, fake_slurm):
    """The whole path: a suite file's [slurm] table, the stage's config, submitit's script, sbatch."""
    toml_lines = "\n".join(f"{key} = {json.dumps(value)}" if not isinstance(value, dict) else
                           f"{key} = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in value.items())} }}"
                           for key, value in TRICKY_SUITE_TABLE.items() if key != "executor")
    suite = load_suite(suite_with_slurm(tmp_path / "tricky.toml", toml_lines))
    config = executor_config_from(None, suite.slurm, stage_name="train")
    plain = ExecutorConfig(executor="slurm", partition="gpu", log_dir=tmp_path / "plain-logs")

    submit_items(square, [1, 2], config.with_changes(log_dir=tmp_path / "logs"), "train")
    submit_items(square, [1, 2], plain, "train")

    scripts = sorted(fake_slurm.iterdir(), key=lambda path: int(path.stem))
    assert len(scripts) == 2  # one sbatch call per stage: a job array of two
    script, plain_script = (path.read_text() for path in scripts)
    options = {"partition": "gpu,long", "account": "lab-1.x_y", "qos": "high_prio",
               "constraint": "[rack1*2&rack2*4]|(a100&ib)", "mem": "15872MB", "reservation": "ours.2",
               "comment": "a comment, with spaces", "exclusive": True, "mail-type": "END,FAIL",
               "mail-user": "me+jobs@example.org", "gres": "gpu:a100:2", "nodelist": "node[1-4,7]",
               "begin": "now+1hour", "nice": "-5", "tmp": "10G"}
    # the plain config names partition gpu too: its line is replaced, not added
    plain_without_partition = "\n".join(line for line in plain_script.splitlines()
                                        if not line.startswith("#SBATCH --partition="))
    assert_one_line_per_option(script, plain_without_partition, tmp_path / "logs" / "train",
                               tmp_path / "plain-logs" / "train", options)
    assert "#SBATCH --constraint='[rack1*2&rack2*4]|(a100&ib)'\n" in script
    assert "#SBATCH --comment='a comment, with spaces'\n" in script


@pytest.mark.parametrize("place", PLACES)
def test_every_value_that_is_accepted_gives_one_line_per_option(tmp_path, monkeypatch, place):
    """Each injection and each fragment of one, with and without the rest: whatever the config
    accepts, the script submitit writes holds it on its own #SBATCH line, read back as given."""
    monkeypatch.setenv("PATH", f"{write_srun(tmp_path)}:/usr/bin:/bin")
    plain = script_submitit_writes(ExecutorConfig(executor="slurm"), tmp_path / "plain")
    fragments = ["\n", "\r", "'", '"', ";", " ", "\t", "$(id)", "`id`", "\\", "#", "&", "|", "*",
                 "[1-2]", "(a)", "!", ",", "=", ":", "@", "+", "/", "%j", "\x0b", "\x1b", "\u2028"]
    values = [f"a{fragment}b" for fragment in fragments] + [INJECTIONS[name].format(marker="/tmp/PWNED")
                                                         for name in INJECTIONS]
    accepted = 0
    for value in values:
        key, option_value = ("reservation", value) if place != "slurm_extra key" else (value, True)
        try:
            if place.startswith("slurm_extra"):
                config = ExecutorConfig(executor="slurm", slurm_extra={key: option_value})
            else:
                config = ExecutorConfig(executor="slurm", **{place: value})
        except ExecutorConfigError:
            continue
        accepted += 1
        option = {place: value} if not place.startswith("slurm_extra") else dict(config.slurm_extra)
        script = script_submitit_writes(config, tmp_path / "logs")
        assert_one_line_per_option(script, plain, tmp_path / "logs", tmp_path / "plain", option)
    # the names and operators Slurm documents are accepted where it takes them
    assert accepted == {"partition": 1, "account": 0, "qos": 0, "constraint": 5,
                        "slurm_extra key": 0, "slurm_extra value": 1}[place]


def write_srun(tmp_path: Path) -> Path:
    folder = tmp_path / "srun-bin"
    folder.mkdir(exist_ok=True)
    (folder / "srun").write_text("#!/bin/sh\nexit 1\n")
    (folder / "srun").chmod(0o755)
    return folder


def test_a_log_folder_with_a_line_break_is_refused_before_anything_is_submitted(tmp_path, fake_slurm,
                                                                                monkeypatch):
    """The log folder is written into the script too (--output, --error); a suite cannot choose
    it, but a runs folder or working folder can hold a line break."""
    with pytest.raises(ExecutorConfigError, match=r"log_dir \(--log-dir\) must be a path without line breaks"):
        ExecutorConfig(executor="slurm", log_dir=tmp_path / "logs\nid")
    working = tmp_path / "work\nid"
    working.mkdir()
    monkeypatch.chdir(working)
    before = listing(tmp_path)
    with pytest.raises(ExecutorConfigError) as raised:
        submit_items(square, [1], ExecutorConfig(executor="slurm", partition="gpu"), "train")
    assert str(raised.value).startswith("the Slurm log folder (--log-dir, or the runs folder it is under) must "
                                        f"be a path without line breaks or other control characters, got "
                                        f"{str(working / 'runs' / 'slurm-logs' / 'train')!r}")
    assert listing(tmp_path) == before and list(fake_slurm.iterdir()) == []
