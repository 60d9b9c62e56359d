"""Export a suite's trained population as a release folder or ``.tar`` (manifest.py: the layout).

Everything is checked before a byte is written (every model trained, every image set made), the
release is written into ``<OUT>.partial`` and renamed into place when whole, so an interrupted
export leaves no folder that reads as a release. Weights leave the store as safetensors: the
state dict's key order travels in the file's metadata, so an import writes a ``weights.pth`` of
the very bytes the exporter trained (metrics.json's ``weights_sha256`` says so).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes

from counteraudit.anomalies.image_sets import CLASSES, IMAGE_SET
from counteraudit.evaluate.release.card import model_card
from counteraudit.evaluate.release.manifest import (FORMAT, FORMAT_VERSION, MANIFEST_NAME, FileEntry,
                                                    ImageSetEntry, Manifest, ModelEntry, WorldEntry)
from counteraudit.evaluate.release.provenance import code_version, sha256_bytes
from counteraudit.explain.stage import IMAGE_SETS, linked_image_sets
from counteraudit.train.checkpoint import (METRICS_NAME, SPEC_NAME, WEIGHTS_NAME, is_trained, model_dir,
                                           read_metrics)
from counteraudit.train.core import numerics
from counteraudit.train.core.artifacts import runs_dir, store_dir
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.core.suite_files import read_table, toml_text
from counteraudit.train.core.weights import load_weights_only
from counteraudit.train.implant_checks import implant_path
from counteraudit.train.worlds import build_world

WEIGHTS_RELEASED = "weights.safetensors"
# One metadata entry (safetensors writes its metadata map in no fixed order: one key keeps the
# file's bytes the same on every export), holding the state dict's key order and torch's
# per-module versions (``state_dict._metadata``), which weights.pth pickles beside the tensors.
STATE_DICT_METADATA = "counteraudit.state_dict"
IMPLANT_FIGURES = "implant-figures"


class ExportError(ValueError):
    """A population that cannot be exported yet; the message says what is missing and the fix."""


def role(suite: Suite, spec: ModelSpec) -> str:
    if not spec.is_reference:
        return "anomalous"
    return "held-out" if spec in suite.held_out else "reference"


def weights_file(state_dict: dict[str, torch.Tensor]) -> bytes:
    """The state dict as safetensors bytes, with what ``torch.save`` records beside the tensors
    in the metadata (the key order, the modules' versions), so the import saves the same bytes."""
    tensors = {name: tensor.detach().contiguous().clone() for name, tensor in state_dict.items()}
    versions = list(getattr(state_dict, "_metadata", {}).items())
    layout = {"order": list(state_dict), "versions": versions}
    return safetensors_bytes(tensors, metadata={STATE_DICT_METADATA: json.dumps(layout)})


def _missing(suite: Suite, runs_root: Path) -> list[str]:
    """What the release needs that the runs folder lacks, as lines with the fix."""
    untrained = [spec.name for spec in suite.models if not is_trained(model_dir(runs_root, spec))]
    lines = []
    if untrained:
        lines.append(f"{len(untrained)} of its {len(suite.models)} models are not trained "
                     f"({', '.join(untrained[:5])}{', ...' if len(untrained) > 5 else ''}): run "
                     f"python train/train.py --suite {suite.name} --runs-dir {runs_root}")
    sets = linked_image_sets(suite, runs_root)
    sets.pop(CLASSES, None)
    unchecked = [spec.name for spec in suite.anomalies
                 if not implant_path(suite, spec, runs_root).is_file()]
    if unchecked or not sets:
        lines.append(f"its implant checks or image sets are not made yet ({len(unchecked)} "
                     f"implant checks missing): run python evaluate/detect.py --suite {suite.name} "
                     f"--runs-dir {runs_root}")
    return lines


def _model_files(suite: Suite, spec: ModelSpec, runs_root: Path) -> dict[str, bytes]:
    """A model's release files, by path inside its release folder."""
    directory = model_dir(runs_root, spec)
    read_metrics(directory)  # verified against its digest (is_trained) just before
    files = {SPEC_NAME: (directory / SPEC_NAME).read_bytes(),
             METRICS_NAME: (directory / METRICS_NAME).read_bytes(),
             WEIGHTS_RELEASED: weights_file(load_weights_only(directory / WEIGHTS_NAME))}
    implant = implant_path(suite, spec, runs_root)
    if implant.is_file():
        files[implant.name] = implant.read_bytes()
    for figure in sorted((directory / IMPLANT_FIGURES).glob("*.json")):
        files[f"{IMPLANT_FIGURES}/{figure.name}"] = figure.read_bytes()
    return files


def _image_set_files(folder: Path) -> dict[str, bytes]:
    IMAGE_SET.require(folder, f"the image set in {folder} is incomplete")
    files = {IMAGE_SET.payload: (folder / IMAGE_SET.payload).read_bytes(),
             IMAGE_SET.marker: (folder / IMAGE_SET.marker).read_bytes()}
    for png in sorted((folder / "png").glob("*.png")):
        files[f"png/{png.name}"] = png.read_bytes()
    return files


def _world(suite: Suite, runs_root: Path) -> WorldEntry:
    """The world's definition and the digests of its generated files, where the exporter has them
    (a world read from a folder of images has none here)."""
    cache = getattr(build_world(suite.world, runs_root=runs_root), "cache_dir", None)
    data = {}
    if cache is not None and Path(cache).is_dir():
        for path in sorted(Path(cache).iterdir()):
            if path.is_file() and not path.name.startswith("."):
                content = path.read_bytes()
                data[path.name] = FileEntry(sha256=sha256_bytes(content), size=len(content))
    return WorldEntry(definition=json.loads(json.dumps(suite.world)), data=data)


def population_files(suite: Suite, runs_root: Path,
                     code: dict[str, str] | None = None) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest and every other file of the suite's release, by release path. ``code``: the
    code version the manifest and its model card name (default: this checkout's,
    ``code_version``); a release exported by another commit is rebuilt byte for byte with its
    own."""
    problems = _missing(suite, runs_root)
    if problems:
        raise ExportError(f"suite {suite.name!r} ({suite.path}) cannot be exported from "
                          f"{runs_root} yet: " + "; ".join(problems) + ". Nothing was written.")
    files: dict[str, bytes] = {}
    suite_file = f"suite/{suite.name}.toml"
    table = read_table(suite.path)
    files[suite_file] = (f"# {suite.path.name} with its extends chain resolved, as exported\n"
                         f"{toml_text({'name': table.pop('name', suite.name), **table})}\n").encode()
    models = []
    for spec in suite.models:
        own = _model_files(suite, spec, runs_root)
        files.update({f"models/{spec.key}/{path}": content for path, content in own.items()})
        metrics = json.loads(own[METRICS_NAME])
        models.append(ModelEntry(name=spec.name, key=spec.key, role=role(suite, spec), family=spec.family,
                                 val_accuracy=float(metrics["val_accuracy"])))
    image_sets = []
    for name, linked in sorted(linked_image_sets(suite, runs_root).items()):
        if name == CLASSES:  # a function of the world, never stored
            continue
        for path, content in _image_set_files(store_dir(runs_root) / IMAGE_SETS / linked.id).items():
            files[f"image_sets/{linked.id}/{path}"] = content
        image_sets.append(ImageSetEntry(name=name, id=linked.id))
    manifest = Manifest(format=FORMAT, format_version=FORMAT_VERSION, suite=suite.name,
                        suite_file=suite_file, counteraudit=code or code_version(),
                        numerics=numerics.key_tag(), world=_world(suite, runs_root), models=models,
                        image_sets=image_sets, files={})
    files["README.md"] = model_card(manifest, suite).encode()
    entries = {path: FileEntry(sha256=sha256_bytes(content), size=len(content))
               for path, content in sorted(files.items())}
    return manifest.model_copy(update={"files": entries}), files


def manifest_bytes(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()


def population_id(suite: Suite, runs_root=None, code: dict[str, str] | None = None) -> str:
    """The id ``export_population`` would give the suite's trained population in ``runs_root``
    (the SHA-256 of its manifest.json), computed without writing anything. The manifest names
    the code that exported it (``code``, default this checkout's): a release's id is reproduced
    from a run by giving the code version the release was exported with."""
    manifest, _ = population_files(suite, runs_dir(runs_root), code)
    return sha256_bytes(manifest_bytes(manifest))


def _write_folder(folder: Path, files: dict[str, bytes]) -> None:
    for path, content in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _write_tar(path: Path, files: dict[str, bytes]) -> None:
    """A plain, reproducible tar: sorted entries, regular files only, no owners, time 0."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(content), 0, 0o644
            archive.addfile(info, io.BytesIO(content))


def export_population(suite: Suite, out: str | os.PathLike, runs_root=None) -> tuple[Path, str, Manifest]:
    """Write the suite's release at ``out`` (a folder, or a ``.tar`` archive when the name ends
    so); returns where, the population id (the manifest's SHA-256) and the manifest. ``out``
    must not exist: an export never replaces or deletes what is there."""
    out, runs_root = Path(out), runs_dir(runs_root)
    if out.exists() or out.is_symlink():
        raise ExportError(f"{out} already exists; an export never replaces anything: give a new "
                          "path (a folder, or a name ending in .tar). Nothing was written.")
    manifest, files = population_files(suite, runs_root)
    content = manifest_bytes(manifest)
    files = {**files, MANIFEST_NAME: content}
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        raise ExportError(f"{partial} is in the way (an interrupted export?); it is not removed "
                          "for you: delete it, then export again. Nothing was written.")
    try:
        if out.suffix == ".tar":
            _write_tar(partial, files)
        else:
            _write_folder(partial, files)
        os.replace(partial, out)
    except BaseException:
        if partial.is_dir():  # made by this call: removed, never anything else
            shutil.rmtree(partial)
        else:
            partial.unlink(missing_ok=True)
        raise
    return out, sha256_bytes(content), manifest
