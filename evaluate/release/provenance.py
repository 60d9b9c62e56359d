"""What made a release: the code's version and commit, and the digest every file is named by."""
from __future__ import annotations

import hashlib
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def sha256_bytes(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def code_version() -> dict[str, str]:
    """The package's version and, in a git checkout, its commit ("+dirty" where files differ
    from it); "unknown" outside one (an installed wheel)."""
    version = {"version": metadata.version("counteraudit"), "commit": "unknown"}
    try:  # fixed arguments, no user input: nothing reaches a shell
        commit = subprocess.run(["git", "-C", str(PACKAGE_ROOT), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(PACKAGE_ROOT), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        version["commit"] = commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return version
