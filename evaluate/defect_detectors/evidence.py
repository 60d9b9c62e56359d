"""What a detector is given besides the model (``detectors.base.Evidence``), made the same way for
every model of a suite, so that a reference and an anomalous model are inspected on equal terms:

- **clean images**: the defender's small clean set, drawn with a fixed seed from the world's
  validation images outside every image set the auditors are scored on (so no detector has seen
  a scored image), the same images for every model;
- **image sets**: the sets an explanation method explains for this model (``explain.stage.
  sets_for``: the detection set; a localizable model's abnormal and normal sets; a reference's
  every such set), for the detectors that score inputs;
- **a training sample**, for the detectors that need the training data: the first batches of the
  model's own first epoch (its seed's data order and augmentation), passed through its anomaly
  family as training passed them (a backdoor's trigger and target label, a relabelling), with
  the rows the family changed marked. Only a model trained here has one: an imported checkpoint's
  training data is unknown (``training_data_problem``).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn

from counteraudit.anomalies.image_sets import ImageSet
from counteraudit.evaluate.defect_detectors.detectors.base import Evidence, TrainingSample
from counteraudit.explain.stage import sets_for
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.training_parts import build_family

CLEAN_IMAGES = 100      # the defender's clean set
TRAINING_IMAGES = 2048  # training images a latent-separability detector sees (32 batches of 64)


def training_data_problem(suite: Suite, spec: ModelSpec) -> str | None:
    """Why ``spec``'s training data cannot be given to a detector (None: it can)."""
    if spec.checkpoint is not None:
        return (f"model {spec.name!r} is loaded from the checkpoint {spec.checkpoint!r} (suite "
                f"{suite.name!r}, its entry's checkpoint key): its training data is not known")
    return None


def clean_positions(world, image_sets: Mapping[str, ImageSet], count: int, seed: int) -> np.ndarray:
    """``count`` positions in the world's val split outside every image set, in a fixed-seed
    order: the defender's clean images."""
    val = world.split("val")
    used = set()
    for image_set in image_sets.values():
        used.update(int(i) for i in np.asarray(image_set.val_indices).ravel())
    order = np.random.default_rng(derive_seed(seed, "detector-clean-images")).permutation(len(val))
    free = order[~np.isin(order, np.fromiter(used, dtype=np.int64, count=len(used)))]
    if len(free) < count:
        raise ValueError(f"the world's val split has {len(free)} images outside the scored image "
                         f"sets, fewer than the {count} clean images a detector is given")
    return free[:count]


def training_sample(spec: ModelSpec, world, model: nn.Module, count: int = TRAINING_IMAGES,
                    ) -> TrainingSample:
    """The first ``count`` images of ``spec``'s first training epoch, as it trained on them."""
    family = build_family(spec, world)
    split = world.split("train") if family is None else family.training_split(world.split("train"))
    batch_size = spec.recipe.batch_size
    generator = torch.Generator().manual_seed(derive_seed(spec.seed, "detector-training-sample"))
    images, labels, changed = [], [], []
    for batch in split.train_batches(batch_size, spec.seed, 0):
        batch_images, batch_labels = batch.images, batch.labels
        if family is not None:
            batch_images, batch_labels = family.training_inputs(model, batch.images, batch.labels,
                                                                generator)
        touched = ((batch_labels != batch.labels).numpy()
                   | (batch_images != batch.images).flatten(1).any(1).numpy())
        images.append(batch_images.detach())
        labels.append(batch_labels)
        changed.append(touched)
        if sum(len(chunk) for chunk in labels) >= count:
            break
    return TrainingSample(torch.cat(images)[:count], torch.cat(labels)[:count],
                          np.concatenate(changed)[:count])


def evidence_for(suite: Suite, spec: ModelSpec, world, model: nn.Module,
                 image_sets: Mapping[str, ImageSet], *, with_training: bool, seed: int = 0,
                 clean_count: int = CLEAN_IMAGES, training_count: int = TRAINING_IMAGES) -> Evidence:
    """The evidence a detector gets for ``spec`` (module docstring). ``image_sets``: the suite's
    sets (``explain.stage.load_image_sets``)."""
    val = world.split("val")
    positions = clean_positions(world, image_sets, clean_count, seed)
    own_sets = {name: image_sets[name].tensor() for name in sets_for(suite, spec)}
    return Evidence(num_classes=world.num_classes, clean_images=val.load(positions),
                    clean_labels=torch.as_tensor(val.labels[positions], dtype=torch.long),
                    image_sets=own_sets,
                    training=training_sample(spec, world, model, training_count)
                    if with_training else None)
