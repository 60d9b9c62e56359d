"""The paper suite's pipeline end to end, wired as it will run on ImageNet: a suite that `extends`
paper.toml, through the real imagenet world loader, on a generated ImageFolder of 224-px images
(3 classes), ResNet-50, 1 epoch, every paper method with its steps cut down, LPIPS with random
backbone weights, face boxes, and the paper's trigger and watermark drawn at 224. The counts and
steps are cut, nothing else: training, implant checks, image sets, explanations, scores, Table 1
and Table 2 all run through the entry scripts."""
import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from counteraudit.anomalies.families.backdoor import PAPER_PATTERNS
from counteraudit.anomalies.families.spurious import add_watermark
from counteraudit.anomalies.image_sets import abnormal_set_name
from counteraudit.evaluate.scoring.distances import DISTANCES
from counteraudit.train.checkpoint import WEIGHTS_NAME
from counteraudit.train.core.suite import load_suite
from tests.conftest import REPO, run_script

# Nine ResNet-50s at 224 px on a CPU: minutes, so .ci/run runs this file as its own step and the
# README's test command leaves it out (pyproject.toml: the paper_pipeline marker).
pytestmark = pytest.mark.paper_pipeline
PIPELINE_TIMEOUT_S = 3600

SYNSETS = ["n01440764", "n02102040", "n02979186"]
# Images per class: 3 to train on (the missing-class model keeps 6: one batch); val images of the
# last class all show a face, 10 of them, the fewest the blurred-faces implant check compares.
TRAIN_PER_CLASS, VAL_PER_CLASS = (3, 3, 3), (3, 3, 10)

SUITE = """
extends = "{paper}"
name = "paper-ci"

[world]
root = "{root}"
face_annotations = "{faces}"
num_workers = 0

[recipe]
epochs = 1
batch_size = 6
lr = 0.01
lr_step_epochs = 1
eval_batch_size = 12

[references]
# 3: scoring a reference leaves it out, and the spread needs a pair of the others
count = 3

[methods.integrated_gradients]
n_steps = 2

[methods.caricature]
steps = 1
steps_by_layer = {{ layer4 = 1 }}  # paper.toml's 1024 for layer4 (tables merge key by key)

[evaluate]
detection_images = 3
localization_images = 2

# the paper's entries, counts cut: one per Table 1 row that localizes or splits a family
[[anomalies]]
name = "adversarial-linf-4"
family = "adversarial"
row = "adversarial_linf"
params = {{ norm = "linf", eps = 0.015686, steps = 1, eval_steps = 1, eval_images = 10 }}

[[anomalies]]
name = "adversarial-l2-1"
family = "adversarial"
row = "adversarial_l2"
params = {{ norm = "l2", eps = 1.0, steps = 1, eval_steps = 1, eval_images = 10 }}

[[anomalies]]
name = "spurious-delta1.0"
family = "spurious"
params = {{ delta = 1.0, cue = "watermark", placement = "scaled", strength = 0.7, selection = "first" }}

[[anomalies]]
name = "backdoor-5-nu0.5"
family = "backdoor"
[anomalies.params]
nu = 0.5
target = 2
pattern = "paper_5"
position = "paper"
poison_before_flip = false
selection = "first"

[[anomalies]]
name = "missing-1"
family = "missing_class"
params = {{ class_id = 1, drop_output = true }}

[[anomalies]]
name = "blurred-faces"
family = "blurred_faces"
"""


def _imagefolder(base):
    """224-px-and-larger JPEGs of 3 classes; a face box in every image of the last class."""
    rng = np.random.default_rng(0)
    root, faces = base / "imagenet", {}
    for split, counts in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for label, (synset, count) in enumerate(zip(SYNSETS, counts)):
            folder = root / split / synset
            folder.mkdir(parents=True)
            for i in range(count):
                width, height = int(rng.integers(256, 300)), int(rng.integers(256, 300))
                pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
                pixels[..., label] //= 2  # a colour cast per class, something to learn
                name = f"{split}_{synset}_{i}.JPEG"
                Image.fromarray(pixels).save(folder / name, format="JPEG")
                if label == 2:
                    faces[f"{split}/{synset}/{name}"] = [[60, 60, 80, 80]]
    (base / "faces.json").write_text(json.dumps(faces))
    return root


def write_paper_ci(base):
    """The generated ImageFolder, the suite file and the random LPIPS weights under ``base``;
    returns the entry scripts' common arguments."""
    root = _imagefolder(base)
    suite = base / "paper-ci.toml"
    suite.write_text(SUITE.format(paper=REPO / "train" / "suites" / "paper.toml", root=root,
                                  faces=base / "faces.json"))
    weights = base / "lpips-weights"  # LPIPS's AlexNet backbone with random weights, as a file
    weights.mkdir()
    torch.manual_seed(0)
    alex = DISTANCES.get("lpips-alex").torchvision_backbone
    torch.save(alex.builder(weights=None).state_dict(), weights / alex.file_name)
    return ["--suite", suite, "--runs-dir", base / "runs", "--distance", "lpips-alex", "--weights-dir",
            weights, "--no-progress", "--device", "cpu", "--gpus-per-node", "0"]


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    # the CPU precision probe times ResNet-50 in fp32 and bf16: minutes on a CPU that emulates bf16
    probe = os.environ.get("COUNTERAUDIT_CPU_PROBE")
    os.environ["COUNTERAUDIT_CPU_PROBE"] = "off"
    base = tmp_path_factory.mktemp("paper-ci")
    common = write_paper_ci(base)
    suite, runs = common[1], common[3]
    try:
        detect = run_script("evaluate/detect.py", *common, timeout=PIPELINE_TIMEOUT_S)
        localize = run_script("evaluate/localize.py", *common, timeout=PIPELINE_TIMEOUT_S)
    finally:
        if probe is None:
            os.environ.pop("COUNTERAUDIT_CPU_PROBE")
        else:
            os.environ["COUNTERAUDIT_CPU_PROBE"] = probe
    return load_suite(suite), runs, detect, localize


def test_every_stage_leaves_its_artifacts(paper_run):
    suite, runs, detect, _ = paper_run
    assert len(suite.models) == 9 and suite.world["image_size"] == 224
    store = runs / "store" / "models"
    for spec in suite.models:
        metrics = json.loads((store / spec.key / "metrics.json").read_text())
        assert metrics["source"] == "trained" and metrics["epochs"] == 1
    assert len(list(store.glob("*/implant-*.json"))) == len(suite.anomalies)
    tables = runs / "paper-ci" / "tables"
    for name in ("detection-lpips-alex", "localization-lpips-alex"):
        for ext in ("md", "csv", "tex"):
            assert (tables / f"{name}.{ext}").is_file()


def test_missing_class_model_has_the_papers_dropped_output(paper_run):
    suite, runs, _, _ = paper_run
    spec = suite.model("missing-1")
    weights = torch.load(runs / "store" / "models" / spec.key / WEIGHTS_NAME, map_location="cpu")
    assert weights["fc.weight"].shape[0] == len(SYNSETS) - 1


def test_tables_have_the_papers_rows(paper_run):
    _, runs, _, _ = paper_run
    tables = runs / "paper-ci" / "tables"
    table1 = pd.read_csv(tables / "detection-lpips-alex.csv")
    assert list(table1["family"]) == ["adversarial_linf", "adversarial_l2", "backdoor", "blurred_faces",
                                      "missing_class", "spurious"]
    methods = {"integrated_gradients", "gradcam", "guided_backprop", "guided_gradcam", "caricature",
               "outputs_only"}
    assert methods <= set(table1.columns)
    table2 = pd.read_csv(tables / "localization-lpips-alex.csv")
    caricature_rows = [r for r in table2["method"] if r.startswith("caricature")]
    assert len(caricature_rows) == 7 + 1 and caricature_rows[-1] == "caricature layer average"
    assert set(table2.columns) >= {"backdoor-5-nu0.5", "spurious-delta1.0", "missing-1", "blurred-faces"}


def _image_set(runs, spec):
    """(folder, index) of a model's abnormal image set (the suite's link into the store)."""
    folder = runs / "paper-ci" / "image_sets" / abnormal_set_name(spec)
    return folder, json.loads((folder / "index.json").read_text())


def test_abnormal_images_carry_the_papers_trigger_and_watermark(paper_run):
    suite, runs, _, _ = paper_run
    folder, _ = _image_set(runs, suite.model("backdoor-5-nu0.5"))
    backdoor = [np.asarray(Image.open(p)) for p in sorted((folder / "png").glob("*.png"))]
    expected = (np.array(PAPER_PATTERNS["paper_5"]) * 255).astype(np.uint8)
    assert len(backdoor) == 2 and all((image[3:10, 23:30] == expected[..., None]).all() for image in backdoor)
    folder, index = _image_set(runs, suite.model("spurious-delta1.0"))
    labels = torch.as_tensor(index["labels"])
    for image, label in zip(sorted((folder / "png").glob("*.png")), labels):
        pixels = torch.from_numpy(np.array(Image.open(image))).permute(2, 0, 1).float() / 255
        # the box at rows 206-221 is at least the watermark's 0.7 where a digit's stroke is
        box = pixels[:, 206:222, 172:222]
        mark = add_watermark(torch.zeros(1, 3, 224, 224), label[None], "fixed", 0.7)[0, :, 206:222, 172:222]
        assert (box[mark > 0.69] >= 0.69).all()
