"""Power (evaluate/studies/power.py): verdicts recomputed on subsets of references and images agree with
Table 1 at the full sets, subset shares are right on constructed scores, and "what a method
needs" is the smallest size that works there and at every larger size."""
import numpy as np
import pandas as pd
import pytest

from counteraudit.evaluate.reporting.html import html_table
from counteraudit.evaluate.reporting.power import needs_table, power_section
from counteraudit.evaluate.scoring.detection import detection_table
from counteraudit.evaluate.scoring.distances import build_distance
from counteraudit.evaluate.scoring.scores import anomaly_scores, reference_distance_matrix
from counteraudit.evaluate.studies.power import (detection_by_image_count, detection_by_reference_count,
                                                 detection_verdicts, localization_by_image_count,
                                                 smallest_sufficient, subset_abars)


@pytest.fixture(scope="module")
def renders():
    """Five references and three models' renders of 12 images (l2 distance on uint8 images): the
    references vary around one image, "far" far from it, "near" like a reference."""
    rng = np.random.default_rng(3)
    base = rng.integers(60, 190, size=(12, 8, 8, 3))
    def render(noise):
        return np.clip(base + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8)
    images = {f"g{k}": render(10) for k in range(5)}
    images.update(far=render(40), near=render(10), mid=render(14))
    distance = build_distance("l2")
    return {name: distance.features(x) for name, x in images.items()}, distance


def test_all_references_and_images_reproduce_table1(renders):
    features, distance = renders
    references, models = [f"g{k}" for k in range(5)], ["far", "near", "mid"]
    scores = anomaly_scores(features, references, distance).assign(method="m")
    table = detection_table(scores, references).set_index("model")
    matrix = reference_distance_matrix(features, [*references, *models], distance)
    model_abars, reference_abars = subset_abars(matrix, 5, np.arange(5))
    assert model_abars == pytest.approx(table.loc[models, "abar"].to_numpy())
    assert reference_abars == pytest.approx(table.loc[references, "abar"].to_numpy())
    detected, margin = detection_verdicts(model_abars, reference_abars)
    assert list(detected) == list(table.loc[models, "detected"])
    assert margin == pytest.approx(table.loc[models, "margin"].to_numpy())
    assert detected[0] and not detected[1]  # the constructed far model is seen, the near one not
    # a subset of references is scored as if the suite had only those (leave-one-out among them)
    chosen = np.array([0, 2, 4])
    sub = [references[k] for k in chosen]
    own = detection_table(anomaly_scores({k: features[k] for k in [*sub, *models]}, sub, distance)
                          .assign(method="m"), sub).set_index("model")
    model_abars, reference_abars = subset_abars(matrix, 5, chosen)
    assert model_abars == pytest.approx(own.loc[models, "abar"].to_numpy())
    assert reference_abars == pytest.approx(own.loc[sub, "abar"].to_numpy())
    # and on a subset of images, Abar is the mean over those images alone
    images = np.array([1, 4, 7])
    model_abars, _ = subset_abars(matrix, 5, np.arange(5), images)
    per_image = scores[scores["model"] == "far"].set_index("image")["score"]
    assert model_abars[0] == pytest.approx(per_image.loc[images].mean())


def test_detection_by_reference_count_counts_subsets(renders):
    features, distance = renders
    names = [*(f"g{k}" for k in range(5)), "far", "near"]
    matrix = reference_distance_matrix(features, names, distance)
    table = detection_by_reference_count(matrix, 5, ["far", "near"], subsets=10,
                                         rng=np.random.default_rng(0)).set_index(["model", "n"])
    assert list(table.index.get_level_values("n").unique()) == [3, 4, 5]
    assert (table.loc["far", "fraction_detected"] == 1.0).all()
    assert table.loc[("far", 5), "subsets"] == 1 and table.loc[("far", 3), "subsets"] == 10
    # the only full set: Table 1's verdict, 0 or 1
    assert table.loc[("near", 5), "fraction_detected"] in (0.0, 1.0)


def test_detection_by_image_count_is_the_share_of_image_subsets_where_abar_beats_the_references():
    # references score 1 on every image; the model 2 on five images and 0.5 on five: with m = 2
    # images it is missed only when both are low, C(5,2) / C(10,2) = 10/45 of the pairs
    rows = [{"model": f"g{k}", "image": i, "score": 1.0} for k in range(3) for i in range(10)]
    rows += [{"model": "f", "image": i, "score": 2.0 if i < 5 else 0.5} for i in range(10)]
    table = detection_by_image_count(pd.DataFrame(rows), ["g0", "g1", "g2"], ["f"], [2, 10],
                                     subsets=4000, rng=np.random.default_rng(1)).set_index("m")
    assert table.loc[2, "fraction_detected"] == pytest.approx(35 / 45, abs=0.02)
    assert table.loc[10, "fraction_detected"] == 1.0 and table.loc[10, "subsets"] == 1
    assert table.loc[10, "mean_margin"] == pytest.approx(1.25)


def test_localization_by_image_count():
    rng = np.random.default_rng(2)
    separated = localization_by_image_count(np.arange(10, 20.0), np.arange(10.0), [3, 10], 50, rng)
    assert (separated["fraction_reaching"] == 1.0).all()
    assert list(separated["subsets"]) == [50, 1]
    same = localization_by_image_count(rng.normal(size=20), rng.normal(size=20), [5, 20], 200, rng)
    assert same.loc[0, "fraction_reaching"] < 0.4  # chance rarely reaches 0.8
    with pytest.raises(ValueError, match="p = 30 abnormal images asked for, 20 scored"):
        localization_by_image_count(np.zeros(20), np.zeros(20), [30], 5, rng)


@pytest.mark.parametrize("fractions, expected", [
    ([0.9, 0.95, 1.0], 3), ([0.5, 0.85, 0.9], 4), ([0.9, 0.7, 0.85], 5), ([0.9, 0.9, 0.5], np.inf)])
def test_smallest_sufficient_holds_at_that_size_and_every_larger_one(fractions, expected):
    assert smallest_sufficient([5, 3, 4], [fractions[2], fractions[0], fractions[1]]) == expected


def test_needs_table_names_each_methods_smallest_counts():
    by_n = pd.DataFrame({"method": "a", "model": "x", "n": [3, 4, 5],
                         "fraction_detected": [0.5, 0.9, 1.0]})
    by_m = pd.DataFrame({"method": "a", "model": "x", "m": [6, 12], "fraction_detected": [0.2, 0.7]})
    by_p = pd.DataFrame({"method": "a", "model": "x", "p": [4, 8], "fraction_reaching": [0.85, 0.9]})
    needs = needs_table(by_n, by_m, None, by_p, level=0.8)
    assert needs.to_dict("records") == [{"method": "a", "model": "x", "detect: n": "4",
                                         "detect: m": "> 12", "localize: n": "-",
                                         "localize: p": "4"}]


def test_the_report_power_section_reads_the_tables_reference_count_wrote(tmp_path):
    command = "counteraudit reference-count --suite demo"
    # the note names the command for the report's own suite
    assert f"<code>{command}</code> adds" in power_section(tmp_path, "l2", html_table, command)
    by_n = pd.DataFrame({"method": ["a", "a", "b", "b"], "model": "x", "n": [3, 4, 3, 4],
                         "fraction_detected": [0.5, 1.0, 0.0, 0.25]})
    by_n.to_csv(tmp_path / "power-detection-by-n-l2.csv", index=False)
    needs_table(by_n, None, None, None, 0.8).to_csv(tmp_path / "power-needs-l2.csv", index=False)
    html = power_section(tmp_path, "l2", html_table, command)
    assert html.count("<svg") == 1 and html.count("<polyline") == 2  # one model, two methods
    assert "<td>a</td><td>x</td><td>4</td>" in html and "<td>b</td><td>x</td><td>&gt; 4</td>" in html
