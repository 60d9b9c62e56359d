"""The grouped engine (recipe engine = "grouped", train/group_trainer.py): a member trains as its
solo twin does, up to rounding; its key is its own; its bits depend on the group size, never on
its companions; an interrupted group resumes to the same bits; models that cannot step together
are split; a suite trains end to end through the stage."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_WORLD, write_suite
from counteraudit.train.checked_training import train_and_check
from counteraudit.train.checkpoint import CHECKPOINT_NAME, WEIGHTS_NAME, model_dir, read_metrics
from counteraudit.train.core.recipe import Recipe
from counteraudit.train.core.stage import RunOptions
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_files import toml_text
from counteraudit.train.group_trainer import Member, subgroups
from counteraudit.train.stage import train_models, training_items
from counteraudit.train.engines import train_models_together
from counteraudit.train.trainer import load_trained_model, train_model
from counteraudit.train.worlds import build_world


ADVERSARIAL = """
[[anomalies]]
name = "adversarial"
family = "adversarial"
params = { steps = 1, eval_steps = 1, eval_images = 20 }
"""


def _grouped(spec, size: int = 2):
    return replace(spec, recipe=replace(spec.recipe, engine="grouped", group_size=size))


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return torch.load(directory / WEIGHTS_NAME, weights_only=True)


def _same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _relative_distance(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over every floating-point weight and statistic."""
    keys = [k for k in a if a[k].is_floating_point()]
    difference = sum(float((a[k] - b[k]).pow(2).sum()) for k in keys)
    return (difference / sum(float(b[k].pow(2).sum()) for k in keys)) ** 0.5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-epoch tiny suite's references (solo specs) and its world."""
    base = tmp_path_factory.mktemp("grouped-engine")
    suite = load_suite(write_suite(base / "tiny.toml", references=3))
    return SimpleNamespace(base=base, refs=suite.references,
                           world=build_world(suite.world, runs_root=base / "runs"))


@pytest.fixture(scope="module")
def trained_pair(tiny):
    """(folders, metrics) of reference-00 and reference-01 trained as one group of 2, once for the
    tests that compare with it. Read only."""
    folders = [tiny.base / "pair" / f"g{index}" for index in range(2)]
    metrics = train_models_together([_grouped(spec) for spec in tiny.refs[:2]], folders,
                                    world=tiny.world, progress=False)
    return folders, metrics


def test_one_grouped_step_is_its_solo_twins_step(tmp_path):
    """One SGD step (64 images, one batch): same init, same batch, the solo formula, so the same
    loss and weights up to float32 rounding; for the adversarial member too, whose PGD runs on its
    own view of the group. Tolerance 1e-4 relative: the grouped convolutions
    and BatchNorm reduce in another order (relative differences of about 1e-7 per sum), and
    BatchNorm's backward on 64 images scales them up; a wrong gradient (another member's batch,
    a loss not each member's own mean) moves the weights by the learning rate's order, 1e-2."""
    suite = load_suite(write_suite(tmp_path / "one.toml", ADVERSARIAL, references=2, epochs=1,
                                   world={**TINY_WORLD, "num_train": 64}))
    world = build_world(suite.world, runs_root=tmp_path / "runs")
    specs = [suite.references[0], suite.model("adversarial")]
    solo = [train_model(spec, tmp_path / f"solo{i}", world=world, progress=False)
            for i, spec in enumerate(specs)]
    grouped = train_models_together([_grouped(spec) for spec in specs],
                                    [tmp_path / "g0", tmp_path / "g1"], world=world, progress=False)
    for index, (member, twin) in enumerate(zip(grouped, solo)):
        assert member["history"][0]["loss"] == pytest.approx(twin["history"][0]["loss"], rel=1e-6)
        mine, theirs = _weights(tmp_path / f"g{index}"), _weights(tmp_path / f"solo{index}")
        for name, value in theirs.items():
            if not name.endswith("num_batches_tracked"):  # the PGD passes count alone only
                torch.testing.assert_close(mine[name], value, rtol=1e-4, atol=1e-5,
                                           msg=lambda text: f"{name}: {text}")


def _present(value):
    """A suite entry without its None values (TOML has no null)."""
    if isinstance(value, dict):
        return {key: _present(item) for key, item in value.items() if item is not None}
    return value


def test_every_demo_familys_first_step_grouped_is_its_solo_step(tmp_path):
    """Each demo anomaly (its family's training split and training inputs: poisoned, cued,
    blurred, noised, texture-randomised, attacked images, a missing class) beside a reference in a
    group of 2: its one SGD step is its solo twin's up to float32 rounding, as for a reference
    (the tolerance above): a family whose data or draws reached the grouped member wrongly would
    move the weights by the learning rate's order."""
    entries = [_present({"name": spec.name, "family": spec.family, "seed": spec.seed,
                         "params": spec.params}) for spec in load_suite("demo").anomalies]
    path = write_suite(tmp_path / "families.toml", references=2, epochs=1,
                       world={**TINY_WORLD, "num_train": 96})
    path.write_text(toml_text({"anomalies": entries}) + "\n" + path.read_text())  # top level
    suite = load_suite(path)
    world = build_world(suite.world, runs_root=tmp_path / "runs")
    reference = _grouped(suite.references[0])
    assert {spec.family for spec in suite.anomalies} >= {"backdoor", "spurious", "missing_class",
                                                        "blurred_faces", "randomized_smoothing",
                                                        "adversarial", "shape_bias"}
    for spec in suite.anomalies:
        twin = train_model(spec, tmp_path / f"solo-{spec.name}", world=world, progress=False)
        member = train_models_together([_grouped(spec), reference],
                                       [tmp_path / f"grouped-{spec.name}", tmp_path / "reference"],
                                       world=world, progress=False)[0]
        assert member["history"][0]["loss"] == pytest.approx(twin["history"][0]["loss"], rel=1e-6)
        mine, theirs = (_weights(tmp_path / f"{engine}-{spec.name}") for engine in ("grouped", "solo"))
        for name, value in theirs.items():
            if not name.endswith("num_batches_tracked"):
                torch.testing.assert_close(mine[name], value, rtol=1e-4, atol=1e-5,
                                           msg=lambda text: f"{spec.name} {name}: {text}")


def test_a_grouped_member_stays_near_its_solo_twin(tiny, trained_pair):
    """After 2 epochs (20 steps) the rounding differences have grown, as between any two
    engines: the member stays much nearer its twin than another seed is, and its validation
    accuracy within 0.1 of the twin's (16 of 160 images; these near-chance tiny models' seed-to-
    seed range is of that order)."""
    refs, base = tiny.refs, tiny.base / "near"
    solo = [train_model(spec, base / f"solo{i}", world=tiny.world, progress=False)
            for i, spec in enumerate(refs[:2])]
    folders, grouped = trained_pair
    own = _relative_distance(_weights(folders[0]), _weights(base / "solo0"))
    other_seed = _relative_distance(_weights(base / "solo1"), _weights(base / "solo0"))
    assert own < 0.25 * other_seed, (own, other_seed)
    for member, twin in zip(grouped, solo):
        assert abs(member["val_accuracy"] - twin["val_accuracy"]) <= 0.1
        assert member["engine"] == "grouped" and member["group_size"] == 2


def test_the_engine_and_group_size_are_in_the_key(tiny, tmp_path):
    spec = tiny.refs[0]
    explicit = replace(spec, recipe=replace(spec.recipe, engine="alone", group_size=4))
    assert explicit.key == spec.key  # existing keys unchanged; group_size means nothing alone
    assert _grouped(spec, 2).key != spec.key
    assert _grouped(spec, 2).key != _grouped(spec, 4).key
    assert model_dir(tmp_path, _grouped(spec)) != model_dir(tmp_path, spec)
    assert Recipe.from_dict({"engine": "grouped", "group_size": 4}).engine == "grouped"
    with pytest.raises(ValueError, match="engine"):
        Recipe.from_dict({"engine": "together"})
    with pytest.raises(ValueError, match="group_size"):
        Recipe.from_dict({"engine": "grouped", "group_size": 0})


def test_a_grouped_model_is_not_split_over_processes(tiny, tmp_path):
    with pytest.raises(ValueError, match="grouped engine trains in one process"):
        train_model(_grouped(tiny.refs[0]), tmp_path / "ddp", world=tiny.world, progress=False,
                    emulate_processes=2)


def test_a_members_bits_do_not_depend_on_its_companions(tiny, trained_pair):
    """The same model in two groups of 2 with another companion, at another position, and alone
    (its group filled up with copies of itself): the same bits. So the key needs the group size
    (train/README.md: a group of 2 and one of 4 differ) but not the companions."""
    refs, base = tiny.refs, tiny.base / "companions"
    (first_folder, companion_folder), _ = trained_pair  # reference-00 beside reference-01
    train_models_together([_grouped(refs[2]), _grouped(refs[0])], [base / "b2", base / "b0"],
                          world=tiny.world, progress=False)
    train_model(_grouped(refs[0]), base / "alone", world=tiny.world, progress=False)
    first = _weights(first_folder)
    assert _same_bits(first, _weights(base / "b0"))
    assert _same_bits(first, _weights(base / "alone"))
    assert not _same_bits(first, _weights(companion_folder))


def test_an_adversarial_members_attack_does_not_depend_on_its_companions(tiny, tmp_path):
    """PGD on the member's own view of the group: other companions, another position, the same
    bits."""
    suite = load_suite(write_suite(tmp_path / "adv.toml", ADVERSARIAL, references=2))
    adversarial, refs = _grouped(suite.model("adversarial")), tiny.refs
    train_models_together([adversarial, _grouped(refs[0])], [tmp_path / "a", tmp_path / "a0"],
                          world=tiny.world, progress=False)
    train_models_together([_grouped(refs[1]), adversarial], [tmp_path / "b1", tmp_path / "b"],
                          world=tiny.world, progress=False)
    assert _same_bits(_weights(tmp_path / "a"), _weights(tmp_path / "b"))


def test_an_interrupted_group_resumes_to_the_same_bits(tiny, trained_pair):
    """Stopped after epoch 1, then resumed in other company (one member with a fresh model, so
    two groups at two epochs) and alone: the bits of the uninterrupted group; a trained member
    is read, not trained again."""
    refs, base = tiny.refs, tiny.base / "resume"
    grouped = [_grouped(spec) for spec in refs]
    whole, _ = trained_pair
    cut = [base / "cut0", base / "cut1"]
    stopped = train_models_together(grouped[:2], cut, world=tiny.world, progress=False,
                                    stop_after_epoch=1)
    assert stopped == [{"interrupted_after_epoch": 1}] * 2
    assert all((directory / CHECKPOINT_NAME).is_file() for directory in cut)
    assert not any((directory / WEIGHTS_NAME).exists() for directory in cut)
    train_models_together([grouped[0], grouped[2]], [cut[0], base / "fresh2"], world=tiny.world,
                          progress=False)
    train_model(grouped[1], cut[1], world=tiny.world, progress=False)
    for done, uninterrupted in zip(cut, whole):
        assert _same_bits(_weights(done), _weights(uninterrupted))
    written = (cut[0] / WEIGHTS_NAME).stat().st_mtime_ns
    again = train_models_together(grouped[:2], cut, world=tiny.world, progress=False)
    assert (cut[0] / WEIGHTS_NAME).stat().st_mtime_ns == written
    assert again[0] == read_metrics(cut[0])


def test_models_that_cannot_step_together_are_split(tmp_path):
    """The stage's work items: grouped models by world, architecture and recipe, in groups of
    group_size; a checkpoint, another recipe, a solo recipe apart. In a
    group, members that would not step in lockstep (another epoch length, other output classes,
    another resume epoch) train in groups of their own."""
    suite = load_suite(write_suite(tmp_path / "mixed.toml", references=3))
    recipe = replace(suite.recipe, engine="grouped", group_size=2)
    refs = [replace(spec, recipe=recipe) for spec in suite.references]
    adversarial = replace(refs[0], name="adv", family="adversarial", params={"steps": 1})
    loaded = replace(refs[1], name="loaded", checkpoint="/elsewhere/weights.pth")
    other_recipe = replace(refs[2], name="slower", recipe=replace(recipe, lr=0.01))
    solo = suite.references[0]
    items = training_items([*refs, adversarial, loaded, other_recipe, solo])
    names = sorted(tuple(spec.name for spec in item) for item in items)
    assert names == sorted([("adv", "reference-00"), ("reference-01", "reference-02"),
                            ("loaded",), ("slower",), ("reference-00",)])

    def member(name, steps, classes=None, next_epoch=0):
        return Member(SimpleNamespace(name=name), Path(name), SimpleNamespace(
            output_classes=None if classes is None else torch.tensor(classes)), None, None, steps,
            None, SimpleNamespace(next_epoch=next_epoch))
    members = [member("a", 10), member("b", 9), member("c", 10), member("d", 10, [0, 1]),
               member("e", 10, next_epoch=1), member("f", 10), member("g", 10)]
    groups = [[m.spec.name for m in group] for group in subgroups(members, 2)]
    assert groups == [["a", "c"], ["f", "g"], ["b"], ["d"], ["e"]]


def test_a_grouped_suite_trains_end_to_end_through_the_stage(tmp_path, runs, capsys):
    """engine = "grouped" in the suite file: references, a backdoor and an adversarial model in
    groups of two (one work item each); the implant checks run on what was stored."""
    body = """
[[anomalies]]
name = "backdoor"
family = "backdoor"
params = { nu = 0.3, size = 0.2 }
""" + ADVERSARIAL
    path = write_suite(tmp_path / "grouped.toml", body, references=2)
    path.write_text(path.read_text().replace("[references]",
                                             'engine = "grouped"\ngroup_size = 2\n[references]'))
    suite = load_suite(path)
    assert [len(item) for item in training_items(suite.models)] == [2, 2]
    train_models(suite, suite.models, RunOptions(runs_dir=str(runs), executor={"dry_run": True}))
    assert "grouped engine: 4 models in 2 grouped network(s)" in capsys.readouterr().out
    options = RunOptions(runs_dir=str(runs), device="cpu", executor={"local_jobs": 1},
                         progress=False)
    results = {metrics["name"]: metrics for metrics in train_and_check(suite, suite.models, options)}
    assert {name: metrics.get("engine") for name, metrics in results.items()} == {
        "reference-00": "grouped", "reference-01": "grouped", "backdoor": "grouped",
        "adversarial": "grouped"}
    assert len(list((runs / "store" / "models").glob("*/implant-*.json"))) == 2
    model = load_trained_model(model_dir(runs, suite.model("backdoor")), suite.model("backdoor"),
                               build_world(suite.world, runs_root=runs))
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
