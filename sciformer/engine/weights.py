"""Model weights from checkpoints: strict loading with one-line mismatch errors, and the
partial loading that starts a fine-tuning run (``train.init_from``, ``--init-from``).

Strict loading (``--resume``, ``evaluate``, ``predict``, :func:`sciformer.load`) refuses a
checkpoint whose tensors do not fit the model with one :class:`CheckpointError` line naming
the checkpoint, the first tensor that differs and why (class count, input channels, patch
size, model name or a model parameter)::

    checkpoint 'runs/x/last.pt': head.weight has shape (16, 64), the model wants (3, 64):
    the checkpoint was trained for 16 classes, this experiment has 3; ...

Partial loading (:func:`init_from_checkpoint`) takes every tensor whose name and shape
match and keeps the fresh initialisation of the others (the head when the class count
differs; any weight sized by the band count, of which the spectral models have none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sciformer.errors import CheckpointError, SciformerError
from sciformer.frontend import option

Shape = tuple[int, ...]
MAX_NAMES = 4  # tensor names listed in one line before "+N more"


@dataclass
class Context:
    """What a checkpoint was trained for against what the model is built for."""

    ckpt_model: str
    model: str
    classes: tuple[int, int]
    channels: tuple[int, int]
    channel_unit: str = "input channels"
    patch: tuple[Any, Any] = (None, None)
    categories: tuple[int, int] = (0, 0)
    params: list[tuple[str, Any, Any]] = field(default_factory=list)  # (model.key, checkpoint value, asked value); no dropout


def context(state: dict[str, Any], exp_dict: dict[str, Any], info: dict[str, Any]) -> Context:
    """The differences between checkpoint ``state`` and the experiment ``exp_dict`` / data ``info``."""
    src_cfg = (state.get("config") or {}).get("model") or {}
    dst_cfg = exp_dict.get("model") or {}
    src_info = state.get("data_info") or {}
    params = [(f"model.{k}", src_cfg.get(k), dst_cfg.get(k)) for k in sorted(set(src_cfg) | set(dst_cfg))
              if k != "name" and "drop" not in k and src_cfg.get(k) != dst_cfg.get(k)]  # dropout rates shape no tensor
    unit = "bands" if info.get("patch_size") is not None else "input channels"
    if info.get("features") is not None or src_info.get("features") is not None:
        unit = "feature channels"
    return Context(
        ckpt_model=str(src_cfg.get("name")), model=str(dst_cfg.get("name")),
        classes=(_int(src_info.get("num_classes")), _int(info.get("num_classes"))),
        channels=(_int(src_info.get("in_channels")), _int(info.get("in_channels"))), channel_unit=unit,
        patch=(src_info.get("patch_size"), info.get("patch_size")),
        categories=(len(src_info.get("category_names") or ()), len(info.get("category_names") or ())),
        params=params,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _differs_by(src: Shape | None, dst: Shape | None, a: int, b: int) -> bool:
    """Whether the shapes differ in one axis by exactly ``a - b`` (a size that counts ``a`` things)."""
    if src is None or dst is None or len(src) != len(dst) or a == b or a < 0 or b < 0:
        return False
    diff = [(s, d) for s, d in zip(src, dst) if s != d]
    return len(diff) == 1 and diff[0][0] - diff[0][1] == a - b


def reason(ctx: Context, src: Shape | None = None, dst: Shape | None = None) -> tuple[str, str]:
    """(long, short) explanation of a tensor that differs: e.g. ("the checkpoint was trained for 16
    classes, this experiment has 3", "16 -> 3 classes"). ``src``/``dst``: the two shapes, when both exist."""
    if ctx.ckpt_model != ctx.model:
        return (f"the checkpoint holds model '{ctx.ckpt_model}', this experiment builds '{ctx.model}'",
                f"model {ctx.ckpt_model} -> {ctx.model}")
    (c0, c1), (i0, i1), (p0, p1), (k0, k1) = ctx.classes, ctx.channels, ctx.patch, ctx.categories
    if _differs_by(src, dst, c0, c1) or (src is None and c0 != c1):
        return f"the checkpoint was trained for {c0} classes, this experiment has {c1}", f"{c0} -> {c1} classes"
    if _differs_by(src, dst, i0, i1):
        return (f"the checkpoint was trained on {i0} {ctx.channel_unit}, this data has {i1}", f"{i0} -> {i1} {ctx.channel_unit}")
    if _differs_by(src, dst, k0, k1):
        return f"the checkpoint knows {k0} shape categories, this data has {k1}", f"{k0} -> {k1} categories"
    if ctx.params:  # every differing setting (up to 3 named): one may not be the one that changed this tensor
        shown = ctx.params[:3]
        more = f" (+{len(ctx.params) - 3} more)" if len(ctx.params) > 3 else ""
        long = "; ".join(f"{key} is {_short(old)} in the checkpoint, {_short(new)} here" for key, old, new in shown) + more
        return long, ", ".join(f"{key} {_short(old)} -> {_short(new)}" for key, old, new in shown) + more
    if p0 != p1:
        return f"the checkpoint was trained on {p0}x{p0} patches, this data has {p1}x{p1}", f"patch {p0} -> {p1}"
    if i0 != i1:
        return (f"the checkpoint was trained on {i0} {ctx.channel_unit}, this data has {i1}", f"{i0} -> {i1} {ctx.channel_unit}")
    if c0 != c1:
        return f"the checkpoint was trained for {c0} classes, this experiment has {c1}", f"{c0} -> {c1} classes"
    shapes = f"{_shape(src)} -> {_shape(dst)}" if src is not None and dst is not None else "absent"
    return "its weights do not fit the model its own config describes (an altered or foreign file)", shapes


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _shape(shape: Shape | None) -> str:
    return "(" + ", ".join(str(s) for s in shape or ()) + (",)" if shape is not None and len(shape) == 1 else ")")


def _shapes(state: dict[str, Any]) -> dict[str, Shape | None]:
    return {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in state.items()}


def _kind_mismatch(name: str, theirs: torch.Tensor, ours: torch.Tensor, source: str) -> str | None:
    """One line when a checkpoint tensor holds another kind of number (integer weights for float
    parameters, ...), which ``load_state_dict`` would convert silently; None when the kinds agree."""
    def kind(t: torch.Tensor) -> str:
        return "bool" if t.dtype == torch.bool else "complex" if t.is_complex() else "float" if t.is_floating_point() else "int"

    if kind(theirs) == kind(ours):
        return None
    return (f"{source}: {name} holds {str(theirs.dtype).removeprefix('torch.')} values, the model wants "
            f"{str(ours.dtype).removeprefix('torch.')}; the file was not written by sciformer for this model (or was altered)")


def mismatch(own: dict[str, Any], src: dict[str, Any], ctx: Context, where: str) -> str | None:
    """One line on the first tensor of ``src`` (checkpoint) that does not fit ``own`` (the model), or None."""
    a, b = _shapes(src), _shapes(own)
    for name, want in b.items():
        if name not in a:
            more = sum(1 for n in b if n not in a) - 1
            return (f"checkpoint '{where}' lacks {name}{f' (and {more} more)' if more else ''}, which model '{ctx.model}' "
                    f"needs: {reason(ctx)[0]}")
        if a[name] is None:
            return (f"checkpoint '{where}': {name} is not a tensor ({type(src[name]).__name__}), the model wants shape {_shape(want)}: "
                    f"{reason(ctx)[0]}")
        if a[name] != want:
            return (f"checkpoint '{where}': {name} has shape {_shape(a[name])}, the model wants {_shape(want)}: "
                    f"{reason(ctx, a[name], want)[0]}")
        line = _kind_mismatch(name, src[name], own[name], f"checkpoint '{where}'")
        if line is not None:
            return line
    extra = [n for n in a if n not in b]
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        return f"checkpoint '{where}' holds {extra[0]}{more}, which model '{ctx.model}' lacks: {reason(ctx)[0]}"
    return None


def _hint(ctx: Context, where: str) -> str:
    if ctx.ckpt_model == ctx.model and not ctx.params and (ctx.classes[0] != ctx.classes[1] or ctx.channels[0] != ctx.channels[1]
                                                           or ctx.patch[0] != ctx.patch[1]):
        return f"; to fine-tune it on this data, train a new run with {option('--init-from', where)}"
    return ""


def load_strict(model: nn.Module, state: dict[str, Any], where: str | Path, exp_dict: dict[str, Any], info: dict[str, Any]) -> None:
    """Load ``state['model']`` into ``model``; any mismatch is one CheckpointError line saying what differs."""
    check_fits(model.state_dict(), state, where, exp_dict, info)
    try:
        model.load_state_dict(state["model"])
    except Exception as exc:  # noqa: BLE001 - shapes fit, yet torch refused (e.g. a non-tensor value)
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
        detail = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in loading") else lines[0]
        raise CheckpointError(f"checkpoint '{where}': its model weights do not load ({detail[:200]})") from None


def check_fits(own: dict[str, Any], state: dict[str, Any], where: str | Path, exp_dict: dict[str, Any], info: dict[str, Any]) -> None:
    """Raise a one-line CheckpointError when ``state['model']`` does not fit the model state ``own``."""
    ctx = context(state, exp_dict, info)
    line = mismatch(own, state["model"], ctx, str(where))
    if line is not None:
        raise CheckpointError(line + _hint(ctx, str(where)))


def check_data_fits(state: dict[str, Any], exp: Any, info: Any, where: str | Path, names_from: str = "this data") -> None:
    """Refuse a checkpoint whose model could not run on data described by ``info`` (a DataInfo),
    or whose classes this data names otherwise (:func:`~sciformer.data.predicting.check_class_names`).

    The model is built for ``info`` (on the meta device when the builder allows, without
    touching the random state) and its tensor shapes compared with the checkpoint's: a
    band-count-agnostic model accepts another band count, a model sized by its input
    channels or classes does not. ``names_from``: what lists this data's class names, in messages.
    """
    import dataclasses

    from sciformer.data.predicting import check_class_names
    from sciformer.engine import builders

    trained_wl = (state.get("data_info") or {}).get("wavelengths")  # a scene without centres runs at the checkpoint's
    shaped = info if info.wavelengths is not None or trained_wl is None else dataclasses.replace(info, wavelengths=trained_wl)
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                model = builders.build_model(exp, shaped)
        except SciformerError:
            raise
        except Exception:  # noqa: BLE001 - a builder that needs real tensors: build it on the CPU
            model = builders.build_model(exp, shaped)
    info_dict = dataclasses.asdict(info)
    check_fits(model.state_dict(), state, where, exp.to_dict(), info_dict)
    classes = (state.get("data_info") or {}).get("num_classes")
    if classes != info.num_classes:  # a model without a class-sized tensor still predicts the wrong classes
        raise CheckpointError(f"checkpoint '{where}' was trained for {classes} classes, this data has {info.num_classes}"
                              f"; to fine-tune it on this data, train a new run with {option('--init-from', where)}")
    names = (state.get("data_info") or {}).get("class_names")
    if names is not None:  # the model's class k is the checkpoint's k-th class, whatever this data calls it
        check_class_names(names, info.class_names, names_from)


# ------------------------------------------------------------------------ --init-from

def model_family(name: str) -> str | None:
    """The package of a registered model's builder (``sciformer.spectral``, ``sciformer.pointcloud``), or None."""
    from sciformer.registry import MODELS

    try:
        module = MODELS.get(name).builder.__module__
    except SciformerError:
        return None
    return module.rsplit(".", 1)[0]


def display_path(path: Path) -> str:
    """``path`` relative to the working folder when it lies below it, else as is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _list(names: list[Any]) -> str:
    shown = ", ".join(str(n) for n in names[:MAX_NAMES])  # an altered file may hold non-string keys
    return shown + (f" (+{len(names) - MAX_NAMES} more)" if len(names) > MAX_NAMES else "")


def init_from_checkpoint(model: nn.Module, path: str | Path, exp_dict: dict[str, Any], info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Load every tensor of checkpoint ``path`` whose name and shape match ``model``'s; the others keep
    their fresh initialisation. Returns the one line to print and a record for the run's env.json.

    A checkpoint of another model family, or one of which no tensor matches, is a one-line
    CheckpointError. Optimizer, schedule and epoch are not taken (that is ``--resume``).
    """
    from sciformer.data.hsi.bandmatch import band_placement
    from sciformer.engine.checkpoint import checkpoint_file, load_checkpoint_and_digest

    file = checkpoint_file(path, in_run="best.pt")
    shown = display_path(file)
    state, sha256 = load_checkpoint_and_digest(file)  # the digest of the bytes loaded
    ctx = context(state, exp_dict, info)
    src_family, dst_family = model_family(ctx.ckpt_model), model_family(ctx.model)
    if src_family is not None and dst_family is not None and src_family != dst_family:
        raise CheckpointError(f"{option('--init-from', shown, quoted=True)} holds model '{ctx.ckpt_model}' ({src_family}), this experiment builds "
                              f"'{ctx.model}' ({dst_family}); {option('--init-from')} takes a checkpoint of the same model family")
    own, src = model.state_dict(), state["model"]
    loaded, redone = [], {}
    for name, tensor in own.items():
        value = src.get(name)
        if isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(tensor.shape):
            odd = _kind_mismatch(name, value, tensor, option("--init-from", shown, quoted=True))
            if odd is not None:
                raise CheckpointError(odd)
            loaded.append(name)
            continue
        why = "not in the checkpoint" if not isinstance(value, torch.Tensor) else \
            f"shape differs: {reason(ctx, tuple(value.shape), tuple(tensor.shape))[1]}"
        redone.setdefault(why, []).append(name)
    if not loaded:
        raise CheckpointError(f"{option('--init-from', shown, quoted=True)}: none of its {len(src)} tensors (model '{ctx.ckpt_model}') matches model "
                              f"'{ctx.model}' by name and shape; {option('--init-from')} takes a checkpoint of the same model family")
    model.load_state_dict({**own, **{n: src[n] for n in loaded}})
    unused = [n for n in src if n not in own]
    line = f"init-from {shown}: loaded {len(loaded)} of {len(own)} tensors"
    if redone:
        line += "; re-initialised " + "; ".join(f"{_list(names)} ({why})" for why, names in redone.items())
    if unused:
        line += f"; ignored {len(unused)} checkpoint tensors the model lacks ({_list(unused)})"
    record = {"checkpoint": str(file.resolve()), "sha256": sha256, "model": ctx.ckpt_model, "epoch": state.get("epoch"),
              "loaded": len(loaded), "tensors": len(own), "reinitialised": [n for names in redone.values() for n in names]}
    placement = band_placement(state.get("data_state"), ((state.get("config") or {}).get("model") or {}).get("position_source"))
    if placement is not None:  # hyperspectral: how the checkpoint's model placed bands
        record["band_placement"] = placement
    if isinstance(state.get("pretrain"), dict):  # written by `sciformer pretrain`: how the encoder was pre-trained
        record["pretrain"] = {k: v for k, v in state["pretrain"].items() if k not in ("history", "env")}
    return line, record


def resolve_init_from(value: str | os.PathLike[str], base_dir: Path) -> Path:
    """``train.init_from`` as a path: relative values are relative to the config's folder."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else base_dir / path
