"""Models from checkpoints: the experiment a checkpoint holds, its model with weights, and
the ``batch -> logits`` function that evaluation, export and ``sciformer predict`` share.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sciformer import config
from sciformer.config import Experiment
from sciformer.contracts import PredictFn, masked_logits
from sciformer.engine import builders
from sciformer.engine.checkpoint import checkpoint_file, load_checkpoint
from sciformer.engine.loops import autocast, to_device
from sciformer.engine.runtime import apply_threads, pick_device
from sciformer.engine.weights import load_strict, model_family
from sciformer.errors import CheckpointError, SciformerError
from sciformer.frontend import init_from_command, option
from sciformer.utils.limits import FOLDER, MISSING, REGULAR_FILE, path_kind

RESUME_KEYS = ("optimizer", "scheduler", "epoch", "global_step", "best")


def checkpoint_experiment(state: dict[str, Any], ckpt_path: Path, overrides: list[str]) -> Experiment:
    """The experiment stored in a checkpoint, validated; errors name the checkpoint."""
    from sciformer.engine.runfolder import checkpoint_int

    if not isinstance(state.get("config_dir"), str):
        raise CheckpointError(f"checkpoint '{ckpt_path}' lacks 'config_dir' (the folder its config paths are relative to)")
    for key in ("epoch", "global_step"):  # reported in evaluations' metrics.json: a tampered value is refused, not reported
        checkpoint_int(state, key, str(ckpt_path), 0)
    stored = ((state.get("config") or {}).get("model") or {}).get("name")
    asked = next((o.split("=", 1)[1].strip().strip("'\"") for o in reversed(overrides) if o.split("=", 1)[0].strip() == "model.name"), stored)
    if asked != stored:  # before its parameters are judged against the other model's keys
        hint = f" (to start a '{asked}' run from the weights they share, train with {option('--init-from')})" if model_family(str(stored)) == model_family(asked) else ""
        raise CheckpointError(f"checkpoint '{ckpt_path}' holds model '{stored}', model.name={asked} asks for another model{hint}")
    return config.from_dict(state["config"], Path(state["config_dir"]), overrides, source=f"checkpoint '{ckpt_path}' config")


def trained_feature_overrides(state: dict[str, Any], overrides: list[str]) -> list[str]:
    """``data.features=[...]`` as the checkpoint's model was trained, unless the user set it.

    Datasets that pick features from the files (e.g. colour when every tile has RGB) would
    otherwise pick them again from new files and feed the model channels it never saw.
    """
    from sciformer.registry import DATASETS

    features = (state.get("data_state") or {}).get("features")
    name = ((state.get("config") or {}).get("data") or {}).get("name")
    if not isinstance(features, list) or not isinstance(name, str) or name not in DATASETS:
        return []
    fields = getattr(DATASETS.get(name).config, "model_fields", {})
    if "features" not in fields or any(o.split("=", 1)[0].strip() == "data.features" for o in overrides):
        return []
    return [f"data.features={json.dumps([str(f) for f in features])}"]


def load_for_inference(ckpt_path: Path, overrides: list[str], device_name: str | None = None) -> tuple[Experiment, dict[str, Any], nn.Module, torch.device]:
    """Experiment, checkpoint state, model (eval mode, on its device) and device of a checkpoint or run folder.

    A run folder means its ``checkpoints/best.pt``; every mismatch is a one-line CheckpointError.
    """
    state = load_checkpoint(ckpt_path, in_run="best.pt")  # a run folder: the model its metrics.json reports
    if state.get("pretrain") is not None:
        raise CheckpointError(f"checkpoint '{ckpt_path}' holds pre-trained weights without a classifier; fine-tune them first: "
                              f"{init_from_command(ckpt_path)}")
    exp = checkpoint_experiment(state, ckpt_path, list(overrides) + trained_feature_overrides(state, overrides))
    apply_threads(exp.cfg.train.threads)  # as in training: train.threads, null the measured best
    device = pick_device(device_name or exp.cfg.train.device)
    try:
        info = builders.data_info_from_dict(state["data_info"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint '{ckpt_path}': data_info is incomplete or malformed ({type(exc).__name__}: {exc}); "
                              "expected num_classes, class_names and in_channels") from None
    model = builders.build_model(exp, info)
    load_strict(model, state, checkpoint_file(ckpt_path, "best.pt"), exp.to_dict(), state["data_info"])  # one line naming what differs
    return exp, state, model.to(device).eval(), device


def predictor_state(state: dict[str, Any], exp: Experiment) -> dict[str, Any]:
    """A checkpoint's data state with the model's ``position_source`` (band index or wavelength)
    and its data config as trained (``data_config``: what an override changed), as the dataset's
    predictor and :meth:`TaskData.match_checkpoint` take it."""
    out = dict(state.get("data_state") or {})
    out["data_config"] = dict((state.get("config") or {}).get("data") or {})
    source = getattr(exp.model_params, "position_source", None)
    if source is not None:
        out["position_source"] = str(source)
    return out


def predict_fn(model: nn.Module, device: torch.device, amp: str) -> PredictFn:
    """``batch -> logits`` (float32, on ``device``) with the model in eval mode, no grad; classes
    the batch rules out (:func:`~sciformer.contracts.masked_logits`) at -inf."""

    @torch.no_grad()
    def predict(batch: dict[str, Any]) -> torch.Tensor:
        model.eval()
        batch = to_device(batch, device)
        with autocast(device, amp):
            logits = model(batch).float()
        return masked_logits(logits, batch)

    return predict




# ------------------------------------------------------------------------- prediction files

# Inputs a folder given to ``predict --input`` contributes (point clouds and hyperspectral cubes).
INPUT_SUFFIXES = (".ply", ".pcd", ".xyz", ".txt", ".pts", ".csv", ".npy", ".npz", ".off", ".las", ".laz", ".bin",
                  ".mat", ".hdr", ".lan", ".tif", ".tiff")
# ENVI outputs: a header and a data file, whatever the case of the suffix given.
_ENVI_OUTPUT = (".hdr", ".img")
# Where an ENVI header's data file may lie (the names readers try) and a data file's header.
_ENVI_DATA = ("", ".img", ".dat", ".raw", ".sli", ".hyspex", ".bsq", ".bil", ".bip")


def input_parts(path: Path) -> list[Path]:
    """The files an input may consist of: itself and, for ENVI, every existing header / data
    file beside it that a reader could pair with it (``a.hdr`` + ``a``, ``a.img``, ``a.dat``,
    ... in either case; ``a.img.hdr`` + ``a.img``). Predictions never write over any of them."""
    out = [path]
    if path.suffix.lower() == ".hdr":
        stems = [path.with_suffix(""), Path(str(path)[: -len(path.suffix)])]
        names = [Path(str(stem) + ext) for stem in stems for e in _ENVI_DATA for ext in {e, e.upper()}]
    else:
        names = [Path(str(path) + ".hdr"), path.with_suffix(".hdr"), path.with_suffix(".HDR")]
    out += [p for p in dict.fromkeys(names) if p != path and p.is_file()]
    return out


def input_sidecars(path: Path) -> list[Path]:
    """Every name, existing or not, that a reader of ``path`` would pair with it: for a data
    file its ENVI header (``a.img.hdr``, ``a.hdr``), for a header its data file (``a``,
    ``a.img``, ...). A prediction written under one of them (in any case) would be read with
    the input afterwards, so it is refused even when no such file exists yet."""
    if path.suffix.lower() == ".hdr":
        stems = [path.with_suffix(""), Path(str(path)[: -len(path.suffix)])]
        return [Path(str(stem) + ext) for stem in stems for ext in _ENVI_DATA]
    if path.suffix.lower() in INPUT_SUFFIXES:  # read by its suffix's own reader, which pairs no header with it
        return []
    return [Path(str(path) + ".hdr"), path.with_suffix(".hdr")]


def input_problem(path: Path, *, folders: bool) -> str | None:
    """Why ``path`` is no input, as the end of a message ("does not exist", "is not a regular
    file or folder (a FIFO)", "cannot be read (Permission denied)", "is a folder"); None for a
    readable regular file, or folder where ``folders``. The one check of ``predict --input``,
    of each entry of a folder or glob it names, and of the Python API's ``predict(path)``."""
    kind = path_kind(path)
    if kind == REGULAR_FILE or (folders and kind == FOLDER):
        return None if os.access(path, os.R_OK) else f"cannot be read ({os.strerror(errno.EACCES)})"
    if kind == MISSING:
        return "does not exist"
    if kind == FOLDER:
        return "is a folder"
    return f"is not a regular file{' or folder' if folders else ''} ({kind})"


def _listed_inputs(spec: str, entries: list[Path]) -> list[Path]:
    """The inputs among the entries of a folder or glob ``spec``: its regular files. An entry
    named as an input (an :data:`INPUT_SUFFIXES` suffix) or a regular file that cannot be read
    (a link to a missing tile, a FIFO, a device, a folder ``x.ply``, no permission) stops the
    command, naming it, before anything is written: it is never left out of the predictions
    unsaid. Other entries (sub-folders, ...) are no inputs."""
    found = []
    for entry in entries:
        if path_kind(entry) != REGULAR_FILE and entry.suffix.lower() not in INPUT_SUFFIXES:
            continue
        problem = input_problem(entry, folders=False)
        if problem is not None:
            raise SciformerError(f"--input '{spec}': '{entry}' {problem}; predict stops rather than leave it out "
                                 "(move it away, or name the files to predict)")
        found.append(entry)
    return found


def expand_inputs(specs: list[str]) -> list[Path]:
    """Files of ``--input`` values: files, folders (their point/cube files, see
    :func:`_listed_inputs`) or quoted globs."""
    import glob

    out: list[Path] = []
    for spec in specs:
        path = Path(spec).expanduser()
        problem = input_problem(path, folders=True)
        if problem is None and path.is_dir():
            found = _listed_inputs(spec, sorted(p for p in path.iterdir() if not p.name.startswith(".")
                                                and p.suffix.lower() in INPUT_SUFFIXES))
            if not found:
                raise SciformerError(f"--input '{spec}': the folder holds no input file ({', '.join(INPUT_SUFFIXES)})")
        elif problem is None:
            found = [path]
        elif glob.has_magic(spec) and not os.path.lexists(path):
            found = _listed_inputs(spec, sorted(Path(p) for p in glob.glob(str(path))))
            if not found:
                raise SciformerError(f"--input '{spec}' matches no file")
        else:  # missing, a FIFO, a device, a socket, a broken or looping link, no permission
            raise SciformerError(f"--input '{spec}' {problem}")
        out.extend(found)
    seen: set[Path] = set()
    unique = []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def plan_outputs(inputs: list[Path], output: Path, suffixes: tuple[str, ...], *, fmt: str | None = None,
                 overwrite: bool = False, many: bool = False,
                 beside: Callable[[Path], list[Path]] | None = None,
                 paired: Callable[[Path], list[Path]] | None = None,
                 labelled_by: Callable[[Path], Path | None] | None = None,
                 read_too: list[Path] = ()) -> list[tuple[Path, Path]]:
    """(input, output) pairs, checked before anything is loaded.

    One input and an ``output`` with a suffix: that file. Several inputs (or ``many``, a
    folder or glob given): ``output`` is a folder and each input ``a.ext`` becomes
    ``output/a<suffix>`` (``fmt``, else the input's suffix when it is an output format,
    else the first of ``suffixes``). Refused, each as a one-line error: an unknown
    suffix, a missing parent folder, an output that exists (unless ``overwrite``) and an
    output that is one of the inputs (always: every part of an ENVI pair, :func:`input_parts`,
    and the other files the command reads, ``read_too``: ``--labels``, ``--wavelengths``),
    an output a reader would pair with an input later (:func:`input_sidecars`, any case; and
    ``paired(input)``: e.g. the label file ``data.label_files`` names beside a point file; and
    ``labelled_by(output)``: the existing file, input or not, whose label file the output would be),
    an output that exists as a dangling link (unless ``overwrite``). ``beside(output)`` names the files a
    predictor writes next to an output (e.g. ``--probabilities`` rasters); they are
    checked like the output, and no file may be written twice.
    """
    folder = many or len(inputs) > 1
    if not folder and output.is_dir():
        raise SciformerError(f"--output '{output}' is a directory; expected a file path (its suffix picks the format), "
                             "or end it with '/' to write into the folder")
    if fmt is not None:
        fmt = fmt if fmt.startswith(".") else f".{fmt}"
        if fmt.lower() not in suffixes:
            raise SciformerError(f"--format '{fmt}': use one of {', '.join(suffixes)}")
    pairs: list[tuple[Path, Path]] = []
    if folder:
        if output.exists() and not output.is_dir():
            raise SciformerError(f"--output '{output}' is a file, but {len(inputs)} inputs need a folder")
        if not output.is_dir() and output.suffix.lower() in suffixes:
            raise SciformerError(f"--output '{output}': several inputs need an output folder; use --format to pick the format")
        for p in inputs:
            suffix = (fmt or (p.suffix.lower() if p.suffix.lower() in suffixes else suffixes[0])).lower()
            pairs.append((p, output / f"{p.stem}{suffix}"))
        names = [o.name for _, o in pairs]
        clash = next((n for n in names if names.count(n) > 1), None)
        if clash:
            raise SciformerError(f"--output '{output}': two inputs would both write {clash}; predict them separately")
    else:
        if fmt is not None and output.suffix.lower() != fmt.lower():
            raise SciformerError(f"--format '{fmt}' disagrees with --output '{output}'")
        if output.suffix.lower() not in suffixes:
            raise SciformerError(f"--output '{output}': unsupported output suffix '{output.suffix}'; use one of {', '.join(suffixes)}")
        if not output.parent.is_dir():
            raise SciformerError(f"--output '{output}': folder '{output.parent}' does not exist")
        pairs.append((inputs[0], output))
    for inp, out in pairs:
        if out.suffix.lower() in (".las", ".laz") and inp.suffix.lower() not in (".las", ".laz"):
            raise SciformerError(f"--output '{out}': LAS/LAZ output copies a LAS/LAZ input, but '{inp.name}' is not one; "
                                 "use .ply, .npz or .npy")
    taken = {part.resolve() for p in [*inputs, *read_too] for part in input_parts(p)}
    inodes = {(st.st_dev, st.st_ino) for st in (p.stat() for p in taken if p.exists())}  # hard links, other spellings
    sidecars = {str(c.resolve()).casefold(): p for p in [*inputs, *read_too]
                for c in [*input_sidecars(p), *(paired(p) if paired is not None and p in inputs else [])]}
    planned: dict[Path, Path] = {}
    for _, out in pairs:
        written = [out] if out.suffix.lower() not in _ENVI_OUTPUT else [out.with_suffix(".hdr"), out.with_suffix(".img")]  # ENVI: lower case
        written += beside(out) if beside is not None else []
        for w in written:
            name = f"--output '{w}'" if w == out else f"--output '{out}': '{w}'"  # what was given, then the file it writes
            first = planned.setdefault(w.resolve(), out)
            if first != out:
                raise SciformerError(f"{name} would be written for two inputs (as '{first.name}' and beside "
                                     f"'{out.name}'); predict them separately")
            if w.resolve() in taken or (w.exists() and (w.stat().st_dev, w.stat().st_ino) in inodes):
                raise SciformerError(f"{name} is an input file; predictions never replace their input")
            if str(w.resolve()).casefold() in sidecars:
                raise SciformerError(f"{name} would be read with input '{sidecars[str(w.resolve()).casefold()]}' "
                                     "(its ENVI header or data file, or its label file); choose another output name")
            owner = labelled_by(w) if labelled_by is not None else None
            if owner is not None:
                raise SciformerError(f"--output '{w}' is the label file data.label_files pairs with '{owner}' (read as its "
                                     "truth by train and evaluate); choose another output name")
            if w.is_dir():  # --overwrite would not help
                raise SciformerError(f"{name} is a directory")
            if os.path.lexists(w) and not overwrite:  # a dangling link too: writing would follow it
                raise SciformerError(f"{name} exists; pass --overwrite to replace it")
            _check_name_length(w)
    return pairs


def _check_name_length(path: Path) -> None:
    """Refuse, before any model runs, a file name the folder cannot hold with the temporary name
    it is written under (``.<name>.<8 characters>.tmp<suffix>``, :mod:`sciformer.utils.atomic`)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        name_max = int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        name_max = 255
    limit = name_max - 14 - len(os.fsencode(path.suffix))
    size = len(os.fsencode(path.name))
    if size > limit:
        raise SciformerError(f"--output '{path.name[:40]}...' in '{path.parent}': the file name is {size} bytes; "
                             f"this folder takes names of at most {name_max}, so at most {limit} here (it is written under "
                             "a temporary name 14 bytes longer); choose a shorter output name")


def prediction_suffixes(predictor: Any) -> tuple[str, ...]:
    """Output suffixes ``predictor`` writes (its ``suffixes``), or those of every dataset for None."""
    from sciformer.registry import DATASETS

    if predictor is not None:
        return tuple(getattr(predictor, "suffixes", ())) or (".npy",)
    out: list[str] = []
    for entry in DATASETS.entries():
        for suffix in getattr(entry.predictor, "suffixes", ()):
            if suffix not in out:
                out.append(suffix)
    return tuple(out)


def check_split_not_empty(task: Any, split: str) -> None:
    """A one-line error when the split to evaluate holds nothing (e.g. ``data.test_files: []``),
    naming the splits that do hold something."""
    if len(task.dataset(split)) == 0:
        others = [s for s in ("test", "val") if s != split and len(task.dataset(s)) > 0]
        hint = (f"evaluate another split: evaluation.split={others[0]} (--split {others[0]})" if others
                else "no validation or test data either: a run ends with an evaluation, so keep a test file")
        raise SciformerError(f"evaluation.split={split}: the {split} split is empty (e.g. data.{split}_files: [] "
                             f"or data.test_area: null); {hint}")
