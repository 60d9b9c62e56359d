"""Worlds: where images come from. Importing this package registers the built-in worlds."""
from counteraudit.train.worlds.base import WORLDS, Batch, Split, World, build_world
from counteraudit.train.worlds import synthetic as _synthetic  # noqa: F401  (registers "synthetic")
from counteraudit.train.worlds import imagenet as _imagenet  # noqa: F401  (registers "imagenet")

__all__ = ["WORLDS", "Batch", "Split", "World", "build_world"]
