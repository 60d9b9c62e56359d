"""The training recipe: SGD with step decay, its keys' types and ranges, and how its fields fit."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.params import added, key_params, params_problems
from counteraudit.train.core.suite_schema import ScheduleSegment
from pydantic import Field


@dataclass(frozen=True)
class Recipe:
    """SGD with step decay. Defaults: the paper's (torchvision's ResNet-50 recipe, batch 300)."""
    epochs: Annotated[int, Field(ge=1, le=bounds.EPOCHS.limit, json_schema_extra=bounds.EPOCHS.extra,
                                 description="training epochs (the paper: 90)")] = 90
    batch_size: Annotated[int, Field(ge=1, le=bounds.BATCH.limit, json_schema_extra=bounds.BATCH.extra,
                                     description="images per step (the paper: 300)")] = 300
    lr: Annotated[float, Field(gt=0, description="the initial learning rate (the paper: 0.1)")] = 0.1
    momentum: Annotated[float, Field(ge=0, lt=1, description="SGD momentum (the paper: 0.9)")] = 0.9
    weight_decay: Annotated[float, Field(ge=0, description="the paper: 1e-4")] = 1e-4
    # multiply the learning rate by lr_gamma every this many epochs
    lr_step_epochs: Annotated[int, Field(ge=1, le=bounds.EPOCHS.limit, json_schema_extra=bounds.EPOCHS.extra,
                                         description="epochs between learning-rate decays (the paper: 30)")] = 30
    lr_gamma: Annotated[float, Field(gt=0, le=1, description="the decay factor (the paper: 0.1)")] = 0.1
    # Linear learning-rate warmup over this many epochs (fractions allowed), from lr/steps to lr,
    # as torchvision's reference recipe offers (--lr-warmup-epochs). 0: none (the paper's recipe).
    # Short CPU schedules need it: without it some seeds stall in their first epoch at lr 0.1.
    lr_warmup_epochs: Annotated[float, Field(ge=0, description=(
        "epochs of linear warmup, at most epochs (0: none, the paper's)"))] = 0.0
    eval_batch_size: Annotated[int, Field(ge=1, le=bounds.BATCH.limit, json_schema_extra=bounds.BATCH.extra,
                                          description="images per evaluation batch")] = 100
    # Intra-op threads on a CPU: of each model's training and explanations, and (the suite's
    # recipe) of every other work item. Part of the recipe because some CPU kernels reduce in a
    # thread-dependent order, so the thread count changes the bits: fixing it makes the same seed
    # give the same results on any machine and executor (train/core/threads.py). Parallelism
    # comes from running several items at once (--jobs, Slurm arrays). Ignored on GPUs.
    cpu_threads: Annotated[int, Field(ge=1, le=bounds.THREADS.limit, json_schema_extra=bounds.THREADS.extra,
                                      description="threads per CPU training, explanation or work item (1)")] = 1
    # bfloat16 autocast for CPU training, as the recipe always does on GPUs: 1.8x the fp32
    # throughput of the small ResNet on a CPU with native bf16 (AVX512-BF16 or AMX, e.g. AMD Zen 4,
    # Intel Sapphire Rapids); older CPUs emulate it, so leave it off there. Changes the weights.
    cpu_bf16: Annotated[bool, Field(description="bfloat16 autocast on CPUs (false)")] = False
    # Progressive resizing: the side of the training crops, epoch by epoch, as segments in order,
    # [{ epochs = 12, size = 160 }, { epochs = 4, size = 192 }] (FFCV's ResNet-50 schedules:
    # 160 px for the first 75% of the epochs, then 192). The segments must cover every epoch.
    # Empty: every epoch at the world's image_size. Evaluation keeps the world's sizes.
    resolution_schedule: tuple[tuple[int, int], ...] = added(())
    # How the models of this recipe are trained: "alone", each by itself (one model per process),
    # or "grouped", group_size models of one world, architecture and recipe as one grouped
    # network (train/group_trainer.py): the same per-model training, other rounding, so other
    # bits, and a key of their own. A member's bits depend on group_size (measured: a model
    # trained in a group of 2 and of 4 differs by 1e-6 after four steps), never on its companions,
    # so a group short of members is filled up to group_size (train/README.md).
    engine: Annotated[Literal["alone", "grouped"], Field(description=(
        "alone: one model per process (the default); grouped: group_size models as one network"))
    ] = added("alone")
    group_size: Annotated[int, Field(ge=1, le=bounds.GROUP.limit, json_schema_extra=bounds.GROUP.extra,
                                     description="models per grouped network (engine grouped)")
                          ] = added(8)

    @classmethod
    def from_dict(cls, table: dict[str, Any], where: str = "[recipe]") -> "Recipe":
        """A recipe from a suite's ``[recipe]`` table (every key checked by the schema, values
        kept exactly as written: they are part of model keys)."""
        problems = recipe_problems(table, where)
        if problems:
            raise ValueError("; ".join(problems))
        table = dict(table)
        if "resolution_schedule" in table:
            table["resolution_schedule"] = resolution_segments(table["resolution_schedule"])
        return cls(**table)

    def crop_size(self, epoch: int) -> int | None:
        """The training crop side of ``epoch`` (0-based) under the resolution schedule; None
        without one (the world's image_size). A function of the epoch alone, so a run resumed
        mid-schedule trains each epoch at the size the uninterrupted run did."""
        end = 0
        for epochs, size in self.resolution_schedule:
            end += epochs
            if epoch < end:
                return size
        return None

    def identity(self) -> dict[str, Any]:
        """The recipe's part of a model's key (``key_params``: a field declared ``added`` is
        left out while at the value models were trained with before it existed). A grouped
        model's key always holds its group_size (its bits depend on it); a solo model's never."""
        identity = key_params(self)
        if self.engine == "grouped":
            identity["group_size"] = self.group_size
        else:
            identity.pop("group_size", None)
        return identity


def resolution_segments(value: Any) -> tuple[tuple[int, int], ...]:
    """[{ epochs, size }, ...] (a suite file) or [(epochs, size), ...] (a Recipe's own) ->
    ((epochs, size), ...); the schema has checked every number."""
    return tuple((int(s["epochs"]), int(s["size"])) if isinstance(s, dict) else (int(s[0]), int(s[1]))
                 for s in value)


# The recipe's file form: resolution_schedule is written as a list of { epochs, size } tables.
_RECIPE_FILE_FORM = (("resolution_schedule", list[ScheduleSegment | tuple[int, int]]),)


def recipe_problems(table: dict[str, Any], where: str = "[recipe]") -> list[str]:
    """What is wrong with a recipe table (every key's type and range, and how they fit)."""
    problems = params_problems(Recipe, table, where, _RECIPE_FILE_FORM)
    if problems:
        return problems
    epochs = table.get("epochs", Recipe.epochs)
    if table.get("lr_warmup_epochs", 0) > epochs:
        problems.append(f"{where} lr_warmup_epochs = {table['lr_warmup_epochs']!r} must be at most "
                        f"epochs = {epochs} (0: no warmup)")
    schedule = resolution_segments(table.get("resolution_schedule", ()))
    covered = sum(segment_epochs for segment_epochs, _ in schedule)
    if schedule and covered != epochs:
        problems.append(
            f"{where} resolution_schedule covers {covered} epochs but epochs = {epochs}; make its "
            f"segments' epochs add up to {epochs} (e.g. [{{ epochs = {epochs - epochs // 4}, "
            f"size = 160 }}, {{ epochs = {epochs // 4}, size = 192 }}])")
    return problems
