"""The options the scoring scripts (detect.py, localize.py, compare.py, report.py, dose.py,
sensitivity.py, record.py) share: the suite, the upstream stages, the distance, the methods and
detectors, the executor. Building their parser loads no stage (evaluate/cli.py: fast --help); the
names given are checked against the registries once parsed (evaluate/pipeline.py, ``prepare``), so
the help points to where they are listed rather than importing the plug-ins to list them."""
from __future__ import annotations

import argparse

from counteraudit.slurm.executor_config import add_executor_args
from counteraudit.train.core.command_line import ScriptHelpFormatter, add_common_args
from counteraudit.train.core.explain_options import CONTROL_METHOD, METHOD_HELP, add_explain_stage_args, add_method_args


def pipeline_parser(prog: str, add_help: bool = True) -> argparse.ArgumentParser:
    """The options detect.py, localize.py and report.py share: suite, upstream stages, executor."""
    parser = argparse.ArgumentParser(prog, add_help=add_help,
                                     formatter_class=ScriptHelpFormatter)
    add_common_args(parser)
    add_pipeline_args(parser)
    add_executor_args(parser)
    return parser


def add_pipeline_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_distance_args(parser)
    add_method_args(parser, f"{METHOD_HELP}. The tables of a run with --method go to "
                            "runs/<suite>/tables/method-<names>/ (method-<names>-<hash> with "
                            "parameters), beside the suite's, never over them")
    parser.add_argument("--detector", action="append", default=None, metavar="NAME",
                        help="a model-level defect detector (neural_cleanse, strip, ...: "
                             "evaluate/README.md, 'Defect detectors') to run beside the methods "
                             "and score as they are, in Tables 1 and 2 (repeatable). Its tables "
                             "go beside the suite's, in tables/method-<methods and detectors>/")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument("--p-value", default=None, metavar="TEST",
                        help="test each model's Abar against the null population of held-out "
                             "references ([references] held_out, 2 or more) and give each a "
                             "verdict, with a registered p-value test (one file each in "
                             "evaluate/scoring/null_tests/; evaluate/README.md, 'Null models', "
                             "compares them; a name not registered is answered with the list); "
                             "default: the suite's [evaluate] p_value, else the paper's rule alone")
    add_explain_stage_args(parser)  # the explain stage's work items and model groups
    return parser


def add_distance_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--distance", default=None,
                        help="the image distance of the anomaly score: l2 or ssim (weight-free), "
                             "lpips-alex (the paper's), lpips-vgg, lpips-squeeze; default: the "
                             "suite's [evaluate] distance (the demo's: l2; the paper's: lpips-alex)")
    parser.add_argument("--download-weights", action="store_true",
                        help="let an LPIPS distance download torchvision's backbone weights into "
                             "$TORCH_HOME/hub/checkpoints when they are missing; without it nothing "
                             "is downloaded, and a missing file stops the run with the fix")
    parser.add_argument("--weights-dir", default=None,
                        help="folder holding torchvision's ImageNet backbone weights for LPIPS "
                             "(e.g. alexnet-owt-7be5be79.pth); also searched: $TORCH_HOME/hub/checkpoints")
    return parser


def add_against_arg(parser: argparse.ArgumentParser,
                    default: str | None = CONTROL_METHOD) -> argparse.ArgumentParser:
    """--against: the methods each --method is compared with, paired (``scoring/pairwise.py``)."""
    said = f"default: {default}, the outputs-only control" if default else "default: none"
    parser.add_argument("--against", default=default, metavar="NAME[,NAME...]",
                        help="compare each --method with each of these methods (comma-separated "
                             "registered names), paired on the same images and models: McNemar "
                             "over models, the margin ratio and dAUROC per model, the per-family "
                             f"rate differences on a suite with null models; {said}")
    return parser
