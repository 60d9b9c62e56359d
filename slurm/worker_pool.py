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

Starting a worker costs an interpreter and its imports: about 7 CPU-s where a stage imports torch
and torchvision, more than many items compute. ``PRELOADED`` starts them from one server per run
(multiprocessing's forkserver) that imported, once, every counteraudit module the run had loaded
(they load torch and torchvision) and the item function's module. Each worker is a fork of that
server: a fresh interpreter's state, as a spawned worker's, in a fraction of a CPU-second. Two
things differ from spawn, and are handled here:

- the server, not the run, is the worker's parent, and it outlives the run while any worker
  does; so such a worker watches the run itself (a pidfd: the kernel says when it ends), after
  checking that its server's parent is the run; and it takes the run's environment as it is when
  the pool starts;
- a library reads some variables once, when the server loads it (the numeric mode's caps:
  slurm/job_environment.py's carried variables), so a pool whose carried values differ from those
  the server started with is spawned instead.

Where there is no forkserver or no pidfd (not Linux, or Linux before 5.3), ``PRELOADED`` spawns.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from counteraudit.slurm import job_environment

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_SECONDS = 0.5
# The start method of workers forked from a server that imported the run's modules once.
PRELOADED = "preloaded"


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


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _watch_process(pidfd: int) -> None:
    select.select([pidfd], [], [])  # readable once the process has ended
    os._exit(1)


def end_with_run(run_pid: int) -> None:
    """Make this worker, forked by the run's preloading server (its parent), end as soon as
    the run ``run_pid`` ends."""
    try:
        pidfd = os.pidfd_open(run_pid)
    except ProcessLookupError:
        os._exit(1)
    if _parent_of(os.getppid()) != run_pid:  # the run ended before: the server has another parent
        os._exit(1)
    threading.Thread(target=_watch_process, args=(pidfd,), name="watch-run", daemon=True).start()


def _start_worker(parent_pid: int, environment: dict[str, str] | None,
                  initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    if environment is None:
        end_with_parent(parent_pid)
    else:  # forked from the preloading server: the run's environment as it is now
        end_with_run(parent_pid)
        os.environ.clear()
        os.environ.update(environment)
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


# The carried variables' values when this process's preloading server was asked for; None
# before that.
_server_environment: dict[str, str | None] | None = None


def _carried_values() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in job_environment.carried()}


def _kernel_has_pidfd() -> bool:
    """Whether this Python and this kernel give pidfds (Linux 5.3 on; a cluster's older kernel
    refuses the call that Python has)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def start_context(start_method: str, preload: tuple[str, ...] = ()) -> multiprocessing.context.BaseContext:
    """The multiprocessing context ``worker_pool`` starts its workers from: ``start_method``'s, or
    for ``PRELOADED`` the forkserver's, preloading ``__main__`` and ``preload`` the first time,
    or spawn's where that server cannot serve (module docstring)."""
    global _server_environment
    if start_method != PRELOADED:
        return multiprocessing.get_context(start_method)
    if "forkserver" not in multiprocessing.get_all_start_methods() or not _kernel_has_pidfd():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    if _server_environment is None:
        package = __name__.split(".")[0]
        ours = [name for name in sys.modules if name == package or name.startswith(package + ".")]
        context.set_forkserver_preload(["__main__", *ours, *preload])  # in the order they loaded
        _server_environment = _carried_values()
    elif _server_environment != _carried_values():
        return multiprocessing.get_context("spawn")
    return context


@contextmanager
def worker_pool(workers: int, start_method: str = "spawn",
                initializer: Callable[..., Any] | None = None,
                initargs: tuple = (), preload: tuple[str, ...] = ()) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor of ``workers`` processes that end with this process (module
    docstring). ``preload``: modules a ``PRELOADED`` server imports, beside ``__main__``. On
    leaving the block normally, what was not started is cancelled and the items in progress are
    waited for; if the block raises (KeyboardInterrupt included), the workers are killed first."""
    context = start_context(start_method, preload)
    environment = dict(os.environ) if context.get_start_method() == "forkserver" else None
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                               initargs=(os.getpid(), environment, initializer, initargs))
    try:
        yield pool
    except BaseException:
        kill_workers(pool)
        raise
    pool.shutdown(wait=True, cancel_futures=True)
