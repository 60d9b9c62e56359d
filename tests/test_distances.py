"""Distances: LPIPS from cached features equals lpips.LPIPS, backbone weights are found or explained."""
from __future__ import annotations

import lpips
import numpy as np
import pytest
import torch
import torchvision
from scipy.ndimage import gaussian_filter

import counteraudit.evaluate.scoring.distances.l2 as l2_module
from counteraudit.evaluate.scoring.distances import (DISTANCES, MissingBackboneWeightsError, available,
                                                     build_distance)
from counteraudit.train.core.registry import UnknownNameError

# lpips builds torchvision backbones with the deprecated pretrained= argument
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torchvision.*")

WEIGHT_FILES = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth",
                "squeeze": "squeezenet1_1-b8a52dc0.pth"}


@pytest.fixture(autouse=True)
def empty_torch_home(tmp_path, monkeypatch):
    """No test may see (or download into) the real hub cache."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))


def renders(count: int, size: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def as_lpips_input(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def reference_lpips(net: str, seed: int):
    torch.manual_seed(seed)  # lpips builds its random backbone from the global stream
    return lpips.LPIPS(pretrained=True, pnet_rand=True, net=net, verbose=False)


@pytest.mark.parametrize("net", ["alex", "vgg", "squeeze"])
def test_lpips_from_cached_features_equals_lpips_package(net):
    a, b = renders(3, seed=1), renders(3, seed=2)
    b[0] = a[0]  # an identical pair must give exactly 0
    metric = reference_lpips(net, seed=7)
    distance = build_distance(f"lpips-{net}", random_backbone=True, seed=7, batch_size=2)
    features_a, features_b = distance.features(a), distance.features(b)
    with torch.no_grad():
        expected_paired = metric(as_lpips_input(a), as_lpips_input(b)).flatten().numpy()
        expected_cross = metric(as_lpips_input(a[1:2]), as_lpips_input(b[2:3])).item()
    paired = distance.paired(features_a, features_b)
    pairwise = distance.pairwise(features_a, features_b)
    np.testing.assert_allclose(paired, expected_paired, atol=1e-5, rtol=0)
    assert paired[0] == 0.0
    np.testing.assert_allclose(np.diag(pairwise), paired, atol=1e-7, rtol=0)
    assert abs(pairwise[1, 2] - expected_cross) < 1e-5


def test_weights_dir_backbone_is_loaded_and_used(tmp_path):
    torch.manual_seed(11)
    torch.save(torchvision.models.alexnet(weights=None).state_dict(), tmp_path / "alexnet-owt-7be5be79.pth")
    assert available("lpips-alex", weights_dir=tmp_path, download=False)
    distance = build_distance("lpips-alex", weights_dir=tmp_path, download=False)
    a, b = renders(2, seed=3), renders(2, seed=4)
    with torch.no_grad():
        expected = reference_lpips("alex", seed=11)(as_lpips_input(a), as_lpips_input(b)).flatten().numpy()
    np.testing.assert_allclose(distance.paired(distance.features(a), distance.features(b)), expected,
                               atol=1e-5, rtol=0)


def test_torch_hub_cache_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.manual_seed(12)
    torch.save(torchvision.models.squeezenet1_1(weights=None).state_dict(),
               tmp_path / "hub" / "checkpoints" / "squeezenet1_1-b8a52dc0.pth")
    assert available("lpips-squeeze", download=False)
    distance = build_distance("lpips-squeeze", download=False)
    a, b = renders(2, seed=5), renders(2, seed=6)
    with torch.no_grad():
        expected = reference_lpips("squeeze", seed=12)(as_lpips_input(a), as_lpips_input(b)).flatten().numpy()
    np.testing.assert_allclose(distance.paired(distance.features(a), distance.features(b)), expected,
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("net", ["alex", "vgg", "squeeze"])
def test_missing_weights_error_names_file_place_and_fetch_command(net, tmp_path):
    assert DISTANCES.get(f"lpips-{net}").torchvision_backbone.file_name == WEIGHT_FILES[net]
    assert not available(f"lpips-{net}", weights_dir=tmp_path, download=False)
    with pytest.raises(MissingBackboneWeightsError) as caught:
        build_distance(f"lpips-{net}", weights_dir=tmp_path, download=False)
    message = str(caught.value)
    assert WEIGHT_FILES[net] in message
    assert str(tmp_path / WEIGHT_FILES[net]) in message  # where to put it
    builder = {"alex": "alexnet", "vgg": "vgg16", "squeeze": "squeezenet1_1"}[net]
    assert f"python -c \"import torchvision; torchvision.models.{builder}(weights='IMAGENET1K_V1')\"" in message
    assert "--download-weights" in message and "--distance l2 or ssim" in message


def test_lpips_downloads_its_weights_only_when_asked(monkeypatch):
    """Offline or not, nothing reaches for the network unasked: a missing backbone is an error
    with the fix; download=True (--download-weights) is what tries the download."""
    tried = []

    def no_network(url, *args, **kwargs):
        tried.append(url)
        raise OSError("no network in this test")
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    assert not available("lpips-alex")  # empty TORCH_HOME: no weights
    with pytest.raises(MissingBackboneWeightsError, match="--download-weights"):
        build_distance("lpips-alex")
    assert tried == []
    with pytest.raises(MissingBackboneWeightsError, match="download failed: OSError"):
        build_distance("lpips-alex", download=True)
    assert tried == [DISTANCES.get("lpips-alex").torchvision_backbone.url]


def test_registry_lists_distances_and_rejects_unknown_names():
    assert {"lpips-alex", "lpips-vgg", "lpips-squeeze", "ssim", "l2"} <= set(DISTANCES.names())
    with pytest.raises(UnknownNameError, match="lpips-alex"):
        build_distance("lpips-alexnet")
    assert available("ssim")


def reference_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Textbook SSIM with scipy's Gaussian filter, cropped like skimage (gaussian_weights=True)."""
    c1, c2, crop = (0.01 * 255) ** 2, (0.03 * 255) ** 2, 5
    values = []
    for channel in range(3):
        x, y = a[..., channel].astype(np.float64), b[..., channel].astype(np.float64)
        blur = lambda image: gaussian_filter(image, sigma=1.5, truncate=3.5)  # noqa: E731
        mx, my = blur(x), blur(y)
        vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
        ssim_map = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
        values.append(ssim_map[crop:-crop, crop:-crop].mean())
    return float(np.mean(values))


def test_ssim_distance_matches_textbook_ssim():
    distance = build_distance("ssim")
    a = renders(3, size=32, seed=8)
    b = np.clip(a.astype(int) + np.random.default_rng(9).integers(-40, 40, a.shape), 0, 255).astype(np.uint8)
    b[2] = a[2]
    paired = distance.paired(distance.features(a), distance.features(b))
    expected = [1 - reference_ssim(a[k], b[k]) for k in range(3)]
    np.testing.assert_allclose(paired, expected, atol=1e-10)
    assert abs(paired[2]) < 1e-12
    pairwise = distance.pairwise(distance.features(a), distance.features(b))
    np.testing.assert_allclose(np.diag(pairwise), paired, atol=1e-12)


def test_l2_distance_is_the_rms_pixel_difference_and_exact_under_chunking(monkeypatch):
    distance = build_distance("l2")
    a, b = renders(5, size=16, seed=12), renders(5, size=16, seed=13)
    b[3] = a[3]
    expected = np.sqrt(((a.astype(np.float64) - b) ** 2).mean(axis=(1, 2, 3))) / 255
    paired = distance.paired(distance.features(a), distance.features(b))
    np.testing.assert_allclose(paired, expected, rtol=1e-12)
    assert paired[3] == 0.0
    # integer sums: chunked (one image per chunk) and subset results are the same bits

    monkeypatch.setattr(l2_module, "chunk_length", lambda _: 1)
    assert np.array_equal(distance.paired(distance.features(a), distance.features(b)), paired)
    subset = distance.paired(distance.features(a).select([4, 1]), distance.features(b[[4, 1]]))
    assert np.array_equal(subset, paired[[4, 1]])


def test_bad_images_and_mixed_features_are_rejected_with_the_fix():
    distance = build_distance("ssim")
    with pytest.raises(ValueError, match="uint8"):
        distance.features(np.zeros((1, 32, 32, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"images\[None\]"):
        distance.features(np.zeros((32, 32, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="same number of images"):
        distance.paired(distance.features(renders(2, 32)), distance.features(renders(3, 32)))
    for name in ("ssim", "l2"):
        with pytest.raises(TypeError, match="unknown options"):
            build_distance(name, weights_dri="typo")


def test_half_precision_cache_is_close_and_features_can_be_subset():
    exact = build_distance("lpips-alex", random_backbone=True, seed=3)
    half = build_distance("lpips-alex", random_backbone=True, seed=3, feature_dtype="float16")
    a, b = renders(3, seed=10), renders(3, seed=11)
    expected = exact.paired(exact.features(a), exact.features(b))
    np.testing.assert_allclose(half.paired(half.features(a), half.features(b)), expected, rtol=1e-3)
    features_a = exact.features(a)
    reordered = features_a.select([2, 0])
    np.testing.assert_allclose(exact.paired(reordered, exact.features(b[[2, 0]])), expected[[2, 0]], atol=1e-7)
    with pytest.raises(ValueError, match="feature_dtype"):
        build_distance("lpips-alex", random_backbone=True, feature_dtype="int8")


@pytest.mark.parametrize("name", DISTANCES.names())
def test_every_distance_gives_the_same_bits_on_any_number_of_threads(name):
    """A score table must not depend on the machine's cores: at 96 px lpips-squeeze and lpips-vgg
    summed and convolved otherwise on 3 threads than on 1 until distances ran on one thread. The
    caller's thread count is left as it was."""
    options = {"random_backbone": True} if DISTANCES.get(name).needs_weights else {}
    distance = build_distance(name, **options)
    images, others = renders(2, size=96, seed=1), renders(2, size=96, seed=2)
    results = {}
    before = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            features = distance.features(images), distance.features(others)
            results[threads] = (distance.paired(*features).tobytes(),
                                distance.pairwise(*features).tobytes())
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert results[1] == results[3]
