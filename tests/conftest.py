"""Shared fixtures: the real-data folder, small deterministic settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sciformer.contracts import default_data_root

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real-data folder; skipped where it is absent, except in CI where that is an error."""
    root = default_data_root()
    if not root.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real data folder {root} is missing in CI (set SCIFORMER_DATA)")
        pytest.skip(f"real data folder {root} is absent (set SCIFORMER_DATA to run these tests)")
    return root


LIDAR_TINY = ["train.epochs=1", "train.threads=1", "train.progress=never", "data.crop_max_points=1500",
              "data.crops_per_tile=1", "data.eval_max_points=30000", "model.channels=[16,32,64,128]"]


@pytest.fixture(scope="session")
def tiny_lidar_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-epoch run of ``experiments/lidar_tiles.yaml`` on the real LAS tiles (:data:`LIDAR_TINY`),
    trained once for every test that reads it (none writes into it)."""
    from sciformer.cli import main

    if not (default_data_root() / "lidar").is_dir():
        pytest.skip("real LiDAR tiles absent (set SCIFORMER_DATA)")
    out = tmp_path_factory.mktemp("lidar_run") / "run"
    experiment = Path(__file__).resolve().parents[1] / "experiments" / "lidar_tiles.yaml"
    assert main(["train", "-c", str(experiment), "-o", str(out), *LIDAR_TINY]) == 0
    return out


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (restored after): tiny tensors, where thread wake-ups
    would dominate on shared CPUs, as ``train.threads=1`` gives a run."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep preprocessing caches of tests out of the user's ~/.cache."""
    monkeypatch.setenv("SCIFORMER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


# ----------------------------------------------------------------------------- a toy task
# A tiny registered dataset and model, so config, engine and CLI behaviour is tested
# without real data: Gaussian blobs in R^d, one per class, and a two-layer MLP.

from pydantic import BaseModel, ConfigDict, Field  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from sciformer.contracts import BuildContext, DataInfo, TaskData  # noqa: E402
from sciformer.registry import DATASETS, MODELS  # noqa: E402


class ToyBlobsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_classes: int = Field(3, ge=2)
    dim: int = Field(4, ge=1)
    per_class: int = Field(40, ge=2)
    spread: float = Field(0.3, gt=0)


class ToyBlobs(TaskData):
    def __init__(self, cfg: ToyBlobsConfig, ctx: BuildContext) -> None:
        gen = torch.Generator().manual_seed(1234)
        centres = 3 * torch.randn(cfg.num_classes, cfg.dim, generator=gen)
        self.splits = {}
        for split in ("train", "val", "test"):
            labels = torch.arange(cfg.num_classes).repeat_interleave(cfg.per_class)
            x = centres[labels] + cfg.spread * torch.randn(len(labels), cfg.dim, generator=gen)
            self.splits[split] = TensorDataset(x, labels)
        self.info = DataInfo(cfg.num_classes, [f"class_{c}" for c in range(cfg.num_classes)], cfg.dim)

    def dataset(self, split):
        return self.splits[split]

    def collate(self, items):
        x = torch.stack([i[0] for i in items])
        y = torch.stack([i[1] for i in items])
        return {"x": x, "target": y}

    def describe(self):
        return {"protocol": "toy blobs"}

    def state(self):
        return {"toy": torch.ones(2)}


class ToyMLPConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(16, ge=1)
    dropout: float = 0.1


class ToyMLP(nn.Module):
    def __init__(self, cfg: ToyMLPConfig, info: DataInfo) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(info.in_channels, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.hidden, info.num_classes))

    def forward(self, batch):
        return self.net(batch["x"])


if "toy_blobs" not in DATASETS._entries:
    DATASETS.register("toy_blobs", config=ToyBlobsConfig)(lambda cfg, ctx: ToyBlobs(cfg, ctx))
    MODELS.register("toy_mlp", config=ToyMLPConfig)(lambda cfg, info: ToyMLP(cfg, info))


@pytest.fixture
def toy_blobs_class() -> type[TaskData]:
    """The toy task's class (tests patch its splits)."""
    return ToyBlobs


@pytest.fixture
def toy_model_class() -> type[nn.Module]:
    """The toy model's class (tests patch its forward)."""
    return ToyMLP


@pytest.fixture
def toy_config(tmp_path: Path) -> Path:
    """A tiny experiment YAML on the toy task."""
    path = tmp_path / "toy.yaml"
    path.write_text(
        "name: toy\n"
        "data: {name: toy_blobs}\n"
        "model: {name: toy_mlp, hidden: 8}\n"
        "optimizer: {lr: 1e-2}\n"
        "train: {epochs: 3, batch_size: 16, progress: never}\n"
    )
    return path


@pytest.fixture
def toy_run(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    """A finished one-epoch run of the toy experiment (its output read away)."""
    from sciformer.cli import main

    folder = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(folder), "train.epochs=1"]) == 0
    capsys.readouterr()
    return folder
