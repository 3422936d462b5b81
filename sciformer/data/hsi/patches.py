"""Lazy patch access to a padded cube: training items and tiled whole-scene batches.

The (normalised) cube is stored once as a ``(B, H + 2r, W + 2r)`` float32 tensor,
``r = patch_size // 2``; a patch centred on pixel ``(i, j)`` is the view
``padded[:, i : i + p, j : j + p]``. Nothing of size ``(n, B, p, p)`` is ever built
for the whole scene: memory grows with the batch, not with the number of pixels.

Padding modes (numpy names): ``reflect`` (mirror without repeating the edge, the
default), ``symmetric`` (mirror repeating the edge), ``edge`` (repeat the edge pixel),
``zero``. With the mirrored modes every value inside a window comes from pixels within
``r`` of its centre, so the split leakage check (Chebyshev distance) stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from sciformer.contracts import check_patch_size
from sciformer.errors import DataError

PaddingMode = Literal["reflect", "symmetric", "edge", "zero"]
PADDING_MODES: tuple[str, ...] = ("reflect", "symmetric", "edge", "zero")


def pad_cube(cube: np.ndarray | torch.Tensor, patch_size: int, mode: PaddingMode = "reflect") -> torch.Tensor:
    """Cube (H, W, B) -> padded band-first float32 tensor (B, H + 2r, W + 2r): :func:`pad_transformed`
    with the cube's values as they are.

    Shapes:
        cube: (H, W, B) -> (B, H + 2r, W + 2r) float32
    """
    arr = cube.detach().cpu().numpy() if isinstance(cube, torch.Tensor) else np.asarray(cube)
    bands = arr.shape[-1] if arr.ndim == 3 else 0  # another rank is refused by pad_transformed
    return pad_transformed(arr, lambda rows, _y: rows.astype(np.float32, copy=False), bands, patch_size, mode)


BLOCK_BYTES = 4 << 20  # float32 bytes of the cube rows pad_transformed transforms at a time


def pad_transformed(cube: np.ndarray, transform: Callable[[np.ndarray, int], np.ndarray], channels: int,
                    patch_size: int, mode: PaddingMode = "reflect") -> torch.Tensor:
    """:func:`pad_cube` of ``transform`` applied to ``cube``, built block of image rows by block:
    ``transform(rows, y)`` gets the rows ``cube[y : y + n]`` (n, W, B) and returns them as
    (n, W, channels) float32, written straight into the padded tensor. Besides the cube and the
    output, memory holds one block (about ``BLOCK_BYTES`` as float32) and one padded band at a time,
    where transforming the whole cube first held a second full-size copy.

    Shapes:
        cube: (H, W, B) -> (channels, H + 2r, W + 2r) float32
    """
    patch_size = check_patch_size(patch_size)
    if mode not in PADDING_MODES:
        raise DataError(f"padding: expected one of {', '.join(PADDING_MODES)}, got '{mode}'")
    if cube.ndim != 3:
        raise DataError(f"cube: expected shape (H, W, B), got {cube.shape}")
    r = patch_size // 2
    h, w = cube.shape[:2]
    out = np.empty((channels, h + 2 * r, w + 2 * r), dtype=np.float32)  # (C, H + 2r, W + 2r)
    step = max(1, BLOCK_BYTES // (4 * max(1, w * max(channels, cube.shape[2]))))
    for y in range(0, h, step):
        block = transform(cube[y : y + step], y)  # (n, W, C)
        out[:, r + y : r + y + block.shape[0], r : r + w] = block.transpose(2, 0, 1)
    if r:
        np_mode = "constant" if mode == "zero" else mode
        for k in range(channels):  # band by band, from the interior just written
            out[k] = np.pad(out[k, r : r + h, r : r + w], r, mode=np_mode)
    return torch.from_numpy(out)


def _check_padded(padded: torch.Tensor, patch_size: int) -> tuple[int, int, int]:
    if not isinstance(padded, torch.Tensor) or padded.ndim != 3:
        raise DataError("padded: expected a (B, H + 2r, W + 2r) tensor from pad_cube")
    patch_size = check_patch_size(patch_size)
    b, hp, wp = padded.shape
    h, w = hp - (patch_size - 1), wp - (patch_size - 1)
    if h < 1 or w < 1:
        raise DataError(f"padded: shape {tuple(padded.shape)} is too small for patch_size {patch_size}")
    return int(b), int(h), int(w)


def augment_patch(
    patch: torch.Tensor, generator: torch.Generator | None = None, flip: bool = True, rotate: bool = True
) -> torch.Tensor:
    """Random horizontal/vertical flip and 90-degree rotation of a (B, p, p) patch.

    One random draw picks among the 16 (flip x flip x rotation) combinations, which
    cover the 8 symmetries of the square equally often.
    """
    code = int(torch.randint(0, 16, (), generator=generator))
    if flip and code & 8:
        patch = patch.flip(-1)
    if flip and code & 4:
        patch = patch.flip(-2)
    k = code & 3
    if rotate and k:
        patch = torch.rot90(patch, k, dims=(-2, -1))
    return patch


class PatchDataset(Dataset):
    """Patches centred on given pixels of a padded cube, cut on access.

    Items are ``{"patch": (B, p, p) float32, "target": () int64}``; with ``return_coords``
    also ``"coord": (2,) int64`` (row, column).

    Args:
        padded: (B, H + 2r, W + 2r) float32 tensor from :func:`pad_cube` (shared, not copied).
        coords: (n, 2) pixel coordinates (row, column) in the unpadded scene.
        targets: (n,) int64 class ids (0-based).
        patch_size: odd window size p.
        flip, rotate: random flips / 90-degree rotations (training augmentation).
        illumination: each patch's raw spectra times one factor s drawn from
            [1 - illumination, 1 + illumination]; in normalised units (any affine
            normalisation ``f``) ``f(s x) = s f(x) + (1 - s) f(0)``, so ``zero`` = f(0) (C,) is needed.
        noise: standard deviation of Gaussian noise added to every value (normalised units).
    """

    def __init__(
        self,
        padded: torch.Tensor,
        coords: np.ndarray | torch.Tensor,
        targets: np.ndarray | torch.Tensor,
        patch_size: int,
        *,
        flip: bool = False,
        rotate: bool = False,
        illumination: float = 0.0,
        noise: float = 0.0,
        zero: np.ndarray | torch.Tensor | None = None,
        return_coords: bool = False,
    ) -> None:
        _, h, w = _check_padded(padded, patch_size)
        coords_t = torch.as_tensor(np.asarray(coords), dtype=torch.int64).reshape(-1, 2)  # (n, 2)
        targets_t = torch.as_tensor(np.asarray(targets), dtype=torch.int64).reshape(-1)  # (n,)
        if coords_t.shape[0] != targets_t.shape[0]:
            raise DataError(f"PatchDataset: {coords_t.shape[0]} coords but {targets_t.shape[0]} targets")
        inside = (coords_t >= 0).all() and (coords_t[:, 0] < h).all() and (coords_t[:, 1] < w).all()
        if coords_t.numel() and not inside:
            raise DataError(f"PatchDataset: coords outside the {h} x {w} scene")
        self.padded = padded
        self.coords = coords_t
        self.targets = targets_t
        self.patch_size = int(patch_size)
        self.flip = bool(flip)
        self.rotate = bool(rotate)
        self.illumination = float(illumination)
        self.noise = float(noise)
        if self.illumination and zero is None:
            raise DataError("PatchDataset: illumination augmentation needs the normalised zero spectrum (zero=)")
        self.zero = None if zero is None else torch.as_tensor(np.asarray(zero), dtype=torch.float32).reshape(-1, 1, 1)  # (C, 1, 1)
        self.return_coords = bool(return_coords)

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def __getitem__(self, index: int) -> dict[str, Any]:
        i, j = (int(v) for v in self.coords[index])
        p = self.patch_size
        patch = self.padded[:, i : i + p, j : j + p]  # (B, p, p) view
        if self.flip or self.rotate:
            patch = augment_patch(patch, flip=self.flip, rotate=self.rotate)
        if self.illumination:
            s = 1.0 + self.illumination * (2.0 * float(torch.rand(())) - 1.0)
            patch = s * patch + (1.0 - s) * self.zero  # (C, p, p)
        if self.noise:
            patch = patch + self.noise * torch.randn(patch.shape)  # (C, p, p)
        item: dict[str, Any] = {"patch": patch.clone(), "target": self.targets[index]}
        if self.return_coords:
            item["coord"] = self.coords[index]
        return item

    def __repr__(self) -> str:
        b = self.padded.shape[0]
        aug = [n for n, on in (("flip", self.flip), ("rotate", self.rotate)) if on]
        aug += [f"{n}={v:g}" for n, v in (("illumination", self.illumination), ("noise", self.noise)) if v]
        return (
            f"PatchDataset(n={len(self)}, bands={b}, patch_size={self.patch_size}, "
            f"augment={'+'.join(aug) or 'none'})"
        )


def iter_scene_batches(
    padded: torch.Tensor,
    patch_size: int,
    batch_size: int,
    mask: np.ndarray | torch.Tensor | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Patches of every pixel (or of ``mask`` pixels), ``batch_size`` at a time.

    The padded cube is unfolded into a strided (H, W, B, p, p) view (no copy) and each
    batch gathers its pixels' windows from it in one indexing call, so memory is bounded
    by ``batch_size`` patches.

    Yields:
        patches (n, B, p, p) float32 with n <= batch_size, coords (n, 2) int64 (row, column),
        in row-major pixel order; every selected pixel exactly once.
    """
    _, h, w = _check_padded(padded, patch_size)
    if int(batch_size) < 1:
        raise DataError(f"batch_size: expected a positive integer, got {batch_size}")
    p = int(patch_size)
    if mask is not None:
        sel = torch.as_tensor(np.asarray(mask)).bool()
        if tuple(sel.shape) != (h, w):
            raise DataError(f"mask: shape {tuple(sel.shape)} does not match the {h} x {w} scene")
        flat_idx = torch.nonzero(sel.reshape(-1), as_tuple=True)[0]  # (N,)
    else:
        flat_idx = None
    total = h * w if flat_idx is None else int(flat_idx.numel())
    windows = padded.unfold(1, p, 1).unfold(2, p, 1)  # (B, H, W, p, p) view, no copy
    windows = windows.permute(1, 2, 0, 3, 4)  # (H, W, B, p, p) view
    for s in range(0, total, int(batch_size)):
        if flat_idx is None:
            idx = torch.arange(s, min(total, s + int(batch_size)))  # (n,)
        else:
            idx = flat_idx[s : s + int(batch_size)]  # (n,)
        rows, cols = idx // w, idx % w
        patches = windows[rows, cols].contiguous()  # (n, B, p, p) gathered copy
        yield patches, torch.stack([rows, cols], dim=1)  # (n, 2)


def extreme_pixel(padded: torch.Tensor, patch_size: int, row: int, col: int) -> tuple[tuple[int, int], float]:
    """The image pixel of largest absolute (normalised) value in the patch of pixel (``row``, ``col``), and that value.

    Only the patch's pixels inside the image are searched: padding copies them (reflect, edge) or is 0.
    """
    _, h, w = _check_padded(padded, patch_size)
    r = patch_size // 2
    top, left = max(row - r, 0), max(col - r, 0)
    window = padded[:, top + r : min(row + r, h - 1) + r + 1, left + r : min(col + r, w - 1) + r + 1]  # (B, ph, pw)
    size = window.abs().amax(dim=0)  # (ph, pw)
    i, j = divmod(int(size.argmax()), int(size.shape[1]))
    return (top + i, left + j), float(window[:, i, j][window[:, i, j].abs().argmax()])


def predict_scene(
    predict: Any,
    padded: torch.Tensor,
    patch_size: int,
    batch_size: int,
    *,
    mask: np.ndarray | None = None,
    make_batch: Any = None,
    probabilities: np.ndarray | None = None,
    where: str = "the cube",
) -> np.ndarray:
    """Predict class ids (0-based) for every pixel (or ``mask`` pixels); -1 elsewhere.

    ``predict(batch) -> logits (n, C)``; ``make_batch(patches) -> batch dict`` (default
    ``{"patch": patches}``). Runs under ``torch.no_grad``. ``probabilities``, when given,
    is an (H, W, C) float32 array that receives the softmax of every predicted pixel
    (other pixels are left as they are). ``where`` (the input file) begins the message of a pixel
    the model gives non-finite scores, which names the most extreme pixel of its patch.

    Returns:
        (H, W) int64 map of argmax class ids, -1 where not predicted.
    """
    _, h, w = _check_padded(padded, patch_size)
    if probabilities is not None and (probabilities.ndim != 3 or probabilities.shape[:2] != (h, w)):
        raise DataError(f"predict_scene: probabilities must be ({h}, {w}, num_classes), got {probabilities.shape}")
    out = np.full((h, w), -1, dtype=np.int64)  # (H, W)
    with torch.no_grad():
        for patches, coords in iter_scene_batches(padded, patch_size, batch_size, mask):
            batch = make_batch(patches) if make_batch is not None else {"patch": patches}
            logits = predict(batch)  # (n, C)
            if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != patches.shape[0]:
                shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                raise DataError(f"predict: expected logits of shape ({patches.shape[0]}, num_classes), got {shape}")
            probs = logits.float().softmax(dim=1).cpu().numpy()  # (n, C)
            c = coords.numpy()
            bad = ~np.isfinite(probs).all(axis=1)  # (n,)
            if bad.any():
                row, col = (int(v) for v in c[bad.argmax()])
                (i, j), value = extreme_pixel(padded, patch_size, row, col)
                raise DataError(f"{where}: the model gives non-finite scores for {int(bad.sum())} pixel(s) of a batch (first at ({row}, {col}), "
                                f"whose patch holds pixel ({i}, {j}) of value {value:.3g} once normalised); has the model "
                                "diverged (see its validation loss), or are there values far outside the training data's range, "
                                "e.g. a no-data fill?")
            out[c[:, 0], c[:, 1]] = probs.argmax(axis=1)  # of the probabilities: the map is their argmax, ties included
            if probabilities is not None:
                if probs.shape[1] != probabilities.shape[2]:
                    raise DataError(f"predict: the model gives {probs.shape[1]} classes, the probability map holds {probabilities.shape[2]}")
                probabilities[c[:, 0], c[:, 1]] = probs
    return out
