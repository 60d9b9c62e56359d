"""evaluate/discovery/README.md's "Add a failure-discovery auditor" example, run as a user would:
its code saved as one new file in a folder of the auditors package, found by the registry's first
lookup, accepted in a suite file, then run on a small generated world with an untrained model
(ranked findings with intervals, the same bits on a rerun, too small a budget refused). In a
subprocess, so the new auditor does not stay registered in the test session."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import guide_example

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "evaluate" / "discovery" / "README.md"
SECTION = "## Add a failure-discovery auditor"


def test_guide_example_adds_an_auditor_with_one_file(tmp_path):
    plugin_dir = tmp_path / "more_auditors"
    plugin_dir.mkdir()
    (plugin_dir / "readme_example.py").write_text(guide_example(GUIDE, SECTION))
    script = textwrap.dedent(f"""
        import json
        from pathlib import Path
        import torch
        torch.set_num_threads(1)
        import counteraudit.evaluate.discovery.auditors as auditors
        from counteraudit.evaluate.discovery.auditors import AUDITORS, BudgetError, build_auditor
        from counteraudit.train.architectures import build_model
        from counteraudit.train.core.suite import load_suite
        from counteraudit.train.worlds import synthetic_factors
        from counteraudit.train.worlds.synthetic import SyntheticConfig, SyntheticWorld

        # A folder of the auditors package, as evaluate/discovery/auditors/ itself is.
        auditors.__path__.append({str(plugin_dir)!r})
        added = {{name for name in AUDITORS  # the first lookup imports every module
                 if AUDITORS.get(name).__module__.endswith(".readme_example")}}
        assert len(added) == 1, f"the guide's example registered {{added}}, expected one auditor"
        name = added.pop()

        # a suite file that selects it and sets a parameter passes the suite's check
        suite = Path({str(tmp_path)!r}) / "with-auditor.toml"
        suite.write_text(f'extends = "demo"\\nname = "with-auditor"\\n[discover]\\n'
                         f'auditors = ["{{name}}"]\\n[auditors.{{name}}]\\nimages_per_class = 3\\n')
        assert load_suite(suite).auditor_tables[name] == {{"images_per_class": 3}}

        synthetic_factors.POOL_PER_CLASS = 10  # a small pool of attribute sets: seconds
        world = SyntheticWorld(SyntheticConfig(seed=3, image_size=32, num_train=16, num_val=16),
                               cache_dir={str(tmp_path / "worlds")!r}, verbose=False)
        torch.manual_seed(0)
        model = build_model("small_resnet", world.num_classes, world.mean, world.std).eval()
        auditor = build_auditor(name, AUDITORS.get(name).test_params)
        budget = 3 * auditor.minimum_budget(world)
        first = auditor.run(model, world, budget, seed=1)
        again = build_auditor(name, AUDITORS.get(name).test_params).run(model, world, budget, seed=1)
        dump = lambda result: json.dumps([f.to_dict() for f in result.findings])
        assert dump(first) == dump(again), "not deterministic"
        assert 0 < first.images_used <= budget
        statistics = [f.statistic for f in first.findings]
        assert statistics == sorted(statistics, reverse=True), "not ranked worst first"
        assert all(f.low <= f.statistic <= f.high for f in first.findings)
        factors = world.factors()
        assert all(v in factors[k] for f in first.findings for k, v in f.conditions.items())
        try:
            auditor.run(model, world, auditor.minimum_budget(world) - 1, seed=1)
        except BudgetError:
            pass
        else:
            raise AssertionError("a budget below the minimum was accepted")
        print("OK", name, len(first.findings))
    """)
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK ")
