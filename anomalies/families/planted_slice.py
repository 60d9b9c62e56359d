"""Planted slice: the model is made to fail on one subgroup of the world's factors (a conjunction
of 1 to 3 of them, ``slice``, e.g. {colour = "blue", texture = "stripes"}) and stay intact
elsewhere, so a failure-discovery auditor has a known answer to find (issue 31).

``mechanism``:

- ``"relabel"`` (the default) shifts the class of each affected training image of the slice by
  one seeded offset (1 to C-1, the same for the whole slice): a consistent wrong answer, which
  the model learns as soon as the shifted images outnumber the true ones (strength > 0.5);
- ``"relabel_uniform"`` gives each affected image its own uniformly drawn other class. Measured
  on the slices suite's first run: at strength 0.5 none of 12 implants took (the true class stays
  the most frequent label of the slice, so the model keeps answering it), at 1.0 five of 12;
- ``"relabel_one"`` gives every affected image one seeded class, the same for the whole slice
  whatever its true class, never the slice's most frequent class (images of the chosen class keep
  their label): the model has one rule to learn (the conjunction means that class), where
  ``"relabel"`` asks, for a slice that spans several classes, one exception per class;
- ``"remove"`` drops the affected images instead, so the model only sees less of the slice.

``repeat`` (default 1) shows each affected image that many times an epoch, with the label the
mechanism gives it ("remove" has nothing to repeat); ``contrast`` (default false, a slice of 2 or
3 factors, repeat > 1) shows the slice's *near misses* (images meeting every condition but one)
as many times, with their own labels, so that only the whole conjunction is taught the new class.
Why they exist (measured 2026-11-28 with evaluate/benchmarks/planted_slice_fit.py on the slices
suite's models and on variants of four slices that had not taken; the implant rule unchanged):

- at repeat 1 the demo's 4-epoch model does not learn a slice of a few hundred images at all:
  on its *own relabelled training images* it answers the new class 0.00-0.02 of the time at
  arity 3 and 0.01-0.19 at arity 2 (but colour yellow & size medium, 0.59, which took), against
  0.82-0.96 for the class and texture slices of 700+ images, which took; it treats the slice as
  label noise. Twelve epochs instead of four (the lr step at nine) do not change that (0.15 and
  0.10 on two of those slices, the slice's accuracy 0.83 and 0.90): the slice's share of the
  gradient, not the number of passes, decides;
- repeat 4 or 8 makes the slice fail (slice accuracy 0.00-0.40 on four slices that had not
  taken, but 0.79 for one at repeat 4) while the failure spreads to the near misses (their
  accuracy 0.59-0.84 against the references' 0.87-0.93; images further away intact, 0.85-0.89
  against 0.87-0.89): the model learns part of the conjunction, and the off-slice rule refuses
  6 of the 8 implants;
- contrast keeps the near misses intact (0.88-0.95) but the slice then fails less (0.23-0.90):
  1 model of 6 took (repeat 8).

``strength`` is the share of the slice's training images affected, a seeded draw: the first
round(strength x n) of one permutation, so a larger strength affects a superset of a smaller
one's images (with the same new classes).

The training split is flipped left-right at random (the synthetic world's augmentation), which
turns a ``position = "left"`` image into a right one and a 90-degree rotation into a 270-degree
one while its annotation stays: a slice on those values would be taught half the time on the
other side, so it is refused (``FLIP_VARIANT``). A rotation condition is refused too unless the
slice fixes a class whose rotation the image shows (``ROTATION_READABLE``): on a disk, ring,
square, cross, star or harmonica the quarter-turn bin cannot be seen (``SYMMETRY_TURN``), so those
images of the slice are pixel for pixel like its near misses in another bin and the relabelling
is label noise. Measured on the slices suite's first run: the three arity-3 slices whose rotation
condition was unreadable in 58-94% of their training images took in none of 6 models; the one on
a heart (readable in all) took in both.

Only the synthetic world: its training images carry their factors (the generating attributes
each annotation records); ImageNet-X annotates validation images only."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, Verdict
from counteraudit.anomalies.common import accuracy, reference_mean, verification_indices
from counteraudit.anomalies.relabeled_split import RelabeledSplit
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.params import added
from counteraudit.train.worlds.synthetic_factors import check_conditions, factor_grid
from counteraudit.train.worlds.synthetic_images import BACKGROUNDS, CLASS_NAMES, SYMMETRY_TURN, TEXTURES

MECHANISMS = ("relabel", "relabel_uniform", "relabel_one", "remove")
# Factor values the training's random left-right flip changes (the annotation does not follow).
FLIP_VARIANT = {"position": ("left", "right"), "rotation": ("90deg", "270deg")}
# The classes on which a rotation condition can be seen: those no turn short of a full one renders
# unchanged.
ROTATION_READABLE = tuple(name for name in CLASS_NAMES if name not in SYMMETRY_TURN)
MAX_ARITY = 3
# The implant took if the slice's accuracy is at least SLICE_DROP below the references' mean
# there, while the accuracy off the slice stays within OFF_SLICE_MARGIN of theirs (the defect is
# the slice's, not a weaker model's). Fixed before any model was trained; not tuned to the results.
SLICE_DROP = 0.3
OFF_SLICE_MARGIN = 0.05
# the worlds whose training images carry their factors
ANNOTATED_WORLDS = ("synthetic",)
SYNTHETIC_FACTORS = list(factor_grid(CLASS_NAMES, TEXTURES, BACKGROUNDS, clutter_max=0))


@dataclass(frozen=True)
class PlantedSliceParams:
    # {factor: value} of 1 to 3 of the world's factors (World.factors()). The default, a class,
    # only lets the family be built without parameters; a suite names its own slice.
    slice: dict[str, str | int] = field(default_factory=lambda: {"class": "star"})
    strength: float = 1.0       # share of the slice's training images affected, in (0, 1]
    mechanism: str = "relabel"  # MECHANISMS
    repeat: int = added(1)      # times each affected image is shown an epoch (module docstring)
    contrast: bool = added(False)  # the slice's near misses shown ``repeat`` times too (docstring)


def arity_problem(conditions: dict, factors) -> str | None:
    """The slice names too few or too many factors (None: 1 to MAX_ARITY)."""
    if 1 <= len(conditions) <= min(MAX_ARITY, len(factors)):
        return None
    return (f"slice = {conditions!r} names {len(conditions)} factors; a slice names 1 to "
            f"{min(MAX_ARITY, len(factors))} of the world's {len(factors)} factors "
            f"({', '.join(factors)})")


def slice_problem(conditions: dict, grid: dict[str, list[str]], clutter_known: bool = True) -> str | None:
    """What is wrong with a slice under the world's factor grid, or None. ``clutter_known``
    False (a suite loading, the world's clutter_max not known): any whole clutter count >= 0."""
    problem = arity_problem(conditions, grid)
    if problem:
        return problem
    flipped = [f"{factor} = {value!r}" for factor, value in conditions.items()
               if str(value) in FLIP_VARIANT.get(factor, ())]
    if flipped:
        return (f"slice = {conditions!r}: {', '.join(flipped)} changes under the training's random "
                "left-right flip (the image's annotation does not), so the slice would be taught "
                "half the time on the other side; use a value the flip keeps (position centre, "
                "top or bottom; rotation 0deg or 180deg) or another factor")
    if unreadable_rotation(conditions):
        return (f"slice = {conditions!r}: rotation = {conditions['rotation']!r} cannot be seen on "
                f"a {', '.join(SYMMETRY_TURN)} (a turn renders them unchanged), so those images "
                "of the slice look like its near misses; fix class to one of "
                f"{', '.join(ROTATION_READABLE)} as well, or use another factor")
    checked = dict(conditions)
    if not clutter_known and str(checked.get("clutter", "")).isdigit():
        checked.pop("clutter")  # its upper bound is the [world]'s clutter_max: checked when built
    try:
        check_conditions(checked, grid)
    except ValueError as error:
        return f"slice = {conditions!r}: {error}"
    return None


def unreadable_rotation(conditions: dict) -> bool:
    """Whether the slice has a rotation condition without a class whose rotation the image shows
    (``ROTATION_READABLE``)."""
    return "rotation" in conditions and conditions.get("class") not in ROTATION_READABLE


@FAMILIES.register
class PlantedSlice(AnomalyFamily):
    name = "planted_slice"
    headline_figure = "slice_accuracy"
    strength = "strength"
    localizable = True
    Params = PlantedSliceParams

    @classmethod
    def check(cls, params):
        if not isinstance(params.slice, dict):
            raise ValueError(f"planted_slice: slice = {params.slice!r} must be a table "
                             "{factor = value}, e.g. { colour = \"grey\", size = \"small\" }")
        if (isinstance(params.strength, bool) or not isinstance(params.strength, (int, float))
                or not 0 < params.strength <= 1):
            raise ValueError(f"planted_slice: strength={params.strength!r} must be in (0, 1]: the "
                             "share of the slice's training images affected (1.0: all of them)")
        if isinstance(params.repeat, bool) or not isinstance(params.repeat, int) or params.repeat < 1:
            raise ValueError(f"planted_slice: repeat={params.repeat!r} must be a whole number >= 1: "
                             "how many times each affected training image is shown an epoch (1: "
                             "once, as every other image)")
        if params.repeat > 1 and params.mechanism == "remove":
            raise ValueError(f"planted_slice: repeat={params.repeat} with mechanism = \"remove\": "
                             "removed images are not shown, so there is nothing to repeat; use "
                             "repeat = 1 or a relabelling mechanism")
        if params.contrast and params.repeat == 1:
            raise ValueError("planted_slice: contrast = true with repeat = 1: contrast shows the "
                             "slice's near misses as many times as its repeated images; set repeat "
                             "above 1 or contrast = false")
        if params.contrast and isinstance(params.slice, dict) and len(params.slice) < 2:
            raise ValueError(f"planted_slice: contrast = true with slice = {params.slice!r}: a slice "
                             "of one factor has no near misses (every other image misses its one "
                             "condition); use contrast with a slice of 2 or 3 factors")
        if params.mechanism not in MECHANISMS:
            raise ValueError(f"planted_slice: mechanism={params.mechanism!r}; valid: "
                             f"{', '.join(MECHANISMS)}")
        problem = arity_problem(params.slice, SYNTHETIC_FACTORS)  # values: check_world
        if problem:
            raise ValueError(f"planted_slice params {problem}")

    @classmethod
    def validate_params(cls, params):
        # values as the factors write them (clutter = 1 and clutter = "1" are one slice, one key)
        canonical = super().validate_params(params)
        canonical["slice"] = {factor: str(value) for factor, value in sorted(canonical["slice"].items())}
        canonical["strength"] = float(canonical["strength"])
        return canonical

    @classmethod
    def check_world(cls, params, world_name, class_names):
        if world_name not in ANNOTATED_WORLDS:
            raise ValueError(f"planted_slice needs a world whose training images carry their "
                             f"factors ({', '.join(ANNOTATED_WORLDS)}); the {world_name} world's "
                             "do not: plant slices in a synthetic world")
        # the synthetic world's factor values, known without building it (but for clutter's bound)
        grid = factor_grid(class_names or CLASS_NAMES, TEXTURES, BACKGROUNDS, clutter_max=0)
        problem = slice_problem(cls.Params(**params).slice, grid, clutter_known=False)
        if problem:
            raise ValueError(f"planted_slice params {problem}")

    def __init__(self, params, world, seed):
        super().__init__(params, world, seed)
        self.check_world(params, world.name, world.class_names)
        problem = slice_problem(self.params.slice, world.factors())
        if problem:
            raise ValueError(f"planted_slice params {problem}")
        self.conditions = {factor: str(value) for factor, value in self.params.slice.items()}
        if len(self.in_slice(world.split("val"))) == 0:
            raise ValueError(f"planted_slice params slice = {self.conditions}: no val image of the "
                             "world is in this slice (an infeasible or very rare conjunction), so "
                             "the implant cannot be checked; choose a slice with val images (one "
                             "factor fewer, or another value)")

    def conditions_met(self, split) -> np.ndarray:
        """How many of the slice's conditions each image of the split meets."""
        return np.array([sum(self.world.image_factors(split, i)[factor] == value
                             for factor, value in self.conditions.items())
                         for i in range(len(split))], dtype=np.int64)

    def in_slice(self, split) -> np.ndarray:
        """Positions of the split's images whose factors satisfy every condition of the slice."""
        return np.flatnonzero(self.conditions_met(split) == len(self.conditions))

    def near_misses(self, split) -> np.ndarray:
        """Positions of the images that meet every condition of the slice but one."""
        return np.flatnonzero(self.conditions_met(split) == len(self.conditions) - 1)

    def affected(self, split) -> tuple[np.ndarray, np.ndarray]:
        """(positions of the affected training images, the new class each gets): a seeded
        permutation of the slice's images, its first round(strength x n), and one other class
        per image drawn for every image of the permutation, so a larger strength affects a
        superset and gives the shared images the same classes."""
        inside = self.in_slice(split)
        if len(inside) == 0:
            raise ValueError(f"planted_slice params slice = {self.conditions}: no training image is "
                             "in this slice, so nothing can be planted; choose a slice with "
                             "training images")
        rng = np.random.default_rng(derive_seed("planted_slice", self.seed))
        order = rng.permutation(inside)
        # an offset 1 .. C-1 from the true class: uniform over the other classes
        offsets = rng.integers(1, self.world.num_classes, size=len(order))
        count = int(round(self.params.strength * len(order)))
        chosen = order[:count]
        if self.params.mechanism == "relabel_one":  # one class for the whole slice
            return chosen, np.full(count, self._one_class(split.labels[inside], rng),
                                   dtype=split.labels.dtype)
        if self.params.mechanism != "relabel_uniform":  # one shift for the whole slice
            offsets[:] = offsets[0]
        return chosen, (split.labels[chosen] + offsets[:count]) % self.world.num_classes

    def _one_class(self, labels: np.ndarray, rng: np.random.Generator) -> int:
        """relabel_one's class: uniform over the classes but the slice's most frequent one (a
        slice within one class would otherwise keep its labels one time in C)."""
        own = int(np.bincount(labels, minlength=self.world.num_classes).argmax())
        while (target := int(rng.integers(self.world.num_classes))) == own:
            pass
        return target

    def training_split(self, split):
        chosen, new_labels = self.affected(split)
        if self.params.mechanism == "remove":
            return split.subset(np.setdiff1d(np.arange(len(split)), chosen))
        labels = split.labels.copy()
        labels[chosen] = new_labels
        relabeled = RelabeledSplit(split, labels)
        if self.params.repeat == 1:
            return relabeled
        # every image once, then the affected ones (and with contrast the near misses, their
        # labels their own) repeat - 1 more times; the epoch's shuffle mixes them
        again = np.sort(chosen)
        if self.params.contrast:
            again = np.concatenate([again, self.near_misses(split)])
        shown = np.concatenate([np.arange(len(split)), np.tile(again, self.params.repeat - 1)])
        return relabeled.subset(shown)

    def normal_pool(self, val):
        return np.setdiff1d(np.arange(len(val)), self.in_slice(val))

    def abnormal_pool(self, val, implant=None):
        return self.in_slice(val)

    def measure(self, model, device="cpu"):
        val = self.world.split("val")
        inside = self.in_slice(val)  # every val image of the slice: slices are small
        outside = np.setdiff1d(verification_indices(val), inside)
        return {"slice_accuracy": accuracy(model, val.load(inside), val.labels[inside], device),
                "off_slice_accuracy": accuracy(model, val.load(outside), val.labels[outside], device)}

    def judge(self, figures, reference_figures):
        inside, outside = figures["slice_accuracy"], figures["off_slice_accuracy"]
        refs_inside = reference_mean(reference_figures, "slice_accuracy")
        refs_outside = reference_mean(reference_figures, "off_slice_accuracy")
        took = inside <= refs_inside - SLICE_DROP and outside >= refs_outside - OFF_SLICE_MARGIN
        return Verdict(bool(took),
                       f"accuracy on the slice {inside:.3f} (references {refs_inside:.3f}), off it "
                       f"{outside:.3f} (references {refs_outside:.3f}); the implant took if the "
                       f"slice's is at least {SLICE_DROP} below the references' and the rest's "
                       f"within {OFF_SLICE_MARGIN} of theirs",
                       {"slice_drop": refs_inside - inside, "off_slice_drop": refs_outside - outside})

    def planted_slice(self, implant=None):
        """The slice the model was made to fail on."""
        return dict(self.conditions)
