"""Which kernels give the same bits on every CPU: the SHA-256 of each op's forward and backward
output, and of a few training steps of the demo's model, in this process's numeric mode.

    python evaluate/benchmarks/numerics.py --out a.json --time       # portable (the default)
    COUNTERAUDIT_NUMERICS=native python evaluate/benchmarks/numerics.py --out b.json --time
    python evaluate/benchmarks/numerics.py --compare a.json c.json   # c.json: another machine's

Run it on two machines in one mode and compare: an op whose digest differs is a kernel the mode
does not pin (the bisection of train/README.md, "Portable numerics"). Each op also runs on one
and on two threads: an op whose digest moves with the thread count must run on a fixed count.
Timings (``--time``) compare the two modes' cost of one training step on this CPU.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.train.architectures import build_model
from counteraudit.train.core import numerics
from counteraudit.train.core.command_line import run_cli


def digest(*tensors: torch.Tensor | np.ndarray) -> str:
    sha = hashlib.sha256()
    for tensor in tensors:
        array = tensor.detach().contiguous().numpy() if isinstance(tensor, torch.Tensor) else tensor
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()[:16]


def _inputs(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _forward_backward(op: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> str:
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    out = op(*leaves)
    out.backward(_inputs(*out.shape, seed=99).to(out.dtype))
    return digest(out, *(leaf.grad for leaf in leaves))


def _conv(channels_last: bool, mkldnn: bool) -> str:
    x, w = _inputs(64, 32, 32, 32), _inputs(64, 32, 3, 3, seed=1) * 0.1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        return _forward_backward(lambda a, b: F.conv2d(a, b, padding=1), x, w)


def _batch_norm() -> str:
    x = _inputs(64, 32, 16, 16)
    return _forward_backward(lambda a: F.batch_norm(a, None, None, training=True), x)


def _training_steps(steps: int = 3, mkldnn: bool = True) -> str:
    """The demo's recipe on random data: small_resnet at 64 px, batch 64, SGD with momentum and
    weight decay, channels_last, as the trainer runs it."""
    torch.manual_seed(0)
    model = build_model("small_resnet", 10, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(1)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        for _ in range(steps):
            images = torch.rand(64, 3, 64, 64, generator=generator).contiguous(
                memory_format=torch.channels_last)
            labels = torch.randint(10, (64,), generator=generator)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
    return digest(*model.state_dict().values())


def op_digests() -> dict[str, str]:
    x = _inputs(256, 512)
    probes: dict[str, Callable[[], str]] = {
        "conv2d (oneDNN, channels_last)": lambda: _conv(True, True),
        "conv2d (oneDNN, contiguous)": lambda: _conv(False, True),
        "conv2d (ATen, channels_last)": lambda: _conv(True, False),
        "linear (MKL GEMM)": lambda: _forward_backward(
            lambda a, b: F.linear(a, b), x, _inputs(100, 512, seed=2)),
        "batch_norm (training)": _batch_norm,
        "relu + max_pool2d": lambda: _forward_backward(
            lambda a: F.max_pool2d(F.relu(a), 3, 2, 1), _inputs(64, 32, 32, 32)),
        "adaptive_avg_pool2d": lambda: _forward_backward(
            lambda a: F.adaptive_avg_pool2d(a, 1), _inputs(64, 256, 8, 8)),
        "cross_entropy": lambda: _forward_backward(
            lambda a: F.cross_entropy(a, torch.arange(256) % 512), x),
        "sum of 1e6": lambda: digest(_inputs(1_000_000).sum()),
        "exp, log, tanh (ATen)": lambda: digest(x.exp(), x.abs().log(), x.tanh()),
        "numpy exp, sin, log float32": lambda: digest(*(f(x.numpy()) for f in (np.exp, np.sin, np.log1p))),
        "numpy exp, sin, log float64": lambda: digest(*(f(x.double().numpy()) for f in (np.exp, np.sin, np.log1p))),
        "numpy matmul (OpenBLAS)": lambda: digest(x.double().numpy() @ x.double().numpy().T),
        "3 training steps of small_resnet (oneDNN)": lambda: _training_steps(3, True),
        "3 training steps of small_resnet (ATen conv)": lambda: _training_steps(3, False),
    }
    results = {}
    for name, probe in probes.items():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results[f"{name} [{threads} thread{'s' if threads > 1 else ''}]"] = probe()
    return results


def step_seconds(mkldnn: bool, repeats: int = 5) -> float:
    """The fastest of ``repeats`` training steps of the demo's model, one thread."""
    torch.set_num_threads(1)
    _training_steps(1, mkldnn)  # warm-up: first-call kernel setup
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        _training_steps(1, mkldnn)
        best = min(best, time.perf_counter() - started)
    return best


def compare(a: dict, b: dict) -> int:
    print(f"A: {a['machine']['cpu']} ({a['machine']['instruction_set']}), mode {a['machine']['mode']}, "
          f"torch {a['machine']['torch']} {a['machine']['torch_cpu_capability']}")
    print(f"B: {b['machine']['cpu']} ({b['machine']['instruction_set']}), mode {b['machine']['mode']}, "
          f"torch {b['machine']['torch']} {b['machine']['torch_cpu_capability']}")
    differ = 0
    for name, value in a["ops"].items():
        other = b["ops"].get(name)
        same = value == other
        differ += not same
        print(f"  {'same' if same else 'DIFFERS':8s} {name}: {value} {other}")
    return differ


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("numerics", __doc__, add_help)
    parser.add_argument("--out", type=Path, help="write the digests (and timings) as JSON here")
    parser.add_argument("--time", action="store_true", help="also time one training step per conv backend")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                        help="compare two files this script wrote; exit 1 if any op differs")
    return parser


def main(args: argparse.Namespace) -> int:
    if args.compare:
        a, b = (json.loads(path.read_text()) for path in args.compare)
        return 1 if compare(a, b) else 0
    result = {"machine": numerics.record(), "ops": op_digests()}
    if args.time:
        result["step_seconds"] = {"oneDNN": step_seconds(True), "ATen conv": step_seconds(False)}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, get_args_parser()))
