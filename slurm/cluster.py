"""What the Slurm cluster this machine talks to offers: is it reachable, its partitions, their GPUs.

Every query goes through Slurm's own commands (`sinfo`), so it sees the same cluster that
`sbatch` and submitit will use: the one named by SLURM_CONF, else /etc/slurm/slurm.conf.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from counteraudit.slurm.errors import SlurmUnreachableError

LOCAL_CLUSTER_SCRIPT = Path(__file__).resolve().parent / "local_cluster.sh"
REQUIRE_SLURM_ENV = "COUNTERAUDIT_REQUIRE_SLURM"
_SINFO_TIMEOUT_SECONDS = 20


@dataclass(frozen=True)
class Partition:
    name: str
    is_default: bool
    is_up: bool
    max_gpus_per_node: int  # 0 when its nodes declare no GPU generic resources
    gres: tuple[str, ...]  # raw `sinfo -o %G` values, for error messages


def _how_to_reach_a_cluster() -> str:
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF is unset, so /etc/slurm/slurm.conf is used"
    return (
        f"({where}). Start the local test cluster with `{LOCAL_CLUSTER_SCRIPT} start` (as root), "
        "or point SLURM_CONF at your cluster's slurm.conf, or use --executor local."
    )


def _run_sinfo(*arguments: str) -> str:
    if shutil.which("sinfo") is None:
        raise SlurmUnreachableError(
            "Slurm's `sinfo` is not on PATH: this machine has no Slurm client tools. "
            "Install them (Debian: apt-get install slurm-client, or slurm-wlm for a local cluster) "
            "or use --executor local."
        )
    command = ["sinfo", *arguments]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=_SINFO_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmUnreachableError(
            f"The Slurm controller did not answer `{' '.join(command)}` within "
            f"{_SINFO_TIMEOUT_SECONDS} s {_how_to_reach_a_cluster()}"
        ) from None
    if completed.returncode != 0:
        # sinfo's last line is its conclusion ("Unable to contact slurm controller", "fatal: ...").
        stderr_lines = [line.strip() for line in completed.stderr.splitlines() if line.strip()]
        said = stderr_lines[-1] if stderr_lines else f"exit code {completed.returncode}"
        raise SlurmUnreachableError(
            f"The Slurm controller is unreachable: `{' '.join(command)}` failed with: {said} "
            f"{_how_to_reach_a_cluster()}"
        )
    return completed.stdout


DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize


def max_array_size() -> int:
    """How many tasks one job array may hold: the cluster's MaxArraySize (task indices run from 0
    to MaxArraySize - 1), Slurm's default if the configuration does not say."""
    try:
        completed = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                                   timeout=_SINFO_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_MAX_ARRAY_SIZE
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", completed.stdout, re.MULTILINE)
    return int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE


def why_slurm_unavailable() -> str | None:
    """The reason the cluster can't be used, or None when it can."""
    try:
        _run_sinfo("-h", "-o", "%P")
    except SlurmUnreachableError as error:
        return str(error)
    return None


def _gpus_in_gres(gres: str) -> int:
    """GPU count of one node's gres string, e.g. 'gpu:a100:4(S:0-1),shard:8' -> 4, '(null)' -> 0."""
    total = 0
    for resource in gres.split(","):
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", resource.strip())
        if match:
            total += int(match.group(1))
    return total


def list_partitions() -> list[Partition]:
    """The cluster's partitions (default one marked), with the most GPUs any of their nodes has."""
    by_name: dict[str, dict] = {}
    # One line per (partition, node group); %G is the nodes' generic resources (GPUs).
    for line in _run_sinfo("-h", "-o", "%P|%a|%G").splitlines():
        if not line.strip():
            continue
        name, availability, gres = line.split("|", 2)
        is_default = name.endswith("*")
        name = name.rstrip("*")
        entry = by_name.setdefault(name, {"is_default": False, "is_up": False, "max_gpus": 0, "gres": []})
        entry["is_default"] |= is_default
        entry["is_up"] |= availability.strip() == "up"
        entry["max_gpus"] = max(entry["max_gpus"], _gpus_in_gres(gres))
        entry["gres"].append(gres.strip())
    return [
        Partition(
            name=name,
            is_default=entry["is_default"],
            is_up=entry["is_up"],
            max_gpus_per_node=entry["max_gpus"],
            gres=tuple(dict.fromkeys(entry["gres"])),
        )
        for name, entry in by_name.items()
    ]
