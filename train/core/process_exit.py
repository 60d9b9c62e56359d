"""A process's exit without the interpreter's final garbage collections.

A process that imported torch holds a few hundred thousand objects the cyclic garbage collector
tracks. When it exits, CPython collects once more before it tears its modules down, and again
while it does. On the AVX2-only AMD EPYC, a process that imports the explain stage and exits
spends 1.9-2.1 of its 8.2-8.7 CPU-seconds in its exit; frozen, 0.4-0.5
(`evaluate/benchmarks/process_exit.py`, two runs). Every command, spawned worker, forkserver and
Slurm task pays it once, for nothing: the operating system frees the memory anyway.

``gc.freeze()`` at exit moves every tracked object to the generation the collector skips, so those
collections find nothing to traverse. Everything else about the exit is Python's own: the exit
status, the ``atexit`` handlers (logging's, multiprocessing's, ``weakref.finalize``'s, which remove
temporary folders), the flush of stdout and stderr, and the modules' teardown. What it gives up is
a finalizer (``__del__``) of an object in a reference cycle at exit, which Python does not promise
to call anyway; this code closes its files and ends its process groups and pools explicitly.
"""
from __future__ import annotations

import atexit
import gc


def skip_final_collections() -> None:
    """Freeze the heap when this process exits."""
    atexit.register(gc.freeze)
