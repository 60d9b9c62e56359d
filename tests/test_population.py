"""A trained population as a release: export, verify, import, from a folder, an archive and the
Hugging Face Hub's cache (offline), and a suite that then trains nothing; every kind of
tampering stops the import before anything is written."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from counteraudit.evaluate.release.export import export_population, manifest_bytes
from counteraudit.evaluate.release.install import install_release
from counteraudit.evaluate.release.manifest import Manifest
from counteraudit.evaluate.release import sources
from counteraudit.evaluate.release.sources import ReleaseError, opened_release
from counteraudit.evaluate.release.verify import verify_release
from counteraudit.train.checkpoint import is_trained, model_dir, read_metrics
from counteraudit.train.core.suite import load_suite
from conftest import ONE_PROCESS, REPO, command_in_process, in_process

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def release(finished_run, tmp_path_factory):
    """(suite file, the exporter's runs folder, a release folder, the same as a .tar)."""
    suite_path, runs, _ = finished_run
    base = tmp_path_factory.mktemp("release")
    suite = load_suite(suite_path)
    folder, folder_id, _ = export_population(suite, base / "population", runs)
    archive, archive_id, _ = export_population(suite, base / "population.tar", runs)
    assert folder_id == archive_id  # one release, two containers: the same manifest
    return suite_path, runs, folder, archive


def population(source, runs, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "evaluate/population.py"), "import", str(source),
                           "--runs-dir", str(runs), *args], capture_output=True, text=True, timeout=300)


def population_in_process(source, runs, *args) -> subprocess.CompletedProcess:
    """``population`` in this process: for what an import stores (``population`` starts the
    command, and the Hub's tests need a process that reads HF_HUB_OFFLINE as it starts)."""
    return command_in_process("evaluate/population.py", "import", source, "--runs-dir", runs, *args)


def tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else []


def test_export_holds_every_model_as_safetensors_with_a_card(release):
    suite_path, _, folder, _ = release
    manifest = Manifest.model_validate_json((folder / "manifest.json").read_text())
    suite = load_suite(suite_path)
    assert {m.key for m in manifest.models} == {spec.key for spec in suite.models}
    assert {m.role for m in manifest.models} == {"reference", "anomalous"}
    assert not list(folder.rglob("*.pth"))  # weights leave as safetensors, never pickles
    assert len(list(folder.glob("models/*/weights.safetensors"))) == len(suite.models)
    assert manifest.numerics and manifest.world.definition["seed"] == 3
    assert manifest.world.data, "the world's generated files' digests"
    card = (folder / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: counteraudit" in card  # the Hub's layout
    for path, entry in manifest.files.items():
        assert hashlib.sha256((folder / path).read_bytes()).hexdigest() == entry.sha256


def test_import_from_a_folder_trains_nothing_and_scores_the_same(release, tmp_path):
    suite_path, exporter_runs, folder, _ = release
    runs = tmp_path / "runs"
    done = population(folder, runs)
    assert done.returncode == 0, done.stderr
    suite = load_suite(suite_path)
    assert f"imported into {runs}/store" in done.stdout
    assert f"{len(suite.models)} models ({len(suite.models)} with weights.pth byte-identical" in done.stdout
    for spec in suite.models:
        assert is_trained(model_dir(runs, spec))
        assert read_metrics(model_dir(runs, spec))["imported_from"]["source"] == str(folder)
    # in this process: what is computed matters here, not the command (finished_run starts it)
    detect = in_process("evaluate/detect.py", "--suite", suite_path, "--runs-dir", runs, "--distance",
                        "l2", "--no-progress", *ONE_PROCESS)
    assert not list((runs / "store" / "models").rglob("checkpoint.pth")), "a model was trained"
    # 5 models x 2 methods on the detection set alone: Table 1 explains nothing else
    assert f"{len(suite.models) * 2} visualization set(s) computed, 0 already stored" in detect.stdout
    assert not (runs / "worlds").exists() or not list((runs / "worlds").rglob("train.npz")), \
        "the training split was generated: something trained"
    # the same weights and image sets: the same per-model Table 1, bit for bit
    table = "tables/detection-per-model-l2.csv"
    assert (runs / suite.name / table).read_bytes() == (exporter_runs / suite.name / table).read_bytes()
    again = population_in_process(folder, runs)  # a second import keeps what is there
    assert again.returncode == 0 and f"kept: {len(suite.models)} models" in again.stdout


def test_import_from_an_archive(release, tmp_path):
    suite_path, _, _, archive = release
    runs = tmp_path / "runs"
    done = population_in_process(archive, runs)
    assert done.returncode == 0, done.stderr
    assert all(is_trained(model_dir(runs, spec)) for spec in load_suite(suite_path).models)


def hub_cache(folder: Path, cache: Path, repo: str, commit: str) -> None:
    """A Hugging Face Hub cache of ``repo`` at ``commit`` holding ``folder``'s files, in the
    layout huggingface_hub writes: blobs by digest, a snapshot of relative links, a ref."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    files = [path for path in sorted(folder.rglob("*")) if path.is_file()]
    extra = {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"}
    for relative, content in [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in files] + \
            list(extra.items()):
        blob = repo_dir / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = repo_dir / "snapshots" / commit / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)


def test_import_through_huggingface_hub_offline(release, tmp_path, monkeypatch):
    suite_path, _, folder, _ = release
    hub_cache(folder, tmp_path / "hub", "lab/population", COMMIT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runs = tmp_path / "runs"
    moving = population("hf://lab/population", runs, "--revision", "main", "--hub-cache", tmp_path / "hub")
    assert moving.returncode == 2 and "is not a commit" in moving.stderr and not runs.exists()
    done = population("hf://lab/population", runs, "--revision", COMMIT, "--hub-cache", tmp_path / "hub")
    assert done.returncode == 0, done.stderr
    assert f"verified hf://lab/population@{COMMIT}" in done.stdout
    assert all(is_trained(model_dir(runs, spec)) for spec in load_suite(suite_path).models)


def _weights(folder: Path) -> Path:
    return sorted(folder.glob("models/*/weights.safetensors"))[0]


def _resign(folder: Path, path: str) -> None:
    """Record ``path``'s current digest in the manifest, as a forger would."""
    manifest = json.loads((folder / "manifest.json").read_text())
    content = (folder / path).read_bytes()
    manifest["files"][path] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content)}
    (folder / "manifest.json").write_bytes(manifest_bytes(Manifest.model_validate(manifest)))


def changed_byte(folder: Path) -> Path:
    weights = _weights(folder)
    content = bytearray(weights.read_bytes())
    content[-1] ^= 1
    weights.write_bytes(bytes(content))
    return folder


def extra_file(folder: Path) -> Path:
    (folder / "models" / "notes.json").write_text("{}")
    return folder


def pickle_inside(folder: Path) -> Path:
    weights = _weights(folder)
    torch.save({"x": torch.zeros(1)}, weights.with_name("weights.pth"))
    _resign(folder, weights.with_name("weights.pth").relative_to(folder).as_posix())
    return folder


def respecified(folder: Path) -> Path:
    """The spec of a model changed (and the manifest re-signed): its weights under another key."""
    spec_path = sorted(folder.glob("models/*/spec.json"))[0]
    spec = json.loads(spec_path.read_text())
    spec["seed"] += 1
    spec_path.write_text(json.dumps(spec))
    _resign(folder, spec_path.relative_to(folder).as_posix())
    return folder


def parent_entry(folder: Path) -> Path:
    archive = folder.with_suffix(".tar")
    with tarfile.open(archive, "w") as out:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out.add(path, path.relative_to(folder).as_posix())
        info = tarfile.TarInfo("../escaped.json")
        info.size = 2
        out.addfile(info, io.BytesIO(b"{}"))
    return archive


@pytest.mark.parametrize("tamper, message", [
    (changed_byte, "does not match its SHA-256 in manifest.json"),
    (extra_file, "models/notes.json is not in manifest.json"),
    (parent_entry, "archive entry '../escaped.json' has the part '..'"),
    (pickle_inside, "is a .pth file, which loads by unpickling"),
    (respecified, "does not hash to the key"),
])
def test_tampered_release_is_refused_and_nothing_is_written(release, tmp_path, tamper, message):
    _, _, folder, _ = release
    copy = shutil.copytree(folder, tmp_path / "copy")
    source = tamper(copy)
    runs = tmp_path / "runs"
    runs.mkdir()
    before = tree(runs)
    with pytest.raises(ReleaseError, match="population import refused") as refusal:
        with opened_release(str(source)) as opened:
            install_release(verify_release(opened), runs)
    assert message in str(refusal.value) and "Nothing was written." in str(refusal.value)
    assert tree(runs) == before == []


def test_pinned_population_id(release, tmp_path):
    _, _, folder, _ = release
    with opened_release(str(folder)) as opened:
        verified = verify_release(opened)
    with pytest.raises(ReleaseError, match="not the pinned"):
        with opened_release(str(folder)) as opened:
            verify_release(opened, "0" * 64)
    with opened_release(str(folder)) as opened:
        assert verify_release(opened, verified.population_id).population_id == verified.population_id


def test_export_never_replaces_a_path(release, tmp_path):
    suite_path, runs, folder, _ = release
    with pytest.raises(ValueError, match="already exists"):
        export_population(load_suite(suite_path), folder, runs)


def test_a_release_larger_than_its_bounds_is_refused_before_it_is_unpacked(release, tmp_path, monkeypatch):
    """A stranger's archive or manifest may declare any size: the bounds refuse it before a byte
    is unpacked or a file is read whole (train/core/size_bounds.py)."""
    _, _, folder, archive = release
    monkeypatch.setattr(sources, "RELEASE_BYTES", 1000)  # below this small release's size
    with pytest.raises(ReleaseError, match="more than a release may"):
        with opened_release(str(archive)):
            pass
    copy = shutil.copytree(folder, tmp_path / "copy")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["README.md"]["size"] = 2 ** 40
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ReleaseError, match=r"manifest.json: files.README.md.size: .*less than or equal"):
        with opened_release(str(copy)) as opened:
            verify_release(opened)
