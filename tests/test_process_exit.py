"""A counteraudit process exits as Python exits, less the final garbage collections
(train/core/process_exit.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A handler registered before counteraudit is imported runs after counteraudit's (atexit is last in,
# first out): it sees the heap as the interpreter's final collections will.
PROGRAM = """
import atexit, gc, sys, tempfile
kept = tempfile.TemporaryDirectory(dir=sys.argv[1])
print(kept.name, flush=True)
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count(), flush=True))
import counteraudit.train
print("frozen before exit:", gc.get_freeze_count(), flush=True)
sys.exit(3)
"""


def test_the_heap_is_frozen_at_exit_and_the_exit_is_pythons_own(tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr  # the exit status is the program's
    kept, before, after = done.stdout.splitlines()
    assert before == "frozen before exit: 0"  # nothing is frozen while the process runs
    frozen = int(after.removeprefix("frozen at exit: "))
    assert frozen > 1000, after  # every object the interpreter tracked, modules included
    assert not Path(kept).exists()  # weakref.finalize's atexit handler still removed its folder
    assert not list(tmp_path.iterdir())
