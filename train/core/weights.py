"""Checkpoints load as weights only: ``torch.load(weights_only=True)`` everywhere, a refused file
named with the Python objects it holds and the command that converts a checkpoint you trust, and
a suite's external checkpoint checked before anything runs."""
from __future__ import annotations

import pickle
import re
import shlex
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from counteraudit.train.core.artifacts import inside_runs


CONVERT_SCRIPT = "train/convert_checkpoint.py"


class CheckpointNotLoaded(ValueError):
    """``torch.load(weights_only=True)`` refused a file or could not read it. ``objects``: the
    Python objects beyond tensors it holds, which were not unpickled (empty: the file is no
    PyTorch checkpoint at all); ``problem``: why, in a few words."""

    def __init__(self, path: Path, problem: str, objects: list[str]):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem, self.objects = path, problem, objects


# How torch's weights-only unpickler names what it refused: "Unsupported global: GLOBAL
# argparse.Namespace was not an allowed global" / "unsupported GLOBAL posix.system whose module".
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def load_weights_only(path: str | Path, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU: only tensors, numbers, strings, lists
    and dicts are unpickled, never other objects (unpickling those can run code). ``mmap``: map
    the tensors' storage instead of reading it (zip-format files only), to check a file cheaply.
    Raises CheckpointNotLoaded, a ValueError naming the file; a RunsFolderError for a path in the
    runs folder that a link leads out of it (``inside_runs``)."""
    path = inside_runs(path, reading=True)
    try:
        with warnings.catch_warnings():  # torch's note on a file of another pickle protocol
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        objects = sorted(set(_REFUSED_GLOBAL.findall(str(error))))
        if objects:
            raise CheckpointNotLoaded(
                path, f"it holds Python objects beyond tensors ({', '.join(objects)}), so it was "
                      "not loaded: unpickling them could run code", objects) from None
        reason = error.__context__ or error  # torch's own reason, without its advice to unpickle
        raise CheckpointNotLoaded(path, f"it is not a PyTorch checkpoint ({reason})", []) from None
    except Exception as error:  # text, truncated zip, empty file: torch raises several kinds
        first = str(error).strip().split("\n")[0].split(". ")[0][:200]  # torch's, then advice
        reason = ": ".join([type(error).__name__, first])
        raise CheckpointNotLoaded(path, "it is not a PyTorch checkpoint torch.load can read "
                                        f"({reason.rstrip(': ')})", []) from None


def check_plain_values(value: Any, where: str) -> None:
    """Refuse what ``torch.load(weights_only=True)`` would refuse to read back (a numpy array or
    scalar, a tuple subclass, any other object), so no checkpoint is written that resuming would
    set aside: the run would silently start over at every resume."""
    if torch.is_tensor(value) or type(value) in (str, int, float, bool, type(None)):
        return
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            check_plain_values(key, f"{where} key {key!r}")
            check_plain_values(item, f"{where}[{key!r}]")
    elif type(value) in (list, tuple):
        for index, item in enumerate(value):
            check_plain_values(item, f"{where}[{index}]")
    else:
        raise TypeError(f"training state {where} is a {type(value).__module__}."
                        f"{type(value).__name__}; a checkpoint holds only tensors, numbers, "
                        "strings, lists and dicts, which load with weights_only=True (convert it, "
                        "e.g. a numpy RNG state to a tensor or a list)")


# Wrappers that training code or other libraries put around a backbone's parameter names:
# DistributedDataParallel ("module."), robustness / timm-style wrappers ("model."), and ours;
# "1.module.": Cohen et al.'s smoothing checkpoints (Sequential(normalize layer, DataParallel)).
_PREFIXES = ("1.module.", "module.", "model.", "backbone.")


def clean_state_dict(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A backbone state dict from a checkpoint file in any of the common layouts."""
    for key in ("state_dict", "model", "model_state_dict", "weights"):
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    cleaned = {}
    for name, value in state.items():
        if not torch.is_tensor(value):
            continue
        stripped = True
        while stripped:
            stripped = False
            for prefix in _PREFIXES:
                if name.startswith(prefix):
                    name, stripped = name[len(prefix):], True
        cleaned[name] = value
    return cleaned


def backbone_tensors(raw: Any, what: str) -> dict[str, torch.Tensor]:
    """``clean_state_dict`` of what a checkpoint file holds; a ValueError naming ``what`` (the
    file) where it holds no state dict."""
    expected = "expected a state dict (or a dict with 'state_dict'/'model')"
    if not isinstance(raw, dict):
        raise ValueError(f"{what} holds a {type(raw).__name__}, {expected}")
    state = clean_state_dict(raw)
    if not state:
        raise ValueError(f"{what} holds no tensors (keys: {sorted(map(str, raw))[:5]}); {expected}")
    return state


def conversion_command(path: str | Path) -> str:
    """The command that converts a trusted full-pickle checkpoint into a weights-only one."""
    path = Path(path)
    converted = path.with_name(f"{path.stem}-weights{path.suffix or '.pth'}")
    return f"python {CONVERT_SCRIPT} {shlex.quote(str(path))} {shlex.quote(str(converted))}"


def _missing_external_checkpoint(path: Path) -> str:
    return (f"external checkpoint {path} does not exist; give the path to a .pth/.pt file holding "
            "a ResNet state dict")


def _read_external_checkpoint(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """The backbone state dict in an external checkpoint, read as weights only; one ValueError
    naming the file (and, for a file holding Python objects, the command that converts it)."""
    try:
        raw = load_weights_only(path, mmap=mmap)
    except CheckpointNotLoaded as error:
        if error.objects:
            raise ValueError(
                f"external checkpoint {path}: {error.problem}. If you trust the file, convert it "
                f"once into a weights-only state dict and give that file as checkpoint =:\n"
                f"    {conversion_command(path)}") from None
        raise ValueError(f"external checkpoint {path}: {error.problem}; give a .pth/.pt file "
                         "written by torch.save, holding a ResNet state dict") from None
    return backbone_tensors(raw, f"external checkpoint {path}")


def output_count_problem(path: str | Path, state: dict[str, torch.Tensor],
                         expected: int) -> str | None:
    """Why a checkpoint's output layer does not fit a model of ``expected`` outputs (None: it
    fits, or the file has no fc layer, which the architecture check reports)."""
    weight = state.get("fc.weight")
    if weight is None or weight.shape[0] == expected:
        return None
    return (f"external checkpoint {path} has {weight.shape[0]} outputs (fc.weight) but this "
            f"suite's model has {expected}; give a checkpoint trained on the suite's {expected} "
            "classes (the same world, classes and output layer), or remove checkpoint = to "
            "train the model here")


def check_external_checkpoint(path: str | Path, expected_outputs: int | None = None) -> None:
    """Whether an external checkpoint can be loaded, cheaply (its tensors are mapped, not read):
    it exists, loads as weights only, holds a state dict and, given ``expected_outputs``, has
    that many outputs. Raises a ValueError naming the file, with the conversion command where it
    holds Python objects. The architecture is checked when the model is built
    (``load_backbone_weights``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(_missing_external_checkpoint(path))
    state = _read_external_checkpoint(path, mmap=zipfile.is_zipfile(path))
    problem = output_count_problem(path, state, expected_outputs) if expected_outputs else None
    if problem:
        raise ValueError(problem)


def load_backbone_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load an external checkpoint (ours, torchvision's, DDP-wrapped, robustness-library style)
    into a Classifier's backbone, checking the class count and every parameter name. Read as
    weights only: a file holding other Python objects is refused, never unpickled."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(_missing_external_checkpoint(path))
    state = _read_external_checkpoint(path)
    backbone = model.backbone
    problem = output_count_problem(path, state, backbone.fc.out_features)
    if problem:
        raise ValueError(problem)
    own = backbone.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(k for k in set(state) - set(own) if not k.startswith(("normalize", "attacker")))
    if missing or unexpected:
        raise ValueError(f"external checkpoint {path} does not match architecture "
                         f"{getattr(model, 'architecture', '?')}: missing {missing[:5]}"
                         f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                         f"{'...' if len(unexpected) > 5 else ''}")
    for name, value in own.items():
        if state[name].shape != value.shape:
            raise ValueError(f"external checkpoint {path}: {name} has shape "
                             f"{tuple(state[name].shape)}, the architecture expects {tuple(value.shape)}")
    backbone.load_state_dict({k: state[k] for k in own})
