"""The grouped network (train/grouped.py, which the grouped engine trains and
evaluate/benchmarks/grouped_training.py times) computes the k models it stacks: a grouped step is
each model's own step."""
from __future__ import annotations

import copy

import counteraudit.train  # noqa: F401, I001  (first: the numeric mode)
import torch
from torch import nn

from counteraudit.evaluate.benchmarks.grouped_training import ENGINES, STEPS, _step_functions
from counteraudit.train.grouped import GroupedClassifier, MemberView, PerModelLogits, grouped_network
from counteraudit.train.architectures import SmallResNet, build_model


def _models_and_batches(k: int = 3, batch: int = 8, size: int = 32):
    """k models and their batches in float64: in float32, a training step of an untrained model
    on 8 images amplifies rounding through BatchNorm on 2x2 maps to differences of 1e-2 between
    two orders of the same sums, which would hide a wrong gradient; in float64 the grouped and
    the alone step agree to 1e-12."""
    torch.manual_seed(0)
    models = [SmallResNet(10).double() for _ in range(k)]
    images = [torch.rand(batch, 3, size, size, dtype=torch.float64) for _ in range(k)]
    labels = [torch.randint(0, 10, (batch,)) for _ in range(k)]
    return models, images, labels


def test_the_grouped_network_gives_each_models_logits():
    models, images, _ = _models_and_batches()
    grouped = grouped_network(models).eval()
    logits = grouped(torch.cat(images, 1))
    for index, (model, x) in enumerate(zip(models, images)):
        torch.testing.assert_close(logits[:, index], model.eval()(x), rtol=1e-12, atol=1e-12)


def test_one_grouped_sgd_step_is_each_models_own_step():
    """Weights, BatchNorm statistics included, after one training step: model i of the grouped
    network equals model i trained alone on its own batch."""
    models, images, labels = _models_and_batches()
    alone = copy.deepcopy(models)
    grouped = PerModelLogits(grouped_network(models))
    optimizer = torch.optim.SGD(grouped.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    interleaved = torch.stack(labels, 1).reshape(-1)
    optimizer.zero_grad()
    (nn.functional.cross_entropy(grouped(torch.cat(images, 1)), interleaved) * len(models)).backward()
    optimizer.step()
    for model, x, y in zip(alone, images, labels):
        own = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        own.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        own.step()
    state = grouped.network.state_dict()
    k = len(models)
    for name, value in alone[1].state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        stacked = state[name]
        if name == "fc.weight" or name == "fc.bias":
            mine = stacked[1]
        else:
            mine = stacked.reshape(k, -1, *stacked.shape[1:])[1]
        torch.testing.assert_close(mine, value, rtol=1e-10, atol=1e-12,
                                   msg=lambda text: f"{name}: {text}")


def test_the_grouped_classifier_gives_each_classifiers_logits():
    """Normalisation and a missing class's spread into the world's class indices, as each member
    Classifier does: member i's logits, absent class included, are column block i."""
    torch.manual_seed(0)
    members = [build_model("small_resnet", 10, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3),
                           output_classes=[c for c in range(10) if c != 3]).double().eval()
               for _ in range(3)]
    images = [torch.rand(4, 3, 32, 32, dtype=torch.float64) for _ in members]
    logits = GroupedClassifier(members).double().eval()(torch.cat(images, 1))
    for index, (member, x) in enumerate(zip(members, images)):
        torch.testing.assert_close(logits[:, index], member(x), rtol=1e-12, atol=1e-12)
    assert bool((logits[:, :, 3] == -1e4).all())


def test_a_member_view_computes_with_the_groups_current_weights_and_statistics():
    """What PGD attacks in a group: member i as its own model, with the group's weights as they
    are now (after a step, not its initial ones), and a training-mode pass updating member i's
    BatchNorm statistics in the group, as the solo model's pass updates its own."""
    torch.manual_seed(0)
    members = [build_model("small_resnet", 10, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)).double()
               for _ in range(3)]
    grouped = GroupedClassifier(members).double()
    with torch.no_grad():
        for parameter in grouped.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    images = [torch.rand(4, 3, 32, 32, dtype=torch.float64) for _ in members]
    view = MemberView(grouped, members[1], 1)
    grouped.eval()
    torch.testing.assert_close(view(images[1]), grouped(torch.cat(images, 1))[:, 1],
                               rtol=1e-12, atol=1e-12)
    grouped.train()
    alone = copy.deepcopy(members[1])
    alone.backbone.load_state_dict(grouped.member_state(1))
    alone.train()(images[1])
    view(images[1])
    after = grouped.member_state(1)
    for name, value in alone.backbone.state_dict().items():
        if name.endswith("running_mean") or name.endswith("running_var"):
            torch.testing.assert_close(after[name], value, rtol=1e-12, atol=1e-12)


def test_every_engine_of_the_benchmark_steps_wholly_on_the_requested_device():
    """The benchmark's GPU figures need every weight, input and attack draw on the GPU. On the
    meta device, anything left on the CPU (a grouped network built from the models after they
    moved, a PGD start drawn with a CPU generator) fails the step as it would on CUDA."""
    for kind in STEPS:
        steps = _step_functions(2, 4, 16, kind, list(ENGINES), torch.device("meta"), "fp32")
        assert sorted(steps) == sorted(ENGINES)
        for step in steps.values():
            step()
