"""explain/README.md's "Add an explanation method" example, run end to end as a user would: its code
saved as one new file in a folder of the ``explain.methods`` package, found by the registry's
first lookup, registered, configured from a suite-style table and run. In a subprocess, so the new method does
not stay registered in the test session."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "explain" / "README.md"
SECTION = "## Add an explanation method"


def readme_example() -> str:
    text = GUIDE.read_text()
    assert SECTION in text, f"{GUIDE} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, f"the section {SECTION!r} of {GUIDE} has no ```python example"
    return blocks[0]


def test_readme_example_adds_a_method_with_one_file(tmp_path):
    plugin_dir = tmp_path / "more_methods"
    plugin_dir.mkdir()
    (plugin_dir / "readme_example.py").write_text(readme_example())
    script = textwrap.dedent(f"""
        import torch
        torch.set_num_threads(1)
        import counteraudit.explain as explain, counteraudit.explain.methods
        from counteraudit.train.architectures import build_model

        # A folder of the methods package, as explain/methods/ itself is; nothing else changes.
        explain.methods.__path__.append({str(plugin_dir)!r})
        added = {{name for name in explain.METHODS  # the first lookup imports every module
                 if explain.METHODS.get(name).__module__.endswith(".readme_example")}}
        assert len(added) == 1, f"the guide's example registered {{added}}, expected one method"
        name = added.pop()
        method = explain.build_method(name, {{"samples": 4}})  # a suite's [methods.<name>] table
        torch.manual_seed(0)
        model = build_model("small_resnet", 10, (0.5,) * 3, (0.25,) * 3)
        images = torch.rand(3, 3, 64, 64)
        first = method.run(model, images, batch_size=2)
        again = method.run(model, images, batch_size=2)
        assert first.images.shape == (3, 64, 64, 3) and first.images.dtype.name == "uint8"
        assert (first.images == again.images).all(), "not deterministic"
        assert first.params["method_params"]["samples"] == 4
        print("OK", name)
    """)
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK ")
