"""Worker processes that end with the process that started them.

Every process pool the project makes comes from ``worker_pool``: a stage's local items
(slurm/executor.py, ``--jobs N``) and the synthetic world's generation (``map_in_processes``).
A pool's workers would otherwise outlive a killed run: after ``kill -9`` of the main process they
kept computing their queued items, then waited for more, for good. Here each worker

- asks the kernel for SIGKILL when its parent dies (Linux: ``prctl(PR_SET_PDEATHSIG)``), then
  checks that the parent is still the one that started it, since it may have died before;
- watches its parent from a thread (``os.getppid()`` changes when the parent dies): the only
  guard where there is no PR_SET_PDEATHSIG, and a second one where there is;
- ignores SIGINT and takes SIGTERM's default: Ctrl-C reaches the whole process group, and the
  parent, not each worker, decides what to stop (``worker_pool`` kills its workers when the
  block it guards raises, KeyboardInterrupt included); a SIGTERM handler a worker inherited
  through fork (submitit's ignores it) does not keep it alive.

PR_SET_PDEATHSIG fires when the *thread* that started the worker ends, not the process. A
ProcessPoolExecutor starts its workers from the thread that submits (spawn: on demand, in
``submit``; fork: all at once, at the first ``submit``); its manager thread starts workers only
to replace those that ended after ``max_tasks_per_child`` tasks, which no pool here sets. The
submitting thread waits in the ``with`` block until the pool is shut down, so no worker outlives
the thread that started it.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_SECONDS = 0.5


def _ask_kernel_to_kill_on_parent_death() -> bool:
    """PR_SET_PDEATHSIG(SIGKILL) for this process; False where the kernel has none."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)  # no cleanup: what a worker would clean up belongs to the dead run


def end_with_parent(parent_pid: int, worker_id: int | None = None) -> None:
    """Make this process (a worker) end as soon as ``parent_pid``, which started it, ends. Call
    it first thing in the worker; also a DataLoader ``worker_init_fn`` through
    ``functools.partial(end_with_parent, os.getpid())`` (the loader passes ``worker_id``)."""
    _ask_kernel_to_kill_on_parent_death()
    if os.getppid() != parent_pid:  # the parent died before the kernel was asked to watch it
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="watch-parent",
                     daemon=True).start()


def _start_worker(parent_pid: int, initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    end_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if initializer is not None:
        initializer(*initargs)


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL every worker of ``pool`` and cancel what it has not started: for a run that is
    being interrupted, where waiting for the items in progress would keep it alive."""
    if hasattr(pool, "kill_workers"):  # Python >= 3.14
        pool.kill_workers()
    else:
        for process in list((pool._processes or {}).values()):
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def worker_pool(workers: int, start_method: str = "spawn",
                initializer: Callable[..., Any] | None = None,
                initargs: tuple = ()) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor of ``workers`` processes that end with this process (module
    docstring). On leaving the block normally, what was not started is cancelled and the items
    in progress are waited for; if the block raises (KeyboardInterrupt included), the workers
    are killed first."""
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start_method),
                               initializer=_start_worker,
                               initargs=(os.getpid(), initializer, initargs))
    try:
        yield pool
    except BaseException:
        kill_workers(pool)
        raise
    pool.shutdown(wait=True, cancel_futures=True)
