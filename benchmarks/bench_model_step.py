"""ModelNet10 training step: sciformer's v1 and v3 models vs the v1 network built from PyG layers, one run.

The sciformer model is ``point_transformer_cls`` exactly as ``experiments/modelnet10.yaml``
configures it (channels 32/64/128/256, blocks 0/1/1/1, strides 1/4/4/4, k 16, share_planes
8). The PyG networks have the same layout, built from torch_geometric layers:

- stage 1: ``Linear-BN-ReLU`` on the coordinates (stride 1, no block);
- stages 2-4: PyG-style transition down (FPS to 1/4, kNN k=16 into the finer level, per
  edge ``Linear-BN-ReLU`` on ``[p_j - p_i, x_j]``, ``torch_geometric.utils.scatter`` max)
  and one PTv1 block (``Linear-BN-ReLU``, ``torch_geometric.nn.PointTransformerConv``,
  ``BN-ReLU``, ``Linear-BN``, residual ``ReLU``) on the stage's kNN graph (self included);
- ``global_mean_pool`` and the same MLP head (256, 128, dropout 0.5).

``v3`` is ``point_transformer_v3_cls`` exactly as ``experiments/modelnet10_v3.yaml``
configures it (``--v3-set KEY=VALUE ...`` overrides that file, e.g. ``model.grid_size=0.06``).

``pyg`` computes the same attention as sciformer: its ``attn_nn`` maps to C/8 weights
repeated over the 8 channel groups (PTv1's share_planes). ``pyg-full`` is PyG's usual
PTv1 block, one attention weight per channel (``attn_nn`` C -> C -> C), more arithmetic.
FPS and kNN are sciformer's in every network (torch_geometric's need torch_cluster, absent
here), so the ratio measures the layers. Data: 32 ModelNet10 training shapes, 512 of their
1,024 points (the experiment's batch), AdamW; a step is forward, cross-entropy, backward and
the optimiser step. The networks run interleaved, one step each per round after warm-up;
the table shows the median step time and the median of the per-round ratios.

    python benchmarks/bench_model_step.py                  # 1 thread (the experiment's), 15 rounds
    python benchmarks/bench_model_step.py --threads 2 --rounds 9
    python benchmarks/bench_model_step.py --cases sciformer,v3   # v1 vs v3 only
    python benchmarks/bench_model_step.py --profile v3     # torch.profiler table of the v3 step
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor, nn

from sciformer import config
from sciformer.contracts import DataInfo, default_data_root
from sciformer.engine import builders
from sciformer.geometry import fps, knn, offset_to_batch

ROOT = Path(__file__).resolve().parents[1]
CHANNELS, STRIDE, K, SHARE = (32, 64, 128, 256), 4, 16, 8


def lbr(i: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, o, bias=False), nn.BatchNorm1d(o), nn.ReLU(inplace=True))


class RepeatGroups(nn.Module):
    """(E, C/s) attention weights -> (E, C): channel c uses weight c mod C/s (PTv1 share_planes)."""

    def __init__(self, s: int) -> None:
        super().__init__()
        self.s = s

    def forward(self, w: Tensor) -> Tensor:
        return w.repeat(1, self.s)


class PygBlock(nn.Module):
    """PTv1 residual block around ``torch_geometric.nn.PointTransformerConv``."""

    def __init__(self, c: int, full: bool) -> None:
        super().__init__()
        from torch_geometric.nn import PointTransformerConv

        g = c if full else c // SHARE
        pos_nn = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU(inplace=True), nn.Linear(3, c))
        attn = [nn.BatchNorm1d(c), nn.ReLU(inplace=True), nn.Linear(c, g), nn.BatchNorm1d(g), nn.ReLU(inplace=True), nn.Linear(g, g)]
        attn_nn = nn.Sequential(*attn, *([] if full else [RepeatGroups(SHARE)]))
        self.lin1, self.bn1 = nn.Linear(c, c, bias=False), nn.BatchNorm1d(c)
        self.conv = PointTransformerConv(c, c, pos_nn=pos_nn, attn_nn=attn_nn, add_self_loops=False)
        self.bn2, self.lin3, self.bn3 = nn.BatchNorm1d(c), nn.Linear(c, c, bias=False), nn.BatchNorm1d(c)

    def forward(self, x: Tensor, pos: Tensor, edge_index: Tensor) -> Tensor:
        h = torch.relu(self.bn1(self.lin1(x)))
        h = torch.relu(self.bn2(self.conv(h, pos, edge_index)))
        return torch.relu(x + self.bn3(self.lin3(h)))


class PygTransitionDown(nn.Module):
    """FPS + kNN, per-edge ``Linear-BN-ReLU`` on ``[p_j - p_i, x_j]``, scatter max."""

    def __init__(self, i: int, o: int) -> None:
        super().__init__()
        self.mlp = lbr(i + 3, o)

    def forward(self, x: Tensor, pos: Tensor, offset: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        from torch_geometric.utils import scatter

        sampled = fps(pos, offset, ratio=1.0 / STRIDE)
        new_pos, new_offset = pos[sampled.index], sampled.offset
        idx, _ = knn(new_pos, pos, K, new_offset, offset, fill="nearest")  # (M, k)
        m = idx.shape[0]
        target = torch.arange(m).repeat_interleave(K)  # (M k,)
        edge = torch.cat([pos[idx.reshape(-1)] - new_pos[target], x[idx.reshape(-1)]], dim=1)  # (M k, 3 + C)
        return scatter(self.mlp(edge), target, dim=0, dim_size=m, reduce="max"), new_pos, new_offset


class PygClassifier(nn.Module):
    """The ModelNet10 layout from PyG layers (see the module docstring)."""

    def __init__(self, num_classes: int, full: bool) -> None:
        super().__init__()
        self.stem = lbr(3, CHANNELS[0])
        self.downs = nn.ModuleList(PygTransitionDown(a, b) for a, b in zip(CHANNELS[:-1], CHANNELS[1:]))
        self.blocks = nn.ModuleList(PygBlock(c, full) for c in CHANNELS[1:])
        head: list[nn.Module] = []
        width = CHANNELS[-1]
        for h in (256, 128):
            head += [nn.Linear(width, h, bias=False), nn.BatchNorm1d(h), nn.ReLU(inplace=True), nn.Dropout(0.5)]
            width = h
        self.head = nn.Sequential(*head, nn.Linear(width, num_classes))

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        from torch_geometric.nn import global_mean_pool

        pos, offset = batch["coord"], batch["offset"]
        x = self.stem(pos)
        for down, block in zip(self.downs, self.blocks):
            x, pos, offset = down(x, pos, offset)
            idx, _ = knn(pos, None, K, offset, fill="nearest")  # (M, k) self included
            edge_index = torch.stack([idx.reshape(-1), torch.arange(idx.shape[0]).repeat_interleave(K)])
            x = block(x, pos, edge_index)
        return self.head(global_mean_pool(x, offset_to_batch(offset), size=offset.shape[0]))


def load_batch(clouds: int, points: int) -> dict[str, Tensor]:
    path = default_data_root() / "modelnet10_hdf5_1024" / "ply_data_train0.h5"
    with h5py.File(path, "r") as f:
        data = np.asarray(f["data"][:clouds, :points], dtype=np.float32)
        label = np.asarray(f["label"][:clouds]).reshape(-1).astype(np.int64)
    return {"coord": torch.from_numpy(data.reshape(-1, 3)), "feat": torch.zeros(clouds * points, 0),
            "offset": torch.arange(1, clouds + 1) * points, "target": torch.from_numpy(label)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cases", default="sciformer,v3,pyg,pyg-full", help="sciformer (v1), v3, pyg, pyg-full")
    parser.add_argument("--profile", metavar="CASE", help="print torch.profiler's table of one step of CASE and exit")
    parser.add_argument("--v3-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of experiments/modelnet10_v3.yaml for the v3 case, e.g. model.grid_size=0.06")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    exp = config.load(ROOT / "experiments" / "modelnet10.yaml", [])
    exp_v3 = config.load(ROOT / "experiments" / "modelnet10_v3.yaml", args.v3_set)
    info = DataInfo(10, [f"c{i}" for i in range(10)], 0, task="classification")
    models: dict[str, nn.Module] = {}
    for case in ([args.profile] if args.profile else args.cases.split(",")):
        if case in ("sciformer", "v3"):
            models[case] = builders.build_model(exp_v3 if case == "v3" else exp, info)
        else:
            models[case] = PygClassifier(10, full=case == "pyg-full")
    batch = load_batch(exp.cfg.train.batch_size, 512)
    steps = {}
    for case, model in models.items():
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=0.002, weight_decay=0.05)

        def step(model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> None:
            loss = nn.functional.cross_entropy(model(batch), batch["target"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        steps[case] = step
    for step in steps.values():  # warm-up
        step(), step()
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                steps[args.profile]()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        return
    times: dict[str, list[float]] = {case: [] for case in steps}
    cpu: dict[str, list[float]] = {case: [] for case in steps}  # process CPU time: steadier on a shared machine
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for case, step in steps.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            times[case].append(time.perf_counter() - t0)
            cpu[case].append(time.process_time() - c0)
    base, base_cpu = times.get("sciformer"), cpu.get("sciformer")
    print(f"ModelNet10 training step, batch {exp.cfg.train.batch_size} x 512 points, {args.threads} thread(s), "
          f"{args.rounds} rounds; torch {torch.__version__}; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| network | parameters | median s/step | median CPU s/step | vs sciformer (median of per-round ratios, wall / CPU) |")
    print("|---|---:|---:|---:|---:|")
    for case, t in times.items():
        if base is None or base_cpu is None or case == "sciformer":
            ratio = "1.00x"
        else:
            ratio = (f"{statistics.median(a / b for a, b in zip(t, base)):.2f}x / "
                     f"{statistics.median(a / b for a, b in zip(cpu[case], base_cpu)):.2f}x")
        params = sum(p.numel() for p in models[case].parameters())
        print(f"| {case} | {params:,} | {statistics.median(t):.4f} | {statistics.median(cpu[case]):.4f} | {ratio} |")


if __name__ == "__main__":
    main()
