"""Export a suite's trained population as a release, or verify one and import it into the store.

    counteraudit population export --suite replicated replicated-population        # a folder
    counteraudit population export --suite replicated replicated-population.tar    # an archive
    counteraudit population import replicated-population.tar --runs-dir runs
    HF_HUB_OFFLINE=1 counteraudit population import hf://owner/name --revision <commit>

A release holds every model of the suite (weights as safetensors, spec, metrics, implant
record), the image sets they are explained on, the suite file, the world's definition and the
digests of its data, a manifest with the SHA-256 of every file, the code and numeric mode that
made it, and a model card (README.md, in the Hugging Face Hub's layout). Import checks every
file first (evaluate/release/verify.py) and writes nothing unless all pass; then each model lands
under its own key, so `python evaluate/detect.py --suite replicated` finds them and trains
nothing. The manifest's SHA-256 names the release: ``--sha256`` pins it.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import time

from counteraudit.train.core.command_line import ScriptHelpFormatter, add_common_args, run_cli


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit population", add_help=add_help,
                                     description=__doc__, formatter_class=ScriptHelpFormatter)
    parser.add_argument("action", choices=("export", "import"),
                        help="export: write the suite's trained models as a release at PATH; "
                             "import: verify the release at PATH and add its models to the store")
    parser.add_argument("path", metavar="PATH",
                        help="export: a new folder, or a new file ending in .tar; import: a "
                             "release folder, a .tar, or hf://owner/name (with --revision)")
    parser.add_argument("--revision", default=None, metavar="COMMIT",
                        help="import from the Hub: the 40-hex-digit commit the release is pinned to")
    parser.add_argument("--hub-cache", default=None, metavar="DIR",
                        help="import from the Hub: huggingface_hub's cache folder (default: its "
                             "own, $HF_HUB_CACHE); with HF_HUB_OFFLINE=1 only the cache is read")
    parser.add_argument("--sha256", default=None, metavar="ID",
                        help="import: the population id (the manifest's SHA-256, printed by "
                             "export) the release must have")
    add_common_args(parser)
    return parser


def export(args: argparse.Namespace) -> None:
    from counteraudit.evaluate.pipeline import load_checked_suite
    from counteraudit.evaluate.release.export import export_population

    suite = load_checked_suite(args.suite)
    started = time.perf_counter()
    out, population_id, manifest = export_population(suite, args.path, args.runs_dir)
    size = sum(entry.size for entry in manifest.files.values())
    print(f"exported suite {suite.name!r}: {len(manifest.models)} models, {len(manifest.image_sets)} "
          f"image sets, {len(manifest.files) + 1} files, {size / 2**20:.1f} MiB, to {out} in "
          f"{time.perf_counter() - started:.1f}s")
    print(f"population id (the manifest's SHA-256; import --sha256 pins it): {population_id}")


def import_(args: argparse.Namespace) -> None:
    from counteraudit.evaluate.release.install import install_release, mode_mismatch
    from counteraudit.evaluate.release.sources import opened_release
    from counteraudit.evaluate.release.verify import verify_release
    from counteraudit.train.core.artifacts import runs_dir
    from counteraudit.train.core.suite_files import available_suites

    started = time.perf_counter()
    with opened_release(args.path, args.revision, args.hub_cache) as opened:
        release = verify_release(opened, args.sha256)
        print(f"verified {release.source}: {len(release.manifest.files) + 1} files, population "
              f"{release.population_id} (suite {release.manifest.suite!r}, numerics "
              f"{release.manifest.numerics}, counteraudit {release.manifest.counteraudit})")
        imported = install_release(release, args.runs_dir)
    print(f"imported into {runs_dir(args.runs_dir)}/store in {time.perf_counter() - started:.1f}s: "
          f"{len(imported.models)} models ({imported.identical_weights} with weights.pth "
          f"byte-identical to the exporter's), {len(imported.image_sets)} image sets; already "
          f"there and kept: {len(imported.models_kept)} models, {len(imported.image_sets_kept)} "
          "image sets")
    warning = mode_mismatch(release)
    if warning:
        print(f"warning: {warning}")
    suite = (release.manifest.suite if release.manifest.suite in available_suites()
             else f"<release>/{release.manifest.suite_file}")
    print(f"next: python evaluate/detect.py --suite {suite} (trains nothing it imported)")


def main(args: argparse.Namespace) -> None:
    (export if args.action == "export" else import_)(args)


if __name__ == "__main__":
    run_cli(main, get_args_parser())
