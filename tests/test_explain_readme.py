"""explain/README.md's "Add an explanation method" example, run end to end as a user would: its code
saved as written into one new file in a folder of the ``explain.methods`` package, found by the
registry's first lookup, registered, configured from a suite-style table, and put through the very
checks tests/test_explain_methods.py runs on every shipped method (shapes, same seed same bits,
batched equal to one at a time if it claims batch invariance, the caller's model unchanged). In a
subprocess, so the new method does not stay registered in the test session."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import guide_example

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "explain" / "README.md"
SECTION = "## Add an explanation method"
METHOD_CHECKS = REPO / "tests" / "test_explain_methods.py"
# The checks every registered method gets, as named in METHOD_CHECKS (parametrized by method).
EVERY_METHODS_CHECKS = {"test_output_shape_dtype_and_record", "test_same_seed_same_bits",
                        "test_does_not_change_the_callers_model"}
BATCH_INVARIANT_CHECK = "test_batched_equals_one_at_a_time"


def test_readme_example_adds_a_method_with_one_file_that_passes_every_methods_checks(tmp_path):
    plugin_dir = tmp_path / "more_methods"
    plugin_dir.mkdir()
    (plugin_dir / "readme_example.py").write_text(guide_example(GUIDE, SECTION))
    script = textwrap.dedent(f"""
        import json
        import pytest
        import counteraudit.explain.methods as methods
        from counteraudit.explain.base import METHODS, build_method

        # A folder of the methods package, as explain/methods/ itself is; nothing else changes.
        methods.__path__.append({str(plugin_dir)!r})
        added = {{name for name in METHODS  # the first lookup imports every module
                 if METHODS.get(name).__module__.endswith(".readme_example")}}
        assert len(added) == 1, f"the guide's example registered {{added}}, expected one method"
        name = added.pop()
        configured = build_method(name, {{"samples": 4}})  # a suite's [methods.<name>]
        assert configured.params.samples == 4

        # The newcomer's path, through a suite file: [methods.<name>] is parsed once by the
        # method's own Params (method_specs -> parse_params -> MethodSpec.build) and reaches
        # ``attribute`` typed (noise_std written as the whole number 1 arrives as the float 1.0).
        import torch
        from pathlib import Path
        from counteraudit.explain.settings import method_problems, method_specs
        from counteraudit.train.architectures import build_model
        from counteraudit.train.core.suite import load_suite
        suite_file = Path({str(tmp_path)!r}) / "newcomer.toml"
        suite_file.write_text(f'[explain]\\nmethods = ["{{name}}"]\\n'
                              f'[methods.{{name}}]\\nsamples = 4\\nnoise_std = 1\\n')
        suite = load_suite(suite_file, method_problems)
        method_class, seen = METHODS.get(name), []
        attribute = method_class.attribute
        def recording(self, model, images, targets):
            seen.append(self.params)
            return attribute(self, model, images, targets)
        method_class.attribute = recording
        spec = method_specs(suite)[name]
        model = build_model("small_resnet", num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3).eval()
        spec.build().run(model, torch.rand(2, 3, 32, 32), batch_size=2)
        method_class.attribute = attribute
        assert isinstance(spec.params, method_class.Params) and seen == [spec.params]
        assert seen[0].samples == 4 and type(seen[0].noise_std) is float and seen[0].noise_std == 1.0

        # Evaluated against a suite's saliency methods without a table of its own, it is drawn as
        # they are: its Params derive from SaliencyParams, so it takes their renderer and space.
        from counteraudit.explain.base import SaliencyParams
        assert issubclass(method_class.Params, SaliencyParams)
        fair_file = Path({str(tmp_path)!r}) / "fair.toml"
        fair_file.write_text(f'[explain]\\nmethods = ["{{name}}", "guided_backprop"]\\n'
                             '[methods.guided_backprop]\\ngradient_space = "normalized"\\n'
                             'renderer = "captum_figure"\\n'
                             'renderer_options = {{ figure_inches = 2.0, dpi = 16 }}\\n')
        fair = method_specs(load_suite(fair_file, method_problems))[name]
        taken = (fair.params.gradient_space, fair.params.renderer, fair.params.renderer_options)
        assert taken == ("normalized", "captum_figure", {{"figure_inches": 2.0, "dpi": 16}}), taken
        fair.build().run(model, torch.rand(2, 3, 32, 32), batch_size=2)  # honours gradient_space

        class Outcomes:
            "Each selected test's outcome, by its name and parameter."
            def __init__(self):
                self.by_test = {{}}
            def pytest_runtest_logreport(self, report):
                if report.when == "call" or report.outcome != "passed":
                    self.by_test[report.nodeid.split("::")[-1]] = report.outcome

        outcomes = Outcomes()
        status = pytest.main([{str(METHOD_CHECKS)!r}, "-q", "-p", "no:cacheprovider", "-n", "0",
                              "-k", f"[{{name}}]"], plugins=[outcomes])
        print("RESULT " + json.dumps({{"name": name, "status": int(status),
                                      "batch_invariant": METHODS.get(name).batch_invariant,
                                      "outcomes": outcomes.by_test}}))
    """)
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "RESULT " in result.stdout, result.stdout + result.stderr
    found = json.loads(result.stdout.split("RESULT ", 1)[1])
    name, outcomes = found["name"], found["outcomes"]
    expected = EVERY_METHODS_CHECKS | ({BATCH_INVARIANT_CHECK} if found["batch_invariant"] else set())
    assert outcomes == {f"{check}[{name}]": "passed" for check in expected}, result.stdout[-3000:]
    assert found["status"] == 0, result.stdout[-3000:]
