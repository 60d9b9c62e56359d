"""A method evaluated against a suite's is drawn as they are (issue 44): a method without its own
[methods.<name>] table takes the renderer and input space its kind of method shares in the suite;
--method NAME:key=value sets parameters through the method's own Params; --method brings the
outputs-only control along; a suite that extends another with a shorter method list drops the
tables of the methods it no longer runs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from counteraudit.evaluate.scoring.stage import only_methods_label
from counteraudit.explain.base import METHODS, AttributionMethod, SaliencyParams
from counteraudit.explain.input_space import in_gradient_space
from counteraudit.explain.method_choice import run_methods, with_method_parameters
from counteraudit.explain.run import get_args_parser
from counteraudit.explain.settings import method_problems, method_specs
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_files import available_suites
from counteraudit.train.core.suite_schema import SuiteFileError
from tests.conftest import write_suite

PLUGIN = "plugin_saliency"
CAPTUM_FIGURE = {"figure_inches": 2.0, "dpi": 16}
# Two saliency methods drawn alike, in the normalised space, and Grad-CAM on its own terms.
SUITE_TABLES = """
[explain]
methods = ["guided_backprop", "integrated_gradients", "gradcam", "outputs_only"]

[methods.guided_backprop]
gradient_space = "normalized"
renderer = "captum_figure"
renderer_options = { figure_inches = 2.0, dpi = 16 }

[methods.integrated_gradients]
gradient_space = "normalized"
baseline = "normalized_zero"
renderer = "captum_figure"
renderer_options = { figure_inches = 2.0, dpi = 16 }

[methods.gradcam]
aug_smooth_space = "normalized"
renderer = "show_cam_on_image"
"""


class PluginSaliency(AttributionMethod):
    """A method as a user's plug-in file would add it: Params derived from SaliencyParams."""
    name = PLUGIN

    @dataclass(frozen=True)
    class Params(SaliencyParams):
        scale: float = 1.0

    def attribute(self, model, images, targets):
        model, inputs = in_gradient_space(model, images, self.params.gradient_space, self.name)
        inputs = inputs.clone().requires_grad_(True)
        picked = model(inputs).gather(1, targets[:, None]).sum()
        return torch.autograd.grad(picked, inputs)[0] * self.params.scale


@pytest.fixture
def plugin(monkeypatch):
    """``PluginSaliency`` registered for one test (the registry keeps no removal of its own)."""
    METHODS.names()  # the shipped methods first, as a plug-in's registration comes after them
    monkeypatch.setitem(METHODS._entries, PLUGIN, PluginSaliency)
    return PluginSaliency


@pytest.fixture
def suite(tmp_path):
    return load_suite(write_suite(tmp_path / "fair.toml", body=SUITE_TABLES), method_problems)


def _drawing(params) -> tuple:
    return params.gradient_space, params.renderer, params.renderer_options


def test_a_method_without_a_table_takes_the_saliency_settings_its_kind_shares(plugin, suite, capsys):
    spec = method_specs(suite, [PLUGIN])[PLUGIN]
    assert _drawing(spec.params) == ("normalized", "captum_figure", CAPTUM_FIGURE)
    # a CAM method takes Grad-CAM's, not the saliency methods'
    cam = method_specs(suite, ["eigencam"])["eigencam"].params
    assert (cam.aug_smooth_space, cam.renderer, cam.renderer_options) == ("normalized", "show_cam_on_image", None)
    # the run says once what it took and from where
    with_method_parameters(suite, run_methods([PLUGIN]), {})
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{PLUGIN}:")]
    assert len(lines) == 1 and '"captum_figure"' in lines[0] and '"normalized"' in lines[0]
    assert "[methods.guided_backprop], [methods.integrated_gradients]" in lines[0]
    assert str(suite.path) in lines[0]
    # it is computed as the suite's methods are, and its key says so
    described = spec.build().describe(suite.architecture)["method_params"]
    assert described["renderer"] == "captum_figure" and described["gradient_space"] == "normalized"


def test_a_method_with_its_own_table_keeps_it_and_disagreeing_methods_share_nothing(plugin, tmp_path):
    body = SUITE_TABLES.replace('methods = ["guided_backprop"', f'methods = ["{PLUGIN}", "guided_backprop"')
    own = load_suite(write_suite(tmp_path / "own.toml", body=f"{body}\n[methods.{PLUGIN}]\nscale = 2.0\n"),
                     method_problems)
    assert _drawing(method_specs(own)[PLUGIN].params) == ("pixels", "hot_overlay", None)
    # integrated gradients drawn otherwise: no renderer is shared, the space still is
    split = SUITE_TABLES.replace('baseline = "normalized_zero"\nrenderer = "captum_figure"',
                                 'baseline = "normalized_zero"\nrenderer = "hot_overlay"')
    split = split.replace('renderer_options = { figure_inches = 2.0, dpi = 16 }\n\n[methods.gradcam]',
                          '\n[methods.gradcam]')
    differing = load_suite(write_suite(tmp_path / "split.toml", body=split), method_problems)
    assert _drawing(method_specs(differing, [PLUGIN])[PLUGIN].params) == ("normalized", "hot_overlay", None)


def test_the_shipped_suites_methods_resolve_as_their_tables_say():
    for name in available_suites():
        suite = load_suite(name)
        for method, spec in method_specs(suite).items():
            assert spec.params == METHODS.get(method)(suite.method_tables.get(method)).params, (name, method)


def _chosen(suite, *argv: str):
    args = get_args_parser().parse_args(["--suite", str(suite.path), *argv])
    names = run_methods(args.method, not args.no_control)
    return names, method_specs(with_method_parameters(suite, names, args.method_params), names)


def test_method_parameters_on_the_command_line_go_over_the_shared_settings_and_into_the_key(plugin, suite):
    names, specs = _chosen(suite, "--method", f"{PLUGIN}:scale=3,explained_class=label")
    assert names == [PLUGIN, "outputs_only"]
    params = specs[PLUGIN].params
    assert params.scale == 3.0 and type(params.scale) is float and params.explained_class == "label"
    assert _drawing(params) == ("normalized", "captum_figure", CAPTUM_FIGURE)
    assert specs[PLUGIN].build().describe(suite.architecture)["method_params"]["explained_class"] == "label"
    # a renderer given replaces the options of the one it replaces; a method's table stays under
    _, specs = _chosen(suite, "--method", f"{PLUGIN}:renderer=hot_overlay",
                       "--method", 'guided_backprop:renderer_options={figure_inches = 3.0}')
    assert _drawing(specs[PLUGIN].params) == ("normalized", "hot_overlay", None)
    assert _drawing(specs["guided_backprop"].params) == ("normalized", "captum_figure", {"figure_inches": 3.0})
    _, specs = _chosen(suite, "--method", "gradcam:layer=(3,1)")
    assert specs["gradcam"].params.layer == "(3,1)" and specs["gradcam"].params.renderer == "show_cam_on_image"


@pytest.mark.parametrize("option,expected", [
    (f"{PLUGIN}:scael=2", [f"--method '{PLUGIN}:scael=2'", "scael", "unknown key", "scale",
                           "valid keys: explained_class, gradient_space, renderer, renderer_options, scale"]),
    (f"{PLUGIN}:scale=big", [f"--method '{PLUGIN}:scale=big'", 'scale = "big"',
                             "the keys of plugin_saliency: explained_class"]),
    (f"{PLUGIN}:renderer=nope", [f"--method '{PLUGIN}:renderer=nope'", "unknown renderer 'nope'",
                                 "captum_figure"]),
    ("outputs_only:steps=3", ["--method 'outputs_only:steps=3'", "steps", "unknown key"]),
], ids=["unknown-key", "wrong-type", "unknown-renderer", "a-method-without-parameters"])
def test_a_bad_method_parameter_is_one_error_naming_the_option_and_the_keys(plugin, suite, option, expected):
    with pytest.raises(ValueError) as caught:
        _chosen(suite, "--method", option)
    assert all(part in str(caught.value) for part in expected), str(caught.value)


@pytest.mark.parametrize("argv,expected", [
    (["--method", f"{PLUGIN}:scale"], "'scale' is not key=value"),
    (["--method", f"{PLUGIN}:scale=[1,"], "is not a TOML value"),
    (["--method", "gradcam", "--method", "gradcam:layer=(3,1)"], "'gradcam' is given twice"),
])
def test_a_malformed_method_option_is_refused_when_the_command_line_is_read(argv, expected, capsys):
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--suite", "demo", *argv])
    error = capsys.readouterr().err
    assert "error: argument --method: " in error and expected in error, error


def test_method_brings_the_outputs_only_control_unless_told_otherwise(plugin, suite):
    assert _chosen(suite, "--method", PLUGIN)[0] == [PLUGIN, "outputs_only"]
    assert _chosen(suite, "--method", PLUGIN, "--no-control")[0] == [PLUGIN]
    assert _chosen(suite, "--method", "outputs_only", "--method", PLUGIN)[0] == ["outputs_only", PLUGIN]
    assert _chosen(suite)[0] is None  # no --method: the suite's own list, as written
    assert "--no-control" in get_args_parser().format_help()


def test_a_child_suite_with_a_shorter_method_list_drops_the_parents_tables(tmp_path):
    child = tmp_path / "child.toml"
    child.write_text('extends = "demo"\n[explain]\nmethods = ["guided_backprop", "outputs_only"]\n')
    suite = load_suite(child, method_problems)
    assert list(suite.method_tables) == ["guided_backprop"]
    assert method_specs(suite)["guided_backprop"].params.renderer == "captum_figure"
    # a table left where the list does not run it names the file that holds it
    parent = tmp_path / "parent.toml"
    parent.write_text('extends = "demo"\n[methods.saliency]\nrenderer = "hot_overlay"\n')
    grandchild = tmp_path / "grandchild.toml"
    grandchild.write_text('extends = "parent.toml"\n')
    with pytest.raises(SuiteFileError) as caught:
        load_suite(grandchild, method_problems)
    message = str(caught.value)
    assert f"{grandchild} extends {parent}" in message and "[methods.saliency]" in message
    assert f"remove the table from {Path(parent)}" in message


def test_a_method_run_with_other_parameters_keeps_its_tables_apart():
    """Two runs of one method with other --method parameters write to two tables folders, and a
    run without parameters to the plain method-<names> one."""
    plain = only_methods_label(["saliency"])
    one = only_methods_label(["saliency"], {"saliency": ("saliency:renderer=hot_overlay",
                                                         {"renderer": "hot_overlay"})})
    other = only_methods_label(["saliency"], {"saliency": ("saliency:renderer=jet_overlay",
                                                           {"renderer": "jet_overlay"})})
    assert plain == "method-saliency"
    assert one.startswith("method-saliency-") and len({plain, one, other}) == 3
