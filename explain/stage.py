"""The explain stage over a suite: which (model, method, image set) results it needs, and the work
items that compute them.

Layout: each result is stored once, in the store shared by every suite, in a folder named by the
hash of its key (method, its parameters, model key, image set id; explain/store.py):
``runs/store/visualizations/<method>/<key hash>/``. A suite's ``runs/<suite>/visualizations/
<method>/<model>/<image set>`` links to it, so a suite finds what another computed, and people and
the score stage read results by the suite's names. A folder an older version wrote at the suite's
path is moved into the store (nothing is recomputed).

Work items. By default one item is one (model, method) on all of that model's image sets: the model
is loaded once and the images go through the method in batches. With ``chunk_images`` N (suite
``[explain] chunk_images``, ``--chunk-images``) one item is one (model, method, image set, image
range) of about N images, so a large suite fans out over a Slurm array. Each such item stores its
range as a part (``<image set>/parts/<start>-<stop>/``, keyed like the full result plus the
range); once every part of a (model, method, set) is there, the submitting process gathers them
into the very artifact an unchunked run writes (``explain.store.gather_parts``) and removes the
parts. A set that fits in one chunk is written directly. A rerun submits only the missing parts.

Bit for bit: a range starts at a multiple of the batch size the method runs with (N is rounded
up to one, see ``part_size``), so every batch holds the same images as in an unchunked run, and
each batch's RNG is seeded from its position in the whole set (``run_range``).

Shared images are explained once. Image sets are nested draws (anomalies/image_sets.py): the
demo's m = 36 detection images are the first 36 of demo-full's m = 50. By the same argument, rows
[0, a) of a stored result for another set of the same lineage are bit for bit those a fresh run
computes when a is a multiple of the batch size (``shared_rows``), so a missing result takes them
and explains only its other images; a chunked run stores them as the parts they cover. CPU work runs on
the model's ``recipe.cpu_threads`` threads, as training does, since some CPU kernels reduce in a
thread-dependent order: local, ``--jobs`` and Slurm runs store the same bits.

Model groups. With ``[explain] model_group`` k, a method that can group models
(``groups_models``) gets items of up to k models each (``grouped_items``), explained in grouped
passes (explain/model_groups.py) and stored as each model's own results, keyed with the group
size; everything above holds for them (ranges, shared rows, locks).

Two runs at once (two suites, two shells on one runs folder) compute each result, or part, once:
it is computed under a lock (``result_lock``, ``part_lock``); the second run to need it waits,
then finds it stored. A full disk stops the stage at the first write that fails (slurm/executor.py);
the message says about how much the unfinished items need (``space_needed``).
"""
from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from counteraudit.anomalies.image_sets import (CLASSES, DETECTION, IMAGE_SET, IMPLANT_DETAILS,
                                               ImageSet, abnormal_recipe, abnormal_set_name,
                                               build_image_sets, classes_set, classes_set_id,
                                               detection_recipe, localizable, normal_set_name,
                                               same_lineage, set_sizes)
from counteraudit.explain.base import METHODS, Explanation, ExplanationMethod
from counteraudit.explain.model_groups import grouped_description, grouping_key, run_models
from counteraudit.explain.settings import MethodSpec, method_specs
from counteraudit.explain.store import (ARRAYS_FILE, PARAMS_FILE, VISUALIZATION, concatenate, gather_parts, is_stored,
                                        load_explanation, part_dir, part_key, result_key, row_range,
                                        save_explanation)
from counteraudit.slurm.errors import ItemsFailedError, OutOfSpaceError
from counteraudit.slurm.stage_run import say
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.artifacts import (artifact_lock, find_or_make, link_into_store, lock_beside,
                                               read_json, stable_hash, store_dir)
from counteraudit.train.core.keyed_store import as_stored
from counteraudit.train.core.registries import WORLDS
from counteraudit.train.core.stage import (RunOptions, StageItem, StagePlan, executor_config, longest_first,
                                           resolved_runs_dir, run_stage)
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.core.threads import torch_threads
from counteraudit.train.implant_checks import read_implant
from counteraudit.train.trainer import load_trained_model, pick_device
from counteraudit.train.worlds import build_world

VISUALIZATIONS = "visualizations"
IMAGE_SETS = "image_sets"


def is_model_level(method: str) -> bool:
    """Whether a registered method explains models rather than images (``model_level``)."""
    return METHODS.get(method).model_level


def detection_set_for(method: str) -> str:
    """The set a method's detection scores (Table 1) are computed on: the ``classes`` set for a
    model-level method (one row per class), else the detection set."""
    return CLASSES if is_model_level(method) else DETECTION


def sets_for(suite: Suite, spec: ModelSpec, method: str | None = None) -> list[str]:
    """The image sets a model is explained on (a held-out reference: the detection set only);
    a localizable model's normal set is the detection set unless [image_sets] gives it a folder.
    A model-level ``method`` explains every model on the ``classes`` set alone: it has no
    localization."""
    if method is not None and is_model_level(method):
        return [CLASSES]
    names = [DETECTION]
    references = {s.name for s in suite.references}
    for anomaly in localizable(suite):
        if spec.name in references or anomaly.name == spec.name:
            names.append(abnormal_set_name(anomaly))
            if normal_set_name(suite, anomaly) != DETECTION:
                names.append(normal_set_name(suite, anomaly))
    return names


def item_sets(suite: Suite, spec: ModelSpec, method: str, detection_only: bool) -> list[str]:
    """The sets a work item explains: ``sets_for``, or with ``detection_only`` (Table 1's run)
    the one set its detection scores are computed on."""
    return [detection_set_for(method)] if detection_only else sets_for(suite, spec, method)


def sets_needed(suite: Suite, specs: list[ModelSpec]) -> set[str]:
    """The image sets the models ``specs`` are explained on."""
    return {name for spec in specs for name in sets_for(suite, spec)}


def result_dir(root: Path, method: str, model: str, image_set: str) -> Path:
    """A result by the suite's names, under the suite's folder ``root`` (a link into the store)."""
    return root / VISUALIZATIONS / method / model / image_set


def stored_result_dir(runs_root, key: dict[str, Any]) -> Path:
    """Where the result with this key (``result_key``) is stored, whichever suite asks."""
    return store_dir(runs_root) / VISUALIZATIONS / key["method"] / stable_hash(key, length=16)


def load_image_sets(suite: Suite, runs_root=None, world=None,
                    classes: bool = False) -> dict[str, ImageSet]:
    """The suite's image sets, made in the store if missing (needs the implant checks for blurred
    faces), each linked from ``runs/<suite>/image_sets/<name>``; with ``classes``, the world's
    ``classes`` set too (model-level methods; made in memory, not stored)."""
    world = world or build_world(suite.world, runs_root=runs_root)
    implants = {spec.name: read_implant(suite, spec, runs_root) for spec in localizable(suite)}
    store = store_dir(runs_root) / IMAGE_SETS
    sets = build_image_sets(suite, world, store, {k: v for k, v in implants.items() if v})
    for name, image_set in sets.items():
        link_into_store(suite.root(runs_root) / IMAGE_SETS / name, store / image_set.id, runs_root,
                        IMAGE_SET.marks(image_set.id))
    if classes:
        sets[CLASSES] = classes_set(suite, world)
    return sets


class LinkedSet(NamedTuple):
    """An image set as a dry run sees it: its id and size, read from the store, never made."""
    id: str
    count: int


def linked_image_sets(suite: Suite, runs_root=None) -> dict[str, LinkedSet]:
    """The suite's image sets that an earlier run made and linked (``runs/<suite>/image_sets/
    <name>``), read without writing anything: a dry run plans with them, since it makes nothing.
    A set is left out when the suite's settings it was drawn with have changed since (its count,
    seed, world or draw; an abnormal set's model, family or parameters): the real run would draw
    it anew, so its results count as missing."""
    drawn_with = {DETECTION: detection_recipe(suite)}
    for spec in localizable(suite):  # the implant check's details are not known to a dry run
        recipe = abnormal_recipe(suite, spec, None)
        drawn_with[abnormal_set_name(spec)] = {k: v for k, v in recipe.items() if k != IMPLANT_DETAILS}
    found = {}
    for name, settings in drawn_with.items():
        index = IMAGE_SET.find(suite.root(runs_root) / IMAGE_SETS / name)
        recipe = (index or {}).get("recipe", {})
        if index and all(recipe.get(k) == as_stored(v) for k, v in settings.items()):
            found[name] = LinkedSet(index["id"], int(index["count"]))
    # The classes set is a function of the world, never stored: its id is known without it (its
    # size, where the world lists its classes without being built; else 0, only a dry run's plan).
    names = WORLDS.get(suite.world.get("name", "synthetic")).listed_class_names(
        {k: v for k, v in suite.world.items() if k != "name"})
    found[CLASSES] = LinkedSet(classes_set_id(suite), len(names or []))
    return found


def chunk_images(suite: Suite) -> int | None:
    """Images per work item: [explain] chunk_images (the command line's --chunk-images merged into
    it by the entry script); None: no chunking (0 or absent)."""
    return suite.explain.chunk_images or None


def model_group(suite: Suite, method: ExplanationMethod | type[ExplanationMethod]) -> int:
    """Models per grouped pass of ``method`` in ``suite``: [explain] model_group for a method that
    can group models (``groups_models``; explain/model_groups.py), else 1 (alone)."""
    return suite.explain.model_group if method.groups_models else 1


def stage_description(suite: Suite, method: ExplanationMethod, architecture: str | None,
                      batch_size: int | None) -> dict[str, Any]:
    """What the suite's results of ``method`` record and are keyed by: ``describe``, with the
    model group a grouped run computes them in."""
    return grouped_description(method.describe(architecture, batch_size),
                               model_group(suite, method))


def part_size(method: ExplanationMethod, batch_size: int | None, chunk: int) -> int:
    """Images per part: ``chunk`` rounded up to a multiple of the batch size the method runs with.

    Parts must start at multiples of the batch size for chunked == unchunked bit for bit: a
    method with ``batch_invariant = False`` (Caricatures: one random augmentation per step for the
    whole batch) gives other results when other images share a batch, and even a batch-invariant
    one only up to float rounding, since CPU and GPU kernels pick their reduction order by batch
    shape (guided backprop's raw attributions differ in the last bits between one batch of 8 and
    batches of 3, 3 and 2). Aligned parts hold exactly the unchunked run's batches."""
    batch = batch_size or method.default_batch_size
    return -(-chunk // batch) * batch


def image_ranges(count: int, size: int | None) -> list[tuple[int, int]]:
    """Consecutive [start, stop) ranges of at most ``size`` images covering ``count`` images."""
    size = size or count
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def check_aligned(method: ExplanationMethod, start: int, batch_size: int | None) -> int:
    """The batch size ``method`` runs with, once ``start`` is checked to be a multiple of it."""
    batch_size = batch_size or method.default_batch_size
    if start % batch_size:
        raise ValueError(f"a range of images starting at {start} is not a multiple of the batch "
                         f"size {batch_size} of {method.name}; its batches would differ from an "
                         "unchunked run's (see part_size)")
    return batch_size


def run_range(method: ExplanationMethod, model, images, start: int,
              batch_size: int | None = None, labels=None, model_id: str | None = None
              ) -> Explanation:
    """``method.run`` on the images [start, start + len(images)) of a set, equal bit for bit to
    those rows of ``method.run`` on the whole set. ``start`` must be a multiple of the batch size
    (see ``part_size``); then the batches hold the same images, and ``first_position`` seeds
    each batch's RNG from its position in the whole set, as the unchunked run does."""
    batch_size = check_aligned(method, start, batch_size)
    return method.run(model, images, batch_size, first_position=start, labels=labels,
                      model_id=model_id)


def shared_rows(runs_root, description: dict[str, Any], model_id: str, image_set: ImageSet,
                batch_size: int) -> Explanation | None:
    """The leading rows of this (method, model, image set) result that a stored result for
    another set of its lineage already holds (module docstring): the longest prefix that both
    sets share and that ends on a batch boundary of ``batch_size``; None if there is none."""
    best, best_rows = None, 0
    for other in same_lineage(store_dir(runs_root) / IMAGE_SETS, image_set):
        rows = min(len(other.images), len(image_set.images)) // batch_size * batch_size
        key = result_key(description, model_id, other.id)
        if rows > best_rows and is_stored(stored_result_dir(runs_root, key), key):
            best, best_rows = stored_result_dir(runs_root, key), rows
    return None if best is None else row_range(load_explanation(best), 0, best_rows)


def store_shared_parts(runs_root, description: dict[str, Any], model_id: str, image_set: ImageSet,
                       directory: Path, key: dict[str, Any], ranges: list[tuple[int, int]],
                       batch_size: int) -> int:
    """A chunked run's parts that ``shared_rows`` already holds, stored as parts (or as the whole
    result when one range covers the set); returns how many leading images they cover."""
    prefix = shared_rows(runs_root, description, model_id, image_set, batch_size)
    covered = 0 if prefix is None else len(prefix.targets)
    for start, stop in ranges:
        if stop > covered:
            break
        whole = (start, stop) == (0, len(image_set.images))
        folder, folder_key = (directory, key) if whole else (part_dir(directory, start, stop),
                                                             part_key(key, start, stop))
        if not is_stored(folder, folder_key):
            save_explanation(folder, row_range(prefix, start, stop), model_id, image_set.id,
                             image_range=None if whole else (start, stop))
    return max([stop for _, stop in ranges if stop <= covered], default=0)


def explain_after(prefix: Explanation | None, count: int, explain_from) -> Explanation:
    """The whole result of a set of ``count`` images: ``prefix``'s rows, then
    ``explain_from(start)`` for the images from the first one the prefix lacks."""
    start = 0 if prefix is None else len(prefix.targets)
    if start == count:
        return prefix
    rest = explain_from(start)
    return rest if prefix is None else concatenate([prefix, rest], "a stored prefix and the rest")


# Library notices that every batch would repeat and that say nothing about the user's run:
# captum's "hooks on ReLU" and "input did not require grad", torch.jit's deprecation.
QUIET = [("ignore", r"Setting backward hooks on ReLU", UserWarning),
         ("ignore", r"Input Tensor \d+ did not already require gradients", UserWarning),
         ("ignore", r"`torch.jit.script` is deprecated", FutureWarning)]


@contextmanager
def method_run_context(spec: ModelSpec, device) -> Iterator[None]:
    """Library notices quiet; on the CPU, the model's ``recipe.cpu_threads`` threads (module
    docstring), restored on exit."""

    with warnings.catch_warnings(), torch_threads(spec.recipe.cpu_threads if device.type == "cpu" else None):
        for action, message, category in QUIET:
            warnings.filterwarnings(action, message=message, category=category)
        yield


@contextmanager
def timed(images: int) -> Iterator[dict[str, float]]:
    """The ``TIMING`` record of the block: filled in on exit with its wall seconds and this
    process's CPU seconds (every thread's), for ``images`` images explained."""
    timing: dict[str, float] = {"images": images}
    wall, cpu = time.perf_counter(), time.process_time()
    yield timing
    timing.update(seconds=round(time.perf_counter() - wall, 3),
                  cpu_seconds=round(time.process_time() - cpu, 3))


@dataclass(frozen=True, kw_only=True)
class ExplainItem(StageItem):
    """One model and one method: all of the model's image sets (``detection_only``: its detection
    set), or with ``image_set`` (a chunked run) the images [start, stop) of that set.
    ``companions``: models explained with ``model`` in grouped passes ([explain] model_group)."""
    model: str
    method: MethodSpec
    device: str | None = None
    detection_only: bool = False
    image_set: str | None = None
    start: int = 0
    stop: int = 0
    companions: tuple[str, ...] = ()

    @property
    def models(self) -> tuple[str, ...]:
        return (self.model, *self.companions)

    @property
    def grouped(self) -> bool:
        """Whether the item's models are explained in grouped passes (even one model alone: its
        group is filled up, so it gets the bits it has in any group)."""
        return model_group(self.suite, METHODS.get(self.method.name)) > 1

    @property
    def name(self) -> str:
        more = f"+{len(self.companions)}" if self.companions else ""
        pair = f"{self.model}{more}/{self.method.name}"
        return pair if self.image_set is None else f"{pair}/{self.image_set}/{self.start}-{self.stop}"


class _Work:
    """What a work item needs, loaded in the process that runs it."""

    def __init__(self, item: ExplainItem):
        self.suite = item.suite
        self.spec = self.suite.model(item.model)
        self.runs_root = item.runs_dir
        self.root = self.suite.root(self.runs_root)
        self.method = item.method.build()
        self.batch_size = item.method.batch_size
        self.device = pick_device(item.device)
        self.world = build_world(self.suite.world, runs_root=self.runs_root)
        self.image_sets = load_image_sets(self.suite, self.runs_root, self.world,
                                          classes=self.method.model_level)
        self._model = None

    def target(self, set_name: str) -> tuple[ImageSet, Path, dict[str, Any]]:
        """The image set, the result's store folder and the result key of one set."""
        image_set = self.image_sets[set_name]
        key = result_key(self.description, self.spec.key, image_set.id)
        return image_set, stored_result_dir(self.runs_root, key), key

    def what(self, set_name: str) -> str:
        """The result of one set, for people: "<method> for <model> on <set>"."""
        return f"{self.method.name} for {self.spec.name} on {set_name}"

    @property
    def description(self) -> dict[str, Any]:
        return stage_description(self.suite, self.method, self.spec.architecture, self.batch_size)

    def for_models(self, names: tuple[str, ...]) -> list["_Work"]:
        """This work for each of the models ``names`` (the first is this one's), sharing its
        world, image sets and method."""
        works = [self]
        for name in names[1:]:
            other = copy.copy(self)
            other.spec, other._model = self.suite.model(name), None
            works.append(other)
        return works

    def run_from(self, image_set: ImageSet, start: int, stop: int | None = None) -> Explanation:
        """The method on images [start, stop) of a set, as rows of the whole set's result."""
        return run_range(self.method, self.model, image_set.tensor()[start:stop], start,
                         self.batch_size, labels=image_set.labels[start:stop],
                         model_id=self.spec.key)

    @property
    def model(self):
        """Loaded once, and only if something is missing."""
        if self._model is None:
            self._model = load_trained_model(model_dir(self.runs_root, self.spec), self.spec,
                                             self.world, self.device)
        return self._model


def result_lock(directory: Path, what: str) -> AbstractContextManager[None]:
    """Held while this process computes the result stored in ``directory``, so that two runs
    that need it at once (two suites, two shells on one runs folder) compute it once: the second
    waits, then finds it stored. Hidden beside the result's folder, which holds only its files."""
    return lock_beside(directory, "explain", f"explaining {what} ({directory})")


def part_lock(folder: Path, what: str) -> AbstractContextManager[None]:
    """``result_lock`` of a part: inside the part's folder, removed with it once gathered."""
    return artifact_lock(folder, ".explaining.lock", "explain", f"explaining {what} ({folder})")


def explain_one(item: ExplainItem) -> dict[str, int]:
    """Work item: one model, one method, all of that model's image sets (missing ones only)."""
    if item.grouped:
        return explain_group(item)
    work = _Work(item)
    counts = {"computed": 0, "stored": 0, "explained_images": 0, "reused_images": 0}
    batch = work.batch_size or work.method.default_batch_size
    with method_run_context(work.spec, work.device):
        for set_name in item_sets(work.suite, work.spec, work.method.name, item.detection_only):
            image_set, directory, key = work.target(set_name)

            def explain_set() -> str:
                prefix = shared_rows(work.runs_root, work.description, work.spec.key, image_set,
                                     batch)
                reused = 0 if prefix is None else len(prefix.targets)
                with timed(len(image_set.images) - reused) as timing:
                    explanation = explain_after(prefix, len(image_set.images),
                                                lambda start: work.run_from(image_set, start))
                counts["reused_images"] += reused
                counts["explained_images"] += len(image_set.images) - reused
                save_explanation(directory, explanation, work.spec.key, image_set.id,
                                 timing=timing if len(image_set.images) > reused else None)
                gather_parts(directory, key, [])  # removes parts a chunked run may have left
                return "computed"
            done = find_or_make(lambda: "stored" if is_stored(directory, key) else None,
                                explain_set, result_lock(directory, work.what(set_name)))
            counts[done] += 1
    return counts


def explain_part(item: ExplainItem) -> dict[str, int]:
    """Work item of a chunked run: one model, one method, images [start, stop) of one image set,
    stored as a part (or as the full result when the range is the whole set)."""
    if item.grouped:
        return explain_group_part(item)
    work = _Work(item)
    start, stop = item.start, item.stop
    image_set, directory, key = work.target(item.image_set)
    whole = (start, stop) == (0, len(image_set.images))
    folder, folder_key = (directory, key) if whole else (part_dir(directory, start, stop),
                                                         part_key(key, start, stop))

    def explain_range() -> dict[str, int]:
        with method_run_context(work.spec, work.device), timed(stop - start) as timing:
            explanation = work.run_from(image_set, start, stop)
        save_explanation(folder, explanation, work.spec.key, image_set.id,
                         image_range=None if whole else (start, stop), timing=timing)
        return {"computed": 1, "stored": 0, "explained_images": stop - start}

    def stored() -> dict[str, int] | None:
        if is_stored(directory, key) or is_stored(folder, folder_key):
            return {"computed": 0, "stored": 1, "explained_images": 0}
        return None

    what = work.what(item.image_set)
    lock = (result_lock(directory, what) if whole
            else part_lock(folder, f"{what}, images {start}-{stop}"))
    return find_or_make(stored, explain_range, lock)


def explain_together(works: list[_Work], image_set: ImageSet, start: int,
                     stop: int | None = None) -> list[Explanation]:
    """The method on images [start, stop) of a set for each work's model, as rows of the whole
    set's results: in grouped passes of the suite's model group, each of models that can share a
    grouped network (``grouping_key``), in the works' order."""
    lead = works[0]
    size = model_group(lead.suite, lead.method)
    batch = check_aligned(lead.method, start, lead.batch_size)
    images, labels = image_set.tensor()[start:stop], image_set.labels[start:stop]
    kinds: dict[Any, list[int]] = {}
    for index, work in enumerate(works):
        kinds.setdefault(grouping_key(work.model), []).append(index)
    results: list[Explanation | None] = [None] * len(works)
    for indices in kinds.values():
        for first in range(0, len(indices), size):
            group = indices[first:first + size]
            explanations = run_models(lead.method, [works[i].model for i in group], images, size,
                                      batch, first_position=start, labels=labels)
            for index, explanation in zip(group, explanations):
                results[index] = explanation
    return results


@contextmanager
def still_missing(works: list[_Work], missing: list[int], stored: Callable[[int], bool],
                  lock: Callable[[int], AbstractContextManager[None]]) -> Iterator[list[int]]:
    """Of the members ``missing``, those still missing once their locks are held (another run
    may have made some meanwhile); the locks are taken in the order of the works' model keys, so
    two grouped runs never wait on each other, and held until exit."""
    with ExitStack() as locks:
        for index in sorted(missing, key=lambda index: works[index].spec.key):
            locks.enter_context(lock(index))
        yield [index for index in missing if not stored(index)]


def share_of(timing: dict[str, float], images: int, total: int) -> dict[str, float]:
    """A member's part of a grouped pass's ``timed`` record: its images, and the pass's seconds
    in proportion to them."""
    part = images / total
    return {"images": images, "seconds": round(timing["seconds"] * part, 3),
            "cpu_seconds": round(timing["cpu_seconds"] * part, 3)}


def explain_group(item: ExplainItem) -> dict[str, int]:
    """Work item: one method, several models of one architecture, all of their image sets
    (missing ones only), computed in grouped passes (explain/model_groups.py)."""
    works = _Work(item).for_models(item.models)
    lead = works[0]
    counts = {"computed": 0, "stored": 0, "explained_images": 0, "reused_images": 0}
    batch = lead.batch_size or lead.method.default_batch_size
    with method_run_context(lead.spec, lead.device):
        for set_name in item_sets(lead.suite, lead.spec, lead.method.name, item.detection_only):
            targets = [work.target(set_name) for work in works]
            image_set = targets[0][0]
            count = len(image_set.images)

            def stored(index: int) -> bool:
                return is_stored(targets[index][1], targets[index][2])

            def lock(index: int) -> AbstractContextManager[None]:
                return result_lock(targets[index][1], works[index].what(set_name))
            missing = [index for index in range(len(works)) if not stored(index)]
            with still_missing(works, missing, stored, lock) as missing:
                prefixes = [shared_rows(lead.runs_root, works[index].description,
                                        works[index].spec.key, image_set, batch)
                            for index in missing]
                reused = [0 if prefix is None else len(prefix.targets) for prefix in prefixes]
                needing = [place for place, rows in enumerate(reused) if rows < count]
                start = min((reused[place] for place in needing), default=count)
                with timed(sum(count - rows for rows in reused)) as timing:
                    fresh = dict(zip(needing, explain_together(
                        [works[missing[place]] for place in needing], image_set, start)
                        if needing else []))
                for place, (index, prefix, rows) in enumerate(zip(missing, prefixes, reused)):
                    rest = fresh.get(place)
                    explanation = explain_after(
                        prefix, count, lambda first, rest=rest: row_range(rest, first - start,
                                                                          count - start))
                    _, directory, key = targets[index]
                    save_explanation(directory, explanation, works[index].spec.key, image_set.id,
                                     timing=share_of(timing, count - rows, timing["images"])
                                     if rows < count else None)
                    gather_parts(directory, key, [])  # removes parts a chunked run may have left
                counts["computed"] += len(missing)
                counts["stored"] += len(works) - len(missing)
                counts["reused_images"] += sum(reused)
                counts["explained_images"] += sum(count - rows for rows in reused)
    return counts


def explain_group_part(item: ExplainItem) -> dict[str, int]:
    """Work item of a chunked run: one method, several models of one architecture, images
    [start, stop) of one image set, computed in grouped passes, each model's stored as a part
    (or as its full result when the range is the whole set)."""
    works = _Work(item).for_models(item.models)
    lead = works[0]
    start, stop = item.start, item.stop
    targets = [work.target(item.image_set) for work in works]
    image_set = targets[0][0]
    whole = (start, stop) == (0, len(image_set.images))

    def folder(index: int) -> tuple[Path, dict[str, Any]]:
        _, directory, key = targets[index]
        return (directory, key) if whole else (part_dir(directory, start, stop),
                                               part_key(key, start, stop))

    def stored(index: int) -> bool:
        return is_stored(*targets[index][1:]) or is_stored(*folder(index))

    def lock(index: int) -> AbstractContextManager[None]:
        what = works[index].what(item.image_set)
        return (result_lock(targets[index][1], what) if whole
                else part_lock(folder(index)[0], f"{what}, images {start}-{stop}"))
    missing = [index for index in range(len(works)) if not stored(index)]
    with still_missing(works, missing, stored, lock) as missing:
        if missing:
            with method_run_context(lead.spec, lead.device), \
                    timed((stop - start) * len(missing)) as timing:
                fresh = explain_together([works[index] for index in missing], image_set, start, stop)
            for index, explanation in zip(missing, fresh):
                save_explanation(folder(index)[0], explanation, works[index].spec.key,
                                 image_set.id, image_range=None if whole else (start, stop),
                                 timing=share_of(timing, stop - start, timing["images"]))
    return {"computed": len(missing), "stored": len(works) - len(missing),
            "explained_images": (stop - start) * len(missing)}


class MissingResult(NamedTuple):
    """A (model, method, image set) result that is not stored: its store folder and key (None on
    a dry run's plan, made before the image sets exist) and its number of images."""
    image_set: str
    directory: Path
    key: dict[str, Any] | None
    images: int


class Gather(NamedTuple):
    """The parts a chunked run gathers into one result: its folder, its key, the parts' ranges."""
    directory: Path
    key: dict[str, Any] | None
    ranges: list[tuple[int, int]]


@dataclass(frozen=True)
class ExplainPlan(StagePlan[ExplainItem]):
    """The explain stage's plan: ``missing``, its work items, most expensive first (e.g.
    Caricatures before Guided Backprop, so local workers end together); ``stored``, the results
    stored already; ``gathers``, what a chunked run must gather; ``reused_images``, how many
    images a chunked run took from stored results of the same lineage (``store_shared_parts``)."""
    gathers: list[Gather] = field(default_factory=list)
    reused_images: int = 0


def plan_explanations(suite: Suite, methods: list[MethodSpec], specs: list[ModelSpec],
                      image_sets: dict[str, ImageSet] | None, chunk: int | None, runs_root,
                      device: str | None = None,
                      linked_sets: dict[str, LinkedSet] | None = None,
                      detection_only: bool = False) -> ExplainPlan:
    """The work items of the missing results and what a chunked run gathers (``ExplainPlan``).

    ``image_sets`` None: a dry run, which writes nothing; it reads the results stored for the
    sets an earlier run made (``linked_sets``) and plans every other result, with the sets'
    nominal sizes ([evaluate] detection_images / localization_images) for the ranges."""
    items, gathers, stored, reused = [], [], 0, 0
    cost: dict[tuple[str, str], float] = {}  # (method, model) -> passes per image
    for method_spec in methods:
        name, batch_size = method_spec.name, method_spec.batch_size
        method = method_spec.build()
        # A model-level result (one row per class) is small: one part, written whole.
        size = part_size(method, batch_size, chunk) if chunk and not method.model_level else None
        method_items: list[ExplainItem] = []
        for spec in specs:
            cost[(name, spec.name)] = method.passes_per_image(spec.architecture)
            description = stage_description(suite, method, spec.architecture, batch_size)
            missing, already = _missing_results(suite, name, description, spec, image_sets,
                                                runs_root, linked_sets or {}, detection_only)
            item = ExplainItem(suite=suite, runs_dir=resolved_runs_dir(runs_root), device=device,
                               model=spec.name, method=method_spec, detection_only=detection_only)
            if not chunk:  # one item for the (model, method); it counts the stored sets itself
                method_items += [item] if missing else []
                stored += 0 if missing else already
                continue
            stored += already
            for result in missing:
                ranges = image_ranges(result.images, size)
                gathers.append(Gather(result.directory, result.key, ranges))
                covered = 0 if result.key is None else store_shared_parts(
                    runs_root, description, spec.key, image_sets[result.image_set],
                    result.directory, result.key, ranges, batch_size or method.default_batch_size)
                reused += covered
                method_items += [replace(item, image_set=result.image_set, start=start, stop=stop)
                                 for start, stop in _parts_to_compute(result, ranges, covered)]
        items += grouped_items(suite, method, method_items, detection_only)
        if size and size != chunk and method_items:
            say("explain", f"{name}: parts of {size} images (chunk_images={chunk} rounded up to "
                           f"a multiple of its batch size {batch_size or method.default_batch_size}, "
                           "so its batches are those of an unchunked run)")
    return ExplainPlan(longest_first(items, lambda item: cost[(item.method.name, item.model)]
                                     * len(item.models)), stored, gathers, reused)


def grouped_items(suite: Suite, method: ExplanationMethod, items: list[ExplainItem],
                  detection_only: bool) -> list[ExplainItem]:
    """One method's work items, those of models that can share a grouped pass (one architecture
    and thread count, the same image sets or range) joined ``model_group`` at a time, in order;
    unchanged for a method explained alone. The item runs the models that turn out to differ
    (e.g. in output classes) in separate grouped passes."""
    size = model_group(suite, method)
    if size == 1:
        return items
    kinds: dict[Any, list[ExplainItem]] = {}
    for item in items:
        spec = suite.model(item.model)
        sets = tuple(item_sets(suite, spec, method.name, detection_only))
        kind = (spec.architecture, spec.recipe.cpu_threads, sets, item.image_set, item.start,
                item.stop)
        kinds.setdefault(kind, []).append(item)
    return [replace(group[0], companions=tuple(other.model for other in group[1:]))
            for same in kinds.values()
            for group in (same[first:first + size] for first in range(0, len(same), size))]


def _missing_results(suite: Suite, method: str, description: dict[str, Any], spec: ModelSpec,
                     image_sets: dict[str, ImageSet] | None, runs_root,
                     linked_sets: dict[str, LinkedSet],
                     detection_only: bool = False) -> tuple[list[MissingResult], int]:
    """The results of one (model, method) that are not stored, and how many are; each is linked
    from the suite's folder first (an older layout's result there is moved into the store). On
    a dry run (``image_sets`` None) nothing is linked or moved: a result counts as stored when
    the store holds it for a set in ``linked_sets``."""
    root = suite.root(runs_root)
    m, p = set_sizes(suite)
    missing, already = [], 0
    for set_name in item_sets(suite, spec, method, detection_only):
        if image_sets is None:
            linked = linked_sets.get(set_name)
            key = None if linked is None else result_key(description, spec.key, linked.id)
            if key is not None and is_stored(stored_result_dir(runs_root, key), key):
                already += 1
                continue
            missing.append(MissingResult(set_name, result_dir(root, method, spec.name, set_name),
                                         None, linked.count if linked else
                                         m if set_name == DETECTION else p))
            continue
        image_set = image_sets[set_name]
        key = result_key(description, spec.key, image_set.id)
        directory = stored_result_dir(runs_root, key)
        link_into_store(result_dir(root, method, spec.name, set_name), directory, runs_root,
                        VISUALIZATION.marks(key))
        if gather_parts(directory, key, []):  # stored (leftover parts are removed)
            already += 1
        else:
            missing.append(MissingResult(set_name, directory, key, len(image_set.images)))
    return missing, already


def _parts_to_compute(result: MissingResult, ranges: list[tuple[int, int]],
                      covered: int) -> list[tuple[int, int]]:
    """The ranges of a missing result that a chunked run computes: not the first ``covered``
    images (stored from a result of the same lineage), nor a part stored by an earlier run."""
    def part_stored(start: int, stop: int) -> bool:
        return (result.key is not None and len(ranges) > 1
                and is_stored(part_dir(result.directory, start, stop),
                              part_key(result.key, start, stop)))
    return [(start, stop) for start, stop in ranges
            if stop > covered and not part_stored(start, stop)]


def explain_suite(suite: Suite, options: RunOptions, methods: dict[str, MethodSpec] | None = None,
                  models: list[str] | None = None, detection_only: bool = False) -> dict[str, int]:
    """Every missing visualization of the suite, through the local or Slurm executor
    (``methods``: those ``method_specs`` made; default: the suite's).

    Returns counts of (model, method, image set) results: ``computed`` in this run, ``stored``
    before it, and ``parts`` computed by a chunked run (module docstring); and of images:
    ``explained_images`` run through a method, ``reused_images`` taken from a stored result of a
    set of the same lineage (``shared_rows``). If some items fail,
    the complete results are still gathered before ``ItemsFailedError`` is raised, and a rerun
    submits only the missing items."""
    methods = list((methods or method_specs(suite)).values())
    specs = [suite.model(m) for m in models] if models else suite.models
    config = executor_config(suite, options, "explain")
    chunk = chunk_images(suite)
    runs_root = options.runs_dir
    # Made once, here, so work items only read them; a dry run makes none, and reads the
    # results stored for the sets an earlier run made.
    image_sets = None if config.dry_run else load_image_sets(
        suite, runs_root, classes=any(method.model_level for method in methods))
    linked = linked_image_sets(suite, runs_root) if config.dry_run else None
    plan = plan_explanations(suite, methods, specs, image_sets, chunk, runs_root, options.device, linked,
                             detection_only)

    def describe(missing: list[ExplainItem]) -> str:  # a dry run's first line
        not_made = sets_needed(suite, specs) - set(linked or {})
        unmade = (f"; {len(not_made)} image set(s) not made yet "
                  "(a dry run makes none), so every result on them counts as missing"
                  if linked is not None and not_made else "")
        return (f"[dry-run] stage 'explain': {plan.stored} visualization set(s) already stored "
                f"(not computed again), {len(missing)} work item(s) to compute the rest{unmade}")

    def needed(unfinished: list[ExplainItem]) -> int | None:
        return space_needed(suite, image_sets, runs_root, unfinished)

    def item_name(item: ExplainItem) -> str:
        return item.name
    if not chunk:
        outcome = run_stage("explain", explain_one, plan, config, item_name=item_name,
                            space_needed=needed, describe=describe)
        return {"computed": outcome.total("computed"),
                "stored": plan.stored + outcome.total("stored"), "parts": 0,
                "explained_images": outcome.total("explained_images"),
                "reused_images": outcome.total("reused_images")}

    def gather_one(gather: Gather) -> bool:
        with lock_beside(gather.directory, "explain", f"gathering the parts of {gather.directory}"):
            return gather_parts(gather.directory, gather.key, gather.ranges)

    def gather() -> int:  # how many results are complete now (a one-part set is written whole)
        return sum(gather_one(each) for each in plan.gathers)

    try:
        outcome = run_stage("explain", explain_part, plan, config, item_name=item_name,
                            space_needed=needed, describe=describe)
    except ItemsFailedError as error:
        if not isinstance(error, OutOfSpaceError):  # no space to gather: the parts wait for a rerun
            gather()  # keep what is complete; a rerun submits only the failed parts
        raise
    if outcome.dry_run:
        return {"computed": 0, "stored": plan.stored, "parts": 0, "explained_images": 0,
                "reused_images": 0}
    return {"computed": gather(), "stored": plan.stored, "parts": outcome.total("computed"),
            "explained_images": outcome.total("explained_images"),
            "reused_images": plan.reused_images}


def space_needed(suite: Suite, image_sets: dict[str, ImageSet], runs_root,
                 items: list[ExplainItem]) -> int | None:
    """About how many bytes the results of ``items`` (work items not finished) will take: the
    images they have left to explain times the stored bytes per image of their method's finished
    results (for a method without any yet, the largest of the other methods': better too much
    than a second full disk); None before any result is stored."""
    stored = store_dir(runs_root) / VISUALIZATIONS
    per_image = {folder.name: _stored_bytes_per_image(folder)
                 for folder in (sorted(stored.iterdir()) if stored.is_dir() else [])}
    known = [size for size in per_image.values() if size is not None]
    if not known:
        return None
    total = 0.0
    for item in items:
        size = per_image.get(item.method.name) or max(known)
        total += size * _images_left(suite, image_sets, runs_root, item)
    return round(total)


def _stored_bytes_per_image(method_folder: Path, sample: int = 100) -> float | None:
    """Mean size per image of the arrays of (up to ``sample``) stored results of a method."""
    sizes, images = 0, 0
    for params in sorted(method_folder.glob(f"*/{PARAMS_FILE}"))[:sample]:
        try:
            shape = read_json(params)["images_shape"]
            sizes += (params.parent / ARRAYS_FILE).stat().st_size
        except (OSError, ValueError, KeyError):  # being rewritten, or not a finished result
            continue
        images += shape[-4]  # (layers,) images, height, width, channels
    return sizes / images if images else None


def _images_left(suite: Suite, image_sets: dict[str, ImageSet], runs_root, item: ExplainItem) -> int:
    """Images a work item has left to explain: its range (a chunked run's part), or the images of
    the sets of its (model, method) that are not stored."""
    if item.image_set is not None:
        return (item.stop - item.start) * len(item.models)
    method = item.method.build()
    left = 0
    for spec in map(suite.model, item.models):
        description = stage_description(suite, method, spec.architecture, item.method.batch_size)
        for set_name in sets_for(suite, spec, item.method.name):
            key = result_key(description, spec.key, image_sets[set_name].id)
            if not is_stored(stored_result_dir(runs_root, key), key):
                left += len(image_sets[set_name].images)
    return left


def explained_images_line(counts: dict[str, int]) -> str:
    """What ``explain_suite`` did, in images (for the stage's summary line)."""
    return (f"{counts.get('explained_images', 0)} image explanation(s) computed, "
            f"{counts.get('reused_images', 0)} reused from image sets of the same draw")


def load_results(suite: Suite, method: str, models: list[str], image_set: str, runs_root=None):
    """model -> stored Explanation of one method on one image set."""
    root = suite.root(runs_root)
    return {m: load_explanation(result_dir(root, method, m, image_set)) for m in models}
