"""The CPU precision probe: real figures, a warning said once, the off switch, the cache."""
from __future__ import annotations

import argparse
import json
import math
import time

import pytest
import torch

from counteraudit.train import cpu_probe
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.cpu_probe import check_cpu_precision, measure_precisions
from counteraudit.train.train import get_args_parser, main
from tests.conftest import write_suite


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch):
    monkeypatch.delenv(cpu_probe.ENV_VAR, raising=False)
    monkeypatch.setattr(cpu_probe, "_WARNED", set())


def probe_suite(tmp_path, cpu_bf16: bool, **sizes):
    """The tiny suite (32 px synthetic world, small_resnet, batch 64) with the given precision."""
    write_suite(tmp_path / "base.toml", **sizes)
    path = tmp_path / f"probe-{'bf16' if cpu_bf16 else 'fp32'}.toml"
    path.write_text(f'extends = "base.toml"\n[recipe]\ncpu_bf16 = {str(cpu_bf16).lower()}\n')
    suite = load_suite(path)
    assert suite.recipe.cpu_bf16 is cpu_bf16
    return suite


def fake_measure(monkeypatch, bf16: float, fp32: float) -> list[dict]:
    """Replace the measurement by fixed figures; the returned list records each call's settings."""
    calls = []

    def measure(architecture, num_classes, image_size, batch_size, threads, **_):
        calls.append({"architecture": architecture, "num_classes": num_classes,
                      "image_size": image_size, "batch_size": batch_size, "threads": threads})
        return {"fp32_images_per_second": fp32, "bf16_images_per_second": bf16,
                "cpu": "Test CPU 9000", **calls[-1]}
    monkeypatch.setattr(cpu_probe, "measure_precisions", measure)
    return calls


def test_measure_precisions_times_both_precisions_and_keeps_the_callers_state():
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    started = time.perf_counter()
    figures = measure_precisions("small_resnet", num_classes=10, image_size=32, batch_size=16,
                                 threads=1, steps=2)
    assert time.perf_counter() - started < 30
    for key in ("fp32_images_per_second", "bf16_images_per_second"):
        assert math.isfinite(figures[key]) and figures[key] > 0, figures
    assert {k: figures[k] for k in ("architecture", "image_size", "batch_size", "threads")} == {
        "architecture": "small_resnet", "image_size": 32, "batch_size": 16, "threads": 1}
    assert figures["cpu"] and figures["torch"] == torch.__version__
    # It never changes what is trained: the trainer's threads and RNG are as they were.
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_much_slower_choice_is_said_once_with_the_figures_and_the_switch(tmp_path, monkeypatch,
                                                                           capsys):
    calls = fake_measure(monkeypatch, bf16=100, fp32=500)
    suite = probe_suite(tmp_path, cpu_bf16=True)
    warning = check_cpu_precision(suite, runs_root=tmp_path / "runs")
    assert warning is not None and capsys.readouterr().out == warning + "\n"
    for part in ("Test CPU 9000", "bf16 trains 100 images/s", "fp32 500 images/s", "5.0x slower",
                 "'probe-bf16'", "set cpu_bf16 = false in the suite's [recipe]",
                 "different models, trained anew", "trains the suite's models as specified"):
        assert part in warning, (part, warning)
    # The suite's settings were probed: its architecture, image size, batch and threads.
    assert calls == [{"architecture": "small_resnet", "num_classes": 10, "image_size": 32,
                      "batch_size": 64, "threads": 1}]

    assert check_cpu_precision(suite, runs_root=tmp_path / "runs") == warning
    assert capsys.readouterr().out == ""  # once per process


def test_a_much_slower_fp32_choice_names_the_other_switch(tmp_path, monkeypatch, capsys):
    fake_measure(monkeypatch, bf16=900, fp32=300)
    warning = check_cpu_precision(probe_suite(tmp_path, cpu_bf16=False), runs_root=tmp_path)
    assert "fp32 is 3.0x slower" in warning and "set cpu_bf16 = true" in warning
    assert capsys.readouterr().out == warning + "\n"


@pytest.mark.parametrize("bf16, fp32", [(500, 100), (100, 140)])  # faster; slower but not much
def test_no_warning_unless_the_choice_is_much_slower(tmp_path, monkeypatch, capsys, bf16, fp32):
    calls = fake_measure(monkeypatch, bf16=bf16, fp32=fp32)
    assert check_cpu_precision(probe_suite(tmp_path, cpu_bf16=True), runs_root=tmp_path) is None
    assert len(calls) == 1 and capsys.readouterr().out == ""


@pytest.mark.parametrize("env, device", [("off", "cpu"), ("OFF", "cpu"), ("", "cuda")])
def test_off_switch_and_gpus_measure_nothing(tmp_path, monkeypatch, capsys, env, device):
    calls = fake_measure(monkeypatch, bf16=1, fp32=1000)
    monkeypatch.setenv(cpu_probe.ENV_VAR, env)
    suite = probe_suite(tmp_path, cpu_bf16=True)
    assert check_cpu_precision(suite, runs_root=tmp_path / "runs", device=device) is None
    assert calls == [] and capsys.readouterr().out == ""
    assert not (tmp_path / "runs").exists()


def test_figures_are_cached_and_a_corrupt_cache_is_measured_again(tmp_path, monkeypatch, capsys):
    calls = fake_measure(monkeypatch, bf16=100, fp32=500)
    suite = probe_suite(tmp_path, cpu_bf16=True)
    warning = check_cpu_precision(suite, runs_root=tmp_path / "runs")
    [cache] = (tmp_path / "runs" / "store" / "cpu-probe").glob("*.json")
    assert len(calls) == 1

    monkeypatch.setattr(cpu_probe, "_WARNED", set())  # a new process: says it again, from the cache
    assert check_cpu_precision(suite, runs_root=tmp_path / "runs") == warning
    assert len(calls) == 1 and capsys.readouterr().out == 2 * (warning + "\n")

    for garbage in (b"\x00\xff{not json", b'{"fp32_images_per_second": "fast"}'):
        cache.write_bytes(garbage)
        monkeypatch.setattr(cpu_probe, "_WARNED", set())
        assert check_cpu_precision(suite, runs_root=tmp_path / "runs") == warning
        assert json.loads(cache.read_text())["bf16_images_per_second"] == 100
    assert len(calls) == 3


def test_the_training_stage_warns_once_and_still_trains_the_suites_models(tmp_path, monkeypatch,
                                                                         capsys):
    """fp32 forced 5x slower: `train.py` on an fp32 suite says so once, with both figures and the
    switch, and trains exactly the models (keys, bits) it trains when the probe is off. (fp32, not
    bf16, is the suite's choice here only because bf16 is emulated, 12x slower, on some CI CPUs.)"""

    fake_measure(monkeypatch, bf16=500, fp32=100)
    suite = probe_suite(tmp_path, cpu_bf16=False, references=2, epochs=1)

    def train(runs) -> argparse.Namespace:
        args = get_args_parser().parse_args(["--suite", str(suite.path), "--runs-dir", str(runs),
                                             "--no-progress", "--jobs", "1"])
        main(args)
        return capsys.readouterr().out

    out = train(tmp_path / "warned")
    assert out.count("[train] CPU precision") == 1, out
    assert "100 images/s" in out and "500 images/s" in out and "cpu_bf16 = true" in out
    monkeypatch.setenv(cpu_probe.ENV_VAR, "off")
    assert "CPU precision" not in train(tmp_path / "quiet")
    for spec in suite.models:
        assert not spec.recipe.cpu_bf16  # the suite's precision, whatever the probe said
        warned = torch.load(model_dir(tmp_path / "warned", spec) / "weights.pth")
        quiet = torch.load(model_dir(tmp_path / "quiet", spec) / "weights.pth")
        assert all(torch.equal(warned[name], quiet[name]) for name in quiet)
