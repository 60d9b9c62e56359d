"""The explain stage over a suite: which (model, method, image set) results it needs, and the work
item that computes one (model, method).

Layout: ``runs/<suite>/visualizations/<method>/<model>/<image set>/`` (see explain/store.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from anomalies.image_sets import (DETECTION, ImageSet, abnormal_set_name, build_image_sets,
                                  localizable)
from explain.base import METHODS, build_method
from explain.store import is_stored, load_explanation, result_key, save_explanation
from train.checkpoint import model_dir
from train.suite import ModelSpec, Suite, load_suite

VISUALIZATIONS = "visualizations"
IMAGE_SETS = "image_sets"


def suite_methods(suite: Suite, only: list[str] | None = None) -> list[str]:
    names = only or suite.tables.get("explain", {}).get("methods") or METHODS.names()
    for name in names:
        METHODS.get(name)  # unknown names list the valid ones
    return list(names)


def method_params(suite: Suite, name: str) -> dict[str, Any]:
    return dict(suite.tables.get("methods", {}).get(name, {}))


def method_batch_size(suite: Suite, name: str) -> int | None:
    return suite.tables.get("explain", {}).get("batch_sizes", {}).get(name)


def sets_for(suite: Suite, spec: ModelSpec) -> list[str]:
    """The image sets a model is explained on."""
    names = [DETECTION]
    for anomaly in localizable(suite):
        if spec.is_reference or anomaly.name == spec.name:
            names.append(abnormal_set_name(anomaly))
    return names


def result_dir(root: Path, method: str, model: str, image_set: str) -> Path:
    return root / VISUALIZATIONS / method / model / image_set


def load_image_sets(suite: Suite, runs_root=None, world=None) -> dict[str, ImageSet]:
    """The suite's image sets, made if missing (needs the implant checks for blurred faces)."""
    from anomalies.verify import read_implant
    from train.worlds import build_world
    world = world or build_world(suite.world, runs_root=runs_root)
    implants = {spec.name: read_implant(suite, spec, runs_root) for spec in localizable(suite)}
    return build_image_sets(suite, world, suite.root(runs_root) / IMAGE_SETS,
                            {k: v for k, v in implants.items() if v})


# Library notices that every batch would repeat and that say nothing about the user's run:
# captum's "hooks on ReLU" and "input did not require grad", torch.jit's deprecation.
QUIET = [("ignore", r"Setting backward hooks on ReLU", UserWarning),
         ("ignore", r"Input Tensor \d+ did not already require gradients", UserWarning),
         ("ignore", r"`torch.jit.script` is deprecated", FutureWarning)]


def explain_one(item: dict[str, Any]) -> dict[str, int]:
    """Work item: one model, one method, all of that model's image sets (missing ones only)."""
    import warnings
    with warnings.catch_warnings():
        for action, message, category in QUIET:
            warnings.filterwarnings(action, message=message, category=category)
        return _explain_one(item)


def _explain_one(item: dict[str, Any]) -> dict[str, int]:
    from train.trainer import load_trained_model
    from train.worlds import build_world
    suite = load_suite(item["suite"])
    spec = suite.model(item["model"])
    root = suite.root(item.get("runs_dir"))
    method = build_method(item["method"], method_params(suite, item["method"]))
    batch_size = method_batch_size(suite, item["method"])
    world = build_world(suite.world, runs_root=item.get("runs_dir"))
    image_sets = load_image_sets(suite, item.get("runs_dir"), world)
    counts = {"computed": 0, "stored": 0}
    model = None
    for set_name in sets_for(suite, spec):
        image_set = image_sets[set_name]
        directory = result_dir(root, method.name, spec.name, set_name)
        key = result_key(method.describe(spec.architecture, batch_size), spec.key, image_set.id)
        if is_stored(directory, key):
            counts["stored"] += 1
            continue
        if model is None:  # loaded once, and only if something is missing
            model = load_trained_model(model_dir(root, spec), spec, world, item.get("device") or "cpu")
        explanation = method.run(model, image_set.tensor(), batch_size)
        save_explanation(directory, explanation, spec.key, image_set.id)
        counts["computed"] += 1
    return counts


def explain_suite(suite: Suite, args: argparse.Namespace, methods: list[str] | None = None,
                  models: list[str] | None = None) -> dict[str, int]:
    """Every missing visualization of the suite, through the local or Slurm executor."""
    from slurm.executor import run_items
    from train.stage import executor_config
    methods = suite_methods(suite, methods)
    specs = [suite.model(m) for m in models] if models else suite.models
    config = executor_config(suite, args, "explain")
    if not config.dry_run:
        load_image_sets(suite, args.runs_dir)  # once, here, so work items only read them
    runs_dir = str(Path(args.runs_dir).resolve()) if args.runs_dir else None
    items = [{"suite": str(suite.path.resolve()), "model": spec.name, "method": method,
              "runs_dir": runs_dir, "device": getattr(args, "device", None)}
             for method in methods for spec in specs]
    results = run_items(explain_one, items, config, "explain",
                        item_name=lambda item: f"{item['model']}/{item['method']}")
    return {key: sum(r[key] for r in results) for key in ("computed", "stored")}


def load_results(suite: Suite, method: str, models: list[str], image_set: str, runs_root=None):
    """model -> stored Explanation of one method on one image set."""
    root = suite.root(runs_root)
    return {m: load_explanation(result_dir(root, method, m, image_set)) for m in models}
