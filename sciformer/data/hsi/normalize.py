"""Per-band scaling and optional PCA, fitted on training pixels only.

``standard`` subtracts each band's training mean and divides by its training standard
deviation; ``minmax`` maps each band's training range to [0, 1]; ``none`` only casts to
float32. With ``pca_components = n`` the scaled bands are projected onto the first ``n``
principal axes of the (scaled) training pixels (numpy eigendecomposition of the
covariance; each axis's sign is fixed so that its largest loading is positive). Test
pixels never influence any statistic.

The fitted state is a dict of torch tensors, ints and strings (``state_dict()``) that
loads with ``torch.load(weights_only=True)`` and restores with :meth:`Normalizer.from_state`.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from sciformer.errors import DataError

Method = Literal["standard", "minmax", "none"]
METHODS: tuple[str, ...] = ("standard", "minmax", "none")

_CHUNK_BYTES = 8 << 20  # float64 bytes of the pixels transformed at a time (bounded temporaries, any band count)


class Normalizer:
    """Band scaling (+ PCA) fitted on training pixels: ``y = ((x - shift) / scale - mean) @ V``.

    Shift and scale are applied in float64 (by chunks of rows), the result cast to float32.
    A band is constant (scale 1) when its spread is 0 or at most ``eps`` times its largest
    absolute value; every other band is scaled, whatever its magnitude.

    Shapes:
        fit: cube (H, W, B) and mask (H, W) bool, or pixels (n, B)
        transform: (..., B) -> (..., C) float32, C = pca_components or B
    """

    def __init__(self, method: Method = "standard", pca_components: int | None = None, eps: float = 1e-10) -> None:
        if method not in METHODS:
            raise DataError(f"normalise: expected one of {', '.join(METHODS)}, got '{method}'")
        if pca_components is not None and int(pca_components) < 1:
            raise DataError(f"pca_components: expected a positive integer, got {pca_components}")
        self.method = method
        self.pca_components = None if pca_components is None else int(pca_components)
        self.eps = float(eps)
        self.in_bands: int | None = None
        self.shift: np.ndarray | None = None  # (B,)
        self.scale: np.ndarray | None = None  # (B,)
        self.pca_mean: np.ndarray | None = None  # (B,)
        self.pca_basis: np.ndarray | None = None  # (B, C)
        self.explained_variance_ratio: np.ndarray | None = None  # (C,)

    # ------------------------------------------------------------------ fitting
    @property
    def fitted(self) -> bool:
        return self.shift is not None

    @property
    def out_channels(self) -> int:
        if self.in_bands is None:
            raise DataError("Normalizer: not fitted yet; call fit() first")
        return self.pca_components or self.in_bands

    def fit(self, data: np.ndarray, mask: np.ndarray | None = None) -> Normalizer:
        """Fit on ``data[mask]`` (cube (H, W, B) + mask (H, W)) or on pixels (n, B)."""
        pixels = _select_pixels(data, mask)  # (n, B)
        n, b = pixels.shape
        if n == 0:
            raise DataError("Normalizer.fit: no training pixels selected (empty mask)")
        x = pixels.astype(np.float64)  # (n, B)
        if self.method == "standard":
            shift = x.mean(axis=0)  # (B,)
            scale = x.std(axis=0)  # (B,)
        elif self.method == "minmax":
            shift = x.min(axis=0)
            scale = x.max(axis=0) - shift
        else:
            shift = np.zeros(b)
            scale = np.ones(b)
        # a constant band (spread 0, or only float64 rounding relative to its magnitude) is not
        # divided by ~0; any other band is scaled, whatever its units (1e-12 or 1e12)
        magnitude = np.maximum(np.abs(x).max(axis=0), np.finfo(np.float64).tiny)  # (B,)
        scale = np.where((scale > 0) & (scale > self.eps * magnitude), scale, 1.0)
        self.in_bands = int(b)
        self.shift, self.scale = shift, scale
        if self.pca_components is not None:
            if self.pca_components > b:
                raise DataError(f"pca_components: {self.pca_components} exceeds the number of bands ({b})")
            z = (x - shift) / scale  # (n, B)
            mean = z.mean(axis=0)  # (B,)
            zc = z - mean
            cov = zc.T @ zc / max(n - 1, 1)  # (B, B)
            evals, evecs = np.linalg.eigh(cov)  # ascending
            order = np.argsort(evals)[::-1][: self.pca_components]
            basis = evecs[:, order]  # (B, C)
            signs = np.sign(basis[np.abs(basis).argmax(axis=0), np.arange(basis.shape[1])])
            basis = basis * np.where(signs == 0, 1.0, signs)
            total = float(np.clip(evals, 0, None).sum())
            self.pca_mean = mean
            self.pca_basis = basis
            kept = np.clip(evals[order], 0, None)  # (C,)
            self.explained_variance_ratio = kept / total if total > 0 else np.zeros(len(order))
        return self

    # ------------------------------------------------------------------ applying
    def transform(self, data: np.ndarray, where: str = "Normalizer", first_row: int = 0) -> np.ndarray:
        """Apply to an array whose last axis is bands: (..., B) -> (..., C) float32.

        A value that leaves float32's range (a no-data fill such as -3.4e38 or 1e300 in a
        float64 cube) is a one-line DataError naming ``where`` and the first such pixel,
        never an infinite input that would give the model NaN outputs (``first_row``: the row
        of the whole cube that ``data``'s first row is, for that pixel's position).
        """
        if not self.fitted:
            raise DataError("Normalizer: not fitted yet; call fit() first")
        data = np.asarray(data)
        if data.shape[-1] != self.in_bands:
            raise DataError(
                f"Normalizer: input has {data.shape[-1]} bands; the normaliser was fitted on {self.in_bands}"
            )
        lead = data.shape[:-1]
        flat = data.reshape(-1, data.shape[-1])  # (N, B)
        out = np.empty((flat.shape[0], self.out_channels), dtype=np.float32)  # (N, C)
        shift = np.asarray(self.shift, dtype=np.float64)
        inv = 1.0 / np.asarray(self.scale, dtype=np.float64)
        rows = max(1, _CHUNK_BYTES // (8 * max(flat.shape[1], self.out_channels, 1)))
        for start in range(0, flat.shape[0], rows):
            with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values are reported below
                # shift and scale in float64 (data at 1e8 with a spread of 10 keeps its detail), then float32
                wide = flat[start : start + rows].astype(np.float64)  # (n, B): the one float64 copy, in place below
                wide -= shift
                wide *= inv
                chunk = wide.astype(np.float32)
                if self.pca_basis is not None:
                    chunk = (chunk - self.pca_mean.astype(np.float32)) @ self.pca_basis.astype(np.float32)  # (n, C)
            bad = ~np.isfinite(chunk).all(axis=1)  # (n,)
            if bad.any():
                row = start + int(bad.argmax())
                raw = flat[row].astype(np.float64)  # (B,)
                first = tuple(int(i) for i in np.unravel_index(row, lead)) if lead else ()
                first = (first[0] + first_row, *first[1:]) if first else first
                more = "+" if start + chunk.shape[0] < flat.shape[0] else ""
                raise DataError(f"{where}: {int(bad.sum())}{more} pixel(s) leave float32's range once normalised (first at "
                                f"{first}, raw value {raw[np.abs(raw).argmax()]:.3g}); a no-data fill? replace or mask it first")
            out[start : start + chunk.shape[0]] = chunk
        return out.reshape(*lead, self.out_channels)

    __call__ = transform

    def at_wavelengths(self, fitted_at: np.ndarray, wavelengths: np.ndarray) -> Normalizer:
        """This normaliser for another band set: each band's shift and scale linearly
        interpolated at its centre ``wavelengths`` (nm) from the fitted bands' centres
        ``fitted_at`` (edge values beyond them). Exact for a subset of the fitted bands;
        it assumes the input is in the training scene's radiometric units. No PCA.

        Shapes:
            fitted_at: (B,), wavelengths: (B',) -> a normaliser taking (..., B')
        """
        if not self.fitted:
            raise DataError("Normalizer: not fitted yet; call fit() first")
        if self.pca_basis is not None:
            raise DataError("Normalizer: a PCA basis is tied to the fitted bands; it cannot be read at other wavelengths")
        src = np.asarray(fitted_at, dtype=np.float64).reshape(-1)  # (B,)
        dst = np.asarray(wavelengths, dtype=np.float64).reshape(-1)  # (B',)
        if src.shape != (self.in_bands,):
            raise DataError(f"Normalizer: {src.size} fitted wavelengths for {self.in_bands} fitted bands")
        order = np.argsort(src, kind="stable")  # np.interp needs increasing positions (sensors overlap)
        out = Normalizer(self.method, None, self.eps)
        out.in_bands = int(dst.size)
        out.shift = np.interp(dst, src[order], self.shift[order])  # (B',)
        out.scale = np.interp(dst, src[order], self.scale[order])  # (B',)
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Fitted state as torch tensors (float64), ints and strings (weights_only-safe)."""
        if not self.fitted:
            raise DataError("Normalizer: not fitted yet; nothing to export")
        state: dict[str, Any] = {
            "method": self.method,
            "in_bands": int(self.in_bands),
            "out_channels": int(self.out_channels),
            "shift": torch.from_numpy(np.asarray(self.shift, dtype=np.float64).copy()),
            "scale": torch.from_numpy(np.asarray(self.scale, dtype=np.float64).copy()),
        }
        if self.pca_basis is not None:
            state["pca_components"] = int(self.pca_components)
            state["pca_mean"] = torch.from_numpy(self.pca_mean.astype(np.float64).copy())
            state["pca_basis"] = torch.from_numpy(self.pca_basis.astype(np.float64).copy())
            evr = self.explained_variance_ratio.astype(np.float64).copy()
            state["explained_variance_ratio"] = torch.from_numpy(evr)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Normalizer:
        """Rebuild a fitted normaliser from :meth:`state_dict` output (tensors or lists)."""
        try:
            norm = cls(state["method"], state.get("pca_components"))
            norm.in_bands = int(state["in_bands"])
            norm.shift = _as_np(state["shift"])
            norm.scale = _as_np(state["scale"])
            if "pca_basis" in state:
                norm.pca_mean = _as_np(state["pca_mean"])
                norm.pca_basis = _as_np(state["pca_basis"])
                evr = state.get("explained_variance_ratio")
                norm.explained_variance_ratio = None if evr is None else _as_np(evr)
        except KeyError as exc:
            raise DataError(f"normaliser state: missing key {exc.args[0]!r}") from exc
        if norm.shift.shape != (norm.in_bands,) or norm.scale.shape != (norm.in_bands,):
            raise DataError(f"normaliser state: shift/scale must have {norm.in_bands} values")
        if norm.pca_basis is not None and norm.pca_basis.shape != (norm.in_bands, norm.pca_components):
            raise DataError(
                f"normaliser state: pca_basis has shape {tuple(norm.pca_basis.shape)}; "
                f"expected ({norm.in_bands}, {norm.pca_components})"
            )
        return norm

    def describe(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "method": self.method,
            "fitted_on": "training pixels",
            "pca_components": self.pca_components,
        }
        if self.explained_variance_ratio is not None:
            facts["pca_explained_variance"] = round(float(self.explained_variance_ratio.sum()), 6)
        return facts

    def __repr__(self) -> str:
        pca = f", pca_components={self.pca_components}" if self.pca_components else ""
        fitted = f", in_bands={self.in_bands}" if self.fitted else ", unfitted"
        return f"Normalizer(method={self.method!r}{pca}{fitted})"


def _as_np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _select_pixels(data: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    data = np.asarray(data)
    if mask is None:
        if data.ndim != 2:
            raise DataError(f"Normalizer.fit: expected pixels (n, B) or a cube with a mask, got shape {data.shape}")
        return data
    mask = np.asarray(mask)
    if data.ndim != 3 or mask.shape != data.shape[:2]:
        raise DataError(f"Normalizer.fit: mask shape {mask.shape} does not match cube shape {data.shape}")
    return data[mask.astype(bool)]  # (n, B)
