"""The registry every plug-in kind uses: one way to register (``@REGISTRY.register``, keyed by the
entry's ``name``), a name registered twice refused, unknown names answered with the valid ones,
and the plug-in package imported once, on the first lookup, and not before."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

import counteraudit.train.core.registry as registry_module
from counteraudit.evaluate.discovery import selection
from counteraudit.evaluate.discovery.auditors import base as auditors_base
from counteraudit.evaluate.scoring.distances import base as distances_base
from counteraudit.evaluate.scoring.null_tests import base as null_tests_base
from counteraudit.evaluate.studies import protocol_choices
from counteraudit.explain import base as explain_base
from counteraudit.explain import renderers
from counteraudit.train.core import registries
from counteraudit.train.core.registry import Registry, UnknownNameError, import_plugins
from tests.conftest import REPO, write_suite


@dataclass(frozen=True)
class Entry:
    name: str


def test_one_way_to_register_a_class_or_an_instance():
    things = Registry("thing")

    @things.register
    class Square:
        name = "square"

    circle = things.register(Entry("circle"))
    assert things.get("square") is Square and things.get("circle") is circle
    assert things.names() == ["circle", "square"] and list(things) == ["circle", "square"]
    assert "square" in things and "triangle" not in things and len(things) == 2


@pytest.mark.parametrize("entry", [object(), Entry(""), Entry(None)])
def test_an_entry_without_a_name_is_refused(entry):
    with pytest.raises(ValueError, match="must set a `name`"):
        Registry("thing").register(entry)


def test_registering_a_name_twice_is_refused():
    things = Registry("thing")
    things.register(Entry("a"))
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        things.register(Entry("a"))
    assert things.get("a") == Entry("a")


def test_an_unknown_name_lists_the_valid_ones():
    things = Registry("thing")
    things.register(Entry("square"))
    things.register(Entry("circle"))
    with pytest.raises(UnknownNameError, match=r"unknown thing 'sqare' \(did you mean 'square'\?\); "
                                               r"valid thing names: circle, square"):
        things.get("sqare")


def plugin_package(root, name: str, modules: dict[str, str]) -> str:
    """A package ``name`` under ``root`` (on sys.path) with the given modules; returns its name."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, source in modules.items():
        (package / f"{module}.py").write_text(textwrap.dedent(source))
    return name


@pytest.fixture
def plugin_root(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("fake_plugins")]:
        del sys.modules[name]


def test_import_plugins_imports_every_public_module_of_a_package_or_the_module_itself(plugin_root):
    package = plugin_package(plugin_root, "fake_plugins_a", {"one": "", "two": "", "_private": ""})
    assert sorted(import_plugins(package)) == [f"{package}.one", f"{package}.two"]
    assert f"{package}.one" in sys.modules and f"{package}._private" not in sys.modules
    assert import_plugins(f"{package}.one") == [f"{package}.one"]


def test_plugins_are_imported_on_the_first_lookup_and_only_once(plugin_root, monkeypatch):
    shapes = Registry("shape", plugins="fake_plugins_b")
    monkeypatch.setattr(sys.modules[__name__], "SHAPES", shapes, raising=False)
    plugin_package(plugin_root, "fake_plugins_b", {"square": f"""
        from {__name__} import SHAPES, Entry
        SHAPES.register(Entry("square"))
        """})
    calls = []
    monkeypatch.setattr(registry_module, "import_plugins",
                        lambda package: calls.append(package) or import_plugins(package))
    assert "fake_plugins_b.square" not in sys.modules and calls == []  # nothing until a lookup
    assert len(shapes) == 1 and "square" in shapes and list(shapes) == ["square"]
    assert shapes.names() == ["square"] and shapes.get("square") == Entry("square")
    assert calls == ["fake_plugins_b"]


def test_a_plugin_that_reads_its_registry_while_loading_sees_the_entries_so_far(plugin_root, monkeypatch):
    shapes = Registry("shape", plugins="fake_plugins_c")
    monkeypatch.setattr(sys.modules[__name__], "SHAPES", shapes, raising=False)
    plugin_package(plugin_root, "fake_plugins_c", {"a_square": f"""
        from {__name__} import SHAPES, Entry
        SHAPES.register(Entry("square"))
        """, "b_circle": f"""
        from {__name__} import SHAPES, Entry
        SEEN = SHAPES.names()  # no second import of the package, no recursion
        SHAPES.register(Entry("circle"))
        """})
    assert shapes.names() == ["circle", "square"]
    assert sys.modules["fake_plugins_c.b_circle"].SEEN == ["square"]


def test_a_failed_plugin_import_is_tried_again(plugin_root):
    shapes = Registry("shape", plugins="fake_plugins_d")
    with pytest.raises(ModuleNotFoundError):
        shapes.names()
    plugin_package(plugin_root, "fake_plugins_d", {"empty": ""})
    assert shapes.names() == []


def test_summaries_read_the_plugins_source_without_importing_them(plugin_root, monkeypatch):
    """What a --help lists: each plug-in with the first line of its module's docstring, read from
    the source (the module is not run), beside an entry registered since (a plug-in file's)."""
    shapes = Registry("shape", plugins="fake_plugins_e")
    monkeypatch.setattr(sys.modules[__name__], "SHAPES", shapes, raising=False)
    plugin_package(plugin_root, "fake_plugins_e", {"square": f'''
        """Squares: four equal sides.

        More than the help says."""
        from {__name__} import SHAPES
        raise AssertionError("a summary ran the plug-in")

        @SHAPES.register
        class Square:
            name = "square"
        ''', "_private": "raise AssertionError('a private module was read')"})
    shapes.register(Entry("circle"))  # this module's entry: its docstring's first line
    assert shapes.summaries() == {"circle": __doc__.split("\n")[0], "square": "Squares: four equal sides."}
    assert not any(name.startswith("fake_plugins_e.") for name in sys.modules)


@pytest.mark.parametrize("registration", [
    "SHAPES.register(Entry('square'))",  # an instance: named when it runs
    "@SHAPES.register\nclass Square:\n    name = 'squ' + 'are'",  # a name computed
])
def test_summaries_import_the_plugins_whose_source_does_not_say_their_name(plugin_root, monkeypatch,
                                                                           registration):
    shapes = Registry("shape", plugins="fake_plugins_f")
    monkeypatch.setattr(sys.modules[__name__], "SHAPES", shapes, raising=False)
    plugin_package(plugin_root, "fake_plugins_f", {"square": f'"""Squares."""\nfrom {__name__} import SHAPES, Entry\n'
                                                             f"{registration}\n"})
    assert list(shapes.summaries()) == ["square"]
    assert "fake_plugins_f.square" in sys.modules


def test_every_registry_names_an_importable_plugin_package():
    """Training's registries (train/core/registries.py) and each higher layer's own, beside its
    plug-ins."""
    kinds = [value for module in (registries, explain_base, renderers, auditors_base, selection,
                                  distances_base, null_tests_base, protocol_choices)
             for value in vars(module).values() if isinstance(value, Registry)]
    assert len({id(kind) for kind in kinds}) == 10
    for registry in kinds:
        assert registry.plugins.startswith("counteraudit.") and len(registry) > 0, registry.kind


def test_checking_a_suite_imports_the_methods_only_for_a_methods_table(tmp_path):
    """Training reads a suite without importing explain's plug-ins (and captum), a [methods.*]
    table or not; the explain layer's check (``method_problems``, which explain/run.py and the
    evaluate scripts pass to ``load_suite``) imports them when a [methods.*] table has to be
    checked, not before."""
    plain = write_suite(tmp_path / "plain.toml")
    with_methods = write_suite(tmp_path / "with_methods.toml", body="[methods.gradcam]\naug_smooth = false\n")
    script = textwrap.dedent(f"""
        import sys
        import counteraudit.train.core.suite as suite
        heavy = ("counteraudit.explain", "captum", "counteraudit.evaluate")
        loaded = lambda: sorted(m for m in sys.modules if m.startswith(heavy))
        assert not loaded(), loaded()
        suite.load_suite({str(plain)!r})
        suite.load_suite({str(with_methods)!r})
        assert not loaded(), loaded()
        from counteraudit.explain.settings import method_problems
        suite.load_suite({str(plain)!r}, method_problems)
        assert "captum" not in sys.modules and not any(m.startswith("counteraudit.explain.methods.")
                                                       for m in sys.modules)
        suite.load_suite({str(with_methods)!r}, method_problems)
        assert "counteraudit.explain.methods.gradcam" in sys.modules and "captum" in sys.modules
        print("OK")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stdout + result.stderr
