"""Regenerates tests/data/captum_figures_matplotlib35.npz: captum's figure as the paper's
environment drew it (js-d/auditing-vis pinned captum 0.6.0 and matplotlib 3.5.2), the reference
tests/test_explain_protocol.py holds the ``captum_figure`` renderer to.

Each figure is the paper's call (visualize/vis_functions.py):

    fig, _ = visualize_image_attr(attr_HWC, image_HWC, "blended_heat_map", alpha_overlay=0.8)
    fig.savefig(png)

at two geometries where the image is upsampled by less than 3x (where matplotlib >= 3.10
colour-maps before resampling): the demo's (64-px images, 6 in at 16 dpi: 96 px) and the paper's
at half size (112-px images, 6 in at 50 dpi: 300 px; the same 2.07x upsampling as 224 px at 100 dpi).

matplotlib 3.5.2 has no wheel for Python 3.11; built from its sdist against the system FreeType
and Qhull (the figure has no text, so FreeType's version does not enter its pixels), in a
throwaway venv outside the repository:

    apt-get install libfreetype-dev libqhull-dev pkg-config
    python3.11 -m venv /tmp/mpl35
    /tmp/mpl35/bin/pip install numpy==1.23.5 "setuptools<70" wheel "setuptools_scm<7" \
        setuptools_scm_git_archive certifi pillow pyparsing cycler kiwisolver fonttools \
        packaging python-dateutil
    /tmp/mpl35/bin/pip download --no-deps --no-binary :all: matplotlib==3.5.2
    tar xzf matplotlib-3.5.2.tar.gz && cd matplotlib-3.5.2
    printf '[libs]\nsystem_freetype = True\nsystem_qhull = True\n' > mplsetup.cfg
    /tmp/mpl35/bin/pip install --no-build-isolation --no-deps .
    /tmp/mpl35/bin/pip install --no-deps captum==0.6.0
    # captum imports torch: let the venv see the project's
    echo <repo>/.venv/lib/python3.11/site-packages > \
        /tmp/mpl35/lib/python3.11/site-packages/zz_project_torch.pth
    /tmp/mpl35/bin/python tests/data/make_matplotlib35_figures.py

The inputs are stored with the figures (attributions as float16 values, images as uint8), so the
test reads exactly what was drawn, whatever its NumPy's random streams.
"""
from __future__ import annotations

import io
from pathlib import Path

import captum
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from captum.attr import visualization  # noqa: E402
from PIL import Image  # noqa: E402

OUTPUT = Path(__file__).with_name("captum_figures_matplotlib35.npz")
GEOMETRIES = {"demo": (64, 16), "half_paper": (112, 50)}  # image px, dpi of a 6-in figure


def smooth(rng: np.random.Generator, size: int, blobs: int) -> np.ndarray:
    """A sum of Gaussian blobs in [0, 1]: the low-frequency content of photographs and maps."""
    rows, columns = np.mgrid[:size, :size] / size
    field = np.zeros((size, size))
    for _ in range(blobs):
        y, x, width, weight = rng.random(4)
        field += (weight - 0.3) * np.exp(-((rows - y) ** 2 + (columns - x) ** 2)
                                         / (0.02 + 0.1 * width) ** 2)
    return (field - field.min()) / (field.max() - field.min())


def inputs(geometry: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Attributions (n, 3, H, W) float16 and images (n, 3, H, W) uint8."""
    size = GEOMETRIES[geometry][0]
    if geometry == "demo":  # noise, heavy tails, mixed signs; a noise image and smooth ones
        attributions = np.stack([
            rng.normal(size=(3, size, size)),
            rng.standard_cauchy(size=(3, size, size)),
            smooth(rng, size, 6)[None] * [[[1.0]], [[-1.0]], [[0.5]]]
            + 0.05 * rng.normal(size=(3, size, size))])
        images = np.stack([rng.random((3, size, size))]
                          + [np.stack([smooth(rng, size, 8) for _ in range(3)])
                             for _ in range(2)])
    else:  # one smooth map on a smooth image, as a saliency map of a photograph
        attributions = (smooth(rng, size, 6) + 0.1 * smooth(rng, size, 40))[None, None] \
            * np.ones((1, 3, 1, 1))
        images = np.stack([smooth(rng, size, 12) for _ in range(3)])[None]
    return attributions.astype(np.float16), np.round(images * 255).astype(np.uint8)


def paper_figure(attribution: np.ndarray, image: np.ndarray, dpi: int) -> np.ndarray:
    """The paper's call and savefig, read back as its LPIPS loader reads the PNG (RGB)."""
    figure, _ = visualization.visualize_image_attr(
        attribution.astype(np.float32).transpose(1, 2, 0),
        (image.astype(np.float32) / 255).transpose(1, 2, 0), "blended_heat_map",
        alpha_overlay=0.8)
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=dpi)
    plt.close(figure)
    png = np.asarray(Image.open(io.BytesIO(buffer.getvalue())))
    assert (png[..., 3] == 255).all()
    return png[..., :3]


def main() -> None:
    assert matplotlib.__version__ == "3.5.2" and captum.__version__ == "0.6.0", \
        (matplotlib.__version__, captum.__version__)
    rng = np.random.default_rng(34)
    arrays = {}
    for geometry, (_, dpi) in GEOMETRIES.items():
        attributions, images = inputs(geometry, rng)
        arrays[f"{geometry}_attributions"] = attributions
        arrays[f"{geometry}_images"] = images
        arrays[f"{geometry}_figures"] = np.stack(
            [paper_figure(a, i, dpi) for a, i in zip(attributions, images)])
    np.savez_compressed(OUTPUT, **arrays)
    print(OUTPUT, OUTPUT.stat().st_size, "bytes;",
          {name: array.shape for name, array in arrays.items()})


if __name__ == "__main__":
    main()
