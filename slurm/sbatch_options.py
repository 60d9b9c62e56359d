"""What a suite file or the command line may hand to sbatch, and the values each option takes.

Every value becomes a line `#SBATCH --key=value` of the script that submitit writes and bash
runs on the cluster. submitit quotes the value, but a line break inside the quotes still starts a
new line, which bash runs as a command. So each value is matched, whole, against what Slurm
accepts for its option (sbatch(1)): names from letters, digits, '_', '-' and '.', and only the
operators an option documents. Nothing here allows a quote, a ';', a '$', a backslash, a line
break or any other control character, and only a comment may hold a space.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

# Values longer than this are no Slurm name or specification; the limit keeps a message readable.
MAX_VALUE_LENGTH = 256


@dataclass(frozen=True)
class ValueKind:
    """The values an sbatch option takes: ``pattern`` (matched against the whole text, None: no
    text), whether a bare flag (``true`` in a suite file, ``--slurm-extra KEY`` on the command
    line) is allowed, and ``what`` for messages."""

    what: str
    pattern: str | None = None
    flag: bool = False

    def problem(self, value: Any) -> str | None:
        """None when ``value`` is one this option takes, else what it should be."""
        if value is True:
            return None if self.flag else f"{self.what}, not a bare flag (true)"
        if value is False:
            return "true (a flag), or left out: false is not an sbatch value"
        if isinstance(value, int):  # a TOML integer stands for its digits
            value = str(value)
        if not isinstance(value, str) or self.pattern is None:
            return self.what
        if len(value) > MAX_VALUE_LENGTH or not re.fullmatch(self.pattern, value):
            return self.what
        return None


_NAME = r"[A-Za-z0-9_.\-]+"
_SAFE = "no spaces, quotes, ';' or line breaks"

NAME = ValueKind(f"a name of letters, digits, '_', '-' and '.' ({_SAFE})", _NAME)
NAMES = ValueKind(f"names of letters, digits, '_', '-' and '.', separated by ',' ({_SAFE})",
                  rf"{_NAME}(,{_NAME})*")
# sbatch --constraint: features joined by & (and), | (or), [ ] (matching or, multiple counts),
# * (node count) and ( ) (grouping).
FEATURES = ValueKind("node features (letters, digits, '_', '-', '.') joined by Slurm's operators "
                     f"& | [ ] * ( ), e.g. 'a100|h100' or '[rack1*2&rack2*4]' ({_SAFE})",
                     r"[A-Za-z0-9_.\-&|\[\]*()]+")
CLUSTER_FEATURES = ValueKind("cluster features, optionally preceded by '!', separated by ',' "
                             f"({_SAFE})", rf"!?{_NAME}(,{_NAME})*")
HOSTS = ValueKind(f"node names or ranges, e.g. 'node[1-4,7],gpu01' ({_SAFE})",
                  r"[A-Za-z0-9_.\-\[\],]+")
COUNT = ValueKind("a whole number", r"[0-9]{1,9}")
SIZE = ValueKind("a size: a whole number with an optional unit K, M, G or T, e.g. '4G'",
                 r"[0-9]{1,12}[KMGTkmgt]?")
TIME = ValueKind(f"a Slurm time, e.g. '16:00', 'now+1hour', '2030-01-20T12:34:00' or '2-12:00:00' "
                 f"({_SAFE})", r"[A-Za-z0-9:+\-/T]+")
# Resource specifications (gres, licenses, distribution, binding, frequencies, ...).
SPEC = ValueKind("a Slurm specification of letters, digits and _ . - : , = @ + * / "
                 f"e.g. 'gpu:a100:2' ({_SAFE})", r"[A-Za-z0-9_.\-:,=@+*/]+")
TEXT = ValueKind("text of letters, digits, single spaces and _ . , : / @ + = - "
                 "(no quotes, ';' or line breaks)", r"[A-Za-z0-9_.,:/@+=\-]+( [A-Za-z0-9_.,:/@+=\-]+)*")
FLAG = ValueKind("a flag: true, or leave it out", flag=True)
MAIL_TYPES = ValueKind("mail types separated by ',': NONE, BEGIN, END, FAIL, REQUEUE, ALL, "
                       "INVALID_DEPEND, STAGE_OUT, TIME_LIMIT, TIME_LIMIT_90, TIME_LIMIT_80, "
                       "TIME_LIMIT_50, ARRAY_TASKS",
                       r"(NONE|BEGIN|END|FAIL|REQUEUE|ALL|INVALID_DEPEND|STAGE_OUT|TIME_LIMIT(_90|_80|_50)?"
                       r"|ARRAY_TASKS)(,(NONE|BEGIN|END|FAIL|REQUEUE|ALL|INVALID_DEPEND|STAGE_OUT"
                       r"|TIME_LIMIT(_90|_80|_50)?|ARRAY_TASKS))*")
MAIL_USER = ValueKind("a user name or an e-mail address (letters, digits, _ . + - and one @)",
                      r"[A-Za-z0-9_.+\-]+(@[A-Za-z0-9.\-]+)?")

# sbatch long options a suite's slurm_extra (or --slurm-extra) may set, as sbatch(1) spells
# them. The options this tool sets itself, or that change what sbatch prints or where the job
# reads and writes, are left out on purpose (see RESERVED_OPTIONS).
SLURM_EXTRA_OPTIONS: dict[str, ValueKind] = {
    "acctg-freq": SPEC,
    "batch": FEATURES,
    "begin": TIME,
    "cluster-constraint": CLUSTER_FEATURES,
    "clusters": NAMES,
    "comment": TEXT,
    "contiguous": FLAG,
    "core-spec": COUNT,
    "cores-per-socket": COUNT,
    "cpu-freq": SPEC,
    "cpus-per-gpu": COUNT,
    "deadline": TIME,
    "delay-boot": COUNT,
    "distribution": SPEC,
    "exclude": HOSTS,
    "exclusive": ValueKind("true, or one of user, mcs, topo", r"user|mcs|topo", flag=True),
    "extra-node-info": SPEC,
    "gpu-bind": SPEC,
    "gpu-freq": SPEC,
    "gpus": SPEC,
    "gpus-per-socket": SPEC,
    "gpus-per-task": SPEC,
    "gres": SPEC,
    "gres-flags": SPEC,
    "hint": SPEC,
    "hold": FLAG,
    "licenses": SPEC,
    "mail-type": MAIL_TYPES,
    "mail-user": MAIL_USER,
    "mcs-label": NAME,
    "mem-bind": SPEC,
    "mem-per-cpu": SIZE,
    "mem-per-gpu": SIZE,
    "mincpus": COUNT,
    "network": SPEC,
    "nice": ValueKind("true, or a whole number (may be negative)", r"-?[0-9]{1,9}", flag=True),
    "no-kill": ValueKind("true, or off", r"off", flag=True),
    "no-requeue": FLAG,
    "nodelist": HOSTS,
    "ntasks": COUNT,
    "ntasks-per-core": COUNT,
    "ntasks-per-gpu": COUNT,
    "ntasks-per-socket": COUNT,
    "overcommit": FLAG,
    "oversubscribe": FLAG,
    "power": SPEC,
    "prefer": FEATURES,
    "priority": ValueKind("a whole number, or TOP", r"[0-9]{1,9}|TOP"),
    "profile": SPEC,
    "propagate": ValueKind(f"true, or resource limits separated by ',' ({_SAFE})",
                           rf"{_NAME}(,{_NAME})*", flag=True),
    "reboot": FLAG,
    "requeue": FLAG,
    "reservation": NAMES,
    "sockets-per-node": COUNT,
    "spread-job": FLAG,
    "switches": SPEC,
    "thread-spec": COUNT,
    "threads-per-core": COUNT,
    "time-min": TIME,
    "tmp": SIZE,
    "tres-bind": SPEC,
    "tres-per-task": SPEC,
    "use-min-nodes": FLAG,
    "wait-all-nodes": ValueKind("0 or 1", r"[01]"),
    "wckey": NAME,
}

# Options the executor's own keys set: the fix for a slurm_extra that names one.
OPTIONS_WITH_KEYS = {
    "partition": "partition", "account": "account", "qos": "qos", "constraint": "constraint",
    "time": "time", "nodes": "nodes", "ntasks-per-node": "tasks_per_node",
    "cpus-per-task": "cpus_per_task", "gpus-per-node": "gpus_per_node", "mem": "mem_gb",
}
# Options the executor sets itself, or that would break how it submits and follows the jobs.
RESERVED_OPTIONS = {
    "array": "the executor makes the job array",
    "job-name": "the stage names the jobs",
    "output": "logs go to <log_dir>/<stage>/",
    "error": "logs go to <log_dir>/<stage>/",
    "input": "jobs read no standard input",
    "open-mode": "the executor appends to the logs",
    "signal": "the executor asks for the signal it checkpoints on",
    "dependency": "the executor chains the stages",
    "kill-on-invalid-dep": "the executor sets it with the stages' dependency",
    "wrap": "the job's script is the executor's",
    "chdir": "jobs run where they were submitted",
    "export": "the jobs need the submitting environment",
    "export-file": "the jobs need the submitting environment",
    "get-user-env": "the jobs need the submitting environment",
    "parsable": "the executor reads sbatch's usual answer",
    "quiet": "the executor reads sbatch's usual answer",
    "verbose": "the executor reads sbatch's usual answer",
    "test-only": "the executor needs a job id",
    "wait": "the executor follows the jobs itself",
    "uid": "jobs run as the submitting user",
    "gid": "jobs run as the submitting user",
    "bb": "burst buffer specifications are site-specific text",
    "bbf": "it names a file to read",
    "nodefile": "it names a file to read",
    "container": "it names a path to run",
    "container-id": "it names a container to run",
}


def option_name(key: Any) -> str | None:
    """The sbatch spelling of a slurm_extra key ('mail_type' -> 'mail-type'), None when it is no
    text at all."""
    return key.replace("_", "-") if isinstance(key, str) else None


def option_problem(key: Any) -> str | None:
    """None when ``key`` names an sbatch option slurm_extra may set, else why not and the fix."""
    name = option_name(key)
    if name in SLURM_EXTRA_OPTIONS:
        return None
    if name in OPTIONS_WITH_KEYS:
        key = OPTIONS_WITH_KEYS[name]
        return f"it is set by the key {key!r} (--{key.replace('_', '-')}); use that"
    if name in RESERVED_OPTIONS:
        return f"this tool sets or needs it as it is ({RESERVED_OPTIONS[name]}); remove it"
    close = difflib.get_close_matches(name or "", SLURM_EXTRA_OPTIONS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"it is not an sbatch option slurm_extra takes; {hint}the options it takes: "
            f"{', '.join(SLURM_EXTRA_OPTIONS)}")
