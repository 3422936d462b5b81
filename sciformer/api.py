"""The Python API: ``sciformer.load`` a trained run and predict arrays or files, ``sciformer.train`` a config.

Both go through the code the command line runs: :func:`load` builds the model as
``sciformer predict`` does and :meth:`Predictor.predict` hands every input to the
dataset's own file predictor (arrays are first written to a temporary ``.npz`` / ``.npy``
file), so the preprocessing (normalisation, grid sampling, chunking, test-time views) is
the trained run's, exactly; :func:`train` is ``sciformer train``.

Example::

    import sciformer

    result = sciformer.train("experiments/indian_pines_demo.yaml", ["train.epochs=2"], output_dir="runs/demo")
    model = sciformer.load(result.run_dir)
    pred = model.predict(cube)                    # (H, W, B) -> labels (H, W) 0-based, label_ids (H, W) as the map, probabilities (H, W, C)
    pred = model.predict("tile.laz", rotations=4)  # a file, with the options of ``sciformer predict``
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.api_arrays import as_numpy as _numpy
from sciformer.api_arrays import write_points
from sciformer.errors import ConfigError, DataError, SciformerError
from sciformer.frontend import check_paths, printed_as, python_api

PathLike = str | os.PathLike[str]


@dataclass
class Prediction:
    """What :meth:`Predictor.predict` returns.

    Attributes:
        labels: 0-based class indices (into ``class_names`` and the last axis of ``probabilities``):
            (n,) per point (-1 where a point could not be classified, e.g. NaN coordinates),
            (H, W) per pixel (-1 on no-data pixels: NaN/Inf in a band, or the file's no-data
            value in every band), or a 0-d array for a whole shape.
        probabilities: class probabilities: (n, C), (H, W, C) or (C,), float32 (NaN on no-data pixels).
        class_names: the C class names, in class-index order.
        valid: (n,) bool for points (False where not classified); None otherwise.
        label_ids: what ``sciformer predict`` writes to a ``.npy`` for the input: a cube's map in the training map's label
            ids (index + 1: id 10 is ``labels`` 9; 0 where not classified); a point file's ``pred`` (the index, -1: no data).
    """

    labels: np.ndarray
    probabilities: np.ndarray
    class_names: list[str]
    valid: np.ndarray | None = None
    label_ids: np.ndarray | None = None  # always set by Predictor.predict

    @property
    def label_names(self) -> np.ndarray:
        """``labels`` as class names ('' where not classified)."""
        names = np.asarray([*self.class_names, ""], dtype=object)
        return names[np.where(self.labels >= 0, self.labels, len(self.class_names))]


@dataclass
class TrainResult:
    """What :func:`train` returns: the run folder, its test metrics and per-epoch history."""

    run_dir: Path
    metrics: dict[str, Any]
    best_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)


class Predictor:
    """A trained model with its data state, ready to predict arrays or files (see :func:`load`)."""

    def __init__(self, run_or_checkpoint: PathLike | Sequence[PathLike], device: str | None = None, overrides: Sequence[str] = ()) -> None:
        from sciformer.data.predicting import check_class_names
        from sciformer.engine.ensemble import load_models
        from sciformer.engine.inference import predict_fn, predictor_state
        from sciformer.registry import DATASETS

        single = isinstance(run_or_checkpoint, (str, os.PathLike))
        sources = [run_or_checkpoint] if single else list(run_or_checkpoint) if isinstance(run_or_checkpoint, Sequence) else [None]
        if not all(isinstance(s, (str, os.PathLike)) for s in sources):  # (none at all: load_models says so)
            raise SciformerError(f"load: expected a run folder, a checkpoint file or a list of them, got {run_or_checkpoint!r:.80}")
        self.source = Path(sources[0]) if len(sources) == 1 else [Path(s) for s in sources]
        with python_api(), _process_state_kept():  # loading sets train.threads; predict sets it again, for the call only
            self.experiment, state, self.model, self.device = load_models(sources, _override_list(overrides), device)
        self.data_state: dict[str, Any] = predictor_state(state, self.experiment)  # + the model's position_source
        self.data_info: dict[str, Any] = dict(state.get("data_info") or {})
        names = [str(n) for n in self.data_info.get("class_names", [])]
        given = getattr(self.experiment.data_params, "class_names", None)  # hyperspectral: names for a checkpoint's unnamed classes
        if given is not None:  # refused as predict refuses them: the model's class k is the checkpoint's k-th class
            check_class_names(names, given, "data.class_names")
        self._class_names = names if given is None else [str(n) for n in given]
        self.members = len(sources)  # 1, or the checkpoints of an ensemble
        self.epoch = state.get("epoch") if self.members == 1 else list(self.model.epochs)  # an ensemble: each member's
        name = self.experiment.cfg.data.name
        self.entry = DATASETS.get(name, key="data.name")
        if self.entry.predictor is None:
            raise SciformerError(f"dataset '{name}' has no file predictor")
        self._predict = predict_fn(self.model, self.device, self.experiment.cfg.train.amp)
        self.batch_size = int(self.experiment.cfg.evaluation.batch_size)

    # ------------------------------------------------------------------ facts
    @property
    def class_names(self) -> list[str]:
        return list(self._class_names)

    @property
    def kind(self) -> str:
        """``hsi`` (a cube -> a map), ``shape`` (a cloud -> one class) or ``points`` (a cloud -> a class per point)."""
        if self.data_info.get("patch_size") is not None:
            return "hsi"
        suffixes = getattr(self.entry.predictor, "suffixes", ())
        return "shape" if ".json" in suffixes else "points"

    @property
    def features(self) -> list[str]:
        """Per-point features the model was trained with, in channel order (point models)."""
        return [str(f) for f in self.data_state.get("features", [])]

    def __repr__(self) -> str:
        members = f", members={self.members}" if self.members > 1 else ""
        return (f"Predictor(model={self.experiment.cfg.model.name!r}{members}, data={self.entry.name!r}, kind={self.kind!r}, "
                f"classes={len(self.class_names)}, device={str(self.device)!r})")

    # ------------------------------------------------------------------ predict
    def predict(
        self,
        data: Any,
        *,
        features: Mapping[str, Any] | Any = None,
        wavelengths: Sequence[float] | None = None,
        batch_size: int | None = None,
        **options: Any,
    ) -> Prediction:
        """Predict a file path, a point array (n, 3) or a hyperspectral cube (H, W, B).

        ``features``: per-point inputs of a point array, as a dict (``colour`` (n, 3) in
        [0, 1] or 0..255, ``normal`` (n, 3), ``intensity`` (n,)) or one (n, c) array in the
        order of :attr:`features`. ``wavelengths`` (B,): the cube's band centres in nm
        (as ``--wavelengths``): a model that places bands by wavelength then takes a cube of
        any band set; see :mod:`sciformer.data.hsi.bandmatch` for the rules. ``options``:
        those of ``sciformer predict`` (:class:`sciformer.contracts.PredictOptions`:
        ``overlap``, ``rotations``, ``flip``, ``votes``, ``category``, ``columns``,
        ``labels``, ``allow_band_mismatch``, ``match_frame``). It runs on the trained run's ``train.threads``
        and gives the caller's torch thread count and random generator states back after.
        """
        import torch

        from sciformer.contracts import PredictOptions
        from sciformer.engine.inference import input_problem
        from sciformer.engine.runtime import apply_threads

        unknown = sorted(set(options) - set(PredictOptions.FLAGS) - {"probabilities"})
        if unknown:
            raise SciformerError(f"predict: unknown option(s) {', '.join(unknown)}; expected {', '.join(PredictOptions.FLAGS)}")
        options.pop("probabilities", None)
        from sciformer.config import check_batch_size

        batch_size = self.batch_size if batch_size is None else check_batch_size(batch_size, "predict: batch_size")
        with python_api(), tempfile.TemporaryDirectory(prefix="sciformer-predict-") as tmp:  # messages name keywords, not flags
            tmp_dir = Path(tmp)
            if isinstance(data, (str, os.PathLike)):
                if features is not None:
                    raise SciformerError("predict: features= goes with a point array; a file carries its own")
                input_path = Path(data)
                problem = input_problem(input_path, folders=False)  # as predict --input words it
                if problem is not None:
                    raise DataError(f"{input_path}: {problem}" + ("; predict takes one file" if input_path.is_dir() else ""))
            elif self.kind == "hsi":
                if features is not None:
                    raise SciformerError("predict: features= goes with a point array; a hyperspectral cube carries its bands")
                input_path = self._write_cube(tmp_dir, data)
            else:
                input_path = write_points(tmp_dir / "points.npz", data, features, self.features)
            opts = PredictOptions(probabilities=self.kind in ("points", "hsi"), wavelengths=wavelengths, **options)
            what = "the cube array" if self.kind == "hsi" else "the point array"
            renames = {} if input_path.parent != tmp_dir else {str(input_path): what, input_path.name: what}
            try:
                with torch.no_grad(), _process_state_kept(), printed_as(renames):  # the run's threads for the call only
                    apply_threads(self.experiment.cfg.train.threads)
                    return self._run(dict(self.data_state), input_path, tmp_dir, batch_size, opts)
            except SciformerError as exc:
                if input_path.parent != tmp_dir:
                    raise
                # the array was handed over as a temporary file: name what the caller passed instead
                text = str(exc).replace(str(input_path), what).replace(input_path.name, what)
                raise type(exc)(text) from None

    def _run(self, state: dict[str, Any], input_path: Path, tmp_dir: Path, batch_size: int, options: Any) -> Prediction:
        predictor, cfg = self.entry.predictor, self.experiment.data_params
        assert predictor is not None
        if self.kind == "hsi":
            out = tmp_dir / "out_map.npy"
            predictor(cfg, state, self._predict, input_path, out, batch_size, options=options)
            ids = np.load(out).astype(np.int64)  # (H, W) the map as written: label ids 1..K, 0 = unclassified
            probs = np.load(tmp_dir / "out_map_probabilities.npy")  # (H, W, K)
            return Prediction(ids - 1, probs.astype(np.float32), self.class_names, label_ids=ids)
        if self.kind == "shape":
            out = tmp_dir / "out_probs.npy"
            predictor(cfg, state, self._predict, input_path, out, batch_size, options=options)
            prob = np.load(out).astype(np.float32)  # (C,)
            label = np.asarray(int(prob.argmax()), dtype=np.int64)  # ()
            return Prediction(label, prob, self.class_names, label_ids=label.copy())
        out = tmp_dir / "out_points.npz"
        predictor(cfg, state, self._predict, input_path, out, batch_size, options=options)
        with np.load(out) as npz:
            pred = npz["pred"].astype(np.int64)  # (n,) class indices, -1 = no data: the file's ids too
            return Prediction(pred, npz["probabilities"].astype(np.float32), [str(n) for n in npz["class_names"]],
                              valid=npz["valid"].astype(bool), label_ids=pred.copy())

    # ------------------------------------------------------------------ arrays -> files
    def _write_cube(self, tmp_dir: Path, cube: Any) -> Path:
        cube = _numpy(cube)
        if cube.ndim != 3:
            raise DataError(f"predict: a hyperspectral cube must be (H, W, B), got shape {cube.shape}")
        path = tmp_dir / "cube.npy"
        np.save(path, np.ascontiguousarray(cube))
        return path


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Give back what a run changes for the whole process: torch's thread count and the global
    random generators (Python's, numpy's, torch's), so the caller's code runs on as before."""
    import random

    import torch

    threads, py_state, np_state, torch_state = torch.get_num_threads(), random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


def load(run_or_checkpoint: PathLike | Sequence[PathLike], device: str | None = None, overrides: Sequence[str] = ()) -> Predictor:
    """A :class:`Predictor` for a run folder (its ``checkpoints/best.pt``) or a checkpoint file; a list of
    them is an ensemble of runs of one experiment (their probabilities averaged, as ``--checkpoint`` repeated).

    ``device``: ``cpu``, ``cuda``, ``cuda:N`` (default: the run's ``train.device``);
    ``overrides``: dotted ``key=value`` changes, as ``sciformer predict`` takes them.
    """
    return Predictor(run_or_checkpoint, device=device, overrides=overrides)


def _override_list(overrides: Sequence[str] | Mapping[str, Any] | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        try:  # a str as exactly that string (never re-read as YAML); numpy / torch values as the plain numbers and lists they hold
            return [f"{k}={_quoted(v) if isinstance(v, str) else json.dumps(v, default=_plain)}" for k, v in overrides.items()]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"overrides: a value cannot be written as YAML ({exc})") from None
    if isinstance(overrides, str):
        return [overrides]
    if not isinstance(overrides, Sequence) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"overrides: expected 'key=value' strings (a list) or a dict, got {overrides!r:.80}")
    return list(overrides)


def _quoted(text: str) -> str:
    """``text`` as a double-quoted YAML scalar: read back as this very string ('#', ':', '123', 'null' included)."""
    import yaml

    return yaml.safe_dump(str(text), default_style='"', width=float("inf"), allow_unicode=True).rstrip("\n")


def _plain(value: Any) -> Any:
    """A numpy or torch value as Python numbers / lists (for ``json.dumps``)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} {value!r:.40}")


def train(
    config: PathLike | Mapping[str, Any] | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    *,
    output_dir: PathLike | None = None,
    seed: int | None = None,
    resume: PathLike | None = None,
    base_dir: PathLike | None = None,
    init_from: PathLike | None = None,
) -> TrainResult:
    """Train an experiment exactly as ``sciformer train`` does; returns the run folder and its metrics.

    ``config``: a YAML path or a dict of sections (relative paths in a dict resolve
    against ``base_dir``, default the working folder). ``overrides``: ``["train.epochs=5"]``
    or ``{"train.epochs": 5}`` (a dict holds Python values: a str stays exactly that string,
    never re-read as YAML, so ``{"name": "run #2"}`` is not cut at '#'). ``output_dir``: the run folder (default
    ``runs/<name>-<time>``). ``resume``: continue a stopped run instead. ``init_from``: a
    checkpoint or run folder whose weights matching by name and shape start the new run
    (fine-tuning, as ``--init-from``); the others, e.g. a head for another class count,
    keep their fresh initialisation.

    Ctrl-C (or SIGTERM) while training steps run writes ``checkpoints/last.pt`` first, then
    reaches the caller as a ``KeyboardInterrupt`` (:class:`sciformer.engine.signals.Interrupted`,
    never a :class:`SciformerError`) whose message names ``sciformer.train(resume=RUN)``.
    """
    from sciformer.engine.launch import prepare_training, run_training
    from sciformer.engine.reporting import read_metrics_csv

    if not isinstance(config, (str, os.PathLike, Mapping, type(None))):
        raise ConfigError(f"train: config must be a YAML path or a dict of sections, got {config!r:.80}")
    check_paths("train", output_dir=output_dir, resume=resume, base_dir=base_dir, init_from=init_from)
    source = dict(config) if isinstance(config, Mapping) else config
    with python_api(), _process_state_kept():  # the run sets torch's threads and seeds the global generators for itself
        exp, run_dir, state = prepare_training(source, _override_list(overrides), output_dir=output_dir, resume=resume,
                                               seed=seed, base_dir=base_dir, init_from=init_from)
        result = run_training(exp, run_dir, state)
    csv_path = Path(result.run_dir) / "metrics.csv"
    history = read_metrics_csv(csv_path) if csv_path.is_file() else []
    return TrainResult(Path(result.run_dir), dict(result.test or {}), int(result.best_epoch), history)


def pretrain(
    config: PathLike | Mapping[str, Any],
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    *,
    output_dir: PathLike | None = None,
    seed: int | None = None,
    epochs: int = 20,
    mask_ratio: float = 0.5,
    band_group: int = 10,
    pixel_ratio: float = 0.0,
    pixels: str = "all",
    base_dir: PathLike | None = None,
) -> Path:
    """Masked-band pre-training of a hyperspectral experiment's ``spectral_spatial`` model, exactly
    as ``sciformer pretrain`` does; returns the run folder (``train(..., init_from=folder)`` starts from it).

    ``pixels="all"`` pre-trains on every pixel of the scene (test and unlabelled ones
    included; no label enters the objective), ``"train"`` on the training pixels only.
    The caller's torch thread count and random generator states are as before when it returns.
    """
    from sciformer.engine.pretrain import PretrainSettings, pretrain_config
    from sciformer.utils.ranks import check_one_process

    check_one_process("pretrain")  # under torchrun every process would run it whole
    check_paths("pretrain", output_dir=output_dir, base_dir=base_dir)
    settings = PretrainSettings(epochs=epochs, mask_ratio=mask_ratio, band_group=band_group, pixel_ratio=pixel_ratio, pixels=pixels)
    source = dict(config) if isinstance(config, Mapping) else config
    with python_api(), _process_state_kept():  # as train: threads and seeded generators for the run only
        return pretrain_config(source, _override_list(overrides), settings, output_dir=output_dir, seed=seed, base_dir=base_dir)


__all__ = ["Prediction", "Predictor", "TrainResult", "load", "pretrain", "train"]
