"""Worlds: where images come from. ``WORLDS`` imports every module here (synthetic, imagenet) on
first lookup, so a new world is one new file."""
from counteraudit.train.worlds.base import WORLDS, Batch, Split, World, build_world

__all__ = ["WORLDS", "Batch", "Split", "World", "build_world"]
