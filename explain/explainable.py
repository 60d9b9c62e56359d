"""A hook-safe copy of a model, made once for every explanation method.

Methods that hook modules break on two torchvision habits:
- ReLUs with ``inplace=True`` overwrite the tensor a forward hook saw, and a backward hook on an
  in-place op raises;
- torchvision's ``Bottleneck`` and ``BasicBlock`` call ONE ``self.relu`` module several times per
  forward, so a hook on it fires several times and a per-module record (lucent's ``hook_model``,
  pytorch-grad-cam's guided ReLU model, captum's DeconvNet) keeps only the last call.

``explainable(model)`` yields a deep copy in eval mode with frozen weights (no weight gradients
are ever needed, and not computing them makes every backward cheaper), in which each residual
block has three distinct, non-inplace ReLU modules and every other ReLU is non-inplace. Its
weights are in the channels_last layout (as in training: the fast convolution layout on GPUs and,
for these models, on CPUs too: 1.7x for a forward+backward of the small ResNet on one core), so
it computes the caller's logits up to float rounding. The caller's model is never touched, so
nothing needs restoring: the copy is dropped on exit.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck


class SplitReluBottleneck(Bottleneck):
    """torchvision's Bottleneck with one ReLU module per use (relu1, relu2, relu3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        # The shortcut after the main path, as torchvision: modules then run (and their gradients
        # arrive) in the order they are registered, which pytorch-grad-cam's FullGrad relies on
        # to pair each bias with its gradient.
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(out + identity)


class SplitReluBasicBlock(BasicBlock):
    """torchvision's BasicBlock with one ReLU module per use (relu1, relu2)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)  # torchvision's order
        return self.relu2(out + identity)


_SPLIT_BLOCKS = {Bottleneck: (SplitReluBottleneck, 3), BasicBlock: (SplitReluBasicBlock, 2)}


def _split_block_relus(block: nn.Module) -> None:
    split_class, uses = _SPLIT_BLOCKS[type(block)]
    del block.relu  # the shared module; replaced by one module per use
    block.__class__ = split_class
    for i in range(1, uses + 1):
        setattr(block, f"relu{i}", nn.ReLU(inplace=False))


def make_explainable_copy(model: nn.Module) -> nn.Module:
    """The copy described in the module docstring (no probe; see ``check_relus_used_once``)."""
    explainable_model = copy.deepcopy(model)
    explainable_model.eval()
    explainable_model.requires_grad_(False)
    explainable_model.to(memory_format=torch.channels_last)
    for module in list(explainable_model.modules()):
        if type(module) in _SPLIT_BLOCKS:  # exact type: a user subclass may have its own forward
            _split_block_relus(module)
        elif isinstance(module, nn.ReLU):
            module.inplace = False
    return explainable_model


def check_relus_used_once(model: nn.Module, example_images: torch.Tensor) -> None:
    """Run one forward and raise if any ReLU module is called more than once in it."""
    calls: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ReLU):
            def count(_module, _inputs, _output, name=name):
                calls[name] = calls.get(name, 0) + 1
            handles.append(module.register_forward_hook(count))
    try:
        with torch.no_grad():
            model(example_images)
    finally:
        for handle in handles:
            handle.remove()
    reused = {name: n for name, n in calls.items() if n > 1}
    if reused:
        raise ValueError(
            f"ReLU module(s) called more than once per forward: {reused}. Hook-based methods "
            "(guided backprop, lucent) need one module per use; add a split-ReLU version of the "
            "block that owns them to _SPLIT_BLOCKS in explain/explainable.py")


@contextmanager
def explainable(model: nn.Module, example_images: torch.Tensor | None = None) -> Iterator[nn.Module]:
    """Yield a hook-safe copy of ``model`` (see module docstring); dropped on exit.

    With ``example_images`` (one image is enough) it also checks that no ReLU module is reused,
    which catches blocks this module does not know.
    """
    explainable_model = make_explainable_copy(model)
    if example_images is not None:
        check_relus_used_once(explainable_model, example_images)
    try:
        yield explainable_model
    finally:
        del explainable_model
