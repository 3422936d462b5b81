"""What every dataset's file predictor (``sciformer predict``) does first, in one place.

A predictor refuses the flags that do not apply to its task, checks the output suffix
before any work, and reads its settings from the checkpoint's data state::

    options, input_path, output_path = start_prediction(
        "modelnet", options, input_path, output_path, (".json", ".npy"), refuse=("overlap", "flip"))
    classes = state_value(state, "class_names", "modelnet")

A class table given as an override (``data.classes``, ``data.class_names``) follows one rule
in ``evaluate`` and ``predict`` alike: the model's class k is the checkpoint's k-th class, so
names or an order other than the checkpoint's are refused (:func:`check_class_names`); the
codes a class takes may change (data relabelled), and are then honoured, with a note
(:func:`table_as_given`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sciformer.contracts import PredictOptions
from sciformer.errors import CheckpointError, DataError

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


SHOWN_CLASSES = 12  # class names listed in one line before "+N more"


def _names(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN_CLASSES]) + (f" (+{len(names) - SHOWN_CLASSES} more)" if len(names) > SHOWN_CLASSES else "")


def check_class_names(trained: Sequence[Any], given: Sequence[Any], what: str) -> None:
    """Refuse, in one CheckpointError line naming both, class names ``given`` (``what`` lists them:
    ``data.classes``, ``this data``) other than the checkpoint's ``trained`` names, in their order:
    the model's class k is the checkpoint's k-th class whatever it is called here. A checkpoint
    whose classes were never named (``class_1``, ``class_2``, ...) takes any names of its count."""
    trained, given = [str(n) for n in trained], [str(n) for n in given]
    if trained == given or (len(trained) == len(given) and trained == [f"class_{k}" for k in range(1, len(trained) + 1)]):
        return
    first = next((k for k, (a, b) in enumerate(zip(trained, given)) if a != b), min(len(trained), len(given)))
    where = (f"class {first} is '{given[first]}' here, '{trained[first]}' in the checkpoint" if first < min(len(trained), len(given))
             else f"{len(given)} classes here, {len(trained)} in the checkpoint")
    raise CheckpointError(f"{what} lists the classes {_names(given)}; the checkpoint's model predicts {_names(trained)}, in that order "
                          f"({where}): give its class names in its order (the codes a class takes may change)")


def table_as_given(trained: Mapping[str, Sequence[int]], given: Mapping[str, Sequence[int]], trained_unmapped: Any, given_unmapped: Any,
                   key: str = "data.classes") -> dict[str, list[int]]:
    """The class table ``given`` (an override, or the trained one repeated), once its names and order are
    the checkpoint's (:func:`check_class_names`); codes other than ``trained`` (or another
    ``unmapped``) are kept and named in a note on stderr: the data is read, and predictions are
    written, with them."""
    table = {str(k): [int(v) for v in vs] for k, vs in given.items()}
    before = {str(k): [int(v) for v in vs] for k, vs in trained.items()}
    check_class_names(list(before), list(table), key)
    changes = [f"{name} {before[name]} -> {codes}" for name, codes in table.items() if codes != before[name]]
    if trained_unmapped is not None and str(trained_unmapped) != str(given_unmapped):
        changes.append(f"unmapped {trained_unmapped} -> {given_unmapped}")
    if changes:
        print(f"note: {key} recodes the checkpoint's classes ({'; '.join(changes)}): labels are read, and classes written, "
              "with these codes", file=sys.stderr)
    return table
