"""What every dataset's file predictor (``sciformer predict``) does first, in one place.

A predictor refuses the flags that do not apply to its task, checks the output suffix
before any work, and reads its settings from the checkpoint's data state::

    options, input_path, output_path = start_prediction(
        "modelnet", options, input_path, output_path, (".json", ".npy"), refuse=("overlap", "flip"))
    classes = state_value(state, "class_names", "modelnet")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sciformer.contracts import PredictOptions
from sciformer.errors import DataError

LAS_SUFFIXES = (".las", ".laz")


def check_output_suffix(output_path: Path, suffixes: Sequence[str], input_path: Path | None = None) -> str:
    """The lower-case suffix of ``output_path`` if it is one of ``suffixes`` (a one-line DataError otherwise).

    ``.las``/``.laz`` outputs need a LAS/LAZ input (they copy its header and points).
    """
    suffix = output_path.suffix.lower()
    if suffix not in suffixes:
        raise DataError(f"{output_path}: unsupported output suffix '{output_path.suffix}'; use one of {', '.join(suffixes)}")
    if suffix in LAS_SUFFIXES and input_path is not None and input_path.suffix.lower() not in LAS_SUFFIXES:
        raise DataError(f"{output_path}: LAS/LAZ output copies a LAS/LAZ input, but '{input_path.name}' is not one; "
                        "use .ply, .npz or .npy")
    return suffix


def start_prediction(
    dataset: str,
    options: PredictOptions | None,
    input_path: str | Path,
    output_path: str | Path,
    suffixes: Sequence[str],
    *,
    refuse: Sequence[str] = (),
    accept: Sequence[str] = (),
) -> tuple[PredictOptions, Path, Path]:
    """``(options, input_path, output_path)`` for a predictor, after the checks every one makes.

    ``options`` defaults to :class:`PredictOptions`; the options named in ``refuse``
    must keep their defaults (they do not apply to ``dataset``), and so must the opt-in
    options (:attr:`PredictOptions.OPT_IN`) not named in ``accept``; the output suffix
    must be one of ``suffixes`` (:func:`check_output_suffix`).
    """
    options = options or PredictOptions()
    options.require_defaults(dataset, *refuse, *(o for o in PredictOptions.OPT_IN if o not in accept))
    input_path, output_path = Path(input_path), Path(output_path)
    check_output_suffix(output_path, suffixes, input_path)
    return options, input_path, output_path


def state_value(state: dict[str, Any], key: str, dataset: str) -> Any:
    """``state[key]`` or a DataError saying the checkpoint is not from ``dataset``."""
    try:
        return state[key]
    except KeyError:
        raise DataError(f"checkpoint data state: missing key '{key}'; not a {dataset} checkpoint") from None
