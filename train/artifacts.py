"""Atomic artifact writes, seed derivation and the run-folder layout.

Every write goes to a temporary file in the destination folder and is renamed into place, so a
killed process never leaves a half-written file that a later run would take for a finished one.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

DEFAULT_RUNS_DIR = "runs"


def runs_dir(explicit: str | os.PathLike | None = None) -> Path:
    """Root of all artifacts: --runs-dir, else $COUNTERAUDIT_RUNS, else ./runs."""
    return Path(explicit or os.environ.get("COUNTERAUDIT_RUNS") or DEFAULT_RUNS_DIR)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic(path: Path, write: Callable[[io.BufferedWriter], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it owner-only; give it a normal file's mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic(Path(path), lambda h: h.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    import torch
    return _atomic(Path(path), lambda h: torch.save(obj, h))


def atomic_save_npz(path: str | os.PathLike, **arrays: np.ndarray) -> Path:
    return _atomic(Path(path), lambda h: np.savez(h, **arrays))


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def stable_hash(obj: Any, length: int = 10) -> str:
    """Hash of a JSON-able object that does not depend on dict order or the Python process."""
    text = json.dumps(obj, sort_keys=True, default=_json_default, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any parts (base seed, purpose, epoch, ...), stable across processes."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
