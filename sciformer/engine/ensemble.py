"""Ensembles: several trained runs of one experiment, their class probabilities averaged.

``sciformer evaluate --checkpoint A --checkpoint B ...`` and ``sciformer predict
--checkpoint A --checkpoint B ...`` load every member with :func:`load_models`; the members
must share the data (the ``data`` section, the fitted preprocessing in ``data_state`` and
the classes) and place bands alike (``model.position_source``), so the test pixels or
points of one are the test data of all and one band plan serves all. Members may differ
in anything else: the seed of the weights, the model (v1 and v3 point backbones), the
epochs. Where the data draws a split from a seed (``data.split.seed``, or ``train.seed``
where that is null), the members must have drawn it with the same seed: otherwise the
test data of one may be the training data of another. A checkpoint given twice is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sciformer.config import Experiment
from sciformer.engine.checkpoint import checkpoint_file
from sciformer.errors import CheckpointError, DataError


class Ensemble(nn.Module):
    """The mean of the members' softmax probabilities, returned as its logarithm (a logit: the
    arg-max, the softmax and the cross-entropy are those of the averaged probabilities).

    Shapes:
        batch (as each member takes it) -> (n, C) log mean probability (-inf where every member gives 0)
    """

    def __init__(self, members: Sequence[nn.Module], epochs: Sequence[Any] = (), names: Sequence[str] = ()) -> None:
        super().__init__()
        if len(members) < 2:
            raise CheckpointError(f"an ensemble needs at least 2 members, got {len(members)}")
        self.members = nn.ModuleList(members)
        self.epochs = list(epochs)  # each member's checkpoint epoch, for metrics.json
        self.names = list(names) or [f"member {i + 1}" for i in range(len(members))]  # for errors: the checkpoints

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        probs = torch.stack([torch.softmax(m(batch).float(), dim=-1) for m in self.members])  # (M, n, C)
        finite = torch.isfinite(probs).all(dim=-1)  # (M, n)
        split = ~finite.all(dim=0) & finite.any(dim=0)  # (n,) samples some members score and others do not
        if bool(split.any()):  # a diverged member, not the data (that stays the caller's error, which names the sample)
            bad = [name for name, ok in zip(self.names, finite[:, split].all(dim=1).tolist()) if not ok]
            raise DataError(f"ensemble: {', '.join(repr(b) for b in bad)} gives non-finite scores for {int(split.sum())} "
                            "sample(s) of a batch that the other members score; has that run diverged (see its validation "
                            "loss)? evaluate it alone, or leave it out of the ensemble")
        return probs.mean(dim=0).log()  # (n, C)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    keys = sorted(set(a) | set(b), key=str)
    return next((str(k) for k in keys if not _same(a.get(k), b.get(k))), None)


def _resolved_data(state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``data`` section with a null ``split.seed`` replaced by the run's ``train.seed``
    (the seed that drew its split)."""
    cfg = state.get("config") or {}
    data = dict(cfg.get("data") or {})
    split = data.get("split")
    if isinstance(split, dict) and "seed" in split and split["seed"] is None:
        data["split"] = {**split, "seed": (cfg.get("train") or {}).get("seed")}
    return data


_RECORDED_LATER = ("trained_classes", "shape_frame")  # data_state records that older checkpoints of the same data lack


def _with_later_records(data_state: dict[str, Any], states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The first member's data state with the :data:`_RECORDED_LATER` records another member holds
    (members share the data: the ensemble masks the classes no member trained, whatever their order)."""
    out = dict(data_state)
    for key in _RECORDED_LATER:
        found = next((s["data_state"][key] for s in states if key in (s.get("data_state") or {})), None)
        if key not in out and found is not None:
            out[key] = found
    return out


def check_members(paths: Sequence[Path], states: Sequence[dict[str, Any]]) -> None:
    """One-line CheckpointError unless every member shares the first one's data."""
    first, where = states[0], checkpoint_file(paths[0], "best.pt")
    files = [checkpoint_file(p, "best.pt").resolve() for p in paths]
    twice = next((f for i, f in enumerate(files) if f in files[:i]), None)
    if twice is not None:
        raise CheckpointError(f"ensemble: checkpoint '{twice}' is given twice; each member counts once")
    data0 = _resolved_data(first)
    place0 = ((first.get("config") or {}).get("model") or {}).get("position_source")
    for path, state in zip(paths[1:], states[1:]):
        other = checkpoint_file(path, "best.pt")
        data = _resolved_data(state)
        if data0.get("name") != data.get("name"):
            raise CheckpointError(f"ensemble: '{other}' was trained on data '{data.get('name')}', '{where}' on '{data0.get('name')}'; "
                                  "members must share the data")
        place = ((state.get("config") or {}).get("model") or {}).get("position_source")
        if place != place0:  # the band plan of a new cube is made once, for the first member
            raise CheckpointError(f"ensemble: '{other}' places bands by model.position_source={place}, '{where}' by {place0}; "
                                  "members must place bands alike")
        key = _first_difference(data0, data)
        if key == "split" and _first_difference(data0["split"], data["split"]) == "seed":
            raise CheckpointError(f"ensemble: '{other}' drew its split with seed {data['split']['seed']}, '{where}' with seed "
                                  f"{data0['split']['seed']} (data.split.seed, or train.seed where that is null); members must share the split")
        if key is not None:
            raise CheckpointError(f"ensemble: '{other}' was trained with another data.{key} than '{where}'; members must share the data")
        for part in ("data_state", "data_info"):
            a, b = dict(first.get(part) or {}), dict(state.get(part) or {})
            for later in _RECORDED_LATER:  # a checkpoint from before the record: not another split
                if (later in a) != (later in b):
                    a.pop(later, None), b.pop(later, None)
            key = _first_difference(a, b)
            if key is not None:
                raise CheckpointError(f"ensemble: '{other}' and '{where}' differ in {part}.{key} (another split or preprocessing); "
                                      "members must share the data")


def load_models(paths: Sequence[str | Path], overrides: list[str], device_name: str | None = None) -> tuple[Experiment, dict[str, Any], nn.Module, torch.device]:
    """As :func:`~sciformer.engine.inference.load_for_inference` for one checkpoint; for several,
    the first one's experiment and state with an :class:`Ensemble` of all, checked by :func:`check_members`."""
    from sciformer.engine.inference import load_for_inference

    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("no checkpoint given; name a run folder or checkpoint file (several make an ensemble)")
    loaded = [load_for_inference(p, overrides, device_name) for p in paths]
    if len(loaded) == 1:
        return loaded[0]
    check_members(paths, [state for _, state, _, _ in loaded])
    exp, state, _, device = loaded[0]
    state = {**state, "data_state": _with_later_records(state.get("data_state") or {}, [s for _, s, _, _ in loaded])}
    members = Ensemble([model for _, _, model, _ in loaded], [st.get("epoch") for _, st, _, _ in loaded], [str(p) for p in paths])
    return exp, state, members.to(device).eval(), device
