"""Training through the Slurm executor on the real local cluster gives the local weights."""
import pytest
import torch

from counteraudit.slurm.executor import ExecutorConfig, run_items
from tests.conftest import write_suite
from counteraudit.train.checkpoint import WEIGHTS_NAME, model_dir
from counteraudit.train.stage import TrainItem, train_one
from counteraudit.train.core.suite import load_suite


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_training_job_array_gives_the_same_weights_as_local(tmp_path):
    suite_path = write_suite(tmp_path / "slurmtiny.toml", references=2, epochs=1)
    suite = load_suite(suite_path)
    items = [TrainItem(suite=suite, runs_dir=str(tmp_path / "slurm"), model=s.name, progress=False)
             for s in suite.references]
    config = ExecutorConfig(executor="slurm", cpus_per_task=1, time_minutes=10,
                            log_dir=tmp_path / "logs")
    on_slurm = run_items(train_one, items, config, "train", item_name=lambda i: i.model)
    assert [m["name"] for m in on_slurm] == ["reference-00", "reference-01"]
    for spec in suite.references:
        train_one(TrainItem(suite=suite, runs_dir=str(tmp_path / "local"), model=spec.name, progress=False))
        a = torch.load(model_dir(tmp_path / "slurm", spec) / WEIGHTS_NAME)
        b = torch.load(model_dir(tmp_path / "local", spec) / WEIGHTS_NAME)
        assert all(torch.equal(a[k], b[k]) for k in a), f"{spec.name}: Slurm and local weights differ"
    assert list((tmp_path / "logs" / "train").glob("*.out"))
