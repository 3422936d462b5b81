"""Raw label ids no class takes, and the refusal of a training split with no labelled point."""

from __future__ import annotations

import numpy as np
import pytest

from sciformer.data.pointcloud.fields import check_labels
from sciformer.data.pointcloud.scene_labels import UnmappedIds, check_labelled
from sciformer.errors import DataError


def test_unmapped_ids_count_and_range_against_numpy() -> None:
    rng = np.random.default_rng(3)
    ids = UnmappedIds()
    assert ids.hint() == ""
    raws = [rng.integers(0, 30, 200), rng.integers(0, 30, 100)]
    for raw in raws:
        ids.add(raw, np.where(raw < 20, raw, -1))  # ids 20.. take no class
    off = np.concatenate([r[r >= 20] for r in raws])
    assert ids.hint() == f"; {off.size:,} labels unmapped: ids {off.min()}..{off.max()}"
    ids.add(np.array([5 | (3 << 16)]), np.array([-1]))
    assert ids.hint().startswith(f"; {off.size + 1:,} labels unmapped: ids {off.min()}..{5 | (3 << 16)}; ")
    assert "label & 0xFFFF" in ids.hint()


def test_check_labelled_reads_until_a_labelled_scene_and_refuses_none() -> None:
    read: list[int] = []

    def scenes(labels: list[np.ndarray]):
        for i, label in enumerate(labels):
            read.append(i)
            yield label

    check_labelled(scenes([np.array([-1, 0]), np.array([-1])]), 2)
    assert read == [0]  # the first scene holds a labelled point: nothing more read
    with pytest.raises(DataError, match=r"^data: no training point has a class of data.classes \(every label of the 2 "
                                        r"training scenes is ignored; why\)"):
        check_labelled(scenes([np.array([-1, -1]), np.array([-1])]), 2, lambda: "; why")


def test_label_ids_beyond_any_class_hint_at_semantickitti_lower_bits() -> None:
    with pytest.raises(DataError, match=r"not plausible class ids .*lower 16 bits.*label & 0xFFFF"):
        check_labels("scan.npy", np.array([1, 40 | (200 << 16)], dtype=np.uint32))
    with pytest.raises(DataError, match=r"not plausible class ids \(expected 0\.\.\d+\)$"):
        check_labels("scan.npy", np.array([-5, 1]))
