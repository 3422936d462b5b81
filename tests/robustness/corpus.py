"""Malformed inputs for the robustness tests, one builder per case.

A :class:`Case` writes one bad input (plus the tiny experiment YAML that points at it)
into a fresh folder and returns the ``sciformer`` command line that must refuse it with
exit code 2 and one line on stderr holding every ``expect`` fragment. Valid files are
written by the ``write_*`` helpers; the bad ones are derived from them (truncated,
keys removed, NaN inserted, ...).

Every command writes only below the case folder: training runs go to ``<dir>/run``,
evaluations to ``<dir>/eval``, predictions to ``<dir>/pred.*``.

Point-cloud experiments use ``robustness_probe``, a tiny model registered in
:mod:`corpus_kit` (a per-point MLP, mean-pooled for classification), so the point datasets
run end to end whatever point models the package provides.

The cases live in ``corpus_cases_data`` (experiment files, hyperspectral scenes),
``corpus_cases_points`` (point-cloud datasets) and ``corpus_cases_commands`` (``predict``
on point files and cubes; checkpoints); importing this module registers them all in
:data:`CASES`, in that order.
"""

from __future__ import annotations

import corpus_cases_commands  # noqa: F401  (registers its cases)
import corpus_cases_data  # noqa: F401
import corpus_cases_points  # noqa: F401
from corpus_cases_commands import _predict_points
from corpus_cases_points import _modelnet, _s3dis, _scenes, _shapenet, _tiles
from corpus_kit import (
    CASES,
    Case,
    Trained,
    cloud,
    hsi_experiment,
    make_scene,
    modelnet_experiment,
    off_text,
    pcd_binary,
    ply_text,
    s3dis_lines,
    save_tampered,
    train_argv,
    write_envi,
    write_las,
    write_mat_v5,
    write_mat_v73,
    write_modelnet_h5,
)

__all__ = [
    "CASES", "Case", "Trained", "by_id", "cloud", "hsi_experiment", "make_scene", "modelnet_experiment", "off_text",
    "pcd_binary", "ply_text", "s3dis_lines", "save_tampered", "train_argv", "write_envi", "write_las", "write_mat_v5", "write_mat_v73",
    "write_modelnet_h5", "_modelnet", "_predict_points", "_s3dis", "_scenes", "_shapenet", "_tiles",
]


def by_id(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)
