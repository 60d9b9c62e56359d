"""Every plug-in's parameters go through the one parser (train/core/params.py), and every key
form follows the one rule for parameters added after results were stored: generated from the
registries, so a new method, renderer, auditor, family or world is checked without a line here."""
from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

import pytest

from counteraudit.anomalies.base import NoParams as FamilyNoParams
from counteraudit.evaluate.discovery.auditors.base import build_auditor
from counteraudit.explain.base import build_method
from counteraudit.train.core.params import (BEFORE, EXECUTION_ONLY, NoParams, key_params,
                                            params_problems, parse_params, recorded_params)
from counteraudit.train.core.recipe import Recipe, recipe_problems
from counteraudit.evaluate.discovery.auditors import AUDITORS
from counteraudit.explain.base import METHODS
from counteraudit.explain.renderers import RENDERERS
from counteraudit.train.core.registries import FAMILIES, WORLDS

UNKNOWN = "no_such_key"
# Wrong for every annotation a parameter has (a number, a string, a flag, a name among a few, a
# list of names, a table): a list holding an empty list.
WRONG = [[]]


def _renderer_host(renderer: str) -> str:
    """A method whose parameters name its renderer and that renders what ``renderer`` does."""
    renders = RENDERERS.get(renderer).renders
    for name in METHODS.names():
        method = METHODS.get(name)
        if getattr(method, "renders", None) == renders and \
                any(f.name == "renderer_options" for f in dataclasses.fields(method.Params)):
            return name
    raise AssertionError(f"no method renders with {renderer}")


def _build_renderer(name: str, options: dict) -> None:
    build_method(_renderer_host(name), {"renderer": name, "renderer_options": options})


def _family(name: str, params: dict) -> None:
    FAMILIES.get(name).validate_params(params)


def _world(name: str, config: dict) -> None:
    problems = WORLDS.get(name).config_problems(config)
    if problems:
        raise ValueError("; ".join(problems))


def _recipe(_: str, table: dict) -> None:
    problems = recipe_problems(table)
    if problems:
        raise ValueError("; ".join(problems))


# (kind, name, its Params, how its entry point takes a table, the ``where`` its errors name)
PLUGINS = (
    [("method", n, METHODS.get(n).Params, build_method, f"method {n!r}") for n in METHODS.names()]
    + [("renderer", n, RENDERERS.get(n).Params, _build_renderer, f"renderer {n!r}")
       for n in RENDERERS.names()]
    + [("auditor", n, AUDITORS.get(n).Params, build_auditor, f"auditor {n!r}")
       for n in AUDITORS.names()]
    + [("family", n, FAMILIES.get(n).Params, _family, f"{n} params") for n in FAMILIES.names()]
    + [("world", n, WORLDS.get(n).config_class, _world, "[world]") for n in WORLDS.names()
       if WORLDS.get(n).config_class is not None]
    + [("recipe", "recipe", Recipe, _recipe, "[recipe]")])
IDS = [f"{kind}-{name}" for kind, name, *_ in PLUGINS]


@pytest.mark.parametrize("kind, name, params_class, build, where", PLUGINS, ids=IDS)
def test_an_unknown_key_is_one_error_naming_it_and_every_valid_key(kind, name, params_class,
                                                                    build, where):
    with pytest.raises(ValueError) as error:
        build(name, {UNKNOWN: 1})
    message = str(error.value)
    valid = [f.name for f in dataclasses.fields(params_class)]
    assert f"{where} {UNKNOWN}: unknown key" in message
    assert message.count("unknown key") == 1
    if valid:
        assert message.endswith("valid keys: " + ", ".join(valid))
    else:
        assert "it takes no parameters" in message


@pytest.mark.parametrize("kind, name, params_class, build, where",
                         [p for p in PLUGINS if dataclasses.fields(p[2])],
                         ids=[i for i, p in zip(IDS, PLUGINS) if dataclasses.fields(p[2])])
def test_a_wrongly_typed_value_is_an_error_naming_the_key(kind, name, params_class, build, where):
    first = dataclasses.fields(params_class)[0].name
    with pytest.raises(ValueError, match=rf"^{re.escape(where)} {first}\b.* = \[\[?\]\]? (must|is) "):
        build(name, {first: WRONG})


@pytest.mark.parametrize("kind, name, params_class, build, where", PLUGINS, ids=IDS)
def test_every_key_is_type_checked_one_error_each(kind, name, params_class, build, where):
    fields = [f.name for f in dataclasses.fields(params_class)]
    problems = params_problems(params_class, {key: WRONG for key in fields}, where)
    assert len(problems) == len(fields)
    for key, problem in zip(fields, problems):
        assert problem.startswith(f"{where} {key} "), problem


@pytest.mark.parametrize("kind, name, params_class, build, where", PLUGINS, ids=IDS)
def test_the_key_omits_an_added_field_at_its_before_value_and_records_it_otherwise(
        kind, name, params_class, build, where):
    defaults = params_class()
    for field in dataclasses.fields(params_class):
        in_key = field.name in key_params(defaults)
        if field.metadata.get(EXECUTION_ONLY):
            assert not in_key
            continue
        if BEFORE not in field.metadata:
            assert in_key
            continue
        before = field.metadata[BEFORE]
        assert field.name not in key_params(dataclasses.replace(defaults, **{field.name: before}))
        another = f"not {before!r}"
        other = dataclasses.replace(defaults, **{field.name: another})
        assert key_params(other)[field.name] == recorded_params(other)[field.name] == another


@pytest.mark.parametrize("name", FAMILIES.names())
def test_a_familys_canonical_params_are_its_key_params(name):
    family = FAMILIES.get(name)
    assert family.validate_params({}) == key_params(family.Params())


def _family_key(name: str, params: dict) -> dict:
    return FAMILIES.get(name).validate_params(params)


def _method_key(method) -> dict:
    return method.describe("small_resnet")["method_params"]


def _options_key(method) -> dict:
    return _method_key(method).get("renderer_options", {})


def _with_renderer(name: str, options: dict):
    return build_method("integrated_gradients", {"renderer": name, "renderer_options": options})


# (entry point, plug-in, an added field, its before value, another valid value, the key form,
# whether the field's default is in the key: a default other than ``before`` is recorded)
@pytest.mark.parametrize("build, name, field, before, other, key_of, default_in_key", [
    (build_method, "caricature", "transforms", "fused", "lucent", _method_key, False),
    (build_method, "guided_backprop", "explained_class", "top", "label", _method_key, False),
    (_with_renderer, "captum_figure", "rasterisation", "installed", "matplotlib-3.5",
     _options_key, True),
    (_family_key, "missing_class", "removed_fraction", 1.0, 0.5, dict, False),
    (_family_key, "missing_class", "drop_output", False, True, dict, False),
    (_family_key, "spurious", "cue", "outlined", "watermark", dict, False),
    (lambda _, table: Recipe.from_dict(table), "recipe", "resolution_schedule", (),
     [{"epochs": 60, "size": 160}, {"epochs": 30, "size": 192}], Recipe.identity, False),
])
def test_each_kind_of_key_follows_the_rule(build, name, field, before, other, key_of,
                                           default_in_key):
    """Through each entry point: a method's recorded parameters, a renderer's options, a family's
    canonical parameters (a model's key), the recipe's identity."""
    assert (field in key_of(build(name, {}))) == default_in_key
    assert field not in key_of(build(name, {field: before}))
    assert field in key_of(build(name, {field: other}))


def test_methods_record_numbers_as_their_type_families_as_written():
    """A method's ``learning_rate = 1`` is recorded as 1.0 (as results always have been); a
    family's ``strength = 1`` stays 1 in the model's key (as models' keys always have)."""
    recorded = build_method("caricature", {"learning_rate": 1, "layers": ["(3,1)"]}).describe(None)
    assert recorded["method_params"]["learning_rate"] == 1.0
    assert isinstance(recorded["method_params"]["learning_rate"], float)
    assert recorded["method_params"]["layers"] == ["(3,1)"]
    canonical = FAMILIES.get("spurious").validate_params({"strength": 1})
    assert canonical["strength"] == 1 and isinstance(canonical["strength"], int)
    parsed = parse_params(FAMILIES.get("spurious").Params, {"strength": 1}, "spurious params")
    assert isinstance(parsed.strength, float)


def test_one_no_params():
    assert FamilyNoParams is NoParams
    assert dataclasses.fields(NoParams) == ()


def test_the_guides_example_declares_parameters_the_parser_checks(monkeypatch):
    """train/README.md's example, run as written: each annotation is a check, and an
    execution-only field is no part of the key."""
    guide = (Path(__file__).parents[1] / "train" / "README.md").read_text()
    section = guide.split("## Plug-in parameters, and keys that stay stable")[1]
    code = section.split("```python\n")[1].split("```")[0]
    module = types.ModuleType("train_guide_example")  # a dataclass's annotations resolve in its module
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, "train/README.md", "exec"), module.__dict__)
    params_class = module.Params
    parsed = parse_params(params_class, {"learning_rate": 1, "batch_size": 8}, "the example")
    assert parsed.learning_rate == 1.0 and "batch_size" not in key_params(parsed)
    for bad, what in [({"steps": 10 ** 9}, "steps = 1000000000 must be <= "),
                      ({"steps_by_layer": {"layer4": 10 ** 9}}, "steps_by_layer layer4 = 1000000000"),
                      ({"learning_rate": 0}, "learning_rate = 0 must be > 0"),
                      ({"noise": "per_image"}, "'shared', 'per_model'"),
                      ({"stesp": 1}, "stesp: unknown key (did you mean 'steps'?)")]:
        with pytest.raises(ValueError, match=re.escape(what)):
            parse_params(params_class, bad, "the example")
