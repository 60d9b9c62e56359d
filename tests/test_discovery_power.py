"""Power, not mechanics: every failure-discovery auditor finds a planted slice of arity 2 on a
*trained* model, and none has a significant finding on a held-out clean model.

Measured with the one-offset relabelling (mechanism "relabel") instead, the failure spread to the
class's medium disks (0.79 val accuracy; surrogate_search's top finding disk and medium), so
that caption_lift found no lift over the class and surrogate_search ranked only the neighbour:
a true result about that model, not a broken auditor, hence the uniform relabelling here.

A small synthetic world (32 px, 4,000 training images), three references, one held-out
reference and one planted_slice model (class disk and size large, every training image of the
slice given its own other class), trained by the real trainer, then the discover stage with the
relative score. Trained, the slice's accuracy falls to about 0.4 against the references' 0.83
(the implant check says so) while the rest of the model is intact: an auditor has to find that among everything
else the model gets wrong, as it would on a real suite. A broken ranking, relative score,
search or captioner puts the slice out of the top five; a broken significance test flags the
clean model.

About 3 minutes on 2 cores, so .ci/run runs this file as its own step and the README's test
command leaves it out (pyproject.toml: the discovery_power marker)."""
import pytest

from conftest import write_suite
from counteraudit.evaluate.discover import get_args_parser
from counteraudit.evaluate.discovery.auditors import AUDITORS
from counteraudit.evaluate.discovery.reference_evaluations import (adaptive_results,
                                                                   evaluate_references,
                                                                   scored_findings)
from counteraudit.evaluate.discovery.relative import significant
from counteraudit.evaluate.discovery.stage import discover_suite
from counteraudit.evaluate.discovery.tables import discovery_tables
from counteraudit.train.core.suite import load_suite
from counteraudit.train.implant_checks import read_implant
from counteraudit.train.checked_training import train_and_check
from counteraudit.train.worlds import build_world
from counteraudit.train.core.stage import run_options

pytestmark = pytest.mark.discovery_power

WORLD = {"name": "synthetic", "seed": 3, "image_size": 32, "num_train": 4000, "num_val": 1000}
PLANTED = {"class": "disk", "size": "large"}
BODY = """
held_out = 1
[[anomalies]]
name = "slice"
family = "planted_slice"
seed = 7
params = { slice = { class = "disk", size = "large" }, strength = 1.0, mechanism = "relabel_uniform" }
[discover.budget]
twise = 3200
"""
TOP = 5


@pytest.fixture(scope="module")
def discovered(tmp_path_factory):
    base = tmp_path_factory.mktemp("power")
    path = write_suite(base / "power.toml", body=BODY, references=3, epochs=6, world=WORLD)
    # six epochs with the step at the fifth and a short warm-up: the references reach about 0.83
    # val accuracy (the other tests' two-epoch tiny suite: about 0.2, too weak to fail on a slice)
    path.write_text(path.read_text().replace("lr_step_epochs = 1",
                                             "lr_step_epochs = 5\nlr_warmup_epochs = 0.5"))
    runs = base / "runs"
    args = run_options(get_args_parser().parse_args(["--suite", str(path), "--runs-dir", str(runs),
                                                     "--no-progress"]))
    suite = load_suite(path)
    train_and_check(suite, suite.models, args)  # as discover.py trains: implant checks too
    world = build_world(suite.world, runs_root=runs)
    discover_suite(suite, args)
    evaluate_references(suite, args, adaptive_results(suite, runs, world=world))
    results = scored_findings(suite, runs, world=world, score="relative")
    return suite, runs, world, results, discovery_tables(suite, results, world, runs, "relative")


def test_the_slice_model_took_its_implant(discovered):
    suite, runs, *_ = discovered
    implant = read_implant(suite, suite.model("slice"), runs)
    assert implant["passed"], implant


# Measured in portable numerics (the same bits on every CPU; train/README.md): on this model
# caption_lift finds no lift over its class, with the implant taken. twise ranked the planted
# slice 9th against the three references alone (natively on an AVX2-only EPYC 6th); against the
# pooled baseline (the references and the held-out reference, evaluate/discovery/README.md) it
# ranks it within the top five (AMD EPYC, 2 cores). One model's rank is not a power figure,
# which is what the slices suite's recovery rates over many models are for. Strict: a change
# that makes caption_lift find it fails here and lifts the mark.
MEASURED_MISSES = {
    "caption_lift": "portable numerics: finds no lift over the slice's class",
}


@pytest.mark.parametrize("auditor", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=MEASURED_MISSES[name]))
    if name in MEASURED_MISSES else name for name in AUDITORS.names()])
def test_each_auditor_ranks_the_planted_slice_in_its_top_five(discovered, auditor):
    *_, tables = discovered
    row = tables["discovery-recovery"].set_index("auditor").loc[auditor]
    assert row["planted_slice"] == "class=disk & size=large"
    assert row["status"] == "ranked" and row["rank"] <= TOP, row.to_dict()


@pytest.mark.parametrize("auditor", AUDITORS.names())
def test_no_auditor_has_a_significant_finding_on_the_held_out_reference(discovered, auditor):
    suite, _, _, results, tables = discovered
    held_out = suite.held_out[0].name
    findings = [f for f in results[(auditor, held_out)].findings
                if f.objective == AUDITORS.get(auditor).objective]
    if not AUDITORS.get(auditor).filters_findings:  # caption_lift keeps significant ones only
        assert findings, "the held-out model was audited"
    assert not any(significant(findings, len(suite.references))), findings[:3]
    calibration = tables["discovery-calibration"].set_index("auditor").loc[auditor]
    assert calibration["any_significant"] == 0
