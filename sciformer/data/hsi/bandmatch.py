"""Applying a trained model to a cube of another band set: the rules, in one place.

``sciformer predict``, ``sciformer evaluate`` and :meth:`sciformer.Predictor.predict` all
call :func:`plan_bands`. A model *places bands by wavelength* when its
``model.position_source`` is ``wavelength``, or ``auto`` and its training scene had band
centres (the checkpoint records them as ``data_state["wavelengths"]``, nm); otherwise it
places them by band index (``index``, a scene without centres, or PCA components: a PCA
model's training centres are recorded too, and checked as an index model's are; a checkpoint
that recorded none is not checked).

======================  ===================  ==========================================
model places bands by   the input            result
======================  ===================  ==========================================
wavelength              has centres          runs at the input's centres (any count);
                                             the normaliser is read at those centres;
                                             bands the model saw no neighbour of are
                                             left out (one note), kept with
                                             ``allow_band_mismatch``; none left: error
wavelength              no centres, same     runs at the checkpoint's centres, with a
                        band count           one-line note on stderr
wavelength              no centres, other    one-line error: give the centres
                        count
index                   other band count     one-line error (retrain with wavelengths)
index                   same count, other    one-line error, or with
                        centres              ``allow_band_mismatch`` a loud warning
index                   same count, same or  runs
                        unknown centres
======================  ===================  ==========================================

Two band sets are the same when every centre agrees within
:data:`~sciformer.data.hsi.wavelengths.TOLERANCE_NM`. The trained centres *cover* the range
between them except their gaps (a step over :data:`GAP_FACTOR` times each of the two steps on
either side of it: Indian Pines' water-absorption gaps of 30, 70 and 134 nm between 10 nm steps;
a sparse sensor such as Sentinel-2, whose steps run 32-669 nm, has none), and each trained band
also covers half its local step (:func:`band_margins`, at least the tolerance, at most :data:`END_REACH_NM` past an end) beyond a range
end or into a gap: a band reaches about halfway to its neighbours, so a recalibration shift of
a nm or two, or the next unit of the same sensor, stays covered. An input band is *unseen* when
it lies outside that coverage. Its normalisation would be read across the gap (or from the
edge band), and a model that never saw it gives a one-class map of a real AVIRIS scene that
holds them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sciformer.data.hsi.wavelengths import TOLERANCE_NM, describe, same_wavelengths
from sciformer.data.predicting import state_value
from sciformer.errors import DataError
from sciformer.frontend import from_python, option

GAP_FACTOR = 2.0  # a step of the trained centres wider than this many times both steps beside it is a gap the model never saw
END_REACH_NM = 25.0  # the most a trained band covers past either end of the range (a sparse sensor's wide steps are no reach)
EVALUATE_CENTRES = "data.wavelengths=[...]"  # how ``evaluate`` (no --wavelengths flag) is given an input's band centres


def how_to_give(given_as: str) -> str:
    """How to give a cube's band centres, ``given_as`` naming the option of the running command."""
    return f"give the cube's band centres (an ENVI 'wavelength' field, data.wavelength_key for .mat, or {given_as})"


def mismatch_option() -> str:
    """The option that runs an index-position model on other band centres, as the running front end spells it."""
    return option("--allow-band-mismatch", True) if from_python() else option("--allow-band-mismatch")


@dataclass
class TrainedBands:
    """The band set a checkpoint's model was trained on."""

    bands: int  # bands of the training cube (before PCA)
    wavelengths: np.ndarray | None  # (bands,) centres in nm, as recorded
    by_wavelength: bool  # the model places bands by wavelength
    pca_components: int | None = None

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TrainedBands:
        """From a checkpoint's data state (plus ``position_source``, the model's setting)."""
        bands = int(state_value(state, "in_bands", "hsi_scene"))
        raw = state.get("wavelengths")
        wl = None if raw is None else np.asarray(raw.tolist() if hasattr(raw, "tolist") else raw, dtype=np.float64).reshape(-1)
        source = str(state.get("position_source") or "auto")
        pca = (state.get("normaliser") or {}).get("pca_components")
        pca = None if pca is None else int(pca)
        return cls(bands, wl, wl is not None and source != "index" and pca is None, pca)  # PCA components: by index

    @property
    def placement(self) -> str:
        """How the model places its inputs: ``wavelength``, ``band index`` or ``PCA component``."""
        if self.pca_components is not None:
            return "PCA component"
        return "wavelength" if self.by_wavelength else "band index"


def band_placement(state: dict[str, Any] | None, position_source: Any) -> str | None:
    """:attr:`TrainedBands.placement` of a data state and a ``model.position_source`` (None: not hyperspectral)."""
    if not state or "in_bands" not in state:
        return None
    return TrainedBands.from_state({**state, "position_source": position_source}).placement


@dataclass
class BandPlan:
    """What the model is fed for one input."""

    wavelengths: np.ndarray | None  # (B,) centres in nm for batch['wavelength']; None: band indices
    resample: bool = False  # the normaliser must be read at ``wavelengths`` (another band set)
    keep: np.ndarray | None = None  # (B,) bool: the input bands fed to the model (None: all); ``wavelengths`` are theirs
    notes: list[str] = field(default_factory=list)  # printed on stderr


def input_wavelengths(from_file: np.ndarray | None, given: np.ndarray | None, bands: int, where: str,
                      given_as: str, error: type[Exception] = DataError) -> np.ndarray | None:
    """The centres of an input: those given (``given_as``: '--wavelengths', 'data.wavelengths') or the file's.

    Given centres must count one per band; given together with a file that carries
    centres, they must agree (a one-line ``error`` otherwise: remove one or fix the file).
    """
    if given is None:
        return from_file
    given = np.asarray(given, dtype=np.float64).reshape(-1)
    if given.size != bands:
        raise error(f"{given_as}: {given.size} wavelengths for {where}, a cube of {bands} bands; expected one band centre per band")
    if from_file is not None and not same_wavelengths(from_file, given):
        i = int(np.argmax(np.abs(from_file - given)))
        raise error(f"{given_as} differ from the band centres {where} carries (band {i}: {given[i]:g} vs {from_file[i]:g} nm); "
                    f"remove {given_as} or fix the file")
    return given


def plan_bands(trained: TrainedBands, bands: int, wavelengths: np.ndarray | None, where: str, *,
               allow_mismatch: bool = False, quiet: bool = False, given_as: str | None = None) -> BandPlan:
    """Apply the rules of the module docstring to an input of ``bands`` bands with ``wavelengths`` (nm or None).

    Raises a one-line DataError for what the model cannot take; notes and warnings go to
    stderr (unless ``quiet``) and are returned in :attr:`BandPlan.notes`. ``given_as`` names how
    the running command takes an input's centres (default: ``--wavelengths`` / ``wavelengths=``;
    ``evaluate``: :data:`EVALUATE_CENTRES`).
    """
    plan = _plan(trained, bands, wavelengths, where, allow_mismatch, given_as or option("--wavelengths"))
    if not quiet:
        for line in plan.notes:
            print(line, file=sys.stderr)
    return plan


def _plan(trained: TrainedBands, bands: int, wl: np.ndarray | None, where: str, allow: bool, given_as: str) -> BandPlan:
    if trained.by_wavelength:
        assert trained.wavelengths is not None
        if wl is None:
            if bands != trained.bands:
                raise DataError(f"{where}: the cube has {bands} bands and no wavelengths; the model was trained on "
                                f"{trained.bands} bands placed by wavelength: {how_to_give(given_as)}")
            return BandPlan(trained.wavelengths, notes=[
                f"note: {where} carries no wavelengths; using the model's ({describe(trained.wavelengths)}), "
                f"as for the same sensor; give {given_as} if it is another"])
        if same_wavelengths(wl, trained.wavelengths):
            return BandPlan(wl)
        notes = [f"note: {where}: {describe(wl)} placed by wavelength in a model trained on {describe(trained.wavelengths)}"]
        unseen = unseen_bands(trained.wavelengths, wl)  # (B,)
        if not unseen.any():
            return BandPlan(wl, resample=True, notes=notes)
        lo, hi = float(trained.wavelengths.min()), float(trained.wavelengths.max())
        what = f"{int(unseen.sum())} of {wl.size} bands of {where} ({band_ranges(wl, unseen)})"
        if unseen.all() and not allow:
            power = int(np.round(np.log10(np.median(wl) / np.median(trained.wavelengths))))
            slip = f" (they read about 1e{power} times the trained centres: a unit slip in the file's wavelength units?)" \
                if abs(power) >= 2 else ""
            raise DataError(f"{where}: none of its {describe(wl)} lies within the model's trained {lo:.1f}-{hi:.1f} nm or "
                            f"next to a trained band{slip}; fix the centres, or pass {mismatch_option()} to run anyway")
        if allow:
            notes.append(f"WARNING: {what} lie outside the trained {lo:.1f}-{hi:.1f} nm or in its gaps; kept "
                         f"({mismatch_option()}): the model saw no band there, their normalisation is read across")
            return BandPlan(wl, resample=True, notes=notes)
        notes.append(f"note: {what} lie outside the trained {lo:.1f}-{hi:.1f} nm or in its gaps (steps over "
                     f"{GAP_FACTOR:g}x the steps beside them), over half a step from a trained band: the model saw no band "
                     f"there; left out ({mismatch_option()} keeps them)")
        return BandPlan(wl[~unseen], resample=True, keep=~unseen, notes=notes)
    if bands != trained.bands:
        if trained.pca_components is not None:
            raise DataError(f"{where}: the cube has {bands} bands but the model takes {trained.pca_components} PCA components "
                            f"of {trained.bands}-band cubes; only a {trained.bands}-band cube of the same sensor fits")
        why = "model.position_source=index" if trained.wavelengths is not None else "its training scene had no wavelengths"
        raise DataError(f"{where}: the cube has {bands} bands but the model was trained on {trained.bands} bands placed "
                        f"by band index ({why}); to apply it to other band sets, train with band centres "
                        "(data.wavelengths or data.wavelength_key) and model.position_source=wavelength")
    if wl is not None and trained.wavelengths is not None and not same_wavelengths(wl, trained.wavelengths):
        i = int(np.argmax(np.abs(wl - trained.wavelengths)))
        how = "its PCA was fitted on the trained bands" if trained.pca_components is not None else "the model places bands by index"
        detail = f"{where}: band centres differ from the model's (band {i}: {wl[i]:g} vs {trained.wavelengths[i]:g} nm) and {how}"
        if not allow:
            raise DataError(f"{detail}; pass {mismatch_option()} to run anyway")
        return BandPlan(None, notes=[f"WARNING: {detail}: the predictions may be meaningless ({mismatch_option()})"])
    return BandPlan(None)


def unseen_bands(trained: np.ndarray, wl: np.ndarray) -> np.ndarray:
    """(B,) bool: the centres ``wl`` outside the ``trained`` centres' coverage (see the module docstring).

    The steps between trained centres are covered, except their :func:`gap_steps`; each trained
    band also covers its :func:`band_margins` beyond a range end and into a gap.

    Shapes:
        trained: (T,), wl: (B,) -> (B,)
    """
    t = np.sort(np.asarray(trained, dtype=np.float64).reshape(-1))  # (T,)
    wl = np.asarray(wl, dtype=np.float64).reshape(-1)  # (B,)
    margin = band_margins(t)  # (T,)
    ends = np.minimum(margin[[0, -1]], max(END_REACH_NM, TOLERANCE_NM))  # (2,)
    out = (wl < t[0] - ends[0]) | (wl > t[-1] + ends[1])
    for i in np.nonzero(gap_steps(t))[0]:
        out |= (wl > t[i] + margin[i]) & (wl < t[i + 1] - margin[i + 1])
    return out


def gap_steps(t: np.ndarray) -> np.ndarray:
    """(T - 1,) bool: the steps of the ascending centres ``t`` that are gaps, wider than :data:`GAP_FACTOR`
    times each of the (up to) two steps on either side: a gap follows the sensor's local spacing, so
    a sparse or irregular sensor's wide steps are none, nor are the steps beside overlapping bands.

    Shapes:
        t: (T,) -> (T - 1,)
    """
    step = np.diff(t)  # (T - 1,)
    if step.size < 2:
        return np.zeros(step.size, dtype=bool)
    pad = np.r_[0.0, 0.0, step, 0.0, 0.0]  # (T + 3,)
    n = step.size
    side = np.max(np.stack([pad[0:n], pad[1:n + 1], pad[3:n + 3], pad[4:n + 4]]), axis=0)  # (T - 1,)
    return step > GAP_FACTOR * side


def band_margins(t: np.ndarray) -> np.ndarray:
    """(T,) nm each trained band covers beyond a range end or into a gap: half the widest step (not a
    gap) within two bands of it, the spacing of its band set there (a recalibration shift or another
    unit of the same sensor stays within it), never under :data:`~sciformer.data.hsi.wavelengths.TOLERANCE_NM`.

    Shapes:
        t: (T,) ascending -> (T,)
    """
    step = np.where(gap_steps(t), 0.0, np.diff(t))  # (T - 1,) gaps count 0
    pad = np.r_[0.0, 0.0, step, 0.0, 0.0]  # (T + 3,): band i sits between pad[i + 1] and pad[i + 2]
    n = t.size
    near = np.max(np.stack([pad[0:n], pad[1:n + 1], pad[2:n + 2], pad[3:n + 3]]), axis=0)  # (T,)
    return np.maximum(0.5 * near, TOLERANCE_NM)


def band_ranges(wl: np.ndarray, chosen: np.ndarray) -> str:
    """``'365.9-394.9, 1363.0-1412.9 nm'``: the runs of ``chosen`` (B,) bool among the centres ``wl`` (B,), in ascending order."""
    order = np.argsort(wl, kind="stable")
    wl, chosen = np.asarray(wl, dtype=np.float64)[order], np.asarray(chosen, dtype=bool)[order]
    edges = np.diff(np.r_[0, chosen.astype(np.int8), 0])  # +1 where a run starts, -1 one past its end
    runs = zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0] - 1)
    return ", ".join(f"{wl[a]:.1f}" if a == b else f"{wl[a]:.1f}-{wl[b]:.1f}" for a, b in runs) + " nm"


def checkpoint_order(trained: np.ndarray | None, wl: np.ndarray) -> np.ndarray | None:
    """For a checkpoint trained on bands out of ascending order (before bands were sorted) and
    an input of the same band set in ascending order ``wl``: the permutation that puts the
    input's bands in the checkpoint's order. None otherwise (nothing to do)."""
    if trained is None or not np.any(np.diff(trained) < 0):
        return None
    placed = np.argsort(trained, kind="stable")  # trained[placed] ascending
    return np.argsort(placed, kind="stable") if same_wavelengths(wl, trained[placed]) else None
