"""Verify a release before anything of it is imported: every file listed with its digest, nothing
else there, nothing that unpickles, nothing that leads out, and each model, image set and
weights file what it says it is.

The checks, in order (the first file that fails stops the import with one message):
1. ``manifest.json`` reads as the manifest of a format version this code knows;
2. the folder holds exactly the manifest's files: an unlisted file, a missing one, a link (other
   than a Hub cache's into its blobs) or a path that is not a plain relative name is refused;
3. every file's type is one a release holds (no pickles) and its size and SHA-256 are recorded;
4. each model folder's ``spec.json`` hashes to its key (so its weights land where the suite that
   needs them looks), its metrics name the same key, its weights are safetensors of finite
   tensors, and the manifest lists it; each image set's index names its folder's id and its
   arrays are plain (no Python objects).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from counteraudit.anomalies.image_sets import IMAGE_SET
from counteraudit.evaluate.release.export import STATE_DICT_METADATA, WEIGHTS_RELEASED
from counteraudit.evaluate.release.manifest import (FORMAT, FORMAT_VERSION, MANIFEST_NAME, Manifest,
                                                    path_problem, type_problem)
from counteraudit.evaluate.release.provenance import sha256_bytes
from counteraudit.evaluate.release.sources import OpenedRelease, refused
from counteraudit.train.checkpoint import METRICS_NAME, SPEC_NAME, finite_weights
from counteraudit.train.core.artifacts import stable_hash
from counteraudit.train.core.payloads import PayloadProblem, npz_layout
from counteraudit.train.core.size_bounds import RELEASE_MANIFEST_BYTES

# spec.json fields that are labels, not part of the key (ModelSpec.to_dict)
SPEC_LABELS = ("name", "key", "checkpoint_recipe")


@dataclass(frozen=True)
class VerifiedRelease:
    """A release whose every file matched: its manifest, its id and where each file is."""
    source: str
    manifest: Manifest
    population_id: str
    folder: Path

    def read(self, path: str) -> bytes:
        """A file's bytes, checked again against the manifest as they are read (a folder may
        change between verifying and importing)."""
        content = (self.folder / path).read_bytes()
        if sha256_bytes(content) != self.manifest.files[path].sha256:
            raise refused(self.source, f"{path} changed after it was verified")
        return content


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _listed_files(release: OpenedRelease) -> dict[str, Path]:
    """Every file under the release folder, by release path; a link is refused unless it resolves
    inside ``links_within`` (a Hub cache's repository folder)."""
    found: dict[str, Path] = {}
    for directory, folders, names in os.walk(release.folder, followlinks=False):
        for name in sorted(folders + names):
            path = Path(directory) / name
            relative = path.relative_to(release.folder).as_posix()
            if path.is_symlink():
                allowed = release.links_within is not None and \
                    path.resolve().is_relative_to(release.links_within.resolve())
                if not allowed:
                    raise refused(release.source, f"{relative} is a link (to {os.readlink(path)}); "
                                                  "a release holds regular files only")
                if path.resolve().is_dir():
                    raise refused(release.source, f"{relative} is a link to a folder")
            if name in folders and not path.is_symlink():
                continue
            found[relative] = path
    return found


def _manifest(release: OpenedRelease, files: dict[str, Path]) -> tuple[Manifest, str]:
    if MANIFEST_NAME not in files:
        raise refused(release.source, f"no {MANIFEST_NAME}: not a counteraudit population release "
                                      "(counteraudit population export writes one)")
    if files[MANIFEST_NAME].stat().st_size > RELEASE_MANIFEST_BYTES:
        raise refused(release.source, f"{MANIFEST_NAME} is larger than a manifest may be "
                                      f"({RELEASE_MANIFEST_BYTES} bytes)")
    content = files[MANIFEST_NAME].read_bytes()
    try:
        raw = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise refused(release.source, f"{MANIFEST_NAME} is not JSON ({error})") from None
    if isinstance(raw, dict) and raw.get("format") == FORMAT and raw.get("format_version") != FORMAT_VERSION:
        raise refused(release.source, f"{MANIFEST_NAME}: format_version {raw.get('format_version')!r} "
                                      f"is not the version this counteraudit reads ({FORMAT_VERSION}); "
                                      "import it with the counteraudit version that made it")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise refused(release.source, f"{MANIFEST_NAME}: {where}: {first['msg']}") from None
    return manifest, sha256_bytes(content)


def _check_files(release: OpenedRelease, manifest: Manifest, files: dict[str, Path]) -> None:
    for path in manifest.files:
        problem = path_problem(path) or type_problem(path)
        if problem:
            raise refused(release.source, f"manifest entry {path!r} {problem}")
    for path in files:
        if path != MANIFEST_NAME and path not in manifest.files and path not in release.ignored:
            problem = type_problem(path)
            raise refused(release.source, f"{path} is not in {MANIFEST_NAME}"
                                          + (f" and {problem}" if problem else "")
                                          + ": a release holds exactly the files its manifest lists")
    for path, entry in manifest.files.items():
        if path not in files:
            raise refused(release.source, f"{path} is listed in {MANIFEST_NAME} but missing")
        size = files[path].stat().st_size
        if size != entry.size or _sha256(files[path]) != entry.sha256:
            raise refused(release.source, f"{path} does not match its SHA-256 in {MANIFEST_NAME} "
                                          f"({size} bytes where {entry.size} were recorded): "
                                          "changed or corrupt; get the release again")


def read_weights(content: bytes) -> OrderedDict[str, torch.Tensor]:
    """A safetensors file's tensors as the state dict they were saved from: its key order and its
    modules' versions (the file's metadata)."""
    (header_size,) = struct.unpack("<Q", content[:8])
    metadata = json.loads(content[8:8 + header_size]).get("__metadata__") or {}
    tensors = load_safetensors(content)
    layout = json.loads(metadata.get(STATE_DICT_METADATA, "{}"))
    order = layout.get("order", [])
    if sorted(order) != sorted(tensors):
        order = sorted(tensors)
    state_dict = OrderedDict((name, tensors[name]) for name in order)
    versions = layout.get("versions", [])
    if versions:
        state_dict._metadata = OrderedDict((prefix, dict(version)) for prefix, version in versions)
    return state_dict


def _json(release: OpenedRelease, folder: Path, path: str) -> dict[str, Any]:
    try:
        value = json.loads((folder / path).read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise refused(release.source, f"{path} is not JSON ({error})") from None
    if not isinstance(value, dict):
        raise refused(release.source, f"{path} is not a JSON object")
    return value


def _check_models(release: OpenedRelease, manifest: Manifest) -> None:
    listed = {entry.key for entry in manifest.models}
    folders = {path.split("/")[1] for path in manifest.files if path.startswith("models/")}
    if listed != folders:
        raise refused(release.source, f"the manifest's models ({len(listed)}) and its models/ "
                                      f"folders ({len(folders)}) differ: "
                                      f"{sorted(listed ^ folders)[:3]}")
    for key in sorted(folders):
        where = f"models/{key}"
        for name in (SPEC_NAME, METRICS_NAME, WEIGHTS_RELEASED):
            if f"{where}/{name}" not in manifest.files:
                raise refused(release.source, f"{where} has no {name}")
        spec = _json(release, release.folder, f"{where}/{SPEC_NAME}")
        identity = {k: v for k, v in spec.items() if k not in SPEC_LABELS}
        if stable_hash(identity) != key or spec.get("key") != key:
            raise refused(release.source, f"{where}/{SPEC_NAME} does not hash to the key {key} it is "
                                          "stored under: its weights would be found by a model "
                                          "they were not trained as")
        if _json(release, release.folder, f"{where}/{METRICS_NAME}").get("key") != key:
            raise refused(release.source, f"{where}/{METRICS_NAME} names another key than {key}")
        try:
            weights = read_weights((release.folder / f"{where}/{WEIGHTS_RELEASED}").read_bytes())
        except (SafetensorError, ValueError, struct.error) as error:
            raise refused(release.source, f"{where}/{WEIGHTS_RELEASED} is not a safetensors file "
                                          f"({error})") from None
        if not finite_weights(weights):
            raise refused(release.source, f"{where}/{WEIGHTS_RELEASED} holds inf or nan")


def _check_image_sets(release: OpenedRelease, manifest: Manifest) -> None:
    for entry in manifest.image_sets:
        where = f"image_sets/{entry.id}"
        for name in (IMAGE_SET.payload, IMAGE_SET.marker):
            if f"{where}/{name}" not in manifest.files:
                raise refused(release.source, f"{where} has no {name}")
        if _json(release, release.folder, f"{where}/{IMAGE_SET.marker}").get("id") != entry.id:
            raise refused(release.source, f"{where}/{IMAGE_SET.marker} names another id than {entry.id}")
        try:
            npz_layout(release.folder / where / IMAGE_SET.payload)
        except PayloadProblem as error:
            raise refused(release.source, f"{where}/{IMAGE_SET.payload}: {error}") from None


def verify_release(release: OpenedRelease, expected_id: str | None = None) -> VerifiedRelease:
    """The release, verified; a ReleaseError naming the first problem otherwise. ``expected_id``:
    the population id (the manifest's SHA-256) the user pinned."""
    files = _listed_files(release)
    manifest, population_id = _manifest(release, files)
    if expected_id is not None and population_id != expected_id:
        raise refused(release.source, f"its manifest's SHA-256 is {population_id}, not the pinned "
                                      f"{expected_id} (--sha256): another release, or a changed one")
    _check_files(release, manifest, files)
    _check_models(release, manifest)
    _check_image_sets(release, manifest)
    return VerifiedRelease(release.source, manifest, population_id, release.folder)
