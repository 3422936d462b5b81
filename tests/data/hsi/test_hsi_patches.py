"""Lazy patches and whole-scene tiles against a direct index oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from sciformer.data.hsi.patches import (
    PatchDataset,
    iter_scene_batches,
    pad_cube,
    predict_scene,
)
from sciformer.errors import DataError


def oracle_patch(cube: np.ndarray, i: int, j: int, p: int, mode: str) -> np.ndarray:
    """(B, p, p) window around (i, j) built pixel by pixel from index arithmetic."""
    h, w, b = cube.shape
    r = p // 2
    out = np.zeros((b, p, p), dtype=np.float32)

    def fold(x: int, n: int) -> int | None:
        if 0 <= x < n:
            return x
        if mode == "zero":
            return None
        if mode == "edge":
            return min(max(x, 0), n - 1)
        if mode == "reflect":  # no edge repeat: -1 -> 1, n -> n - 2
            return -x if x < 0 else 2 * (n - 1) - x
        return -x - 1 if x < 0 else 2 * n - 1 - x  # symmetric: -1 -> 0, n -> n - 1

    for a in range(p):
        for c in range(p):
            y, x = fold(i + a - r, h), fold(j + c - r, w)
            if y is not None and x is not None:
                out[:, a, c] = cube[y, x]
    return out


@pytest.mark.parametrize("mode", ["reflect", "symmetric", "edge", "zero"])
@pytest.mark.parametrize("p", [1, 3, 7])
def test_patches_match_oracle_everywhere_incl_borders(scene, mode, p):
    cube = scene[0][:9, :11]  # (9, 11, 8): r = 3 still inside one reflection
    padded = pad_cube(cube, p, mode)
    assert padded.shape == (8, 9 + p - 1, 11 + p - 1) and padded.dtype == torch.float32
    rows, cols = np.meshgrid(np.arange(9), np.arange(11), indexing="ij")
    coords = np.stack([rows.ravel(), cols.ravel()], 1)
    ds = PatchDataset(padded, coords, np.arange(len(coords)), p)
    for n in range(len(ds)):
        item = ds[n]
        i, j = coords[n]
        np.testing.assert_array_equal(item["patch"].numpy(), oracle_patch(cube, i, j, p, mode))
        assert item["target"].dtype == torch.int64 and int(item["target"]) == n


def test_dataset_shares_the_padded_cube(scene):
    padded = pad_cube(scene[0], 5)
    ds = PatchDataset(padded, np.array([[0, 0], [3, 4]]), np.array([1, 2]), 5)
    assert ds.padded is padded  # stored once, never materialised per pixel
    item = ds[1]
    assert item["patch"].shape == (8, 5, 5)
    item["patch"].zero_()  # items are copies: the cube is untouched
    assert padded.abs().sum() > 0 and ds[1]["patch"].abs().sum() > 0
    assert repr(ds) == "PatchDataset(n=2, bands=8, patch_size=5, augment=none)"


def test_augmentation_is_a_dihedral_transform(scene):
    padded = pad_cube(scene[0], 5)
    ds = PatchDataset(padded, np.array([[10, 10]]), np.array([3]), 5, flip=True, rotate=True)
    plain = PatchDataset(padded, np.array([[10, 10]]), np.array([3]), 5)[0]["patch"]
    variants = [torch.rot90(t, k, dims=(-2, -1)) for t in (plain, plain.flip(-1)) for k in range(4)]
    torch.manual_seed(0)
    seen = set()
    for _ in range(60):
        item = ds[0]
        assert int(item["target"]) == 3
        match = [n for n, v in enumerate(variants) if torch.equal(v, item["patch"])]
        assert match, "augmented patch is not a flip/rotation of the original"
        seen.add(match[0])
    assert len(seen) == 8


def test_dataloader_batches(scene):
    cube, gt, _ = scene
    padded = pad_cube(cube, 3)
    rows, cols = np.nonzero(gt)
    ds = PatchDataset(padded, np.stack([rows, cols], 1), gt[rows, cols] - 1, 3)
    batches = list(DataLoader(ds, batch_size=16))
    assert batches[0]["patch"].shape == (16, 8, 3, 3)
    assert sum(len(b["target"]) for b in batches) == len(rows)


@pytest.mark.parametrize("batch_size", [1, 7, 26, 100, 10_000])
def test_scene_iterator_covers_every_pixel_once(scene, batch_size):
    cube = scene[0]
    h, w, _ = cube.shape
    p = 5
    padded = pad_cube(cube, p)
    seen = np.zeros((h, w), dtype=np.int64)
    order = []
    for patches, coords in iter_scene_batches(padded, p, batch_size):
        assert patches.shape[0] == coords.shape[0] <= batch_size
        assert patches.shape[1:] == (8, p, p) and patches.is_contiguous()
        for k in range(0, len(coords), max(1, len(coords) // 3)):  # spot-check against the oracle
            i, j = coords[k].tolist()
            np.testing.assert_array_equal(patches[k].numpy(), oracle_patch(cube, i, j, p, "reflect"))
        seen[coords[:, 0], coords[:, 1]] += 1
        order += (coords[:, 0] * w + coords[:, 1]).tolist()
    assert np.all(seen == 1)
    assert order == sorted(order)


def test_scene_iterator_with_mask(scene):
    cube, gt, _ = scene
    padded = pad_cube(cube, 3)
    got = torch.cat([c for _, c in iter_scene_batches(padded, 3, 10, mask=gt > 0)])
    np.testing.assert_array_equal(got.numpy(), np.argwhere(gt > 0))
    with pytest.raises(DataError, match="mask: shape"):
        next(iter_scene_batches(padded, 3, 10, mask=gt[:-1] > 0))


def test_predict_scene_against_numpy(scene):
    cube = scene[0]
    padded = pad_cube(cube, 3)

    def predict(batch):  # logits = the centre pixel's spectrum
        return batch["patch"][:, :, 1, 1]

    out = predict_scene(predict, padded, 3, 37)
    np.testing.assert_array_equal(out, cube.argmax(axis=2))
    mask = np.zeros(cube.shape[:2], dtype=bool)
    mask[2:5, 3:9] = True
    part = predict_scene(predict, padded, 3, 37, mask=mask)
    assert np.all(part[~mask] == -1) and np.array_equal(part[mask], cube.argmax(2)[mask])
    with pytest.raises(DataError, match="expected logits"):
        predict_scene(lambda b: b["patch"].sum(), padded, 3, 37)


def test_bad_arguments(scene):
    cube = scene[0]
    with pytest.raises(DataError, match="patch_size"):
        pad_cube(cube, 4)
    with pytest.raises(DataError, match="padding"):
        pad_cube(cube, 3, "wrap")
    with pytest.raises(DataError, match=r"expected shape \(H, W, B\)"):
        pad_cube(cube[..., 0], 3)
    padded = pad_cube(cube, 3)
    with pytest.raises(DataError, match="coords outside"):
        PatchDataset(padded, np.array([[30, 0]]), np.array([0]), 3)
    with pytest.raises(DataError, match="2 coords but 1 targets"):
        PatchDataset(padded, np.array([[0, 0], [1, 1]]), np.array([0]), 3)
    with pytest.raises(DataError, match="batch_size"):
        next(iter_scene_batches(padded, 3, 0))


def test_scene_map_is_the_argmax_of_the_probabilities_even_at_float32_ties() -> None:
    """Logits 1e-8 apart are distinct, their float32 softmax is not: the map follows the probabilities."""
    padded = pad_cube(np.zeros((4, 5, 2), np.float32), 3, "reflect")

    def predict(batch: dict) -> torch.Tensor:
        n = batch["patch"].shape[0]
        return torch.tensor([[0.1, 0.1 + 1e-8]], dtype=torch.float64).expand(n, 2)  # (n, 2)

    probs = np.zeros((4, 5, 2), np.float32)
    ids = predict_scene(predict, padded, 3, 7, probabilities=probs)
    np.testing.assert_array_equal(ids, probs.argmax(axis=2))
    np.testing.assert_allclose(probs, 0.5)


@pytest.mark.parametrize("mode", ["reflect", "symmetric", "edge", "zero"])
@pytest.mark.parametrize(("h", "w", "p"), [(37, 23, 7), (3, 2, 9), (1, 1, 5), (300, 300, 1)])
def test_pad_transformed_equals_transforming_the_whole_cube_first(mode, h, w, p, monkeypatch) -> None:
    """Oracle: pad_cube of the whole transformed cube (the path it replaces), on blocks that split
    the rows unevenly (BLOCK_BYTES shrunk to a few rows), with a transform that changes the band
    count and depends on the rows' position."""
    from sciformer.data.hsi import patches
    from sciformer.data.hsi.patches import pad_transformed

    monkeypatch.setattr(patches, "BLOCK_BYTES", 4 * 6 * (3 * w + 1))  # 3 rows of 6 bands per block, the last one short
    rng = np.random.default_rng(h * w + p)
    cube = rng.integers(0, 4000, size=(h, w, 6)).astype(np.uint16)  # (H, W, B)
    basis = rng.normal(size=(6, 4))
    whole = (cube.astype(np.float64) @ basis + np.arange(h)[:, None, None]).astype(np.float32)  # (H, W, 4)
    seen: list[int] = []

    def transform(rows: np.ndarray, y: int) -> np.ndarray:
        seen.append(y)
        return (rows.astype(np.float64) @ basis + np.arange(y, y + len(rows))[:, None, None]).astype(np.float32)

    got = pad_transformed(cube, transform, 4, p, mode)
    torch.testing.assert_close(got, pad_cube(whole, p, mode), rtol=0, atol=0)
    assert seen == list(range(0, h, 3))


def test_pad_transformed_holds_no_second_copy_of_the_cube() -> None:
    """Peak memory above the uint16 cube (tracemalloc sees numpy's allocations): the float32 output
    plus blocks, not a whole float32 (let alone float64) transformed copy beside it."""
    from synthetic import traced_peak

    from sciformer.data.hsi.normalize import Normalizer
    from sciformer.data.hsi.patches import pad_transformed

    cube = np.random.default_rng(0).integers(0, 4000, size=(400, 300, 100)).astype(np.uint16)  # 24 MB
    norm = Normalizer("standard").fit(cube, np.ones(cube.shape[:2], bool))
    out_bytes = 100 * (400 + 6) * (300 + 6) * 4
    with traced_peak() as traced:
        padded = pad_transformed(cube, lambda rows, y: norm.transform(rows, "cube", y), 100, 7, "reflect")
    peak = traced[0]
    torch.testing.assert_close(padded, pad_cube(norm.transform(cube), 7, "reflect"), rtol=0, atol=0)
    assert peak < out_bytes + 28 * 2**20, (peak, out_bytes)  # a block (4 MB) and its transform's chunks (8 MB float64)
    assert peak < out_bytes + cube.size * 4  # the old path: a float32 copy of the whole cube beside the output


@pytest.mark.parametrize("at", [(0, 0), (4, 5), (6, 8)])  # a corner (reflected into the padding), inside, the far corner
def test_non_finite_scores_name_the_file_and_the_extreme_pixel_of_the_patch(at: tuple[int, int]) -> None:
    cube = np.random.default_rng(0).normal(size=(7, 9, 3)).astype(np.float32)  # (H, W, B)
    cube[at[0], at[1], 1] = -3e38  # a no-data fill: the model overflows on every patch that holds it
    padded = pad_cube(cube, 3, "reflect")

    def overflow(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        big = batch["patch"].abs().amax(dim=(1, 2, 3)) > 1e30  # (n,)
        return torch.where(big[:, None], torch.tensor(float("nan")), torch.zeros(1, 2))  # (n, 2)

    first = (max(at[0] - 1, 0), max(at[1] - 1, 0))  # the first pixel in row-major order whose 3 x 3 patch holds it
    with pytest.raises(DataError, match=rf"^scene.mat: the model gives non-finite scores for \d pixel\(s\) of a batch "
                                        rf"\(first at \({first[0]}, {first[1]}\), whose patch holds pixel \({at[0]}, {at[1]}\) "
                                        r"of value -3e\+38 once normalised\)"):
        predict_scene(overflow, padded, 3, 64, where="scene.mat")
