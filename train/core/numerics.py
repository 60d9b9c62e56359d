"""The numeric mode: which CPU kernels every stage runs.

PyTorch, oneDNN, MKL, NumPy and OpenBLAS each pick their kernels by the CPU's instruction set when
they first run: an AVX-512 machine rounds differently from an AVX2 one, and four epochs of training
turn that into other weights, other explanations and other verdicts. Two modes:

- ``portable`` (the default): every library is capped at AVX2 with FMA (Haswell, 2013; every AMD
  Zen), which every x86-64 machine the project meets has. One commit computes the same bits on any
  such CPU, so a table is a fixed measurement that two labs can place side by side.
- ``native``: each library picks its fastest kernels. The same seed gives the same bits on one
  machine, not across instruction sets. Artifacts made so are keyed by the instruction set
  (``key_tag``), so a portable run never finds them, nor a native run on another kind of CPU.

The mode is a property of the process and of every process it starts: the libraries read their
settings from the environment when they first run, so ``configure()`` writes them into
``os.environ`` when ``counteraudit`` is first imported (``counteraudit.train``'s ``__init__``),
before any kernel has run, and children inherit them: local workers, and Slurm jobs, which also
get them as ``export`` lines of their batch script (slurm/job_environment.py).
``COUNTERAUDIT_NUMERICS`` (``portable`` or ``native``) chooses; an entry script's ``--numerics``
sets it before its first kernel runs (NumPy, loaded by then, keeps its caps in both modes).

A GPU run is outside this mode: CUDA kernels are not pinned, and a model trained on a GPU records
the device it was trained on instead.

This module imports neither torch nor NumPy at its top, so it can run before them.
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from counteraudit.slurm import job_environment

ENV_VAR = "COUNTERAUDIT_NUMERICS"
MODES = ("portable", "native")
DEFAULT_MODE = "portable"

# The instruction set every x86-64 CPU the project meets has, and each library's switch that caps
# its kernels there. evaluate/benchmarks/numerics.py hashes the ops each one pins, per mode.
PORTABLE_ENVIRONMENT = {
    # ATen's vectorised CPU kernels (elementwise ops, reductions, batch norm, pooling, softmax).
    "ATEN_CPU_CAPABILITY": "avx2",
    # oneDNN's JIT kernels (convolutions, on the CPU).
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # MKL's GEMMs (linear layers, ATen's own convolution) and vector maths: MKL's conditional
    # numerical reproducibility. Its AVX2 branch is not one code path: MKL runs another one on AMD
    # CPUs (measured: an Intel Xeon under MKL_CBWR=AVX2 and an AMD EPYC gave other linear-layer
    # bits), while COMPATIBLE is the branch both vendors run alike.
    "MKL_CBWR": "COMPATIBLE",
}
# NumPy reads its caps when it loads, which every counteraudit module makes it do, so they hold in
# both modes: the worlds it draws (NumPy and PIL only) are the same bits in either, and their cost
# is a small part of a run.
NUMPY_ENVIRONMENT = {
    # NumPy's dispatched SIMD loops (its transcendental functions and sorts have AVX-512 variants).
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL "
                                "AVX512_ICL AVX512_SPR",
    # NumPy's BLAS (OpenBLAS picks a kernel per CPU model).
    "OPENBLAS_CORETYPE": "Haswell",
    # and splits a product by its thread count, each split rounding its own way (a float32 product
    # differed on each of 1, 2, 3, 4 and 8 threads): one thread, whatever the machine has. A work
    # item runs on its suite's recipe.cpu_threads instead (train/core/threads.py).
    "OPENBLAS_NUM_THREADS": "1",
}
# Part of every portable artifact's key: bump it when a change of the caps changes what is computed.
PORTABLE_VERSION = 1
# What portable mode needs of the CPU (Linux's names in /proc/cpuinfo).
REQUIRED_FLAGS = ("avx2", "fma")


class NumericsError(ValueError):
    """The numeric mode cannot be what was asked: an unknown mode, a CPU without AVX2, or the
    kernels already chosen before the mode was set."""


def requested_mode() -> str:
    mode = os.environ.get(ENV_VAR, "").strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        raise NumericsError(f"${ENV_VAR}={os.environ[ENV_VAR]!r} is not a numeric mode; use one of: "
                            f"{', '.join(MODES)} (or --numerics)")
    return mode


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def instruction_set(flags: set[str] | None = None) -> str:
    """The widest vector instruction set the kernels could pick on this CPU: avx512, avx2 or
    older (what a native artifact's key names)."""
    flags = cpu_flags() if flags is None else flags
    if "avx512f" in flags:
        return "avx512" + ("-amx" if "amx_tile" in flags else "")
    if "avx2" in flags:
        return "avx2"
    return platform.machine() or "unknown"


def configure(mode: str | None = None) -> str:
    """Make this process, and every process it starts, compute in ``mode`` (default: the one
    ``$COUNTERAUDIT_NUMERICS`` asks for, else portable). Returns the mode.

    Portable writes ``PORTABLE_ENVIRONMENT`` into the environment, over any value there (a
    portable run must not inherit a cap to another instruction set). It must run before torch
    picks its kernels; where torch was imported first and already picked another, it raises."""
    if mode is not None:
        if mode not in MODES:
            raise NumericsError(f"numeric mode {mode!r} is unknown; use one of: {', '.join(MODES)}")
        os.environ[ENV_VAR] = mode
    mode = requested_mode()
    job_environment.carry(ENV_VAR, *NUMPY_ENVIRONMENT, *PORTABLE_ENVIRONMENT)
    os.environ[ENV_VAR] = mode  # explicit for every child and Slurm job
    os.environ.update(NUMPY_ENVIRONMENT)  # for the children, if this process loaded NumPy already
    if mode == "native":
        for name in PORTABLE_ENVIRONMENT:  # back to what the environment had before portable
            if name in _BEFORE:
                os.environ[name] = _BEFORE[name]
            else:
                os.environ.pop(name, None)
        return mode
    if platform.machine() in ("x86_64", "AMD64"):
        missing = [flag for flag in REQUIRED_FLAGS if flag not in cpu_flags()]
        if missing and cpu_flags():
            raise NumericsError(
                f"portable numerics needs AVX2 with FMA, and this CPU ({cpu_model()}) lacks "
                f"{', '.join(missing)}; run with --numerics native (its results are then this "
                "machine's own, keyed apart)")
    for name in PORTABLE_ENVIRONMENT:
        if name in os.environ and os.environ[name] != PORTABLE_ENVIRONMENT[name]:
            _BEFORE.setdefault(name, os.environ[name])
    os.environ.update(PORTABLE_ENVIRONMENT)
    if "torch" in sys.modules:
        _check_torch_capability()
    return mode


# The values portable mode replaced, restored if the process switches to native before its first
# kernel (an entry script's --numerics native).
_BEFORE: dict[str, str] = {}


def _check_torch_capability() -> None:
    """torch picks its ATen kernels once, at its first use of them: where it already has, they
    must be the portable ones."""
    import torch  # noqa: PLC0415  (already imported: sys.modules says so)
    picked = torch.backends.cpu.get_cpu_capability().lower()
    if picked in (PORTABLE_ENVIRONMENT["ATEN_CPU_CAPABILITY"], "default"):
        return
    raise NumericsError(
        f"torch already runs its {picked.upper()} kernels in this process, so portable numerics "
        "cannot pin them: import counteraudit before running anything in torch, or set "
        f"{ENV_VAR}=portable and ATEN_CPU_CAPABILITY=avx2 in the environment")


def check_in_effect() -> None:
    """In portable mode, that the kernels torch and NumPy already chose are the portable ones (an
    entry point calls it before any work): a library loaded before ``configure`` keeps its own."""
    if not is_portable():
        return
    if "torch" in sys.modules:
        _check_torch_capability()
    if "numpy" in sys.modules and numpy_uses_avx512():
        raise NumericsError(
            "NumPy was loaded before counteraudit set the numeric mode, and runs its AVX-512 loops, "
            "so portable numerics cannot pin them: import counteraudit before NumPy and torch, or "
            "set these in the environment: " + " ".join(
                f"{name}='{value}'" for name, value in NUMPY_ENVIRONMENT.items()))


RESTARTED_VAR = "COUNTERAUDIT_NUMERICS_RESTARTED"


def restart_in_effect() -> None:
    """Start this command again in a fresh interpreter whose environment holds the mode's
    settings from its first instruction: for a process where NumPy or torch loaded before
    counteraudit (a ``.pth`` file or ``sitecustomize`` that imports them, a caller's own
    imports). Once only: a second failure is raised."""
    if os.environ.get(RESTARTED_VAR):
        return
    os.environ[RESTARTED_VAR] = "1"
    print("counteraudit: NumPy or torch loaded before the numeric mode was set; starting the "
          "command again with it in the environment", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def numpy_uses_avx512() -> bool:
    """Whether NumPy runs any of its AVX-512 loops: a dispatch target it was built with that is
    enabled at run time (NPY_DISABLE_CPU_FEATURES turns them off when NumPy loads)."""
    import numpy  # noqa: PLC0415  (already loaded where this is asked)
    umath = numpy._core._multiarray_umath
    enabled = [target for target in getattr(umath, "__cpu_dispatch__", ())
               if umath.__cpu_features__.get(target)]
    return any(target.startswith(("AVX512", "X86_V4")) for target in enabled)


def is_portable() -> bool:
    return requested_mode() == "portable"


def key_tag() -> dict[str, str]:
    """What an artifact's key holds of the numeric mode: the portable caps' version, or the
    instruction set whose native kernels made it. A model made before modes existed has neither,
    so no portable or native run ever takes it for its own (its bits are the native ones of
    whatever CPU made it)."""
    if is_portable():
        return {"numerics": f"portable-v{PORTABLE_VERSION}"}
    return {"numerics": "native-" + instruction_set()}


def record(device: Any = None) -> dict[str, Any]:
    """What an artifact records of how it was computed: the mode, the kernels torch ran, the
    machine's instruction set and CPU, the library versions; on a GPU, the device instead of a
    mode (CUDA kernels are not pinned)."""
    import numpy  # noqa: PLC0415  (kept off this module's top: configure() runs before NumPy loads)
    import torch  # noqa: PLC0415
    facts: dict[str, Any] = {
        "mode": requested_mode(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "instruction_set": instruction_set(), "cpu": cpu_model(),
        "torch": torch.__version__, "numpy": numpy.__version__,
        "numpy_avx512": numpy_uses_avx512(),
    }
    if device is not None and getattr(device, "type", str(device)) == "cuda":
        facts["mode"] = "gpu"
        facts["device"] = torch.cuda.get_device_name(device)
    return facts
