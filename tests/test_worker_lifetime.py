"""Worker processes end with the run that started them: after SIGKILL or SIGTERM of the main
process, or Ctrl-C, no worker is left computing or waiting (they used to outlive a killed run for
good). Both kinds of pool: a stage's local items (--jobs) and the synthetic world's generation."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from counteraudit.slurm.worker_pool import PRELOADED, start_context
from tests.conftest import REPO

JOBS = 2
ITEMS = 8
ITEM_SECONDS = 60  # far longer than the test: an item that finishes means a worker was not stopped


def sleeping_item(folder: str) -> None:
    """A work item that says which process runs it, then works for a long time."""
    (Path(folder) / f"started-{os.getpid()}").touch()
    time.sleep(ITEM_SECONDS)


def run_sleeping_stage(folder: str, pool: str) -> None:
    """The run the tests kill: ITEMS sleeping items on JOBS worker processes. The pools are
    imported here, in the killed process only: the test process never needs them."""
    if pool == "stage":
        from counteraudit.slurm.executor import ExecutorConfig, run_items  # noqa: PLC0415
        run_items(sleeping_item, [folder] * ITEMS, ExecutorConfig(local_jobs=JOBS), "sleep")
    else:
        from counteraudit.train.worlds.synthetic_images import map_in_processes  # noqa: PLC0415
        map_in_processes(sleeping_item, [folder] * ITEMS, workers=JOBS)


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, their children...), by pid, with its start time."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = process_stat(int(entry))
            if stat is not None:
                parents.setdefault(int(stat[1]), []).append(int(entry))
    found, todo = {}, list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        stat = process_stat(child)
        if stat is not None:
            found[child] = stat[19]
            todo += parents.get(child, [])
    return found


def process_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...), None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def alive(processes: dict[int, str]) -> list[int]:
    """Those of ``processes`` still running (a zombie has ended; a reused pid is another one)."""
    living = []
    for pid, started in processes.items():
        stat = process_stat(pid)
        if stat is not None and stat[0] != "Z" and stat[19] == started:
            living.append(pid)
    return living


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds processes in /proc")
@pytest.mark.parametrize("pool", ["stage", "world"])
# SIGKILL (nothing runs in the parent) and Ctrl-C (the parent's own shutdown); SIGTERM takes
# the same path as SIGKILL here (measured: none left 0.06-0.17 s after it)
@pytest.mark.parametrize("stop", ["SIGKILL", "Ctrl-C"])
def test_no_worker_outlives_its_run(tmp_path, pool, stop):
    log = tmp_path / "run.log"  # a file, not a pipe: a worker left behind would hold a pipe open
    with open(log, "w") as output:
        run = subprocess.Popen(
            # Ctrl-C raises KeyboardInterrupt in the run even where this test was started with
            # SIGINT ignored (a shell's background job), which the run would inherit
            [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                                   "from tests.test_worker_lifetime import run_sleeping_stage; "
                                   "run_sleeping_stage(*sys.argv[1:])",
             str(tmp_path), pool],
            cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own process group, as a shell gives a command
    below: dict[int, str] = {}
    try:
        wait_for(lambda: len(list(tmp_path.glob("started-*"))) == JOBS, 120, f"{JOBS} items to start")
        workers = {int(p.name.split("-")[1]) for p in tmp_path.glob("started-*")}
        below = descendants(run.pid)
        assert workers <= set(below), (workers, below)
        stopped_at = time.monotonic()
        if stop == "Ctrl-C":
            os.killpg(run.pid, signal.SIGINT)  # what a terminal sends its foreground group
        else:
            os.kill(run.pid, getattr(signal, stop))
        run.wait(timeout=30)
        wait_for(lambda: not alive(below), 10, f"the processes {alive(below)} to end")
        ended_after = time.monotonic() - stopped_at
    finally:  # a failed test leaves nothing running either
        if run.poll() is None:
            run.kill()
        for pid in alive(below):  # checked by start time: these very processes
            os.kill(pid, signal.SIGKILL)
        run.wait()
    print(f"{pool}, {stop}: {len(below)} processes below the run ({len(workers)} busy workers), "
          f"none left {ended_after:.2f}s after the signal")
    assert len(list(tmp_path.glob("started-*"))) == JOBS, "a worker started another item"
    if stop == "Ctrl-C":
        assert "KeyboardInterrupt" in log.read_text(), log.read_text()[-2000:]


def worker_facts(_item: int) -> dict:
    """What a worker says of itself: its parent, the CPU it spent before its item, and the
    environment it runs in."""
    time.sleep(1)  # every worker of the pool gets an item
    return {"pid": os.getpid(), "parent": os.getppid(), "cpu": time.process_time(),
            "marker": os.environ.get("WORKER_TEST_MARKER")}


def preloaded_pools() -> list[list[dict]]:
    """Three preloaded pools of a run, one after the other: the second after an environment
    change, the third after a change of a variable a library reads when it loads."""
    from counteraudit.slurm import job_environment  # noqa: PLC0415  (in the run only)
    from counteraudit.slurm.worker_pool import PRELOADED, worker_pool  # noqa: PLC0415
    pools = []
    for marker, carried in (("first", "1"), ("second", "1"), ("third", "2")):
        os.environ["WORKER_TEST_MARKER"] = marker
        os.environ["WORKER_TEST_CARRIED"] = carried
        job_environment.carry("WORKER_TEST_CARRIED")
        with worker_pool(JOBS, PRELOADED, preload=(__name__,)) as pool:
            pools.append(list(pool.map(worker_facts, range(JOBS))))
    return pools


def test_preloaded_workers_fork_from_one_server_in_the_runs_environment_of_the_moment():
    """A stage's workers (PRELOADED) are forks of one server the run started, which had imported
    torch and the stage: they start in a fraction of a CPU-second where a spawned worker takes
    seconds. Each sees the run's environment when its pool started; where a variable that a
    library reads once at load has changed since the server started, the pool is spawned."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, os, counteraudit.train, counteraudit.slurm.executor; "
                               "from tests.test_worker_lifetime import preloaded_pools; "
                               "print(json.dumps({'run': os.getpid(), 'pools': preloaded_pools()}))"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.splitlines()[-1])
    first, second, third = facts["pools"]
    servers = {worker["parent"] for worker in first + second}
    assert len(servers) == 1 and facts["run"] not in servers, facts
    for worker in first + second:
        assert worker["cpu"] < 1.0, worker  # forked with torch loaded: no interpreter start
    assert {worker["marker"] for worker in first} == {"first"}
    assert {worker["marker"] for worker in second} == {"second"}
    assert {worker["parent"] for worker in third} == {facts["run"]}, third  # spawned
    assert {worker["marker"] for worker in third} == {"third"}
    assert min(worker["cpu"] for worker in third) > max(worker["cpu"] for worker in first + second)


def test_a_kernel_without_pidfds_gets_spawned_workers(monkeypatch):
    """A forked worker watches its run through a pidfd; where the kernel has none (Linux before
    5.3, still on some clusters), the pool is spawned rather than broken."""
    def refused(pid):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(os, "pidfd_open", refused)
    assert start_context(PRELOADED).get_start_method() == "spawn"
