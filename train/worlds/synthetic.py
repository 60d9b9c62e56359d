"""The synthetic world: procedural, seeded, annotated images that stand in for ImageNet, offered
through the World interface (its images: ``synthetic_images.py``; its named factors and
conditional generation: ``synthetic_factors.py``)."""
from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from counteraudit.train.core.artifacts import (WORLDS_FOLDER, artifact_lock, atomic_write_json, find_or_make,
                                               runs_dir, stable_hash)
from counteraudit.train.core.size_bounds import world_memory_problem
from counteraudit.train.worlds import synthetic_factors
from counteraudit.train.worlds.base import WORLDS, Split, World
from counteraudit.train.worlds.synthetic_factors import (PARTS, FactorPool, cached_generation,
                                                         check_conditions, factor_grid, factor_values)
from counteraudit.train.worlds.synthetic_images import (BACKGROUNDS, CLASS_NAMES, GENERATOR_VERSION,
                                                        SPLIT_IDS, TEXTURES, InMemorySplit, SyntheticConfig,
                                                        generate, load_cached, save_cached)

# the images: attributes, rendering, generation, cache


@WORLDS.register
class SyntheticWorld(World):
    name = "synthetic"
    config_class = SyntheticConfig
    class_names = CLASS_NAMES
    default_image_size = SyntheticConfig.image_size
    # Statistics of the default world's pixels, measured once; they only condition the inputs.
    mean = (0.5, 0.5, 0.5)
    std = (0.25, 0.25, 0.25)

    def __init__(self, config: SyntheticConfig | None = None, cache_dir: str | os.PathLike | None = None,
                 verbose: bool = True):
        self.config = config or SyntheticConfig()
        if self.config.image_size < 32:
            raise ValueError(f"image_size={self.config.image_size} is too small to draw faces and "
                             "objects legibly; use 32 or more (64 recommended)")
        self.image_size = self.config.image_size
        key = stable_hash({"version": GENERATOR_VERSION, **asdict(self.config)})
        self.cache_dir = Path(cache_dir or runs_dir() / WORLDS_FOLDER) / f"synthetic-{key}"
        self.verbose = verbose
        self._splits: dict[str, InMemorySplit] = {}

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> list[str]:
        if "decode" in config:
            return [f"[world] decode = {config['decode']!r}: the synthetic world renders its "
                    "images in memory and has no JPEG files to decode; remove decode from [world] "
                    "(it is an option of the imagenet world)"]
        problems = super().config_problems(config)
        if not problems:  # each size valid: do they fit in memory together?
            full = {**asdict(SyntheticConfig()), **config}
            problem = world_memory_problem(full["num_train"], full["num_val"], full["image_size"])
            problems += [problem] if problem else []
        return problems

    @classmethod
    def listed_val_size(cls, config: dict[str, Any]) -> int | None:
        return int(config.get("num_val", SyntheticConfig.num_val))

    @classmethod
    def from_config(cls, config: dict[str, Any], runs_root=None) -> "SyntheticWorld":
        cls.check_config(config)
        return cls(SyntheticConfig(**config), cache_dir=runs_dir(runs_root) / WORLDS_FOLDER)

    def split(self, name: str, texture_randomized: bool = False) -> InMemorySplit:
        if name not in SPLIT_IDS:
            raise ValueError(f"unknown split {name!r}; valid: {', '.join(SPLIT_IDS)}")
        key = f"{name}-texture-randomized" if texture_randomized else name
        if key not in self._splits:
            self._splits[key] = self._load_or_generate(name, key, texture_randomized)
        return self._splits[key]

    def _load_or_generate(self, name: str, key: str, texture_randomized: bool) -> InMemorySplit:
        def load() -> InMemorySplit | None:
            cached = load_cached(self.cache_dir, key)
            return None if cached is None else InMemorySplit(*cached, hflip=name == "train")

        return find_or_make(load, lambda: self._generate(name, key, texture_randomized),
                            self.generation_lock(key))

    def generation_lock(self, key: str) -> AbstractContextManager[None]:
        """Held while this process generates a split (``key``: its name, or its texture-randomized
        copy's): two runs that need it at once generate it once, the second reads it."""
        return artifact_lock(self.cache_dir, f".{key}.lock", "world",
                             f"generating the synthetic world's {key} split in {self.cache_dir}")

    def _generate(self, name: str, key: str, texture_randomized: bool) -> InMemorySplit:
        started = time.perf_counter()
        images, labels, annotations = generate(self.config, name, texture_randomized)
        save_cached(self.cache_dir, key, images, labels, annotations)
        atomic_write_json(self.cache_dir / "config.json",
                          {"version": GENERATOR_VERSION, **asdict(self.config)})
        if self.verbose:
            print(f"[world] generated {len(images)} synthetic {key} images in "
                  f"{time.perf_counter() - started:.1f}s -> {self.cache_dir / key}.npz", flush=True)
        return InMemorySplit(images, labels, annotations, hflip=name == "train")

    # ---- factors and conditional generation (train/worlds/synthetic_factors.py)
    def factors(self) -> dict[str, list[str]]:
        if getattr(self, "_factors", None) is None:
            self._factors = factor_grid(CLASS_NAMES, TEXTURES, BACKGROUNDS, self.config.clutter_max)
        return {factor: list(values) for factor, values in self._factors.items()}

    def image_factors(self, split: Split, index: int) -> dict[str, str]:
        return factor_values(split.annotation(index)["attributes"], self.image_size)

    def factor_pool(self):
        """The pool of attribute draws conditional generation picks from (made once, cached)."""
        if getattr(self, "_factor_pool", None) is None:
            self._factor_pool = FactorPool.shared(self.config, self.factors(), self.cache_dir,
                                                  synthetic_factors.POOL_PER_CLASS)
        return self._factor_pool

    has_generator = True

    @property
    def factors_version(self) -> str:
        """What the factors' feasibility depends on besides the config (cache keys use it)."""
        return f"{synthetic_factors.FACTORS_VERSION}-{synthetic_factors.POOL_PER_CLASS}"

    def feasible(self, conditions: dict[str, str]) -> bool:
        self.factors()
        if not all(f in self._factors and v in self._factors[f] for f, v in conditions.items()):
            conditions = check_conditions(conditions, self._factors)  # the error lists valid ones
        return self.factor_pool().feasible(conditions)

    def constraint_groups(self) -> list[list[str]]:
        return [["class", *names] for names, _ in PARTS.values()]

    def generate(self, conditions: dict[str, str], n: int, seed: int) -> InMemorySplit:
        """n images satisfying ``conditions``, cached under the world's cache folder; the
        annotations also hold each image's ``factors``."""
        conditions = check_conditions(conditions, self.factors())
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n={n!r} images: ask for a whole number >= 1")
        images, labels, annotations = cached_generation(self.config, self.factor_pool,
                                                        self.cache_dir, conditions, n, int(seed))
        return InMemorySplit(images, labels, annotations, hflip=False)

    def prepare(self) -> "SyntheticWorld":
        for name in SPLIT_IDS:
            self.split(name)
        return self

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **asdict(self.config), "cache": str(self.cache_dir)}
